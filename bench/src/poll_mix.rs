//! Ray's dashboard release mix, as people and probes load a dashboard:
//! every client polls every endpoint of the mix once a period, each
//! endpoint on a poller of its own (Ray's `dashboard_test` does the same
//! with one client), and each probe path is polled once a period with a
//! short timeout, as a Kubernetes probe does. The probes run on a thread of
//! their own at a raised priority (where allowed): the kubelet does not
//! wait for a CPU behind the head's processes, so neither may the probe
//! that stands for it.
//!
//! A poller sends a GET, waits for the whole answer (or its timeout), then
//! waits for the rest of its period, if any: a slow endpoint is polled less
//! often, never by two requests of one poller at once. Mix pollers keep one
//! keep-alive connection each (a browser tab); a probe opens a new
//! connection each time (as the kubelet does). Clients start spread over
//! the first period, all endpoints of a client at once (a page loading).
//!
//! Only requests that start inside the run are made; the last ones are
//! waited for, each within its timeout, so the run ends within
//! `duration + timeout`.
//!
//! Latency is from just before the request is written (a new connection's
//! connect included) to the last byte of the answer, for every answer read
//! to its end, whatever its status; any status but 200, a timeout, a failed
//! connect and an answer cut short are errors, counted by kind.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use serde_json::json;

use crate::net::{self, micros, Sender, Target};

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) target: Target,
    /// Paths every client polls, one poller each.
    pub(crate) mix: Vec<String>,
    /// Clients polling the whole mix.
    pub(crate) clients: usize,
    /// Paths polled as a prober does: one poller each, a new connection and
    /// `probe_timeout` each time.
    pub(crate) probes: Vec<String>,
    pub(crate) period: Duration,
    pub(crate) duration: Duration,
    /// A mix request that takes longer is abandoned and counted as an error.
    pub(crate) mix_timeout: Duration,
    pub(crate) probe_timeout: Duration,
    /// `Accept-Encoding` sent with every request (none when empty).
    pub(crate) accept_encoding: String,
    /// A process whose whole tree's CPU time over the run is reported.
    pub(crate) cpu_tree: Option<u32>,
    pub(crate) clk_tck: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mix,
    Probe,
}

/// What the pollers of one path saw.
#[derive(Debug)]
struct Tally {
    /// Latency of the answers read to the end (any status), µs.
    hist: Histogram<u64>,
    /// Body bytes of each of those answers (as sent: compressed if it was).
    sizes: Vec<u64>,
    /// Requests started (answered or not).
    requests: u64,
    /// Answers read to the end, any status.
    answered: u64,
    /// 200 answers read to the end.
    ok: u64,
    /// Failures by kind: `status <code>`, `timeout`, `connect`, `cut`
    /// (the body ended early or broke), `request` (no answer).
    errors: BTreeMap<String, u64>,
    first_error: Option<String>,
    /// Answers with a `Content-Encoding`.
    encoded: u64,
    /// Keep-alive connections the server had closed, replaced before the
    /// request was sent again (not an error).
    reconnects: u64,
    /// The slowest answers: (when the request started, seconds into the
    /// run; latency, µs), at most [`SLOWEST`], to line a tail up with what
    /// else happened then.
    slowest: Vec<(f64, u64)>,
}

/// How many of the slowest answers a tally keeps.
const SLOWEST: usize = 5;

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: net::histogram(),
            sizes: vec![],
            requests: 0,
            answered: 0,
            ok: 0,
            errors: BTreeMap::new(),
            first_error: None,
            encoded: 0,
            reconnects: 0,
            slowest: vec![],
        }
    }

    /// Keeps (`at`, `us`) if it is among the [`SLOWEST`] answers so far.
    fn answered_in(&mut self, at: f64, us: u64) {
        self.slowest.push((at, us));
        self.slowest.sort_by_key(|s| std::cmp::Reverse(s.1));
        self.slowest.truncate(SLOWEST);
    }

    fn error(&mut self, kind: &str, detail: String) {
        *self.errors.entry(kind.to_owned()).or_default() += 1;
        self.first_error.get_or_insert(detail);
    }

    fn merge(&mut self, other: Tally) -> anyhow::Result<()> {
        self.hist.add(&other.hist)?;
        self.sizes.extend(other.sizes);
        self.requests += other.requests;
        self.answered += other.answered;
        self.ok += other.ok;
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.encoded += other.encoded;
        for (at, us) in other.slowest {
            self.answered_in(at, us);
        }
        self.reconnects += other.reconnects;
        Ok(())
    }
}

