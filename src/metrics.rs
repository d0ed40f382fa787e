//! The host's own metrics, served at `GET /metrics` in Prometheus text
//! format: what the proxy records on the request path ([`ModuleMetrics`],
//! made once per module), and what a scrape reads of the modules and of the
//! process ([`Scrape`]). Below the supervisor and the proxy, which record
//! into it; it knows neither.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http::StatusCode;
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use ray_dashd_contract::LockExt;

use crate::routes::{RouteKind, RouteSpec};
use ray_series::{RayMetrics, RouteSeries};

mod merge;
pub mod ray_series;

pub use merge::merge_openmetrics;

/// What every series' name starts with.
const PREFIX: &str = "ray_dashd";

/// Upper bounds of the request latency buckets, in seconds: from a cached
/// answer (a millisecond) to the proxy's longest response timeout.
const LATENCY_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The route kinds, in the order [`ModuleMetrics`] indexes them.
const KINDS: [RouteKind; 3] = [RouteKind::Http, RouteKind::Stream, RouteKind::Websocket];
/// The status classes, in the order [`ModuleMetrics`] indexes them (a
/// websocket's handshake is a 101).
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// A request series' labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    module: String,
    kind: &'static str,
    class: &'static str,
}

/// A module series' labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModuleLabels {
    module: String,
}

/// The labels of a module's open websockets or streams.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpenLabels {
    module: String,
    kind: &'static str,
}

/// A module's state, info style: 1 for the state it is in.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    module: String,
    state: &'static str,
}

/// A log writer's labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriterLabels {
    writer: &'static str,
}

type LatencyFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The host's metrics: the series recorded as requests pass, in one
/// registry, and what is read at each scrape.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    open: Family<OpenLabels, Gauge>,
    bytes_in: Family<ModuleLabels, Counter>,
    bytes_out: Family<ModuleLabels, Counter>,
    /// How many [`ModuleMetrics`] of each name live: a module changed by a
    /// reload has two for a while, and its series go only with the last.
    /// Locked when a module is made or dropped, never on the request path.
    live: Mutex<HashMap<String, usize>>,
    /// The client connections served now, and the cap, once the server
    /// accepts.
    clients: OnceLock<ClientCount>,
    /// What reads how many of them are parked between requests.
    waiting_clients: OnceLock<Arc<AtomicUsize>>,
    /// Ray's dashboard series, when Ray's modules are hosted.
    ray: Option<Arc<RayMetrics>>,
}

/// The cap on client connections, and what reads how many are served now.
struct ClientCount(usize, Box<dyn Fn() -> usize + Send + Sync>);

