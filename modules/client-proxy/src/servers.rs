//! Specific servers: the Ray client server process each client gets.
//!
//! A server is started the way Ray starts one (same flags), on a port taken
//! from the pool, with its output in `<logs>/ray_client_server_<port>.out`
//! and `.err`. One task per server waits on the process: the moment it exits
//! it is reaped and its port goes back to the pool. Servers get SIGKILL from
//! the kernel when the proxy dies (parent-death signal), and their pids are
//! kept in a file so that a restarted proxy can stop any that survived.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::TokioExecutor;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use ray_dashd_contract::proc;
use ray_dashd_tls::{Connector, RayTls};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::driver::DriverChannel;
use crate::h2_settings::{CONNECTION_WINDOW_BYTES, MAX_FRAME_BYTES, STREAM_WINDOW_BYTES};
use crate::listeners;

/// How a specific server is started.
#[derive(Debug, Clone)]
pub struct ServerCommand {
    /// The program and its first arguments; Ray's flags are appended.
    pub argv: Vec<String>,
    /// The GCS address passed as `--address`.
    pub gcs_address: String,
    /// Where the servers' `.out`/`.err` files go.
    pub log_dir: PathBuf,
    /// How long a new server may take to accept connections.
    pub ready_timeout: Duration,
    /// SIGTERM, then SIGKILL after this.
    pub stop_grace: Duration,
    /// How often a server's driver connection is pinged.
    pub ping: Duration,
    /// Ray's TLS, when on: the servers inherit `RAY_USE_TLS` and serve
    /// with it, so the proxy dials them with it (checking their
    /// certificate against `127.0.0.1`, the address dialled, as Ray's
    /// proxier does).
    pub tls: Option<RayTls>,
    /// Whether a port where only another process listens is given up
    /// (`--own-listener`).
    pub own_listener: bool,
}

/// Why a server could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// Every port of the pool is in use.
    #[error("no free port in {first}-{last} for a Ray client server")]
    NoPort {
        /// First port of the pool.
        first: u16,
        /// Last port of the pool.
        last: u16,
    },
    /// The process could not be started.
    #[error("cannot start the Ray client server ({program}): {reason}")]
    Spawn {
        /// The program.
        program: String,
        /// What failed.
        reason: String,
    },
    /// It exited before accepting connections.
    #[error(
        "the Ray client server on port {port} exited ({status}) before it was ready; see {log}"
    )]
    Exited {
        /// Its port.
        port: u16,
        /// How it ended.
        status: String,
        /// Its error log.
        log: String,
    },
    /// Another process listens on its port too (gRPC sets SO_REUSEPORT, so
    /// both could bind), and the kernel would split the client's calls
    /// between them; or only another process listens there.
    #[error("another process listens on port {port}; a Ray client server there would share its connections or never get them")]
    Shared {
        /// The port.
        port: u16,
    },
    /// It did not accept connections in time.
    #[error("the Ray client server on port {port} did not accept connections within {timeout:?}; see {log}")]
    Timeout {
        /// Its port.
        port: u16,
        /// The limit.
        timeout: Duration,
        /// Its error log.
        log: String,
    },
}

/// The ports servers may listen on. A port is in use from the moment it is
/// handed out until its server's exit has been reaped.
#[derive(Debug)]
pub struct PortPool {
    range: RangeInclusive<u16>,
    in_use: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    taken: BTreeSet<u16>,
    next: u16,
}

impl PortPool {
    /// A pool of the ports in `range`.
    pub fn new(range: RangeInclusive<u16>) -> PortPool {
        let next = *range.end();
        PortPool {
            range,
            in_use: Mutex::new(PoolState {
                taken: BTreeSet::new(),
                next,
            }),
        }
    }

    /// Takes a port nobody listens on, going round the range downwards so
    /// that a port just given back is the last to be reused. Downwards from
    /// the top: Ray's own proxier takes the lowest free port of the same
    /// default range, so the two meet only when both are busy.
    pub fn take(&self) -> Result<u16, ServerError> {
        let (first, last) = (*self.range.start(), *self.range.end());
        let mut state = self.in_use.lock().expect("UNWRAP: pool lock poisoned");
        let span = u32::from(last - first) + 1;
        for step in 0..span {
            let port = last - ((u32::from(last - state.next) + step) % span) as u16;
            if state.taken.contains(&port) || !bindable(port) {
                continue;
            }
            state.taken.insert(port);
            state.next = if port == first { last } else { port - 1 };
            return Ok(port);
        }
        Err(ServerError::NoPort { first, last })
    }

    /// Gives `port` back.
    pub fn give_back(&self, port: u16) {
        let mut state = self.in_use.lock().expect("UNWRAP: pool lock poisoned");
        state.taken.remove(&port);
    }

