//! What can go wrong: [`StartupError`] ends the process, [`LogsError`] fails
//! one request, and `impl IntoResponse for LogsError` is the one place that
//! turns it into a status and a `{"error", "message"}` JSON body.

use std::io;
use std::path::PathBuf;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ray_dashd_sdk::SdkError;
use rustix::io::Errno;
use serde_json::json;

use crate::headers::FILE_SIZE_HEADER;

/// Errors that stop the module before it serves anything.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The module environment is unusable, or the socket could not be served.
    #[error(transparent)]
    Sdk(#[from] SdkError),
    /// Neither `RAY_DASHD_LOG_DIR` nor `RAY_DASHD_SESSION_DIR` is set.
    #[error(
        "no log folder: set {} (or {})",
        ray_dashd_sdk::LOG_DIR_VAR,
        ray_dashd_sdk::SESSION_DIR_VAR
    )]
    NoLogDir,
    /// The log folder cannot be resolved, or is not a folder.
    #[error("log folder {}: {source}", path.display())]
    LogDir {
        /// The folder as given.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },
}

/// Why one request for a log file fails.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    /// The query string is malformed or contradicts itself (400).
    #[error("bad query: {0}")]
    BadQuery(String),
    /// The name is refused because it could lead outside the log folder:
    /// `..`, an absolute path, NUL, or a symlink anywhere in it, wherever
    /// it leads: links in the log folder are never followed (400).
    #[error("refused name {name:?}: {reason}")]
    Refused {
        /// The name as the client sent it.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// No file by that name (404).
    #[error("no such file: {name:?}")]
    NotFound {
        /// The name as the client sent it.
        name: String,
    },
    /// The name is a folder (400).
    #[error("{name:?} is a directory")]
    IsDirectory {
        /// The name as the client sent it.
        name: String,
    },
    /// The name is a socket, FIFO or device, which are never opened (400).
    #[error("{name:?} is not a regular file")]
    NotRegularFile {
        /// The name as the client sent it.
        name: String,
    },
    /// The module may not read the file (403).
    #[error("permission denied reading {name:?}")]
    PermissionDenied {
        /// The name as the client sent it.
        name: String,
    },
    /// A byte range starting beyond the end of the file, which most likely
    /// means it was truncated or rotated since the client last looked (416).
    #[error("offset {offset} is past the end of {name:?} ({size} bytes)")]
    OffsetPastEnd {
        /// The name as the client sent it.
        name: String,
        /// The requested start.
        offset: u64,
        /// The file's current size.
        size: u64,
    },
    /// Any other failure to read the file (500; details are logged, not sent).
    #[error("failed to read {name:?}: {source}")]
    Io {
        /// The name as the client sent it.
        name: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl LogsError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadQuery(_)
            | Self::Refused { .. }
            | Self::IsDirectory { .. }
            | Self::NotRegularFile { .. } => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::PermissionDenied { .. } => StatusCode::FORBIDDEN,
            Self::OffsetPastEnd { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            Self::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short machine-readable code sent as `error`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadQuery(_) => "bad_query",
            Self::Refused { .. } => "refused",
            Self::NotFound { .. } => "not_found",
            Self::IsDirectory { .. } => "is_directory",
            Self::NotRegularFile { .. } => "not_regular_file",
            Self::PermissionDenied { .. } => "forbidden",
            Self::OffsetPastEnd { .. } => "offset_past_end",
            Self::Io { .. } => "io",
        }
    }

    /// The text sent to the client as `message`: the display form, except
    /// that internal I/O details stay in the log.
    pub fn client_message(&self) -> String {
        match self {
            Self::Io { name, .. } => format!("failed to read {name:?}"),
            other => other.to_string(),
        }
    }

    /// Maps an I/O error met while resolving, opening or reading `name`.
    pub(crate) fn from_io(name: &str, source: io::Error) -> Self {
        let name = name.to_owned();
        match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => Self::NotFound { name },
            io::ErrorKind::PermissionDenied => Self::PermissionDenied { name },
            io::ErrorKind::IsADirectory => Self::IsDirectory { name },
            // Only path resolution fails so, and it does for any link in
            // the name (see `beneath.rs`), not just for loops.
            _ if source.raw_os_error() == Some(Errno::LOOP.raw_os_error()) => Self::Refused {
                name,
                reason:
                    "is or passes through a symlink (symlinks in the log folder are not followed)",
            },
            // `RESOLVE_BENEATH` saw the name leave the folder.
            _ if source.raw_os_error() == Some(Errno::XDEV.raw_os_error()) => Self::Refused {
                name,
                reason: "resolves outside the log folder",
            },
            _ => Self::Io { name, source },
        }
    }

    /// A blocking task reading `name` that panicked, as a read failure.
    pub(crate) fn from_join(name: &str, e: tokio::task::JoinError) -> Self {
        Self::Io {
            name: name.to_owned(),
            source: io::Error::other(e),
        }
    }
}

impl IntoResponse for LogsError {
    fn into_response(self) -> Response {
        if let Self::Io { name, source } = &self {
            // Client errors are the client's business; this one is ours.
            tracing::warn!(name = %name, error = %source, "failed to read log file");
        }
        let body = Json(json!({ "error": self.code(), "message": self.client_message() }));
        let mut response = (self.status(), body).into_response();
        if let Self::OffsetPastEnd { size, .. } = self {
            // Tells the client where the file ends now, so it can start over.
            response
                .headers_mut()
                .insert(FILE_SIZE_HEADER, HeaderValue::from(size));
        }
        response
    }
}
