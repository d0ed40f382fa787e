//! Errors. A [`StartupError`] ends the process; an [`ApiError`] (the
//! host's own API refusing) becomes one HTTP response, through the single
//! mapping in its `IntoResponse`. A module route's failure is the proxy's
//! own ([`crate::proxy::ProxyError`]), mapped the same way.

use std::path::PathBuf;

use axum::http::StatusCode;
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