    /// How many ports are handed out.
    pub fn in_use(&self) -> usize {
        self.in_use
            .lock()
            .expect("UNWRAP: pool lock poisoned")
            .taken
            .len()
    }
}

/// Whether nothing listens on `port` on loopback right now.
pub(crate) fn bindable(port: u16) -> bool {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
}

/// A running (or just ended) specific server.
#[derive(Debug)]
pub struct SpecificServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its process id.
    pub pid: u32,
    /// When it was started.
    pub started: SystemTime,
    /// An HTTP/2 client (one connection, multiplexed) for it.
    pub client: H2Client,
    /// `http://127.0.0.1:<port>` (`https` with TLS).
    pub origin: http::Uri,
    /// The connection its `RayletDriver` calls take.
    pub driver: DriverChannel,
    exit: watch::Receiver<Option<String>>,
    stop_grace: Duration,
}

impl SpecificServer {
    /// How it ended, once it has.
    pub fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    /// Waits until the process has exited.
    pub async fn exited(&self) {
        let mut exit = self.exit.clone();
        let _ = exit.wait_for(Option::is_some).await;
    }

    /// Stops it: SIGTERM to its process group, SIGKILL after the grace
    /// period. Returns once it has been reaped.
    pub async fn stop(&self) {
        if self.exit_status().is_some() {
            return;
        }
        signal_group(self.pid, Signal::SIGTERM);
        if tokio::time::timeout(self.stop_grace, self.exited())
            .await
            .is_err()
        {
            warn!(
                pid = self.pid,
                port = self.port,
                "Ray client server ignored SIGTERM; killing it"
            );
            signal_group(self.pid, Signal::SIGKILL);
            self.exited().await;
        }
    }
}

/// The HTTP/2 client calls to a server go through. Plain hyper rather than a
/// tonic `Channel`: the channel's request queue adds a task hop to every
/// call, which is most of a forwarded call's cost on loopback.
pub type H2Client = hyper_util::client::legacy::Client<Connector, tonic::body::Body>;

/// Ray's setting for how many idle seconds (checks, one a second) a
/// specific server without a client waits before it exits.
pub const IDLE_EXIT_ENV: &str = "TIMEOUT_FOR_SPECIFIC_SERVER_S";
/// A spare's value of it: ten years.
const SPARE_IDLE_CHECKS: &str = "315360000";

fn h2_client(tls: Option<RayTls>) -> H2Client {
    let connector = Connector::new(tls).timeout(Duration::from_secs(5));
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(STREAM_WINDOW_BYTES)
        .http2_initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .http2_max_frame_size(MAX_FRAME_BYTES)
        .timer(hyper_util::rt::TokioTimer::new())
        .build(connector)
}

fn signal_group(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(raw), signal);
    }
}

/// Starts servers and keeps track of them.
#[derive(Debug)]
pub struct Launcher {
    command: ServerCommand,
    ports: Arc<PortPool>,
    registry: Arc<PidFile>,
}

impl Launcher {
    /// A launcher using `command`, ports from `ports`, and `pid_file` to
    /// remember its servers across restarts of the proxy.
    pub fn new(command: ServerCommand, ports: Arc<PortPool>, pid_file: Arc<PidFile>) -> Launcher {
        Launcher {
            command,
            ports,
            registry: pid_file,
        }
    }

    /// The port pool.
    pub fn ports(&self) -> &PortPool {
        &self.ports
    }

    /// The error log of the server on `port`.
    pub fn error_log(&self, port: u16) -> PathBuf {
        self.command
            .log_dir
            .join(format!("ray_client_server_{port}.err"))
    }

