//! Processes that leave a module's process group (setsid(), SIGTERM
//! ignored, double-forked away) end with the module's incarnation and with
//! the host: with cgroups (`server.cgroups = "auto"`; the `_in_cgroups`
//! tests fail, saying why, where ray-dashd cannot use them) and without
//! (`"off"`: found through /proc).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{
    client, dashd, eventually, gone_within, proc_stat, process_gone, read_pid_file, test_module,
    Dashd, ModuleDef, WAIT,
};

/// Bound on an escaped process's end once its incarnation ends.
const GONE: Duration = Duration::from_secs(10);

/// A shell command: a process that ignores SIGTERM and writes its pid to
/// `pidfile`.
fn escapee(pidfile: &Path) -> String {
    let p = pidfile.display();
    format!("sh -c 'trap \"\" TERM; echo $$ > {p}.tmp && mv {p}.tmp {p} && exec sleep 600'")
}

/// The test module, starting three processes that ignore SIGTERM:
/// `grouped` stays in its process group (which a SIGKILL of the host does
/// not reach), `child` stays its child but in a session of its own, and
/// `detached` is double-forked away (`setsid -f`: its parent exits at
/// once, so the host adopts it).
fn module_with_escapees(dir: &Path) -> (ModuleDef, [PathBuf; 3]) {
    let [grouped, child, detached] = ["grouped", "child", "detached"].map(|name| dir.join(name));
    let spawn = format!(
        "setsid -f {}; {} & exec setsid {}",
        escapee(&detached),
        escapee(&grouped),
        escapee(&child)
    );
    let module = test_module("esc")
        .env("TEST_MODULE_SPAWN", &spawn)
        .supervision("stop_grace_secs", "0.5");
    (module, [grouped, child, detached])
}

/// Kills, on drop, every process it was given that is still there, and
/// the ones the pid files name then (a later incarnation's escapees): a
/// test leaves nothing running, failed or not (without cgroups, escapees
/// outlive the fixture's SIGKILL of ray-dashd).
struct Reap {
    pids: Vec<u32>,
    files: Vec<PathBuf>,
}

impl Drop for Reap {
    fn drop(&mut self) {
        let named = self
            .files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u32>().ok());
        for pid in self.pids.iter().copied().chain(named) {
            if !process_gone(pid) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

/// Starts the fixture with `cgroups` and returns it with the escapees'
/// pids, both checked alive.
async fn start(cgroups: &str, dir: &Path) -> (Dashd, Reap) {
    let (module, pidfiles) = module_with_escapees(dir);
    let d = dashd()
        .server("cgroups", &format!("{cgroups:?}"))
        .module(module)
        .start();
    d.healthy("esc", 0).await;
    let mut pids = Vec::new();
    for file in &pidfiles {
        let pid = read_pid_file(file).await;
        assert!(!process_gone(pid), "escapee {pid} is not running");
        pids.push(pid);
    }
    let files = pidfiles.to_vec();
    (d, Reap { pids, files })
}

/// Why ray-dashd cannot run its modules in cgroups here, if it said so at
/// start.
fn cgroups_unusable(d: &Dashd) -> Option<String> {
    d.log()
        .lines()
        .find(|l| l.contains("cgroups not usable"))
        .map(str::to_owned)
}

/// Fails the test unless `escapees`, started by the module's first
/// incarnation, are in its cgroup (`ray-dashd-<pid>/esc-0`): a test of
/// cgroups must not pass having tested the /proc fallback. Where ray-dashd
/// cannot use cgroups, the failure says why (run such tests with `--skip`
/// on that machine).
fn assert_in_cgroups(d: &Dashd, escapees: &Reap) {
    if let Some(why) = cgroups_unusable(d) {
        panic!("this test needs a writable cgroup v2, and ray-dashd has none here: {why}");
    }
    let expected = format!("/ray-dashd-{}/esc-0", d.pid());
    for pid in &escapees.pids {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/cgroup: {e}"));
        let unified = cgroup.lines().find_map(|l| l.strip_prefix("0::"));
        assert!(
            unified.is_some_and(|path| path.ends_with(&expected)),
            "escapee {pid} is not in the incarnation's cgroup (…{expected}):\n{cgroup}log:\n{}",
            d.log()
        );
    }
}

async fn restart_kills_escapees(cgroups: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut d, escapees) = start(cgroups, dir.path()).await;
    if cgroups == "auto" {
        assert_in_cgroups(&d, &escapees);
    }
    let restarted = client()
        .post(d.url("/api/modules/esc/restart"))
        .send()
        .await
        .expect("restart");
    assert_eq!(restarted.status(), 202);
    d.healthy("esc", 1).await;
    for pid in &escapees.pids {
        assert!(
            gone_within(*pid, GONE).await,
            "escapee {pid} outlived its incarnation (cgroups {cgroups}); log:\n{}",
            d.log()
        );
    }
    stop(&mut d);
}

/// Stops ray-dashd with SIGTERM, which takes the escapees of the running
/// incarnation along (a SIGKILL would leave them, without cgroups).
fn stop(d: &mut Dashd) {
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(WAIT).code(), Some(0), "log:\n{}", d.log());
}

