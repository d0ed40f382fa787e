//! The Ray fixture: a real Ray head (or a node joining one) started by
//! `ray start --block` from a venv's Python, on private ports in a temp
//! dir, with Ray's token authentication on (`RAY_AUTH_MODE=token`, a token
//! of its own), stopped by pid (its process group) on drop; ray-dashd
//! hosting its modules ([`hosting`]), Ray's CLI and drivers bounded by
//! [`RAY_WAIT`], and the waits the tests against Ray share.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use ray_dashd::config::ray_settings::DEFAULT_ON_DEMAND;
use ray_dashd_contract::proc;
use serde_json::Value;

use crate::support::{dashd, eventually, kill, process_gone, Dashd, DashdBuilder};

/// Ray's nine default subprocess modules (the same in 2.45 through 2.60).
pub const RAY_MODULES: [&str; 9] = [
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
pub const RAY_WAIT: Duration = Duration::from_secs(180);

/// The cluster's token: Ray's CLI, the head and ray-dashd all get it.
pub fn token() -> String {
    format!("dashd-test-token-{}", std::process::id())
}

/// A client that presents the cluster's token.
pub fn authed() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", token()).parse().expect("header value"),
    );
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .default_headers(headers)
        .build()
        .expect("reqwest client")
}

/// The Python with ray==2.60.0. Missing, the test fails: a skipped run
/// must not pass for one that ran (scripts/test sets it).
pub fn ray_python() -> PathBuf {
    std::env::var_os("RAY_DASHD_TEST_RAY_PYTHON")
        .map(PathBuf::from)
        .expect(
            "RAY_DASHD_TEST_RAY_PYTHON must name a Python with ray==2.60.0 (scripts/test sets it)",
        )
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `n` consecutive free ports below the kernel's ephemeral range (32768 and
/// up), so that no outgoing connection of Ray's takes one before Ray binds it,
/// and above 20,099, clear of the README recipe's 20001 (`tests/readme.rs`).
/// Each call starts its search at another block, so that two heads of one
/// test run never pick the same block before either has bound it.
fn free_port_block(n: u16) -> u16 {
    static CALLS: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = 20_100 + ((std::process::id() % 100) as u16 + call * 7) % 100 * 100;
    (0..100u16)
        .map(|i| 20_100 + (start - 20_100 + i * 100) % 12_000)
        .find(|base| (*base..*base + n).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()))
        .expect("a block of free ports")
}

/// The environment of a node of a cluster of several nodes: Ray refuses a
/// second node unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1` (which
/// [`ray_env`] sets to 0 for single-node heads).
const MULTI_NODE: (&str, &str) = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1");

/// A Ray node (the head, or one joining it) run by `ray start --block` in
/// its own process group.
pub struct RayHead {
    child: Option<Child>,
    temp: tempfile::TempDir,
    pub gcs: String,
    pub bin: PathBuf,
    /// Variables on top of [`ray_env`] for `ray start` and every Ray
    /// process of the test ([`RayHead::env`]).
    extra_env: Vec<(String, String)>,
    /// The port of Ray's own client proxier (the head's; `None` for a node
    /// that joined).
    pub ray_client_port: Option<u16>,
}

impl RayHead {
    pub fn start(python: &Path) -> RayHead {
        RayHead::start_with_env(python, &[])
    }

    /// [`RayHead::start`] with `extra_env` set for `ray start`, the CLI
    /// ([`RayHead::cli`]) and whatever else gets [`RayHead::env`].
    pub fn start_with_env(python: &Path, extra_env: &[(&str, &str)]) -> RayHead {
        Self::launch(python, None, &[], extra_env)
    }

    /// A head with Ray's own dashboard, on 127.0.0.1:`port`.
    pub fn start_with_dashboard(python: &Path, port: u16) -> RayHead {
        let port = format!("--dashboard-port={port}");
        let flags = [
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            &port,
        ];
        Self::launch(python, None, &flags, &[])
    }

