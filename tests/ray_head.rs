//! Against a real Ray head (`ray==2.60.0` from the venv named by
//! `RAY_DASHD_TEST_RAY_PYTHON`; scripts/test makes it): Ray's own dashboard
//! modules run under ray-dashd, and Ray's own command-line tools work
//! through it. The head runs on private ports in a temp dir and is stopped
//! by pid.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{dashd, kill, Dashd};

/// Ray's nine default subprocess modules (2.60).
const RAY_MODULES: [&str; 9] = [
    "DataHead",
    "EventHead",
    "JobHead",
    "MetricsHead",
    "NodeHead",
    "ReportHead",
    "ServeHead",
    "StateHead",
    "TrainHead",
];
/// Bound on the head's start, the modules' start and each CLI call.
const RAY_WAIT: Duration = Duration::from_secs(180);

fn ray_python() -> Option<PathBuf> {
    match std::env::var_os("RAY_DASHD_TEST_RAY_PYTHON") {
        Some(python) => Some(PathBuf::from(python)),
        None if std::env::var_os("CI").is_some() => {
            panic!("RAY_DASHD_TEST_RAY_PYTHON must name a Python with ray==2.60.0 in CI")
        }
        None => {
            eprintln!("skipped: set RAY_DASHD_TEST_RAY_PYTHON to a Python with ray==2.60.0");
            None
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `n` consecutive free ports below the kernel's ephemeral range (32768 and
/// up), so that no outgoing connection of Ray's takes one before Ray binds it.
fn free_port_block(n: u16) -> u16 {
    let start = 20_000 + (std::process::id() % 100) as u16 * 100;
    (0..100u16)
        .map(|i| 20_000 + (start - 20_000 + i * 100) % 12_000)
        .find(|base| (*base..*base + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()))
        .expect("a block of free ports")
}

/// A Ray head run by `ray start --block` in its own process group.
struct RayHead {
    child: Option<Child>,
    temp: tempfile::TempDir,
    gcs: String,
    bin: PathBuf,
}

impl RayHead {
    fn start(python: &Path) -> RayHead {
        let bin = python.parent().expect("venv bin").to_path_buf();
        let temp = tempfile::Builder::new()
            .prefix("rdr")
            .tempdir()
            .expect("tempdir");
        let base = free_port_block(100);
        let gcs_port = base;
        // Workers take ports from the block's upper half.
        let workers = base + 50;
        let next = std::cell::Cell::new(base);
        let port = |flag: &str| {
            next.set(next.get() + 1);
            format!("--{flag}={}", next.get())
        };
        let mut command = Command::new(bin.join("ray"));
        command
            .args(["start", "--head", "--block", "--include-dashboard=false"])
            .args([
                "--disable-usage-stats",
                "--num-cpus=2",
                "--node-ip-address=127.0.0.1",
            ])
            .arg("--object-store-memory=100000000")
            .arg(format!("--port={gcs_port}"))
            .arg(format!("--temp-dir={}", temp.path().display()))
            .arg(port("node-manager-port"))
            .arg(port("object-manager-port"))
            .arg(port("ray-client-server-port"))
            .arg(port("dashboard-agent-listen-port"))
            .arg(port("dashboard-agent-grpc-port"))
            .arg(port("runtime-env-agent-port"))
            .arg(port("metrics-export-port"))
            .arg(format!("--min-worker-port={workers}"))
            .arg(format!("--max-worker-port={}", workers + 49));
        ray_env(&mut command, &bin);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // `ray start` logs on stderr but says it is up on stdout.
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("ray start");
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        for stream in [
            Box::new(stdout) as Box<dyn std::io::Read + Send>,
            Box::new(stderr),
        ] {
            let started_tx = started_tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if line.contains("Ray runtime started") {
                        let _ = started_tx.send(());
                    }
                }
            });
        }
        let head = RayHead {
            child: Some(child),
            temp,
            gcs: format!("127.0.0.1:{gcs_port}"),
            bin,
        };
        started_rx
            .recv_timeout(RAY_WAIT)
            .expect("ray start reported the runtime started");
        head
    }

    fn session(&self) -> PathBuf {
        self.temp.path().join("session_latest")
    }

    /// Runs Ray's CLI with `args`, bounded by [`RAY_WAIT`].
    fn cli(&self, args: &[&str]) -> Output {
        let mut command = Command::new(self.bin.join("ray"));
        command.args(args);
        ray_env(&mut command, &self.bin);
        run_bounded(command)
    }
}

