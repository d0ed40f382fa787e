//! Connections at scale (`bench/conn_scale.sh`): thousands of idle
//! keep-alive clients or websockets through one host, what each costs the
//! host's memory, and whether the host still answers while it holds them.
//!
//! - [`idle`]: opens N idle HTTP/1.1 keep-alive connections (each makes one
//!   request) or N websockets (each echoes one message), and reads the
//!   host's and the modules' memory before, once they are connected, once
//!   each has been used once, and after they are closed.
//! - [`hold`]: probes `/api/healthz` and fires a burst of requests at an
//!   http route, first with nothing held, then while N websockets are held,
//!   every one of them echoing a message every period; at the end each of
//!   them must echo once more.
//!
//! Every connection goes to a loopback target; every wait is bounded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::net::{self, micros, BoxIo, Target};
use crate::procfs::CpuMeter;

/// How long opening one connection (and its websocket handshake) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one request or one echo may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long closing one websocket may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// The message each websocket echoes.
const PAYLOAD: &str = "0123456789abcdefghijklmnopqrstuv";

type Socket = tokio_tungstenite::WebSocketStream<BoxIo>;

// --- memory ------------------------------------------------------------------

/// One process's memory, in KiB: `VmRSS`, `RssAnon`, `RssFile` from
/// `/proc/<pid>/status`, `Pss` and `Pss_Anon` from `smaps_rollup`.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    anon: u64,
    file: u64,
    pss: u64,
    pss_anon: u64,
}

impl Mem {
    fn read(pid: u32) -> anyhow::Result<Mem> {
        let status = |key: &str| crate::procfs::status_kib(pid, key);
        let mut mem = Mem {
            rss: status("VmRSS")?,
            anon: status("RssAnon")?,
            file: status("RssFile")?,
            ..Mem::default()
        };
        let path = format!("/proc/{pid}/smaps_rollup");
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let Ok(kib) = value.trim().trim_end_matches("kB").trim().parse::<u64>() else {
                continue;
            };
            match key {
                "Pss" => mem.pss = kib,
                "Pss_Anon" => mem.pss_anon = kib,
                _ => {}
            }
        }
        Ok(mem)
    }

    fn sum(pids: &[u32]) -> anyhow::Result<Mem> {
        let mut total = Mem::default();
        for &pid in pids {
            let m = Mem::read(pid)?;
            total.rss += m.rss;
            total.anon += m.anon;
            total.file += m.file;
            total.pss += m.pss;
            total.pss_anon += m.pss_anon;
        }
        Ok(total)
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "vmrss_kib": self.rss,
            "rssanon_kib": self.anon,
            "rssfile_kib": self.file,
            "pss_kib": self.pss,
            "pss_anon_kib": self.pss_anon,
        })
    }

    /// `(self − before) ÷ n` per field, in KiB per connection.
    fn per(&self, before: &Mem, n: usize) -> serde_json::Value {
        let d = |a: u64, b: u64| (a as f64 - b as f64) / n.max(1) as f64;
        let r = |x: f64| (x * 100.0).round() / 100.0;
        json!({
            "vmrss_kib": r(d(self.rss, before.rss)),
            "rssanon_kib": r(d(self.anon, before.anon)),
            "pss_kib": r(d(self.pss, before.pss)),
            "pss_anon_kib": r(d(self.pss_anon, before.pss_anon)),
        })
    }
}

/// The host's and the modules' memory at one moment.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    host: Mem,
    modules: Mem,
}

impl Snapshot {
    fn read(host: u32, modules: &[u32]) -> anyhow::Result<Snapshot> {
        Ok(Snapshot {
            host: Mem::read(host)?,
            modules: Mem::sum(modules)?,
        })
    }

    fn json(&self) -> serde_json::Value {
        json!({ "host": self.host.json(), "modules": self.modules.json() })
    }

    fn per(&self, before: &Snapshot, n: usize) -> serde_json::Value {
        json!({
            "host": self.host.per(&before.host, n),
            "modules": self.modules.per(&before.modules, n),
        })
    }
}

// --- connections ---------------------------------------------------------------