/// How one exchange ended.
enum Outcome {
    /// A whole answer, whatever its status.
    Answer {
        status: StatusCode,
        bytes: u64,
        encoded: bool,
    },
    /// Kind and detail of a transport failure.
    Failed(&'static str, String),
}

fn request(plan: &Plan, path: &str) -> anyhow::Result<Request<Empty<Bytes>>> {
    let mut builder = Request::get(path)
        .header(header::HOST, plan.target.authority())
        .header(header::USER_AGENT, net::USER_AGENT);
    if !plan.accept_encoding.is_empty() {
        builder = builder.header(header::ACCEPT_ENCODING, plan.accept_encoding.as_str());
    }
    builder
        .body(Empty::new())
        .with_context(|| format!("bad request path {path:?}"))
}

/// One GET on `sender` (opened first when there is none), the body read to
/// the end. A kept connection that the server closed in the meantime is
/// replaced once, before anything was answered.
async fn exchange(
    plan: &Plan,
    path: &str,
    sender: &mut Option<Sender>,
    reconnects: &mut u64,
) -> Outcome {
    let mut retried = false;
    let response = loop {
        let reused = sender.is_some();
        if sender.is_none() {
            match net::open(&plan.target).await {
                Ok(s) => *sender = Some(s),
                Err(e) => return Outcome::Failed("connect", format!("{e:#}")),
            }
        }
        let Some(s) = sender.as_mut() else {
            return Outcome::Failed("connect", "no connection".into());
        };
        let req = match request(plan, path) {
            Ok(r) => r,
            Err(e) => return Outcome::Failed("request", format!("{e:#}")),
        };
        let sent = match s.ready().await {
            Ok(()) => s.send_request(req).await,
            Err(e) => Err(e),
        };
        match sent {
            Ok(r) => break r,
            Err(e) => {
                *sender = None;
                if reused
                    && !retried
                    && (e.is_canceled() || e.is_incomplete_message() || e.is_closed())
                {
                    retried = true;
                    *reconnects += 1;
                    continue;
                }
                return Outcome::Failed("request", format!("request failed: {e}"));
            }
        }
    };
    let status = response.status();
    let keep_alive = crate::net::keeps_alive(response.headers());
    let encoded = response.headers().contains_key(header::CONTENT_ENCODING);
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(data) = f.data_ref() {
                    bytes += data.len() as u64;
                }
            }
            Err(e) => {
                *sender = None;
                return Outcome::Failed(
                    "cut",
                    format!("{status} answer cut after {bytes} bytes: {e}"),
                );
            }
        }
    }
    if !keep_alive {
        *sender = None;
    }
    Outcome::Answer {
        status,
        bytes,
        encoded,
    }
}

/// One poller: `path` once a period from `first` until `end`.
async fn poller(plan: Plan, path: String, kind: Kind, start: Instant, first: Instant) -> Tally {
    let end = start + plan.duration;
    let mut tally = Tally::new();
    let timeout = match kind {
        Kind::Mix => plan.mix_timeout,
        Kind::Probe => plan.probe_timeout,
    };
    let mut sender: Option<Sender> = None;
    let mut next = first;
    tokio::time::sleep_until(next.into()).await;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        tally.requests += 1;
        let mut reconnects = 0;
        let outcome = tokio::time::timeout(
            timeout,
            exchange(&plan, &path, &mut sender, &mut reconnects),
        )
        .await;
        tally.reconnects += reconnects;
        let elapsed = t0.elapsed();
        match outcome {
            Err(_) => {
                // The answer may still come: never reuse that connection.
                sender = None;
                tally.error("timeout", format!("no full answer within {timeout:?}"));
            }
            Ok(Outcome::Answer {
                status,
                bytes,
                encoded,
            }) => {
                tally.answered += 1;
                tally.hist.saturating_record(micros(elapsed));
                tally.answered_in(t0.duration_since(start).as_secs_f64(), micros(elapsed));
                tally.sizes.push(bytes);
                tally.encoded += u64::from(encoded);
                if status == StatusCode::OK {
                    tally.ok += 1;
                } else {
                    tally.error(
                        &format!("status {}", status.as_u16()),
                        format!("status {status}"),
                    );
                }
            }
            Ok(Outcome::Failed(k, detail)) => tally.error(k, detail),
        }
        if kind == Kind::Probe {
            sender = None;
        }
        next += plan.period;
        let now = Instant::now();
        if next < now {
            // Late: the next poll goes right away, and the schedule moves on
            // from here (no burst of catch-up polls).
            next = now;
        }
        tokio::time::sleep_until(next.into()).await;
    }
    tally
}

/// utime + stime (ticks) of every process in `root`'s tree now, by pid and
/// start time; processes that vanish while being read are left out.
fn tree_ticks(root: u32) -> HashMap<(u32, u64), u64> {
    crate::proctree::tree(root)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            let ticks = crate::procfs::process_ticks(p.pid).ok()?;
            Some(((p.pid, p.start_ticks), ticks))
        })
        .collect()
}

