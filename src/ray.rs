//! Ray's own dashboard modules: when the session is a running Ray head, the
//! Python launcher in `modules/ray/` (built into this binary) runs each of
//! Ray's subprocess modules as a ray-dashd module, and ray-dashd tells Ray's
//! tools where the dashboard is.
//!
//! The route table is not kept here: `routes.py` reads it from the installed
//! Ray at start-up and fails loudly when Ray's internals are not the ones it
//! knows. What Ray's dashboard parent serves itself is in [`parent`], its
//! token check in [`auth`], and the host's own view of the GCS in [`gcs`].

pub mod auth;
pub mod gcs;
pub mod metrics_port;
mod not_hosted;
pub mod parent;
pub mod python;
pub mod ray_state;
pub mod shared_routes;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ray_dashd_tls::RayTls;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::builtin;
use crate::config::ray_settings::{RayLaunch, RayModules, RayPython, RaySettings};
use crate::config::{Config, ModuleSpec, Start, Supervision};
use crate::error::StartupError;
use crate::routes::{RouteKind, RouteSpec};
use crate::session::Session;
use crate::supervisor::EarlyStart;
use auth::Token;
use gcs::{GcsClient, GcsStatus, Watcher};
use not_hosted::{MissingImport, NotHosted, RunError};

impl From<auth::TokenError> for StartupError {
    fn from(error: auth::TokenError) -> StartupError {
        StartupError::TokenAuth(Box::new(error))
    }
}

/// The launcher's files, written to `<session>/ray_dashd/` at start-up.
const FILES: &[(&str, &str)] = &[
    ("dashd_ray.py", include_str!("../modules/ray/dashd_ray.py")),
    ("launcher.py", include_str!("../modules/ray/launcher.py")),
    ("zygote.py", include_str!("../modules/ray/zygote.py")),
    ("routes.py", include_str!("../modules/ray/routes.py")),
    (
        "dashboard_kv.py",
        include_str!("../modules/ray/dashboard_kv.py"),
    ),
    (
        "head_facts.py",
        include_str!("../modules/ray/head_facts.py"),
    ),
];

/// How long reading Ray's route table may take (it imports Ray and the
/// nine module files: about 3 s on 2 cores).
const ROUTES_TIMEOUT: Duration = Duration::from_secs(120);
/// The name of the Ray Client proxy module.
pub const CLIENT_PROXY_MODULE: &str = "ray_client_proxy";

/// The module name of Ray's zygote (not a Ray class name, so its socket is
/// none that a Ray module uses). `routes.py`'s `ZYGOTE_MODULE` is the same:
/// the shims it writes ask the zygote by this name.
pub const ZYGOTE_MODULE: &str = "RayZygote";

/// Where, in the launcher's folder, the zygote writes Ray's modules' config.
const REPORT_FILE: &str = "modules.toml";

/// How often the host looks for the zygote's report.
const REPORT_POLL: Duration = Duration::from_millis(10);

/// The Ray head a session belongs to.
#[derive(Debug, Clone)]
pub struct RayHead {
    /// The GCS address, `host:port`.
    pub gcs_address: String,
    /// What the host serves in place of Ray's dashboard parent.
    pub parent: RayParent,
    /// How long the GCS may stay unreachable before the head counts as gone.
    pub gcs_gone_after: Duration,
    /// Ray's TLS (`RAY_USE_TLS`), for the GCS connection; `None`: off.
    pub tls: Option<RayTls>,
}

/// What Ray's dashboard parent serves itself, for the host to serve.
#[derive(Debug, Clone)]
pub struct RayParent {
    /// The installed Ray's `__version__`.
    pub ray_version: String,
    /// Ray's built web UI (`index.html`, `favicon.ico`, `static/`), when the
    /// installed Ray has it.
    pub ui_dir: Option<PathBuf>,
    /// The answer to `GET /timezone`.
    pub timezone: serde_json::Value,
    /// The cluster's token when Ray's token authentication is on
    /// (`RAY_AUTH_MODE=token`); `None` when it is off.
    pub token: Option<Token>,
    /// For `GET /usage_stats_enabled`.
    pub usage_stats_enabled: bool,
    /// For `GET /usage_stats_enabled`.
    pub usage_stats_prompt_enabled: bool,
    /// The latest GCS check, for `/api/gcs_healthz` and `/cluster_id`.
    pub gcs: GcsStatus,
    /// How Ray's modules mask runtime-env secrets for a browser.
    pub redaction: Redaction,
}

