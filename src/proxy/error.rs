//! Why a request could not be forwarded to a module: [`ProxyError`], and
//! the one mapping of it to the client's answer (its `IntoResponse`).

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::error_chain;
use crate::supervisor::{ModuleHandle, ModuleState, NotReady};

/// What a 503 for a module whose connections and queue are all taken asks
/// the client to wait: a queue drains in well under a second when the
/// module keeps up, and a client that comes back sooner finds it as full.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a request could not be forwarded to a module.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    /// No route claims the path.
    #[error("no route for {path}")]
    NotFound {
        /// The request path.
        path: String,
    },
    /// A route claims the path, but not with this method.
    #[error("method {method} not allowed on {path}")]
    MethodNotAllowed {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
        /// The methods that the path accepts, for the `Allow` header.
        allow: String,
    },
    /// The module is starting, restarting or backing off.
    #[error("module {module} is not ready ({state})")]
    NotReady {
        /// The module's name.
        module: String,
        /// Its state, such as starting or backing off.
        state: ModuleState,
        /// When to try again.
        retry_after: Duration,
    },
    /// The module could not be reached, or broke off the exchange.
    #[error("module {module} failed: {reason}")]
    Upstream {
        /// The module's name.
        module: String,
        /// What happened, with its cause.
        #[source]
        reason: UpstreamFailure,
    },
    /// Every connection to the module is in use and as many requests as
    /// may wait for one already do.
    #[error("module {module} is busy: all {connections} connections in use and {queued} requests waiting for one; try again later")]
    Busy {
        /// The module's name.
        module: String,
        /// Its connections in use (its `max_connections`).
        connections: usize,
        /// Requests waiting (its `max_queued_requests`).
        queued: usize,
    },
    /// The request waited for a free connection to the module until its
    /// deadline.
    #[error("module {module} had no free connection within {after:?}: all {connections} in use")]
    NoConnection {
        /// The module's name.
        module: String,
        /// The deadline that passed.
        after: Duration,
        /// Its connections in use (its `max_connections`).
        connections: usize,
    },
    /// As many streams and websockets as the module may hold are open.
    #[error("module {module} has all {limit} streams and websockets it allows open (max_long_lived_connections); try again when one closes")]
    LongLivedFull {
        /// The module's name.
        module: String,
        /// Its `max_long_lived_connections`.
        limit: usize,
    },
    /// The module did not start its response in time.
    #[error("module {module} did not answer within {after:?}")]
    Timeout {
        /// The module's name.
        module: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The request body is over the limit.
    #[error("request body over the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// The client sent nothing of the request body for the body timeout
    /// (`server.client_body_timeout_secs`).
    #[error(
        "the request body stalled: nothing came for {after:?} (server.client_body_timeout_secs)"
    )]
    BodyTimeout {
        /// The timeout that passed.
        after: Duration,
    },
    /// The request body broke off or is malformed (a bad chunk, say).
    #[error("bad request body: {reason}")]
    BadBody {
        /// What was wrong with it.
        reason: String,
    },
}

