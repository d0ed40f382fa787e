//! The health probe: `GET /api/healthz` on a module's socket, bounded in time.

use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;

use crate::connection::ModulePool;
use crate::error::error_chain;

/// Largest healthz body read (and thrown away) so the connection is reused.
const MAX_HEALTHZ_BODY: usize = 64 * 1024;

/// Why a health check failed.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// What went wrong, in words for `last_error`: the module's own words
    /// when it answered.
    pub(crate) reason: String,
    /// The module's own words (its answer's text), when it gave some.
    pub(crate) words: Option<String>,
    /// Whether the module answered (with a status other than 200).
    pub(crate) answered: bool,
    /// Whether the check ran out of time (the request was taken, no answer
    /// came): the one failure a busy module gives. A refused or failed
    /// connection is not that.
    pub(crate) timed_out: bool,
    /// When it answered 503 with `Retry-After`: it is alive and waiting for
    /// something outside itself (a port another process holds), and tries
    /// again after this long.
    pub(crate) waiting: Option<Duration>,
}

impl Failure {
    fn silent(reason: String) -> Failure {
        Failure {
            reason,
            words: None,
            answered: false,
            timed_out: false,
            waiting: None,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Asks the module behind `pool` for `/api/healthz`. `Ok` carries the round
/// trip; `Err` says what failed.
pub(crate) async fn check_health(
    pool: &ModulePool,
    timeout: Duration,
) -> Result<Duration, Failure> {
    pool.prune_idle();
    let started = Instant::now();
    let request = http::Request::get(ray_dashd_contract::names::HEALTHZ_PATH)
        .header(http::header::HOST, "localhost")
        .header(http::header::USER_AGENT, "ray-dashd-health")
        .body(Body::empty())
        .expect("UNWRAP: static request is valid");
    let probe = async {
        let response = pool
            .probe(request)
            .await
            .map_err(|e| Failure::silent(format!("healthz request failed: {}", error_chain(&e))))?;
        let status = response.status();
        let waiting = (status == http::StatusCode::SERVICE_UNAVAILABLE)
            .then(|| retry_after(response.headers()))
            .flatten();
        let body = http_body_util::Limited::new(response.into_body(), MAX_HEALTHZ_BODY);
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status == http::StatusCode::OK {
            Ok(started.elapsed())
        } else {
            let words = words(&body);
            Err(Failure {
                reason: unhealthy(status, words.as_deref()),
                words,
                answered: true,
                timed_out: false,
                waiting,
            })
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(result) => result,
        Err(_) => Err(Failure {
            timed_out: true,
            ..Failure::silent(format!("healthz did not answer within {timeout:?}"))
        }),
    }
}

/// The delay a `Retry-After` header asks for, when it has one: whole
/// seconds (RFC 9110 §10.2.3); a date, which no module has reason to send,
/// counts as one second.
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?;
    let secs = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Some(Duration::from_secs(secs))
}

/// The start of the module's own words, when its answer's body is text
/// (not empty, not an HTML page).
fn words(body: &[u8]) -> Option<String> {
    // Enough for a reason that names a process and the ways out.
    const SHOWN: usize = 1000;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() || text.starts_with('<') {
        return None;
    }
    let cut: String = text.chars().take(SHOWN).collect();
    let more = if cut.len() < text.len() { "…" } else { "" };
    Some(format!("{cut}{more}"))
}

/// The failure of a non-200 answer, with the module's own words when it
/// gave some (so its state says why).
fn unhealthy(status: http::StatusCode, words: Option<&str>) -> String {
    match words {
        Some(words) => format!("healthz answered {status}: {words}"),
        None => format!("healthz answered {status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{unhealthy, words};

    #[test]
    fn unhealthy_names_the_modules_reason() {
        let status = http::StatusCode::SERVICE_UNAVAILABLE;
        let said = |body: &[u8]| unhealthy(status, words(body).as_deref());
        assert_eq!(said(b""), "healthz answered 503 Service Unavailable");
        assert_eq!(
            said(b" port taken \n"),
            "healthz answered 503 Service Unavailable: port taken"
        );
        assert_eq!(said(b"<html>"), "healthz answered 503 Service Unavailable");
        assert!(said(&[b'x'; 2000]).ends_with("x…"));
        assert!(!said(&[b'x'; 1000]).ends_with("x…"));
    }
}