/// How the installed Ray's modules mask runtime-env secrets in what they
/// answer a browser (as `head_facts.py` read it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Redaction {
    /// They do not (before 2.60, or `RAY_DASHBOARD_REDACT_RUNTIME_ENV=0`).
    #[default]
    None,
    /// Each value of these fields becomes `placeholder`.
    Masks {
        /// The runtime env's secret fields.
        fields: Vec<String>,
        /// What replaces each value.
        placeholder: String,
    },
    /// They do, in a way `head_facts.py` could not read.
    Unknown,
}

impl Redaction {
    fn unknown() -> Redaction {
        Redaction::Unknown
    }
}

/// What `head_facts.py` prints, read with Ray's own helpers.
#[derive(Deserialize)]
struct HeadFacts {
    /// `ray.__version__`.
    #[serde(default)]
    ray_version: String,
    /// One line each: this Ray is newer than the newest release ray-dashd
    /// was tested on (its internals passed the checks all the same); token
    /// authentication asked for where this Ray has none.
    #[serde(default)]
    warnings: Vec<String>,
    ui_dir: PathBuf,
    timezone: serde_json::Value,
    authentication_mode: String,
    #[serde(default)]
    k8s_token_auth: bool,
    #[serde(default)]
    auth_token: Option<String>,
    usage_stats_enabled: bool,
    usage_stats_prompt_enabled: bool,
    /// Missing, the masking is unknown: no Ray state module, rather than
    /// one that might show a browser what Ray would mask.
    #[serde(default = "Redaction::unknown")]
    runtime_env_redaction: Redaction,
}

impl RayParent {
    /// Checks `facts` and keeps what the host serves.
    fn from_facts(facts: HeadFacts) -> Result<RayParent, NotHosted> {
        for warning in &facts.warnings {
            warn!(ray_version = %facts.ray_version, "{warning}");
        }
        let token = match facts.authentication_mode.as_str() {
            "disabled" => None,
            "k8s" => return Err(NotHosted::K8sAuthMode),
            "token" if facts.k8s_token_auth => return Err(NotHosted::K8sTokenAuth),
            "token" => Some(
                facts
                    .auth_token
                    .as_deref()
                    .and_then(Token::new)
                    .ok_or(NotHosted::NoToken)?,
            ),
            other => return Err(NotHosted::UnknownAuthMode(other.to_owned())),
        };
        let ui_dir = if facts.ui_dir.join("index.html").is_file() {
            Some(facts.ui_dir)
        } else {
            warn!(ui = %facts.ui_dir.display(), "Ray's web UI is not in the installed Ray; not served");
            None
        };
        Ok(RayParent {
            ray_version: facts.ray_version,
            ui_dir,
            timezone: facts.timezone,
            token,
            usage_stats_enabled: facts.usage_stats_enabled,
            usage_stats_prompt_enabled: facts.usage_stats_prompt_enabled,
            gcs: GcsStatus::default(),
            redaction: facts.runtime_env_redaction,
        })
    }
}

/// What [`add_modules`] found and started.
#[derive(Debug)]
pub struct RayStart {
    /// The head whose modules are hosted, for [`watcher`].
    pub head: Option<RayHead>,
    /// Ray's zygote, when it was started here already (for
    /// [`Supervisor::start`] to take over).
    ///
    /// [`Supervisor::start`]: crate::supervisor::Supervisor::start
    pub early: Option<EarlyStart>,
    /// Whether Ray's modules are hosted and why not, for the UI.
    pub status: RayStatus,
}