/// Runs `make(i)` for `i` in `0..n`, at most `concurrency` at once; the
/// results in any order.
async fn bounded<T, F, Fut>(n: usize, concurrency: usize, make: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    futures_util::stream::iter(0..n)
        .map(make)
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// A websocket to `path`, with small client buffers (the client holds
/// thousands of them).
async fn open_ws(target: &Target, path: &str) -> anyhow::Result<Socket> {
    let open = async {
        let io = target.connect().await?;
        let url = format!("ws://{}{}", target.authority(), path);
        let config = WebSocketConfig::default()
            .read_buffer_size(4096)
            .write_buffer_size(0);
        let (socket, _) =
            tokio_tungstenite::client_async_with_config(url.as_str(), io, Some(config))
                .await
                .with_context(|| format!("websocket handshake for {path}"))?;
        Ok(socket)
    };
    tokio::time::timeout(OPEN_TIMEOUT, open)
        .await
        .map_err(|_| anyhow::anyhow!("websocket to {path}: not open within {OPEN_TIMEOUT:?}"))?
}

/// One echo within [`EXCHANGE_TIMEOUT`].
async fn echo(socket: &mut Socket) -> anyhow::Result<()> {
    tokio::time::timeout(EXCHANGE_TIMEOUT, crate::ws::echo(socket, PAYLOAD))
        .await
        .map_err(|_| anyhow::anyhow!("no echo within {EXCHANGE_TIMEOUT:?}"))?
}

/// One GET on `sender` within [`EXCHANGE_TIMEOUT`]: its status.
async fn get(sender: &mut net::Sender, target: &Target, path: &str) -> anyhow::Result<u16> {
    let d = tokio::time::timeout(EXCHANGE_TIMEOUT, net::get_drained(sender, target, path))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {EXCHANGE_TIMEOUT:?}"))??;
    Ok(d.status.as_u16())
}

/// A GET on a new connection, from the connect to the last body byte:
/// its status and time.
async fn get_fresh(target: &Target, path: &str) -> anyhow::Result<(u16, Duration)> {
    let t0 = Instant::now();
    let exchange = async {
        let mut sender = net::open(target).await?;
        get(&mut sender, target, path).await
    };
    let status = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("GET {path}: no answer within {EXCHANGE_TIMEOUT:?}"))??;
    Ok((status, t0.elapsed()))
}

/// Counts of outcomes by name, with the first error's text.
#[derive(Debug, Default)]
struct Outcomes {
    counts: BTreeMap<String, u64>,
    first_error: Option<String>,
}

impl Outcomes {
    fn status(&mut self, status: u16) {
        *self.counts.entry(status.to_string()).or_default() += 1;
    }

    fn error(&mut self, e: &anyhow::Error) {
        *self.counts.entry("error".to_owned()).or_default() += 1;
        self.first_error.get_or_insert_with(|| format!("{e:#}"));
    }

    fn ok(&mut self) {
        *self.counts.entry("ok".to_owned()).or_default() += 1;
    }

    fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    fn json(&self) -> serde_json::Value {
        let mut out = json!({ "counts": self.counts });
        if let Some(e) = &self.first_error {
            out["first_error"] = json!(e);
        }
        out
    }
}

// --- idle connections ------------------------------------------------------------

/// Which connections [`idle`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// HTTP/1.1 keep-alive connections, each making one GET of the path.
    Http,
    /// Websockets, each echoing one message.
    Ws,
}

/// What [`idle`] runs.
#[derive(Debug)]
pub(crate) struct IdlePlan {
    pub(crate) target: Target,
    pub(crate) kind: Kind,
    /// The GET path (http), or the websocket paths, used in turn (ws).
    pub(crate) paths: Vec<String>,
    pub(crate) connections: usize,
    pub(crate) concurrency: usize,
    pub(crate) settle: Duration,
    pub(crate) host_pid: u32,
    pub(crate) module_pids: Vec<u32>,
}

