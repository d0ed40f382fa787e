//! What the accept loop decides on its own: how long to pause after a
//! failed accept, and which connections are served under the client cap.
//!
//! A connection over `server.max_connections` is still accepted. Left in
//! the kernel's backlog instead, it would wait there, health check or not,
//! until its client gave up, and the backlog would hand the server stale
//! connections first once slots free up. Accepted, up to
//! [`OVERFLOW_CONNECTIONS`] more are served one request each, within
//! [`OVERFLOW_DEADLINE`]: `/api/healthz` as usual, anything else 503 with
//! `Retry-After`. Beyond those it is closed at once. So idle clients
//! cannot take the descriptors that module connections and health checks
//! need, nor keep a health check from being answered.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper::body::Incoming;
use nix::errno::Errno;
use ray_dashd_contract::Backoff;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::{debug, warn};

pub(crate) use crate::descriptors::OVERFLOW_CONNECTIONS;

use super::Dispatch;

/// The pauses after accepts failed for want of descriptors or memory:
/// 10 ms first, short because a descriptor frees up as soon as any
/// connection closes; doubling up to a second, so that a connection waiting
/// in the backlog is taken within a second of room appearing.
const ACCEPT_PAUSES: Backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
/// At most one warning per this, for failed accepts and for refused
/// connections each; the rest are counted into the next warning. (At the
/// old fixed pause of 50 ms, an exhausted descriptor table logged 20 lines
/// a second.)
const WARN_EVERY: Duration = Duration::from_secs(1);
/// How long a connection over the cap may take, from accept to the end of
/// its one answer; idle ones give their place back within this.
pub(crate) const OVERFLOW_DEADLINE: Duration = Duration::from_secs(2);
/// The one path answered on a connection over the cap.
const HEALTH_PATH: &str = "/api/healthz";

/// Pacing of accepts that fail.
#[derive(Debug)]
pub(crate) struct AcceptBackoff {
    /// The pauses after failures of the exhausting kind.
    pauses: Backoff,
    /// Warnings, at most one per [`WARN_EVERY`].
    warnings: Throttle,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pauses: ACCEPT_PAUSES,
            warnings: Throttle::default(),
        }
    }
}

impl AcceptBackoff {
    /// An accept succeeded: the next failure pauses briefly again.
    pub(crate) fn succeeded(&mut self) {
        self.pauses.reset();
    }

    /// An accept failed with `error`; returns how long to wait before the
    /// next one. A failure that belongs to one connection (aborted before it
    /// was taken, refused by a firewall rule) is retried at once; any other
    /// (no descriptors, no memory) would fail again at once, with the
    /// pending connection still in the backlog, so it pauses.
    pub(crate) fn failed(&mut self, error: &io::Error) -> Duration {
        let errno = error.raw_os_error().map(Errno::from_raw);
        if matches!(
            errno,
            Some(
                Errno::ECONNABORTED
                    | Errno::ECONNRESET
                    | Errno::EPROTO
                    | Errno::EPERM
                    | Errno::EINTR
                    | Errno::EAGAIN
            )
        ) {
            debug!(%error, "accept failed for one connection");
            return Duration::ZERO;
        }
        let pause = self.pauses.next_delay();
        if let Some(failures) = self.warnings.tick() {
            warn!(
                %error,
                failures,
                pause_ms = pause.as_millis() as u64,
                "accept failed; pausing accepts"
            );
        }
        pause
    }
}

/// Counts events and lets one through per [`WARN_EVERY`].
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    /// Events since the last one let through, this one included.
    count: u64,
}