/// Whether Ray's modules are hosted, and if not why, in one line: what
/// `GET /api/dashd/status` says under `ray`.
#[derive(Debug, Clone, Serialize)]
pub struct RayStatus {
    /// Whether they are hosted.
    pub state: RayHosting,
    /// What is hosted, or why not and how to fix it.
    pub message: String,
    /// The Python that runs Ray's modules (or the one that failed).
    pub python: Option<String>,
    /// Where that Python came from.
    pub python_source: Option<String>,
    /// The installed Ray's version, when hosted.
    pub ray_version: Option<String>,
}

/// Whether Ray's modules are hosted, as `/api/dashd/status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RayHosting {
    /// `[ray] modules = "off"`.
    Off,
    /// The session is no Ray head's.
    NoHead,
    /// They are hosted.
    Hosted,
    /// The session is a Ray head's, and they cannot be hosted.
    NotHosted,
}

impl RayStart {
    /// Ray's modules not hosted, and why.
    fn unhosted(status: RayStatus) -> RayStart {
        RayStart {
            head: None,
            early: None,
            status,
        }
    }
}

impl RayStatus {
    fn new(state: RayHosting, message: impl Into<String>, python: Option<&RayPython>) -> Self {
        RayStatus {
            state,
            message: message.into(),
            python: python.map(|p| p.program.clone()),
            python_source: python.map(|p| p.source.to_string()),
            ray_version: None,
        }
    }
}

/// Adds Ray's modules to `config` when its `[ray]` settings ask for them.
/// Call within the runtime: the zygote is a tokio child.
pub fn add_modules(config: &mut Config, session: &Session) -> Result<RayStart, StartupError> {
    let settings = config.ray.clone();
    if settings.modules == RayModules::Off {
        return Ok(RayStart::unhosted(RayStatus::new(
            RayHosting::Off,
            "Ray's modules are off ([ray] modules = \"off\")",
            None,
        )));
    }
    let Some(gcs_address) = gcs_address(&session.dir) else {
        let why = format!(
            "{} is not the session of a running Ray head: no ray_current_cluster beside it",
            session.dir.display()
        );
        if settings.modules == RayModules::On {
            return Err(StartupError::Ray(why));
        }
        info!(session = %session.dir.display(), "no Ray head found; Ray's modules are not hosted");
        return Ok(RayStart::unhosted(RayStatus::new(
            RayHosting::NoHead,
            format!("Ray's modules are not hosted: {why}"),
            None,
        )));
    };
    let refuse = Refusal {
        settings: &settings,
        gcs_address: &gcs_address,
    };
    // Read first: with TLS on, nothing of the head can be reached without
    // it, and a bad file is better told before anything starts. Ray's
    // modules and the client proxy inherit the variables and read them too.
    let tls = match RayTls::from_env() {
        Ok(tls) => tls,
        Err(e) => return refuse.not_hosted(None, e.to_string()),
    };
    if let Some(tls) = &tls {
        info!(
            cert = %tls.cert_path().display(),
            ca = %tls.ca_path().display(),
            "Ray's TLS is on (RAY_USE_TLS): mutual TLS to the GCS"
        );
    }
    let python = match &settings.python {
        Some(named) => named.clone(),
        None => match python::find(&session.dir) {
            Ok(found) => found,
            Err(tried) => return refuse.not_hosted(None, python::not_found(&tried)),
        },
    };
    info!(python = %python.program, source = %python.source, "the Python for Ray's modules");
    let read = match read_head(config, session, &settings, &python)? {
        Ok(read) => read,
        Err(why) => return refuse.not_hosted(Some(&python), format!("{why}{}", why.fix())),
    };
    host_modules(config, &settings, gcs_address, &python, tls, read)
}

/// How a head found but not hosted is answered: with `[ray] modules =
/// "auto"`, a warning and the status that says why; with `"on"`, an error
/// that stops the start. One line, whatever failed: what was tried, what
/// went wrong, the fix.
struct Refusal<'a> {
    settings: &'a RaySettings,
    gcs_address: &'a str,
}

