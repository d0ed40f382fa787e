//! The configuration: the TOML file (or the built-in default), merged with the
//! command line, validated into typed values before anything binds or spawns.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use serde::Deserialize;

use crate::cli::Cli;
use crate::error::ConfigError;
use crate::ray::{RayLaunch, RayModules, RaySettings};
use crate::supervisor::CgroupMode;

/// The configuration used when `--config` is absent (`config/default.toml`).
pub const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

/// Where the built-in default configuration claims to come from, in errors.
const DEFAULT_CONFIG_NAME: &str = "<built-in config/default.toml>";

/// The validated configuration of one ray-dashd process.
#[derive(Debug, Clone)]
pub struct Config {
    /// The Ray session folder whose `sockets/` and `logs/` the host uses.
    pub session_dir: PathBuf,
    /// The address the HTTP server binds.
    pub host: IpAddr,
    /// The TCP port the HTTP server binds (0 picks a free one).
    pub port: u16,
    /// Limits and timeouts of the HTTP server and the proxy.
    pub server: ServerSettings,
    /// The modules to supervise, in the order they are started.
    pub modules: Vec<ModuleSpec>,
    /// Supervision settings of modules that set none of their own.
    pub module_defaults: Supervision,
    /// Whether and how to host Ray's own dashboard modules.
    pub ray: RaySettings,
}

/// Limits and timeouts of the HTTP server and the proxy.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Largest request body forwarded to a module; larger ones get 413.
    pub max_request_body_bytes: u64,
    /// Largest total size of a request's head (request line and headers).
    pub max_header_bytes: usize,
    /// Largest websocket message (and frame) relayed in either direction.
    pub max_websocket_message_bytes: usize,
    /// How long an `http` route's module may take to start its response.
    pub http_response_timeout: Duration,
    /// How long in-flight requests may take to finish after SIGTERM or SIGINT.
    pub shutdown_grace: Duration,
    /// How long one write to a client may wait for the client to take data
    /// before its connection is closed (and its module request cancelled);
    /// any progress starts it over.
    pub client_send_timeout: Duration,
    /// How long a request body may send nothing while its module waits for
    /// it before the request is cancelled (408); any progress starts it over.
    pub client_body_timeout: Duration,
    /// Threads of the async runtime; 1 runs everything on one thread, the
    /// cheapest per request when the modules behind need the other cores.
    pub worker_threads: usize,
    /// Host names (lowercase, no port) answered besides loopback ones; when
    /// set, `Host` is checked whatever address is bound (see [`crate::guard`]).
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, lowercase, no default port) whose
    /// pages may open websockets and send writes besides this server's own.
    pub allowed_origins: Vec<String>,
    /// Most client connections served at once (at least 1); `None`: derived
    /// at start from the open-file limit and the modules' connection caps
    /// ([`crate::descriptors::max_connections_for`]).
    pub max_connections: Option<usize>,
    /// Whether each module incarnation runs in a cgroup of its own, killed
    /// whole when the incarnation ends.
    pub cgroups: CgroupMode,
}

/// One module: how to start it, how to supervise it and which routes it serves.
#[derive(Debug, Clone)]
pub struct ModuleSpec {
    /// Unique name, `[A-Za-z0-9_-]+`; names the socket `dash_<name>`.
    pub name: String,
    /// The program to run (resolved at spawn time, see [`ModuleSpec::program`]).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables, on top of the host's own environment.
    pub env: BTreeMap<String, String>,
    /// The routes the host forwards to it.
    pub routes: Vec<RouteSpec>,
    /// Health and restart settings.
    pub supervision: Supervision,
}

/// Health, restart and connection settings of one module.
#[derive(Debug, Clone, PartialEq)]
pub struct Supervision {
    /// How long a new incarnation may take to answer `/api/healthz` with 200.
    pub startup_timeout: Duration,
    /// Time between two health checks of a ready module.
    pub health_interval: Duration,
    /// How long one health check may take before it counts as a failure.
    pub health_timeout: Duration,
    /// Consecutive failed checks that make a ready module unhealthy.
    pub failure_threshold: u32,
    /// Delay before the second restart in a row; it doubles with each failure.
    pub backoff_initial: Duration,
    /// The cap on the restart delay.
    pub backoff_max: Duration,
    /// Healthy uptime after which the failure count (and so the backoff) resets.
    pub stable_after: Duration,
    /// Time between SIGTERM and SIGKILL when the module is stopped.
    pub stop_grace: Duration,
    /// Most connections open to one incarnation at once (idle ones, and
    /// those a stream or websocket holds, included); at least 1.
    pub max_connections: usize,
    /// Most requests waiting for a connection when all are in use; more
    /// get 503. 0: none wait.
    pub max_queued_requests: usize,
}

/// Connections per module when the config names no number: Ray's own
/// dashboard parent opens at most 100 per module (aiohttp's connector
/// limit), so Ray's modules are used to that much concurrency; and it is
/// below the listen backlog of 128 that aiohttp (and so every Ray module)
/// sets, so the host alone can never fill a module's backlog, where a
/// connect fails at once with EAGAIN.
pub const DEFAULT_MAX_CONNECTIONS: usize = 100;

