//! Validation: raw values from the file (and the command line) checked and
//! turned into typed settings, each error naming the file and the field.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use http::Method;

use super::hosts::{allowed_host, allowed_origin};
use super::raw::{RawConfig, RawModule, RawSupervision};
use super::ray_settings::{
    default_on_demand, PythonSource, RayPython, RaySettings, DEFAULT_CACHE, DEFAULT_CLIENT_PORT,
    GCS_GONE_AFTER,
};
use super::{
    Config, ModuleSpec, Rotation, ServerSettings, Supervision, TlsFiles, DEFAULT_BACKUP_COUNT,
    DEFAULT_CLIENT_IDLE_TIMEOUT, DEFAULT_HOST, DEFAULT_HTTP_RESPONSE_TIMEOUT, DEFAULT_MAX_BYTES,
    DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_MAX_WEBSOCKET_MESSAGE_BYTES,
    DEFAULT_PORT, DEFAULT_SHUTDOWN_GRACE, DEFAULT_WORKER_THREADS, MIN_HEADER_BYTES,
};
use crate::cli::Cli;
use crate::error::ConfigError;
use crate::routes::host::HOST_PATHS;
use crate::routes::{normalize_pattern, Lookup, RouteKind, RouteSpec, RouteTable};

/// What a `cache_secs` may be, a route's or `[ray]`'s (which 0 turns off):
/// under a millisecond would print as 0 in the effective config.
const CACHE_SECS: std::ops::RangeInclusive<f64> = 0.001..=3600.0;

pub(super) struct Validator<'a> {
    pub(super) origin: &'a str,
}