    /// A head that other nodes may join ([`RayHead::join`]).
    pub fn start_multi_node(python: &Path) -> RayHead {
        Self::launch(python, None, &[], &[MULTI_NODE])
    }

    /// A second node joining the cluster of `head` (on this machine, with
    /// ports and a temp dir of its own), started with `extra` flags.
    pub fn join(head: &RayHead, python: &Path, extra: &[&str]) -> RayHead {
        Self::launch(python, Some(&head.gcs), extra, &[MULTI_NODE])
    }

    /// `extra`: flags of `ray start`; `extra_env`: its environment.
    fn launch(
        python: &Path,
        join: Option<&str>,
        extra: &[&str],
        extra_env: &[(&str, &str)],
    ) -> RayHead {
        let extra_env: Vec<(String, String)> = extra_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
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
        command.args(["start", "--block"]);
        let client_flag = port("ray-client-server-port");
        let ray_client_port = join.is_none().then(|| next.get());
        match join {
            None => command
                .args(["--head", "--include-dashboard=false"])
                .args(["--disable-usage-stats", "--num-cpus=2"])
                .arg(format!("--port={gcs_port}"))
                .arg(client_flag),
            Some(gcs) => command.arg(format!("--address={gcs}")).arg("--num-cpus=1"),
        };
        command
            .args(extra)
            .arg("--node-ip-address=127.0.0.1")
            .arg("--object-store-memory=100000000")
            .arg(format!("--temp-dir={}", temp.path().display()))
            .arg(port("node-manager-port"))
            .arg(port("object-manager-port"))
            .arg(port("dashboard-agent-listen-port"))
            .arg(port("dashboard-agent-grpc-port"))
            .arg(port("runtime-env-agent-port"))
            .arg(port("metrics-export-port"))
            .arg(format!("--min-worker-port={workers}"))
            .arg(format!("--max-worker-port={}", workers + 49));
        ray_env(&mut command, &bin);
        command.envs(extra_env.iter().map(|(k, v)| (k, v)));
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
            gcs: join.map_or_else(|| format!("127.0.0.1:{gcs_port}"), str::to_owned),
            bin,
            extra_env,
            ray_client_port,
        };
        started_rx
            .recv_timeout(RAY_WAIT)
            .expect("ray start reported the runtime started");
        head
    }

    pub fn session(&self) -> PathBuf {
        self.temp.path().join("session_latest")
    }

    /// `ray job submit --no-wait` of `python -c script` through `address`;
    /// the submission id.
    pub fn submit_no_wait(&self, address: &str, script: &str) -> String {
        let submitted = self.cli(&[
            "job",
            "submit",
            "--no-wait",
            "--address",
            address,
            "--",
            "python",
            "-c",
            script,
        ]);
        assert!(submitted.status.success(), "{}", text(&submitted));
        submission_id(&submitted)
    }

    /// Runs Ray's CLI with `args`, bounded by [`RAY_WAIT`].
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut command = Command::new(self.bin.join("ray"));
        command.args(args);
        self.env(&mut command);
        run_bounded(command)
    }

    /// [`ray_env`] and the head's extra variables, for a Ray process.
    pub fn env(&self, command: &mut Command) {
        ray_env(command, &self.bin);
        command.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
    }

    /// Stops `ray start --block` and what it started (its process group).
    pub fn stop(&mut self) {
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
    }

    /// Stops Ray's own dashboard of this head (a head started with
    /// [`RayHead::start_with_dashboard`]) and every process below it, and
    /// says how it was started, to start it again later
    /// ([`RayDashboardLaunch::start`]). `ray start --block` lets it go: it
    /// ends on SIGTERM.
    pub fn stop_rays_dashboard(&self) -> RayDashboardLaunch {
        let found: Vec<(i32, Vec<String>)> = pids_mentioning(self.temp.path())
            .into_iter()
            .filter_map(|pid| Some((pid, proc::cmdline(u32::try_from(pid).ok()?).ok()?)))
            .filter(|(_, args)| args.iter().any(|a| a.ends_with("dashboard/dashboard.py")))
            .collect();
        let [(pid, argv)] = &found[..] else {
            panic!("not one dashboard.py below the head: {found:?}");
        };
        let pid = *pid as u32;
        let environ = std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/environ: {e}"));
        let launch = RayDashboardLaunch {
            argv: argv.clone(),
            env: String::from_utf8_lossy(&environ)
                .split('\0')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            cwd: std::fs::read_link(format!("/proc/{pid}/cwd")).expect("dashboard's cwd"),
            group: self.child.as_ref().expect("a running head").id() as i32,
        };
        stop_tree(pid);
        launch
    }
}