/// Default of `server.client_send_timeout_secs` and
/// `server.client_body_timeout_secs`: nginx's `send_timeout` and
/// `client_body_timeout`. Long enough for a client on a bad link or a
/// laptop waking up; short enough that a client that stopped reading or
/// sending lets its module request go within a minute.
pub const DEFAULT_CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Requests that may wait for a connection per module when the config names
/// no number: ten times the default connections, so a burst of a thousand
/// (a dashboard page fanning out, a script in a loop) waits instead of
/// being refused, while a module that has stopped keeping up has new
/// requests refused at once rather than waiting out their deadline.
pub const DEFAULT_MAX_QUEUED_REQUESTS: usize = 1000;

impl Supervision {
    /// The limits of the connection pool of each incarnation.
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections,
            max_queued: self.max_queued_requests,
        }
    }
}

/// How many connections one incarnation's pool opens, and how many
/// requests may wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once; at least 1.
    pub max_connections: usize,
    /// Most requests waiting for a connection.
    pub max_queued: usize,
}

impl Default for Supervision {
    fn default() -> Self {
        Supervision {
            startup_timeout: Duration::from_secs(30),
            health_interval: Duration::from_secs(1),
            health_timeout: Duration::from_secs(1),
            failure_threshold: 3,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            stable_after: Duration::from_secs(30),
            stop_grace: Duration::from_secs(2),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_queued_requests: DEFAULT_MAX_QUEUED_REQUESTS,
        }
    }
}

/// One route a module serves.
#[derive(Debug, Clone)]
pub struct RouteSpec {
    /// The HTTP method (a `GET` route also answers `HEAD`).
    pub method: Method,
    /// The path pattern, aiohttp style: `/api/jobs/{job_id}`.
    pub path: String,
    /// How the host forwards it.
    pub kind: RouteKind,
}

/// How the host forwards a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// A request and a response, with a deadline for the response to start.
    Http,
    /// A long-lived response streamed chunk by chunk, with no deadline.
    Stream,
    /// A websocket, relayed message by message.
    Websocket,
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteKind::Http => "http",
            RouteKind::Stream => "stream",
            RouteKind::Websocket => "websocket",
        })
    }
}

// === raw file format ===

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    module_defaults: RawSupervision,
    modules: Vec<RawModule>,
    ray: RawRay,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRay {
    modules: Option<RayModules>,
    python: Option<String>,
    client_port: Option<u16>,
    gcs_gone_secs: Option<f64>,
    launch: Option<RayLaunch>,
}

/// Only modules: what `routes.py` generates for Ray's modules.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModules {
    #[serde(default)]
    modules: Vec<RawModule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawServer {
    session_dir: Option<PathBuf>,
    host: Option<IpAddr>,
    port: Option<u16>,
    max_request_body_bytes: Option<u64>,
    max_header_bytes: Option<usize>,
    max_websocket_message_bytes: Option<usize>,
    http_response_timeout_secs: Option<f64>,
    shutdown_grace_secs: Option<f64>,
    client_send_timeout_secs: Option<f64>,
    client_body_timeout_secs: Option<f64>,
    worker_threads: Option<usize>,
    allowed_hosts: Option<Vec<String>>,
    allowed_origins: Option<Vec<String>>,
    max_connections: Option<usize>,
    cgroups: Option<CgroupMode>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawSupervision {
    startup_timeout_secs: Option<f64>,
    health_interval_secs: Option<f64>,
    health_timeout_secs: Option<f64>,
    failure_threshold: Option<u32>,
    backoff_initial_secs: Option<f64>,
    backoff_max_secs: Option<f64>,
    stable_after_secs: Option<f64>,
    stop_grace_secs: Option<f64>,
    max_connections: Option<usize>,
    max_queued_requests: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModule {
    name: String,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    supervision: RawSupervision,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    method: String,
    path: String,
    #[serde(rename = "type")]
    kind: RouteKind,
}

/// Paths the host answers itself, as its router (axum's, matchit patterns:
/// `{name}` is one segment, `{*rest}` the rest of the path) writes them. A
/// request is looked up among the module routes first, so no module route
/// may match any of these, whatever its method.
pub const HOST_PATHS: &[&str] = &[
    // ray-dashd's own API (server.rs).
    "/api/healthz",
    "/api/modules",
    "/api/modules/{name}",
    "/api/modules/{name}/restart",
    // ray-dashd's UI, its only place when Ray's own UI is served at `/`.
    "/dashd",
    "/dashd/{*path}",
    // What Ray's dashboard parent serves (when Ray's modules are hosted):
    // its web UI (server.rs) and its own routes (ray/parent.rs).
    "/",
    "/favicon.ico",
    "/static/{*path}",
    crate::ray::parent::GCS_HEALTH_PATH,
    "/timezone",
    "/api/authentication_mode",
    "/api/authenticate",
    "/usage_stats_enabled",
    "/cluster_id",
];

/// Largest request-head size accepted: hyper needs at least 8 KiB.
const MIN_HEADER_BYTES: usize = 8 * 1024;

impl Config {
    /// Reads the file named by `--config` (or the built-in default) and merges
    /// the command line over it.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let (origin, text) = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                (path.display().to_string(), text)
            }
            None => (DEFAULT_CONFIG_NAME.to_owned(), DEFAULT_CONFIG.to_owned()),
        };
        Config::from_toml(&origin, &text, cli)
    }

    /// Parses and validates `text`, which came from `origin` (named in errors).
    pub fn from_toml(origin: &str, text: &str, cli: &Cli) -> Result<Config, ConfigError> {
        let raw: RawConfig = parse(origin, text)?;
        Validator { origin }.validate(raw, cli)
    }

    /// Adds the `[[modules]]` of `text` (from `origin`), checked like the
    /// config file's own and against them: Ray's modules, found at start-up.
    pub fn add_modules_toml(&mut self, origin: &str, text: &str) -> Result<(), ConfigError> {
        let raw: RawModules = parse(origin, text)?;
        let validator = Validator { origin };
        let added = validator.modules(raw.modules, &self.module_defaults, &self.modules)?;
        self.modules.extend(added);
        Ok(())
    }
}

