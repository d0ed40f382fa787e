//! Ray's own dashboard modules: when the session is a running Ray head, the
//! Python launcher in `modules/ray/` (built into this binary) runs each of
//! Ray's subprocess modules as a ray-dashd module, and ray-dashd tells Ray's
//! tools where the dashboard is.
//!
//! The route table is not kept here: `routes.py` reads it from the installed
//! Ray at start-up and fails loudly when Ray's internals are not the ones it
//! knows.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tracing::{info, warn};

use crate::config::Config;
use crate::error::StartupError;
use crate::session::Session;

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
/// How long writing the dashboard's address to the GCS may take.
const KV_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the address is written again: Ray's own minimal dashboard
/// writes its (dead) address at start, and a restarted GCS forgets ours.
const KV_REFRESH: Duration = Duration::from_secs(60);

/// When to host Ray's modules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RayLaunch {
    /// Forked from one Python process that preloaded Ray and the module
    /// classes (`zygote.py`), each through a `ray-dashd-fork-shim`; a module
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
    /// The Python that has `ray` installed.
    pub python: String,
    /// How the modules are started.
    pub launch: RayLaunch,
}

impl Default for RaySettings {
    fn default() -> Self {
        RaySettings {
            modules: RayModules::Auto,
            python: "python3".to_owned(),
            launch: RayLaunch::Fork,
        }
    }
}

/// The fork shim's binary, built beside ray-dashd's.
const SHIM: &str = "ray-dashd-fork-shim";

/// The Ray head a session belongs to.
#[derive(Debug, Clone)]
pub struct RayHead {
    /// The GCS address, `host:port`.
    pub gcs_address: String,
    /// Where the launcher's files were written.
    pub launcher_dir: PathBuf,
    /// The Python that has `ray`.
    pub python: String,
    /// What the host serves in place of Ray's dashboard parent, when the
    /// installed Ray could tell (see `head_facts.py`).
    pub parent: Option<RayParent>,
}

/// What Ray's dashboard parent serves itself, for the host to serve.
#[derive(Debug, Clone, Deserialize)]
pub struct RayParent {
    /// Ray's built web UI (`index.html`, `favicon.ico`, `static/`).
    pub ui_dir: PathBuf,
    /// The answer to `GET /timezone`.
    pub timezone: serde_json::Value,
    /// `disabled` or `token`, for `GET /api/authentication_mode`.
    pub authentication_mode: String,
}

/// Adds Ray's modules to `config` when its `[ray]` settings ask for them.
/// Returns the head they belong to, for [`advertise`].
pub fn add_modules(
    config: &mut Config,
    session: &Session,
) -> Result<Option<RayHead>, StartupError> {
    let settings = config.ray.clone();
    if settings.modules == RayModules::Off {
        return Ok(None);
    }
    let Some(gcs_address) = gcs_address(&session.dir) else {
        if settings.modules == RayModules::On {
            return Err(StartupError::Ray(format!(
                "{} is not the session of a running Ray head: no ray_current_cluster beside it",
                session.dir.display()
            )));
        }
        info!(session = %session.dir.display(), "no Ray head found; Ray's modules are not hosted");
        return Ok(None);
    };
    let launcher_dir = write_launcher(session)
        .map_err(|e| StartupError::Ray(format!("cannot write the launcher: {e}")))?;
    let routes = launcher_dir.join("routes.py");
    let mut command = Command::new(&settings.python);
    command
        .arg(&routes)
        .arg("--python")
        .arg(&settings.python)
        .arg("--launcher")
        .arg(launcher_dir.join("launcher.py"));
    if let Some(shim) = shim(settings.launch) {
        command
            .arg("--shim")
            .arg(shim)
            .arg("--zygote")
            .arg(launcher_dir.join("zygote.py"));
    }
    let generated = match run(command, ROUTES_TIMEOUT) {
        Ok(generated) => generated,
        Err(e) if settings.modules == RayModules::Auto => {
            warn!(python = %settings.python, error = %e, "Ray head found, but its modules cannot be hosted");
            return Ok(None);
        }
        Err(e) => return Err(StartupError::Ray(e)),
    };
    let origin = format!(
        "<Ray's modules, from {} {}>",
        settings.python,
        routes.display()
    );
    let before = config.modules.len();
    config.add_modules_toml(&origin, &generated)?;
    info!(
        gcs = %gcs_address,
        modules = config.modules.len() - before,
        "hosting Ray's dashboard modules"
    );
    let mut facts = Command::new(&settings.python);
    facts.arg(launcher_dir.join("head_facts.py"));
    let parent = match run(facts, ROUTES_TIMEOUT).map(|out| serde_json::from_str::<RayParent>(&out))
    {
        Ok(Ok(parent)) if parent.ui_dir.join("index.html").is_file() => Some(parent),
        Ok(Ok(parent)) => {
            warn!(ui = %parent.ui_dir.display(), "Ray's web UI is not in the installed Ray; not served");
            None
        }
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read what Ray's dashboard parent serves; Ray's UI is not served");
            None
        }
        Err(e) => {
            warn!(error = %e, "cannot read what Ray's dashboard parent serves; Ray's UI is not served");
            None
        }
    };
    Ok(Some(RayHead {
        gcs_address,
        launcher_dir,
        python: settings.python,
        parent,
    }))
}

