//! Supervision through the real binary and real processes: what needs real
//! signals (SIGKILL mid-request, SIGSTOP), the restart API, the contract's
//! environment and log files, one module starting while others serve.
//! Exits, hangs, failing checks, slow starts, crash-loop backoff and
//! missing commands are tested in process, on a paused clock, in
//! `src/supervisor/tests.rs`.

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{client, dashd, eventually, file_with, kill, test_module, WAIT};

fn pid_of(report: &Value) -> u64 {
    report["pid"].as_u64().expect("pid")
}

/// kill -9 of a module mid-request: the request gets 502 at once (long
/// before the module would have answered) and the service comes back with
/// incarnation + 1.
#[tokio::test]
async fn restarts_module_after_kill_9_mid_request() {
    let d = dashd().module(test_module("tm")).start();
    let report = d.healthy("tm", 0).await;
    let in_flight = tokio::spawn({
        let url = d.url("/test/slow?ms=120000");
        async move { client().get(url).send().await.expect("request") }
    });
    d.wait_in_flight(1).await;
    kill(pid_of(&report), Signal::SIGKILL);
    let response = tokio::time::timeout(WAIT, in_flight)
        .await
        .expect("in-flight request answered well before the module's 120 s")
        .expect("task");
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["module"], "tm");

    let report = d.healthy("tm", 1).await;
    assert_eq!(report["incarnation"], 1);
    assert_eq!(report["restarts"], 1);
    assert!(
        report["last_error"]
            .as_str()
            .expect("last_error")
            .contains("SIGKILL"),
        "{report}"
    );
    let info: Value = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("json");
    assert_eq!(info["incarnation"], 1);
}

/// A module whose event loop blocks is found out by its health checks and
/// When a module turns unhealthy, its in-flight exchanges end at once, while
/// its process is still being stopped: a waiting request gets 502, an open
/// stream is cut and a websocket is closed with 1012.
#[tokio::test]
async fn unhealthy_module_fails_in_flight_work_before_it_is_killed() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    // A stopped module that ignores SIGTERM stays alive through its long
    // stop grace, long after the health checks gave up on it.
    let d = dashd()
        .module(
            test_module("tm")
                .env("TEST_MODULE_IGNORE_SIGTERM", "1")
                .supervision("stop_grace_secs", "60"),
        )
        .start();
    let report = d.healthy("tm", 0).await;
    let pid = pid_of(&report);
    let waiting = tokio::spawn({
        let url = d.url("/test/slow?ms=120000");
        async move { client().get(url).send().await.expect("request") }
    });
    let stream = client()
        .get(d.url("/test/stream?chunks=2&size=4&delay_ms=120000"))
        .send()
        .await
        .expect("stream");
    let mut stream = stream.bytes_stream();
    stream.next().await.expect("first chunk").expect("ok");
    let (mut ws, _) = tokio_tungstenite::connect_async(d.ws_url("/test/ws/echo"))
        .await
        .expect("ws");
    ws.send(Message::Text("x".into())).await.expect("send");
    ws.next().await.expect("echo").expect("ok");
    d.wait_in_flight(2).await;

    kill(pid, Signal::SIGSTOP);
    let response = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("answered")
        .expect("task");
    assert_eq!(response.status(), 502);
    let cut = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("stream ended");
    assert!(matches!(cut, Some(Err(_))), "stream not cut: {cut:?}");
    match tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("ws ended")
    {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(u16::from(frame.code), 1012),
        other => panic!("expected close 1012, got {other:?}"),
    }
    assert!(
        !crate::support::process_gone(pid as u32),
        "the process should still be in its stop grace"
    );
    assert_eq!(d.module("tm").await["state"], "unhealthy");
    kill(pid, Signal::SIGKILL);
}

