//! The host's own metrics at `GET /metrics`: per module requests, state and
//! restarts, the process's own series, and the token that token mode asks
//! for there as everywhere else. Ray's dashboard series: `ray_serving.rs`.

use nix::sys::signal::Signal;

use crate::support::{
    client, dashd, eventually, kill, metric_value as value, test_module, Dashd, WAIT,
};

/// `GET /metrics` of `d`, with `token` when given.
async fn scrape(d: &Dashd, token: Option<&str>) -> (u16, String) {
    let mut request = client().get(d.url("/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET /metrics");
    let status = response.status().as_u16();
    (status, response.text().await.expect("metrics text"))
}

/// After N requests to a module's http route, its counter for kind `http`
/// and class 2xx is at least N, its latency histogram counted them too, and
/// a stream's bytes are counted; the process's series are there.
#[tokio::test]
async fn counts_requests_by_module_kind_and_class() {
    let d = dashd().module(test_module("tm")).start();
    d.healthy("tm", 0).await;
    const N: usize = 7;
    for _ in 0..N {
        let response = client()
            .post(d.url("/test/echo"))
            .body("hello")
            .send()
            .await
            .expect("echo");
        assert_eq!(response.status(), 200);
        response.bytes().await.expect("echo body");
    }
    let missing = client()
        .get(d.url("/test/echo/a/b/c"))
        .send()
        .await
        .expect("404");
    assert_eq!(missing.status(), 404);
    let (status, text) = scrape(&d, None).await;
    assert_eq!(status, 200, "{text}");
    let ok = r#"ray_dashd_requests_total{module="tm",kind="http",class="2xx"}"#;
    assert!(value(&text, ok) >= Some(N as f64), "{text}");
    let duration =
        r#"ray_dashd_request_duration_seconds_count{module="tm",kind="http",class="2xx"}"#;
    assert!(value(&text, duration) >= Some(N as f64), "{text}");
    let received = r#"ray_dashd_request_body_bytes_total{module="tm"}"#;
    assert!(value(&text, received) >= Some((N * 5) as f64), "{text}");
    let sent = r#"ray_dashd_response_body_bytes_total{module="tm"}"#;
    assert!(value(&text, sent) >= Some((N * 5) as f64), "{text}");
    for series in [
        r#"ray_dashd_module_up{module="tm"} 1"#,
        r#"ray_dashd_module_state{module="tm",state="healthy"} 1"#,
        r#"ray_dashd_module_restarts_total{module="tm"} 0"#,
        r#"ray_dashd_module_health_rtt_seconds{module="tm"}"#,
        r#"ray_dashd_module_in_flight{module="tm"}"#,
        "ray_dashd_client_connections ",
        "ray_dashd_client_connections_max ",
        "ray_dashd_open_fds ",
        "ray_dashd_resident_memory_bytes ",
        r#"ray_dashd_log_dropped_lines_total{writer="stderr"} 0"#,
    ] {
        assert!(text.contains(series), "{series} not in:\n{text}");
    }
    assert!(
        value(&text, "ray_dashd_client_connections") >= Some(1.0),
        "{text}"
    );
    // The text format 0.0.4 by default: no OpenMetrics end marker, a
    // counter's family named as its samples.
    assert!(!text.contains("# EOF"), "{text}");
    assert!(
        text.contains("# TYPE ray_dashd_requests_total counter\n"),
        "{text}"
    );
}

/// `/metrics` answers the text format 0.0.4 (as Prometheus's client
/// libraries do), and OpenMetrics to a client whose `Accept` asks for it.
#[tokio::test]
async fn answers_text_004_unless_openmetrics_is_asked_for() {
    let d = dashd().start();
    let plain = client().get(d.url("/metrics")).send().await.expect("GET");
    assert_eq!(
        plain.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let open = client()
        .get(d.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .expect("GET");
    assert_eq!(
        open.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(open.text().await.expect("text").ends_with("# EOF\n"));
}

/// A module is `up` 1 while healthy and 0 once killed (here held in its
/// long backoff), its state and restarts saying so.
#[tokio::test]
async fn up_follows_the_modules_health() {
    let d = dashd()
        .module(
            test_module("tm")
                .supervision("backoff_initial_secs", "60")
                .supervision("backoff_max_secs", "60"),
        )
        .start();
    let report = d.healthy("tm", 0).await;
    let (_, text) = scrape(&d, None).await;
    assert_eq!(
        value(&text, r#"ray_dashd_module_up{module="tm"}"#),
        Some(1.0)
    );
    kill(report["pid"].as_u64().expect("pid"), Signal::SIGKILL);
    let text = eventually(WAIT, || async {
        let (_, text) = scrape(&d, None).await;
        (value(&text, r#"ray_dashd_module_up{module="tm"}"#) == Some(0.0)).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("up never went to 0; log:\n{}", d.log()));
    assert!(
        !text.contains(r#"ray_dashd_module_state{module="tm",state="healthy"}"#),
        "{text}"
    );
    let streams = r#"ray_dashd_open{module="tm",kind="stream"}"#;
    assert_eq!(value(&text, streams), Some(0.0), "{text}");
}

/// In token mode `/metrics` is not public: 401 without the token, 200 with.
#[tokio::test]
async fn token_mode_asks_for_the_token() {
    let d = dashd()
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", "s3cret")
        .start();
    let ok = eventually(WAIT, || async {
        let (status, text) = scrape(&d, Some("s3cret")).await;
        (status == 200).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("no metrics with the token; log:\n{}", d.log()));
    assert!(ok.contains("ray_dashd_open_fds"), "{ok}");
    let (status, text) = scrape(&d, None).await;
    assert_eq!(status, 401, "{text}");
}

/// A module a reload adds gets its series, and counts its requests; one a
/// reload removes has its series removed once it has stopped.
#[tokio::test]
async fn a_reload_adds_and_removes_modules_series() {
    let first = || test_module("a").routes(&[("GET", "/test/echo", "http")]);
    let second = || test_module("b").routes(&[("GET", "/test/info", "http")]);
    let d = dashd().module(first()).start();
    d.healthy("a", 0).await;
    let config = dashd().module(second()).config_text();
    std::fs::write(d.config_path(), config).expect("write the config");
    let reloaded = client()
        .post(d.url("/api/reload"))
        .send()
        .await
        .expect("POST /api/reload");
    assert_eq!(reloaded.status(), 200);
    d.healthy("b", 0).await;
    let info = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info");
    assert_eq!(info.status(), 200);
    let text = eventually(WAIT, || async {
        let (_, text) = scrape(&d, None).await;
        (!text.contains(r#"module="a""#)).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("module a's series stayed; log:\n{}", d.log()));
    let ok = r#"ray_dashd_requests_total{module="b",kind="http",class="2xx"}"#;
    assert_eq!(value(&text, ok), Some(1.0), "{text}");
}
