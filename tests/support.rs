//! Test fixtures: a real `ray-dashd` process with the test module behind it,
//! started in a private temp dir on a free loopback port, killed by pid on drop;
//! the Pythons the tests need and `--check-config`. A real Ray head: [`ray`].

pub mod ray;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ray_dashd_contract::proc;
use serde_json::Value;

/// How long a fixture may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Default bound for `eventually`.
pub const WAIT: Duration = Duration::from_secs(20);

/// Held by each test that takes a default port of Ray's or ray-dashd's
/// ([`DEFAULT_PORT_NUMBERS`]): one at a time, whatever the test harness
/// runs beside.
pub static DEFAULT_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The fixed ports of the README's Ray and ray-dashd: the GCS, the
/// dashboard, the Ray Client proxy, Ray's own client proxier as the README
/// moves it, Ray's dashboard metrics port and the next (ray-dashd's when
/// Ray's process holds 44227), the dashboard agent. Three lie in Linux's
/// ephemeral range, where a port bound as `:0` may land: the synthetic
/// cluster's nodes keep off them all (`ray_scale.rs`).
pub const DEFAULT_PORT_NUMBERS: [u16; 7] = [6379, 8265, 10001, 20001, 44227, 44228, 52365];

pub use crate::bins::{bin_dir, test_module_bin};

/// Every route of the test module, as config lines.
pub const TEST_ROUTES: &[(&str, &str, &str)] = &[
    ("GET", "/test/echo", "http"),
    ("POST", "/test/echo", "http"),
    ("PUT", "/test/echo", "http"),
    ("GET", "/test/echo/{rest}", "http"),
    ("POST", "/test/body", "http"),
    ("POST", "/test/early", "http"),
    ("GET", "/test/stream", "stream"),
    ("GET", "/test/stats", "http"),
    ("GET", "/test/info", "http"),
    ("GET", "/test/decline", "http"),
    ("GET", "/test/ws/echo", "websocket"),
    ("GET", "/test/ws/out", "websocket"),
    ("GET", "/test/ws/not", "websocket"),
    ("POST", "/test/crash", "http"),
    ("POST", "/test/hang", "http"),
    ("POST", "/test/spin", "http"),
    ("POST", "/test/grow", "http"),
    ("GET", "/test/count", "http"),
    ("POST", "/test/print", "http"),
    ("GET", "/test/slow", "http"),
    ("GET", "/test/status/{code}", "http"),
    ("GET", "/test/cookies", "http"),
    ("GET", "/test/hop", "http"),
    ("POST", "/test/health/{mode}", "http"),
];

/// A module to put in the fixture's config.
#[derive(Debug, Clone)]
pub struct ModuleDef {
    name: String,
    command: Vec<String>,
    env: Vec<(String, String)>,
    routes: Vec<(String, String, String)>,
    supervision: Vec<(String, String)>,
    /// Routes (by path) with a `cache_secs`.
    cached: Vec<(String, String)>,
    /// Routes (by path) with a `fallback` module.
    fallbacks: Vec<(String, String)>,
    /// Its `start` (a TOML value), when set.
    start: Option<String>,
}

/// The test module under `name`, serving every test route under `prefix`
/// (`/test` keeps the module's own paths).
pub fn test_module(name: &str) -> ModuleDef {
    ModuleDef {
        name: name.to_owned(),
        command: vec![test_module_bin().display().to_string()],
        env: vec![],
        routes: TEST_ROUTES
            .iter()
            .map(|(m, p, k)| (m.to_string(), p.to_string(), k.to_string()))
            .collect(),
        supervision: vec![],
        cached: vec![],
        fallbacks: vec![],
        start: None,
    }
}

