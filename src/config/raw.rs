//! The config file's format as written: every field optional, unknown
//! fields refused, parsed with errors that name the file, field, line and
//! column; and how a file is laid over the built-in config.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ray_settings::{RayLaunch, RayModules};
use super::{CgroupMode, Start};
use crate::error::ConfigError;
use crate::routes::RouteKind;

/// A config file. Tables come after the top-level keys, as TOML needs them
/// to when written out (`--check-config`).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConfig {
    /// Whether the built-in modules are kept; unset: kept unless the file
    /// declares `[[modules]]` of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) builtin_modules: Option<bool>,
    pub(super) server: RawServer,
    pub(super) module_defaults: RawSupervision,
    pub(super) ray: RawRay,
    /// `None` when the file declares no `[[modules]]` (not even `modules = []`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) modules: Option<Vec<RawModule>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRay {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) modules: Option<RayModules>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) python: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) client_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) gcs_gone_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) launch: Option<RayLaunch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) memory_budget_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cache_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) native_routes: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) on_demand: Option<Vec<String>>,
}

/// Only modules: what `routes.py` generates for Ray's modules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModules {
    #[serde(default)]
    pub(super) modules: Vec<RawModule>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawServer {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) session_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) host: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_request_body_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_header_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_websocket_message_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) http_response_timeout_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) shutdown_grace_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) client_send_timeout_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) client_body_timeout_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) worker_threads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) allowed_hosts: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) allowed_origins: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cgroups: Option<CgroupMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) log_rotation_max_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) log_rotation_backup_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tls_key: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) url_prefix: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawSupervision {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) startup_timeout_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) health_interval_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) health_timeout_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) failure_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) backoff_initial_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) backoff_max_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stable_after_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stop_grace_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_queued_requests: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_long_lived_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) busy_max_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) memory_budget_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) nice: Option<i32>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModule {
    pub(super) name: String,
    pub(super) command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "RawSupervision::is_empty")]
    pub(super) supervision: RawSupervision,
    #[serde(default, skip_serializing_if = "is_at_launch")]
    pub(super) start: Start,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
}

fn is_at_launch(start: &Start) -> bool {
    *start == Start::AtLaunch
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) method: String,
    pub(super) path: String,
    #[serde(rename = "type")]
    pub(super) kind: RouteKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cache_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) fallback: Option<String>,
}

// === layering ===

impl RawConfig {
    /// The settings of `self` (the built-in config) with those `file` sets
    /// laid over them, field by field. Modules are not merged here: see
    /// [`RawConfig::builtin_modules_kept`].
    pub(super) fn overlaid_with(self, file: &RawConfig) -> RawConfig {
        RawConfig {
            builtin_modules: None,
            server: self.server.overlaid_with(&file.server),
            module_defaults: self.module_defaults.overlaid_with(&file.module_defaults),
            ray: self.ray.overlaid_with(&file.ray),
            modules: None,
        }
    }

    /// Whether a file keeps the built-in modules: as it says with
    /// `builtin_modules`, else when it declares no modules of its own.
    pub(super) fn builtin_modules_kept(&self) -> bool {
        self.builtin_modules.unwrap_or(self.modules.is_none())
    }
}

impl RawServer {
    fn overlaid_with(self, over: &RawServer) -> RawServer {
        RawServer {
            session_dir: over.session_dir.clone().or(self.session_dir),
            host: over.host.or(self.host),
            port: over.port.or(self.port),
            max_request_body_bytes: over.max_request_body_bytes.or(self.max_request_body_bytes),
            max_header_bytes: over.max_header_bytes.or(self.max_header_bytes),
            max_websocket_message_bytes: over
                .max_websocket_message_bytes
                .or(self.max_websocket_message_bytes),
            http_response_timeout_secs: over
                .http_response_timeout_secs
                .or(self.http_response_timeout_secs),
            shutdown_grace_secs: over.shutdown_grace_secs.or(self.shutdown_grace_secs),
            client_send_timeout_secs: over
                .client_send_timeout_secs
                .or(self.client_send_timeout_secs),
            client_body_timeout_secs: over
                .client_body_timeout_secs
                .or(self.client_body_timeout_secs),
            worker_threads: over.worker_threads.or(self.worker_threads),
            allowed_hosts: over.allowed_hosts.clone().or(self.allowed_hosts),
            allowed_origins: over.allowed_origins.clone().or(self.allowed_origins),
            max_connections: over.max_connections.or(self.max_connections),
            cgroups: over.cgroups.or(self.cgroups),
            log_rotation_max_bytes: over.log_rotation_max_bytes.or(self.log_rotation_max_bytes),
            log_rotation_backup_count: over
                .log_rotation_backup_count
                .or(self.log_rotation_backup_count),
            tls_cert: over.tls_cert.clone().or(self.tls_cert),
            tls_key: over.tls_key.clone().or(self.tls_key),
            url_prefix: over.url_prefix.clone().or(self.url_prefix),
        }
    }
}

impl RawSupervision {
    fn overlaid_with(self, over: &RawSupervision) -> RawSupervision {
        RawSupervision {
            startup_timeout_secs: over.startup_timeout_secs.or(self.startup_timeout_secs),
            health_interval_secs: over.health_interval_secs.or(self.health_interval_secs),
            health_timeout_secs: over.health_timeout_secs.or(self.health_timeout_secs),
            failure_threshold: over.failure_threshold.or(self.failure_threshold),
            backoff_initial_secs: over.backoff_initial_secs.or(self.backoff_initial_secs),
            backoff_max_secs: over.backoff_max_secs.or(self.backoff_max_secs),
            stable_after_secs: over.stable_after_secs.or(self.stable_after_secs),
            stop_grace_secs: over.stop_grace_secs.or(self.stop_grace_secs),
            max_connections: over.max_connections.or(self.max_connections),
            max_queued_requests: over.max_queued_requests.or(self.max_queued_requests),
            max_long_lived_connections: over
                .max_long_lived_connections
                .or(self.max_long_lived_connections),
            busy_max_secs: over.busy_max_secs.or(self.busy_max_secs),
            memory_budget_mib: over.memory_budget_mib.or(self.memory_budget_mib),
            nice: over.nice.or(self.nice),
        }
    }

    /// Whether it sets nothing (so is left out when written).
    pub(super) fn is_empty(&self) -> bool {
        *self == RawSupervision::default()
    }
}

impl RawRay {
    fn overlaid_with(self, over: &RawRay) -> RawRay {
        RawRay {
            modules: over.modules.or(self.modules),
            python: over.python.clone().or(self.python),
            client_port: over.client_port.or(self.client_port),
            gcs_gone_secs: over.gcs_gone_secs.or(self.gcs_gone_secs),
            launch: over.launch.or(self.launch),
            memory_budget_mib: over.memory_budget_mib.or(self.memory_budget_mib),
            cache_secs: over.cache_secs.or(self.cache_secs),
            native_routes: over.native_routes.or(self.native_routes),
            on_demand: over.on_demand.clone().or(self.on_demand),
        }
    }
}

// === parsing ===

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