impl std::fmt::Debug for ClientCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCount").field("max", &self.0).finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Metrics with no module yet.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = LatencyFamily::new_with_constructor(latency_histogram);
        let open = Family::<OpenLabels, Gauge>::default();
        let bytes_in = Family::<ModuleLabels, Counter>::default();
        let bytes_out = Family::<ModuleLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests for module routes, by module, route kind and status class",
            requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time from a module route's request to its response head (the whole \
             exchange for an error the host answers)",
            Unit::Seconds,
            latency.clone(),
        );
        registry.register(
            "open",
            "Websockets relayed and stream responses being sent, by module and route kind",
            open.clone(),
        );
        registry.register_with_unit(
            "request_body",
            "Request body bytes forwarded to the module",
            Unit::Bytes,
            bytes_in.clone(),
        );
        registry.register_with_unit(
            "response_body",
            "Response body bytes forwarded from the module (websocket messages not included)",
            Unit::Bytes,
            bytes_out.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            open,
            bytes_in,
            bytes_out,
            live: Mutex::new(HashMap::new()),
            clients: OnceLock::new(),
            waiting_clients: OnceLock::new(),
            ray: None,
        }
    }

    /// Records Ray's dashboard series into `ray` too.
    pub fn with_ray(mut self, ray: Arc<RayMetrics>) -> Metrics {
        self.ray = Some(ray);
        self
    }

    /// Ray's dashboard series, when Ray's modules are hosted.
    pub fn ray(&self) -> Option<&Arc<RayMetrics>> {
        self.ray.as_ref()
    }

    /// The series of module `name` and its `routes`, made now so that the
    /// request path finds them without a lookup; its series stay until the
    /// last [`ModuleMetrics`] of that name is dropped.
    pub fn module(self: &Arc<Metrics>, name: &str, routes: &[RouteSpec]) -> ModuleMetrics {
        *self.live.locked().entry(name.to_owned()).or_default() += 1;
        let request = |kind: RouteKind, class: &'static str| RequestLabels {
            module: name.to_owned(),
            kind: kind_label(kind),
            class,
        };
        let requests = KINDS.map(|kind| {
            CLASSES.map(|class| self.requests.get_or_create_owned(&request(kind, class)))
        });
        let latency = KINDS.map(|kind| {
            CLASSES.map(|class| self.latency.get_or_create_owned(&request(kind, class)))
        });
        let open = |kind| OpenLabels {
            module: name.to_owned(),
            kind,
        };
        let module = ModuleLabels {
            module: name.to_owned(),
        };
        ModuleMetrics {
            name: name.to_owned(),
            metrics: Arc::clone(self),
            requests,
            latency,
            websockets: self.open.get_or_create_owned(&open("websocket")),
            streams: self.open.get_or_create_owned(&open("stream")),
            bytes_in: self.bytes_in.get_or_create_owned(&module),
            bytes_out: self.bytes_out.get_or_create_owned(&module),
            ray_routes: self.ray.as_ref().map_or_else(Box::default, |ray| {
                routes.iter().map(|route| ray.route(route)).collect()
            }),
        }
    }

    /// Removes module `name`'s series.
    fn forget(&self, name: &str) {
        for kind in KINDS {
            for class in CLASSES {
                let labels = RequestLabels {
                    module: name.to_owned(),
                    kind: kind_label(kind),
                    class,
                };
                self.requests.remove(&labels);
                self.latency.remove(&labels);
            }
        }
        for kind in ["websocket", "stream"] {
            self.open.remove(&OpenLabels {
                module: name.to_owned(),
                kind,
            });
        }
        let module = ModuleLabels {
            module: name.to_owned(),
        };
        self.bytes_in.remove(&module);
        self.bytes_out.remove(&module);
    }

    /// Where the client connections served now are read from, and their
    /// cap; set once, by the accept loop.
    pub fn set_clients(&self, max: usize, count: impl Fn() -> usize + Send + Sync + 'static) {
        let _ = self.clients.set(ClientCount(max, Box::new(count)));
    }

    /// Where the client connections parked between requests now are read
    /// from; set once, by the accept loop.
    pub fn set_waiting_clients(&self, count: Arc<AtomicUsize>) {
        let _ = self.waiting_clients.set(count);
    }

    /// Every series, in Prometheus text format: those recorded, then
    /// `scrape`'s and the process's.
    pub fn encode(&self, scrape: &Scrape<'_>) -> String {
        let mut out = String::new();
        let waiting = self.waiting_clients.get().map(|n| n.load(Relaxed));
        let read = scrape.registry(self.clients.get(), waiting);
        // Writing to a String cannot fail, nor can the crate's encoders
        // but through the writer.
        let _ = text::encode_registry(&mut out, &self.registry)
            .and_then(|()| text::encode_registry(&mut out, &read))
            .and_then(|()| text::encode_eof(&mut out));
        out
    }
}

/// The label of a route kind.
fn kind_label(kind: RouteKind) -> &'static str {
    match kind {
        RouteKind::Http => "http",
        RouteKind::Stream => "stream",
        RouteKind::Websocket => "websocket",
    }
}

fn kind_index(kind: RouteKind) -> usize {
    match kind {
        RouteKind::Http => 0,
        RouteKind::Stream => 1,
        RouteKind::Websocket => 2,
    }
}

fn class_index(status: StatusCode) -> usize {
    usize::from(status.as_u16() / 100)
        .clamp(1, CLASSES.len())
        .saturating_sub(1)
}

// === impl ModuleMetrics ===

