//! Fixture module for ray-dashd's integration tests: serves `/test/*` routes
//! that echo, stream, crash, hang and misbehave on purpose, and reads its
//! start-up misbehaviour from `TEST_MODULE_*` variables.
//!
//! It runs on a current-thread runtime so that `POST /test/hang` blocks
//! everything, health checks included.

mod connections;
mod http;
mod state;
mod ws;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::middleware;
use axum::routing::{any, get, post};
use axum::Router;
use ray_dashd_sdk::{ModuleEnv, SdkError};
use tokio::signal::unix::{signal, SignalKind};

use crate::state::{AppState, HealthMode, NotReady, Shared};

/// Exit code for a bad environment (EX_USAGE).
const EXIT_USAGE: u8 = 64;

/// Start-up misbehaviour chosen by the `TEST_MODULE_*` variables.
#[derive(Debug, Default)]
struct Behaviour {
    /// `TEST_MODULE_STARTUP_DELAY_MS`: wait this long before binding.
    startup_delay: Duration,
    /// `TEST_MODULE_EXIT_ON_START`: exit at once with this code.
    exit_on_start: Option<i32>,
    /// `TEST_MODULE_NEVER_READY=1`: healthz answers 503.
    never_ready: bool,
    /// `TEST_MODULE_NOT_READY_REASON`: healthz answers 503 with
    /// `not ready: <this>` (implies never ready).
    not_ready_reason: Option<String>,
    /// `TEST_MODULE_NOT_READY_DELAY_MS`: the not-ready answer takes this long.
    not_ready_delay: Duration,
    /// `TEST_MODULE_IGNORE_SIGTERM=1`: only SIGKILL (or SIGINT) stops it.
    ignore_sigterm: bool,
    /// `TEST_MODULE_SPAWN`: a shell command started (`sh -c`) as the
    /// module's child at start and left running: descendants that setsid(),
    /// ignore SIGTERM or double-fork away.
    spawn: Option<String>,
}