/// CPU seconds the processes of `root`'s tree used since `before` was taken
/// (a process that ended in between is missing: a lower bound then).
fn tree_cpu_since(root: u32, before: &HashMap<(u32, u64), u64>, clk_tck: u64) -> f64 {
    let ticks: u64 = tree_ticks(root)
        .iter()
        .map(|(key, now)| now.saturating_sub(before.get(key).copied().unwrap_or(0)))
        .sum();
    ticks as f64 / clk_tck.max(1) as f64
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The nice value the probes' thread asks for. A prober (the kubelet, a
/// monitor) runs elsewhere, not among the head's processes: on a head whose
/// CPUs the GCS and the dashboards hold, a prober at their priority would
/// time its own wait for a CPU along with the dashboard's answer.
const PROBE_NICE: i32 = -10;

type ProbeThread = std::thread::JoinHandle<anyhow::Result<(i32, Vec<(String, Kind, Tally)>)>>;

/// Runs the plan's probes on a thread of their own, with a runtime of its
/// own, at [`PROBE_NICE`] where the user may ask for it (root); the mix's
/// clients share the other runtime's thread. Gives the nice value the
/// thread ran at, and the probes' tallies.
fn spawn_probes(plan: &Plan, start: Instant) -> ProbeThread {
    let plan = plan.clone();
    std::thread::spawn(move || {
        let tid = rustix::thread::gettid();
        // Without the privilege the probes run at the tool's priority, and
        // the summary says which.
        let _ = rustix::process::setpriority_process(Some(tid), PROBE_NICE);
        let nice = rustix::process::getpriority_process(Some(tid))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let tallies = runtime.block_on(async {
            let jobs: Vec<_> = plan
                .probes
                .iter()
                .map(|path| {
                    let job = poller(plan.clone(), path.clone(), Kind::Probe, start, start);
                    (path.clone(), tokio::spawn(job))
                })
                .collect();
            let mut tallies = vec![];
            for (path, job) in jobs {
                tallies.push((path, Kind::Probe, job.await?));
            }
            anyhow::Ok(tallies)
        })?;
        Ok((nice, tallies))
    })
}

/// Runs the plan and returns its JSON summary.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        !plan.mix.is_empty() || !plan.probes.is_empty(),
        "no paths to poll"
    );
    let start = Instant::now();
    let own_cpu = crate::procfs::CpuMeter::start(&[std::process::id()], plan.clk_tck)?;
    let tree_cpu_start = plan.cpu_tree.map(tree_ticks);
    let clients = plan.clients;
    let mut tasks = vec![];
    for c in 0..clients {
        let offset = plan.period.mul_f64(c as f64 / clients.max(1) as f64);
        for path in &plan.mix {
            let job = poller(plan.clone(), path.clone(), Kind::Mix, start, start + offset);
            tasks.push((path.clone(), Kind::Mix, tokio::spawn(job)));
        }
    }
    let probes = (!plan.probes.is_empty()).then(|| spawn_probes(&plan, start));
    let mut done: Vec<(String, Kind, Tally)> = vec![];
    for (path, kind, task) in tasks {
        done.push((path, kind, task.await?));
    }
    let mut probe_nice = None;
    if let Some(probes) = probes {
        let (nice, tallies) = tokio::task::spawn_blocking(move || probes.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the probes' thread panicked"))??;
        probe_nice = Some(nice);
        done.extend(tallies);
    }
    let mut tallies: Vec<(String, Kind, Tally)> = vec![];
    for (path, kind, t) in done {
        match tallies
            .iter_mut()
            .find(|(p, k, _)| *p == path && *k == kind)
        {
            Some((_, _, total)) => total.merge(t)?,
            None => tallies.push((path, kind, t)),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut endpoints = vec![];
    for (path, kind, mut t) in tallies {
        t.sizes.sort_unstable();
        let median_bytes = t.sizes.get(t.sizes.len() / 2).copied();
        let errors: u64 = t.errors.values().sum();
        let quantile = |q: f64| (t.answered > 0).then(|| ms(t.hist.value_at_quantile(q)));
        endpoints.push(json!({
            "path": path,
            "kind": match kind { Kind::Mix => "mix", Kind::Probe => "probe" },
            "pollers": match kind { Kind::Mix => clients, Kind::Probe => 1 },
            "requests": t.requests,
            "answered": t.answered,
            "ok": t.ok,
            "errors": errors,
            "error_kinds": t.errors,
            "first_error": t.first_error,
            "p50_ms": quantile(0.50),
            "p95_ms": quantile(0.95),
            "p99_ms": quantile(0.99),
            "max_ms": (t.answered > 0).then(|| ms(t.hist.max())),
            "over_1s": t.hist.count_between(1_000_001, u64::MAX),
            "bytes_median": median_bytes,
            "bytes_max": t.sizes.last().copied(),
            "encoded": t.encoded,
            "reconnects": t.reconnects,
            "slowest": t.slowest.iter().map(|&(at, us)| json!({"at_s": (at * 1000.0).round() / 1000.0, "ms": ms(us)})).collect::<Vec<_>>(),
        }));
    }
    let mut out = json!({
        "seconds": seconds,
        "clients": clients,
        "period_s": plan.period.as_secs_f64(),
        "mix_timeout_s": plan.mix_timeout.as_secs_f64(),
        "probe_timeout_s": plan.probe_timeout.as_secs_f64(),
        "accept_encoding": plan.accept_encoding,
        "loadgen_cpu_s": own_cpu.elapsed_us()? / 1e6,
        "probe_nice": probe_nice,
        "endpoints": endpoints,
    });
    if let (Some(pid), Some(before)) = (plan.cpu_tree, tree_cpu_start) {
        out["tree_cpu_s"] = json!(tree_cpu_since(pid, &before, plan.clk_tck));
    }
    Ok(out)
}
