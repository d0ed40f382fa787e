//! One binary is the whole install: `ray-dashd` carries its built-in modules
//! and Ray's helpers (`ray-dashd module …`, `fork-shim`, `client-proxy`), so
//! a copy alone runs its default config; and the wheel (`pip install
//! ray-dashd`, built and installed by scripts/test into a venv beside
//! `ray[default]==2.60.0`, named by `RAY_DASHD_TEST_WHEEL_VENV`) hosts Ray's
//! modules with Ray's own Python found from the venv, with no flags.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::ray::{
    all_ray_modules_up, authed, ray_module_healthy, ray_state_answers_as_rays, run_driver,
    submit_six_times_seven, text, token, RayHead,
};
use crate::support::{client, dashd, Dashd};

/// The Ray Client port ray-dashd's proxy takes when told none.
const DEFAULT_CLIENT_PORT: u16 = 10001;

/// A `PATH` with no Python that has Ray and no `ray-dashd`: what ray-dashd
/// starts must come from the binary itself or the venv it was installed in.
const BARE_PATH: &str = "/usr/bin:/bin";

/// The venv scripts/test installed the wheel into.
pub fn wheel_venv() -> PathBuf {
    let venv = std::env::var_os("RAY_DASHD_TEST_WHEEL_VENV").map(PathBuf::from);
    let venv = venv.unwrap_or_else(|| {
        panic!(
            "RAY_DASHD_TEST_WHEEL_VENV is not set: it names the venv with the ray-dashd wheel \
             and ray[default]==2.60.0 installed; scripts/test builds the wheel and makes it \
             (target/wheel-venv)"
        )
    });
    for file in ["bin/ray-dashd", "bin/python", "bin/ray"] {
        assert!(
            venv.join(file).is_file(),
            "{} is missing: RAY_DASHD_TEST_WHEEL_VENV must be a venv with the ray-dashd wheel \
             and ray[default]==2.60.0 installed (scripts/test makes it)",
            venv.join(file).display()
        );
    }
    venv
}

/// The executable of process `pid`.
fn exe_of(pid: u64) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("the module's executable")
}

/// The `command` of a module's report, as strings.
fn command(report: &Value) -> Vec<String> {
    report["command"]
        .as_array()
        .expect("command")
        .iter()
        .map(|a| a.as_str().expect("argument").to_owned())
        .collect()
}

/// GETs `path` and returns its status and body.
async fn get(d: &Dashd, path: &str) -> (u16, String) {
    let response = client().get(d.url(path)).send().await.expect(path);
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// The `ray-dashd` binary copied alone into an empty folder, with a `PATH`
/// that has no `ray-dashd`, runs its built-in config with every module
/// healthy: the logs and example modules are this binary itself (`ray-dashd
/// module logs|example`), not binaries beside it.
#[tokio::test]
async fn the_binary_alone_runs_its_default_config() {
    let alone = tempfile::Builder::new()
        .prefix("rdalone")
        .tempdir()
        .expect("tempdir");
    let copy = alone.path().join("ray-dashd");
    std::fs::copy(env!("CARGO_BIN_EXE_ray-dashd"), &copy).expect("copy ray-dashd");
    let d = dashd()
        .binary(&copy)
        .default_config()
        .env("PATH", BARE_PATH)
        .start();
    for name in ["logs", "example"] {
        let report = d.healthy(name, 0).await;
        assert_eq!(
            exe_of(report["pid"].as_u64().expect("pid")),
            copy,
            "{name} is not run by the copied binary: {report:#}"
        );
        assert_eq!(command(&report)[..2], ["ray-dashd", "module"], "{report:#}");
    }
    let (status, body) = get(&d, "/api/example/hello").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"module\":\"example\""), "{body}");
    let (status, body) = get(&d, "/api/dashd/logs/files").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("ray-dashd.log"), "{body}");
    let entries: Vec<_> = std::fs::read_dir(alone.path())
        .expect("the folder")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(entries, ["ray-dashd"], "the folder holds the binary alone");
}