impl Validator<'_> {
    fn invalid(&self, field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.origin.to_owned(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Validates the settings of `raw` (its modules are left to
    /// [`Validator::modules`]) with the command line over them.
    pub(super) fn validate(&self, raw: RawConfig, cli: &Cli) -> Result<Config, ConfigError> {
        let s = raw.server;
        let defaults = self.supervision(
            "module_defaults",
            &raw.module_defaults,
            &Supervision::default(),
        )?;
        let max_header_bytes = s.max_header_bytes.unwrap_or(DEFAULT_MAX_HEADER_BYTES);
        if max_header_bytes < MIN_HEADER_BYTES {
            return Err(self.invalid(
                "server.max_header_bytes",
                format!("must be at least {MIN_HEADER_BYTES}"),
            ));
        }
        let server = ServerSettings {
            max_request_body_bytes: s
                .max_request_body_bytes
                .unwrap_or(DEFAULT_MAX_REQUEST_BODY_BYTES),
            max_header_bytes,
            max_websocket_message_bytes: s
                .max_websocket_message_bytes
                .unwrap_or(DEFAULT_MAX_WEBSOCKET_MESSAGE_BYTES),
            http_response_timeout: self.secs(
                "server.http_response_timeout_secs",
                s.http_response_timeout_secs,
                DEFAULT_HTTP_RESPONSE_TIMEOUT,
            )?,
            shutdown_grace: self.secs(
                "server.shutdown_grace_secs",
                s.shutdown_grace_secs,
                DEFAULT_SHUTDOWN_GRACE,
            )?,
            client_send_timeout: self.positive_secs(
                "server.client_send_timeout_secs",
                s.client_send_timeout_secs,
                DEFAULT_CLIENT_IDLE_TIMEOUT,
            )?,
            client_body_timeout: self.positive_secs(
                "server.client_body_timeout_secs",
                s.client_body_timeout_secs,
                DEFAULT_CLIENT_IDLE_TIMEOUT,
            )?,
            worker_threads: match s.worker_threads {
                None => DEFAULT_WORKER_THREADS,
                Some(0) => return Err(self.invalid("server.worker_threads", "must be at least 1")),
                Some(n) => n,
            },
            allowed_hosts: self.list("server.allowed_hosts", s.allowed_hosts, allowed_host)?,
            allowed_origins: self.list(
                "server.allowed_origins",
                s.allowed_origins,
                allowed_origin,
            )?,
            // Zero would refuse every client, health checks included.
            max_connections: match s.max_connections {
                Some(0) => return Err(self.invalid("server.max_connections", "must be at least 1")),
                n => n,
            },
            cgroups: s.cgroups.unwrap_or_default(),
            // Ray's variables, read as Ray reads them, over the file.
            log_rotation: Rotation {
                max_bytes: cli
                    .log_rotation_max_bytes
                    .or(s.log_rotation_max_bytes)
                    .unwrap_or(DEFAULT_MAX_BYTES),
                backup_count: cli
                    .log_rotation_backup_count
                    .or(s.log_rotation_backup_count)
                    .unwrap_or(DEFAULT_BACKUP_COUNT),
            },
            tls: self.tls(
                cli.tls_cert.clone().or(s.tls_cert),
                cli.tls_key.clone().or(s.tls_key),
            )?,
            url_prefix: {
                let prefix = cli.url_prefix.clone().or(s.url_prefix).unwrap_or_default();
                check_url_prefix(&prefix)
                    .map_err(|p| self.invalid("server.url_prefix", p.to_string()))?;
                prefix
            },
        };

        Ok(Config {
            session_dir: cli
                .session_dir
                .clone()
                .or(s.session_dir)
                .unwrap_or_else(|| PathBuf::from(crate::cli::DEFAULT_SESSION_DIR)),
            host: cli.host.or(s.host).unwrap_or(DEFAULT_HOST),
            port: cli.port.or(s.port).unwrap_or(DEFAULT_PORT),
            server,
            modules: Vec::new(),
            module_defaults: defaults,
            ray: RaySettings {
                modules: raw.ray.modules.unwrap_or_default(),
                python: self.python(cli, raw.ray.python)?,
                client_port: cli
                    .ray_client_port
                    .or(raw.ray.client_port)
                    .unwrap_or(DEFAULT_CLIENT_PORT),
                gcs_gone_after: match self.secs(
                    "ray.gcs_gone_secs",
                    raw.ray.gcs_gone_secs,
                    GCS_GONE_AFTER,
                )? {
                    Duration::ZERO => {
                        return Err(self.invalid("ray.gcs_gone_secs", "must be more than 0"))
                    }
                    after => after,
                },
                launch: raw.ray.launch.unwrap_or_default(),
                memory_budget: self
                    .memory_budget("ray.memory_budget_mib", raw.ray.memory_budget_mib)?,
                cache: match raw.ray.cache_secs {
                    None => Some(DEFAULT_CACHE),
                    Some(0.0) => None,
                    Some(secs) if CACHE_SECS.contains(&secs) => Some(Duration::from_secs_f64(secs)),
                    Some(_) => {
                        return Err(
                            self.invalid("ray.cache_secs", "must be 0 (off) or from 0.001 to 3600")
                        )
                    }
                },
                native_routes: raw.ray.native_routes.unwrap_or(true),
                on_demand: self.on_demand(raw.ray.on_demand)?,
            },
        })
    }

    /// The dashboard port's TLS files: both named, or neither.
    fn tls(
        &self,
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
    ) -> Result<Option<TlsFiles>, ConfigError> {
        let named = |field: &str, path: Option<PathBuf>| match path {
            Some(path) if path.as_os_str().is_empty() => {
                Err(self.invalid(field, "must name a PEM file"))
            }
            path => Ok(path),
        };
        match (
            named("server.tls_cert", cert)?,
            named("server.tls_key", key)?,
        ) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles { cert, key })),
            (None, None) => Ok(None),
            (Some(_), None) => Err(self.invalid(
                "server.tls_key",
                "must be set with server.tls_cert (--tls-key, RAY_DASHD_TLS_KEY): HTTPS needs both the certificate and its key",
            )),
            (None, Some(_)) => Err(self.invalid(
                "server.tls_cert",
                "must be set with server.tls_key (--tls-cert, RAY_DASHD_TLS_CERT): HTTPS needs both the certificate and its key",
            )),
        }
    }

    /// The Python for Ray's modules when one is named: `--ray-python` (or
    /// `RAY_DASHD_RAY_PYTHON`) over `[ray] python`.
    fn python(&self, cli: &Cli, file: Option<String>) -> Result<Option<RayPython>, ConfigError> {
        let chosen = match (&cli.ray_python, file) {
            (Some(program), _) => RayPython {
                program: program.clone(),
                source: if cli.ray_python_from_env {
                    PythonSource::Env
                } else {
                    PythonSource::Flag
                },
            },
            (None, Some(program)) => {
                if program.is_empty() {
                    return Err(self.invalid("ray.python", "must name a program"));
                }
                RayPython {
                    program,
                    source: PythonSource::ConfigFile(self.origin.to_owned()),
                }
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(chosen))
    }

    /// A route's `cache_secs`: only for `GET` routes of kind `http`, whose
    /// answers can be shared; more than 0 and at most an hour.
    fn route_cache(
        &self,
        at: &str,
        method: &Method,
        kind: RouteKind,
        secs: Option<f64>,
    ) -> Result<Option<Duration>, ConfigError> {
        let Some(secs) = secs else { return Ok(None) };
        let field = format!("{at}.cache_secs");
        if *method != Method::GET || kind != RouteKind::Http {
            return Err(self.invalid(
                field,
                "only a GET route of type \"http\" may be cached (a write, a stream or a websocket is never shared)",
            ));
        }
        if !CACHE_SECS.contains(&secs) {
            return Err(self.invalid(field, "must be from 0.001 to 3600"));
        }
        Ok(Some(Duration::from_secs_f64(secs)))
    }

    /// A `memory_budget_mib` in bytes: at least 1 MiB when set.
    fn memory_budget(&self, field: &str, mib: Option<u64>) -> Result<Option<u64>, ConfigError> {
        match mib {
            Some(0) => Err(self.invalid(field, "must be at least 1")),
            mib => Ok(mib.map(|mib| mib.saturating_mul(1024 * 1024))),
        }
    }

    /// `[ray] on_demand`: module names, each once.
    fn on_demand(&self, names: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
        let Some(names) = names else {
            return Ok(default_on_demand());
        };
        for (i, name) in names.iter().enumerate() {
            let field = format!("ray.on_demand[{i}]");
            if !is_module_name(name) {
                return Err(self.invalid(field, format!("{name:?} must match [A-Za-z0-9_-]+")));
            }
            if names[..i].contains(name) {
                return Err(self.invalid(field, format!("{name:?} is named twice")));
            }
        }
        Ok(names)
    }

    /// Validates `raw` modules, which come after `existing` ones.
    pub(super) fn modules(
        &self,
        raw: Vec<RawModule>,
        defaults: &Supervision,
        existing: &[ModuleSpec],
    ) -> Result<Vec<ModuleSpec>, ConfigError> {
        let mut modules = Vec::with_capacity(raw.len());
        let mut claims = Claims::new(existing);
        for (i, m) in raw.into_iter().enumerate() {
            let at = format!("modules[{i}]");
            self.claim_name(&mut claims, &at, i, &m.name)?;
            let mut command = m.command.into_iter();
            let program = command.next().unwrap_or_default();
            self.check_program(&at, &program)?;
            self.check_env(&at, &m.env)?;
            let mut routes = Vec::with_capacity(m.routes.len());
            for (j, r) in m.routes.into_iter().enumerate() {
                let rat = format!("{at}.routes[{j}]");
                let method = Method::from_bytes(r.method.to_ascii_uppercase().as_bytes())
                    .map_err(|_| self.invalid(format!("{rat}.method"), "not an HTTP method"))?;
                let cache = self.route_cache(&rat, &method, r.kind, r.cache_secs)?;
                let route = RouteSpec {
                    method,
                    path: r.path,
                    kind: r.kind,
                    cache,
                    fallback: r.fallback,
                };
                self.claim_route(&mut claims, &rat, &m.name, &route)?;
                routes.push(route);
            }
            let supervision =
                self.supervision(&format!("{at}.supervision"), &m.supervision, defaults)?;
            modules.push(ModuleSpec {
                name: m.name,
                program,
                args: command.collect(),
                env: m.env,
                routes,
                supervision,
                start: m.start,
            });
        }
        self.check_fallbacks(&modules, existing)?;
        Ok(modules)
    }

    /// Checks the `fallback` of each route of `added` (after `existing`):
    /// only a `GET` `http` route has one (a request it may replay, with no
    /// body), and it names another module of the config.
    fn check_fallbacks(
        &self,
        added: &[ModuleSpec],
        existing: &[ModuleSpec],
    ) -> Result<(), ConfigError> {
        for (i, module) in added.iter().enumerate() {
            for (j, route) in module.routes.iter().enumerate() {
                let Some(fallback) = &route.fallback else {
                    continue;
                };
                let field = format!("modules[{i}].routes[{j}].fallback");
                if route.method != Method::GET || route.kind != RouteKind::Http {
                    return Err(self.invalid(field, "only a GET http route can have a fallback"));
                }
                if *fallback == module.name {
                    return Err(self.invalid(field, "names the route's own module"));
                }
                if !existing.iter().chain(added).any(|m| m.name == *fallback) {
                    return Err(self.invalid(field, format!("{fallback:?} is no module")));
                }
            }
        }
        Ok(())
    }

    /// Checks modules built as values (not read from TOML), which come
    /// after `existing` ones, as [`Validator::modules`] checks those it
    /// reads: names, commands, variables, and routes against each other,
    /// the existing modules' and the host's paths. Their supervision is
    /// typed already.
    pub(super) fn specs(
        &self,
        specs: &[ModuleSpec],
        existing: &[ModuleSpec],
    ) -> Result<(), ConfigError> {
        let mut claims = Claims::new(existing);
        for (i, spec) in specs.iter().enumerate() {
            let at = format!("modules[{i}]");
            self.claim_name(&mut claims, &at, i, &spec.name)?;
            self.check_program(&at, &spec.program)?;
            self.check_env(&at, &spec.env)?;
            for (j, route) in spec.routes.iter().enumerate() {
                self.claim_route(&mut claims, &format!("{at}.routes[{j}]"), &spec.name, route)?;
            }
        }
        self.check_fallbacks(specs, existing)
    }

    /// Checks the name of the module at `at` (index `i` among those being
    /// checked) and takes it.
    fn claim_name(
        &self,
        claims: &mut Claims,
        at: &str,
        i: usize,
        name: &str,
    ) -> Result<(), ConfigError> {
        if !is_module_name(name) {
            return Err(self.invalid(
                format!("{at}.name"),
                format!("{name:?} must match [A-Za-z0-9_-]+"),
            ));
        }
        if let Some(first) = claims.names.insert(name.to_owned(), Some(i)) {
            let first = match first {
                Some(first) => format!("modules[{first}]"),
                None => "an earlier module (a built-in one, or one of the config's)".to_owned(),
            };
            return Err(self.invalid(
                format!("{at}.name"),
                format!("{name:?} is already the name of {first}"),
            ));
        }
        Ok(())
    }

    fn check_program(&self, at: &str, program: &str) -> Result<(), ConfigError> {
        if program.is_empty() {
            return Err(self.invalid(format!("{at}.command"), "must name a program"));
        }
        Ok(())
    }

    fn check_env(&self, at: &str, env: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        for key in env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(self.invalid(
                    format!("{at}.env"),
                    format!("{key:?} is not a valid variable name"),
                ));
            }
        }
        Ok(())
    }

    /// Checks `route` of `module` (at `rat`) and takes its method and path:
    /// a websocket is GET, the pattern is well formed, shadows none of the
    /// host's paths and is no earlier module's.
    fn claim_route(
        &self,
        claims: &mut Claims,
        rat: &str,
        module: &str,
        route: &RouteSpec,
    ) -> Result<(), ConfigError> {
        let (method, path) = (&route.method, &route.path);
        if route.kind == RouteKind::Websocket && method != Method::GET {
            return Err(self.invalid(format!("{rat}.method"), "a websocket route must be GET"));
        }
        check_pattern(path).map_err(|p| self.invalid(format!("{rat}.path"), p.to_string()))?;
        if let Some(host_path) = claims.host_paths.shadowed_by(route) {
            return Err(self.invalid(
                format!("{rat}.path"),
                format!(
                    "{method} {path} of module {module:?} would shadow {host_path}, which ray-dashd (host) serves itself"
                ),
            ));
        }
        let key = (method.clone(), normalize_pattern(path));
        if let Some((other, other_path)) = claims.routes.get(&key) {
            return Err(self.invalid(
                format!("{rat}.path"),
                format!(
                    "{method} {path} is claimed by both {other:?} ({other_path}) and {module:?}"
                ),
            ));
        }
        claims.routes.insert(key, (module.to_owned(), path.clone()));
        Ok(())
    }

    /// Checks each entry of the list `field` with `check`, which gives the
    /// entry's normal form or its problem.
    fn list<E: std::fmt::Display>(
        &self,
        field: &str,
        entries: Option<Vec<String>>,
        check: impl Fn(&str) -> Result<String, E>,
    ) -> Result<Vec<String>, ConfigError> {
        let mut checked: Vec<String> = Vec::new();
        for (i, entry) in entries.unwrap_or_default().iter().enumerate() {
            let normal = check(entry)
                .map_err(|problem| self.invalid(format!("{field}[{i}]"), problem.to_string()))?;
            if !checked.contains(&normal) {
                checked.push(normal);
            }
        }
        Ok(checked)
    }

    fn secs(
        &self,
        field: &str,
        value: Option<f64>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(v) => Duration::try_from_secs_f64(v).map_err(|_| {
                self.invalid(
                    field,
                    format!("{v} is not a non-negative number of seconds"),
                )
            }),
        }
    }

    /// As [`Validator::secs`], but 0 is refused too.
    fn positive_secs(
        &self,
        field: &str,
        value: Option<f64>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match self.secs(field, value, default)? {
            Duration::ZERO => Err(self.invalid(field, "must be more than 0")),
            secs => Ok(secs),
        }
    }

    fn supervision(
        &self,
        at: &str,
        raw: &RawSupervision,
        base: &Supervision,
    ) -> Result<Supervision, ConfigError> {
        let f = |name: &str| format!("{at}.{name}");
        let s = Supervision {
            startup_timeout: self.secs(
                &f("startup_timeout_secs"),
                raw.startup_timeout_secs,
                base.startup_timeout,
            )?,
            health_interval: self.secs(
                &f("health_interval_secs"),
                raw.health_interval_secs,
                base.health_interval,
            )?,
            health_timeout: self.secs(
                &f("health_timeout_secs"),
                raw.health_timeout_secs,
                base.health_timeout,
            )?,
            failure_threshold: raw.failure_threshold.unwrap_or(base.failure_threshold),
            backoff_initial: self.secs(
                &f("backoff_initial_secs"),
                raw.backoff_initial_secs,
                base.backoff_initial,
            )?,
            backoff_max: self.secs(
                &f("backoff_max_secs"),
                raw.backoff_max_secs,
                base.backoff_max,
            )?,
            stable_after: self.secs(
                &f("stable_after_secs"),
                raw.stable_after_secs,
                base.stable_after,
            )?,
            stop_grace: self.secs(&f("stop_grace_secs"), raw.stop_grace_secs, base.stop_grace)?,
            max_connections: raw.max_connections.unwrap_or(base.max_connections),
            max_queued_requests: raw.max_queued_requests.unwrap_or(base.max_queued_requests),
            max_long_lived: raw
                .max_long_lived_connections
                .unwrap_or(base.max_long_lived),
            busy_max: self.secs(&f("busy_max_secs"), raw.busy_max_secs, base.busy_max)?,
            memory_budget: self
                .memory_budget(&f("memory_budget_mib"), raw.memory_budget_mib)?
                .or(base.memory_budget),
            nice: match raw.nice {
                Some(n) if !(0..=19).contains(&n) => {
                    return Err(self.invalid(f("nice"), "must be from 0 to 19"))
                }
                n => n.unwrap_or(base.nice),
            },
        };
        // A zero backoff or stable-after time would restart a failing module
        // at once, again and again.
        let positive = [
            ("startup_timeout_secs", s.startup_timeout),
            ("health_interval_secs", s.health_interval),
            ("health_timeout_secs", s.health_timeout),
            ("backoff_initial_secs", s.backoff_initial),
            ("stable_after_secs", s.stable_after),
            ("busy_max_secs", s.busy_max),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(self.invalid(f(name), "must be greater than zero"));
            }
        }
        if s.failure_threshold == 0 {
            return Err(self.invalid(f("failure_threshold"), "must be at least 1"));
        }
        // No connection at all would leave every request waiting out its
        // deadline.
        if s.max_connections == 0 {
            return Err(self.invalid(f("max_connections"), "must be at least 1"));
        }
        if s.max_long_lived == 0 {
            return Err(self.invalid(f("max_long_lived_connections"), "must be at least 1"));
        }
        if s.backoff_max < s.backoff_initial {
            return Err(self.invalid(
                f("backoff_max_secs"),
                "must not be less than backoff_initial_secs",
            ));
        }
        Ok(s)
    }
}