impl Refusal<'_> {
    fn not_hosted(
        &self,
        python: Option<&RayPython>,
        why: String,
    ) -> Result<RayStart, StartupError> {
        let gcs_address = self.gcs_address;
        let line = match python {
            Some(python) => format!(
                "Ray head found (GCS {gcs_address}), but its modules cannot be hosted with \
                 {} ({}): {why}",
                python.program, python.source,
            ),
            None => format!(
                "Ray head found (GCS {gcs_address}), but its modules cannot be hosted: {why}"
            ),
        };
        if self.settings.modules == RayModules::Auto {
            warn!("{line}");
            Ok(RayStart::unhosted(RayStatus::new(
                RayHosting::NotHosted,
                line,
                python,
            )))
        } else {
            Err(StartupError::Ray(line))
        }
    }
}

/// What `python` tells of the head: Ray's own facts (its version, token,
/// UI) and the config of Ray's modules, read by Ray's zygote (in fork mode,
/// which keeps running) or by `routes.py`.
struct HeadRead {
    parent: RayParent,
    /// What the config's errors name as the source of Ray's modules.
    origin: String,
    /// Their `[[modules]]`, as TOML.
    toml: String,
    /// The running zygote, in fork mode.
    zygote: Option<EarlyStart>,
}

/// Runs the launcher's scripts with `python` (the facts and the routes at
/// once: both import Ray, most of their time): what they read, or why
/// Ray's modules cannot be hosted. The outer error stops the start.
fn read_head(
    config: &Config,
    session: &Session,
    settings: &RaySettings,
    python: &RayPython,
) -> Result<Result<HeadRead, NotHosted>, StartupError> {
    let launcher_dir = write_launcher(session)
        .map_err(|e| StartupError::Ray(format!("cannot write the launcher: {e}")))?;
    let mut facts = Command::new(&python.program);
    facts.arg(launcher_dir.join("head_facts.py"));
    // `routes.py`'s options, for it or for the zygote's report.
    let mut routes_args: Vec<std::ffi::OsString> = vec![
        "--python".into(),
        python.program.clone().into(),
        "--launcher".into(),
        launcher_dir.join("launcher.py").into(),
        // The host answers it from its cached check (see `gcs`).
        "--omit".into(),
        crate::routes::host::GCS_HEALTH_PATH.into(),
    ];
    let routes = launcher_dir.join("routes.py");
    let facts = std::thread::spawn(move || run(facts, ROUTES_TIMEOUT));
    let fork = settings.launch == RayLaunch::Fork;
    let origin = if fork {
        format!(
            "<Ray's modules, reported by Ray's zygote to {}>",
            launcher_dir.join(REPORT_FILE).display()
        )
    } else {
        format!(
            "<Ray's modules, from {} {}>",
            python.program,
            routes.display()
        )
    };
    let ray_routes = if fork {
        // This binary, run as `ray-dashd fork-shim` (see `builtin`): it is
        // always there, so forking never falls back for want of a shim.
        routes_args.extend([
            "--shim".into(),
            builtin::SELF_PROGRAM.into(),
            "--shim-arg".into(),
            builtin::FORK_SHIM.into(),
        ]);
        zygote_routes(
            config,
            session,
            &python.program,
            &launcher_dir,
            &routes_args,
        )?
    } else {
        let mut command = Command::new(&python.program);
        command.arg(&routes).args(&routes_args);
        match run(command, ROUTES_TIMEOUT) {
            Ok(toml) => RayRoutes::Read { toml, zygote: None },
            Err(why) => RayRoutes::Failed(why.into()),
        }
    };
    let facts = facts
        .join()
        .map_err(|_| NotHosted::FactsRunnerPanicked)
        .and_then(|ran| ran.map_err(NotHosted::from));
    // What the parent serves first: without it (a token that cannot be
    // read, say) the modules must not be exposed at all.
    let parent = match facts.and_then(|out| {
        let facts = serde_json::from_str::<HeadFacts>(&out).map_err(NotHosted::NoFacts)?;
        RayParent::from_facts(facts)
    }) {
        Ok(parent) => parent,
        Err(e) => return Ok(Err(e)),
    };
    Ok(match ray_routes {
        RayRoutes::Read { toml, zygote } => Ok(HeadRead {
            parent,
            origin,
            toml,
            zygote,
        }),
        RayRoutes::Failed(why) => Err(why),
    })
}