impl Throttle {
    /// Counts an event; `Some(count)` when it is time to report, with the
    /// events since the last report.
    fn tick(&mut self) -> Option<u64> {
        self.count += 1;
        let now = Instant::now();
        if self.last.is_some_and(|last| now - last < WARN_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

/// Where an accepted connection goes.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Served as usual; the permit is its slot under the cap.
    Client(OwnedSemaphorePermit),
    /// Over the cap: one request, `/api/healthz` only.
    Overflow(OwnedSemaphorePermit),
    /// Over the cap and the overflow: closed at once.
    Refused,
}

/// The client cap and the overflow beyond it.
#[derive(Debug)]
pub(crate) struct Admission {
    max: usize,
    clients: Arc<Semaphore>,
    overflow: Arc<Semaphore>,
    warnings: Throttle,
}

impl Admission {
    /// At most `max` client connections, and [`OVERFLOW_CONNECTIONS`] more
    /// for health checks.
    pub(crate) fn new(max: usize) -> Admission {
        Admission {
            max,
            clients: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            overflow: Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS)),
            warnings: Throttle::default(),
        }
    }

    /// Reads how many client connections are served now (those over the
    /// cap not counted).
    pub(crate) fn clients_served(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let clients = Arc::clone(&self.clients);
        let max = self.max.min(Semaphore::MAX_PERMITS);
        move || max - clients.available_permits()
    }

    /// Decides where a connection just accepted goes.
    pub(crate) fn admit(&mut self) -> Admitted {
        if let Ok(permit) = Arc::clone(&self.clients).try_acquire_owned() {
            return Admitted::Client(permit);
        }
        let admitted = match Arc::clone(&self.overflow).try_acquire_owned() {
            Ok(permit) => Admitted::Overflow(permit),
            Err(_) => Admitted::Refused,
        };
        if let Some(over) = self.warnings.tick() {
            warn!(
                max_connections = self.max,
                over,
                "client connection limit reached; new connections get /api/healthz only, or are closed"
            );
        }
        admitted
    }
}

/// The service of a connection over the cap: `/api/healthz` through the
/// usual dispatch (the guard included), 503 for everything else.
#[derive(Debug, Clone)]
pub(crate) struct Overflow {
    pub(crate) dispatch: Dispatch,
    pub(crate) max: usize,
}

impl hyper::service::Service<Request<Incoming>> for Overflow {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if self.dispatch.route_path(request.uri().path()) == Some(HEALTH_PATH) {
            return self.dispatch.call(request);
        }
        let body = serde_json::json!({
            "error": "Service Unavailable",
            "message": format!(
                "too many connections (server.max_connections = {}); try again",
                self.max
            ),
        });
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        Box::pin(async move { Ok(response) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(Errno::EMFILE as i32)
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_accepts_pause_doubling_to_a_second() {
        let mut backoff = AcceptBackoff::default();
        let pauses: Vec<u64> = (0..9)
            .map(|_| backoff.failed(&emfile()).as_millis() as u64)
            .collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(&emfile()), Duration::from_millis(10));
        let aborted = io::Error::from_raw_os_error(Errno::ECONNABORTED as i32);
        assert_eq!(backoff.failed(&aborted), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn throttle_lets_one_event_through_per_second_with_the_count() {
        let mut throttle = Throttle::default();
        assert_eq!(throttle.tick(), Some(1));
        for _ in 0..19 {
            tokio::time::advance(Duration::from_millis(50)).await;
            assert_eq!(throttle.tick(), None);
        }
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(throttle.tick(), Some(20));
        assert_eq!(throttle.tick(), None);
    }

    #[tokio::test]
    async fn connections_over_the_cap_overflow_then_are_refused() {
        let mut admission = Admission::new(2);
        let clients: Vec<_> = (0..2).map(|_| admission.admit()).collect();
        assert!(clients.iter().all(|a| matches!(a, Admitted::Client(_))));
        let overflow: Vec<_> = (0..OVERFLOW_CONNECTIONS)
            .map(|_| admission.admit())
            .collect();
        assert!(overflow.iter().all(|a| matches!(a, Admitted::Overflow(_))));
        assert!(matches!(admission.admit(), Admitted::Refused));
        drop(clients);
        assert!(matches!(admission.admit(), Admitted::Client(_)));
    }
}
