//! SDK for ray-dashd modules written in Rust: read the environment the host
//! sets, serve an axum [`Router`] on the Unix socket it names, answer
//! `GET /api/healthz`, and stop gracefully on SIGTERM or SIGINT.
//!
//! The host starts each module with these variables:
//!
//! | variable                | meaning                                        |
//! |-------------------------|------------------------------------------------|
//! | `RAY_DASHD_SOCKET`      | Unix socket path to listen on (required)       |
//! | `RAY_DASHD_MODULE`      | the module's name (required)                   |
//! | `RAY_DASHD_INCARNATION` | 0, then +1 at each restart (required)          |
//! | `RAY_DASHD_SESSION_DIR` | Ray session directory (optional)               |
//! | `RAY_DASHD_LOG_DIR`     | directory for the module's own logs (optional) |
//!
//! It considers the module ready once `GET /api/healthz` answers 200, and
//! stops it with SIGTERM (SIGKILL after a grace period).
//!
//! # Example
//!
//! ```no_run
//! use axum::{routing::get, Router};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), ray_dashd_sdk::SdkError> {
//!     ray_dashd_sdk::init_tracing();
//!     let app = Router::new().route("/api/hello/greet", get(|| async { "hello" }));
//!     ray_dashd_sdk::serve(app).await
//! }
//! ```
//!
//! Use [`ModuleEnv::from_env`] + [`serve_router`] to serve a router that has
//! its own health check, and [`serve_router_until`] to choose when to stop.

use std::ffi::OsString;
use std::future::Future;
use std::io::{self, IsTerminal};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{signal, SignalKind};

// The module contract's names, as the host sets and polls them.
pub use ray_dashd_contract::names::{
    HEALTHZ_PATH, INCARNATION_VAR, LOG_DIR_VAR, MODULE_VAR, SESSION_DIR_VAR, SOCKET_VAR,
};

/// Errors from reading the module environment or serving the socket.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    /// A required environment variable is not set (or is empty).
    #[error("environment variable {var} is not set")]
    MissingVar {
        /// The variable's name.
        var: &'static str,
    },
    /// An environment variable is set but its value cannot be used.
    #[error("environment variable {var} has an invalid value {value:?}: {reason}")]
    InvalidVar {
        /// The variable's name.
        var: &'static str,
        /// The value as found, lossily decoded.
        value: String,
        /// Why the value was rejected.
        reason: String,
    },
    /// Installing the SIGTERM/SIGINT handlers failed.
    #[error("failed to install signal handlers: {0}")]
    Signal(#[source] io::Error),
    /// Something other than a socket exists at the socket path.
    #[error("refusing to replace {}: it exists and is not a socket", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A stale socket file could not be inspected or removed.
    #[error("failed to remove stale socket {}: {source}", path.display())]
    StaleSocket {
        /// The socket path.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// Binding the Unix listener failed.
    #[error("failed to bind {}: {source}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The HTTP server stopped with an I/O error.
    #[error("server on {} failed: {source}", path.display())]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
}

/// What the host tells a module through its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleEnv {
    /// Unix socket path to listen on (`RAY_DASHD_SOCKET`).
    pub socket: PathBuf,
    /// The module's name (`RAY_DASHD_MODULE`).
    pub name: String,
    /// 0 at first start, +1 at each restart (`RAY_DASHD_INCARNATION`).
    pub incarnation: u32,
    /// Ray session directory (`RAY_DASHD_SESSION_DIR`), if set and non-empty.
    pub session_dir: Option<PathBuf>,
    /// Directory for the module's own logs (`RAY_DASHD_LOG_DIR`), if set and non-empty.
    pub log_dir: Option<PathBuf>,
}

impl ModuleEnv {
    /// Reads the module environment from the process environment.
    pub fn from_env() -> Result<Self, SdkError> {
        Self::from_lookup(|var| std::env::var_os(var))
    }

    /// Reads the module environment through `lookup`, which maps a variable
    /// name to its value; tests pass a map instead of touching the process
    /// environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, SdkError> {
        let non_empty = |var: &'static str| lookup(var).filter(|value| !value.is_empty());
        let required = |var: &'static str| non_empty(var).ok_or(SdkError::MissingVar { var });