/// One module's series, made when the module is: recording a request is
/// an index into arrays and atomic adds (the histogram's own lock aside).
#[derive(Debug)]
pub struct ModuleMetrics {
    name: String,
    metrics: Arc<Metrics>,
    /// By route kind, then status class.
    requests: [[Counter; CLASSES.len()]; KINDS.len()],
    latency: [[Histogram; CLASSES.len()]; KINDS.len()],
    websockets: Gauge,
    streams: Gauge,
    bytes_in: Counter,
    bytes_out: Counter,
    /// Ray's series of each of the module's routes, in their order; empty
    /// unless Ray's modules are hosted.
    ray_routes: Box<[RouteSeries]>,
}

impl ModuleMetrics {
    /// Counts a request for the module's route number `route`, of `kind`,
    /// answered with `status` after `elapsed`.
    pub fn record(&self, kind: RouteKind, route: usize, status: StatusCode, elapsed: Duration) {
        let (k, c) = (kind_index(kind), class_index(status));
        let seconds = elapsed.as_secs_f64();
        self.requests[k][c].inc();
        self.latency[k][c].observe(seconds);
        if let (Some(series), Some(ray)) = (self.ray_routes.get(route), &self.metrics.ray) {
            series.record(ray, status, seconds);
        }
    }

    /// Counts a websocket open until the guard is dropped.
    pub fn websocket_open(&self) -> OpenGuard {
        OpenGuard::new(&self.websockets)
    }

    /// Counts a stream response open until the guard is dropped.
    pub fn stream_open(&self) -> OpenGuard {
        OpenGuard::new(&self.streams)
    }

    /// The request body byte counter.
    pub fn bytes_in(&self) -> &Counter {
        &self.bytes_in
    }

    /// The response body byte counter.
    pub fn bytes_out(&self) -> &Counter {
        &self.bytes_out
    }
}

impl Drop for ModuleMetrics {
    fn drop(&mut self) {
        let mut live = self.metrics.live.locked();
        if let Some(count) = live.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                live.remove(&self.name);
                // Under the lock, so that a module of this name made
                // meanwhile keeps its series.
                self.metrics.forget(&self.name);
            }
        }
    }
}

/// Holds one count of an open websocket or stream.
#[derive(Debug)]
pub struct OpenGuard(Gauge);