fn parse<T: serde::de::DeserializeOwned>(origin: &str, text: &str) -> Result<T, ConfigError> {
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
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = (0..=offset.min(text.len()))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

struct Validator<'a> {
    origin: &'a str,
}

impl Validator<'_> {
    fn invalid(&self, field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.origin.to_owned(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn validate(&self, raw: RawConfig, cli: &Cli) -> Result<Config, ConfigError> {
        let s = raw.server;
        let defaults = self.supervision(
            "module_defaults",
            &raw.module_defaults,
            &Supervision::default(),
        )?;
        let max_header_bytes = s.max_header_bytes.unwrap_or(64 * 1024);
        if max_header_bytes < MIN_HEADER_BYTES {
            return Err(self.invalid(
                "server.max_header_bytes",
                format!("must be at least {MIN_HEADER_BYTES}"),
            ));
        }
        let server = ServerSettings {
            max_request_body_bytes: s.max_request_body_bytes.unwrap_or(100 * 1024 * 1024),
            max_header_bytes,
            max_websocket_message_bytes: s.max_websocket_message_bytes.unwrap_or(64 * 1024 * 1024),
            http_response_timeout: self.secs(
                "server.http_response_timeout_secs",
                s.http_response_timeout_secs,
                Duration::from_secs(300),
            )?,
            shutdown_grace: self.secs(
                "server.shutdown_grace_secs",
                s.shutdown_grace_secs,
                Duration::from_secs(10),
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
                None => 1,
                Some(0) => return Err(self.invalid("server.worker_threads", "must be at least 1")),
                Some(n) => n,
            },
            allowed_hosts: self.list(
                "server.allowed_hosts",
                s.allowed_hosts,
                crate::guard::allowed_host,
            )?,
            allowed_origins: self.list(
                "server.allowed_origins",
                s.allowed_origins,
                crate::guard::allowed_origin,
            )?,
            // Zero would refuse every client, health checks included.
            max_connections: match s.max_connections {
                Some(0) => return Err(self.invalid("server.max_connections", "must be at least 1")),
                n => n,
            },
            cgroups: s.cgroups.unwrap_or_default(),
        };

        let modules = self.modules(raw.modules, &defaults, &[])?;
        Ok(Config {
            session_dir: cli
                .session_dir
                .clone()
                .or(s.session_dir)
                .unwrap_or_else(|| PathBuf::from(crate::cli::DEFAULT_SESSION_DIR)),
            host: cli.host.or(s.host).unwrap_or(IpAddr::from([127, 0, 0, 1])),
            port: cli.port.or(s.port).unwrap_or(8265),
            server,
            modules,
            module_defaults: defaults,
            ray: RaySettings {
                modules: raw.ray.modules.unwrap_or_default(),
                // Installed by the wheel, the Python of that environment.
                python: raw
                    .ray
                    .python
                    .or_else(|| {
                        crate::wheel::wheel_python().map(|python| python.display().to_string())
                    })
                    .unwrap_or_else(|| RaySettings::default().python),
                client_port: cli
                    .ray_client_port
                    .or(raw.ray.client_port)
                    .unwrap_or(crate::ray::DEFAULT_CLIENT_PORT),
                gcs_gone_after: match self.secs(
                    "ray.gcs_gone_secs",
                    raw.ray.gcs_gone_secs,
                    crate::ray::GCS_GONE_AFTER,
                )? {
                    Duration::ZERO => {
                        return Err(self.invalid("ray.gcs_gone_secs", "must be more than 0"))
                    }
                    after => after,
                },
                launch: raw.ray.launch.unwrap_or_default(),
            },
        })
    }

    /// Validates `raw` modules, which come after `existing` ones.
    fn modules(
        &self,
        raw: Vec<RawModule>,
        defaults: &Supervision,
        existing: &[ModuleSpec],
    ) -> Result<Vec<ModuleSpec>, ConfigError> {
        let mut modules = Vec::with_capacity(raw.len());
        let mut names = HashMap::new();
        // (method, normalized path) -> (module, path as written)
        let mut claimed: HashMap<(Method, String), (String, String)> = HashMap::new();
        for (i, module) in existing.iter().enumerate() {
            names.insert(module.name.clone(), i);
            for route in &module.routes {
                claimed.insert(
                    (route.method.clone(), normalize_pattern(&route.path)),
                    (module.name.clone(), route.path.clone()),
                );
            }
        }
        let host_paths = HostPaths::new();
        for (i, m) in raw.into_iter().enumerate() {
            let at = format!("modules[{i}]");
            if m.name.is_empty()
                || !m
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(self.invalid(
                    format!("{at}.name"),
                    format!("{:?} must match [A-Za-z0-9_-]+", m.name),
                ));
            }
            if let Some(first) = names.insert(m.name.clone(), i) {
                return Err(self.invalid(
                    format!("{at}.name"),
                    format!("{:?} is already the name of modules[{first}]", m.name),
                ));
            }
            let mut command = m.command.into_iter();
            let program = match command.next() {
                Some(p) if !p.is_empty() => p,
                _ => return Err(self.invalid(format!("{at}.command"), "must name a program")),
            };
            for key in m.env.keys() {
                if key.is_empty() || key.contains('=') || key.contains('\0') {
                    return Err(self.invalid(
                        format!("{at}.env"),
                        format!("{key:?} is not a valid variable name"),
                    ));
                }
            }
            let mut routes = Vec::with_capacity(m.routes.len());
            for (j, r) in m.routes.into_iter().enumerate() {
                let rat = format!("{at}.routes[{j}]");
                let method = Method::from_bytes(r.method.to_ascii_uppercase().as_bytes())
                    .map_err(|_| self.invalid(format!("{rat}.method"), "not an HTTP method"))?;
                if r.kind == RouteKind::Websocket && method != Method::GET {
                    return Err(
                        self.invalid(format!("{rat}.method"), "a websocket route must be GET")
                    );
                }
                check_pattern(&r.path).map_err(|p| self.invalid(format!("{rat}.path"), p))?;
                let route = RouteSpec {
                    method,
                    path: r.path,
                    kind: r.kind,
                };
                if let Some(host_path) = host_paths.shadowed_by(&route) {
                    return Err(self.invalid(
                        format!("{rat}.path"),
                        format!(
                            "{} {} of module {:?} would shadow {host_path}, which ray-dashd (host) serves itself",
                            route.method, route.path, m.name
                        ),
                    ));
                }
                let (method, path) = (&route.method, &route.path);
                let key = (method.clone(), normalize_pattern(path));
                if let Some((other, other_path)) = claimed.get(&key) {
                    return Err(self.invalid(
                        format!("{rat}.path"),
                        format!(
                            "{method} {path} is claimed by both {other:?} ({other_path}) and {:?}",
                            m.name
                        ),
                    ));
                }
                claimed.insert(key, (m.name.clone(), path.clone()));
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
            });
        }

        Ok(modules)
    }

    /// Checks each entry of the list `field` with `check`, which gives the
    /// entry's normal form or its problem.
    fn list(
        &self,
        field: &str,
        entries: Option<Vec<String>>,
        check: impl Fn(&str) -> Result<String, String>,
    ) -> Result<Vec<String>, ConfigError> {
        let mut checked: Vec<String> = Vec::new();
        for (i, entry) in entries.unwrap_or_default().iter().enumerate() {
            let normal = check(entry).map_err(|p| self.invalid(format!("{field}[{i}]"), p))?;
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
        };
        // A zero backoff or stable-after time would restart a failing module
        // at once, again and again.
        let positive = [
            ("startup_timeout_secs", s.startup_timeout),
            ("health_interval_secs", s.health_interval),
            ("health_timeout_secs", s.health_timeout),
            ("backoff_initial_secs", s.backoff_initial),
            ("stable_after_secs", s.stable_after),
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
        if s.backoff_max < s.backoff_initial {
            return Err(self.invalid(
                f("backoff_max_secs"),
                "must not be less than backoff_initial_secs",
            ));
        }
        Ok(s)
    }
}

