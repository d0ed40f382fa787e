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
    pool.prune_idle();
    let started = Instant::now();
    let request = http::Request::get("/api/healthz")
        .header(http::header::HOST, "localhost")
        .header(http::header::USER_AGENT, "ray-dashd-health")
        .body(Body::empty())
        .expect("UNWRAP: static request is valid");
    let probe = async {
        let response = pool
            .probe(request)
            .await
            .map_err(|e| format!("healthz request failed: {}", error_chain(&e)))?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_HEALTHZ_BODY);
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status == http::StatusCode::OK {
            Ok(started.elapsed())
        } else {
            Err(unhealthy(status, &body))
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(result) => result,
        Err(_) => Err(format!("healthz did not answer within {timeout:?}")),
    }
}

/// The failure of a non-200 answer, with the start of the module's own
/// words when it gave a text body (so its state says why).
fn unhealthy(status: http::StatusCode, body: &[u8]) -> String {
    const SHOWN: usize = 300;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() || text.starts_with('<') {
        return format!("healthz answered {status}");
    }
    let cut: String = text.chars().take(SHOWN).collect();
    let more = if cut.len() < text.len() { "…" } else { "" };
    format!("healthz answered {status}: {cut}{more}")
}

#[cfg(test)]
mod tests {
    use super::unhealthy;

    #[test]
    fn unhealthy_names_the_modules_reason() {
        let status = http::StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            unhealthy(status, b""),
            "healthz answered 503 Service Unavailable"
        );
        assert_eq!(
            unhealthy(status, b" port taken \n"),
            "healthz answered 503 Service Unavailable: port taken"
        );
        assert_eq!(
            unhealthy(status, b"<html>"),
            "healthz answered 503 Service Unavailable"
        );
        assert!(unhealthy(status, &[b'x'; 1000]).ends_with("x…"));
    }
}
