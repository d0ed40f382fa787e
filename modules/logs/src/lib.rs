//! `ray-dashd-logs`: a ray-dashd module serving the files of the Ray
//! session's log folder: a listing, last lines, byte ranges, and a live
//! tail as a stream or a websocket. The HTTP contract is in `README.md`.
//! [`main`] runs it: `ray-dashd module logs` (the default config) and the
//! `ray-dashd-logs` binary both call it.
//!
//! # Layout
//!
//! - `files.rs`: the log folder: checking names, opening files, listing
//! - `beneath.rs`: the safety boundary: reaching names beneath the folder's
//!   open descriptor without following any symlink (`openat2`, or a walk)
//! - `tail.rs`: reading backwards in blocks from the end
//! - `follow.rs`: the follower behind both live routes (truncation, rotation)
//! - `routes.rs`: the http and stream routes: queries, headers, bodies
//! - `ws.rs`: the websocket route
//! - `headers.rs`: the names of the headers that say where a file stood
//! - `error.rs`: errors, and their one mapping to HTTP answers

mod beneath;
mod error;
mod files;
#[cfg(test)]
mod fixture;
mod follow;
mod headers;
mod routes;
mod tail;
mod ws;

use std::process::ExitCode;

use axum::routing::get;
use axum::Router;
use ray_dashd_sdk::ModuleEnv;
use tokio_util::sync::CancellationToken;

pub use error::{LogsError, StartupError};
pub use files::LogDir;

/// Prefix of every route; it collides with none of Ray's dashboard routes.
pub const PREFIX: &str = "/api/dashd/logs";

/// What every handler shares.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    /// The log folder.
    pub(crate) dir: LogDir,
    /// Cancelled on SIGTERM: live tails end so the server can drain.
    pub(crate) shutdown: CancellationToken,
}

/// The module's routes (without `/api/healthz`), serving files of `dir`;
/// live tails end when `shutdown` is cancelled.
pub fn router(dir: LogDir, shutdown: CancellationToken) -> Router {
    Router::new()
        .route(&format!("{PREFIX}/files"), get(routes::files))
        .route(&format!("{PREFIX}/file"), get(routes::file))
        .route(&format!("{PREFIX}/follow"), get(routes::follow))
        .route(&format!("{PREFIX}/ws"), get(ws::websocket))
        .with_state(AppState { dir, shutdown })
}

/// Runs the module until SIGTERM or SIGINT: reads the module environment,
/// serves the log folder's routes plus `/api/healthz` on the host's socket.
pub fn main() -> ExitCode {
    ray_dashd_sdk::run_main("logs module", serve())
}

async fn serve() -> Result<(), StartupError> {
    let env = ModuleEnv::from_env()?;
    let path = env
        .log_dir
        .clone()
        .or_else(|| env.session_dir.as_ref().map(|dir| dir.join("logs")))
        .ok_or(StartupError::NoLogDir)?;
    let dir = LogDir::new(&path)?;
    tracing::info!(log_dir = %dir.root().display(), "serving log folder");

    // Live tails never end on their own; cancel them on SIGTERM so the
    // server's graceful shutdown can finish.
    let signal = ray_dashd_sdk::shutdown_signal()?;
    let token = CancellationToken::new();
    let shutdown = {
        let token = token.clone();
        async move {
            signal.await;
            token.cancel();
        }
    };
    let app = ray_dashd_sdk::with_healthz(router(dir, token));
    ray_dashd_sdk::serve_router_until(&env, app, shutdown).await?;
    Ok(())
}