impl OpenGuard {
    fn new(gauge: &Gauge) -> OpenGuard {
        gauge.inc();
        OpenGuard(gauge.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

// === impl Scrape ===

/// One module as a scrape reads it from the supervisor.
#[derive(Debug, Clone)]
pub struct ModuleSample<'a> {
    /// The module's name.
    pub name: &'a str,
    /// Its state's name (`healthy`, `backoff`, …), as the label shows it.
    pub state: &'static str,
    /// Whether its requests are served (it is healthy, or dormant).
    pub up: bool,
    /// Incarnations started after the first.
    pub restarts: u32,
    /// The last successful health check's round trip.
    pub health_rtt: Option<Duration>,
    /// Requests being served by it or waiting for a connection to it.
    pub in_flight: usize,
}

/// What a scrape reads besides the recorded series.
#[derive(Debug, Default)]
pub struct Scrape<'a> {
    /// Every module now.
    pub modules: Vec<ModuleSample<'a>>,
    /// Lines each log writer dropped, by writer.
    pub dropped_log_lines: Vec<(&'static str, u64)>,
    /// The host process's own readings.
    pub process: ProcessReadings,
}

/// What `/proc` says of the host process: read off the async runtime
/// ([`ProcessReadings::read`] blocks) before a scrape is encoded.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessReadings {
    /// File descriptors open in the host.
    pub open_fds: Option<i64>,
    /// Its resident set size, in bytes.
    pub rss_bytes: Option<u64>,
}

impl ProcessReadings {
    /// Reads them. Blocking: `/proc/self/fd` lists one entry per open
    /// file, thousands with thousands of clients.
    pub fn read() -> ProcessReadings {
        ProcessReadings {
            open_fds: open_fds(),
            rss_bytes: ray_dashd_contract::proc::status_kib(std::process::id(), "VmRSS")
                .map(|kib| kib.saturating_mul(1024)),
        }
    }
}

impl Scrape<'_> {
    /// The series read now, in a registry of their own.
    fn registry(&self, clients: Option<&ClientCount>, waiting: Option<usize>) -> Registry {
        let mut registry = Registry::with_prefix(PREFIX);
        let up = Family::<ModuleLabels, Gauge>::default();
        let state = Family::<StateLabels, Gauge>::default();
        let restarts = Family::<ModuleLabels, Counter>::default();
        let rtt = Family::<ModuleLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let in_flight = Family::<ModuleLabels, Gauge>::default();
        for m in &self.modules {
            let labels = ModuleLabels {
                module: m.name.to_owned(),
            };
            up.get_or_create(&labels).set(i64::from(m.up));
            state
                .get_or_create(&StateLabels {
                    module: m.name.to_owned(),
                    state: m.state,
                })
                .set(1);
            restarts
                .get_or_create(&labels)
                .inc_by(u64::from(m.restarts));
            if let Some(d) = m.health_rtt {
                rtt.get_or_create(&labels).set(d.as_secs_f64());
            }
            in_flight
                .get_or_create(&labels)
                .set(i64::try_from(m.in_flight).unwrap_or(i64::MAX));
        }
        registry.register(
            "module_up",
            "1 while the module's requests are served: it is healthy, or dormant (started on \
             demand, by the first); else 0",
            up,
        );
        registry.register(
            "module_state",
            "1 for the state the module is in (dormant, starting, waiting, healthy, \
             unhealthy, backoff, stopping, stopped)",
            state,
        );
        registry.register(
            "module_restarts",
            "Incarnations of the module started after its first",
            restarts,
        );
        registry.register_with_unit(
            "module_health_rtt",
            "Round trip of the module's last successful health check",
            Unit::Seconds,
            rtt,
        );
        registry.register(
            "module_in_flight",
            "Requests being served by the module or waiting for a connection to it",
            in_flight,
        );
        if let Some(ClientCount(max, count)) = clients {
            let open = Gauge::<i64>::default();
            open.set(i64::try_from(count()).unwrap_or(i64::MAX));
            registry.register("client_connections", "Client connections served", open);
            let cap = Gauge::<i64>::default();
            cap.set(i64::try_from(*max).unwrap_or(i64::MAX));
            registry.register(
                "client_connections_max",
                "Client connections served at most at once",
                cap,
            );
        }
        if let Some(waiting) = waiting {
            let parked = Gauge::<i64>::default();
            parked.set(i64::try_from(waiting).unwrap_or(i64::MAX));
            registry.register(
                "client_connections_waiting",
                "Client connections idle between requests, parked with no HTTP state",
                parked,
            );
        }
        let dropped = Family::<WriterLabels, Counter>::default();
        for (writer, lines) in &self.dropped_log_lines {
            dropped
                .get_or_create(&WriterLabels { writer })
                .inc_by(*lines);
        }
        registry.register(
            "log_dropped_lines",
            "Log lines dropped because a writer fell behind, by writer",
            dropped,
        );
        if let Some(fds) = self.process.open_fds {
            let gauge = Gauge::<i64>::default();
            gauge.set(fds);
            registry.register("open_fds", "File descriptors open in the host", gauge);
        }
        if let Some(bytes) = self.process.rss_bytes {
            let gauge = Gauge::<i64>::default();
            gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
            registry.register_with_unit(
                "resident_memory",
                "Resident set size of the host",
                Unit::Bytes,
                gauge,
            );
        }
        registry
    }
}

/// The host's open file descriptors (the one reading them included).
fn open_fds() -> Option<i64> {
    crate::fault::fault_point!("host-fd-count");
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    i64::try_from(entries.count()).ok()
}

/// The content type of the Prometheus text format 0.0.4, which
/// Prometheus's own client libraries answer unless asked for OpenMetrics.
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The content type of OpenMetrics text 1.0.0.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics (as Prometheus does
/// when its scrape config allows it).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|accept| {
        accept.split(',').any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    })
}

