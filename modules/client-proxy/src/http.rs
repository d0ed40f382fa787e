//! The module's HTTP side, on its Unix socket: the health check the host
//! polls, and `GET /api/client_proxy/clients`.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ray_dashd_contract::LockExt;
use serde_json::json;

use crate::proxy::Proxy;

/// Whether the gRPC port is bound, and if not why.
#[derive(Debug, Clone)]
pub enum Listening {
    /// Not yet tried.
    Starting,
    /// Bound at this address.
    On(std::net::SocketAddr),
    /// Bind failed and is tried again after `retry_after`; the words say
    /// why and the ways out.
    Waiting {
        /// Why the port is not bound, in one line.
        why: String,
        /// The pause before the next attempt.
        retry_after: std::time::Duration,
    },
    /// Serving stopped for good; the words say why.
    Failed(String),
}

/// What the HTTP handlers read.
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The proxy.
    pub proxy: Arc<Proxy>,
    /// The gRPC listener's state.
    pub listening: Arc<Mutex<Listening>>,
}

/// The module's routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/api/healthz", get(healthz))
        .route("/api/client_proxy/clients", get(clients))
        .with_state(state)
}

/// 200 once the client port is bound; 503 naming the problem otherwise, so
/// that the host shows it in the module's state. While the port is held by
/// another process, the 503 carries `Retry-After` (the pause before the
/// next try): the module is waiting for something a restart cannot change,
/// so the host keeps it (`waiting`) instead of restarting it.
async fn healthz(State(state): State<HttpState>) -> Response {
    let listening = state.listening.locked().clone();
    match listening {
        Listening::On(_) => "success".into_response(),
        Listening::Starting => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Ray client port is not bound yet",
        )
            .into_response(),
        Listening::Waiting { why, retry_after } => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(
                header::RETRY_AFTER,
                retry_after.as_secs().max(1).to_string(),
            )],
            why,
        )
            .into_response(),
        Listening::Failed(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn clients(State(state): State<HttpState>) -> Json<serde_json::Value> {
    let listening = state.listening.locked().clone();
    let (listen, error) = match listening {
        Listening::On(addr) => (Some(addr.to_string()), None),
        Listening::Starting => (None, None),
        Listening::Waiting { why, .. } | Listening::Failed(why) => (None, Some(why)),
    };
    let proxy = &state.proxy;
    Json(json!({
        "listen": listen,
        "error": error,
        "gcs_address": proxy.gcs.as_ref().map(|g| g.address().to_owned()),
        "num_clients": proxy.num_clients(),
        "ports_in_use": proxy.launcher.ports().in_use(),
        "server_ports": proxy.launcher.ports().source(),
        "warm_spare": proxy.settings.warm_spare,
        "spare_ready": proxy.spare_ready(),
        "spare_pid": proxy.spare_pid(),
        "clients": proxy.views(),
    }))
}
