//! Ray's dashboard metrics port: what Ray's dashboard head serves on
//! `DASHBOARD_METRIC_PORT` (its `_setup_metrics`), for Prometheus to find
//! through the GCS key `DashboardMetricsAddress` (written by the GCS
//! watcher). The series are [`crate::metrics::ray_series`]'s; this binds the port,
//! serves them, and samples the host's and the modules' CPU and memory
//! every `METRICS_RECORD_INTERVAL_S`, as Ray's `_record_dashboard_metrics`
//! does.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header;
use axum::response::IntoResponse;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::ray_series::{ComponentSample, HostSample, RayMetrics, HOST_COMPONENT};
use crate::supervisor::Supervisor;

/// Ray's default metrics port (`ray/dashboard/consts.py`).
pub const DEFAULT_PORT: u16 = 44227;
/// Ray's default `METRICS_RECORD_INTERVAL_S`: how often CPU and memory are
/// sampled.
const DEFAULT_RECORD_INTERVAL: Duration = Duration::from_secs(5);

/// The metrics port Ray's dashboard would use: `DASHBOARD_METRIC_PORT`, or
/// 44227.
pub fn port(env: impl Fn(&str) -> Option<String>) -> u16 {
    env("DASHBOARD_METRIC_PORT")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_PORT)
}

/// How often CPU and memory are sampled: `METRICS_RECORD_INTERVAL_S`, or
/// 5 s.
pub fn record_interval(env: impl Fn(&str) -> Option<String>) -> Duration {
    env("METRICS_RECORD_INTERVAL_S")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_RECORD_INTERVAL, Duration::from_secs)
}

/// Where ray-dashd serves Ray's dashboard metrics.
#[derive(Debug)]
pub struct MetricsPort {
    /// The bound port.
    pub listener: TcpListener,
    /// Ray's own dashboard process, when it holds Ray's port: its series
    /// are served too, merged into ray-dashd's.
    pub ray_own: Option<SocketAddr>,
}

/// How long a scrape waits for the series of Ray's own dashboard process.
const RAY_OWN_WITHIN: Duration = Duration::from_secs(2);

/// The most of Ray's own dashboard process's answer that is read.
const RAY_OWN_MAX_BYTES: usize = 16 << 20;

/// Binds the metrics port as Ray does: on the head's IP when that is a
/// loopback address, else on all addresses.
///
/// Ray 2.60's `ray start --include-dashboard=false` still runs a dashboard
/// process of its own (its usage-stats module only), which binds `port`
/// first and writes it to `DashboardMetricsAddress`. Then ray-dashd binds
/// the next port, serves that process's series merged into its own there,
/// and its `DashboardMetricsAddress` (written after Ray's, and again each
/// minute) points Prometheus's discovery at the merged port: nothing of
/// either is lost. `None`, logged once, when neither can be bound:
/// everything else is served all the same.
pub async fn bind(head_ip: IpAddr, port: u16) -> Option<MetricsPort> {
    let ip = if head_ip.is_loopback() {
        head_ip
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    };
    let addr = SocketAddr::new(ip, port);
    let taken = match TcpListener::bind(addr).await {
        Ok(listener) => {
            return Some(MetricsPort {
                listener,
                ray_own: None,
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => error,
        Err(error) => {
            warn!(%addr, %error, "cannot bind Ray's dashboard metrics port (DASHBOARD_METRIC_PORT); not serving Ray's dashboard metrics");
            return None;
        }
    };
    let next = SocketAddr::new(ip, port.checked_add(1)?);
    match TcpListener::bind(next).await {
        Ok(listener) => {
            info!(
                taken = %addr,
                serving = %next,
                "Ray's dashboard metrics port is taken (Ray's own dashboard process, as a rule); \
                 serving Ray's dashboard metrics on the next port, with the taken port's merged in"
            );
            Some(MetricsPort {
                listener,
                ray_own: Some(SocketAddr::new(head_ip, port)),
            })
        }
        Err(error) => {
            warn!(%addr, %next, taken = %taken, %error, "cannot bind Ray's dashboard metrics port (DASHBOARD_METRIC_PORT) nor the next; not serving Ray's dashboard metrics");
            None
        }
    }
}

/// Serves `metrics` on `port` (any path, as Ray's exporter does; the text
/// format 0.0.4 unless `Accept` asks for OpenMetrics, as Prometheus's
/// client libraries answer) and samples the components every `interval`,
/// until `stop`.
pub fn serve(
    port: MetricsPort,
    metrics: Arc<RayMetrics>,
    supervisor: Arc<Supervisor>,
    interval: Duration,
    stop: CancellationToken,
) {
    let MetricsPort { listener, ray_own } = port;
    let scraped = Arc::clone(&metrics);
    let app = Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let metrics = Arc::clone(&scraped);
        async move {
            let mut text = metrics.encode();
            if let Some(ray_own) = ray_own {
                if let Some(theirs) = scrape_ray_own(ray_own).await {
                    text = crate::metrics::merge_openmetrics(&text, &theirs);
                }
            }
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
            if crate::metrics::wants_openmetrics(accept) {
                ([(header::CONTENT_TYPE, crate::metrics::OPENMETRICS)], text).into_response()
            } else {
                (
                    [(header::CONTENT_TYPE, crate::metrics::TEXT_004)],
                    crate::metrics::to_text_004(&text),
                )
                    .into_response()
            }
        }
    });
    let shutdown = stop.clone();
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            warn!(%error, "Ray's dashboard metrics server stopped");
        }
    });
    tokio::spawn(sample(metrics, supervisor, interval, stop));
}