/// Has those of Ray's `modules` that `names` lists start on demand (never
/// the zygote, which the others are forked from); returns their names (a
/// release without one of them is not an error).
fn start_on_demand(modules: &mut [ModuleSpec], names: &[String]) -> Vec<String> {
    let mut started = Vec::new();
    for module in modules {
        if names.contains(&module.name) && module.name != ZYGOTE_MODULE {
            module.start = Start::OnDemand;
            started.push(module.name.clone());
        }
    }
    started
}

/// Adds Ray's modules as `read` found them to `config` (with `[ray]`'s
/// memory budget and shared answers), and the Ray Client proxy unless
/// `[ray] client_port` is 0.
fn host_modules(
    config: &mut Config,
    settings: &RaySettings,
    gcs_address: String,
    python: &RayPython,
    tls: Option<RayTls>,
    read: HeadRead,
) -> Result<RayStart, StartupError> {
    let HeadRead {
        parent,
        origin,
        toml,
        zygote,
    } = read;
    let before = config.modules.len();
    config.add_modules_toml(&origin, &toml)?;
    if let Some(budget) = settings.memory_budget {
        for module in &mut config.modules[before..] {
            module.supervision.memory_budget = Some(budget);
        }
    }
    let on_demand = start_on_demand(&mut config.modules[before..], &settings.on_demand);
    let shared = shared_routes::mark(&mut config.modules[before..], settings.cache);
    let supervision = Supervision {
        memory_budget: settings
            .memory_budget
            .or(config.module_defaults.memory_budget),
        ..config.module_defaults.clone()
    };
    let native = if settings.native_routes {
        ray_state::take_routes(
            &mut config.modules[before..],
            &ray_state::Launch {
                gcs_address: &gcs_address,
                token_auth: parent.token.is_some(),
                redaction: &parent.redaction,
            },
            supervision.clone(),
        )
    } else {
        Err(ray_state::Skipped::Off)
    };
    match native {
        Ok(spec) => {
            let routes: Vec<&str> = spec.routes.iter().map(|r| r.path.as_str()).collect();
            info!(
                ?routes,
                "Ray's routes answered from the GCS (the Ray state module)"
            );
            config.add_modules("<the Ray state module>", vec![spec])?;
        }
        Err(why) => info!(reason = %why, "no Ray state module"),
    }
    info!(
        gcs = %gcs_address,
        ray_version = %parent.ray_version,
        modules = config.modules.len() - before,
        token_auth = parent.token.is_some(),
        tls = tls.is_some(),
        shared_routes = shared,
        ?on_demand,
        "hosting Ray's dashboard modules"
    );
    if settings.client_port != 0 {
        let proxy = client_proxy_spec(
            &config.host.to_string(),
            settings.client_port,
            &gcs_address,
            &python.program,
            parent.token.is_some(),
            supervision,
        );
        config.add_modules("<the Ray Client proxy>", vec![proxy])?;
        info!(port = settings.client_port, "hosting the Ray Client proxy");
    }
    let mut status = RayStatus::new(
        RayHosting::Hosted,
        format!(
            "hosting Ray {}'s dashboard modules (GCS {gcs_address})",
            parent.ray_version
        ),
        Some(python),
    );
    status.ray_version = Some(parent.ray_version.clone());
    let head = RayHead {
        gcs_address,
        parent,
        gcs_gone_after: settings.gcs_gone_after,
        tls,
    };
    Ok(RayStart {
        head: Some(head),
        early: zygote,
        status,
    })
}

/// What reading Ray's route table gave.
// Made once, at start-up: the zygote is moved, not boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum RayRoutes {
    /// The config of Ray's modules, as TOML; with the zygote when it
    /// reported them (its own config first), to take over as a module.
    Read {
        /// The `[[modules]]` to add.
        toml: String,
        /// The running zygote, in fork mode.
        zygote: Option<EarlyStart>,
    },
    /// Why not (the zygote's or `routes.py`'s failure, with the end of its
    /// stderr): Ray's modules cannot be hosted.
    Failed(NotHosted),
}