/// Opens, uses once and holds `connections` idle connections; the memory
/// before, connected, used once, and after they closed.
pub(crate) async fn idle(plan: IdlePlan) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(!plan.paths.is_empty(), "--path is needed");
    match plan.kind {
        Kind::Http => idle_http(&plan).await,
        Kind::Ws => idle_ws(&plan).await,
    }
}

async fn idle_http(plan: &IdlePlan) -> anyhow::Result<serde_json::Value> {
    let target = &plan.target;
    let path = plan.paths[0].as_str();
    let n = plan.connections;
    // As many connections at once as the measurement opens, so that what
    // the host keeps from them (its pooled module connections) is in the
    // baseline.
    let warm = bounded(plan.concurrency, plan.concurrency, |_| async move {
        let mut s = net::open(target).await?;
        get(&mut s, target, path).await
    })
    .await;
    let warm_failed = warm.iter().filter(|r| !matches!(r, Ok(200))).count();
    anyhow::ensure!(
        warm_failed == 0,
        "warm-up: {warm_failed} GETs of {path} failed"
    );
    drop(warm);
    tokio::time::sleep(plan.settle).await;
    let before = Snapshot::read(plan.host_pid, &plan.module_pids)?;

    let t0 = Instant::now();
    let opened = bounded(n, plan.concurrency, |_| async move {
        tokio::time::timeout(OPEN_TIMEOUT, net::open(target))
            .await
            .map_err(|_| anyhow::anyhow!("connect: not within {OPEN_TIMEOUT:?}"))?
    })
    .await;
    let connect_s = t0.elapsed().as_secs_f64();
    let mut open_errors = Outcomes::default();
    let mut senders = Vec::with_capacity(n);
    for r in opened {
        match r {
            Ok(s) => senders.push(s),
            Err(e) => open_errors.error(&e),
        }
    }
    tokio::time::sleep(plan.settle).await;
    let connected = Snapshot::read(plan.host_pid, &plan.module_pids)?;

    // One request each; then idle.
    let t0 = Instant::now();
    let first = use_all(&mut senders, plan.concurrency, target, path).await;
    let request_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(plan.settle).await;
    let used = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    // Still open and answering?
    let second = use_all(&mut senders, plan.concurrency, target, path).await;
    let held = senders.len();
    drop(senders);
    tokio::time::sleep(plan.settle.max(Duration::from_secs(1))).await;
    let closed = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    Ok(json!({
        "kind": "http",
        "path": path,
        "connections": n,
        "held": held,
        "connect_s": connect_s,
        "first_request_s": request_s,
        "open": open_errors.json(),
        "first_request": first.json(),
        "second_request": second.json(),
        "mem": {
            "before": before.json(),
            "connected": connected.json(),
            "used": used.json(),
            "closed": closed.json(),
        },
        "per_connection": {
            "connected": connected.per(&before, held),
            "used": used.per(&before, held),
            "closed": closed.per(&before, held),
        },
    }))
}

/// One GET on every sender, `concurrency` at once.
async fn use_all(
    senders: &mut [net::Sender],
    concurrency: usize,
    target: &Target,
    path: &str,
) -> Outcomes {
    let results: Vec<anyhow::Result<u16>> =
        futures_util::stream::iter(senders.iter_mut().map(|s| get(s, target, path)))
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    let mut out = Outcomes::default();
    for r in results {
        match r {
            Ok(status) => out.status(status),
            Err(e) => out.error(&e),
        }
    }
    out
}

/// One echo on every socket, `concurrency` at once.
async fn echo_all(sockets: &mut [Socket], concurrency: usize) -> Outcomes {
    let results: Vec<anyhow::Result<()>> = futures_util::stream::iter(sockets.iter_mut().map(echo))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut out = Outcomes::default();
    for r in results {
        match r {
            Ok(()) => out.ok(),
            Err(e) => out.error(&e),
        }
    }
    out
}

/// Closes every socket, `concurrency` at once.
async fn close_all(sockets: Vec<Socket>, concurrency: usize) {
    futures_util::stream::iter(sockets.into_iter().map(|mut s| async move {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, s.close(None)).await;
    }))
    .buffer_unordered(concurrency.max(1))
    .collect::<Vec<()>>()
    .await;
}

