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
    d.logged("cannot be hosted").await;
    d.logged("no token for you").await;
}

/// A fake Python for the discovery tests: it answers ray-dashd's question
/// whether it has Ray (`-c …find_spec('ray')…`) as `has_ray` says, prints
/// the head facts, and is a zygote that reports no modules and stays.
fn discoverable_python(dir: &Path, name: &str, has_ray: bool) -> PathBuf {
    let path = dir.join(name);
    let answer = if has_ray { 0 } else { 3 };
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n  -c) exit {answer} ;;\n  */head_facts.py) echo '{FACTS}' ;;\n  */zygote.py) while [ $# -gt 0 ]; do if [ \"$1\" = --report ]; then : > \"$2\"; fi; shift; done; exec sleep 600 ;;\n  *) echo \"unexpected: $*\" >&2; exit 2 ;;\nesac\n"
    );
    std::fs::write(&path, script).expect("write fake python");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A stand-in for the head's raylet: a process of this user whose command
/// line names the session folder and the dashboard agent's command, as
/// Ray's raylet's does (`sh -c 'sleep …; :'` keeps `sh`, and so the
/// arguments, in place of `sleep`).
fn fake_raylet(session: &Path, agent_python: &Path) -> Raylet {
    let real = std::fs::canonicalize(session).expect("session");
    let child = Command::new("sh")
        .args(["-c", "sleep 600; :", "raylet"])
        .arg(format!("--session_dir={}", real.display()))
        .arg(format!(
            "--dashboard_agent_command={} -u /opt/ray/dashboard/agent.py --session-dir={}",
            agent_python.display(),
            real.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the fake raylet");
    Raylet(child)
}

/// The stand-in raylet, killed (by pid) and reaped when dropped.
struct Raylet(std::process::Child);

impl Raylet {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Raylet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `PATH` with `dir` first.
fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The INFO line that says which Python runs Ray's modules, and why.
fn python_line(log: &str) -> Option<String> {
    log.lines()
        .find(|line| line.contains("the Python for Ray's modules"))
        .map(str::to_owned)
}

/// `GET /api/dashd/status`'s `ray`.
async fn ray_status(d: &crate::support::Dashd) -> Value {
    let status: Value = client()
        .get(d.url("/api/dashd/status"))
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    status["ray"].clone()
}

/// With no Python named, the head's own (the dashboard agent's, from the
/// raylet's command line) is used before `python3` on PATH, and one INFO
/// line says which and why; a named one (`--ray-python`, then
/// `RAY_DASHD_RAY_PYTHON`, then `[ray] python`) is used as named.
#[tokio::test]
async fn the_python_is_the_named_one_else_the_heads_else_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = fake_head(dir.path());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    // Both have Ray; the head's must win.
    let on_path = discoverable_python(&bin, "python3", true);
    let agents = discoverable_python(dir.path(), "agent-python", true);
    let raylet = fake_raylet(&session, &agents);
    let ray = "[ray]\nclient_port = 0\n";

    let d = dashd()
        .session_dir(&session)
        .env("PATH", &path_with(&bin))
        .toml(ray)
        .start();
    let line = python_line(&d.log()).unwrap_or_else(|| panic!("no python line:\n{}", d.log()));
    assert!(
        line.contains(" INFO ")
            && line.contains(&format!("python={}", agents.display()))
            && line.contains(&format!(
                "source=the dashboard agent's Python, from the raylet (pid {}) of this session",
                raylet.id()
            )),
        "{line}"
    );
    let status = ray_status(&d).await;
    assert_eq!(status["state"], "hosted", "{status}");
    assert_eq!(status["python"], agents.display().to_string(), "{status}");
    drop(d);

    // Named: the flag over the variable over the file.
    let named = |name: &str| discoverable_python(dir.path(), name, true);
    let (flag, var, file) = (named("flag-py"), named("var-py"), named("file-py"));
    let file_ray = format!(
        "{ray}python = {}\n",
        serde_json::to_string(&file.display().to_string()).expect("json")
    );
    for (flag, var, chosen, source) in [
        (Some(&flag), Some(&var), &flag, "--ray-python".to_owned()),
        (None, Some(&var), &var, "RAY_DASHD_RAY_PYTHON".to_owned()),
        (None, None, &file, "[ray] python in ".to_owned()),
    ] {
        let mut builder = dashd()
            .session_dir(&session)
            .env("PATH", &path_with(&bin))
            .toml(&file_ray);
        if let Some(var) = var {
            builder = builder.env("RAY_DASHD_RAY_PYTHON", &var.display().to_string());
        }
        if let Some(flag) = flag {
            builder = builder.arg("--ray-python").arg(&flag.display().to_string());
        }
        let d = builder.start();
        let line = python_line(&d.log()).unwrap_or_else(|| panic!("no python line:\n{}", d.log()));
        assert!(
            line.contains(&format!("python={} source={source}", chosen.display())),
            "{line}"
        );
    }

    // The head's Python without Ray is passed over for python3 on PATH.
    drop(raylet);
    let lacking = discoverable_python(dir.path(), "agent-python-no-ray", false);
    let _raylet = fake_raylet(&session, &lacking);
    let d = dashd()
        .session_dir(&session)
        .env("PATH", &path_with(&bin))
        .toml(ray)
        .start();
    let line = python_line(&d.log()).unwrap_or_else(|| panic!("no python line:\n{}", d.log()));
    assert!(
        line.contains(&format!("python={} source=python3 on PATH", "python3")),
        "{line}\n{}",
        on_path.display()
    );
}

/// No Python with Ray anywhere: one WARN line says what was tried and how
/// to fix it (no traceback), and the UI's status says the same.
#[tokio::test]
async fn no_python_with_ray_is_one_line_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = fake_head(dir.path());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    discoverable_python(&bin, "python3", false);
    let agents = discoverable_python(dir.path(), "agent-python", false);
    let _raylet = fake_raylet(&session, &agents);
    let d = dashd()
        .session_dir(&session)
        .env("PATH", &path_with(&bin))
        .toml("[ray]\nclient_port = 0\n")
        .start();
    let said: Vec<String> = d
        .log()
        .lines()
        .filter(|line| line.contains("cannot be hosted"))
        .map(str::to_owned)
        .collect();
    assert_eq!(said.len(), 1, "{}", d.log());
    let line = &said[0];
    for expected in [
        " WARN ",
        "no Python with Ray found: tried ",
        &format!("{} (the dashboard agent's Python", agents.display()),
        "python3 (python3 on PATH: no ray)",
        "--ray-python",
        "RAY_DASHD_RAY_PYTHON",
        "[ray] python",
    ] {
        assert!(line.contains(expected), "{expected} not in {line}");
    }
    let status = ray_status(&d).await;
    assert_eq!(status["state"], "not_hosted", "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("no Python with Ray found")),
        "{status}"
    );
}