    /// Starts a server on `port` (taken from the pool by the caller) with
    /// `context` as its `--serialized-runtime-env-context`, and waits until
    /// it accepts connections. On failure the port goes back to the pool.
    ///
    /// A `spare` waits for a client that may be long in coming, so it is
    /// started without Ray's idle exit (a server with no client quits after
    /// `TIMEOUT_FOR_SPECIFIC_SERVER_S`, 30 s by default): left on, a spare
    /// would quit and be started again every half minute. Its life is the
    /// proxy's to end, as every assigned server's is.
    pub async fn start(
        &self,
        port: u16,
        context: &str,
        spare: bool,
    ) -> Result<Arc<SpecificServer>, ServerError> {
        let started_at = Instant::now();
        let (child, pid) = match self.spawn(port, context, spare) {
            Ok(spawned) => spawned,
            Err(e) => {
                self.ports.give_back(port);
                return Err(e);
            }
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        self.registry.add(pid);
        tokio::spawn(reap(
            child,
            pid,
            port,
            exit_tx,
            self.ports.clone(),
            self.registry.clone(),
        ));
        let server = Arc::new(SpecificServer {
            port,
            pid,
            started: SystemTime::now(),
            client: h2_client(self.command.tls.clone()),
            origin: format!(
                "{}://127.0.0.1:{port}",
                ray_dashd_tls::scheme(self.command.tls.as_ref())
            )
            .parse()
            .expect("UNWRAP: loopback URI is valid"),
            driver: DriverChannel::new(port, self.command.ping, self.command.tls.clone()),
            exit: exit_rx,
            stop_grace: self.command.stop_grace,
        });
        let log = self.error_log(port).display().to_string();
        match tokio::time::timeout(self.command.ready_timeout, wait_listening(&server)).await {
            Ok(Ok(())) => {
                if shared_port(port, pid, self.command.own_listener).await {
                    warn!(
                        port,
                        pid, "another process listens on the Ray client server's port"
                    );
                    server.stop().await;
                    return Err(ServerError::Shared { port });
                }
                info!(
                    port,
                    pid,
                    elapsed_ms = started_at.elapsed().as_millis() as u64,
                    "Ray client server ready"
                );
                Ok(server)
            }
            Ok(Err(status)) => Err(ServerError::Exited { port, status, log }),
            Err(_) => {
                server.stop().await;
                Err(ServerError::Timeout {
                    port,
                    timeout: self.command.ready_timeout,
                    log,
                })
            }
        }
    }

    fn spawn(&self, port: u16, context: &str, spare: bool) -> Result<(Child, u32), ServerError> {
        let spawn_error = |reason: String| ServerError::Spawn {
            program: self.command.argv.first().cloned().unwrap_or_default(),
            reason,
        };
        let (program, args) = self
            .command
            .argv
            .split_first()
            .ok_or_else(|| spawn_error("empty command".into()))?;
        let log = |ext: &str| {
            let path = self
                .command
                .log_dir
                .join(format!("ray_client_server_{port}.{ext}"));
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| spawn_error(format!("cannot open {}: {e}", path.display())))
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .arg(format!("--address={}", self.command.gcs_address))
            .arg("--host=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg("--mode=specific-server")
            .arg("--language=PYTHON")
            .arg(format!("--serialized-runtime-env-context={context}"))
            .stdin(Stdio::null())
            .stdout(log("out")?)
            .stderr(log("err")?);
        if spare {
            cmd.env(IDLE_EXIT_ENV, SPARE_IDLE_CHECKS);
        }
        // Its own group, which `stop` signals; and SIGKILL from the kernel
        // when the proxy dies.
        ray_dashd_contract::child::own_child(cmd.as_std_mut());
        let child = cmd.spawn().map_err(|e| spawn_error(e.to_string()))?;
        let pid = child
            .id()
            .ok_or_else(|| spawn_error("exited at once".into()))?;
        debug!(port, pid, "Ray client server spawned");
        Ok((child, pid))
    }
}

/// Waits until the server accepts TCP connections, or fails with how it
/// ended if it exits first.
async fn wait_listening(server: &SpecificServer) -> Result<(), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port));
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(status) = server.exit_status() {
            return Err(status);
        }
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            // A connect to a port nobody listens on can land on itself when
            // the kernel picks that very port as the source (TCP self-connect).
            if stream.local_addr().ok() != stream.peer_addr().ok() {
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = server.exited() => {}
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How long a server's own listener is looked for when only another
/// process's is seen on its port.
const OWN_LISTENER_WAIT: Duration = Duration::from_secs(3);

/// Whether the server of process group `group`, which answers on `port`,
/// shares the port with another process's listener, or does not listen on
/// it at all while another process does. When only another's listener is
/// there, the server's own may be a moment from binding beside it: it is
/// looked for a little while; after that the port counts as another's, so
/// a process that bound it between the pool's check and the server's own
/// bind never gets a client's calls (its metadata and token included),
/// unless `own_listener` is off.
async fn shared_port(port: u16, group: u32, own_listener: bool) -> bool {
    let deadline = Instant::now() + OWN_LISTENER_WAIT;
    loop {
        match listeners::census(port, group) {
            Ok(census) if census.strangers == 0 => return false,
            Ok(census) if census.ours > 0 => return true,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => return own_listener,
            Err(e) => {
                debug!(port, error = %e, "cannot tell who listens on the port");
                return false;
            }
        }
    }
}

async fn reap(
    mut child: Child,
    pid: u32,
    port: u16,
    exit: watch::Sender<Option<String>>,
    ports: Arc<PortPool>,
    registry: Arc<PidFile>,
) {
    let status = match child.wait().await {
        Ok(status) => describe(status),
        Err(e) => format!("wait failed: {e}"),
    };
    info!(pid, port, %status, "Ray client server exited; port returned to the pool");
    registry.remove(pid);
    ports.give_back(port);
    let _ = exit.send(Some(status));
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(signal) => format!("killed by {signal}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        _ => status.to_string(),
    }
}

/// The pids of the servers this proxy started, with each one's start time
/// (from `/proc/<pid>/stat`) so that a reused pid is never mistaken for one.
#[derive(Debug)]
pub struct PidFile {
    path: Option<PathBuf>,
    pids: Mutex<Vec<(u32, u64)>>,
}

impl PidFile {
    /// A registry kept at `path` (none: kept in memory only).
    pub fn new(path: Option<PathBuf>) -> PidFile {
        PidFile {
            path,
            pids: Mutex::new(Vec::new()),
        }
    }

    /// Stops the servers an earlier run of the proxy left behind: every pid
    /// in the file that still names the same process (same start time).
    /// Returns how many were stopped.
    pub fn stop_leftovers(&self) -> usize {
        let Some(path) = &self.path else { return 0 };
        let Ok(text) = std::fs::read_to_string(path) else {
            return 0;
        };
        let mut stopped = 0;
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(Ok(pid)), Some(Ok(start))) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u64>),
            ) else {
                continue;
            };
            if start_time(pid) == Some(start) {
                warn!(
                    pid,
                    "stopping a Ray client server left by an earlier run of the proxy"
                );
                signal_group(pid, Signal::SIGKILL);
                stopped += 1;
            }
        }
        self.save(&[]);
        stopped
    }

    fn add(&self, pid: u32) {
        let Some(start) = start_time(pid) else { return };
        let mut pids = self.pids.lock().expect("UNWRAP: pid file lock poisoned");
        pids.push((pid, start));
        self.save(&pids);
    }

    fn remove(&self, pid: u32) {
        let mut pids = self.pids.lock().expect("UNWRAP: pid file lock poisoned");
        pids.retain(|(p, _)| *p != pid);
        self.save(&pids);
    }

    fn save(&self, pids: &[(u32, u64)]) {
        let Some(path) = &self.path else { return };
        let text: String = pids
            .iter()
            .map(|(pid, start)| format!("{pid} {start}\n"))
            .collect();
        let tmp = path.with_extension("tmp");
        let result = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = result {
            warn!(path = %path.display(), error = %e, "cannot save the Ray client server pids");
        }
    }
}

