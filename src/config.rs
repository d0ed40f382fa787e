//! The configuration: the TOML file laid over the built-in one, merged with
//! the command line, validated into typed values before anything binds or
//! spawns.
//!
//! The file's format and its layering are in [`raw`] (with the parser,
//! whose errors name the line and column); [`validate`] turns it into the
//! types here; [`effective`] writes them back out as TOML.

mod effective;
pub(crate) mod hosts;
mod raw;
pub mod ray_settings;
mod validate;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cli::Cli;
use crate::error::ConfigError;
use crate::routes::RouteSpec;
pub use crate::session::rotating::{Rotation, DEFAULT_BACKUP_COUNT, DEFAULT_MAX_BYTES};
use raw::{parse, RawConfig, RawModules};
use ray_settings::RaySettings;
use validate::Validator;

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
    /// set, `Host` is checked whatever address is bound (see `server::guard`).
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
    /// How `ray-dashd.log` and the modules' `.out` and `.err` rotate.
    pub log_rotation: Rotation,
    /// The certificate and key the dashboard port serves HTTPS and WSS
    /// with (`server.tls_cert`, `server.tls_key`); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// The path everything is served under (`/` then segments of
    /// unreserved characters, no trailing `/`); empty: `/`.
    pub url_prefix: String,
}

/// The PEM files of the dashboard port's TLS, read at start and again at
/// every SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// The private key of the chain's first certificate (PKCS#8, PKCS#1
    /// or SEC1).
    pub key: PathBuf,
}

/// Whether module incarnations run in cgroups of their own
/// (`server.cgroups`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// Where cgroup v2 is mounted and the host's own cgroup is writable.
    #[default]
    Auto,
    /// Never: descendants are found through `/proc` only, and those in
    /// other sessions outlive a SIGKILL of the host.
    Off,
}

/// When a module's first incarnation starts (`modules[].start`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// With the host (or the reload that adds it).
    #[default]
    AtLaunch,
    /// When the first request for one of its routes arrives; that request
    /// waits for it to be ready (at most `startup_timeout`). Once started,
    /// it is supervised as any other and stays up.
    OnDemand,
}

/// One module: how to start it, how to supervise it and which routes it serves.
#[derive(Debug, Clone, PartialEq)]
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
    /// When its first incarnation starts.
    pub start: Start,
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
    /// Most connections open to one incarnation at once for `http`
    /// exchanges (idle ones included), and for streams and websockets
    /// until their answer has started; at least 1.
    pub max_connections: usize,
    /// Most requests waiting for a connection when all are in use; more
    /// get 503. 0: none wait.
    pub max_queued_requests: usize,
    /// Most streams and websockets open to one incarnation at once, once
    /// answered (they no longer count under `max_connections`); more get
    /// 503 at once. At least 1.
    pub max_long_lived: usize,
    /// How long a module may miss its health checks while it is *busy*
    /// (its processes use CPU, none is stopped) before it counts as hung.
    /// A busy module's missed checks are not failures until then.
    pub busy_max: Duration,
    /// The most resident memory, in bytes, that the module's processes may
    /// hold together; past it the module is restarted. `None`: no budget.
    pub memory_budget: Option<u64>,
    /// How much nicer than the host the module runs (0–19, added to the
    /// host's own nice value, at most 19): with the CPU scarce, the host
    /// (health probes, shared answers) goes first.
    pub nice: i32,
}

// === Defaults ===
//
// What each setting is when neither the file nor the command line names it
// (the `[ray]` settings' are in [`ray_settings`]).

/// Default of `server.host`: loopback, so that the dashboard is reachable
/// from elsewhere only when an address is named.
pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Default of `server.port`: Ray's dashboard port.
pub const DEFAULT_PORT: u16 = 8265;

/// Default of `server.max_request_body_bytes`: 100 MiB.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 100 * 1024 * 1024;

/// Default of `server.max_header_bytes`: 64 KiB.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;

/// Default of `server.max_websocket_message_bytes`: 64 MiB.
pub const DEFAULT_MAX_WEBSOCKET_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Default of `server.http_response_timeout_secs`: how long an `http`
/// route's module may take to start its answer before the client gets 504.
pub const DEFAULT_HTTP_RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

/// Default of `server.shutdown_grace_secs`: how long in-flight requests get
/// after SIGTERM or SIGINT.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Default of `server.worker_threads`: one thread is the cheapest per
/// request when the modules behind need the other cores.
pub const DEFAULT_WORKER_THREADS: usize = 1;

/// Default of `startup_timeout_secs`: how long a new incarnation may take
/// to answer `/api/healthz` with 200.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of `health_interval_secs`: the time between two health checks.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Default of `health_timeout_secs`: a check that takes longer fails.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Default of `failure_threshold`: failed checks in a row that make a
/// ready module unhealthy.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// Default of `backoff_initial_secs`: the delay before the second restart
/// in a row (the first is at once); it doubles with each failure.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(500);

/// Default of `backoff_max_secs`: the cap on the restart delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Default of `stable_after_secs`: healthy uptime after which the failure
/// count (and so the backoff) starts over.
pub const DEFAULT_STABLE_AFTER: Duration = Duration::from_secs(30);

/// Default of `stop_grace_secs`: the time between SIGTERM and SIGKILL.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(2);