/// Tells Ray's tools (through the GCS key `dashboard`) that the dashboard
/// is at `addr`, now and every [`KV_REFRESH`], until the process ends.
pub async fn advertise(head: RayHead, addr: SocketAddr) {
    let advertised = match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        other => other,
    };
    loop {
        let mut command = Command::new(&head.python);
        command
            .arg(head.launcher_dir.join("dashboard_kv.py"))
            .arg(&head.gcs_address)
            .arg(advertised.to_string());
        match tokio::task::spawn_blocking(move || run(command, KV_TIMEOUT)).await {
            Ok(Ok(_)) => {
                info!(address = %advertised, gcs = %head.gcs_address, "dashboard address written to the GCS")
            }
            Ok(Err(e)) => {
                warn!(gcs = %head.gcs_address, error = %e, "cannot write the dashboard address to the GCS")
            }
            Err(e) => warn!(error = %e, "dashboard address task failed"),
        }
        tokio::time::sleep(KV_REFRESH).await;
    }
}

/// The fork shim to start the modules through, when `launch` asks for
/// forking and the shim is installed beside ray-dashd.
fn shim(launch: RayLaunch) -> Option<PathBuf> {
    if launch == RayLaunch::Standalone {
        return None;
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(SHIM)))
        .filter(|path| path.is_file());
    if beside.is_none() {
        warn!(
            shim = SHIM,
            "the fork shim is not installed beside ray-dashd; Ray's modules start standalone"
        );
    }
    beside
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
    use std::os::unix::fs::DirBuilderExt;
    let dir = session.dir.join("ray_dashd");
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    for (name, text) in FILES {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(dir)
}

/// Runs `command` to completion within `timeout`; its stdout on success,
/// its stderr's last lines in the error otherwise.
fn run(mut command: Command, timeout: Duration) -> Result<String, String> {
    let describe = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {describe}: {e}"))?;
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
                return Err(format!("{describe} did not finish within {timeout:?}"));
            }
            Err(e) => return Err(format!("{describe}: {e}")),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let lines: Vec<&str> = err.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join("\n");
        Err(format!("{describe} failed ({status}): {tail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn failing_command_reports_its_stderr() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo partial; echo 'ray 2.61 differs' >&2; exit 64"]);
        let err = run(command, Duration::from_secs(10)).expect_err("fails");
        assert!(
            err.contains("ray 2.61 differs") && err.contains("64"),
            "{err}"
        );
    }
}