/// A module with a command of one's own and no routes.
pub fn command_module(name: &str, command: &[&str]) -> ModuleDef {
    ModuleDef {
        name: name.to_owned(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        routes: vec![],
        supervision: vec![],
        cached: vec![],
        fallbacks: vec![],
        start: None,
    }
}

impl ModuleDef {
    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Replaces the routes.
    pub fn routes(mut self, routes: &[(&str, &str, &str)]) -> Self {
        self.routes = routes
            .iter()
            .map(|(m, p, k)| (m.to_string(), p.to_string(), k.to_string()))
            .collect();
        self
    }

    /// Gives the route with `path` a `cache_secs` (a TOML value).
    pub fn cached(mut self, path: &str, secs: &str) -> Self {
        self.cached.push((path.into(), secs.into()));
        self
    }

    /// Gives the route with `path` a `fallback` module.
    pub fn fallback(mut self, path: &str, module: &str) -> Self {
        self.fallbacks.push((path.into(), module.into()));
        self
    }

    /// Starts it on demand: at the first request for one of its routes.
    pub fn on_demand(mut self) -> Self {
        self.start = Some("\"on_demand\"".to_owned());
        self
    }

    /// Sets a supervision setting (a TOML value).
    pub fn supervision(mut self, key: &str, value: &str) -> Self {
        self.supervision.push((key.into(), value.into()));
        self
    }

    fn to_toml(&self) -> String {
        let mut t = String::from("[[modules]]\n");
        t += &format!("name = {}\n", quote(&self.name));
        let cmd: Vec<String> = self.command.iter().map(|c| quote(c)).collect();
        t += &format!("command = [{}]\n", cmd.join(", "));
        if !self.env.is_empty() {
            let env: Vec<String> = self
                .env
                .iter()
                .map(|(k, v)| format!("{} = {}", quote(k), quote(v)))
                .collect();
            t += &format!("env = {{ {} }}\n", env.join(", "));
        }
        if !self.supervision.is_empty() {
            let s: Vec<String> = self
                .supervision
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            t += &format!("supervision = {{ {} }}\n", s.join(", "));
        }
        if let Some(start) = &self.start {
            t += &format!("start = {start}\n");
        }
        t += "routes = [\n";
        for (m, p, k) in &self.routes {
            let cache = self
                .cached
                .iter()
                .find(|(path, _)| path == p)
                .map(|(_, secs)| format!(", cache_secs = {secs}"))
                .unwrap_or_default();
            let fallback = self
                .fallbacks
                .iter()
                .find(|(path, _)| path == p)
                .map(|(_, module)| format!(", fallback = {}", quote(module)))
                .unwrap_or_default();
            t += &format!(
                "  {{ method = {}, path = {}, type = {}{cache}{fallback} }},\n",
                quote(m),
                quote(p),
                quote(k)
            );
        }
        t += "]\n";
        t
    }
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("string serializes")
}

/// Builds a [`Dashd`].
#[derive(Debug, Default)]
pub struct DashdBuilder {
    modules: Vec<ModuleDef>,
    server: Vec<(String, String)>,
    extra: String,
    session: Option<PathBuf>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    stall_stderr: bool,
    binary: Option<PathBuf>,
    default_config: bool,
    nofile: Option<(u64, u64)>,
    ca: Option<String>,
    prefix: String,
}

/// Starts describing a ray-dashd fixture.
pub fn dashd() -> DashdBuilder {
    DashdBuilder::default()
}

impl DashdBuilder {
    /// Adds a module.
    pub fn module(mut self, module: ModuleDef) -> Self {
        self.modules.push(module);
        self
    }

    /// Sets a `[server]` setting (a TOML value).
    pub fn server(mut self, key: &str, value: &str) -> Self {
        self.server.push((key.into(), value.into()));
        self
    }

    /// Appends raw TOML (whole tables) to the config.
    pub fn toml(mut self, text: &str) -> Self {
        self.extra.push_str(text);
        self.extra.push('\n');
        self
    }

    /// Uses `dir` as the session folder instead of a fresh one.
    pub fn session_dir(mut self, dir: &Path) -> Self {
        self.session = Some(dir.to_path_buf());
        self
    }

    /// Sets an environment variable of ray-dashd (and so of its modules).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs `binary` instead of the workspace's `ray-dashd`.
    pub fn binary(mut self, binary: &Path) -> Self {
        self.binary = Some(binary.to_path_buf());
        self
    }

    /// Passes no `--config`: ray-dashd runs its built-in config (the
    /// modules and `[server]` settings given here are not used).
    pub fn default_config(mut self) -> Self {
        self.default_config = true;
        self
    }

    /// Starts ray-dashd with this soft and hard `RLIMIT_NOFILE` (through
    /// `sh -c 'ulimit …; exec ray-dashd …'`: the pid is ray-dashd's).
    pub fn nofile(mut self, soft: u64, hard: u64) -> Self {
        self.nofile = Some((soft, hard));
        self
    }

    /// Talks HTTPS to it, trusting the CA certificate `ca_pem` (the
    /// certificate and key are passed as the test chooses: flags,
    /// variables or `[server]` settings).
    pub fn https(mut self, ca_pem: &str) -> Self {
        self.ca = Some(ca_pem.to_owned());
        self
    }

    /// Addresses it under `prefix` ([`Dashd::url`] and the waits that use
    /// it; the setting is passed as the test chooses).
    pub fn prefixed(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// Adds a command-line argument of ray-dashd.
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Stops reading ray-dashd's stderr once it listens, as a stalled
    /// reader would, until [`Dashd::resume_stderr`]: the pipe fills.
    pub fn stall_stderr(mut self) -> Self {
        self.stall_stderr = true;
        self
    }

    /// The config file's text.
    pub fn config_text(&self) -> String {
        let mut t = String::from("[server]\n");
        for (k, v) in &self.server {
            t += &format!("{k} = {v}\n");
        }
        for m in &self.modules {
            t += &m.to_toml();
        }
        t += &self.extra;
        t
    }

    /// Starts ray-dashd and waits until it listens (not until modules are ready).
    pub fn start(self) -> Dashd {
        let tmp = tempfile::Builder::new()
            .prefix("rd")
            .tempdir()
            .expect("tempdir");
        let config = tmp.path().join("dashd.toml");
        std::fs::write(&config, self.config_text()).expect("write config");
        let session = self.session.clone().unwrap_or_else(|| tmp.path().join("s"));
        let binary = self
            .binary
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ray-dashd")));
        let mut command = match self.nofile {
            Some((soft, hard)) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!(
                        "ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\""
                    ))
                    .arg(&binary);
                sh
            }
            None => Command::new(&binary),
        };
        command
            .arg("--session-dir")
            .arg(&session)
            .arg("--port")
            .arg("0")
            .args(&self.args);
        if !self.default_config {
            command.arg("--config").arg(&config);
        }
        let mut child = command
            .env("RAY_DASHD_LOG", "info,ray_dashd=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ray-dashd");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
        let mut stall = self.stall_stderr.then_some(resume_rx);
        let sink = Arc::clone(&log);
        let (read_tx, read_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // Dropped when stderr ends: the log is whole.
            let _read = read_tx;
            let mut addr_tx = Some(addr_tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(tx) = &addr_tx {
                    if let Some(addr) = parse_listening(&line) {
                        let _ = tx.send(addr);
                        addr_tx = None;
                        // Until resumed, or until the fixture is dropped.
                        if let Some(resume) = stall.take() {
                            let _ = resume.recv();
                        }
                    }
                }
                let mut log = sink.lock().expect("log lock");
                log.push_str(&line);
                log.push('\n');
            }
        });
        let addr = match addr_rx.recv_timeout(START_TIMEOUT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ray-dashd did not start listening; stderr:\n{}",
                    log.lock().expect("log lock")
                );
            }
        };
        let token = self
            .env
            .iter()
            .find(|(k, _)| k == "RAY_AUTH_TOKEN")
            .map(|(_, v)| v.clone());
        Dashd {
            child: Some(child),
            addr,
            session,
            log,
            log_read: Some(read_rx),
            resume_stderr: Some(resume_tx),
            tmp,
            token,
            ca: self.ca,
            prefix: self.prefix,
        }
    }
}