/// A module whose only thread computes for seconds (a Ray module building
/// a big answer) misses its health checks but is busy, not hung: it is
/// kept, its answer arrives, and `/api/modules` says it was busy. Busy for
/// longer than `busy_max_secs`, it is replaced, and the reason says so.
#[tokio::test]
async fn a_module_busy_computing_is_kept_until_busy_max() {
    // Quick checks: a hang would be declared after about 0.75 s.
    let quick = |m: crate::support::ModuleDef| {
        m.supervision("health_interval_secs", "0.25")
            .supervision("health_timeout_secs", "0.25")
            .supervision("failure_threshold", "2")
    };
    let d = dashd()
        .module(quick(test_module("tm")).supervision("busy_max_secs", "30"))
        .start();
    d.healthy("tm", 0).await;

    let spinning = tokio::spawn({
        let url = d.url("/test/spin?ms=4000");
        async move { client().post(url).send().await.expect("spin") }
    });
    let busy = eventually(WAIT, || async {
        let report = d.module("tm").await;
        report["busy_since_ms"].as_u64().map(|_| report)
    })
    .await
    .expect("the module is reported busy while it computes");
    assert_eq!(busy["state"], "healthy", "{busy}");
    let response = tokio::time::timeout(WAIT, spinning)
        .await
        .expect("answered")
        .expect("task");
    let status = response.status();
    let body = response.text().await.expect("body");
    assert!(
        status == 200 && body.starts_with("spun"),
        "{status}: {body}"
    );
    let report = d.healthy("tm", 0).await;
    assert_eq!(report["incarnation"], 0, "{report}");
    assert_eq!(report["restarts"], 0, "{report}");
    assert!(report["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|e| e["kind"] == "busy"));
    // Served again: no longer busy.
    eventually(WAIT, || async {
        d.module("tm").await["busy_since_ms"]
            .is_null()
            .then_some(())
    })
    .await
    .expect("busy no more once it answers");

    // The same work with busy_max_secs 1.5: a loop that never ends, as far
    // as the host can tell.
    let d = dashd()
        .module(quick(test_module("short")).supervision("busy_max_secs", "1.5"))
        .start();
    d.healthy("short", 0).await;
    let cut = client()
        .post(d.url("/test/spin?ms=8000"))
        .send()
        .await
        .expect("spin");
    assert_eq!(cut.status(), 502);
    let report = d.healthy("short", 1).await;
    let error = report["last_error"].as_str().expect("last_error");
    assert!(
        error.starts_with("busy for ") && error.contains("busy_max_secs 1.5"),
        "{report}"
    );
}

/// A module whose processes grow past `memory_budget_mib` is replaced at its
/// next check with the reason naming the budget, while the host and the
/// other modules serve on.
#[tokio::test]
async fn a_module_over_its_memory_budget_is_replaced_and_others_serve() {
    let d = dashd()
        .module(
            test_module("tm")
                .routes(&[("POST", "/test/grow", "http")])
                .supervision("memory_budget_mib", "64")
                .supervision("health_interval_secs", "0.25"),
        )
        .module(test_module("other").routes(&[("GET", "/test/info", "http")]))
        .start();
    let report = d.healthy("tm", 0).await;
    assert_eq!(report["memory_budget_bytes"], 64 << 20);
    let grown = client()
        .post(d.url("/test/grow?mib=100"))
        .send()
        .await
        .expect("grow");
    assert_eq!(grown.status(), 200);
    let report = d.healthy("tm", 1).await;
    let error = report["last_error"].as_str().expect("last_error");
    assert!(
        error.starts_with("over its memory budget: its processes hold ")
            && error.ends_with("the budget is 64.0 MiB (memory_budget_mib)"),
        "{report}"
    );
    // The new incarnation is back under it.
    let memory = eventually(WAIT, || async {
        d.module("tm").await["memory_bytes"].as_u64()
    })
    .await
    .expect("memory reported");
    assert!(memory < 64 << 20, "{memory}");
    let other = d.module("other").await;
    assert_eq!(other["state"], "healthy");
    assert_eq!(other["restarts"], 0);
    let info = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info");
    assert_eq!(info.status(), 200);
    let health = client()
        .get(d.url("/api/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
}

/// A SIGSTOPped module is replaced too (it cannot even see SIGTERM).
#[tokio::test]
async fn replaces_stopped_module() {
    let d = dashd()
        .module(test_module("tm").supervision("stop_grace_secs", "0.5"))
        .start();
    let report = d.healthy("tm", 0).await;
    let old = pid_of(&report);
    kill(old, Signal::SIGSTOP);
    let report = d.healthy("tm", 1).await;
    assert_ne!(pid_of(&report), old);
    assert!(
        crate::support::process_gone(old as u32) || {
            // Reaped by ray-dashd: give the kernel a moment to drop the entry.
            eventually(WAIT, || async {
                crate::support::process_gone(old as u32).then_some(())
            })
            .await
            .is_some()
        }
    );
}

/// `/api/healthz` answering non-200 several times in a row makes the module
/// A module that exits at once is restarted with growing delays up to the
/// cap, never in a hot loop; meanwhile its routes answer 503 with
/// A module that never becomes ready is given up on after its startup
/// A module that answers 503 with its reason (in 20 ms, as a Python
/// module might) until its start-up deadline: its failure carries the
/// reason, as the last probe gets a real timeout (not what is left of the
/// budget: nothing, at the deadline), and its state shows the reason
/// A module still starting does not hold up requests to other modules or
/// to the host.
#[tokio::test]
async fn starting_module_does_not_stall_others() {
    let d = dashd()
        .module(
            test_module("late")
                .env("TEST_MODULE_STARTUP_DELAY_MS", "60000")
                .routes(&[("GET", "/late", "http")]),
        )
        .module(test_module("ok"))
        .start();
    d.healthy("ok", 0).await;
    let info = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info");
    assert_eq!(info.status(), 200);
    assert_eq!(d.module("late").await["state"], "starting");
    let late = client().get(d.url("/late")).send().await.expect("late");
    assert_eq!(late.status(), 503);
}

/// A module started on demand has no process until a request for one of
/// its routes comes; that request, and one sent while it starts, are
/// answered by it, and it stays up. A shared (`cache_secs`) route starts
/// it too; a request to another module meanwhile is not held up.
#[tokio::test]
async fn a_module_started_on_demand_starts_at_its_first_request() {
    let d = dashd()
        .module(
            test_module("lazy")
                .routes(&[("GET", "/test/info", "http")])
                .on_demand(),
        )
        .module(
            test_module("lazy_shared")
                .routes(&[("GET", "/test/count", "http")])
                .cached("/test/count", "1")
                .on_demand(),
        )
        .module(test_module("eager").routes(&[("GET", "/test/hop", "http")]))
        .start();
    d.healthy("eager", 0).await;
    for name in ["lazy", "lazy_shared"] {
        let report = d.module(name).await;
        assert_eq!(report["state"], "dormant", "{report:#}");
        assert!(report["pid"].is_null(), "{report:#}");
    }
    let eager = client()
        .get(d.url("/test/hop"))
        .send()
        .await
        .expect("eager");
    assert_eq!(eager.status(), 200);
    // Still dormant: a request to another module wakes nothing.
    assert_eq!(d.module("lazy").await["state"], "dormant");

    let asks: Vec<_> = (0..2)
        .map(|_| {
            let url = d.url("/test/info");
            tokio::spawn(async move { client().get(url).send().await.expect("info") })
        })
        .collect();
    for ask in asks {
        let answer = ask.await.expect("task");
        assert_eq!(answer.status(), 200);
        let info: Value = answer.json().await.expect("json");
        assert_eq!(info["incarnation"], 0, "{info}");
    }
    let report = d.healthy("lazy", 0).await;
    let kinds: Vec<&str> = report["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(kinds[..2], ["dormant", "woken"], "{report:#}");

    let shared = client()
        .get(d.url("/test/count"))
        .send()
        .await
        .expect("shared");
    assert_eq!(shared.status(), 200);
    d.healthy("lazy_shared", 0).await;
}

/// `POST /api/modules/<name>/restart` starts a new incarnation.
#[tokio::test]
async fn restart_api_starts_new_incarnation() {
    let d = dashd().module(test_module("tm")).start();
    let first = d.healthy("tm", 0).await;
    let response = client()
        .post(d.url("/api/modules/tm/restart"))
        .send()
        .await
        .expect("restart");
    assert_eq!(response.status(), 202);
    let second = d.healthy("tm", 1).await;
    assert_ne!(pid_of(&first), pid_of(&second));
    // A page from another origin cannot restart anything.
    let foreign = client()
        .post(d.url("/api/modules/tm/restart"))
        .header("origin", "http://elsewhere.example")
        .send()
        .await
        .expect("restart");
    assert_eq!(foreign.status(), 403);
    assert_eq!(d.module("tm").await["incarnation"], 1);
    let missing = client()
        .post(d.url("/api/modules/nope/restart"))
        .send()
        .await
        .expect("restart");
    assert_eq!(missing.status(), 404);
}

/// A module gets the contract's variables, and its output is appended to
/// its log files across incarnations.
#[tokio::test]
async fn module_gets_contract_env_and_log_files() {
    let d = dashd()
        .module(test_module("tm").env("EXTRA", "yes"))
        .start();
    let report = d.healthy("tm", 0).await;
    let info: Value = client()
        .get(d.url("/test/info"))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("json");
    let env = &info["env"];
    assert_eq!(env["RAY_DASHD_MODULE"], "tm");
    assert_eq!(env["RAY_DASHD_INCARNATION"], "0");
    assert_eq!(
        env["RAY_DASHD_SOCKET"],
        d.socket_path("tm").display().to_string()
    );
    assert_eq!(
        env["RAY_DASHD_SESSION_DIR"],
        d.session().display().to_string()
    );
    assert_eq!(
        env["RAY_DASHD_LOG_DIR"],
        d.session().join("logs").display().to_string()
    );

    kill(pid_of(&report), Signal::SIGKILL);
    d.healthy("tm", 1).await;
    let logs = d.session().join("logs");
    let out = file_with(&logs.join("dashboard_tm.out"), "incarnation=1").await;
    assert!(
        out.contains("incarnation=0") && out.contains("incarnation=1"),
        "{out}"
    );
    let err = file_with(&logs.join("dashboard_tm.err"), "incarnation=1").await;
    assert!(
        err.contains("test-module stderr line incarnation=1"),
        "{err}"
    );
    let host_log = std::fs::read_to_string(logs.join("ray-dashd.log")).expect("host log");
    assert!(host_log.contains("module failed"), "{host_log}");
    // The failure report quotes the module's last stderr lines.
    let report_line = host_log
        .lines()
        .find(|l| l.contains("module failed"))
        .expect("failure line");
    assert!(
        report_line.contains("test-module stderr line incarnation=0"),
        "{report_line}"
    );

    let modules: Value = client()
        .get(d.url("/api/modules"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let tm = &modules.as_array().expect("array")[0];
    for field in [
        "name",
        "pid",
        "incarnation",
        "state",
        "restarts",
        "last_error",
        "uptime_ms",
        "routes",
        "events",
    ] {
        assert!(tm.get(field).is_some(), "{field} missing from {tm}");
    }
}

/// Modules run nicer than the host (5 by default, `nice` per module), so
/// that with the CPU scarce the host answers its probes first.
#[tokio::test]
async fn modules_run_nicer_than_the_host() {
    let nice_of = |pid: u64| {
        let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
        rustix::process::getpriority_process(Some(pid)).expect("getpriority")
    };
    let d = dashd()
        .module(test_module("tm"))
        .module(test_module("same").routes(&[]).supervision("nice", "0"))
        .start();
    let host = nice_of(u64::from(d.pid()));
    let niced = pid_of(&d.healthy("tm", 0).await);
    assert_eq!(nice_of(niced), (host + 5).min(19));
    let same = pid_of(&d.healthy("same", 0).await);
    assert_eq!(nice_of(same), host);
}