/// A restart kills the incarnation's setsid() child that ignores SIGTERM
/// and its double-forked one, in cgroups: where ray-dashd has none, it
/// fails saying so, rather than pass having tested the /proc fallback.
#[tokio::test]
async fn restart_kills_escaped_descendants_in_cgroups() {
    restart_kills_escapees("auto").await;
}

/// The same through /proc alone, without cgroups.
#[tokio::test]
async fn restart_kills_escaped_descendants_without_cgroups() {
    restart_kills_escapees("off").await;
}

/// A module that crashes leaves nothing behind either: its orphans were
/// adopted by the host and are found by who they belonged to.
#[tokio::test]
async fn a_crashed_modules_escaped_descendants_are_killed() {
    for cgroups in ["auto", "off"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut d, escapees) = start(cgroups, dir.path()).await;
        let _ = client().post(d.url("/test/crash")).send().await;
        d.healthy("esc", 1).await;
        for pid in &escapees.pids {
            assert!(
                gone_within(*pid, GONE).await,
                "escapee {pid} outlived its crashed incarnation (cgroups {cgroups}); log:\n{}",
                d.log()
            );
        }
        stop(&mut d);
    }
}

async fn sigterm_kills_escapees(cgroups: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut d, escapees) = start(cgroups, dir.path()).await;
    if cgroups == "auto" {
        assert_in_cgroups(&d, &escapees);
    }
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(WAIT).code(), Some(0), "log:\n{}", d.log());
    for pid in &escapees.pids {
        assert!(
            gone_within(*pid, GONE).await,
            "escapee {pid} outlived ray-dashd's exit (cgroups {cgroups}); log:\n{}",
            d.log()
        );
    }
}

/// ray-dashd's exit on SIGTERM leaves no escaped descendant, in cgroups
/// (which it needs, as the restart test does).
#[tokio::test]
async fn sigterm_exit_kills_escaped_descendants_in_cgroups() {
    sigterm_kills_escapees("auto").await;
}

/// The same without cgroups.
#[tokio::test]
async fn sigterm_exit_kills_escaped_descendants_without_cgroups() {
    sigterm_kills_escapees("off").await;
}

/// SIGKILL of ray-dashd: the cgroup warden kills the escapees. Without
/// cgroups they survive (docs/security.md says so), so this test needs a
/// writable cgroup v2: where ray-dashd has none, it fails saying so (run
/// it with `--skip` on such a machine), rather than pass having checked
/// nothing.
#[tokio::test]
async fn sigkill_of_the_host_kills_escaped_descendants_in_cgroups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut d, escapees) = start("auto", dir.path()).await;
    assert_in_cgroups(&d, &escapees);
    d.signal(Signal::SIGKILL);
    d.wait_exit(WAIT);
    for pid in &escapees.pids {
        assert!(
            gone_within(*pid, GONE).await,
            "escapee {pid} outlived a SIGKILL of ray-dashd; log:\n{}",
            d.log()
        );
    }
}

/// An orphan below a module is adopted by ray-dashd (a child subreaper),
/// not by init, and reaped by it when it exits: no zombie piles up.
#[tokio::test]
async fn orphans_are_adopted_by_the_host_and_reaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("orphan.pid");
    let release = dir.path().join("go");
    let p = pidfile.display();
    let orphan = format!(
        "setsid -f sh -c 'echo $$ > {p}.tmp && mv {p}.tmp {p}; \
         while [ ! -e {go} ]; do sleep 0.05; done'",
        go = release.display()
    );
    let d = dashd()
        .module(test_module("orph").env("TEST_MODULE_SPAWN", &orphan))
        .start();
    d.healthy("orph", 0).await;
    let pid = read_pid_file(&pidfile).await;
    let _reap = Reap {
        pids: vec![pid],
        files: Vec::new(),
    };
    let adopted = eventually(WAIT, || async {
        let ppid = proc_stat(pid)?.ppid;
        (ppid == d.pid()).then_some(())
    })
    .await;
    assert!(
        adopted.is_some(),
        "orphan {pid} has parent {:?}, not ray-dashd ({})",
        proc_stat(pid).map(|stat| stat.ppid),
        d.pid()
    );
    std::fs::write(&release, b"").expect("release the orphan");
    let reaped = eventually(GONE, || async { proc_stat(pid).is_none().then_some(()) }).await;
    assert!(
        reaped.is_some(),
        "orphan {pid} was not reaped: {:?}",
        proc_stat(pid)
    );
}
