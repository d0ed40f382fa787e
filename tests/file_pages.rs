//! Start-up's file pages: let go once no module is starting any more, and
//! again after a module's restart, the host serving as before.

use nix::sys::signal::Signal;

use crate::support::{dashd, eventually, kill, test_module, WAIT};

/// The line `src/lib.rs` logs when it has let go of them.
const LET_GO: &str = "start-up's file pages let go";

/// The line it logs (at debug) each time after a module started again.
const AGAIN: &str = "file pages let go again after a module started";

/// `released_kib=<n>` of the line.
fn released_kib(log: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(LET_GO))?;
    let value = line.split("released_kib=").nth(1)?;
    value
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[tokio::test]
async fn start_ups_file_pages_are_let_go_once_the_modules_started() {
    let d = dashd()
        .module(test_module("slow").env("TEST_MODULE_STARTUP_DELAY_MS", "1500"))
        .start();
    // While the module starts, nothing is let go; the module still starting
    // is what holds it back. The log is read first: a line already there
    // while the state is still "starting" came before the module was up.
    let started = eventually(WAIT, || async {
        let let_go = d.log().contains(LET_GO);
        let state = d.module("slow").await["state"].clone();
        assert!(
            !let_go || state != "starting",
            "let go while the module was starting:\n{}",
            d.log()
        );
        (state == "healthy").then_some(())
    })
    .await;
    assert!(started.is_some(), "module never healthy:\n{}", d.log());
    let log = d.logged(LET_GO).await;
    let kib = released_kib(&log).unwrap_or_else(|| panic!("no released_kib:\n{log}"));
    assert!(kib > 0, "{log}");
    // Everything the host serves still runs: its own answers, a proxied
    // request, a stream and the module's health checks.
    let client = d.client();
    for _ in 0..20 {
        let health = client
            .get(d.url("/api/healthz"))
            .send()
            .await
            .expect("healthz");
        assert_eq!(health.status(), 200);
        let echo = client.get(d.url("/test/echo")).send().await.expect("echo");
        assert_eq!(echo.status(), 200);
    }
    let stream = client
        .get(d.url("/test/stream?chunks=8&size=65536&delay_ms=0"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.bytes().await.expect("stream body").len(), 8 * 65536);
    let report = d.module("slow").await;
    assert_eq!(report["state"], "healthy", "{report:#}");
    assert_eq!(
        report["incarnation"], 0,
        "restarted after the let-go: {report:#}"
    );
    // A restart maps the spawning code again: let go again once the new
    // incarnation is up, not before.
    assert!(!d.log().contains(AGAIN), "{}", d.log());
    let pid = report["pid"].as_u64().expect("pid");
    kill(pid, Signal::SIGKILL);
    d.healthy("slow", 1).await;
    d.logged(AGAIN).await;
    let echo = client.get(d.url("/test/echo")).send().await.expect("echo");
    assert_eq!(echo.status(), 200);
}
