//! The fork shim's contract: a module forked by the zygote
//! (`modules/ray/zygote.py`) through `ray-dashd fork-shim` behaves, for the
//! supervisor, like a process it started itself. The zygote's app here is
//! `tests/fixtures/zygote_app.py` (aiohttp, from `RAY_DASHD_TEST_PYTHON`),
//! so no Ray is needed.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{
    client, command_module, dashd, eventually, file_with, kill, process_gone, python,
    read_pid_file, ModuleDef,
};

const ZYGOTE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/modules/ray/zygote.py");
const APP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/zygote_app.py");
/// The fixture's exit status after SIGTERM.
const EXIT_ON_SIGTERM: &str = "43";
/// Bound on a process ending.
const GONE: Duration = Duration::from_secs(10);

/// The zygote, as module `Z`, preloading modules `alpha` and `beta`.
fn zygote(python: &str) -> ModuleDef {
    command_module("Z", &[python, ZYGOTE, "--app", APP, "alpha", "beta"])
}

/// Module `name` through the shim, with `flags` before its name.
fn forked(python: &str, name: &str, flags: &[&str]) -> ModuleDef {
    // This binary as the shim, as ray-dashd starts Ray's modules.
    let mut command = vec!["ray-dashd", "fork-shim", "--zygote", "Z"];
    command.extend_from_slice(flags);
    command.extend_from_slice(&[name, "--", python, APP, name]);
    let path = format!("/zfx/{name}/info");
    command_module(name, &command).routes(&[("GET", &path, "http")])
}

/// What module `name` says about its process.
async fn info(d: &crate::support::Dashd, name: &str) -> Value {
    client()
        .get(d.url(&format!("/zfx/{name}/info")))
        .send()
        .await
        .expect("info")
        .json()
        .await
        .expect("info json")
}

fn pid(report: &Value) -> u64 {
    report["pid"].as_u64().expect("pid")
}

async fn gone(pid: u64) -> bool {
    eventually(GONE, || async { process_gone(pid as u32).then_some(()) })
        .await
        .is_some()
}

/// The detail of the last `failed` event of a module's report.
fn last_failure(report: &Value) -> String {
    report["events"]
        .as_array()
        .expect("events")
        .iter()
        .rev()
        .find(|e| e["kind"] == "failed")
        .map(|e| e["detail"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// The module is a child of the zygote, in the shim's process group, and
/// not the shim itself.
#[tokio::test]
async fn zygote_forks_the_module_into_the_shims_group() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .module(forked(&py, "beta", &[]))
        .start();
    let z = d.healthy("Z", 0).await;
    for name in ["alpha", "beta"] {
        let shim = d.healthy(name, 0).await;
        let info = info(&d, name).await;
        assert_eq!(info["forked"], true, "{info}");
        assert_eq!(info["ppid"].as_u64(), Some(pid(&z)), "{info}");
        assert_eq!(info["pgid"].as_u64(), Some(pid(&shim)), "{info}");
        assert_ne!(info["pid"].as_u64(), Some(pid(&shim)), "{info}");
    }
}

/// SIGKILL of the shim ends its forked child at once, and the module is
/// replaced by a new child.
#[tokio::test]
async fn sigkill_of_the_shim_ends_its_forked_child() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    let shim = d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    kill(pid(&shim), Signal::SIGKILL);
    assert!(gone(child).await, "forked child {child} outlived its shim");
    d.healthy("alpha", 1).await;
    let again = info(&d, "alpha").await;
    assert_eq!(again["forked"], true, "{again}");
    assert_ne!(pid(&again), child);
}

/// SIGTERM to the shim reaches the child, which stops; the shim exits with
/// the child's status.
#[tokio::test]
async fn sigterm_to_the_shim_stops_the_child_and_returns_its_status() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    let shim = d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    kill(pid(&shim), Signal::SIGTERM);
    assert!(gone(child).await, "forked child {child} ignored SIGTERM");
    let report = d.healthy("alpha", 1).await;
    let failure = last_failure(&report);
    assert!(
        failure.contains(&format!("exit status: {EXIT_ON_SIGTERM}")),
        "{failure}"
    );
}

/// A forked child killed by a signal makes its shim end by the same signal.
#[tokio::test]
async fn a_child_killed_by_a_signal_ends_its_shim_by_it() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    let shim = d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    kill(child, Signal::SIGKILL);
    assert!(gone(pid(&shim)).await, "shim outlived its child");
    let report = d.healthy("alpha", 1).await;
    let failure = last_failure(&report);
    assert!(failure.contains("SIGKILL"), "{failure}");
}