fn parse_listening(line: &str) -> Option<SocketAddr> {
    if !line.contains("ray-dashd listening") {
        return None;
    }
    let rest = &line[line.find("addr=")? + 5..];
    rest.split_whitespace().next()?.parse().ok()
}

/// A running ray-dashd.
#[derive(Debug)]
pub struct Dashd {
    child: Option<Child>,
    addr: SocketAddr,
    session: PathBuf,
    log: Arc<Mutex<String>>,
    /// Disconnected once the whole of its stderr has been read.
    log_read: Option<std::sync::mpsc::Receiver<()>>,
    /// Dropped to resume reading a stalled stderr.
    resume_stderr: Option<std::sync::mpsc::Sender<()>>,
    #[allow(dead_code)]
    tmp: tempfile::TempDir,
    /// `RAY_AUTH_TOKEN` of its environment: in token mode the host's API
    /// asks for it.
    token: Option<String>,
    /// The CA its certificate chains to, when it serves HTTPS.
    ca: Option<String>,
    /// Its `server.url_prefix`, which [`Dashd::url`] puts before paths.
    prefix: String,
}

impl Dashd {
    /// A client for this host: it presents the host's token, if any, and
    /// trusts the CA of its certificate, when it serves HTTPS.
    pub fn client(&self) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(token) = &self.token {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().expect("header value"),
            );
            builder = builder.default_headers(headers);
        }
        if let Some(ca) = &self.ca {
            let ca = reqwest::Certificate::from_pem(ca.as_bytes()).expect("CA PEM");
            builder = builder.add_root_certificate(ca);
        }
        builder.build().expect("reqwest client")
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><prefix><path>` (`https` when it serves HTTPS).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{}{}", self.addr, self.prefix, path)
    }

    /// `ws://<addr><prefix><path>`.
    pub fn ws_url(&self, path: &str) -> String {
        format!("ws://{}{}{}", self.addr, self.prefix, path)
    }

    /// The config file it was started with (a reload reads it again).
    pub fn config_path(&self) -> PathBuf {
        self.tmp.path().join("dashd.toml")
    }

    /// The session folder.
    pub fn session(&self) -> &Path {
        &self.session
    }

    /// The socket of module `name`.
    pub fn socket_path(&self, name: &str) -> PathBuf {
        self.session
            .join("sockets")
            .join(ray_dashd_contract::names::socket_name(name))
    }

    /// ray-dashd's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Reads ray-dashd's stderr again after [`DashdBuilder::stall_stderr`].
    pub fn resume_stderr(&mut self) {
        self.resume_stderr.take();
    }

    /// What ray-dashd wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }

    /// The log once it holds `needle`, waited for within [`WAIT`]: ray-dashd
    /// writes its log off the serving thread, so a line can come a moment
    /// after what it tells of. Panics with the log when it does not come.
    pub async fn logged(&self, needle: &str) -> String {
        eventually(WAIT, || async {
            let log = self.log();
            log.contains(needle).then_some(log)
        })
        .await
        .unwrap_or_else(|| panic!("{needle:?} never logged; log:\n{}", self.log()))
    }

    /// `GET /api/modules/<name>`.
    pub async fn module(&self, name: &str) -> Value {
        self.client()
            .get(self.url(&format!("/api/modules/{name}")))
            .send()
            .await
            .expect("GET /api/modules/<name>")
            .json()
            .await
            .expect("module json")
    }

    /// Waits until module `name` is healthy with at least `incarnation`;
    /// returns its report.
    pub async fn healthy(&self, name: &str, incarnation: u64) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let last = self.module(name).await;
            if last["state"] == "healthy" && last["incarnation"].as_u64() >= Some(incarnation) {
                return last;
            }
            assert!(
                Instant::now() < deadline,
                "module {name} not healthy at incarnation {incarnation}: {last:#}\nlog:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `GET /test/stats` of the test module serving the `/test` routes.
    pub async fn test_stats(&self) -> Option<Value> {
        let response = self
            .client()
            .get(self.url("/test/stats"))
            .send()
            .await
            .ok()?;
        response.json().await.ok()
    }

    /// Waits until the test module has at least `n` requests in flight.
    pub async fn wait_in_flight(&self, n: u64) {
        let reached = eventually(WAIT, || async {
            let stats = self.test_stats().await?;
            (stats["requests_in_flight"].as_u64() >= Some(n)).then_some(())
        })
        .await;
        assert!(
            reached.is_some(),
            "{n} requests never reached the test module"
        );
    }

    /// Sends a signal to ray-dashd.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, signal).expect("signal ray-dashd");
    }

    /// Waits (bounded) for ray-dashd to exit.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                // What it wrote last may still be on its way through the pipe.
                if let Some(read) = self.log_read.take() {
                    let _ = read.recv_timeout(LOG_DRAIN);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "ray-dashd did not exit within {within:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How long an exited ray-dashd's last log lines may take to be read.
const LOG_DRAIN: Duration = Duration::from_secs(5);

/// How many of ray-dashd's last log lines a failing test prints.
const LOG_TAIL_LINES: usize = 80;

impl Drop for Dashd {
    fn drop(&mut self) {
        // A failing test shows what the server said: a failure seen once in
        // CI is then explained by its own output.
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!(
                "--- ray-dashd at {} (last {} of {} log lines) ---\n{}",
                self.addr,
                tail.len(),
                lines.len(),
                tail.join("\n")
            );
        }
        if let Some(mut child) = self.child.take() {
            // SIGKILL: the modules follow through their parent-death signal.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The value of the series `series` (its name and labels, as written) in a
/// Prometheus text scrape, if the scrape has it.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// A client that follows no redirects and has no proxy.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .expect("reqwest client")
}

/// Sends `request` as raw bytes and returns the raw response head and body
/// (the server closes the connection: the request says `Connection: close`).
pub fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    std::io::Write::write_all(&mut stream, request).expect("write");
    let mut response = Vec::new();
    let _ = std::io::Read::read_to_end(&mut stream, &mut response);
    String::from_utf8_lossy(&response).into_owned()
}

/// Polls `probe` every 20 ms until it returns `Some`, at most for `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pid of the cgroup warden that host `host` started.
pub fn warden_of(host: u32) -> Option<u32> {
    proc::pids().ok()?.find(|&pid| {
        proc::stat(pid).is_ok_and(|s| s.ppid == host)
            && proc::cmdline(pid).is_ok_and(|args| args.iter().any(|a| a == "--cgroup-warden"))
    })
}

/// `/proc/<pid>/stat`; `None` once the process is gone.
pub fn proc_stat(pid: u32) -> Option<proc::Stat> {
    proc::stat(pid).ok()
}

/// Whether process `pid` is gone (or a zombie no one reaped yet).
pub fn process_gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|stat| stat.is_dead())
}

