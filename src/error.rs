//! Errors. A [`StartupError`] ends the process; a [`ProxyError`] (a module
//! route's failure) and an [`ApiError`] (the host's own API refusing)
//! each become one HTTP response, through the single mapping in their
//! `IntoResponse`.

use std::path::PathBuf;
use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config {path}: cannot read: {source}")]
    Read {
        /// The file named by `--config`.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A field is missing, unknown or has a bad value.
    #[error("config {file}: {field}: {problem}")]
    Invalid {
        /// The file the value came from.
        file: String,
        /// The field's path, such as `modules[1].routes[0].path`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// Anything that stops ray-dashd from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// See [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The session folder could not be prepared.
    #[error("session folder {path}: {source}")]
    Session {
        /// The folder (or the entry in it) that failed.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A module's socket path does not fit in `sockaddr_un`.
    #[error("socket path {path} is {len} bytes, over the AF_UNIX limit of {limit}; use a shorter --session-dir")]
    SocketPathTooLong {
        /// The path that is too long.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The most the kernel accepts.
        limit: usize,
    },
    /// The HTTP listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Ray's modules were asked for but cannot be hosted.
    #[error("ray: {0}")]
    Ray(String),
    /// Ray's token mode is on and ray-dashd cannot check tokens: it will
    /// not serve without them. A `ray::auth::TokenError`, boxed so that
    /// this bottom layer names nothing of Ray's.
    #[error(transparent)]
    TokenAuth(Box<dyn std::error::Error + Send + Sync>),
    /// The dashboard port's certificate or key cannot be used.
    #[error(transparent)]
    Tls(#[from] ray_dashd_tls::TlsError),
    /// The async runtime or its signal handlers could not be set up.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl StartupError {
    /// The exit code: 64 (EX_USAGE) for configuration, 1 for the rest.
    pub fn exit_code(&self) -> u8 {
        match self {
            StartupError::Config(_) | StartupError::Tls(_) => 64,
            _ => 1,
        }
    }
}

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
        /// Its state, such as `starting` or `backoff`.
        state: &'static str,
        /// When to try again.
        retry_after: Duration,
    },
    /// The module could not be reached, or broke off the exchange.
    #[error("module {module} failed: {reason}")]
    Upstream {
        /// The module's name.
        module: String,
        /// What happened.
        reason: String,
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
            "message": self.to_string(),
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

/// An error and its causes, joined with `: `.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Why the host's own API refused a request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No module has the name in the path.
    #[error("no module named {name:?}")]
    UnknownModule {
        /// The name asked for.
        name: String,
    },
    /// A restart of the module was asked for and has not begun yet.
    #[error("a restart of this module is already pending")]
    RestartPending {
        /// The module's name.
        module: String,
    },
    /// A reload read a config that is not valid; nothing changed.
    #[error("{message}; the running config is kept")]
    BadConfig {
        /// The config error, naming the file, the field and the problem.
        message: String,
    },
    /// A reload read a certificate or key that does not load; nothing
    /// changed.
    #[error("{message}; the certificate in use and the running config are kept")]
    BadCertificate {
        /// The TLS error, naming the setting and the file.
        message: String,
    },
    /// This host was started without a config source to read again.
    #[error("this ray-dashd cannot reload its config")]
    NoReload,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        let (status, body) = match self {
            ApiError::UnknownModule { .. } => (
                StatusCode::NOT_FOUND,
                serde_json::json!({ "error": "Not Found", "message": message }),
            ),
            ApiError::RestartPending { module } => (
                StatusCode::CONFLICT,
                serde_json::json!({ "module": module, "restarting": false, "message": message }),
            ),
            ApiError::BadConfig { .. } => (
                StatusCode::BAD_REQUEST,
                serde_json::json!({ "error": "Bad Config", "message": message }),
            ),
            ApiError::BadCertificate { .. } => (
                StatusCode::BAD_REQUEST,
                serde_json::json!({ "error": "Bad Certificate", "message": message }),
            ),
            ApiError::NoReload => (
                StatusCode::NOT_IMPLEMENTED,
                serde_json::json!({ "error": "Not Implemented", "message": message }),
            ),
        };
        (status, axum::Json(body)).into_response()
    }
}

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

    async fn json(response: Response) -> serde_json::Value {
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        serde_json::from_slice(&body).expect("json")
    }

    /// An unknown module is 404 and a pending restart 409, each with the
    /// body the API has always sent.
    #[tokio::test]
    async fn api_errors_keep_their_status_and_body() {
        let unknown = ApiError::UnknownModule {
            name: "nope".to_owned(),
        }
        .into_response();
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            json(unknown).await,
            serde_json::json!({ "error": "Not Found", "message": "no module named \"nope\"" })
        );
        let pending = ApiError::RestartPending {
            module: "echo".to_owned(),
        }
        .into_response();
        assert_eq!(pending.status(), StatusCode::CONFLICT);
        assert_eq!(
            json(pending).await,
            serde_json::json!({
                "module": "echo",
                "restarting": false,
                "message": "a restart of this module is already pending",
            })
        );
    }
}
