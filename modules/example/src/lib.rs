//! Showcase module built on `ray-dashd-sdk`: a JSON greeting, a slow text
//! stream and a websocket echo, served on the socket the host names. Run as
//! `ray-dashd module example` (the default config) or `ray-dashd-example`.

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::get;
use axum::{body::Body, Json, Router};
use bytes::Bytes;
use futures_util::StreamExt;
use ray_dashd_sdk::ModuleEnv;
use serde::Deserialize;
use serde_json::{json, Value};

/// Most ticks one `/api/example/ticks` request may ask for.
const MAX_TICKS: u64 = 60;

/// Gap between two ticks.
const TICK_INTERVAL: Duration = Duration::from_secs(1);

/// Runs the module until SIGTERM or SIGINT: the entry point of both
/// `ray-dashd module example` and `ray-dashd-example`.
pub fn main() -> ExitCode {
    ray_dashd_sdk::run_main("example module", serve())
}

/// Serves the routes on the socket the host names.
async fn serve() -> Result<(), ray_dashd_sdk::SdkError> {
    let env = ModuleEnv::from_env()?;
    let app = Router::new()
        .route("/api/example/hello", get(hello))
        .route("/api/example/ticks", get(ticks))
        .route("/api/example/echo", get(echo))
        .with_state(env.clone());
    ray_dashd_sdk::serve_router(&env, ray_dashd_sdk::with_healthz(app)).await
}

/// `GET /api/example/hello`: who answered.
async fn hello(State(env): State<ModuleEnv>) -> Json<Value> {
    Json(json!({
        "message": "hello from ray-dashd-example",
        "module": env.name,
        "incarnation": env.incarnation,
        "pid": std::process::id(),
    }))
}

/// Query of `/api/example/ticks`.
#[derive(Debug, Deserialize)]
struct TicksQuery {
    /// Number of lines (default 5, at most [`MAX_TICKS`]).
    n: Option<u64>,
}

/// `GET /api/example/ticks?n=N`: `tick <i>` lines, one per second.
async fn ticks(Query(query): Query<TicksQuery>) -> Body {
    let n = query.n.unwrap_or(5).min(MAX_TICKS);
    let lines = futures_util::stream::iter(0..n).then(|i| async move {
        if i > 0 {
            tokio::time::sleep(TICK_INTERVAL).await;
        }
        Ok::<_, Infallible>(Bytes::from(format!("tick {i}\n")))
    });
    Body::from_stream(lines)
}

/// `GET /api/example/echo`: websocket echoing every message back.
async fn echo(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket: WebSocket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            // Pings and Closes are answered by the websocket layer itself.
            let echoed = matches!(message, Message::Text(_) | Message::Binary(_));
            if echoed && socket.send(message).await.is_err() {
                break;
            }
        }
    })
}