/// With no zygote listening, the shim becomes the standalone module (same
/// pid), so the module still starts.
#[tokio::test]
async fn without_a_zygote_the_module_starts_standalone() {
    let py = python();
    let d = dashd()
        .module(forked(&py, "alpha", &["--wait", "0.2"]))
        .start();
    let shim = d.healthy("alpha", 0).await;
    let info = info(&d, "alpha").await;
    assert_eq!(info["forked"], false, "{info}");
    assert_eq!(info["pid"].as_u64(), Some(pid(&shim)), "{info}");
    let err = file_with(
        &d.session().join("logs/dashboard_alpha.err"),
        "starting the module standalone",
    )
    .await;
    assert!(err.contains("starting the module standalone"), "{err}");
}

/// A module whose environment differs from the zygote's is refused (its
/// preloaded code read the zygote's) and starts standalone.
#[tokio::test]
async fn a_module_with_another_environment_starts_standalone() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]).env("SOME_SETTING", "other"))
        .start();
    d.healthy("Z", 0).await;
    d.healthy("alpha", 0).await;
    let info = info(&d, "alpha").await;
    assert_eq!(info["forked"], false, "{info}");
    let err = file_with(
        &d.session().join("logs/dashboard_alpha.err"),
        "SOME_SETTING",
    )
    .await;
    assert!(
        err.contains("refused") && err.contains("SOME_SETTING"),
        "{err}"
    );
}

/// Killing the zygote leaves its forked modules running; a module restarted
/// meanwhile still starts (forked by the zygote's next incarnation).
#[tokio::test]
async fn killing_the_zygote_leaves_forked_modules_running() {
    let py = python();
    let d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    let z = d.healthy("Z", 0).await;
    let shim = d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    kill(pid(&z), Signal::SIGKILL);
    assert!(gone(pid(&z)).await, "zygote survived SIGKILL");
    assert_eq!(pid(&info(&d, "alpha").await), child);
    assert_eq!(pid(&d.module("alpha").await), pid(&shim));
    d.healthy("Z", 1).await;
    kill(pid(&shim), Signal::SIGKILL);
    assert!(gone(child).await, "forked child {child} outlived its shim");
    d.healthy("alpha", 1).await;
    assert_eq!(info(&d, "alpha").await["forked"], true);
}

/// ray-dashd's shutdown stops forked modules and exits cleanly.
#[tokio::test]
async fn shutdown_stops_forked_modules() {
    let py = python();
    let mut d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", d.log());
    assert!(gone(child).await, "forked child {child} outlived ray-dashd");
}

/// SIGKILL of ray-dashd ends forked modules too: the kernel kills the shims
/// (parent-death signal) and each child follows its shim (lifeline), though
/// no one signals the children's group.
#[tokio::test]
async fn sigkill_of_ray_dashd_ends_forked_modules() {
    let py = python();
    let mut d = dashd()
        .module(zygote(&py))
        .module(forked(&py, "alpha", &[]))
        .start();
    let z = d.healthy("Z", 0).await;
    d.healthy("alpha", 0).await;
    let child = pid(&info(&d, "alpha").await);
    d.signal(Signal::SIGKILL);
    d.wait_exit(Duration::from_secs(10));
    assert!(gone(pid(&z)).await, "zygote outlived ray-dashd");
    assert!(gone(child).await, "forked child {child} outlived ray-dashd");
}

/// What a forked module starts in a session of its own, ignoring SIGTERM,
/// ends with the module's incarnation, though the module is the zygote's
/// child: in the shim's cgroup, which it joins before it runs (with
/// cgroups), or found through the shim's process group (without).
#[tokio::test]
async fn a_forked_modules_escaped_descendants_end_with_its_incarnation() {
    let py = python();
    for cgroups in ["auto", "off"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("escapee.pid");
        let mut cleanup = KillNamedIn {
            file: pidfile.clone(),
            pids: Vec::new(),
        };
        let p = pidfile.display();
        let spawn = format!(
            "exec setsid sh -c 'trap \"\" TERM; echo $$ > {p}.tmp && mv {p}.tmp {p} && exec sleep 600'"
        );
        let mut d = dashd()
            .server("cgroups", &format!("{cgroups:?}"))
            .module(zygote(&py).env("ZFX_SPAWN", &spawn))
            .module(forked(&py, "alpha", &[]).env("ZFX_SPAWN", &spawn))
            .start();
        d.healthy("alpha", 0).await;
        let info = info(&d, "alpha").await;
        assert_eq!(info["forked"], true, "{info}");
        if d.log()
            .contains("each module incarnation runs in a cgroup of its own")
        {
            let cgroup = info["cgroup"].as_str().unwrap_or_default();
            assert!(cgroup.ends_with("/alpha-0"), "{info}");
        }
        let escapee = u64::from(read_pid_file(&pidfile).await);
        cleanup.pids.push(escapee as u32);
        assert!(
            !process_gone(escapee as u32),
            "escapee {escapee} is not running"
        );
        let restarted = client()
            .post(d.url("/api/modules/alpha/restart"))
            .send()
            .await
            .expect("restart");
        assert_eq!(restarted.status(), 202);
        assert!(
            gone(escapee).await,
            "escapee {escapee} of a forked module outlived its incarnation (cgroups {cgroups}); log:\n{}",
            d.log()
        );
        d.healthy("alpha", 1).await;
        let again = u64::from(read_pid_file(&pidfile).await);
        d.signal(Signal::SIGTERM);
        assert!(d.wait_exit(GONE).success(), "log:\n{}", d.log());
        assert!(
            gone(again).await,
            "escapee {again} outlived ray-dashd (cgroups {cgroups}; now {:?}); log:\n{}",
            crate::support::proc_stat(again as u32),
            d.log()
        );
    }
}