/// Connections per module when the config names no number: Ray's own
/// dashboard parent opens at most 100 per module (aiohttp's connector
/// limit), so Ray's modules are used to that much concurrency; and it is
/// below the listen backlog of 128 that aiohttp (and so every Ray module)
/// sets, so the host alone can never fill a module's backlog, where a
/// connect fails at once with EAGAIN.
pub const DEFAULT_MAX_CONNECTIONS: usize = 100;

/// Streams and websockets per module when the config names no number.
/// They do not count under `max_connections` once answered (a followed
/// log or a websocket sits idle for hours; counting it there let 100 of
/// them starve every other request), so this is a separate cap on what
/// they hold: descriptors in the host and the module, and the module's
/// memory. Generous: a thousand browser tabs each following a log, with
/// room to spare; bounded, so a script opening websockets in a loop runs
/// into a 503 rather than the host's open-file limit.
pub const DEFAULT_MAX_LONG_LIVED: usize = 2048;

/// How long a busy module (using CPU, not answering its health checks) is
/// given by default before it counts as hung: Ray's modules on a big
/// cluster block their event loop for seconds building one answer; a loop
/// that never ends is still caught within a minute.
pub const DEFAULT_BUSY_MAX: Duration = Duration::from_secs(60);

/// How much nicer than the host modules run by default. On a big
/// cluster's head the CPU is scarce (the GCS, Ray's modules busy building
/// big answers): measured on 2 cores, the host's one thread, running 1 %
/// of the time, waited 12 times as long as it ran for a CPU, and a health
/// probe's answer took up to 457 ms. Nice 5 gives a module a third of the
/// host's weight.
pub const DEFAULT_NICE: i32 = 5;

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
            max_long_lived: self.max_long_lived,
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
    /// Most streams and websockets open at once.
    pub max_long_lived: usize,
}

impl Default for Supervision {
    fn default() -> Self {
        Supervision {
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            health_interval: DEFAULT_HEALTH_INTERVAL,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            stable_after: DEFAULT_STABLE_AFTER,
            stop_grace: DEFAULT_STOP_GRACE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_queued_requests: DEFAULT_MAX_QUEUED_REQUESTS,
            max_long_lived: DEFAULT_MAX_LONG_LIVED,
            busy_max: DEFAULT_BUSY_MAX,
            memory_budget: None,
            nice: DEFAULT_NICE,
        }
    }
}

/// Largest request-head size accepted: hyper needs at least 8 KiB.
const MIN_HEADER_BYTES: usize = 8 * 1024;

impl Config {
    /// Reads the file named by `--config`, lays it over the built-in config
    /// (see [`Config::from_toml`]), and merges the command line over both.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                Config::from_toml(&path.display().to_string(), &text, cli)
            }
            None => Config::builtin(cli),
        }
    }

    /// The built-in config (`config/default.toml`) with the command line
    /// over it.
    pub fn builtin(cli: &Cli) -> Result<Config, ConfigError> {
        let mut builtin: RawConfig = parse(DEFAULT_CONFIG_NAME, DEFAULT_CONFIG)?;
        let validator = Validator {
            origin: DEFAULT_CONFIG_NAME,
        };
        let modules = builtin.modules.take().unwrap_or_default();
        let mut config = validator.validate(builtin, cli)?;
        config.modules = validator.modules(modules, &config.module_defaults, &[])?;
        Ok(config)
    }

    /// Parses `text`, which came from `origin` (named in errors), and lays
    /// it over the built-in config: each setting it names replaces the
    /// built-in one; the built-in modules are kept, before its own, unless
    /// it declares `[[modules]]` (or says `builtin_modules = false`;
    /// `builtin_modules = true` keeps them beside its own).
    pub fn from_toml(origin: &str, text: &str, cli: &Cli) -> Result<Config, ConfigError> {
        let mut file: RawConfig = parse(origin, text)?;
        let mut builtin: RawConfig = parse(DEFAULT_CONFIG_NAME, DEFAULT_CONFIG)?;
        let builtin_modules = match file.builtin_modules_kept() {
            true => builtin.modules.take().unwrap_or_default(),
            false => Vec::new(),
        };
        let own_modules = file.modules.take().unwrap_or_default();
        // The settings in effect are the file's wherever it names one, so
        // an error in them is the file's to name.
        let validator = Validator { origin };
        let mut config = validator.validate(builtin.overlaid_with(&file), cli)?;
        let builtin_validator = Validator {
            origin: DEFAULT_CONFIG_NAME,
        };
        config.modules =
            builtin_validator.modules(builtin_modules, &config.module_defaults, &[])?;
        let own = validator.modules(own_modules, &config.module_defaults, &config.modules)?;
        config.modules.extend(own);
        Ok(config)
    }

    /// The config as TOML that loads back to the same config: every
    /// setting written out, the modules listed whole and the built-in ones
    /// left out (`builtin_modules = false`). What `--check-config` prints.
    pub fn to_toml(&self) -> String {
        effective::to_toml(self)
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

    /// Adds `modules`, built as values by the host (from `origin`, named in
    /// errors), checked as the config file's own are and against them.
    pub fn add_modules(
        &mut self,
        origin: &str,
        modules: Vec<ModuleSpec>,
    ) -> Result<(), ConfigError> {
        Validator { origin }.specs(&modules, &self.modules)?;
        self.modules.extend(modules);
        Ok(())
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

#[cfg(test)]
mod tests;