/// Opens `n` websockets to `paths` in turn, `concurrency` at once.
async fn open_all(
    target: &Target,
    paths: &[String],
    n: usize,
    concurrency: usize,
) -> (Vec<Socket>, Outcomes) {
    let opened = bounded(n, concurrency, |i| open_ws(target, &paths[i % paths.len()])).await;
    let mut errors = Outcomes::default();
    let mut sockets = Vec::with_capacity(n);
    for r in opened {
        match r {
            Ok(s) => sockets.push(s),
            Err(e) => errors.error(&e),
        }
    }
    (sockets, errors)
}

async fn idle_ws(plan: &IdlePlan) -> anyhow::Result<serde_json::Value> {
    let target = &plan.target;
    let n = plan.connections;
    // Warm-up: as many websockets at once as the measurement opens.
    let (mut warm, errors) =
        open_all(target, &plan.paths, plan.concurrency, plan.concurrency).await;
    anyhow::ensure!(
        errors.get("error") == 0,
        "warm-up: websockets failed: {}",
        errors.json()
    );
    let warm_echo = echo_all(&mut warm, plan.concurrency).await;
    anyhow::ensure!(
        warm_echo.get("error") == 0,
        "warm-up: echoes failed: {}",
        warm_echo.json()
    );
    close_all(warm, plan.concurrency).await;
    tokio::time::sleep(plan.settle).await;
    let before = Snapshot::read(plan.host_pid, &plan.module_pids)?;

    let t0 = Instant::now();
    let (mut sockets, open_errors) = open_all(target, &plan.paths, n, plan.concurrency).await;
    let open_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(plan.settle).await;
    let connected = Snapshot::read(plan.host_pid, &plan.module_pids)?;

    let t0 = Instant::now();
    let first = echo_all(&mut sockets, plan.concurrency).await;
    let echo_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(plan.settle).await;
    let used = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    let second = echo_all(&mut sockets, plan.concurrency).await;
    let held = sockets.len();
    close_all(sockets, plan.concurrency).await;
    tokio::time::sleep(plan.settle.max(Duration::from_secs(1))).await;
    let closed = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    Ok(json!({
        "kind": "ws",
        "paths": plan.paths,
        "connections": n,
        "held": held,
        "open_s": open_s,
        "first_echo_s": echo_s,
        "open": open_errors.json(),
        "first_echo": first.json(),
        "second_echo": second.json(),
        "mem": {
            "before": before.json(),
            "connected": connected.json(),
            "used": used.json(),
            "closed": closed.json(),
        },
        "per_connection": {
            "connected": connected.per(&before, held),
            "used": used.per(&before, held),
            "closed": closed.per(&before, held),
        },
    }))
}

// --- websockets held under load ----------------------------------------------------

/// What [`hold`] runs.
#[derive(Debug)]
pub(crate) struct HoldPlan {
    pub(crate) target: Target,
    /// Websocket paths, used in turn.
    pub(crate) ws_paths: Vec<String>,
    pub(crate) websockets: usize,
    pub(crate) concurrency: usize,
    /// The path probed on a new connection each time.
    pub(crate) probe_path: String,
    /// Time between two probes' starts.
    pub(crate) probe_every: Duration,
    /// How long the probes run with nothing held.
    pub(crate) baseline: Duration,
    /// How long the websockets are held, echoing.
    pub(crate) hold: Duration,
    /// Time between two echoes of one websocket.
    pub(crate) echo_every: Duration,
    /// The http route of the burst, and its size.
    pub(crate) burst_path: String,
    pub(crate) burst: usize,
    pub(crate) host_pid: u32,
    pub(crate) module_pids: Vec<u32>,
    pub(crate) clk_tck: u64,
}

/// Probes `path` on a new connection every `every` until `until`.
async fn probe(target: Target, path: String, every: Duration, until: Instant) -> Probes {
    let mut out = Probes {
        hist: net::histogram(),
        outcomes: Outcomes::default(),
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if Instant::now() >= until {
            break;
        }
        match get_fresh(&target, &path).await {
            Ok((status, took)) => {
                out.outcomes.status(status);
                out.hist.saturating_record(micros(took));
            }
            Err(e) => out.outcomes.error(&e),
        }
    }
    out
}

