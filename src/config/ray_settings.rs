//! The `[ray]` settings: whether and how Ray's own dashboard modules are
//! hosted. Only the values; what they start is in [`crate::ray`], above.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default of `[ray] gcs_gone_secs`: how long the GCS may stay unreachable
/// before the head counts as gone. Ray's own processes give up on a GCS
/// after the same time (`gcs_rpc_server_reconnect_timeout_s`).
pub const GCS_GONE_AFTER: Duration = Duration::from_secs(60);

/// Default of `[ray] cache_secs`: an answer of one of Ray's polled routes
/// is shared for up to 2 s, the staleness a page polled every second
/// already shows.
pub const DEFAULT_CACHE: Duration = Duration::from_secs(2);

/// Default of `[ray] on_demand`: Ray's modules that do nothing until asked
/// (no background task, no file written at start; checked in Ray 2.45 and
/// 2.60's sources), started by the first request for one of their routes.
/// JobHead's polled job list is the Ray state module's (`native_routes`):
/// JobHead starts with the first job submitted, or the first list the Ray
/// state module declines. StateHead starts with the first state API call
/// (`ray list`, `ray logs`, a page of the web UI that lists state).
pub const DEFAULT_ON_DEMAND: [&str; 5] =
    ["DataHead", "JobHead", "ServeHead", "StateHead", "TrainHead"];

/// [`DEFAULT_ON_DEMAND`] as the setting holds it.
pub(crate) fn default_on_demand() -> Vec<String> {
    DEFAULT_ON_DEMAND.map(String::from).to_vec()
}

/// The port Ray clients connect to (`ray://head:10001`).
pub const DEFAULT_CLIENT_PORT: u16 = 10001;

/// When to host Ray's modules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RayModules {
    /// When the session folder belongs to a Ray head (its temp dir names a
    /// GCS in `ray_current_cluster`) and `python` can import Ray.
    #[default]
    Auto,
    /// Always; a failure to read Ray's routes stops ray-dashd.
    On,
    /// Never.
    Off,
}

/// How Ray's modules are started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RayLaunch {
    /// Forked from one Python process that preloaded Ray and the module
    /// classes (`zygote.py`), each through a `ray-dashd fork-shim`; a module
    /// the zygote cannot fork starts standalone.
    #[default]
    Fork,
    /// Each module its own `python launcher.py <ClassName>`.
    Standalone,
}

/// The `[ray]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaySettings {
    /// When to host Ray's modules.
    pub modules: RayModules,
    /// The Python that has `ray` installed, when one is named; else one is
    /// found at start-up (`ray::python::find`).
    pub python: Option<RayPython>,
    /// The Ray Client proxy's port; 0: no proxy.
    pub client_port: u16,
    /// How long the head's GCS may stay unreachable before ray-dashd stops.
    pub gcs_gone_after: Duration,
    /// How the modules are started.
    pub launch: RayLaunch,
    /// The memory budget of each of Ray's modules (and the Ray Client
    /// proxy), in bytes, unless its own supervision names one.
    pub memory_budget: Option<u64>,
    /// How old a shared answer of Ray's polled routes may be when served
    /// (`crate::ray::shared_routes`); `None`: every request goes to the
    /// module.
    pub cache: Option<Duration>,
    /// Whether the Ray state module (`modules/ray-state`) answers the
    /// routes it can build from the GCS in place of Ray's modules.
    pub native_routes: bool,
    /// Ray's modules (by class name) started by the first request for one
    /// of their routes rather than with the host; names the installed Ray
    /// does not have are left alone.
    pub on_demand: Vec<String>,
}

impl Default for RaySettings {
    fn default() -> Self {
        RaySettings {
            modules: RayModules::Auto,
            python: None,
            client_port: DEFAULT_CLIENT_PORT,
            gcs_gone_after: GCS_GONE_AFTER,
            launch: RayLaunch::Fork,
            memory_budget: None,
            cache: Some(DEFAULT_CACHE),
            native_routes: true,
            on_demand: default_on_demand(),
        }
    }
}

/// A Python for Ray's modules, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RayPython {
    /// The program: a path, or a name looked up on `PATH`.
    pub program: String,
    /// Where it came from, for the log and the UI.
    pub source: PythonSource,
}

/// Where a [`RayPython`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PythonSource {
    /// `--ray-python`.
    Flag,
    /// `RAY_DASHD_RAY_PYTHON`.
    Env,
    /// `[ray] python` of this config file.
    ConfigFile(String),
    /// What a process of the Ray head runs, described.
    Head(String),
    /// The Python of the wheel ray-dashd was installed from.
    Wheel,
    /// `python3` looked up on `PATH`.
    Path,
}

impl fmt::Display for PythonSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PythonSource::Flag => f.write_str("--ray-python"),
            PythonSource::Env => f.write_str("RAY_DASHD_RAY_PYTHON"),
            PythonSource::ConfigFile(file) => write!(f, "[ray] python in {file}"),
            PythonSource::Head(what) => f.write_str(what),
            PythonSource::Wheel => f.write_str("the Python of ray-dashd's wheel"),
            PythonSource::Path => f.write_str("python3 on PATH"),
        }
    }
}