/// How `ray start` started its dashboard: its command line, environment
/// and folder, and the head's process group.
#[derive(Debug)]
pub struct RayDashboardLaunch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    group: i32,
}

impl RayDashboardLaunch {
    /// Starts Ray's dashboard again as it was started, in the head's process
    /// group, writing to `log`, but with a session folder of its own under
    /// `dir` (of the same name; its logs still go to the head's): Ray's
    /// dashboard and ray-dashd both put their modules' sockets at
    /// `<session>/sockets/dash_<Module>`, and on one session folder the one
    /// started last would answer for both. It ends with the head, or when
    /// the result is dropped.
    pub fn start(&self, log: &Path, dir: &Path) -> RayDashboard {
        let log = std::fs::File::create(log).expect("the dashboard's log");
        let args: Vec<String> = self.argv[1..]
            .iter()
            .map(|arg| {
                let Some(session) = arg.strip_prefix("--session-dir=") else {
                    return arg.clone();
                };
                let own = dir.join(Path::new(session).file_name().expect("a session name"));
                std::fs::create_dir_all(&own).expect("the dashboard's session folder");
                format!("--session-dir={}", own.display())
            })
            .collect();
        assert!(
            args != self.argv[1..],
            "no --session-dir= in Ray's dashboard's command line: {:?}",
            self.argv
        );
        let mut command = Command::new(&self.argv[0]);
        command
            .args(&args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, self.group);
        RayDashboard(command.spawn().expect("Ray's dashboard"))
    }
}

/// Ray's dashboard started again ([`RayDashboardLaunch::start`]); killed
/// by pid on drop (its modules end with it, or with the head's group).
#[derive(Debug)]
pub struct RayDashboard(Child);