/// What the modules checked so far have taken, with the host's paths.
struct Claims {
    /// Module name -> its index among those being checked, or `None` for
    /// an existing module.
    names: HashMap<String, Option<usize>>,
    /// (method, normalized path) -> (module, path as written).
    routes: HashMap<(Method, String), (String, String)>,
    host_paths: HostPaths,
}

impl Claims {
    /// What `existing` modules have taken.
    fn new(existing: &[ModuleSpec]) -> Claims {
        let mut claims = Claims {
            names: HashMap::new(),
            routes: HashMap::new(),
            host_paths: HostPaths::new(),
        };
        for module in existing {
            claims.names.insert(module.name.clone(), None);
            for route in &module.routes {
                claims.routes.insert(
                    (route.method.clone(), normalize_pattern(&route.path)),
                    (module.name.clone(), route.path.clone()),
                );
            }
        }
        claims
    }
}

/// The host's own paths ([`HOST_PATHS`]), each with a matcher, for finding
/// module routes that would shadow them.
struct HostPaths(Vec<(&'static str, matchit::Router<()>)>);

impl HostPaths {
    fn new() -> HostPaths {
        HostPaths(
            HOST_PATHS
                .iter()
                .map(|path| {
                    let mut matcher = matchit::Router::new();
                    matcher
                        .insert(*path, ())
                        .expect("UNWRAP: HOST_PATHS are valid matchit patterns");
                    (*path, matcher)
                })
                .collect(),
        )
    }

    /// The first host path that `route` would answer (whatever the method:
    /// a path that a module route matches is the module's), if any. Two
    /// patterns overlap when a path built from the host path, with each of
    /// its parameters filled from the route's segment at the same place,
    /// matches both; the route side is checked by the proxy's own matcher.
    fn shadowed_by(&self, route: &RouteSpec) -> Option<&'static str> {
        let table = RouteTable::new([std::slice::from_ref(route)]);
        self.0.iter().find_map(|(host_path, matcher)| {
            let path = overlap_probe(&route.path, host_path);
            let shadowed =
                matcher.at(&path).is_ok() && table.lookup(&route.method, &path) != Lookup::NotFound;
            shadowed.then_some(*host_path)
        })
    }
}

/// The path that matches both `pattern` (a module route's) and `host` (a
/// matchit pattern) if any does: `host` with its `{name}` parameters taken
/// from `pattern`'s literal segment at the same place (else `x`), and its
/// `{*rest}` from `pattern`'s remaining segments.
pub(super) fn overlap_probe(pattern: &str, host: &str) -> String {
    let route: Vec<&str> = pattern.split('/').collect();
    let literal = |segment: &str| {
        if segment.starts_with('{') {
            "x".to_owned()
        } else {
            segment.to_owned()
        }
    };
    let mut probe = Vec::new();
    for (i, segment) in host.split('/').enumerate() {
        if segment.starts_with("{*") {
            let rest = route.get(i..).unwrap_or_default();
            if rest.is_empty() {
                probe.push("x".to_owned());
            }
            probe.extend(rest.iter().map(|s| literal(s)));
            break;
        } else if segment.starts_with('{') {
            probe.push(match route.get(i) {
                Some(s) if !s.is_empty() => literal(s),
                _ => "x".to_owned(),
            });
        } else {
            probe.push(segment.to_owned());
        }
    }
    probe.join("/")
}

/// Why a `server.url_prefix` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum UrlPrefixError {
    /// It does not start with `/`.
    #[error("{prefix:?} must start with '/'")]
    NotAbsolute {
        /// The prefix.
        prefix: String,
    },
    /// It is `/` alone or ends with `/`.
    #[error("{prefix:?} must not end with '/' (leave it unset to serve at /)")]
    TrailingSlash {
        /// The prefix.
        prefix: String,
    },
    /// It has an empty segment.
    #[error("{prefix:?} must not contain '//'")]
    EmptySegment {
        /// The prefix.
        prefix: String,
    },
    /// It has a `.` or `..` segment.
    #[error("{prefix:?} must not have '.' or '..' segments")]
    DotSegment {
        /// The prefix.
        prefix: String,
    },
    /// It has a character that is not unreserved.
    #[error(
        "{prefix:?}: {c:?} is not allowed; only letters, digits, '-', '.', '_', '~' and '/' are"
    )]
    Character {
        /// The prefix.
        prefix: String,
        /// The first character not allowed.
        c: char,
    },
}