/// OpenMetrics text (what [`Metrics::encode`] writes) as the text format
/// 0.0.4: no `# EOF` nor `# UNIT` lines, and a counter's family named as
/// its samples are (`foo_total`), as 0.0.4 parsers match them.
pub fn to_text_004(openmetrics: &str) -> String {
    let mut counters: Vec<&str> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.push(name);
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(line) => out.push_str(&line),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A series' name and labels as the text format writes them.
#[cfg(test)]
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    use std::fmt::Write as _;
    let mut out = format!("{name}{{");
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{v}\"");
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request recorded shows in its module's counter and histogram, by
    /// kind and class; the series go with the module's last metrics.
    #[test]
    fn records_requests_by_module_kind_and_class() {
        let metrics = Arc::new(Metrics::new());
        let echo = metrics.module("echo", &[]);
        echo.record(RouteKind::Http, 0, StatusCode::OK, Duration::from_millis(3));
        echo.record(RouteKind::Http, 0, StatusCode::OK, Duration::from_millis(3));
        echo.record(
            RouteKind::Stream,
            0,
            StatusCode::BAD_GATEWAY,
            Duration::from_millis(3),
        );
        echo.bytes_out().inc_by(5);
        let _ws = echo.websocket_open();
        let text = metrics.encode(&Scrape::default());
        let ok = series(
            "ray_dashd_requests_total",
            &[("module", "echo"), ("kind", "http"), ("class", "2xx")],
        );
        assert!(text.contains(&format!("{ok} 2\n")), "{text}");
        let bad = series(
            "ray_dashd_requests_total",
            &[("module", "echo"), ("kind", "stream"), ("class", "5xx")],
        );
        assert!(text.contains(&format!("{bad} 1\n")), "{text}");
        assert!(
            text.contains(
                "ray_dashd_request_duration_seconds_count{module=\"echo\",kind=\"http\",class=\"2xx\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ray_dashd_response_body_bytes_total{module=\"echo\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("ray_dashd_open{module=\"echo\",kind=\"websocket\"} 1\n"),
            "{text}"
        );
        // A changed module: two live at once; the series stay with the new.
        let again = metrics.module("echo", &[]);
        drop(echo);
        let text = metrics.encode(&Scrape::default());
        assert!(text.contains(&format!("{ok} 2\n")), "{text}");
        drop(again);
        drop(_ws);
        let text = metrics.encode(&Scrape::default());
        assert!(!text.contains("module=\"echo\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// A scrape reports each module's state and the process's own series.
    #[test]
    fn text_004_unless_openmetrics_is_asked_for() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
        let openmetrics = "# HELP ray_dashd_requests Requests.\n\
            # TYPE ray_dashd_requests counter\n\
            ray_dashd_requests_total{module=\"m\"} 3\n\
            # HELP ray_dashd_latency_seconds Latency.\n\
            # TYPE ray_dashd_latency_seconds histogram\n\
            # UNIT ray_dashd_latency_seconds seconds\n\
            ray_dashd_latency_seconds_count 1\n\
            # EOF\n";
        assert_eq!(
            to_text_004(openmetrics),
            "# HELP ray_dashd_requests_total Requests.\n\
             # TYPE ray_dashd_requests_total counter\n\
             ray_dashd_requests_total{module=\"m\"} 3\n\
             # HELP ray_dashd_latency_seconds Latency.\n\
             # TYPE ray_dashd_latency_seconds histogram\n\
             ray_dashd_latency_seconds_count 1\n"
        );
    }

    #[test]
    fn a_scrape_reports_modules_and_the_process() {
        let metrics = Metrics::new();
        metrics.set_clients(10, || 3);
        let scrape = Scrape {
            modules: vec![ModuleSample {
                name: "echo",
                state: "backoff",
                up: false,
                restarts: 2,
                health_rtt: Some(Duration::from_millis(2)),
                in_flight: 1,
            }],
            dropped_log_lines: vec![("stderr", 4)],
            process: ProcessReadings::read(),
        };
        let text = metrics.encode(&scrape);
        for line in [
            "ray_dashd_module_up{module=\"echo\"} 0\n",
            "ray_dashd_module_state{module=\"echo\",state=\"backoff\"} 1\n",
            "ray_dashd_module_restarts_total{module=\"echo\"} 2\n",
            "ray_dashd_module_health_rtt_seconds{module=\"echo\"} 0.002\n",
            "ray_dashd_module_in_flight{module=\"echo\"} 1\n",
            "ray_dashd_client_connections 3\n",
            "ray_dashd_client_connections_max 10\n",
            "ray_dashd_log_dropped_lines_total{writer=\"stderr\"} 4\n",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        assert!(text.contains("ray_dashd_open_fds "), "{text}");
        assert!(text.contains("ray_dashd_resident_memory_bytes "), "{text}");
    }
}
