//! Which of Ray's routes answer the same to every client and may be
//! shared (see `proxy::shared`): read-only `GET`s of cluster state that
//! Ray's web UI, `ray list` and `ray status` poll. Matched against the
//! routes Ray's modules declare; one a release lacks is simply not there.
//!
//! Left out on purpose: writes, streams and websockets (never shared);
//! answers about one thing a client waits on (`/api/jobs/{id}`, which
//! `ray job submit` polls for the job's end); profiling, tracebacks and
//! log contents, which start work on a node for one client.

use std::time::Duration;

use crate::config::ModuleSpec;
use crate::routes::RouteKind;

/// The paths (as Ray's modules declare them) of the `GET` routes shared.
pub const SHARED_PATHS: &[&str] = &[
    // The web UI's pages, polled every few seconds by every open tab.
    "/logical/actors",
    "/logical/actors/{actor_id}",
    "/nodes",
    "/nodes/{node_id}",
    "/events",
    "/api/cluster_status",
    "/api/jobs/",
    "/api/component_activities",
    "/api/prometheus_health",
    "/api/grafana_health",
    "/api/serve/applications/",
    "/api/data/datasets/{job_id}",
    "/api/train/v2/runs",
    // The state API (`ray list …`, `ray summary …`, the UI's tables).
    "/api/v0/actors",
    "/api/v0/jobs",
    "/api/v0/nodes",
    "/api/v0/placement_groups",
    "/api/v0/workers",
    "/api/v0/tasks",
    "/api/v0/objects",
    "/api/v0/runtime_envs",
    "/api/v0/cluster_events",
    "/api/v0/logs",
    "/api/v0/tasks/summarize",
    "/api/v0/actors/summarize",
    "/api/v0/objects/summarize",
];

/// Marks the shared routes of Ray's `modules` with `max` (`None`: marks
/// none). Returns how many it marked.
pub fn mark(modules: &mut [ModuleSpec], max: Option<Duration>) -> usize {
    let Some(max) = max else { return 0 };
    let mut marked = 0;
    for route in modules.iter_mut().flat_map(|m| m.routes.iter_mut()) {
        if route.method == http::Method::GET
            && route.kind == RouteKind::Http
            && SHARED_PATHS.contains(&route.path.as_str())
        {
            route.cache = Some(max);
            marked += 1;
        }
    }
    marked
}