/// Starts Ray's zygote (`zygote.py`, module [`ZYGOTE_MODULE`]) at once and
/// has it report the route table of the modules it preloaded: it imports
/// them anyway, so Ray is imported once rather than twice before the first
/// module can start. Gives the config of the zygote and of Ray's modules
/// (forked from it through the shim) with the running zygote, or why there
/// is none (when the zygote exits without a report, say); `Err` only for
/// what stops ray-dashd whatever `[ray] modules` says.
fn zygote_routes(
    config: &Config,
    session: &Session,
    python: &str,
    launcher_dir: &Path,
    routes_args: &[std::ffi::OsString],
) -> Result<RayRoutes, StartupError> {
    let report = launcher_dir.join(REPORT_FILE);
    match std::fs::remove_file(&report) {
        Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
            return Ok(RayRoutes::Failed(NotHosted::RemoveReport {
                path: report,
                source,
            }))
        }
        _ => {}
    }
    let mut command: Vec<String> = vec![
        python.to_owned(),
        path_str(&launcher_dir.join("zygote.py")),
        "--app".to_owned(),
        path_str(&launcher_dir.join("launcher.py")),
        "--report".to_owned(),
        path_str(&report),
    ];
    for arg in routes_args {
        command.push("--report-arg".to_owned());
        command.push(arg.to_string_lossy().into_owned());
    }
    let quote = |s: &str| serde_json::to_string(s).expect("UNWRAP: a string serializes");
    let zygote_toml = format!(
        "# Preloads Ray and its modules once, reports their routes; the modules are forked from it.\n\
         [[modules]]\nname = {name}\ncommand = [{command}]\nroutes = []\n\n",
        name = quote(ZYGOTE_MODULE),
        command = command.iter().map(|a| quote(a)).collect::<Vec<_>>().join(", "),
    );
    let origin = "<Ray's zygote>";
    let mut scratch = config.clone();
    scratch.add_modules_toml(origin, &zygote_toml)?;
    let spec = scratch
        .modules
        .last()
        .expect("UNWRAP: the zygote was just added");
    Session::check_socket_path(&session.socket_path(&spec.name))?;
    let mut zygote = match EarlyStart::spawn(spec, session) {
        Ok(zygote) => zygote,
        Err(source) => {
            return Ok(RayRoutes::Failed(NotHosted::StartZygote {
                python: python.to_owned(),
                source,
            }))
        }
    };
    let deadline = Instant::now() + ROUTES_TIMEOUT;
    loop {
        // The zygote renames the report into place when it is whole.
        match std::fs::read_to_string(&report) {
            Ok(text) => {
                return Ok(RayRoutes::Read {
                    toml: zygote_toml + &text,
                    zygote: Some(zygote),
                })
            }
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                return Ok(RayRoutes::Failed(NotHosted::ReadReport {
                    path: report,
                    source,
                }))
            }
            Err(_) => {}
        }
        if let Some(status) = zygote.try_exit() {
            // Its last line is the exception (a traceback ends with it);
            // the rest stays in its log.
            let tail = zygote.stderr_tail(session, 5);
            let last_line = last_line(&tail);
            return Ok(RayRoutes::Failed(NotHosted::ZygoteExited {
                command: command.join(" "),
                status,
                last_line: last_line.to_owned(),
                missing: MissingImport::from_traceback(last_line),
                log: session
                    .log_dir
                    .file_path(&format!("dashboard_{ZYGOTE_MODULE}.err")),
            }));
        }
        if Instant::now() >= deadline {
            return Ok(RayRoutes::Failed(NotHosted::ZygoteSilent {
                within: ROUTES_TIMEOUT,
            }));
        }
        std::thread::sleep(REPORT_POLL);
    }
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The Ray Client proxy as a module: `ray://<host>:<port>` clients, each
/// with a Ray client server of its own (`modules/client-proxy`), supervised
/// as `supervision` says.
///
/// `token_auth` is Ray's own verdict (from `head_facts.py`), passed on as
/// `RAY_AUTH_MODE`: a release without token authentication (before 2.52)
/// ignores a `RAY_AUTH_MODE=token` in the environment, so its clients send
/// no token and the proxy must not ask for one.
fn client_proxy_spec(
    host: &str,
    port: u16,
    gcs_address: &str,
    python: &str,
    token_auth: bool,
    supervision: Supervision,
) -> ModuleSpec {
    let mode = if token_auth { "token" } else { "disabled" };
    ModuleSpec {
        name: CLIENT_PROXY_MODULE.to_owned(),
        program: builtin::SELF_PROGRAM.to_owned(),
        args: [
            builtin::CLIENT_PROXY,
            "--host",
            host,
            "--ray-client-port",
            &port.to_string(),
            "--gcs-address",
            gcs_address,
            "--python",
            python,
        ]
        .map(str::to_owned)
        .to_vec(),
        env: [("RAY_AUTH_MODE".to_owned(), mode.to_owned())].into(),
        routes: vec![RouteSpec {
            method: http::Method::GET,
            path: "/api/client_proxy/clients".to_owned(),
            kind: RouteKind::Http,
            cache: None,
            fallback: None,
        }],
        supervision,
        start: Start::AtLaunch,
    }
}