/// The OpenMetrics text Ray's own dashboard process serves at `addr`, if
/// it answers one within [`RAY_OWN_WITHIN`]; else nothing, logged at debug
/// level (a scrape goes on with ray-dashd's own series).
async fn scrape_ray_own(addr: SocketAddr) -> Option<String> {
    let scraped = tokio::time::timeout(RAY_OWN_WITHIN, async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = axum::http::Request::get("/metrics")
            .header(header::HOST, addr.to_string())
            .header(
                header::ACCEPT,
                "application/openmetrics-text; version=1.0.0",
            )
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let openmetrics = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/openmetrics-text"));
        if !response.status().is_success() || !openmetrics {
            return Err(format!(
                "answered {} ({:?}), not OpenMetrics",
                response.status(),
                response.headers().get(header::CONTENT_TYPE)
            )
            .into());
        }
        let body = http_body_util::Limited::new(response.into_body(), RAY_OWN_MAX_BYTES);
        let bytes = http_body_util::BodyExt::collect(body).await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(String::from_utf8(bytes.to_vec())?)
    })
    .await;
    match scraped {
        Ok(Ok(text)) => Some(text),
        Ok(Err(error)) => {
            debug!(%addr, %error, "no series from Ray's own dashboard process");
            None
        }
        Err(_) => {
            debug!(%addr, "no series from Ray's own dashboard process in time");
            None
        }
    }
}

/// Samples CPU and memory of the host and every module with a process,
/// every `interval`; CPU is the share of one core used since the last
/// sample, as psutil's `cpu_percent()` gives it.
async fn sample(
    metrics: Arc<RayMetrics>,
    supervisor: Arc<Supervisor>,
    interval: Duration,
    stop: CancellationToken,
) {
    let ticks_per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(100.0, |t| t as f64);
    let mut last: HashMap<u32, (u64, Instant)> = HashMap::new();
    let mut lag = Duration::ZERO;
    loop {
        let mut processes = vec![(HOST_COMPONENT.to_owned(), std::process::id())];
        for module in supervisor.modules().iter() {
            if let Some(pid) = module.report().pid {
                processes.push((format!("dashboard_{}", module.name()), pid));
            }
        }
        // `/proc` reads (`smaps_rollup` walks a process's page tables)
        // never on the runtime's thread.
        let before = std::mem::take(&mut last);
        let (components, seen) = tokio::task::spawn_blocking(move || {
            read_components(processes, &before, ticks_per_second)
        })
        .await
        // A read that panicked: no sample this time.
        .unwrap_or_default();
        last = seen;
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        metrics.set_sampled(
            components,
            HostSample {
                tasks: i64::try_from(tasks).unwrap_or(i64::MAX),
                lag_seconds: lag.as_secs_f64(),
            },
        );
        let due = tokio::time::Instant::now() + interval;
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = stop.cancelled() => {
                debug!("Ray's dashboard metrics sampler stopped");
                return;
            }
        }
        lag = tokio::time::Instant::now().saturating_duration_since(due);
    }
}

/// CPU, RSS and USS of each `(component, pid)`; CPU as the share of a core
/// since `last` (ticks and when, by pid), which it returns anew. Blocking.
fn read_components(
    processes: Vec<(String, u32)>,
    last: &HashMap<u32, (u64, Instant)>,
    ticks_per_second: f64,
) -> (Vec<ComponentSample>, HashMap<u32, (u64, Instant)>) {
    let now = Instant::now();
    let mut seen = HashMap::with_capacity(processes.len());
    let components = processes
        .into_iter()
        .filter_map(|(component, pid)| {
            let stat = ray_dashd_contract::proc::stat(pid).ok()?;
            let ticks = stat.utime + stat.stime;
            let cpu_percent = match last.get(&pid) {
                Some((before, at)) if ticks >= *before => {
                    let wall = now.duration_since(*at).as_secs_f64();
                    if wall > 0.0 {
                        (ticks - before) as f64 / ticks_per_second / wall * 100.0
                    } else {
                        0.0
                    }
                }
                _ => 0.0,
            };
            seen.insert(pid, (ticks, now));
            let rss_bytes = ray_dashd_contract::proc::status_kib(pid, "VmRSS")
                .unwrap_or(0)
                .saturating_mul(1024);
            Some(ComponentSample {
                component,
                pid,
                cpu_percent,
                rss_bytes,
                uss_bytes: uss_bytes(pid).unwrap_or(0),
            })
        })
        .collect();
    (components, seen)
}

/// A process's unique set size: its private pages, from
/// `/proc/<pid>/smaps_rollup`.
fn uss_bytes(pid: u32) -> Option<u64> {
    crate::fault::fault_point!("ray-component-sample");
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = text
        .lines()
        .filter(|line| {
            line.starts_with("Private_Clean:")
                || line.starts_with("Private_Dirty:")
                || line.starts_with("Private_Hugetlb:")
        })
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The port and interval come from Ray's variables, else Ray's defaults.
    #[test]
    fn port_and_interval_follow_rays_variables() {
        let none = |_: &str| None;
        assert_eq!(port(none), 44227);
        assert_eq!(record_interval(none), Duration::from_secs(5));
        let set = |name: &str| match name {
            "DASHBOARD_METRIC_PORT" => Some("45001".to_owned()),
            "METRICS_RECORD_INTERVAL_S" => Some("2".to_owned()),
            _ => None,
        };
        assert_eq!(port(set), 45001);
        assert_eq!(record_interval(set), Duration::from_secs(2));
    }

    /// This process has private pages.
    #[test]
    fn reads_its_own_uss() {
        assert!(uss_bytes(std::process::id()).is_some_and(|b| b > 0));
    }
}
