//! The host's own API under `/api/` (health, the modules' reports, a
//! module's restart, the host's status): one handler per [`ApiRoute`]. Its
//! refusals are [`ApiError`]s, answered in one place.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::Json;
use tracing::info;

use super::tls::ServerTls;
use super::AppState;
use crate::error::ApiError;
use crate::reload::Reloader;
use crate::routes::host::ApiRoute;

/// The handler of a route of the host's API.
pub(super) fn handler(route: ApiRoute) -> MethodRouter<AppState> {
    match route {
        ApiRoute::Healthz => get(healthz),
        ApiRoute::Modules => get(list_modules),
        ApiRoute::Module => get(show_module),
        ApiRoute::RestartModule => post(restart_module),
        ApiRoute::Status => get(status),
        ApiRoute::Reload => post(reload),
        ApiRoute::Metrics => get(metrics),
    }
}

/// How long a scrape waits for the host's `/proc` readings.
const PROCESS_READINGS_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The host's metrics (see [`crate::metrics`]), read now.
async fn metrics(State(state): State<AppState>, headers: http::HeaderMap) -> impl IntoResponse {
    // A scrape is answered without the host's own readings rather than
    // late (Prometheus gives up after 10 s by default).
    let process = tokio::time::timeout(
        PROCESS_READINGS_WITHIN,
        tokio::task::spawn_blocking(crate::metrics::ProcessReadings::read),
    )
    .await
    .ok()
    .and_then(Result::ok)
    .unwrap_or_default();
    let modules = state.supervisor.modules();
    let reports: Vec<_> = modules
        .iter()
        .map(|m| (m.report(), m.in_flight()))
        .collect();
    let scrape = crate::metrics::Scrape {
        modules: reports
            .iter()
            .map(|(report, in_flight)| crate::metrics::ModuleSample {
                name: &report.name,
                state: report.state.as_str(),
                // A dormant module serves too: its first request starts it.
                up: matches!(
                    report.state,
                    crate::supervisor::ModuleState::Healthy
                        | crate::supervisor::ModuleState::Dormant
                ),
                restarts: report.restarts,
                health_rtt: report.last_health_rtt_us.map(Duration::from_micros),
                in_flight: *in_flight,
            })
            .collect(),
        dropped_log_lines: crate::logging::dropped_lines(),
        process,
    };
    let openmetrics = state.supervisor.metrics().encode(&scrape);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    // The text format 0.0.4 unless OpenMetrics is asked for, as
    // Prometheus's own client libraries answer.
    let (content_type, body) = if crate::metrics::wants_openmetrics(accept) {
        (crate::metrics::OPENMETRICS, openmetrics)
    } else {
        (
            crate::metrics::TEXT_004,
            crate::metrics::to_text_004(&openmetrics),
        )
    };
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_TYPE, content_type),
        ],
        body,
    )
}

/// `POST /api/reload`: [`reload_all`]'s report, or 400 naming what is
/// wrong (nothing changed then).
async fn reload(State(state): State<AppState>) -> Result<Response, ApiError> {
    // A page of another origin was refused by the guard before this ran.
    let report = reload_all(state.reloader.as_deref(), state.tls.as_ref()).await?;
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(report)).into_response())
}

/// Reads the dashboard port's certificate and the config again and applies
/// them (see [`crate::reload`]), all or nothing: the certificate is read
/// first and served only once the config has been applied. What SIGHUP and
/// `POST /api/reload` both do. The report says what changed.
pub(crate) async fn reload_all(
    reloader: Option<&Reloader>,
    tls: Option<&Arc<ServerTls>>,
) -> Result<serde_json::Value, ApiError> {
    if reloader.is_none() && tls.is_none() {
        return Err(ApiError::NoReload);
    }
    let certificate = match tls {
        Some(tls) => {
            // Two small files, read off the runtime's threads.
            let tls = Arc::clone(tls);
            let read = tokio::task::spawn_blocking(move || tls.read_again().map(|c| (tls, c)))
                .await
                .map_err(|error| ApiError::BadCertificate {
                    message: format!("the certificate could not be read: {error}"),
                })?
                .map_err(|error| ApiError::BadCertificate {
                    message: error.to_string(),
                })?;
            Some(read)
        }
        None => None,
    };
    let mut report = match reloader {
        Some(reloader) => {
            let applied = reloader
                .reload()
                .await
                .map_err(|error| ApiError::BadConfig {
                    message: error.to_string(),
                })?;
            serde_json::to_value(applied).unwrap_or_default()
        }
        None => serde_json::json!({}),
    };
    if let Some((tls, read)) = certificate {
        tls.serve(read);
        report["tls_certificate"] = "reloaded".into();
    }
    Ok(report)
}

async fn healthz() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], "success")
}

/// `{"ray": …}`: whether Ray's modules are hosted, and if not why.
async fn status(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(serde_json::json!({ "ray": &*state.ray_status })),
    )
}

async fn list_modules(State(state): State<AppState>) -> impl IntoResponse {
    let reports: Vec<_> = state
        .supervisor
        .modules()
        .iter()
        .map(|m| m.report())
        .collect();
    ([(header::CACHE_CONTROL, "no-store")], Json(reports))
}

async fn show_module(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let module = state
        .supervisor
        .get(&name)
        .ok_or(ApiError::UnknownModule { name })?;
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(module.report())).into_response())
}

async fn restart_module(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    // A page of another origin was refused by the guard before this ran.
    let Some(module) = state.supervisor.get(&name) else {
        return Err(ApiError::UnknownModule { name });
    };
    if !module.restart() {
        return Err(ApiError::RestartPending { module: name });
    }
    info!(module = %name, "restart requested through the API");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "module": name, "restarting": true })),
    )
        .into_response())
}