/// The checker of `head`'s GCS for a dashboard bound to `bound`: it keeps
/// `head.parent.gcs` current, writes the dashboard's address to the GCS
/// keys `dashboard` and `webui:url` (as `https://host:port` when it serves
/// `https`, with its `url_prefix`), and ends when the head is gone.
pub fn watcher(
    head: &RayHead,
    bound: SocketAddr,
    https: bool,
    url_prefix: &str,
) -> Result<Watcher<GcsClient>, StartupError> {
    let client = GcsClient::new(
        &head.gcs_address,
        head.parent.token.as_ref(),
        head.tls.as_ref(),
    )
    .map_err(|e| StartupError::Ray(e.to_string()))?;
    Ok(Watcher::new(
        client,
        head.gcs_address.clone(),
        gcs::advertised_url(bound, &head.gcs_address, https, url_prefix),
        head.gcs_gone_after,
        head.parent.gcs.clone(),
    ))
}

/// The GCS address of the head `session` belongs to: Ray writes it to
/// `<temp dir>/ray_current_cluster`, and the session folder is
/// `<temp dir>/session_*` (or the `session_latest` link to it).
fn gcs_address(session: &Path) -> Option<String> {
    let real = std::fs::canonicalize(session).ok()?;
    let pointer = real.parent()?.join("ray_current_cluster");
    let text = std::fs::read_to_string(pointer).ok()?;
    let address = text.lines().next()?.trim();
    (!address.is_empty()).then(|| address.to_owned())
}

fn write_launcher(session: &Session) -> std::io::Result<PathBuf> {
    let dir = session.dir.join("ray_dashd");
    crate::session::private_dir(&dir)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    for (name, text) in FILES {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(dir)
}

/// The last line of `text` that says something: the exception of a Python
/// traceback.
fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty())
        .unwrap_or("(no output)")
}

