//! Start-up's file pages: let go once no module is starting any more, and
//! again after a module's restart, the host serving as before.

use nix::sys::signal::Signal;
use ray_dashd_contract::proc;

use crate::support::{dashd, eventually, kill, test_module, warden_of, WAIT};

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

/// The built-in modules of the default config let go of their own
/// start-up pages once their socket is bound, and serve on.
#[tokio::test]
async fn built_in_modules_let_go_of_their_start_up_pages_once_serving() {
    let d = dashd().default_config().start();
    d.healthy("example", 0).await;
    d.healthy("logs", 0).await;
    for name in ["example", "logs"] {
        let path = d.session().join(format!("logs/dashboard_{name}.err"));
        let log = eventually(WAIT, || async {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            text.contains(LET_GO).then_some(text)
        })
        .await
        .unwrap_or_else(|| panic!("module {name} never let go; its log:\n{path:?}"));
        let kib = released_kib(&log).unwrap_or_else(|| panic!("no released_kib:\n{log}"));
        assert!(kib > 0, "{log}");
    }
    let client = d.client();
    for path in ["/api/example/hello", "/api/dashd/logs/files"] {
        let answer = client.get(d.url(path)).send().await.expect(path);
        assert_eq!(answer.status(), 200, "{path}");
    }
}

/// The cgroup warden, which only waits for the host to go, holds almost
/// none of the binary's pages once started.
#[tokio::test]
async fn the_cgroup_warden_lets_go_of_its_start_up_pages() {
    let d = dashd()
        .server("cgroups", "\"auto\"")
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let warden = warden_of(d.pid())
        .unwrap_or_else(|| panic!("the host started no cgroup warden; log:\n{}", d.log()));
    // Started, it had mapped a third of what the host let go of (8.2 of
    // 25.7 MiB in a debug build, 3.0 of 6.8 in a release build); waiting on
    // its pipe, it runs little that maps them again (1.5 MiB in a debug
    // build).
    let host_kib = released_kib(&d.logged(LET_GO).await).expect("released_kib");
    let small = eventually(WAIT, || async {
        let kib = proc::status_kib(warden, "RssFile")?;
        (kib < host_kib / 4).then_some(kib)
    })
    .await;
    assert!(
        small.is_some(),
        "warden {warden} holds {:?} KiB of file pages; the host let go of {host_kib}",
        proc::status_kib(warden, "RssFile")
    );
}