#[derive(Debug)]
struct Probes {
    hist: Histogram<u64>,
    outcomes: Outcomes,
}

fn latency_json(hist: &Histogram<u64>) -> serde_json::Value {
    json!({
        "samples": hist.len(),
        "p50_us": hist.value_at_quantile(0.50),
        "p99_us": hist.value_at_quantile(0.99),
        "max_us": hist.max(),
    })
}

impl Probes {
    fn json(&self) -> serde_json::Value {
        let mut out = latency_json(&self.hist);
        out["outcomes"] = self.outcomes.json();
        out
    }
}

/// The kernel's `TcpExt` counters of connections a listener dropped
/// (`ListenOverflows`: its accept queue was full; `ListenDrops`: those and
/// any other drop), from `/proc/net/netstat`: for this network namespace,
/// so anything else connecting meanwhile counts too.
fn listen_drops() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let names: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |key: &str| {
        let i = names.iter().position(|n| *n == key)?;
        values.get(i)?.parse::<u64>().ok()
    };
    Some((get("ListenOverflows")?, get("ListenDrops")?))
}

/// `n` GETs of `path` at once, each on a new connection.
async fn burst(target: &Target, path: &str, n: usize) -> serde_json::Value {
    let drops_before = listen_drops();
    let t0 = Instant::now();
    let results = bounded(n, n, |_| get_fresh(target, path)).await;
    let took = t0.elapsed();
    let drops_after = listen_drops();
    let mut hist = net::histogram();
    let mut outcomes = Outcomes::default();
    for r in results {
        match r {
            Ok((status, took)) => {
                outcomes.status(status);
                hist.saturating_record(micros(took));
            }
            Err(e) => outcomes.error(&e),
        }
    }
    let mut out = latency_json(&hist);
    out["requests"] = json!(n);
    out["seconds"] = json!(took.as_secs_f64());
    if let (Some(a), Some(b)) = (drops_before, drops_after) {
        out["listen_overflows"] = json!(b.0.saturating_sub(a.0));
        out["listen_drops"] = json!(b.1.saturating_sub(a.1));
    }
    out["outcomes"] = outcomes.json();
    out
}

/// What one held websocket saw.
#[derive(Debug)]
struct Held {
    hist: Histogram<u64>,
    echoes: u64,
    error: Option<String>,
    final_echo: bool,
}

/// Echoes every `every` (first at `start + offset`) until `until`, then
/// once more at `last`, and closes.
async fn keep_echoing(
    mut socket: Socket,
    start: Instant,
    offset: Duration,
    every: Duration,
    until: Instant,
    last: Instant,
) -> Held {
    let mut held = Held {
        hist: net::histogram(),
        echoes: 0,
        error: None,
        final_echo: false,
    };
    let mut next = start + offset;
    while next < until {
        tokio::time::sleep_until(next.into()).await;
        let t0 = Instant::now();
        match echo(&mut socket).await {
            Ok(()) => {
                held.hist.saturating_record(micros(t0.elapsed()));
                held.echoes += 1;
            }
            Err(e) => {
                held.error = Some(format!("{e:#}"));
                return held;
            }
        }
        next += every;
    }
    tokio::time::sleep_until(last.into()).await;
    match echo(&mut socket).await {
        Ok(()) => held.final_echo = true,
        Err(e) => held.error = Some(format!("final echo: {e:#}")),
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, socket.close(None)).await;
    held
}

/// `long_lived` of each module in `/api/modules`, wherever the entry has it.
async fn long_lived(target: &Target) -> serde_json::Value {
    fn find(v: &serde_json::Value) -> Option<&serde_json::Value> {
        match v {
            serde_json::Value::Object(map) => map
                .get("long_lived")
                .or_else(|| map.values().find_map(find)),
            serde_json::Value::Array(list) => list.iter().find_map(find),
            _ => None,
        }
    }
    let Ok((status, body)) = net::get_once(target, "/api/modules").await else {
        return json!(null);
    };
    if !status.is_success() {
        return json!(null);
    }
    let Ok(list) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) else {
        return json!(null);
    };
    let mut out = serde_json::Map::new();
    for m in &list {
        if let (Some(name), Some(n)) = (m["name"].as_str(), find(m)) {
            out.insert(name.to_owned(), n.clone());
        }
    }
    serde_json::Value::Object(out)
}

