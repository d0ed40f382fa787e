//! Ray's modules when they cannot be hosted, without a real Ray: a fake
//! Python stands in for the one with Ray. With `modules = "on"` a zygote
//! that fails before reporting Ray's route table stops ray-dashd with its
//! reason; with `"auto"` ray-dashd serves without Ray's modules and leaves
//! no zygote behind, even one that reported its table.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{client, dashd, eventually, process_gone, WAIT};

/// What `head_facts.py` prints for a head without token authentication.
const FACTS: &str = r#"{"ui_dir": "/nonexistent", "timezone": {"offset": "+00:00", "value": "UTC"}, "authentication_mode": "disabled", "usage_stats_enabled": false, "usage_stats_prompt_enabled": false}"#;

/// A Ray head's temp dir: `session_1/` and `ray_current_cluster` beside it.
fn fake_head(dir: &Path) -> PathBuf {
    let session = dir.join("session_1");
    std::fs::create_dir(&session).expect("session dir");
    std::fs::write(dir.join("ray_current_cluster"), "127.0.0.1:1\n").expect("pointer");
    session
}

/// A "python" that runs `head_facts.py` and `zygote.py` as `facts` and
/// `zygote` (shell) say; the zygote's pid goes to `<dir>/zygote.pid`.
fn fake_python(dir: &Path, facts: &str, zygote: &str) -> String {
    let path = dir.join("python");
    let pid_file = dir.join("zygote.pid");
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n  */head_facts.py) {facts} ;;\n  */zygote.py) echo $$ > '{pid}'; {zygote} ;;\n  *) echo \"unexpected: $*\" >&2; exit 2 ;;\nesac\n",
        pid = pid_file.display()
    );
    std::fs::write(&path, script).expect("write fake python");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

/// SIGKILLs its pids when dropped (a failed assertion included).
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !process_gone(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn ray_toml(python: &str, modules: &str) -> String {
    format!(
        "[ray]\nmodules = \"{modules}\"\npython = {}\nclient_port = 0\n",
        serde_json::to_string(python).expect("json")
    )
}

/// `modules = "on"`: the zygote exits before its report, and ray-dashd
/// exits 1 quoting the zygote's stderr.
#[test]
fn a_zygote_failing_before_its_report_stops_ray_dashd_when_required() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = fake_head(dir.path());
    let python = fake_python(
        dir.path(),
        &format!("echo '{FACTS}'"),
        "echo 'zygote boom: this Ray differs' >&2; exit 64",
    );
    let config = dir.path().join("dashd.toml");
    std::fs::write(&config, ray_toml(&python, "on")).expect("config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
        .arg("--session-dir")
        .arg(&session)
        .args(["--port", "0", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ray-dashd");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ray-dashd did not stop within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("zygote") && err.contains("zygote boom: this Ray differs"),
        "{err}"
    );
}

/// `modules = "auto"`: the zygote reports its table, but the head facts
/// cannot be read; ray-dashd serves without Ray's modules and kills the
/// zygote it had started, and its process group.
#[tokio::test]
async fn an_unhosted_ray_leaves_no_zygote_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = fake_head(dir.path());
    // The zygote starts a process of its own in its group, writes an empty
    // report (no modules) where --report says, then stays, as a zygote does.
    let helper_pid = dir.path().join("helper.pid");
    let zygote = format!(
        r#"sleep 600 & echo $! > '{}'; while [ $# -gt 0 ]; do if [ "$1" = --report ]; then : > "$2"; fi; shift; done; exec sleep 600"#,
        helper_pid.display()
    );
    let python = fake_python(dir.path(), "echo 'no token for you' >&2; exit 1", &zygote);
    let d = dashd()
        .session_dir(&session)
        .toml(&ray_toml(&python, "auto"))
        .start();
    let pid: u32 = std::fs::read_to_string(dir.path().join("zygote.pid"))
        .expect("the zygote was started")
        .trim()
        .parse()
        .expect("pid");
    let helper: u32 = std::fs::read_to_string(&helper_pid)
        .expect("the zygote's helper was started")
        .trim()
        .parse()
        .expect("pid");
    // Whatever happens below, neither outlives the test.
    let _reaper = KillOnDrop(vec![pid, helper]);
    for pid in [pid, helper] {
        let gone = eventually(WAIT, || async { process_gone(pid).then_some(()) }).await;
        assert!(
            gone.is_some(),
            "{pid} of the zygote's group outlived it\n{}",
            d.log()
        );
    }
    let modules: Vec<Value> = client()
        .get(d.url("/api/modules"))
        .send()
        .await
        .expect("modules")
        .json()
        .await
        .expect("json");
    assert!(
        modules.iter().all(|m| m["name"] != "RayZygote"),
        "{modules:#?}"
    );
    assert!(
        d.log().contains("cannot be hosted") && d.log().contains("no token for you"),
        "{}",
        d.log()
    );
}