impl ModuleSpec {
    /// The program to execute: a bare `ray-dashd` is the running executable
    /// (the built-in config and Ray's modules start `ray-dashd <builtin>`,
    /// whatever the file is named); another bare name is looked up first
    /// beside the running executable (where the workspace's module binaries
    /// are built), then on `PATH`; a path is used as written.
    pub fn program(&self) -> PathBuf {
        let program = Path::new(&self.program);
        if self.program == crate::builtin::SELF_PROGRAM {
            // Gone when the file was replaced since (an upgrade): then
            // whatever is installed under the name now.
            if let Some(exe) = std::env::current_exe().ok().filter(|exe| exe.is_file()) {
                return exe;
            }
        }
        if program.components().count() == 1 {
            if let Some(dir) = std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(Path::to_path_buf))
            {
                let sibling = dir.join(program);
                if sibling.is_file() {
                    return sibling;
                }
            }
        }
        program.to_path_buf()
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
        let probe = ModuleSpec {
            name: String::new(),
            program: String::new(),
            args: Vec::new(),
            env: BTreeMap::new(),
            routes: vec![route.clone()],
            supervision: Supervision::default(),
        };
        let table = crate::routes::RouteTable::new(std::slice::from_ref(&probe));
        self.0.iter().find_map(|(host_path, matcher)| {
            let path = overlap_probe(&route.path, host_path);
            let shadowed = matcher.at(&path).is_ok()
                && table.lookup(&route.method, &path) != crate::routes::Lookup::NotFound;
            shadowed.then_some(*host_path)
        })
    }
}

