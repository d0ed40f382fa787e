//! The config file's format as written: every field optional, unknown
//! fields refused, parsed with errors that name the file, field, line and column.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::RouteKind;
use crate::error::ConfigError;
use crate::ray::{RayLaunch, RayModules};

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) server: RawServer,
    pub(super) module_defaults: RawSupervision,
    pub(super) modules: Vec<RawModule>,
    pub(super) ray: RawRay,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRay {
    pub(super) modules: Option<RayModules>,
    pub(super) python: Option<String>,
    pub(super) client_port: Option<u16>,
    pub(super) gcs_gone_secs: Option<f64>,
    pub(super) launch: Option<RayLaunch>,
}

/// Only modules: what `routes.py` generates for Ray's modules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModules {
    #[serde(default)]
    pub(super) modules: Vec<RawModule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) session_dir: Option<PathBuf>,
    pub(super) host: Option<IpAddr>,
    pub(super) port: Option<u16>,
    pub(super) max_request_body_bytes: Option<u64>,
    pub(super) max_header_bytes: Option<usize>,
    pub(super) max_websocket_message_bytes: Option<usize>,
    pub(super) http_response_timeout_secs: Option<f64>,
    pub(super) shutdown_grace_secs: Option<f64>,
    pub(super) worker_threads: Option<usize>,
    pub(super) allowed_hosts: Option<Vec<String>>,
    pub(super) allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawSupervision {
    pub(super) startup_timeout_secs: Option<f64>,
    pub(super) health_interval_secs: Option<f64>,
    pub(super) health_timeout_secs: Option<f64>,
    pub(super) failure_threshold: Option<u32>,
    pub(super) backoff_initial_secs: Option<f64>,
    pub(super) backoff_max_secs: Option<f64>,
    pub(super) stable_after_secs: Option<f64>,
    pub(super) stop_grace_secs: Option<f64>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_queued_requests: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModule {
    pub(super) name: String,
    pub(super) command: Vec<String>,
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(super) supervision: RawSupervision,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) method: String,
    pub(super) path: String,
    #[serde(rename = "type")]
    pub(super) kind: RouteKind,
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    origin: &str,
    text: &str,
) -> Result<T, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let field = err.path().to_string();
        let at = err.inner().span().map(|span| line_column(text, span.start));
        // One line: the message of a syntax error may span several.
        let message = err
            .inner()
            .message()
            .split('\n')
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let (field, problem) = match (field == ".", at) {
            // A syntax error (or a bad top-level table): the place is all
            // there is to name.
            (true, Some((line, column))) => (format!("line {line}, column {column}"), message),
            (true, None) => ("(top level)".to_owned(), message),
            (false, Some((line, column))) => {
                (field, format!("{message} (line {line}, column {column})"))
            }
            (false, None) => (field, message),
        };
        ConfigError::Invalid {
            file: origin.to_owned(),
            field,
            problem,
        }
    })
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = (0..=offset.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}
