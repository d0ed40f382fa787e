//! Start-up time: from a launch (a wall-clock instant the caller took just
//! before starting the server) until every given route answers 200 and,
//! for ray-dashd, every module in `/api/modules` is healthy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::net::{self, Target};

/// Pause between two rounds of polls: the resolution of the measurement.
const POLL: Duration = Duration::from_millis(20);

/// What to wait for.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) target: Target,
    /// Routes that must answer 200.
    pub(crate) paths: Vec<String>,
    /// When set, ray-dashd's `/api/modules` must list at least this many
    /// modules, all healthy.
    pub(crate) modules: Option<usize>,
    /// The launch, in seconds since the Unix epoch (bash: `$EPOCHREALTIME`).
    pub(crate) since: f64,
    pub(crate) timeout: Duration,
}

/// Milliseconds from `since` (seconds since the epoch) to now.
fn ms_since(since: f64) -> f64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    (now - since) * 1000.0
}

/// What `/api/modules` said once every module was healthy.
#[derive(Debug, Clone, Copy)]
struct ModulesReady {
    /// The earliest module start, in ms since the epoch.
    first_started_at_ms: Option<f64>,
    /// Restarts of all modules together.
    restarts: u64,
}

/// Whether `/api/modules` lists at least `min` modules, all up (healthy,
/// or dormant: started on demand, not asked for yet); or what is not yet.
async fn modules_ready(target: &Target, min: usize) -> Result<ModulesReady, String> {
    let (status, body) = net::get_once(target, "/api/modules")
        .await
        .map_err(|e| format!("{e:#}"))?;
    if !status.is_success() {
        return Err(format!("/api/modules answered {status}"));
    }
    let list: Vec<serde_json::Value> =
        serde_json::from_slice(&body).map_err(|e| format!("/api/modules: {e}"))?;
    let not_healthy: Vec<String> = list
        .iter()
        .filter(|m| m["state"] != "healthy" && m["state"] != "dormant")
        .map(|m| format!("{} {}", m["name"], m["state"]))
        .collect();
    if list.len() < min {
        return Err(format!("{} modules listed, {min} expected", list.len()));
    }
    if !not_healthy.is_empty() {
        return Err(format!("not up: {}", not_healthy.join(", ")));
    }
    Ok(ModulesReady {
        first_started_at_ms: list
            .iter()
            .filter_map(|m| m["started_at_ms"].as_f64())
            .reduce(f64::min),
        restarts: list.iter().filter_map(|m| m["restarts"].as_u64()).sum(),
    })
}

/// Polls until everything in the plan is ready:
/// `{ready_ms, routes_ms, paths_ms: {path: ms}, modules_ms,
/// first_module_started_ms, module_restarts, polls}`, where `routes_ms` is
/// the last route's first 200 and `ready_ms` the later of that and
/// `modules_ms`.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    let deadline = Instant::now() + plan.timeout;
    let mut paths_ms: BTreeMap<&str, f64> = BTreeMap::new();
    let mut modules_ms: Option<f64> = None;
    let mut modules: Option<ModulesReady> = None;
    let mut last = String::from("no answer yet");
    let mut polls = 0u64;
    loop {
        polls += 1;
        for path in &plan.paths {
            if paths_ms.contains_key(path.as_str()) {
                continue;
            }
            match net::get_once(&plan.target, path).await {
                Ok((status, _)) if status.is_success() => {
                    paths_ms.insert(path, ms_since(plan.since));
                }
                Ok((status, _)) => last = format!("GET {path}: {status}"),
                Err(e) => last = format!("GET {path}: {e:#}"),
            }
        }
        if let (Some(min), None) = (plan.modules, modules_ms) {
            match modules_ready(&plan.target, min).await {
                Ok(ready) => {
                    modules_ms = Some(ms_since(plan.since));
                    modules = Some(ready);
                }
                Err(e) => last = e,
            }
        }
        let done =
            paths_ms.len() == plan.paths.len() && (plan.modules.is_none() || modules_ms.is_some());
        if done {
            break;
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "not ready {:?} after the launch: {last}; ready so far: {paths_ms:?}",
                plan.timeout
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let routes_ms = paths_ms.values().copied().fold(0.0, f64::max);
    let ready_ms = modules_ms.map_or(routes_ms, |m| m.max(routes_ms));
    Ok(json!({
        "ready_ms": ready_ms,
        "routes_ms": routes_ms,
        "paths_ms": paths_ms,
        "modules_ms": modules_ms,
        // How long the host took before it started its first module.
        "first_module_started_ms": modules
            .and_then(|m| m.first_started_at_ms)
            .map(|at| at - plan.since * 1000.0),
        "module_restarts": modules.map(|m| m.restarts),
        "polls": polls,
    }))
}