        let socket = PathBuf::from(required(SOCKET_VAR)?);
        let name = required(MODULE_VAR)?
            .into_string()
            .map_err(|value| SdkError::InvalidVar {
                var: MODULE_VAR,
                value: value.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".to_owned(),
            })?;
        let raw = required(INCARNATION_VAR)?;
        let incarnation = raw
            .to_str()
            .ok_or_else(|| "not valid UTF-8".to_owned())
            .and_then(|s| s.parse::<u32>().map_err(|e| e.to_string()))
            .map_err(|reason| SdkError::InvalidVar {
                var: INCARNATION_VAR,
                value: raw.to_string_lossy().into_owned(),
                reason,
            })?;

        Ok(Self {
            socket,
            name,
            incarnation,
            session_dir: non_empty(SESSION_DIR_VAR).map(PathBuf::from),
            log_dir: non_empty(LOG_DIR_VAR).map(PathBuf::from),
        })
    }
}

/// Installs a tracing subscriber writing to stderr, filtered by `RUST_LOG`
/// (default `info`), with colours only when stderr is a terminal (the host
/// sends it to a log file). Does nothing if a global subscriber is already set.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // An error only means a subscriber is already installed; keep that one.
    let _ = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_env_filter(filter)
        .try_init();
}

/// A module's whole `main`: installs tracing ([`init_tracing`]), runs
/// `serve` to its end on a new tokio runtime, and turns the outcome into
/// the process's exit status, logging a failure as `{module} failed`.
pub fn run_main<E: std::fmt::Display>(
    module: &str,
    serve: impl Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    init_tracing();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{module} failed");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Adds `GET /api/healthz` answering 200 `ok` to `router`.
///
/// # Panics
///
/// Panics (in axum) if `router` already has a `/api/healthz` route.
pub fn with_healthz(router: Router) -> Router {
    router.route(HEALTHZ_PATH, get(|| async { "ok" }))
}

/// Reads the environment, adds `GET /api/healthz` and serves `router` until
/// SIGTERM or SIGINT; the usual entry point of a module.
pub async fn serve(router: Router) -> Result<(), SdkError> {
    let env = ModuleEnv::from_env()?;
    serve_router(&env, with_healthz(router)).await
}

/// Serves `router`, which must answer `GET /api/healthz` itself, on
/// `env.socket` until SIGTERM or SIGINT.
pub async fn serve_router(env: &ModuleEnv, router: Router) -> Result<(), SdkError> {
    let shutdown = shutdown_signal()?;
    serve_router_until(env, router, shutdown).await
}

/// Serves `router` on `env.socket` until `shutdown` resolves, then drains
/// open connections and removes the socket file.
///
/// A stale socket left at the path (by an earlier incarnation) is replaced;
/// any other kind of file there is an error.
pub async fn serve_router_until<F>(
    env: &ModuleEnv,
    router: Router,
    shutdown: F,
) -> Result<(), SdkError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_router_wrapped_until(env, router, std::convert::identity, shutdown).await
}

/// As [`serve_router_until`], with every accepted connection passed through
/// `wrap` before it is served: to count the connections open, say.
pub async fn serve_router_wrapped_until<F, W, Io>(
    env: &ModuleEnv,
    router: Router,
    wrap: W,
    shutdown: F,
) -> Result<(), SdkError>
where
    F: Future<Output = ()> + Send + 'static,
    W: FnMut(UnixStream) -> Io + Send + 'static,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let path = env.socket.as_path();
    let (listener, _cleanup) = bind(env)?;
    axum::serve(Wrapped { listener, wrap }, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| SdkError::Serve {
            path: path.to_owned(),
            source,
        })?;
    tracing::info!(module = %env.name, incarnation = env.incarnation, "module stopped");
    Ok(())
}

/// Binds `env.socket` (replacing a stale socket left there); the socket
/// file goes when the returned guard does.
fn bind(env: &ModuleEnv) -> Result<(UnixListener, SocketFile<'_>), SdkError> {
    let path = env.socket.as_path();
    remove_stale_socket(path)?;
    let listener = UnixListener::bind(path).map_err(|source| SdkError::Bind {
        path: path.to_owned(),
        source,
    })?;
    tracing::info!(
        module = %env.name,
        incarnation = env.incarnation,
        socket = %path.display(),
        "module listening"
    );
    Ok((listener, SocketFile(path)))
}

/// A Unix listener whose accepted connections go through `wrap`.
struct Wrapped<W> {
    listener: UnixListener,
    wrap: W,
}