/// Probes and a burst with nothing held, then with `websockets` held and
/// echoing; every websocket echoes once more at the end.
pub(crate) async fn hold(plan: HoldPlan) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(!plan.ws_paths.is_empty(), "--ws-path is needed");
    let target = &plan.target;

    // Nothing held.
    let until = Instant::now() + plan.baseline;
    let prober = tokio::spawn(probe(
        target.clone(),
        plan.probe_path.clone(),
        plan.probe_every,
        until,
    ));
    tokio::time::sleep(plan.baseline / 2).await;
    let burst_before = burst(target, &plan.burst_path, plan.burst).await;
    let probes_before = prober.await?;
    let mem_before = Snapshot::read(plan.host_pid, &plan.module_pids)?;

    // Open them all.
    let t0 = Instant::now();
    let (sockets, open_errors) =
        open_all(target, &plan.ws_paths, plan.websockets, plan.concurrency).await;
    let open_s = t0.elapsed().as_secs_f64();
    let opened = sockets.len();
    anyhow::ensure!(opened > 0, "no websocket opened: {}", open_errors.json());
    let mem_open = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    let counted = long_lived(target).await;

    // Hold them, each echoing every `echo_every`, spread evenly.
    let start = Instant::now();
    let until = start + plan.hold;
    let last = until + Duration::from_millis(500);
    let cpu = CpuMeter::start(&[plan.host_pid], plan.clk_tck)?;
    let holders: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| {
            let offset = plan.echo_every.mul_f64(i as f64 / opened as f64);
            tokio::spawn(keep_echoing(
                socket,
                start,
                offset,
                plan.echo_every,
                until,
                last,
            ))
        })
        .collect();
    let prober = tokio::spawn(probe(
        target.clone(),
        plan.probe_path.clone(),
        plan.probe_every,
        until,
    ));
    tokio::time::sleep(plan.hold / 2).await;
    let burst_held = burst(target, &plan.burst_path, plan.burst).await;
    let probes_held = prober.await?;
    let host_cpu_s = cpu.elapsed_us()? / 1e6;
    let mem_held = Snapshot::read(plan.host_pid, &plan.module_pids)?;
    let mut echo_hist = net::histogram();
    let mut echoes = 0;
    let mut final_ok = 0;
    let mut broken = Outcomes::default();
    for h in holders {
        let h = h.await?;
        echo_hist.add(&h.hist)?;
        echoes += h.echoes;
        if h.final_echo {
            final_ok += 1;
        }
        if let Some(e) = h.error {
            broken.error(&anyhow::anyhow!(e));
        }
    }
    let mut echo_json = latency_json(&echo_hist);
    echo_json["echoes"] = json!(echoes);
    echo_json["per_s"] = json!(echoes as f64 / plan.hold.as_secs_f64());
    Ok(json!({
        "websockets": plan.websockets,
        "opened": opened,
        "open_s": open_s,
        "open": open_errors.json(),
        "long_lived_after_open": counted,
        "hold_s": plan.hold.as_secs_f64(),
        "echo_every_s": plan.echo_every.as_secs_f64(),
        "echo": echo_json,
        "broken": broken.json(),
        "final_echo_ok": final_ok,
        "probe_path": plan.probe_path,
        "probes_before": probes_before.json(),
        "probes_held": probes_held.json(),
        "burst_path": plan.burst_path,
        "burst_before": burst_before,
        "burst_held": burst_held,
        "host_cpu_s_during_hold": host_cpu_s,
        "mem": {
            "before": mem_before.json(),
            "open": mem_open.json(),
            "held": mem_held.json(),
        },
        "per_websocket": {
            "open": mem_open.per(&mem_before, opened),
            "held": mem_held.per(&mem_before, opened),
        },
    }))
}
