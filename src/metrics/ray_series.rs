//! Ray's dashboard metrics, under the names and labels Ray's dashboard
//! gives them (`ray/dashboard/dashboard_metrics.py`): the API requests by
//! route pattern, and each component's CPU and memory. Served on Ray's
//! `DASHBOARD_METRIC_PORT` (see `crate::ray::metrics_port`) when Ray's modules
//! are hosted.

use std::sync::{Mutex, OnceLock};

use http::StatusCode;
use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use ray_dashd_contract::LockExt;

use super::{class_index, CLASSES};
use crate::routes::RouteSpec;

/// Ray's buckets for the API's durations, in seconds (5 ms … 60 s).
const BUCKETS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    60.0,
];

/// The `Component` of the dashboard's own series, as Ray names it.
pub const HOST_COMPONENT: &str = "dashboard";

/// What labels every series: Ray's version and session.
#[derive(Debug, Clone)]
pub struct RayLabels {
    /// The installed Ray's `__version__`.
    pub version: String,
    /// The session's name (`session_<date>_<pid>`).
    pub session_name: String,
}

// Ray's label names are its own, capitals included.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CountLabels {
    method: String,
    endpoint: String,
    http_status: &'static str,
    Version: String,
    SessionName: String,
    Component: &'static str,
}

#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    endpoint: String,
    http_status: &'static str,
    Version: String,
    SessionName: String,
    Component: &'static str,
}

#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComponentLabels {
    ip: String,
    pid: String,
    Version: String,
    Component: String,
    SessionName: String,
}

type DurationFamily = Family<DurationLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// One process as the sampler last measured it.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentSample {
    /// `dashboard`, or `dashboard_<ModuleName>`.
    pub component: String,
    /// Its pid.
    pub pid: u32,
    /// CPU used since the previous sample, in percent of one core.
    pub cpu_percent: f64,
    /// Resident set size, in bytes.
    pub rss_bytes: u64,
    /// Unique set size (private pages), in bytes.
    pub uss_bytes: u64,
}

/// What the sampler measured last, besides the components.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostSample {
    /// Tasks alive in the host's runtime.
    pub tasks: i64,
    /// How late the sampler's last tick woke, in seconds.
    pub lag_seconds: f64,
}

/// Ray's dashboard series.
#[derive(Debug)]
pub struct RayMetrics {
    labels: RayLabels,
    /// The head's IP, for the components' `ip`.
    ip: String,
    registry: Registry,
    count: Family<CountLabels, Counter>,
    duration: DurationFamily,
    /// Replaced whole by each sample; read by scrapes. Neither holds it
    /// long, and the request path never takes it.
    sampled: Mutex<(Vec<ComponentSample>, HostSample)>,
}

impl RayMetrics {
    /// Ray's series, labelled with `labels` and, for the components, `ip`.
    pub fn new(labels: RayLabels, ip: String) -> RayMetrics {
        let mut registry = Registry::with_prefix("ray");
        let count = Family::<CountLabels, Counter>::default();
        let duration = DurationFamily::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "dashboard_api_requests_count",
            "Total requests count per endpoint",
            Unit::Other("requests".to_owned()),
            count.clone(),
        );
        registry.register_with_unit(
            "dashboard_api_requests_duration",
            "Total duration in seconds per endpoint",
            Unit::Seconds,
            duration.clone(),
        );
        RayMetrics {
            labels,
            ip,
            registry,
            count,
            duration,
            sampled: Mutex::new(Default::default()),
        }
    }

    /// The series of `route`, one per status class, each made at its
    /// first request.
    pub(super) fn route(&self, route: &RouteSpec) -> RouteSeries {
        RouteSeries {
            by_class: Default::default(),
            method: route.method.to_string(),
            endpoint: route.path.clone(),
        }
    }

    /// The counter and histogram of `route`'s requests answered in `class`.
    fn series(&self, route: &RouteSeries, class: &'static str) -> (Counter, Histogram) {
        let count = self.count.get_or_create_owned(&CountLabels {
            method: route.method.clone(),
            endpoint: route.endpoint.clone(),
            http_status: class,
            Version: self.labels.version.clone(),
            SessionName: self.labels.session_name.clone(),
            Component: HOST_COMPONENT,
        });
        let duration = self.duration.get_or_create_owned(&DurationLabels {
            endpoint: route.endpoint.clone(),
            http_status: class,
            Version: self.labels.version.clone(),
            SessionName: self.labels.session_name.clone(),
            Component: HOST_COMPONENT,
        });
        (count, duration)
    }

    /// Keeps what the sampler measured, for the scrapes until the next.
    pub fn set_sampled(&self, components: Vec<ComponentSample>, host: HostSample) {
        *self.sampled.locked() = (components, host);
    }

    /// Every series, in Prometheus text format.
    pub fn encode(&self) -> String {
        let (components, host) = self.sampled.locked().clone();
        let mut sampled = Registry::with_prefix("ray");
        let cpu = Family::<ComponentLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let rss_mb = Family::<ComponentLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let rss_bytes = Family::<ComponentLabels, Gauge>::default();
        let uss_mb = Family::<ComponentLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let uss_bytes = Family::<ComponentLabels, Gauge>::default();
        let tasks = Family::<ComponentLabels, Gauge>::default();
        let lag = Family::<ComponentLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let int = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
        for c in &components {
            let labels = self.component_labels(&c.component, c.pid);
            cpu.get_or_create(&labels).set(c.cpu_percent);
            rss_mb.get_or_create(&labels).set(mb(c.rss_bytes));
            rss_bytes.get_or_create(&labels).set(int(c.rss_bytes));
            uss_mb.get_or_create(&labels).set(mb(c.uss_bytes));
            uss_bytes.get_or_create(&labels).set(int(c.uss_bytes));
        }
        if let Some(own) = components.iter().find(|c| c.component == HOST_COMPONENT) {
            let labels = self.component_labels(HOST_COMPONENT, own.pid);
            tasks.get_or_create(&labels).set(host.tasks);
            lag.get_or_create(&labels).set(host.lag_seconds);
        }
        let percentage = Unit::Other("percentage".to_owned());
        let megabytes = Unit::Other("mb".to_owned());
        sampled.register_with_unit(
            "component_cpu",
            "Dashboard CPU percentage usage",
            percentage,
            cpu,
        );
        sampled.register_with_unit(
            "component_rss",
            "RSS usage of all components on the node",
            megabytes.clone(),
            rss_mb,
        );
        sampled.register_with_unit(
            "component_rss",
            "RSS usage of all components on the node",
            Unit::Bytes,
            rss_bytes,
        );
        sampled.register_with_unit(
            "component_uss",
            "USS usage of all components on the node",
            megabytes,
            uss_mb,
        );
        sampled.register_with_unit(
            "component_uss",
            "USS usage of all components on the node",
            Unit::Bytes,
            uss_bytes,
        );
        // The unit is in the name already, where Ray's exporter leaves it.
        sampled.register(
            "dashboard_event_loop_tasks",
            "Number of tasks alive in the host's runtime",
            tasks,
        );
        sampled.register_with_unit(
            "dashboard_event_loop_lag",
            "How late the host's runtime woke a timer, in seconds",
            Unit::Seconds,
            lag,
        );
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = text::encode_registry(&mut out, &self.registry)
            .and_then(|()| text::encode_registry(&mut out, &sampled))
            .and_then(|()| text::encode_eof(&mut out));
        out
    }

    fn component_labels(&self, component: &str, pid: u32) -> ComponentLabels {
        ComponentLabels {
            ip: self.ip.clone(),
            pid: pid.to_string(),
            Version: self.labels.version.clone(),
            Component: component.to_owned(),
            SessionName: self.labels.session_name.clone(),
        }
    }
}