/// The path that matches both `pattern` (a module route's) and `host` (a
/// matchit pattern) if any does: `host` with its `{name}` parameters taken
/// from `pattern`'s literal segment at the same place (else `x`), and its
/// `{*rest}` from `pattern`'s remaining segments.
fn overlap_probe(pattern: &str, host: &str) -> String {
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

/// Checks an aiohttp-style path pattern: absolute, `{name}` segments only.
fn check_pattern(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} must start with '/'"));
    }
    for segment in path.split('/') {
        if let Some(inner) = segment.strip_prefix('{') {
            let Some(name) = inner.strip_suffix('}') else {
                return Err(format!(
                    "{path:?}: segment {segment:?} must be a whole {{name}}"
                ));
            };
            let valid = name.bytes().enumerate().all(|(i, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
            });
            if name.is_empty() || !valid {
                return Err(format!(
                    "{path:?}: parameter {segment:?} must be {{name}} with name [A-Za-z_][A-Za-z0-9_]* (regex parameters are not supported)"
                ));
            }
        } else if segment.contains(['{', '}']) {
            return Err(format!(
                "{path:?}: segment {segment:?} mixes text and a parameter"
            ));
        }
    }
    Ok(())
}

/// The pattern with every parameter renamed by position, so that
/// `/a/{x}` and `/a/{y}` count as the same path.
pub(crate) fn normalize_pattern(path: &str) -> String {
    let mut n = 0;
    path.split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                n += 1;
                format!("{{p{n}}}")
            } else {
                segment.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn cli(args: &[&str]) -> Cli {
        let mut argv = vec!["ray-dashd"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv)
    }

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml("test.toml", text, &cli(&[]))
    }

    #[test]
    fn builtin_default_config_is_valid() {
        let config = Config::load(&cli(&[])).expect("default config");
        assert_eq!(config.port, 8265);
        assert_eq!(config.host, IpAddr::from([127, 0, 0, 1]));
        assert_eq!(config.session_dir, PathBuf::from("/tmp/ray/session_latest"));
        assert!(!config.modules.is_empty());
    }

    #[test]
    fn command_line_overrides_file() {
        let text = "[server]\nport = 9000\nhost = \"0.0.0.0\"\n";
        let c = Config::from_toml("t.toml", text, &cli(&["--port", "9100"])).expect("valid");
        assert_eq!(c.port, 9100);
        assert_eq!(c.host, IpAddr::from([0, 0, 0, 0]));
    }

    #[test]
    fn unknown_field_names_file_field_and_problem() {
        let err = load("[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nbogus = 1\n")
            .expect_err("unknown field");
        let msg = err.to_string();
        assert!(msg.contains("test.toml"), "{msg}");
        assert!(msg.contains("modules[0]"), "{msg}");
        assert!(msg.contains("unknown field `bogus`"), "{msg}");
    }

    #[test]
    fn bad_route_type_is_named() {
        let text = "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n[[modules.routes]]\nmethod = \"GET\"\npath = \"/x\"\ntype = \"sse\"\n";
        let msg = load(text).expect_err("bad type").to_string();
        assert!(msg.contains("modules[0].routes[0].type"), "{msg}");
        assert!(msg.contains("sse"), "{msg}");
    }

    #[test]
    fn bad_value_type_is_named() {
        let msg = load("[module_defaults]\nfailure_threshold = \"three\"\n")
            .expect_err("bad value")
            .to_string();
        assert!(msg.contains("module_defaults.failure_threshold"), "{msg}");
    }

    #[test]
    fn duplicate_route_names_both_modules() {
        let text = r#"
[[modules]]
name = "first"
command = ["x"]
routes = [{ method = "GET", path = "/api/jobs/{id}", type = "http" }]
[[modules]]
name = "second"
command = ["y"]
routes = [{ method = "get", path = "/api/jobs/{job}", type = "http" }]
"#;
        let msg = load(text).expect_err("duplicate").to_string();
        assert!(
            msg.contains("\"first\"") && msg.contains("\"second\""),
            "{msg}"
        );
        assert!(msg.contains("modules[1].routes[0].path"), "{msg}");
    }

    #[test]
    fn same_path_other_method_is_allowed() {
        let text = r#"
[[modules]]
name = "a"
command = ["x"]
routes = [{ method = "GET", path = "/api/jobs/", type = "http" }]
[[modules]]
name = "b"
command = ["y"]
routes = [{ method = "POST", path = "/api/jobs/", type = "http" }]
"#;
        assert_eq!(load(text).expect("valid").modules.len(), 2);
    }

    #[test]
    fn module_may_not_claim_host_paths() {
        let text = "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/api/healthz\", type = \"http\" }]\n";
        let msg = load(text).expect_err("host path").to_string();
        assert!(msg.contains("ray-dashd (host)"), "{msg}");
    }

    fn module_with_route(method: &str, path: &str) -> String {
        format!(
            "[[modules]]\nname = \"shadow\"\ncommand = [\"x\"]\nroutes = [{{ method = \"{method}\", path = \"{path}\", type = \"http\" }}]\n"
        )
    }

    #[test]
    fn module_routes_may_not_shadow_host_paths_with_any_method_or_pattern() {
        let cases = [
            ("PUT", "/api/healthz", "/api/healthz"),
            ("DELETE", "/api/healthz", "/api/healthz"),
            ("GET", "/api/{x}", "/api/healthz"),
            ("POST", "/api/{x}", "/api/healthz"),
            ("GET", "/api/modules/{m}", "/api/modules/{name}"),
            ("GET", "/api/modules/logs", "/api/modules/{name}"),
            ("GET", "/api/{a}/{b}", "/api/modules/{name}"),
            (
                "PATCH",
                "/api/{a}/{b}/restart",
                "/api/modules/{name}/restart",
            ),
            ("GET", "/api/gcs_healthz", "/api/gcs_healthz"),
            ("GET", "/{page}", "/dashd"),
            ("GET", "/dashd/{file}", "/dashd/{*path}"),
            ("GET", "/static/js/{file}", "/static/{*path}"),
            ("GET", "/", "/"),
        ];
        for (method, path, host_path) in cases {
            let msg = load(&module_with_route(method, path))
                .expect_err(path)
                .to_string();
            assert!(msg.contains("test.toml"), "{msg}");
            assert!(msg.contains("modules[0].routes[0].path"), "{msg}");
            assert!(msg.contains("\"shadow\""), "{msg}");
            assert!(msg.contains(&format!("{method} {path} ")), "{msg}");
            assert!(msg.contains(&format!("shadow {host_path},")), "{msg}");
            assert!(msg.contains("ray-dashd (host)"), "{msg}");
        }
        for (method, path) in [
            ("GET", "/api/healthz/"),
            ("GET", "/api/healthz/{x}"),
            ("GET", "/api/modules/"),
            ("GET", "/api/{a}/{b}/{c}/{d}"),
            ("POST", "/api/{x}/{y}/stop"),
            ("GET", "/apis/healthz"),
            ("GET", "/dashd-logs"),
        ] {
            load(&module_with_route(method, path)).expect(path);
        }
    }

    /// Every route of Ray 2.60's dashboard modules but the GCS health check
    /// (which `routes.py --omit` leaves out) fits beside the host's paths.
    #[test]
    fn ray_module_routes_do_not_shadow_host_paths() {
        let ray_routes = [
            ("GET", "/api/data/datasets/{job_id}"),
            ("GET", "/api/v0/cluster_events"),
            ("GET", "/events"),
            ("POST", "/report_events"),
            ("GET", "/api/component_activities"),
            ("GET", "/api/jobs/"),
            ("POST", "/api/jobs/"),
            ("DELETE", "/api/jobs/{job_or_submission_id}"),
            ("GET", "/api/jobs/{job_or_submission_id}/logs"),
            ("GET", "/api/jobs/{job_or_submission_id}/logs/tail"),
            ("POST", "/api/jobs/{job_or_submission_id}/stop"),
            ("GET", "/api/packages/{protocol}/{package_name}"),
            ("GET", "/api/version"),
            ("GET", "/api/grafana_health"),
            ("GET", "/logical/actors/{actor_id}"),
            ("GET", "/nodes"),
            ("GET", "/nodes/{node_id}"),
            ("GET", "/test/dump"),
            ("GET", "/api/cluster_status"),
            ("GET", "/api/prometheus/sd"),
            ("GET", "/memory_profile"),
            ("GET", "/worker/traceback"),
            ("GET", "/api/ray/version"),
            ("PUT", "/api/serve/applications/"),
            (
                "POST",
                "/api/v1/applications/{application_name}/deployments/{deployment_name}/scale",
            ),
            ("GET", "/api/v0/delay/{delay_s}"),
            ("GET", "/api/v0/logs/{media_type}"),
            ("POST", "/api/task_events/query"),
            ("GET", "/api/train/v2/runs/v1"),
        ];
        for (method, path) in ray_routes {
            load(&module_with_route(method, path)).expect(path);
        }
    }

    /// The client idle timeouts default to nginx's 60 s, are read in
    /// seconds, and 0 (which would cut every wait) is refused.
    #[test]
    fn client_idle_timeouts_default_to_60_s_and_refuse_0() {
        let c = load("").expect("valid");
        assert_eq!(c.server.client_send_timeout, Duration::from_secs(60));
        assert_eq!(c.server.client_body_timeout, Duration::from_secs(60));
        let c = load("[server]\nclient_send_timeout_secs = 2.5\nclient_body_timeout_secs = 7\n")
            .expect("valid");
        assert_eq!(c.server.client_send_timeout, Duration::from_millis(2500));
        assert_eq!(c.server.client_body_timeout, Duration::from_secs(7));
        for field in ["client_send_timeout_secs", "client_body_timeout_secs"] {
            let msg = load(&format!("[server]\n{field} = 0\n"))
                .expect_err(field)
                .to_string();
            assert_eq!(
                msg,
                format!("config test.toml: server.{field}: must be more than 0")
            );
        }
    }

    #[test]
    fn zero_backoff_or_stable_after_is_refused() {
        let cases = [
            (
                "[module_defaults]\nbackoff_initial_secs = 0\n",
                "module_defaults.backoff_initial_secs",
            ),
            (
                "[module_defaults]\nbackoff_initial_secs = 0\nbackoff_max_secs = 0\n",
                "module_defaults.backoff_initial_secs",
            ),
            (
                "[module_defaults]\nbackoff_initial_secs = 0.0000000001\n",
                "module_defaults.backoff_initial_secs",
            ),
            (
                "[module_defaults]\nstable_after_secs = 0\n",
                "module_defaults.stable_after_secs",
            ),
            (
                "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { backoff_initial_secs = 0 }\n",
                "modules[0].supervision.backoff_initial_secs",
            ),
            (
                "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { stable_after_secs = 0.0 }\n",
                "modules[0].supervision.stable_after_secs",
            ),
        ];
        for (text, field) in cases {
            let msg = load(text).expect_err(text).to_string();
            assert!(msg.contains("test.toml"), "{msg}");
            assert!(msg.contains(field), "{field} not in {msg}");
            assert!(msg.contains("must be greater than zero"), "{msg}");
        }
        let text = "[module_defaults]\nbackoff_initial_secs = 0.01\nstable_after_secs = 0.01\n";
        load(text).expect("small but positive");
    }

    #[test]
    fn syntax_error_names_file_line_and_column() {
        let msg = load("# ports\n[server]\nport = 80 80\n")
            .expect_err("syntax error")
            .to_string();
        assert!(
            msg.starts_with("config test.toml: line 3, column 11: "),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            msg.len() > "config test.toml: line 3, column 11: ".len(),
            "{msg}"
        );
        // A bad value names the field and the place too.
        let msg = load("[server]\nport = \"high\"\n")
            .expect_err("bad port")
            .to_string();
        assert!(
            msg.contains("server.port") && msg.contains("line 2, column 8"),
            "{msg}"
        );
        assert_eq!(line_column("ab\ncé\nd", 6), (2, 3));
        assert_eq!(line_column("ab\ncé\nd", 5), (2, 2));
        assert_eq!(line_column("ab\ncé\nd", 7), (3, 1));
        assert_eq!(line_column("x", 99), (1, 2));
    }

    #[test]
    fn rejects_bad_names_patterns_and_settings() {
        let cases = [
            ("[[modules]]\nname = \"a b\"\ncommand = [\"x\"]\n", "modules[0].name"),
            ("[[modules]]\nname = \"a\"\ncommand = []\n", "modules[0].command"),
            (
                "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n",
                "modules[1].name",
            ),
            (
                "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/x/{id:\\\\d+}\", type = \"http\" }]\n",
                "modules[0].routes[0].path",
            ),
            (
                "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nroutes = [{ method = \"POST\", path = \"/ws\", type = \"websocket\" }]\n",
                "modules[0].routes[0].method",
            ),
            ("[module_defaults]\nfailure_threshold = 0\n", "module_defaults.failure_threshold"),
            ("[module_defaults]\nhealth_timeout_secs = -1\n", "module_defaults.health_timeout_secs"),
            ("[server]\nmax_header_bytes = 100\n", "server.max_header_bytes"),
        ];
        for (text, field) in cases {
            let msg = load(text).expect_err(text).to_string();
            assert!(msg.contains(field), "{field} not in {msg}");
            assert!(msg.contains("test.toml"), "{msg}");
        }
    }

    #[test]
    fn module_supervision_overrides_defaults() {
        let text = r#"
[module_defaults]
failure_threshold = 5
[[modules]]
name = "a"
command = ["x"]
supervision = { health_timeout_secs = 0.25 }
"#;
        let c = load(text).expect("valid");
        let s = &c.modules[0].supervision;
        assert_eq!(s.failure_threshold, 5);
        assert_eq!(s.health_timeout, Duration::from_millis(250));
        assert_eq!(s.health_interval, Duration::from_secs(1));
    }

    #[test]
    fn connection_limits_default_and_are_overridden_per_module() {
        let c = load("[[modules]]\nname = \"a\"\ncommand = [\"x\"]\n").expect("valid");
        let limits = c.modules[0].supervision.connection_limits();
        assert_eq!(limits.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(limits.max_queued, DEFAULT_MAX_QUEUED_REQUESTS);
        let text = r#"
[module_defaults]
max_connections = 10
max_queued_requests = 0
[[modules]]
name = "a"
command = ["x"]
[[modules]]
name = "b"
command = ["x"]
supervision = { max_connections = 2 }
"#;
        let c = load(text).expect("valid");
        let a = c.modules[0].supervision.connection_limits();
        let b = c.modules[1].supervision.connection_limits();
        assert_eq!((a.max_connections, a.max_queued), (10, 0));
        assert_eq!((b.max_connections, b.max_queued), (2, 0));
    }

    #[test]
    fn client_connection_cap_is_derived_unless_set() {
        let c = load("").expect("valid");
        assert_eq!(c.server.max_connections, None);
        assert_eq!(c.server.cgroups, CgroupMode::Auto);
        let c = load("[server]\nmax_connections = 5000\ncgroups = \"off\"\n").expect("valid");
        assert_eq!(c.server.max_connections, Some(5000));
        assert_eq!(c.server.cgroups, CgroupMode::Off);
        let msg = load("[server]\nmax_connections = 0\n")
            .expect_err("zero")
            .to_string();
        assert_eq!(
            msg,
            "config test.toml: server.max_connections: must be at least 1"
        );
        let msg = load("[server]\nmax_connections = -5\n")
            .expect_err("negative")
            .to_string();
        assert!(
            msg.starts_with("config test.toml: server.max_connections: ") && msg.contains("line 2"),
            "{msg}"
        );
        let msg = load("[server]\ncgroups = \"yes\"\n")
            .expect_err("bad mode")
            .to_string();
        assert!(
            msg.starts_with("config test.toml: server.cgroups: ") && msg.contains("auto"),
            "{msg}"
        );
    }

    #[test]
    fn bad_connection_limits_name_file_field_and_problem() {
        let msg = load("[module_defaults]\nmax_connections = 0\n")
            .expect_err("zero")
            .to_string();
        assert_eq!(
            msg,
            "config test.toml: module_defaults.max_connections: must be at least 1"
        );
        let msg = load(
            "[[modules]]\nname = \"a\"\ncommand = [\"x\"]\nsupervision = { max_connections = 0 }\n",
        )
        .expect_err("zero")
        .to_string();
        assert_eq!(
            msg,
            "config test.toml: modules[0].supervision.max_connections: must be at least 1"
        );
        let msg = load("[module_defaults]\nmax_queued_requests = -1\n")
            .expect_err("negative")
            .to_string();
        assert!(
            msg.starts_with("config test.toml: module_defaults.max_queued_requests: ")
                && msg.contains("line 2"),
            "{msg}"
        );
    }

    #[test]
    fn added_modules_are_checked_against_the_files() {
        let mut c = load(
            "[[modules]]\nname = \"mine\"\ncommand = [\"x\"]\nroutes = [{ method = \"GET\", path = \"/api/jobs/\", type = \"http\" }]\n",
        )
        .expect("valid");
        let clash = "[[modules]]\nname = \"JobHead\"\ncommand = [\"py\"]\nroutes = [{ method = \"GET\", path = \"/api/jobs/\", type = \"http\" }]\n";
        let msg = c
            .add_modules_toml("<ray>", clash)
            .expect_err("clash")
            .to_string();
        assert!(
            msg.contains("<ray>") && msg.contains("\"mine\"") && msg.contains("\"JobHead\""),
            "{msg}"
        );
        let same_name = "[[modules]]\nname = \"mine\"\ncommand = [\"py\"]\n";
        assert!(c.add_modules_toml("<ray>", same_name).is_err());
        let fine = "[[modules]]\nname = \"NodeHead\"\ncommand = [\"py\"]\nroutes = [{ method = \"GET\", path = \"/nodes\", type = \"http\" }]\n";
        c.add_modules_toml("<ray>", fine).expect("added");
        assert_eq!(c.modules.len(), 2);
        assert_eq!(c.modules[1].supervision, c.module_defaults);
    }

    #[test]
    fn ray_settings_default_to_auto_with_python3() {
        let c = load("").expect("valid");
        assert_eq!(c.ray, RaySettings::default());
        let c = load("[ray]\nmodules = \"off\"\npython = \"/opt/py\"\n").expect("valid");
        assert_eq!(c.ray.modules, RayModules::Off);
        assert_eq!(c.ray.python, "/opt/py");
        assert_eq!(c.ray.launch, RayLaunch::Fork);
        let c = load("[ray]\nlaunch = \"standalone\"\n").expect("valid");
        assert_eq!(c.ray.launch, RayLaunch::Standalone);
        assert!(load("[ray]\nmodules = \"maybe\"\n").is_err());
        assert_eq!(c.ray.gcs_gone_after, Duration::from_secs(60));
        let c = load("[ray]\ngcs_gone_secs = 2.5\n").expect("valid");
        assert_eq!(c.ray.gcs_gone_after, Duration::from_millis(2500));
        assert!(load("[ray]\ngcs_gone_secs = 0\n").is_err());
        assert!(load("[ray]\nlaunch = \"spawn\"\n").is_err());
    }

    #[test]
    fn normalized_patterns_ignore_parameter_names() {
        assert_eq!(
            normalize_pattern("/a/{x}/b/{y}"),
            normalize_pattern("/a/{id}/b/{z}")
        );
        assert_ne!(normalize_pattern("/a/{x}"), normalize_pattern("/a/x"));
    }
}
