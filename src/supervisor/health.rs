//! The health probe: `GET /api/healthz` on a module's socket, bounded in time.

use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;

use crate::proxy::{error_chain, ModulePool};

/// Largest healthz body read (and thrown away) so the connection is reused.
const MAX_HEALTHZ_BODY: usize = 64 * 1024;

/// Asks the module behind `pool` for `/api/healthz`. `Ok` carries the round
/// trip; `Err` says what failed, in words for `last_error`.
pub(crate) async fn check_health(pool: &ModulePool, timeout: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let request = http::Request::get("/api/healthz")
        .header(http::header::HOST, "localhost")
        .header(http::header::USER_AGENT, "ray-dashd-health")
        .body(Body::empty())
        .expect("UNWRAP: static request is valid");
    let probe = async {
        let response = pool
            .send(request)
            .await
            .map_err(|e| format!("healthz request failed: {}", error_chain(&e)))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_HEALTHZ_BODY);
        let _ = body.collect().await;
        if status == http::StatusCode::OK {
            Ok(started.elapsed())
        } else {
            Err(format!("healthz answered {status}"))
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(result) => result,
        Err(_) => Err(format!("healthz did not answer within {timeout:?}")),
    }
}