/// CPU time (user + system) of process `pid` so far, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = proc_stat(pid).expect("proc stat");
    stat.utime + stat.stime
}

/// Resident memory of `pid` in KiB (VmRSS).
pub fn rss_kib(pid: u32) -> u64 {
    proc::status_kib(pid, "VmRSS").expect("VmRSS")
}

/// Waits (bounded) for the file `path`, written whole by a test's
/// process, and reads the pid in it.
pub async fn read_pid_file(path: &Path) -> u32 {
    let pid = eventually(WAIT, || async {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    })
    .await;
    pid.unwrap_or_else(|| panic!("no pid in {} within {WAIT:?}", path.display()))
}

/// Waits (bounded by `within`) until process `pid` is gone or a zombie.
pub async fn gone_within(pid: u32, within: Duration) -> bool {
    eventually(within, || async { process_gone(pid).then_some(()) })
        .await
        .is_some()
}

/// Sends `signal` to `pid`.
pub fn kill(pid: u64, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("kill");
}

/// The Python with aiohttp, named by `RAY_DASHD_TEST_PYTHON` (scripts/test
/// sets it; the Python with Ray is [`ray::ray_python`]). Missing, the test
/// fails: a skipped run must not pass for one that ran.
pub fn python() -> String {
    std::env::var("RAY_DASHD_TEST_PYTHON")
        .expect("RAY_DASHD_TEST_PYTHON must name a Python with aiohttp (scripts/test sets it)")
}