/// One route's request series, by status class, each made at the first
/// request answered in its class (as Ray's exporter shows a series only
/// once it was recorded), then found without a lookup. They stay when the
/// route goes (a reload), as Ray's own do.
#[derive(Debug)]
pub(super) struct RouteSeries {
    by_class: [OnceLock<(Counter, Histogram)>; CLASSES.len()],
    method: String,
    endpoint: String,
}

impl RouteSeries {
    /// Counts a request answered with `status` after `seconds`.
    pub(super) fn record(&self, ray: &RayMetrics, status: StatusCode, seconds: f64) {
        let index = class_index(status);
        let (count, duration) =
            self.by_class[index].get_or_init(|| ray.series(self, CLASSES[index]));
        count.inc();
        duration.observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series carry Ray's names, units and labels, as Ray's exporter
    /// writes them; a route's series shows once it was recorded.
    #[test]
    fn series_have_rays_names_and_labels() {
        let ray = RayMetrics::new(
            RayLabels {
                version: "2.60.0".to_owned(),
                session_name: "session_x".to_owned(),
            },
            "10.0.0.1".to_owned(),
        );
        let route = ray.route(&RouteSpec {
            method: http::Method::GET,
            path: "/api/jobs/{job_or_submission_id}".to_owned(),
            kind: crate::routes::RouteKind::Http,
            cache: None,
            fallback: None,
        });
        assert!(!ray.encode().contains("/api/jobs/"));
        route.record(&ray, StatusCode::NOT_FOUND, 0.02);
        ray.set_sampled(
            vec![ComponentSample {
                component: "dashboard_JobHead".to_owned(),
                pid: 7,
                cpu_percent: 12.5,
                rss_bytes: 2 * 1024 * 1024,
                uss_bytes: 1024 * 1024,
            }],
            HostSample::default(),
        );
        let text = ray.encode();
        let component = r#"{ip="10.0.0.1",pid="7",Version="2.60.0",Component="dashboard_JobHead",SessionName="session_x"}"#;
        for line in [
            r#"ray_dashboard_api_requests_count_requests_total{method="GET",endpoint="/api/jobs/{job_or_submission_id}",http_status="4xx",Version="2.60.0",SessionName="session_x",Component="dashboard"} 1"#.to_owned(),
            r#"ray_dashboard_api_requests_duration_seconds_bucket{le="0.025",endpoint="/api/jobs/{job_or_submission_id}",http_status="4xx",Version="2.60.0",SessionName="session_x",Component="dashboard"} 1"#.to_owned(),
            format!("ray_component_cpu_percentage{component} 12.5"),
            format!("ray_component_rss_mb{component} 2.0"),
            format!("ray_component_rss_bytes{component} 2097152"),
            format!("ray_component_uss_mb{component} 1.0"),
            format!("ray_component_uss_bytes{component} 1048576"),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} not in\n{text}");
        }
    }
}
