//! The host's own routes, declared once: every path ray-dashd answers
//! itself, and what answers it. The server's router and Ray's parent routes
//! are built from [`HOST_ROUTES`], and the config keeps module routes off
//! [`HOST_PATHS`], derived from it: a request is looked up among the
//! module routes first, so no module route may match any of these paths,
//! whatever its method.

/// Where the host's own status beyond its modules is, for the UI's overview.
pub const STATUS_PATH: &str = "/api/dashd/status";

/// Where the host answers the GCS health check (Ray's ReportHead route,
/// left out of ReportHead's routes when the host serves it).
pub const GCS_HEALTH_PATH: &str = "/api/gcs_healthz";

/// One path the host answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRoute {
    /// The path as axum's router (matchit) writes it: `{name}` is one
    /// segment, `{*path}` the rest of the path.
    pub path: &'static str,
    /// What answers it.
    pub handler: HostHandler,
}

/// What answers a host route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostHandler {
    /// ray-dashd's own API, always served.
    Api(ApiRoute),
    /// ray-dashd's UI, built into the binary: served by the router's
    /// fallback, which serves the UI's files wherever no route claims the
    /// path; these are the UI's only place when Ray's own UI takes `/`.
    Ui,
    /// Ray's web UI, from the installed Ray: served when Ray's modules are
    /// hosted and that Ray has it (else the fallback serves ray-dashd's).
    RayUi(RayUiRoute),
    /// What Ray's dashboard parent serves itself: served when Ray's
    /// modules are hosted.
    RayParent(ParentRoute),
}

/// A route of ray-dashd's own API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiRoute {
    /// `GET`: `success`, while the host serves.
    Healthz,
    /// `GET`: every module's report.
    Modules,
    /// `GET`: one module's report.
    Module,
    /// `POST`: restart one module.
    RestartModule,
    /// `GET`: the host's own status (whether Ray's modules are hosted).
    Status,
    /// `POST`: read the config again and apply its modules.
    Reload,
    /// `GET`: the host's metrics, in Prometheus text format.
    Metrics,
}

/// Where the host's metrics are (not public in token mode).
pub const METRICS_PATH: &str = "/metrics";

/// Where `POST` reloads the config (as SIGHUP does).
pub const RELOAD_PATH: &str = "/api/reload";

/// A part of Ray's web UI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RayUiRoute {
    /// Its `index.html`, at `/`.
    Index,
    /// Its `favicon.ico`.
    Favicon,
    /// Its `static/` folder.
    Static,
}

/// A route Ray's dashboard parent answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentRoute {
    /// `GET`: the cached GCS check.
    GcsHealth,
    /// `GET`: the head's time zone.
    Timezone,
    /// `GET`: whether token authentication is on.
    AuthenticationMode,
    /// `POST`: the token login, setting Ray's cookie.
    Authenticate,
    /// `GET`: Ray's usage stats settings.
    UsageStatsEnabled,
    /// `GET`: the cluster's id.
    ClusterId,
}

/// Every path the host answers itself.
pub const HOST_ROUTES: &[HostRoute] = &[
    route("/api/healthz", HostHandler::Api(ApiRoute::Healthz)),
    route("/api/modules", HostHandler::Api(ApiRoute::Modules)),
    route("/api/modules/{name}", HostHandler::Api(ApiRoute::Module)),
    route(
        "/api/modules/{name}/restart",
        HostHandler::Api(ApiRoute::RestartModule),
    ),
    route(STATUS_PATH, HostHandler::Api(ApiRoute::Status)),
    route(RELOAD_PATH, HostHandler::Api(ApiRoute::Reload)),
    route("/dashd", HostHandler::Ui),
    route("/dashd/{*path}", HostHandler::Ui),
    route("/", HostHandler::RayUi(RayUiRoute::Index)),
    route("/favicon.ico", HostHandler::RayUi(RayUiRoute::Favicon)),
    route("/static/{*path}", HostHandler::RayUi(RayUiRoute::Static)),
    route(
        GCS_HEALTH_PATH,
        HostHandler::RayParent(ParentRoute::GcsHealth),
    ),
    route("/timezone", HostHandler::RayParent(ParentRoute::Timezone)),
    route(
        "/api/authentication_mode",
        HostHandler::RayParent(ParentRoute::AuthenticationMode),
    ),
    route(
        "/api/authenticate",
        HostHandler::RayParent(ParentRoute::Authenticate),
    ),
    route(
        "/usage_stats_enabled",
        HostHandler::RayParent(ParentRoute::UsageStatsEnabled),
    ),
    route(
        "/cluster_id",
        HostHandler::RayParent(ParentRoute::ClusterId),
    ),
    route(METRICS_PATH, HostHandler::Api(ApiRoute::Metrics)),
];

const fn route(path: &'static str, handler: HostHandler) -> HostRoute {
    HostRoute { path, handler }
}

/// The paths of [`HOST_ROUTES`], which no module route may match.
pub const HOST_PATHS: [&str; HOST_ROUTES.len()] = {
    let mut paths = [""; HOST_ROUTES.len()];
    let mut i = 0;
    while i < HOST_ROUTES.len() {
        paths[i] = HOST_ROUTES[i].path;
        i += 1;
    }
    paths
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The reserved list is the table's paths, in its order, each once.
    #[test]
    fn host_paths_are_the_tables_paths() {
        let from_table: Vec<&str> = HOST_ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(HOST_PATHS.as_slice(), from_table.as_slice());
        for (i, path) in HOST_PATHS.iter().enumerate() {
            assert!(!HOST_PATHS[..i].contains(path), "{path} is declared twice");
        }
    }
}