/// The subcommands are on `--help`, and a wrong one exits 64 as any bad
/// command line does.
#[test]
fn builtins_are_subcommands() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ray-dashd"))
            .args(args)
            .output()
            .expect("run ray-dashd")
    };
    let help = run(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for command in ["module", "fork-shim", "client-proxy"] {
        assert!(help.contains(command), "{command} missing:\n{help}");
    }
    let bad = run(&["module", "nope"]);
    assert_eq!(bad.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("logs, example"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    // The shim's own command line, unparsed by clap (its `--` included).
    let shim = run(&[
        "fork-shim",
        "--zygote",
        "Z",
        "M",
        "--",
        "/bin/echo",
        "--",
        "x",
    ]);
    assert!(shim.status.success(), "{shim:?}");
    assert_eq!(String::from_utf8_lossy(&shim.stdout), "-- x\n");
    let shim = run(&["fork-shim", "--zygote", "Z", "M"]);
    assert_eq!(shim.status.code(), Some(64));
}

/// The wheel's `ray-dashd`, on a head started with `ray start --head
/// --include-dashboard=false --ray-client-server-port=<another port>` (and
/// token authentication), run with `--session-dir` and `--port` only and a
/// `PATH` without Ray: it finds Ray's Python in the venv it was installed
/// into, hosts Ray's nine modules (forked through `ray-dashd fork-shim`),
/// the Ray Client proxy (`ray-dashd client-proxy`) on 10001 and its
/// built-in modules, all healthy; `ray job submit` works through it, and
/// `ray.init("ray://127.0.0.1:10001")` runs a task, an actor and a put/get.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_wheel_hosts_rays_modules_with_no_flags() {
    let venv = wheel_venv();
    let installed = venv.join("bin/ray-dashd");
    // The proxy on its default port, as a user gets it: no other test uses
    // 10001 meanwhile (the test heads' own proxiers are on ports of their
    // own; the README's recipe takes it too).
    let _default_ports = crate::support::DEFAULT_PORTS.lock().await;
    let head = RayHead::start(&venv.join("bin/python"));
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", DEFAULT_CLIENT_PORT)).is_ok(),
        "port {DEFAULT_CLIENT_PORT} is taken on this machine: this test needs it free"
    );
    let d = dashd()
        .binary(&installed)
        .default_config()
        .session_dir(&head.session())
        .env("PATH", BARE_PATH)
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", &token())
        .start();
    let modules = all_ray_modules_up(&d).await;
    let report = |name: &str| -> Value {
        modules
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no module {name}: {modules:#?}"))
    };
    // `[ray] python` defaulted to the venv's interpreter, unresolved.
    let zygote = report("RayZygote");
    assert_eq!(
        Path::new(&command(&zygote)[0]),
        venv.join("bin/python3"),
        "{zygote:#}"
    );
    // NodeHead's supervised process is the installed binary, standing as
    // the shim for the module forked from the zygote (not a standalone
    // Python).
    let node_head = report("NodeHead");
    assert_eq!(command(&node_head)[..2], ["ray-dashd", "fork-shim"]);
    assert_eq!(
        exe_of(node_head["pid"].as_u64().expect("pid")),
        installed,
        "{node_head:#}"
    );
    for name in ["ray_client_proxy", "ray_state", "logs", "example"] {
        let module = ray_module_healthy(&d, &authed(), name).await;
        assert_eq!(
            exe_of(module["pid"].as_u64().expect("pid")),
            installed,
            "{module:#}"
        );
    }
    let versions: Value = authed()
        .get(d.url("/api/version"))
        .send()
        .await
        .expect("GET /api/version")
        .json()
        .await
        .expect("version json");
    assert_eq!(versions["ray_version"], "2.60.0", "{versions}");

    let submitted = submit_six_times_seven(&head, &d, &d.url(""), &[]);
    let out = text(&submitted);
    assert!(out.contains("succeeded"), "{out}");

    // `ray://` on the default port reaches ray-dashd's proxy: a task, an
    // actor and a put/get, on a client server of its own.
    let address = format!("127.0.0.1:{DEFAULT_CLIENT_PORT}");
    let result = run_driver(&head, &venv.join("bin/python"), &address, "basics");
    assert_eq!(result["task"], 42, "{result:#}");
    assert_eq!(result["actor"], 2, "{result:#}");
    assert_eq!(result["put_get_equal"], true, "{result:#}");
    assert_eq!(result["print_seen"], true, "{result:#}");

    // The job list from the GCS (the Ray state module) is Ray's: the
    // submitted job, and the client's driver.
    let jobs = ray_state_answers_as_rays(&d).await;
    for kind in ["SUBMISSION", "DRIVER"] {
        assert!(jobs.iter().any(|j| j["type"] == kind), "{kind}: {jobs:?}");
    }
}