/// Runs `command` to completion within `timeout`; its stdout on success,
/// its stderr's last line in the error otherwise.
fn run(mut command: Command, timeout: Duration) -> Result<String, RunError> {
    // The program, and each argument that is a path by its file name.
    let describe = std::iter::once(command.get_program().to_string_lossy().into_owned())
        .chain(command.get_args().map(|arg| {
            let path = Path::new(arg);
            match path.file_name() {
                Some(name) if path.components().count() > 1 => name.to_string_lossy().into_owned(),
                _ => arg.to_string_lossy().into_owned(),
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| RunError::Spawn {
            command: describe.clone(),
            source,
        })?;
    let mut stdout = child.stdout.take().expect("UNWRAP: stdout is piped");
    let mut stderr = child.stderr.take().expect("UNWRAP: stderr is piped");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::TimedOut {
                    command: describe,
                    within: timeout,
                });
            }
            Err(source) => {
                return Err(RunError::Wait {
                    command: describe,
                    source,
                })
            }
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let last_line = last_line(&err);
        Err(RunError::Failed {
            command: describe,
            status,
            missing: MissingImport::from_traceback(last_line),
            last_line: last_line.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `head_facts.py`'s word on masking is read as it says; without one,
    /// the masking is unknown (and no Ray state module is hosted).
    #[test]
    fn the_masking_facts_are_read_and_fail_closed() {
        let facts = |extra: &str| -> Redaction {
            let text = format!(
                r#"{{"ui_dir": "/x", "timezone": {{}}, "authentication_mode": "disabled",
                "usage_stats_enabled": false, "usage_stats_prompt_enabled": false{extra}}}"#
            );
            serde_json::from_str::<HeadFacts>(&text)
                .expect("facts")
                .runtime_env_redaction
        };
        assert_eq!(facts(""), Redaction::Unknown);
        assert_eq!(
            facts(r#", "runtime_env_redaction": {"kind": "none"}"#),
            Redaction::None
        );
        assert_eq!(
            facts(
                r#", "runtime_env_redaction": {"kind": "masks", "fields": ["env_vars"], "placeholder": "<redacted>"}"#
            ),
            Redaction::Masks {
                fields: vec!["env_vars".to_owned()],
                placeholder: "<redacted>".to_owned()
            }
        );
    }

    /// The Ray Client proxy runs as `ray-dashd client-proxy` with the
    /// head's address and Python, Ray's token verdict in `RAY_AUTH_MODE`,
    /// and serves its clients' list.
    #[test]
    fn the_client_proxy_module_is_this_binary_with_the_heads_facts() {
        let supervision = Supervision {
            stop_grace: Duration::from_secs(7),
            ..Supervision::default()
        };
        let spec = client_proxy_spec(
            "127.0.0.1",
            10001,
            "10.0.0.1:6379",
            "/venv/bin/python",
            true,
            supervision.clone(),
        );
        assert_eq!(spec.name, CLIENT_PROXY_MODULE);
        assert_eq!(spec.program, builtin::SELF_PROGRAM);
        assert_eq!(
            spec.args,
            [
                "client-proxy",
                "--host",
                "127.0.0.1",
                "--ray-client-port",
                "10001",
                "--gcs-address",
                "10.0.0.1:6379",
                "--python",
                "/venv/bin/python",
            ]
        );
        assert_eq!(spec.env["RAY_AUTH_MODE"], "token");
        assert_eq!(spec.env.len(), 1);
        let [route] = spec.routes.as_slice() else {
            panic!("one route: {:?}", spec.routes);
        };
        assert_eq!(
            (&route.method, route.path.as_str(), route.kind),
            (
                &http::Method::GET,
                "/api/client_proxy/clients",
                RouteKind::Http
            )
        );
        assert_eq!(spec.supervision, supervision);
        let off = client_proxy_spec("::1", 1, "g", "p", false, Supervision::default());
        assert_eq!(off.env["RAY_AUTH_MODE"], "disabled");
    }

    #[test]
    fn finds_gcs_through_the_session_link() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = tmp.path().join("session_2026_1");
        std::fs::create_dir(&real).expect("mkdir");
        std::os::unix::fs::symlink("session_2026_1", tmp.path().join("session_latest"))
            .expect("link");
        assert_eq!(gcs_address(&tmp.path().join("session_latest")), None);
        std::fs::write(tmp.path().join("ray_current_cluster"), "127.0.0.1:6390\n").expect("write");
        assert_eq!(
            gcs_address(&tmp.path().join("session_latest")).as_deref(),
            Some("127.0.0.1:6390")
        );
    }

    #[test]
    fn a_failure_is_one_line_with_the_fix_when_there_is_one() {
        let traceback = "Traceback (most recent call last):\n  File \"x\", line 1\nModuleNotFoundError: No module named 'ray'\n\n";
        assert_eq!(
            last_line(traceback),
            "ModuleNotFoundError: No module named 'ray'"
        );
        assert_eq!(last_line(""), "(no output)");
        assert_eq!(
            MissingImport::from_traceback(last_line(traceback)),
            Some(MissingImport::Ray)
        );
    }

    #[test]
    fn failing_command_reports_its_stderr() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo partial; echo 'ray 2.61 differs' >&2; exit 64"]);
        let err = run(command, Duration::from_secs(10))
            .expect_err("fails")
            .to_string();
        assert!(
            err.contains("ray 2.61 differs") && err.contains("64"),
            "{err}"
        );
    }
}