impl ProxyError {
    /// Why `module` let nothing through (see [`ModuleHandle::admit`]).
    pub(crate) fn not_ready(module: &ModuleHandle, why: NotReady) -> ProxyError {
        ProxyError::NotReady {
            module: module.name().to_owned(),
            state: why.state,
            retry_after: why.retry_after,
        }
    }
    /// The status the client is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ProxyError::NotFound { .. } => StatusCode::NOT_FOUND,
            ProxyError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::NotReady { .. }
            | ProxyError::Busy { .. }
            | ProxyError::LongLivedFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } | ProxyError::NoConnection { .. } => {
                StatusCode::GATEWAY_TIMEOUT
            }
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::BadBody { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// Whether a module broke an exchange it had accepted, or could not
    /// keep up with its requests (502, 504, 503 busy): worth a log line. A
    /// module not ready is already in its status and log.
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            ProxyError::Upstream { .. }
                | ProxyError::Timeout { .. }
                | ProxyError::Busy { .. }
                | ProxyError::LongLivedFull { .. }
                | ProxyError::NoConnection { .. }
        )
    }

    fn module(&self) -> Option<&str> {
        match self {
            ProxyError::NotReady { module, .. }
            | ProxyError::Busy { module, .. }
            | ProxyError::LongLivedFull { module, .. }
            | ProxyError::NoConnection { module, .. }
            | ProxyError::Upstream { module, .. }
            | ProxyError::Timeout { module, .. } => Some(module),
            _ => None,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::json!({
            "error": status.canonical_reason().unwrap_or("error"),
            "module": self.module(),
            "message": error_chain(&self),
        });
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        let retry_after = match &self {
            ProxyError::NotReady { retry_after, .. } => Some(*retry_after),
            ProxyError::Busy { .. } | ProxyError::LongLivedFull { .. } => Some(BUSY_RETRY_AFTER),
            _ => None,
        };
        if let Some(retry_after) = retry_after {
            let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let ProxyError::MethodNotAllowed { allow, .. } = &self {
            if let Ok(value) = HeaderValue::from_str(allow) {
                headers.insert(header::ALLOW, value);
            }
        }
        if matches!(
            self,
            ProxyError::BodyTimeout { .. } | ProxyError::BadBody { .. }
        ) {
            // The rest of the body cannot be told from a next request.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// How a module broke an exchange, for [`ProxyError::Upstream`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamFailure {
    /// The incarnation serving the request failed meanwhile.
    #[error("incarnation {incarnation} failed while handling the request")]
    IncarnationFailed {
        /// The incarnation that failed.
        incarnation: u32,
    },
    /// Its answer had both `Transfer-Encoding` and `Content-Length`.
    #[error(
        "it answered with both Transfer-Encoding and Content-Length \
         (RFC 9112 §6.3: the body's length is ambiguous)"
    )]
    AmbiguousLength,
    /// The exchange failed: the connect, the request or the answer's head.
    #[error(transparent)]
    Exchange(SharedError),
    /// Its answer's head could not be passed on (a bare exchange's check).
    #[error("{0}")]
    BadAnswer(String),
    /// The answer's body broke off.
    #[error("the answer broke off: {0}")]
    AnswerBroke(#[source] SharedError),
}

/// A cause shared by every waiter on one answer (a [`ProxyError`] is
/// cloned to each).
pub type SharedError = Arc<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A full queue is 503 with `Retry-After`; a request that waited out
    /// its deadline for a connection is 504; both name the module.
    #[test]
    fn a_busy_module_is_503_with_retry_after_and_no_connection_504() {
        let busy = ProxyError::Busy {
            module: "echo".to_owned(),
            connections: 100,
            queued: 1000,
        }
        .into_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        let waited = ProxyError::NoConnection {
            module: "echo".to_owned(),
            after: Duration::from_secs(300),
            connections: 100,
        };
        assert_eq!(
            waited.to_string(),
            "module echo had no free connection within 300s: all 100 in use"
        );
        let waited = waited.into_response();
        assert_eq!(waited.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(!waited.headers().contains_key(header::RETRY_AFTER));
    }

    /// A module that broke the exchange is 502, its cause kept as the
    /// error's source and told to the client as before.
    #[test]
    fn an_upstream_failure_keeps_its_cause_and_its_words() {
        let cause: SharedError = Arc::new(std::io::Error::other("connection reset"));
        let failed = ProxyError::Upstream {
            module: "echo".to_owned(),
            reason: UpstreamFailure::AnswerBroke(cause),
        };
        let source = std::error::Error::source(&failed).expect("a source");
        assert_eq!(source.to_string(), "the answer broke off: connection reset");
        assert_eq!(
            error_chain(&failed),
            "module echo failed: the answer broke off: connection reset"
        );
        assert_eq!(failed.into_response().status(), StatusCode::BAD_GATEWAY);
        let not_ready = ProxyError::NotReady {
            module: "echo".to_owned(),
            state: ModuleState::Backoff,
            retry_after: Duration::from_secs(3),
        };
        assert_eq!(not_ready.to_string(), "module echo is not ready (backoff)");
    }
}