/// Checks `server.url_prefix`: empty, or `/` then segments of unreserved
/// characters (RFC 3986 §2.3), none empty, `.` or `..`, and no trailing
/// `/`, so that it means one path however a client or proxy normalizes it.
pub(super) fn check_url_prefix(prefix: &str) -> Result<(), UrlPrefixError> {
    if prefix.is_empty() {
        return Ok(());
    }
    let owned = || prefix.to_owned();
    let Some(rest) = prefix.strip_prefix('/') else {
        return Err(UrlPrefixError::NotAbsolute { prefix: owned() });
    };
    if rest.is_empty() || rest.ends_with('/') {
        return Err(UrlPrefixError::TrailingSlash { prefix: owned() });
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err(UrlPrefixError::EmptySegment { prefix: owned() });
        }
        if segment == "." || segment == ".." {
            return Err(UrlPrefixError::DotSegment { prefix: owned() });
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')))
        {
            return Err(UrlPrefixError::Character { prefix: owned(), c });
        }
    }
    Ok(())
}

/// Why a route's path pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum PatternError {
    /// It does not start with `/`.
    #[error("{path:?} must start with '/'")]
    NotAbsolute {
        /// The pattern.
        path: String,
    },
    /// A segment opens a `{` it does not close at its end.
    #[error("{path:?}: segment {segment:?} must be a whole {{name}}")]
    Unclosed {
        /// The pattern.
        path: String,
        /// The segment.
        segment: String,
    },
    /// A parameter's name is empty or not an identifier.
    #[error("{path:?}: parameter {segment:?} must be {{name}} with name [A-Za-z_][A-Za-z0-9_]* (regex parameters are not supported)")]
    BadName {
        /// The pattern.
        path: String,
        /// The segment.
        segment: String,
    },
    /// A segment has a brace amid text.
    #[error("{path:?}: segment {segment:?} mixes text and a parameter")]
    Mixed {
        /// The pattern.
        path: String,
        /// The segment.
        segment: String,
    },
}

/// Checks an aiohttp-style path pattern: absolute, `{name}` segments only.
pub(super) fn check_pattern(path: &str) -> Result<(), PatternError> {
    if !path.starts_with('/') {
        return Err(PatternError::NotAbsolute {
            path: path.to_owned(),
        });
    }
    for segment in path.split('/') {
        let at = || (path.to_owned(), segment.to_owned());
        if let Some(inner) = segment.strip_prefix('{') {
            let Some(name) = inner.strip_suffix('}') else {
                let (path, segment) = at();
                return Err(PatternError::Unclosed { path, segment });
            };
            let valid = name.bytes().enumerate().all(|(i, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
            });
            if name.is_empty() || !valid {
                let (path, segment) = at();
                return Err(PatternError::BadName { path, segment });
            }
        } else if segment.contains(['{', '}']) {
            let (path, segment) = at();
            return Err(PatternError::Mixed { path, segment });
        }
    }
    Ok(())
}

/// Whether `name` can name a module (and so its socket, `dash_<name>`).
fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
