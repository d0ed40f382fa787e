//! Specific servers: the Ray client server process each client gets.
//!
//! A server is started the way Ray starts one (same flags), on a port taken
//! from the pool (a range's, or one the kernel picks), with its output in `<logs>/ray_client_server_<port>.out`
//! and `.err`. One task per server waits on the process: the moment it exits
//! it is reaped and its port goes back to the pool. Servers get SIGKILL from
//! the kernel when the proxy dies (parent-death signal), and their pids are
//! kept in a file so that a restarted proxy can stop any that survived.
//!
//! Layout: `ports` is the pool of ports; `launch` starts a server, waits
//! until it is ready and reaps it; `census` checks that the port is the
//! server's alone; `pid_file` remembers the servers across restarts of the
//! proxy. This file holds what they share: the command, the errors, and
//! the running server.

mod census;
mod launch;
mod pid_file;
mod ports;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use ray_dashd_tls::{Connector, RayTls};
use tokio::sync::watch;
use tracing::warn;

use crate::driver::DriverChannel;

pub use launch::{Launcher, IDLE_EXIT_ENV};
pub use pid_file::PidFile;
pub(crate) use ports::bindable;
pub use ports::PortPool;

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
    /// The kernel gave no port (`--port-range auto`).
    #[error("the kernel gave no free port for a Ray client server: {reason}")]
    NoKernelPort {
        /// Why.
        reason: String,
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

fn signal_group(pid: u32, signal: Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = killpg(Pid::from_raw(raw), signal);
    }
}

/// Checks that `dir` exists and can take log files.
pub fn check_log_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)
}