impl Drop for RayHead {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = nix::unistd::Pid::from_raw(child.id() as i32);
        // `ray start --block` stops what it started on SIGTERM.
        let _ = nix::sys::signal::kill(group, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
        // Whatever left the group still names our temp dir in its command line.
        for pid in pids_mentioning(self.temp.path()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Processes whose command line mentions `path`.
fn pids_mentioning(path: &Path) -> Vec<i32> {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// pid, parent and process group of a process.
struct Stat {
    pid: i32,
    ppid: i32,
    pgrp: i32,
}

/// [`Stat`] of every process.
fn stat_fields() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command's closing parenthesis: state, ppid, pgrp.
            let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
            Some(Stat {
                pid,
                ppid: rest.next()?.parse().ok()?,
                pgrp: rest.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// What every Ray process of the test needs: loopback-only addresses, the
/// venv first on PATH (a job's `python` is the venv's), no usage reports.
fn ray_env(command: &mut Command, bin: &Path) {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    command
        .env("PATH", path)
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("DASHBOARD_METRIC_PORT", free_port().to_string());
}

fn run_bounded(mut command: Command) -> Output {
    let described = format!("{command:?}");
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(RAY_WAIT) {
        Ok(output) => output.expect("output"),
        Err(_) => {
            kill(u64::from(pid), Signal::SIGKILL);
            panic!("{described} did not finish within {RAY_WAIT:?}");
        }
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

async fn all_ray_modules_healthy(d: &Dashd) -> Vec<Value> {
    let deadline = Instant::now() + RAY_WAIT;
    loop {
        let modules: Vec<Value> = crate::support::client()
            .get(d.url("/api/modules"))
            .send()
            .await
            .expect("modules")
            .json()
            .await
            .expect("json");
        let healthy = RAY_MODULES.iter().all(|name| {
            modules
                .iter()
                .any(|m| m["name"] == *name && m["state"] == "healthy")
        });
        if healthy {
            return modules;
        }
        assert!(
            Instant::now() < deadline,
            "Ray's modules not all healthy: {modules:#?}\nlog:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// On a head started with `--include-dashboard=false`, ray-dashd hosts Ray's
/// nine modules; `ray job submit` (whose log tail is the websocket route, and
/// with `--working-dir` the package upload), `ray job logs --follow` of a
/// running job, `ray job list`, `ray summary
/// tasks`, `ray list nodes` and `ray logs` (found through the GCS key
/// ray-dashd writes) work through it; JobHead runs forked from the zygote,
/// and when its shim is killed its process ends, a new one replaces it, and
/// the jobs submitted before are still listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_cli_works_through_ray_dashd() {
    let Some(python) = ray_python() else { return };
    let head = RayHead::start(&python);
    let d = dashd()
        .session_dir(&head.session())
        .toml(&format!(
            "[ray]\nmodules = \"on\"\npython = {}\n",
            serde_json::to_string(&python.display().to_string()).expect("json")
        ))
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .start();
    all_ray_modules_healthy(&d).await;
    let address = d.url("");

    let submitted = head.cli(&[
        "job",
        "submit",
        "--address",
        &address,
        "--",
        "python",
        "-c",
        "print(6 * 7)",
    ]);
    let out = text(&submitted);
    assert!(submitted.status.success(), "{out}\nlog:\n{}", d.log());
    assert!(
        out.lines().any(|l| l.trim() == "42"),
        "job output missing: {out}"
    );
    assert!(out.contains("succeeded"), "{out}");
    let id = out
        .split_whitespace()
        .find(|w| w.starts_with("'raysubmit_") || w.starts_with("raysubmit_"))
        .map(|w| w.trim_matches(|c: char| c == '\'' || c == '.').to_owned())
        .expect("submission id in the output");

    // A working_dir is uploaded through the package routes before the job runs.
    let work = tempfile::tempdir().expect("working dir");
    std::fs::write(
        work.path().join("greeting.txt"),
        "hello from the working dir",
    )
    .expect("write");
    let uploaded = head.cli(&[
        "job",
        "submit",
        "--address",
        &address,
        "--working-dir",
        &work.path().display().to_string(),
        "--",
        "python",
        "-c",
        "print(open('greeting.txt').read())",
    ]);
    assert!(uploaded.status.success(), "{}", text(&uploaded));
    assert!(
        text(&uploaded).contains("hello from the working dir"),
        "{}",
        text(&uploaded)
    );

    // `ray job logs --follow` tails a running job over the websocket route
    // and ends when the job does.
    let started = head.cli(&[
        "job",
        "submit",
        "--no-wait",
        "--address",
        &address,
        "--",
        "python",
        "-c",
        "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)",
    ]);
    assert!(started.status.success(), "{}", text(&started));
    let running = text(&started)
        .split_whitespace()
        .find(|w| {
            w.trim_matches(|c: char| c == '\'' || c == '.')
                .starts_with("raysubmit_")
        })
        .map(|w| w.trim_matches(|c: char| c == '\'' || c == '.').to_owned())
        .expect("submission id");
    let followed = head.cli(&["job", "logs", "--address", &address, "--follow", &running]);
    assert!(followed.status.success(), "{}", text(&followed));
    for i in 0..4 {
        assert!(
            text(&followed).contains(&format!("tick {i}")),
            "{}",
            text(&followed)
        );
    }

    let summary = head.cli(&["summary", "tasks", "--address", &address]);
    assert!(summary.status.success(), "{}", text(&summary));
    assert!(
        text(&summary).contains("Tasks Summary"),
        "{}",
        text(&summary)
    );

    let nodes = head.cli(&["list", "nodes", "--address", &address]);
    assert!(nodes.status.success(), "{}", text(&nodes));
    assert!(text(&nodes).contains("ALIVE"), "{}", text(&nodes));

    // `ray logs` finds the dashboard only through the GCS key.
    let logs = head.cli(&["logs", "cluster", "--address", &head.gcs]);
    assert!(logs.status.success(), "{}\nlog:\n{}", text(&logs), d.log());
    assert!(text(&logs).contains("raylet.out"), "{}", text(&logs));

    // What Ray's dashboard parent serves itself: its web UI at `/` (ours
    // moves to `/dashd/`), the UI's files, the time zone, the auth mode.
    let client = crate::support::client();
    let index = client.get(d.url("/")).send().await.expect("index");
    assert_eq!(index.status(), 200);
    let index = index.text().await.expect("index body");
    assert!(
        index.contains("<title>Ray Dashboard</title>"),
        "{index}\nlog:\n{}",
        d.log()
    );
    let script = index
        .split("src=\"./")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a script in Ray's index.html");
    let asset = client
        .get(d.url(&format!("/{script}")))
        .send()
        .await
        .expect("asset");
    assert_eq!(asset.status(), 200, "{script}");
    assert!(asset.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .contains("javascript"));
    let ours = client.get(d.url("/dashd/")).send().await.expect("our UI");
    assert!(ours
        .text()
        .await
        .expect("body")
        .contains("<title>ray-dashd</title>"));
    let timezone: Value = client
        .get(d.url("/timezone"))
        .send()
        .await
        .expect("tz")
        .json()
        .await
        .expect("json");
    assert!(
        timezone["offset"].is_string() && timezone["value"].is_string(),
        "{timezone}"
    );
    let auth: Value = client
        .get(d.url("/api/authentication_mode"))
        .send()
        .await
        .expect("auth")
        .json()
        .await
        .expect("json");
    assert_eq!(auth["authentication_mode"], "disabled");
    // Writes that look like a browser's are refused, as Ray refuses them.
    let browser_post = client
        .post(d.url("/api/jobs/"))
        .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64)")
        .body("{}")
        .send()
        .await
        .expect("browser post");
    assert_eq!(browser_post.status(), 405);
    let browser_get = client
        .get(d.url("/api/jobs/"))
        .header("origin", "http://elsewhere.example")
        .send()
        .await
        .expect("browser get");
    assert_eq!(browser_get.status(), 200);

    // Forked from the zygote (the default launch): the module's process
    // is a child of RayZygote in the process group of JobHead's shim, and
    // killing the shim ends it.
    let zygote = d.module("RayZygote").await["pid"]
        .as_u64()
        .expect("zygote pid") as i32;
    let job_head = d.module("JobHead").await;
    let shim = job_head["pid"].as_u64().expect("pid");
    let child = stat_fields()
        .into_iter()
        .find(|s| s.pgrp == shim as i32 && s.pid != shim as i32 && s.ppid == zygote)
        .unwrap_or_else(|| {
            panic!(
                "no child of the zygote in JobHead's group\nlog:\n{}",
                d.log()
            )
        })
        .pid;
    kill(shim, Signal::SIGKILL);
    let gone = crate::support::eventually(RAY_WAIT, || async {
        crate::support::process_gone(child as u32).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "JobHead's forked process {child} outlived its shim"
    );
    d.healthy("JobHead", 1).await;
    let listed = head.cli(&["job", "list", "--address", &address]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(text(&listed).contains(&id), "{id} not in {}", text(&listed));
}
