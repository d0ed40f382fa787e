//! The effective config written out as TOML (`--check-config`): every
//! setting explicit, so that the text loads back to the same config.

use std::time::Duration;

use super::raw::{RawConfig, RawModule, RawRay, RawRoute, RawServer, RawSupervision};
use super::{Config, ModuleSpec, Supervision};

/// What the printed config says about itself, as TOML comments.
const HEADER: &str = "\
# The effective configuration of ray-dashd: the config file over the
# built-in one, with the command line and RAY_DASHD_* variables applied.
# `ray-dashd --config <this file>` loads it unchanged. Ray's modules and
# the Ray Client proxy are not listed: they are added at start-up, when the
# session is a Ray head.
";

/// The note on `[ray] python` when none is named.
const PYTHON_NOTE: &str = "\
# [ray] python is not set: the first that imports ray is used of the
# Python of the Ray head's processes, that of ray-dashd's wheel, and
# python3 on PATH.
";

pub(super) fn to_toml(config: &Config) -> String {
    let settings = RawConfig {
        builtin_modules: Some(false),
        server: server(config),
        module_defaults: supervision(&config.module_defaults, None),
        ray: ray(config),
        modules: None,
    };
    let mut text = String::from(HEADER);
    if config.ray.python.is_none() {
        text.push_str(PYTHON_NOTE);
    }
    text.push('\n');
    text.push_str(&toml::to_string(&settings).expect("UNWRAP: the settings are plain TOML data"));
    for m in &config.modules {
        text.push_str("\n[[modules]]\n");
        text.push_str(&module_lines(&module(m, &config.module_defaults)));
    }
    text
}

/// A module's fields, as written by hand: one line each, its routes one
/// inline table a line (TOML's serializer would give each a table header).
fn module_lines(module: &RawModule) -> String {
    let value = toml::Value::try_from(module).expect("UNWRAP: a module is plain TOML data");
    let table = value.as_table().expect("UNWRAP: a module is a table");
    let mut text = String::new();
    for key in ["name", "command", "env", "supervision", "start"] {
        if let Some(value) = table.get(key) {
            text.push_str(&format!("{key} = {value}\n"));
        }
    }
    text.push_str("routes = [\n");
    for route in table
        .get("routes")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
    {
        text.push_str(&format!("  {route},\n"));
    }
    text.push_str("]\n");
    text
}

fn secs(d: Duration) -> Option<f64> {
    Some(d.as_secs_f64())
}

fn server(config: &Config) -> RawServer {
    let s = &config.server;
    RawServer {
        session_dir: Some(config.session_dir.clone()),
        host: Some(config.host),
        port: Some(config.port),
        max_request_body_bytes: Some(s.max_request_body_bytes),
        max_header_bytes: Some(s.max_header_bytes),
        max_websocket_message_bytes: Some(s.max_websocket_message_bytes),
        http_response_timeout_secs: secs(s.http_response_timeout),
        shutdown_grace_secs: secs(s.shutdown_grace),
        client_send_timeout_secs: secs(s.client_send_timeout),
        client_body_timeout_secs: secs(s.client_body_timeout),
        worker_threads: Some(s.worker_threads),
        allowed_hosts: Some(s.allowed_hosts.clone()),
        allowed_origins: Some(s.allowed_origins.clone()),
        // Unset: derived at start from the open-file limit; left out so
        // that the printed file derives it again where it is loaded.
        max_connections: s.max_connections,
        cgroups: Some(s.cgroups),
        log_rotation_max_bytes: Some(s.log_rotation.max_bytes),
        log_rotation_backup_count: Some(s.log_rotation.backup_count),
        tls_cert: s.tls.as_ref().map(|tls| tls.cert.clone()),
        tls_key: s.tls.as_ref().map(|tls| tls.key.clone()),
        url_prefix: Some(s.url_prefix.clone()),
    }
}

/// Every field of `s`, or (with `base`) only those that differ from it:
/// a module's own settings are what it changes of `[module_defaults]`.
fn supervision(s: &Supervision, base: Option<&Supervision>) -> RawSupervision {
    let differs = |pick: fn(&Supervision) -> Duration| {
        base.is_none_or(|b| pick(b) != pick(s))
            .then(|| pick(s).as_secs_f64())
    };
    let differs_n =
        |pick: fn(&Supervision) -> usize| base.is_none_or(|b| pick(b) != pick(s)).then(|| pick(s));
    RawSupervision {
        startup_timeout_secs: differs(|s| s.startup_timeout),
        health_interval_secs: differs(|s| s.health_interval),
        health_timeout_secs: differs(|s| s.health_timeout),
        failure_threshold: base
            .is_none_or(|b| b.failure_threshold != s.failure_threshold)
            .then_some(s.failure_threshold),
        backoff_initial_secs: differs(|s| s.backoff_initial),
        backoff_max_secs: differs(|s| s.backoff_max),
        stable_after_secs: differs(|s| s.stable_after),
        stop_grace_secs: differs(|s| s.stop_grace),
        max_connections: differs_n(|s| s.max_connections),
        max_queued_requests: differs_n(|s| s.max_queued_requests),
        max_long_lived_connections: differs_n(|s| s.max_long_lived),
        busy_max_secs: differs(|s| s.busy_max),
        nice: base.is_none_or(|b| b.nice != s.nice).then_some(s.nice),
        memory_budget_mib: base
            .is_none_or(|b| b.memory_budget != s.memory_budget)
            .then(|| s.memory_budget.map(|bytes| bytes / (1024 * 1024)))
            .flatten(),
    }
}

fn ray(config: &Config) -> RawRay {
    let r = &config.ray;
    RawRay {
        modules: Some(r.modules),
        python: r.python.as_ref().map(|p| p.program.clone()),
        client_port: Some(r.client_port),
        gcs_gone_secs: secs(r.gcs_gone_after),
        launch: Some(r.launch),
        memory_budget_mib: r.memory_budget.map(|bytes| bytes / (1024 * 1024)),
        cache_secs: Some(r.cache.map_or(0.0, |d| d.as_secs_f64())),
        native_routes: Some(r.native_routes),
        on_demand: Some(r.on_demand.clone()),
    }
}

fn module(m: &ModuleSpec, defaults: &Supervision) -> RawModule {
    RawModule {
        name: m.name.clone(),
        command: std::iter::once(m.program.clone())
            .chain(m.args.iter().cloned())
            .collect(),
        env: m.env.clone(),
        supervision: supervision(&m.supervision, Some(defaults)),
        start: m.start,
        routes: m
            .routes
            .iter()
            .map(|r| RawRoute {
                method: r.method.to_string(),
                path: r.path.clone(),
                kind: r.kind,
                cache_secs: r.cache.map(|d| d.as_secs_f64()),
                fallback: r.fallback.clone(),
            })
            .collect(),
    }
}