impl Drop for RayDashboard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGTERM to `pid` and waits, within [`RAY_WAIT`], until it and
/// every process that was below it have ended (a zombie counts as ended:
/// its parent reaps it).
fn stop_tree(pid: u32) {
    let tree = descendants(pid);
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGTERM);
    let deadline = Instant::now() + RAY_WAIT;
    while tree.iter().any(|&p| !process_gone(p)) {
        assert!(
            Instant::now() < deadline,
            "process {pid} and those below it {tree:?} did not end within {RAY_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `pid` and the processes below it, found by their parents.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = proc::pids()
        .map(|pids| {
            pids.filter_map(|p| proc::stat(p).ok().map(|st| (p, st.ppid)))
                .collect()
        })
        .unwrap_or_default();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

impl Drop for RayHead {
    fn drop(&mut self) {
        self.stop();
        // Whatever left the group still names our temp dir in its command line.
        for pid in pids_mentioning(self.temp.path()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Processes whose command line mentions `path`.
fn pids_mentioning(path: &Path) -> Vec<i32> {
    let needle = path.to_string_lossy().into_owned();
    let Ok(pids) = proc::pids() else {
        return vec![];
    };
    pids.filter(|&pid| proc::cmdline(pid).is_ok_and(|args| args.join(" ").contains(&needle)))
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// What every Ray process of the test needs: loopback-only addresses, the
/// venv first on PATH (a job's `python` is the venv's), no usage reports,
/// the cluster's token.
pub fn ray_env(command: &mut Command, bin: &Path) {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    command
        .env("PATH", path)
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", token())
        .env("DASHBOARD_METRIC_PORT", free_port().to_string());
}

pub fn run_bounded(mut command: Command) -> Output {
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

pub fn text(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The submission id (`raysubmit_…`) that `ray job submit` printed.
pub fn submission_id(submitted: &Output) -> String {
    text(submitted)
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| c == '\'' || c == '.'))
        .find(|w| w.starts_with("raysubmit_"))
        .unwrap_or_else(|| panic!("no submission id in: {}", text(submitted)))
        .to_owned()
}

/// ray-dashd hosting the Ray modules of `head` with `python`, its client
/// proxy on `client_port`, with the cluster's environment and token;
/// `extra_ray` (TOML lines) goes into its `[ray]` table.
pub fn hosting(head: &RayHead, python: &Path, client_port: u16, extra_ray: &str) -> DashdBuilder {
    dashd()
        .session_dir(&head.session())
        .toml(&format!(
            "[ray]\nmodules = \"on\"\npython = {}\nclient_port = {client_port}\n{extra_ray}",
            serde_json::to_string(&python.display().to_string()).expect("json"),
        ))
        .env("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        .env("RAY_USAGE_STATS_ENABLED", "0")
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", &token())
        // Ray's dashboard metrics port, one per test.
        .env("DASHBOARD_METRIC_PORT", &free_port().to_string())
        // The client proxy's servers on ports the kernel picks, not
        // 23000-23999 (which Ray's own proxier and other runs share).
        .env("RAY_DASHD_CLIENT_PROXY_PORT_RANGE", "auto")
}

/// Waits, within [`RAY_WAIT`], until module `name` of `d` is healthy,
/// asking with `client` (the cluster's token, a CA, as the host needs);
/// its report. Fails the test with the last report and the host's log
/// otherwise.
pub async fn ray_module_healthy(d: &Dashd, client: &reqwest::Client, name: &str) -> Value {
    ray_module_in(d, client, name, "healthy").await
}

/// [`ray_module_healthy`], for the module's `state` (`dormant`, …).
pub async fn ray_module_in(d: &Dashd, client: &reqwest::Client, name: &str, state: &str) -> Value {
    let last = std::sync::Mutex::new(Value::Null);
    let reached = eventually(RAY_WAIT, || async {
        let report = json_of(client.get(d.url(&format!("/api/modules/{name}")))).await?;
        let reached = report["state"] == state;
        *last.lock().expect("last report") = report.clone();
        reached.then_some(report)
    })
    .await;
    reached.unwrap_or_else(|| {
        panic!(
            "module {name} not {state}: {:#}\nlog:\n{}",
            last.lock().expect("last report"),
            d.log()
        )
    })
}

/// `ray job submit --address address [extra…] -- python -c "print(6 * 7)"`
/// with `head`'s Ray, through `d`: asserts that it succeeded and printed
/// 42; its output.
pub fn submit_six_times_seven(head: &RayHead, d: &Dashd, address: &str, extra: &[&str]) -> Output {
    let mut args = vec!["job", "submit", "--address", address];
    args.extend_from_slice(extra);
    args.extend(["--", "python", "-c", "print(6 * 7)"]);
    let submitted = head.cli(&args);
    let out = text(&submitted);
    assert!(submitted.status.success(), "{out}\nlog:\n{}", d.log());
    assert!(
        out.lines().any(|l| l.trim() == "42"),
        "job output missing: {out}"
    );
    submitted
}

/// Waits, within [`RAY_WAIT`], until every one of [`RAY_MODULES`] is in
/// the state `want` gives for its name (`what` says it in a failure); the
/// reports of all modules.
async fn ray_modules_in(d: &Dashd, what: &str, want: impl Fn(&str) -> &'static str) -> Vec<Value> {
    let deadline = Instant::now() + RAY_WAIT;
    loop {
        let modules: Vec<Value> = authed()
            .get(d.url("/api/modules"))
            .send()
            .await
            .expect("modules")
            .json()
            .await
            .expect("json");
        let all = RAY_MODULES.iter().all(|name| {
            modules
                .iter()
                .any(|m| m["name"] == *name && m["state"] == want(name))
        });
        if all {
            return modules;
        }
        assert!(
            Instant::now() < deadline,
            "Ray's modules not all {what}: {modules:#?}\nlog:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits, within [`RAY_WAIT`], until every one of [`RAY_MODULES`] is up:
/// healthy, or, for those started on demand (`[ray] on_demand`, by
/// default [`DEFAULT_ON_DEMAND`]), dormant with no process. The reports.
pub async fn all_ray_modules_up(d: &Dashd) -> Vec<Value> {
    let modules = ray_modules_in(d, "up", |name| {
        if DEFAULT_ON_DEMAND.contains(&name) {
            "dormant"
        } else {
            "healthy"
        }
    })
    .await;
    for m in modules.iter().filter(|m| m["state"] == "dormant") {
        assert!(m["pid"].is_null(), "a dormant module runs: {m:#}");
    }
    modules
}

/// Asks each of Ray's modules started on demand, dormant, for a `GET`
/// route of its own (its first, `{…}` segments filled in) through `d`, and
/// checks that the request started it and was answered by it (not 503
/// from ray-dashd), and that it is then healthy, woken by that request.
pub async fn on_demand_modules_start_when_asked(d: &Dashd) {
    for name in DEFAULT_ON_DEMAND {
        let report = json_of(authed().get(d.url(&format!("/api/modules/{name}"))))
            .await
            .unwrap_or_else(|| panic!("no report of {name}"));
        assert_eq!(report["state"], "dormant", "{report:#}");
        let path = report["routes"]
            .as_array()
            .and_then(|routes| routes.iter().find(|r| r["method"] == "GET"))
            .and_then(|r| r["path"].as_str())
            .unwrap_or_else(|| panic!("{name} has no GET route: {report:#}"))
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "x"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let response = authed()
            .get(d.url(&path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        assert!(
            !body.contains("is not ready"),
            "{name} did not answer GET {path}: {status} {body}\nlog:\n{}",
            d.log()
        );
        let report = ray_module_healthy(d, &authed(), name).await;
        assert!(report["pid"].as_u64().is_some(), "{report:#}");
        let events: Vec<&str> = report["events"]
            .as_array()
            .map(|e| e.iter().filter_map(|e| e["kind"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(
            events.get(..2),
            Some(&["dormant", "woken"][..]),
            "{name}: {report:#}"
        );
        assert_eq!(report["restarts"], 0, "{report:#}");
    }
}

/// Waits, within [`RAY_WAIT`], until every one of [`RAY_MODULES`] is
/// healthy (those started on demand, once asked for); the reports.
pub async fn all_ray_modules_healthy(d: &Dashd) -> Vec<Value> {
    ray_modules_in(d, "healthy", |_| "healthy").await
}

fn driver_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ray_client_driver.py")
}

/// The Ray client driver (`tests/fixtures/ray_client_driver.py`), run by
/// `python` in `head`'s environment: `scenario` through `address`, with
/// `flags` the folder of the files it writes and waits for (the `hold` and
/// `resume` scenarios).
pub fn driver(
    head: &RayHead,
    python: &Path,
    address: &str,
    scenario: &str,
    flags: &Path,
) -> Command {
    let mut command = Command::new(python);
    command
        .arg(driver_script())
        .args([address, scenario])
        .arg(flags);
    head.env(&mut command);
    command
}

/// Runs a scenario of the client driver ([`driver`]) to its end; its JSON
/// result.
pub fn run_driver(head: &RayHead, python: &Path, address: &str, scenario: &str) -> Value {
    let flags = tempfile::tempdir().expect("flags dir");
    let output = run_bounded(driver(head, python, address, scenario, flags.path()));
    let out = text(&output);
    assert!(output.status.success(), "{scenario} failed:\n{out}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("{scenario} printed nothing:\n{out}"));
    let mut result: Value =
        serde_json::from_str(last).unwrap_or_else(|_| panic!("{scenario}: no JSON result:\n{out}"));
    if result["print_attempts"].as_u64().is_some_and(|n| n > 1) {
        eprintln!(
            "{scenario}: a task's print arrived on attempt {}",
            result["print_attempts"]
        );
    }
    result["stdout"] = Value::String(stdout.into_owned());
    result
}

/// What the client proxy module of `d` says of its clients and servers.
pub async fn clients(d: &Dashd) -> Value {
    d.client()
        .get(d.url("/api/client_proxy/clients"))
        .send()
        .await
        .expect("clients")
        .json()
        .await
        .expect("json")
}

/// `GET path` from the module listening on `socket`, with `headers`: its
/// status and body.
pub async fn socket_get(socket: &Path, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use http_body_util::BodyExt;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let mut request = http::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// How long two answers may differ because what the GCS holds changes.
const STATE_SETTLE: Duration = Duration::from_secs(30);

/// `GET path` through `d`, which the Ray state module answers from the
/// GCS, is what Ray's `module` answers (asked on its socket), as parsed
/// JSON, with `headers`, at one moment at least within [`STATE_SETTLE`]
/// (what the GCS holds may change between two answers). Returns it.
pub async fn answered_as_rays(
    d: &Dashd,
    path: &str,
    module: &str,
    headers: &[(&str, &str)],
) -> Value {
    let socket = d.session().join(format!("sockets/dash_{module}"));
    let last = std::sync::Mutex::new(String::new());
    let same = eventually(STATE_SETTLE, || async {
        let mut ours = authed().get(d.url(path));
        for (name, value) in headers {
            ours = ours.header(*name, *value);
        }
        let ours = ours.send().await.expect("ours").text().await.expect("body");
        let (status, theirs) = socket_get(&socket, path, headers).await;
        assert_eq!(status, 200, "{module}: {theirs}");
        let ours_json: Value = serde_json::from_str(&ours).expect("our JSON");
        let theirs_json: Value = serde_json::from_str(&theirs).expect("Ray's JSON");
        *last.lock().expect("last") = format!("ours:  {ours}\nRay's: {theirs}");
        (ours_json == theirs_json).then_some(ours_json)
    })
    .await;
    let last = last.into_inner().expect("last");
    same.unwrap_or_else(|| panic!("{path} {headers:?}: never the same as {module}'s\n{last}"))
}

/// The Ray state module's routes answer as Ray's modules do
/// ([`answered_as_rays`]): `/api/jobs/` for the CLI and for a browser
/// (whose secrets Ray 2.60 masks), `/api/cluster_status`; and the module
/// left none of them to Ray's. Returns the job list (the browser's).
pub async fn ray_state_answers_as_rays(d: &Dashd) -> Vec<Value> {
    answered_as_rays(d, "/api/jobs/", "JobHead", &[]).await;
    let browser = [("origin", "http://elsewhere.example")];
    let listed = answered_as_rays(d, "/api/jobs/", "JobHead", &browser).await;
    // Once the autoscaler has written its status (every few seconds), so
    // that its keys are camel-cased on both sides.
    let written = eventually(STATE_SETTLE, || async {
        let status = json_of(authed().get(d.url("/api/cluster_status"))).await?;
        status["data"]["clusterStatus"].is_object().then_some(())
    })
    .await;
    assert!(written.is_some(), "the autoscaler wrote no status");
    let status = answered_as_rays(d, "/api/cluster_status", "ReportHead", &[]).await;
    assert!(
        status["data"]["clusterStatus"]
            .as_object()
            .is_some_and(|s| s.keys().any(|k| k.contains(char::is_uppercase))),
        "{status}"
    );
    let module_log = std::fs::read_to_string(d.session().join("logs/dashboard_ray_state.err"))
        .expect("the Ray state module's log");
    assert!(
        module_log.contains("serving Ray's routes from the GCS")
            && !module_log.contains("left to Ray's module"),
        "{module_log}"
    );
    listed.as_array().cloned().unwrap_or_default()
}

/// The JSON answer to `request`; `None` when it cannot be had (for waits
/// that ask again).
pub async fn json_of(request: reqwest::RequestBuilder) -> Option<Value> {
    request.send().await.ok()?.json().await.ok()
}
