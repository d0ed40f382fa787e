//! ray-dashd's module API: waiting for a module (or a route) to be ready,
//! and the restart test: SIGKILL the module, time the first 200 through
//! ray-dashd again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::net::{self, Target};
use crate::procfs;

/// Pause between two looks at the module list while waiting for it.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// What to run.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) dashd: SocketAddr,
    pub(crate) module: String,
    pub(crate) path: String,
    pub(crate) poll: Duration,
    pub(crate) timeout: Duration,
}

/// A module's entry in `GET /api/modules`.
#[derive(Debug, Clone)]
struct ModuleInfo {
    state: String,
    pid: Option<u32>,
    incarnation: Option<u64>,
}

async fn module_info(dashd: SocketAddr, module: &str) -> anyhow::Result<ModuleInfo> {
    let (status, body) = net::get_once(&Target::Tcp(dashd), "/api/modules").await?;
    if !status.is_success() {
        anyhow::bail!("GET /api/modules answered {status}");
    }
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(&body).context("GET /api/modules: not a JSON array")?;
    let entry = list
        .iter()
        .find(|m| m["name"] == module)
        .with_context(|| format!("no module named {module:?} in /api/modules"))?;
    Ok(ModuleInfo {
        state: entry["state"].as_str().unwrap_or_default().to_owned(),
        pid: entry["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
        incarnation: entry["incarnation"].as_u64(),
    })
}

/// Waits until `module` is healthy; returns its pid and incarnation.
pub(crate) async fn wait_module(
    dashd: SocketAddr,
    module: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match module_info(dashd, module).await {
            Ok(info) if info.state == "healthy" && info.pid.is_some() => {
                return Ok(json!({ "pid": info.pid, "incarnation": info.incarnation }));
            }
            Ok(info) => last = format!("state {}", info.state),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
    anyhow::bail!("module {module:?} not healthy after {timeout:?}: {last}")
}

/// Waits until GET `path` on `target` answers 200.
pub(crate) async fn wait_http(
    target: &Target,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        match net::get_once(target, path).await {
            Ok((status, _)) if status.is_success() => return Ok(json!({ "ready": true })),
            Ok((status, _)) => last = format!("status {status}"),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
    anyhow::bail!("GET {path} on {target} not 200 after {timeout:?}: {last}")
}

/// SIGKILLs the module's process and polls `path` through ray-dashd every
/// `poll` until it answers 200 again.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    let target = Target::Tcp(plan.dashd);
    let before = module_info(plan.dashd, &plan.module).await?;
    let (Some(pid), "healthy") = (before.pid, before.state.as_str()) else {
        anyhow::bail!("module {:?} is not healthy: {before:?}", plan.module);
    };
    let raw = i32::try_from(pid).context("pid out of range")?;
    let t0 = Instant::now();
    let deadline = t0 + plan.timeout;
    kill(Pid::from_raw(raw), Signal::SIGKILL).with_context(|| format!("kill -9 {pid}"))?;
    // A 200 only counts once the old process is dead (the kill is
    // asynchronous); this takes microseconds and is part of the time.
    while !procfs::is_dead(pid) {
        if Instant::now() >= deadline {
            anyhow::bail!("pid {pid} still alive {:?} after SIGKILL", plan.timeout);
        }
        tokio::task::yield_now().await;
    }
    let mut polls = 0u64;
    let mut statuses = std::collections::BTreeMap::<String, u64>::new();
    let ms_to_200 = loop {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "no 200 from {} within {:?} of the SIGKILL; seen {statuses:?}",
                plan.path,
                plan.timeout
            );
        }
        polls += 1;
        let seen = match net::get_once(&target, &plan.path).await {
            Ok((status, _)) if status.is_success() => {
                break t0.elapsed().as_secs_f64() * 1000.0;
            }
            Ok((status, _)) => status.as_u16().to_string(),
            Err(_) => "error".to_owned(),
        };
        *statuses.entry(seen).or_default() += 1;
        tokio::time::sleep(plan.poll).await;
    };
    let after = module_info(plan.dashd, &plan.module).await?;
    Ok(json!({
        "ms_to_200": ms_to_200,
        "old_pid": pid,
        "new_pid": after.pid,
        "old_incarnation": before.incarnation,
        "new_incarnation": after.incarnation,
        "polls": polls,
        "non_200_seen": statuses,
    }))
}