impl<W, Io> axum::serve::Listener for Wrapped<W>
where
    W: FnMut(UnixStream) -> Io + Send + 'static,
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = Io;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Io, Self::Addr) {
        // axum's own accept, which retries (and logs) failed accepts.
        let (stream, addr) = axum::serve::Listener::accept(&mut self.listener).await;
        ((self.wrap)(stream), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// Installs SIGTERM and SIGINT handlers now and returns a future that
/// resolves when either arrives, logging which.
///
/// Signals that arrive after this call and before the future is polled are
/// not lost. Must be called inside a tokio runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, SdkError> {
    let mut term = signal(SignalKind::terminate()).map_err(SdkError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SdkError::Signal)?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown signal received");
    })
}

/// Removes a socket file left at `path`; a missing file is fine, a
/// non-socket file is an error.
fn remove_stale_socket(path: &Path) -> Result<(), SdkError> {
    let stale = |source| SdkError::StaleSocket {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            tracing::debug!(socket = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(stale)
        }
        Ok(_) => Err(SdkError::NotASocket {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(stale(e)),
    }
}

/// Removes the socket file when dropped, so it goes away on every exit path
/// short of the process being killed.
#[derive(Debug)]
struct SocketFile<'a>(&'a Path);

impl Drop for SocketFile<'_> {
    fn drop(&mut self) {
        match std::fs::remove_file(self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(socket = %self.0.display(), error = %e, "failed to remove socket")
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is the failure message
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    /// How long a test waits for the server task to bind its socket.
    const BIND_TIMEOUT: Duration = Duration::from_secs(5);

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |var| map.get(var).cloned()
    }

    fn module_env(socket: PathBuf) -> ModuleEnv {
        ModuleEnv {
            socket,
            name: "test".to_owned(),
            incarnation: 0,
            session_dir: None,
            log_dir: None,
        }
    }

    /// Sends one HTTP/1.1 GET over the socket, retrying the connect until the
    /// server has bound it, and returns the raw response.
    async fn get(socket: &Path, path: &str) -> String {
        let mut stream = tokio::time::timeout(BIND_TIMEOUT, async {
            loop {
                match UnixStream::connect(socket).await {
                    Ok(stream) => break stream,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        })
        .await
        .expect("server did not bind its socket in time");
        let request = format!("GET {path} HTTP/1.1\r\nhost: module\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    /// from_lookup reads every variable, treating empty optional ones as unset.
    #[test]
    fn reads_all_variables() {
        let env = ModuleEnv::from_lookup(lookup(&[
            (SOCKET_VAR, "/tmp/m.sock"),
            (MODULE_VAR, "jobs"),
            (INCARNATION_VAR, "3"),
            (SESSION_DIR_VAR, "/tmp/session"),
            (LOG_DIR_VAR, ""),
        ]))
        .unwrap();
        assert_eq!(env.socket, PathBuf::from("/tmp/m.sock"));
        assert_eq!(env.name, "jobs");
        assert_eq!(env.incarnation, 3);
        assert_eq!(env.session_dir, Some(PathBuf::from("/tmp/session")));
        assert_eq!(env.log_dir, None);
    }

    /// A missing required variable is reported by name.
    #[test]
    fn missing_variable_error_names_it() {
        let err = ModuleEnv::from_lookup(lookup(&[(SOCKET_VAR, "/tmp/m.sock")])).unwrap_err();
        assert!(matches!(err, SdkError::MissingVar { var: MODULE_VAR }));
        assert!(err.to_string().contains("RAY_DASHD_MODULE"), "{err}");
    }

    /// A non-numeric incarnation is reported with the variable and value.
    #[test]
    fn bad_incarnation_error_names_variable_and_value() {
        let err = ModuleEnv::from_lookup(lookup(&[
            (SOCKET_VAR, "/tmp/m.sock"),
            (MODULE_VAR, "jobs"),
            (INCARNATION_VAR, "-1"),
        ]))
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("RAY_DASHD_INCARNATION") && msg.contains("\"-1\""),
            "{msg}"
        );
    }

    /// The served router answers /api/healthz, replaces a stale socket, and
    /// removes its socket file after shutdown.
    #[tokio::test]
    async fn serves_healthz_and_cleans_up_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("m.sock");
        // A stale socket from an earlier incarnation must not block the bind.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(socket.exists());

        let env = module_env(socket.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            serve_router_until(&env, with_healthz(Router::new()), shutdown).await
        });

        let response = get(&socket, HEALTHZ_PATH).await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok"), "{response}");

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(!socket.exists(), "socket file left behind");
    }

    /// A regular file at the socket path is left alone and reported.
    #[tokio::test]
    async fn refuses_to_replace_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        std::fs::write(&path, b"keep me").unwrap();

        let env = module_env(path.clone());
        let err = serve_router_until(&env, Router::new(), std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(err, SdkError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    }
}
