//! Nothing slow runs on the host's async runtime: with a `/proc` read or a
//! cgroup removal made to take a minute (fault points, `src/fault.rs`), the
//! host answers its health check and proxies requests meanwhile. Without
//! the `failpoints` feature (scripts/test builds with it) the faults cannot
//! be set, and these tests show as ignored.

use std::time::Duration;

use serde_json::Value;

use crate::support::{
    client, dashd, eventually, process_gone, test_module, warden_of, Dashd, WAIT,
};

/// How long a fault holds its thread: longer than any bound below, so a
/// runtime it held would fail them.
const STUCK: &str = "sleep(120000)";

/// Less than [`STUCK`]: a request held up by the fault would miss it.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// `/api/healthz` and a request for `path` each answer 200 within
/// [`ANSWER_WITHIN`], ten times over.
async fn answered_meanwhile(d: &Dashd, path: &str) {
    let client = client();
    for round in 0..10 {
        for url in [d.url("/api/healthz"), d.url(path)] {
            let answer = tokio::time::timeout(ANSWER_WITHIN, client.get(&url).send())
                .await
                .unwrap_or_else(|_| {
                    panic!("{url} not answered within {ANSWER_WITHIN:?} (round {round})")
                })
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(answer.status(), 200, "{url}");
        }
    }
}

/// Each health check samples the module's processes from `/proc`; with
/// that read stuck, requests and health checks go on, and the module
/// stays healthy (its memory shows as unknown: the fault is in force).
#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoints feature (scripts/test builds with it)"
)]
async fn a_stuck_proc_read_holds_up_no_request() {
    let d = dashd()
        .env("FAILPOINTS", &format!("module-usage-sample={STUCK}"))
        .module(test_module("tm"))
        .start();
    d.healthy("tm", 0).await;
    let checked_at = d.module("tm").await["last_health_at_ms"].as_u64();
    answered_meanwhile(&d, "/test/echo").await;
    // Health checks went on past the stuck samples.
    let checked = eventually(WAIT, || async {
        let m = d.module("tm").await;
        (m["last_health_at_ms"].as_u64() > checked_at).then_some(m)
    })
    .await
    .expect("no health check since the samples got stuck");
    assert_eq!(checked["state"], "healthy", "{checked}");
    assert_eq!(checked["restarts"], 0, "{checked}");
    assert_eq!(
        checked["memory_bytes"],
        Value::Null,
        "the fault was not in force: {checked}"
    );
}

/// A restarted module's old cgroup is killed and removed on the blocking
/// pool; with that stuck, the host and another module serve on.
#[tokio::test]
#[cfg_attr(
    not(feature = "failpoints"),
    ignore = "needs the failpoints feature (scripts/test builds with it)"
)]
async fn a_stuck_cgroup_removal_holds_up_no_request() {
    let d = dashd()
        .server("cgroups", "\"auto\"")
        .env("FAILPOINTS", &format!("cgroup-remove={STUCK}"))
        .module(test_module("tm").routes(&[("GET", "/test/echo", "http")]))
        .module(test_module("other").routes(&[("GET", "/test/info", "http")]))
        .start();
    let module = d.healthy("tm", 0).await;
    d.healthy("other", 0).await;
    let warden = warden_of(d.pid())
        .unwrap_or_else(|| panic!("the host started no cgroup warden; log:\n{}", d.log()));
    let pid = module["pid"].as_u64().expect("pid");
    let cgroup = module_cgroup(pid as u32).unwrap_or_else(|| {
        panic!(
            "this test needs cgroups in use, and module tm is in none; log:\n{}",
            d.log()
        )
    });
    let restarted = client()
        .post(d.url("/api/modules/tm/restart"))
        .send()
        .await
        .expect("restart");
    assert_eq!(restarted.status(), 202);
    answered_meanwhile(&d, "/test/info").await;
    assert!(
        cgroup.exists(),
        "the fault was not in force: {} was removed",
        cgroup.display()
    );
    // The warden ends soon after the host: the host's faults are not its.
    drop(d);
    let ended = eventually(WAIT, || async { process_gone(warden).then_some(()) }).await;
    assert!(
        ended.is_some(),
        "the cgroup warden {warden} outlived the host"
    );
}

/// The cgroup v2 folder of process `pid`, if it is in one below the root
/// (the v2 hierarchy is mounted at `/sys/fs/cgroup`, or at
/// `/sys/fs/cgroup/unified` beside v1 controllers).
fn module_cgroup(pid: u32) -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    if path == "/" {
        return None;
    }
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|mount| std::path::Path::new(mount).join(path.trim_start_matches('/')))
        .find(|dir| dir.join("cgroup.procs").exists())
}
