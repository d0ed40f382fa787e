//! Starting a server: its command line and log files, the wait until it
//! accepts connections, and the task that reaps it and gives its port back.

use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::TokioExecutor;
use nix::sys::signal::Signal;
use ray_dashd_contract::Backoff;
use ray_dashd_tls::{Connector, RayTls};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::census::shared_port;
use super::{H2Client, PidFile, PortPool, ServerCommand, ServerError, SpecificServer};
use crate::driver::DriverChannel;
use crate::h2_settings::{CONNECTION_WINDOW_BYTES, MAX_FRAME_BYTES, STREAM_WINDOW_BYTES};

/// Ray's setting for how many idle seconds (checks, one a second) a
/// specific server without a client waits before it exits.
pub const IDLE_EXIT_ENV: &str = "TIMEOUT_FOR_SPECIFIC_SERVER_S";
/// A spare's value of it: ten years.
const SPARE_IDLE_CHECKS: &str = "315360000";
/// The pauses between looks at whether a new server listens: 5 ms first,
/// doubling up to 50 ms (an exit ends the wait at once).
const LISTENING_POLLS: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(50));

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
        match tokio::time::timeout(self.command.ready_timeout, wait_listening(&server, &log)).await
        {
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
            Ok(Err(exited)) => Err(exited),
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
/// ended ([`ServerError::Exited`], naming its error `log`) if it exits
/// first.
async fn wait_listening(server: &SpecificServer, log: &str) -> Result<(), ServerError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port));
    let mut pauses = LISTENING_POLLS;
    loop {
        if let Some(status) = server.exit_status() {
            return Err(ServerError::Exited {
                port: server.port,
                status,
                log: log.to_owned(),
            });
        }
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            // A connect to a port nobody listens on can land on itself when
            // the kernel picks that very port as the source (TCP self-connect).
            if stream.local_addr().ok() != stream.peer_addr().ok() {
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pauses.next_delay()) => {}
            _ = server.exited() => {}
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