/// The start time of `pid` in clock ticks since boot, if it runs.
fn start_time(pid: u32) -> Option<u64> {
    proc::stat(pid).ok().map(|stat| stat.start)
}

/// Checks that `dir` exists and can take log files.
pub fn check_log_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_goes_round_and_skips_taken_ports() {
        // A port above the kernel's ephemeral range (32768–60999), so that
        // no outgoing connection takes it once it is let go.
        let holder = (61_500..65_500)
            .find_map(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok())
            .expect("a free port above the ephemeral range");
        let busy = holder.local_addr().unwrap().port();
        let pool = PortPool::new(busy..=busy);
        assert!(
            matches!(pool.take(), Err(ServerError::NoPort { .. })),
            "a port someone listens on was handed out"
        );
        drop(holder);
        // A child another test is spawning may hold a copy of the socket
        // until its exec: wait for the port with a bound.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let taken = loop {
            match pool.take() {
                Ok(port) => break port,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("the freed port is not handed out: {e}"),
            }
        };
        assert_eq!(taken, busy);
        assert!(pool.take().is_err(), "a port was handed out twice");
        pool.give_back(busy);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.take().unwrap(), busy);
    }

    #[test]
    fn pool_hands_out_ports_from_the_top_down() {
        let first = (61_500..65_000)
            .find(|&port| (port..port + 3).all(bindable))
            .expect("three free ports above the ephemeral range");
        let pool = PortPool::new(first..=first + 2);
        let order: Vec<u16> = (0..3).map(|_| pool.take().expect("a port")).collect();
        assert_eq!(order, [first + 2, first + 1, first]);
        pool.give_back(first + 1);
        assert_eq!(pool.take().expect("the port given back"), first + 1);
    }

    #[test]
    fn leftovers_of_an_earlier_run_are_stopped_and_reused_pids_spared() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers");
        let mut leftover = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = leftover.id();
        {
            let earlier = PidFile::new(Some(path.clone()));
            earlier.add(pid);
            earlier.add(std::process::id());
        }
        // Our own pid, listed with another start time, stands for a reused pid.
        let text = std::fs::read_to_string(&path).unwrap().replace(
            &format!(
                "{} {}",
                std::process::id(),
                start_time(std::process::id()).unwrap()
            ),
            &format!("{} 1", std::process::id()),
        );
        std::fs::write(&path, text).unwrap();
        let stopped = PidFile::new(Some(path.clone())).stop_leftovers();
        assert_eq!(stopped, 1);
        let status = leftover.wait().unwrap();
        assert!(!status.success(), "the leftover was not killed: {status}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "",
            "the file still lists pids"
        );
    }

    #[test]
    fn start_time_reads_our_own_process() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
    }
}