/// Why the module cannot start: its environment is not what it needs.
#[derive(Debug, thiserror::Error)]
enum StartError {
    /// The host's variables (see `ray_dashd_sdk`).
    #[error(transparent)]
    Env(#[from] SdkError),
    /// A `TEST_MODULE_*` variable that should be a number is not.
    #[error("{name} is not a number: {value:?}")]
    NotANumber {
        /// The variable.
        name: String,
        /// What it holds.
        value: String,
    },
}

impl Behaviour {
    fn from_env() -> Result<Self, StartError> {
        fn var(name: &str) -> Option<String> {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        }
        fn number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, StartError> {
            var(name)
                .map(|value| {
                    value.parse().map_err(|_| StartError::NotANumber {
                        name: name.to_owned(),
                        value,
                    })
                })
                .transpose()
        }
        let flag = |name: &str| var(name).is_some_and(|v| v == "1" || v == "true");
        Ok(Self {
            startup_delay: Duration::from_millis(
                number("TEST_MODULE_STARTUP_DELAY_MS")?.unwrap_or(0),
            ),
            exit_on_start: number("TEST_MODULE_EXIT_ON_START")?,
            never_ready: flag("TEST_MODULE_NEVER_READY")
                || var("TEST_MODULE_NOT_READY_REASON").is_some(),
            not_ready_reason: var("TEST_MODULE_NOT_READY_REASON"),
            not_ready_delay: Duration::from_millis(
                number("TEST_MODULE_NOT_READY_DELAY_MS")?.unwrap_or(0),
            ),
            ignore_sigterm: flag("TEST_MODULE_IGNORE_SIGTERM"),
            spawn: var("TEST_MODULE_SPAWN"),
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    ray_dashd_sdk::init_tracing();
    let (env, behaviour) = match ModuleEnv::from_env()
        .map_err(StartError::from)
        .and_then(|env| Ok((env, Behaviour::from_env()?)))
    {
        Ok(config) => config,
        Err(e) => {
            eprintln!("test-module: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    println!(
        "test-module ready pid={} incarnation={}",
        std::process::id(),
        env.incarnation
    );
    eprintln!("test-module stderr line incarnation={}", env.incarnation);
    if let Some(code) = behaviour.exit_on_start {
        tracing::warn!(code, "exiting on start");
        std::process::exit(code);
    }
    // Held, never waited for: it lives as long as it likes.
    let _spawned = match &behaviour.spawn {
        Some(command) => match std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => Some(child),
            Err(e) => {
                eprintln!("test-module: cannot run TEST_MODULE_SPAWN: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };

    match run(env, behaviour).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "test-module failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(env: ModuleEnv, behaviour: Behaviour) -> Result<(), SdkError> {
    let mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>> = if behaviour.ignore_sigterm {
        Box::pin(ignore_sigterm()?)
    } else {
        Box::pin(ray_dashd_sdk::shutdown_signal()?)
    };
    if !behaviour.startup_delay.is_zero() {
        tracing::info!(delay = ?behaviour.startup_delay, "delaying start-up");
        tokio::select! {
            () = tokio::time::sleep(behaviour.startup_delay) => {}
            () = &mut shutdown => return Ok(()),
        }
    }
    let health = if behaviour.never_ready {
        HealthMode::NeverReady
    } else {
        HealthMode::Ok
    };
    let state = Arc::new(Shared::new(
        env.name.clone(),
        env.incarnation,
        env.socket.clone(),
        health,
        NotReady {
            body: behaviour
                .not_ready_reason
                .map_or_else(|| "not ready".to_owned(), |why| format!("not ready: {why}")),
            delay: behaviour.not_ready_delay,
        },
    ));
    let counted = Arc::clone(&state);
    let count = move |stream| connections::Counted::new(stream, Arc::clone(&counted));
    ray_dashd_sdk::serve_router_wrapped_until(&env, router(state), count, shutdown).await
}

/// Swallows every SIGTERM from now on (replacing its default action) and
/// returns a future resolving on SIGINT only.
fn ignore_sigterm() -> Result<impl Future<Output = ()> + Send + 'static, SdkError> {
    let mut term = signal(SignalKind::terminate()).map_err(SdkError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SdkError::Signal)?;
    tokio::spawn(async move {
        while term.recv().await.is_some() {
            tracing::warn!("ignoring sigterm");
        }
    });
    Ok(async move {
        int.recv().await;
        tracing::info!(signal = "SIGINT", "shutdown signal received");
    })
}

/// All routes (`/test/echo/` too, since `{*rest}` does not match an empty
/// rest); those under `/test/` except stats and health switching count
/// towards `requests_in_flight`.
fn router(state: AppState) -> Router {
    let tracked = Router::new()
        .route("/test/echo", any(http::echo))
        .route("/test/echo/", any(http::echo))
        .route("/test/echo/{*rest}", any(http::echo))
        .route("/test/body", post(http::body))
        .route("/test/early", post(http::early))
        .route("/test/stream", get(http::stream))
        .route("/test/ws/echo", get(ws::echo))
        .route("/test/ws/out", get(ws::out))
        .route("/test/ws/not", get(ws::not_websocket))
        .route("/test/crash", post(http::crash))
        .route("/test/hang", post(http::hang))
        .route("/test/spin", post(http::spin))
        .route("/test/count", get(http::count))
        .route("/test/grow", post(http::grow))
        .route("/test/print", post(http::print))
        .route("/test/slow", get(http::slow))
        .route("/test/status/{code}", get(http::status))
        .route("/test/cookies", get(http::cookies))
        .route("/test/hop", get(http::hop))
        .route("/test/info", get(http::info))
        .route("/test/decline", get(http::decline))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            state::track_in_flight,
        ));
    Router::new()
        .route(ray_dashd_sdk::HEALTHZ_PATH, get(http::healthz))
        .route("/test/health/{mode}", post(http::set_health))
        .route("/test/stats", get(http::stats))
        .merge(tracked)
        .with_state(state)
}