/// Kills, on drop, the processes it was given and the one its pid file
/// names then, if they are still there: a failed test leaves none behind.
struct KillNamedIn {
    file: std::path::PathBuf,
    pids: Vec<u32>,
}

impl Drop for KillNamedIn {
    fn drop(&mut self) {
        let named = std::fs::read_to_string(&self.file)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok());
        for pid in self.pids.iter().copied().chain(named) {
            if !process_gone(pid) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// A zygote whose preload left a thread running does not fork (fork safety):
/// it exits, and the modules start standalone.
#[tokio::test]
async fn a_zygote_with_a_thread_does_not_fork() {
    let py = python();
    let d = dashd()
        .module(zygote(&py).env("ZFX_PRELOAD_THREAD", "1"))
        .module(forked(&py, "alpha", &[]))
        .start();
    d.healthy("alpha", 0).await;
    let info = info(&d, "alpha").await;
    assert_eq!(info["forked"], false, "{info}");
    let z = d.module("Z").await;
    assert_ne!(z["state"], "healthy", "{z}");
    let err = file_with(&d.session().join("logs/dashboard_Z.err"), "threads running").await;
    assert!(err.contains("threads running"), "{err}");
}

/// A zygote that ray-dashd stops removes its fork socket.
#[tokio::test]
async fn a_stopped_zygote_removes_its_fork_socket() {
    let py = python();
    let mut d = dashd().module(zygote(&py)).start();
    d.healthy("Z", 0).await;
    let fork_socket = d.session().join("sockets/dash_Z.fork");
    assert!(fork_socket.exists(), "{}", fork_socket.display());
    d.signal(Signal::SIGTERM);
    assert!(
        d.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        d.log()
    );
    assert!(
        !fork_socket.exists(),
        "{} left behind",
        fork_socket.display()
    );
}

/// With `--report FILE`, the zygote writes what its app reports (given the
/// `--report-arg`s) to FILE, mode 0600, before it counts as ready.
#[tokio::test]
async fn the_zygote_writes_its_apps_report_before_it_is_ready() {
    use std::os::unix::fs::PermissionsExt;
    let py = python();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report.json");
    let report_arg = report.display().to_string();
    // The zygote writing its report to `report`, with `more` arguments.
    let zygote = |more: &[&str]| {
        let mut argv = vec![py.as_str(), ZYGOTE, "--app", APP, "--report", &report_arg];
        argv.extend_from_slice(more);
        command_module("Z", &argv)
    };
    let d = dashd()
        .module(zygote(&[
            "--report-arg",
            "--omit",
            "--report-arg",
            "/x y",
            "alpha",
        ]))
        .start();
    d.healthy("Z", 0).await;
    let text = std::fs::read_to_string(&report).expect("the report is there once Z is ready");
    let written: Value = serde_json::from_str(&text).expect("the app's JSON");
    assert_eq!(
        written,
        serde_json::json!({"args": ["--omit", "/x y"], "preloaded": ["alpha"]})
    );
    let mode = std::fs::metadata(&report)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    // A report that fails is the zygote's failure, named in its log.
    let failing = dashd().module(zygote(&["--report-arg", "fail"])).start();
    let logged = eventually(GONE, || async {
        let err = std::fs::read_to_string(failing.session().join("logs/dashboard_Z.err")).ok()?;
        err.contains("asked to fail").then_some(err)
    })
    .await;
    assert!(logged.is_some(), "{}", failing.log());
    assert_ne!(failing.module("Z").await["state"], "healthy");
}
