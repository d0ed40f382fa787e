//! `ray-dashd-logs`: reads the module environment, serves the log folder's
//! routes plus `/api/healthz` on the host's socket, and stops on SIGTERM.

use std::process::ExitCode;

use ray_dashd_logs::{LogDir, StartupError};
use ray_dashd_sdk::ModuleEnv;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    ray_dashd_sdk::init_tracing();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "logs module failed");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), StartupError> {
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
    let app = ray_dashd_sdk::with_healthz(ray_dashd_logs::router(dir, token));
    ray_dashd_sdk::serve_router_until(&env, app, shutdown).await?;
    Ok(())
}