/// The variables that would set what the tests set through files and
/// flags: [`check_config`] runs without them.
const CONFIG_VARS: &[&str] = &[
    "RAY_DASHD_SESSION_DIR",
    "RAY_DASHD_HOST",
    "RAY_DASHD_PORT",
    "RAY_DASHD_RAY_CLIENT_PORT",
    "RAY_DASHD_RAY_PYTHON",
    "RAY_DASHD_CONFIG",
];

/// `ray-dashd --check-config` with `args`, none of [`CONFIG_VARS`] set.
pub fn check_config(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ray-dashd"));
    command.arg("--check-config").args(args);
    for var in CONFIG_VARS {
        command.env_remove(var);
    }
    command.output().expect("run ray-dashd --check-config")
}

/// [`check_config`] of `text`, written as file `name` (which its errors
/// name) in a temp dir.
pub fn check_config_text(name: &str, text: &str) -> Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write config");
    check_config(&["--config", path.to_str().expect("utf8")])
}

/// Module `name`, a few lines of Python (`RAY_DASHD_TEST_PYTHON`) that
/// answer `GET /api/healthz` with 200 and any other request with `answer`,
/// raw bytes as written, then close: for module answers no real HTTP server
/// would write. The module's own process listens, as the host's peer check
/// of module sockets requires.
pub fn raw_module(name: &str, answer: &[u8]) -> ModuleDef {
    const SERVER: &str = r#"
import os, socket, threading
answer = bytes.fromhex(os.environ["RAW_ANSWER_HEX"])
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.environ["RAY_DASHD_SOCKET"])
listener.listen(64)
def serve(conn):
    pending = b""
    while True:
        data = conn.recv(4096)
        if not data:
            break
        pending += data
        while b"\r\n\r\n" in pending:
            request, pending = pending.split(b"\r\n\r\n", 1)
            if request.startswith(b"GET /api/healthz "):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            else:
                conn.sendall(answer)
                conn.close()
                return
    conn.close()
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"#;
    let python = python();
    let hex: String = answer.iter().map(|b| format!("{b:02x}")).collect();
    command_module(name, &[&python, "-c", SERVER]).env("RAW_ANSWER_HEX", &hex)
}

/// The text of `path` once it holds `needle`, waiting at most [`WAIT`]: a
/// module's output reaches its `.out`/`.err` through the host's pipe, a
/// moment after the module wrote it. Panics with the text it had.
pub async fn file_with(path: &Path, needle: &str) -> String {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    let found = eventually(WAIT, || async { read().contains(needle).then(read) }).await;
    found.unwrap_or_else(|| panic!("{} never held {needle:?}:\n{}", path.display(), read()))
}
