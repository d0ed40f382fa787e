//! The operator's serving settings against a real Ray head, on one head and
//! one ray-dashd: HTTPS and a URL prefix together, as a cluster behind a
//! path-routing load balancer that requires TLS would run it, and Ray's
//! dashboard metrics where Ray's Prometheus discovery finds them. Each
//! setting alone is tested without Ray in `tls.rs`, `url_prefix.rs` and
//! `metrics.rs`; a Ray head is the costliest fixture of the suite, so the
//! Ray side of all three shares one.

use std::time::{Duration, Instant};

use crate::support::client;
use crate::support::ray::{
    free_port, hosting, ray_module_healthy, ray_module_in, ray_python, run_bounded,
    submit_six_times_seven, text, RayHead,
};
use crate::tls::{dashboard_key, path, Ca};

const PREFIX: &str = "/cluster-a/dashboard";

/// Bound on the wait for the metrics port's series: the modules must have
/// answered and the sampler have run.
const RAY_SCRAPE_WAIT: Duration = Duration::from_secs(60);

/// `ray job submit --address https://127.0.0.1:PORT/prefix --verify ca.pem`
/// runs a job through ray-dashd serving HTTPS under a prefix; the GCS key
/// `dashboard` carries both; Ray's API answers under the prefix. Ray's
/// dashboard metrics are served on `DASHBOARD_METRIC_PORT`: the request
/// counter has the jobs route's pattern (not the prefixed path) as its
/// endpoint, the components' memory has the host's and Ray's modules'
/// `Component`s, and Ray's Prometheus service discovery lists the port
/// (read from the GCS key `DashboardMetricsAddress`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_job_submit_over_https_under_a_prefix_with_rays_metrics() {
    let python = ray_python();
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    ca.issue(dir.path(), "dashboard");
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).expect("write CA");
    let head = RayHead::start(&python);
    let metrics_port = free_port();
    let d = hosting(&head, &python, free_port(), "")
        .env("RAY_DASHD_TLS_CERT", &path(dir.path(), "cert.pem"))
        .env("RAY_DASHD_TLS_KEY", &path(dir.path(), "key.pem"))
        .env("DASHBOARD_METRIC_PORT", &metrics_port.to_string())
        .env("METRICS_RECORD_INTERVAL_S", "1")
        .arg("--url-prefix")
        .arg(PREFIX)
        .https(&ca.pem)
        .prefixed(PREFIX)
        .start();
    // JobHead starts on demand: the submission over HTTPS, under the
    // prefix, starts it.
    ray_module_in(&d, &d.client(), "JobHead", "dormant").await;

    let address = d.url("");
    assert!(address.starts_with("https://"), "{address}");
    assert!(address.trim_end_matches('/').ends_with(PREFIX), "{address}");
    let ca_file = path(dir.path(), "ca.pem");
    submit_six_times_seven(&head, &d, &address, &["--verify", &ca_file]);
    ray_module_healthy(&d, &d.client(), "JobHead").await;
    assert_eq!(
        dashboard_key(&head, &d).await,
        format!("https://{}{PREFIX}", d.addr())
    );
    let version = d
        .client()
        .get(d.url("/api/version"))
        .send()
        .await
        .expect("GET /api/version");
    assert_eq!(version.status(), 200);

    // Ray's dashboard series, on Ray's metrics port (plain HTTP, no prefix,
    // as Ray serves it).
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let wanted = [
        r#"ray_dashboard_api_requests_count_requests_total{method="POST",endpoint="/api/jobs/",http_status="2xx","#,
        r#"ray_dashboard_api_requests_duration_seconds_count{endpoint="/api/jobs/",http_status="2xx","#,
        r#"Component="dashboard_JobHead""#,
        "ray_component_rss_mb{",
        "ray_component_rss_bytes{",
        "ray_component_uss_mb{",
        "ray_component_cpu_percentage{",
        "ray_dashboard_event_loop_tasks{",
        "ray_dashboard_event_loop_lag_seconds{",
    ];
    let deadline = Instant::now() + RAY_SCRAPE_WAIT;
    let scraped = loop {
        let body = match client().get(&url).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(e) => format!("{e}"),
        };
        if wanted.iter().all(|w| body.contains(w)) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "metrics port lacks a series; last scrape:\n{body}\nlog:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(scraped.contains(r#"Version="2.60.0""#), "{scraped}");
    assert!(scraped.contains(r#"Component="dashboard""#), "{scraped}");
    assert!(scraped.contains("SessionName=\"session_"), "{scraped}");

    // The address as Prometheus finds it: Ray's file-based service
    // discovery (`ray metrics launch-prometheus`) lists every target it
    // reads from the GCS, this one from `DashboardMetricsAddress`.
    let scratch = tempfile::tempdir().expect("tempdir");
    let mut discover = std::process::Command::new(&python);
    discover.args([
        "-c",
        "import sys\nfrom ray._private.metrics_agent import PrometheusServiceDiscoveryWriter\n\
         w = PrometheusServiceDiscoveryWriter(sys.argv[1], sys.argv[2])\n\
         print(w.get_file_discovery_content())",
        &head.gcs,
        &scratch.path().to_string_lossy(),
    ]);
    head.env(&mut discover);
    let out = run_bounded(discover);
    assert!(out.status.success(), "{}", text(&out));
    let content: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let ours = serde_json::Value::String(format!("127.0.0.1:{metrics_port}"));
    let targets = content[0]["targets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        targets.contains(&ours),
        "discovery lacks {ours}: {content}\nlog:\n{}",
        d.log()
    );
}
