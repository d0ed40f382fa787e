//! Closed-loop HTTP load: N keep-alive HTTP/1.1 connections, one request
//! outstanding on each, for a warm-up and then a measured window.
//!
//! A request counts when it starts inside the measured window; its latency
//! is from just before the request is written to the last byte of its body.
//! The rate divides those requests by the time from the window's start to
//! the moment the last worker stopped. A failed request (transport error or
//! non-200) counts as an error, and its connection is replaced.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;

use crate::net::{self, micros, Target};
use crate::procfs::CpuMeter;

/// Pause after a failed connect, so that a dead target is not spun on.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);
/// How long past the end of the window a request may still take before the
/// run gives up on it (a hung server must not hang the benchmark).
const GRACE: Duration = Duration::from_secs(10);

/// What to run.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) target: Target,
    pub(crate) path: String,
    pub(crate) connections: usize,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    /// The proxy's processes (none for a direct run).
    pub(crate) cpu_pids: Vec<u32>,
    /// The backend's process, whose CPU per request is reported too.
    pub(crate) backend_pid: Option<u32>,
    pub(crate) clk_tck: u64,
}

#[derive(Debug)]
struct Tally {
    hist: Histogram<u64>,
    requests: u64,
    errors: u64,
    /// Connections replaced after the server's `Connection: close`.
    reconnects: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: net::histogram(),
            requests: 0,
            errors: 0,
            reconnects: 0,
            first_error: None,
        }
    }
}

/// Runs the plan and returns its JSON summary.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    // Fail fast on a target that does not answer at all.
    let (status, _) = net::get_once(&plan.target, &plan.path).await?;
    if !status.is_success() {
        anyhow::bail!("GET {} on {} answered {status}", plan.path, plan.target);
    }
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let until = measure_from + plan.duration;
    let mut workers = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        let target = plan.target.clone();
        let path = plan.path.clone();
        workers.push(tokio::spawn(worker(target, path, measure_from, until)));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let proxy_cpu = CpuMeter::start(&plan.cpu_pids, plan.clk_tck)?;
    let backend_cpu = CpuMeter::start(plan.backend_pid.as_slice(), plan.clk_tck)?;
    let own_cpu = CpuMeter::start(&[std::process::id()], plan.clk_tck)?;
    let window_start = Instant::now();

    let mut total = Tally::new();
    for w in workers {
        let t = w.await?;
        total.hist.add(&t.hist)?;
        total.requests += t.requests;
        total.errors += t.errors;
        total.reconnects += t.reconnects;
        if total.first_error.is_none() {
            total.first_error = t.first_error;
        }
    }
    let elapsed = window_start.elapsed().as_secs_f64();

    let requests = total.requests;
    let mut out = json!({
        "rps": requests as f64 / elapsed,
        "p50_us": total.hist.value_at_quantile(0.50),
        "p90_us": total.hist.value_at_quantile(0.90),
        "p99_us": total.hist.value_at_quantile(0.99),
        "max_us": total.hist.max(),
        "requests": requests,
        "errors": total.errors,
        "reconnects": total.reconnects,
        "seconds": elapsed,
        "connections": plan.connections,
    });
    let per_request = |us: f64| {
        if requests > 0 {
            us / requests as f64
        } else {
            0.0
        }
    };
    if proxy_cpu.is_active() {
        let us = proxy_cpu.elapsed_us()?;
        out["cpu_us"] = json!(us);
        out["cpu_us_per_req"] = json!(per_request(us));
    }
    if backend_cpu.is_active() {
        out["backend_cpu_us_per_req"] = json!(per_request(backend_cpu.elapsed_us()?));
    }
    out["loadgen_cpu_us_per_req"] = json!(per_request(own_cpu.elapsed_us()?));
    if let Some(e) = total.first_error {
        out["first_error"] = json!(e);
    }
    Ok(out)
}

/// Records a failed request (when `counted`) and keeps the first error.
fn note(tally: &mut Tally, counted: bool, error: String) {
    if counted {
        tally.errors += 1;
    }
    tally.first_error.get_or_insert(error);
}

/// One connection's loop until `until`.
async fn worker(target: Target, path: String, measure_from: Instant, until: Instant) -> Tally {
    let mut tally = Tally::new();
    'connect: while Instant::now() < until {
        let mut sender = match net::open(&target).await {
            Ok(s) => s,
            Err(e) => {
                note(&mut tally, Instant::now() >= measure_from, format!("{e:#}"));
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        loop {
            let t0 = Instant::now();
            if t0 >= until {
                break 'connect;
            }
            let counted = t0 >= measure_from;
            let exchange = net::get_drained(&mut sender, &target, &path);
            let Ok(result) = tokio::time::timeout_at((until + GRACE).into(), exchange).await else {
                note(
                    &mut tally,
                    counted,
                    format!("no response within {GRACE:?} of the end"),
                );
                break 'connect;
            };
            match result {
                Ok(d) if d.status.is_success() => {
                    if counted {
                        tally.hist.saturating_record(micros(t0.elapsed()));
                        tally.requests += 1;
                    }
                    if !d.keep_alive {
                        tally.reconnects += 1;
                        continue 'connect;
                    }
                }
                Ok(d) => {
                    note(&mut tally, counted, format!("status {}", d.status));
                    if !d.keep_alive {
                        continue 'connect;
                    }
                }
                Err(e) => {
                    note(&mut tally, counted, format!("{e:#}"));
                    continue 'connect;
                }
            }
        }
    }
    tally
}
