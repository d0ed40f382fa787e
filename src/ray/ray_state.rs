//! The Ray state module (`modules/ray-state`) in Ray's module set: which of
//! Ray's routes it takes over (`GET /api/jobs/` from JobHead, `GET
//! /api/cluster_status` from ReportHead), and how it is started. Ray's
//! module keeps the route's other methods, and answers what the Ray state
//! module declines (through its socket).

use std::path::Path;

use crate::builtin;
use crate::config::{ModuleSpec, Start, Supervision};

use super::Redaction;

/// The Ray state module's name.
pub const MODULE: &str = "ray_state";

/// The routes it serves: Ray's module that declares each, the path, and
/// the flag that gives the module that Ray module's socket.
const TAKEN: &[(&str, &str, &str)] = &[
    ("JobHead", "/api/jobs/", "--job-head-socket"),
    ("ReportHead", "/api/cluster_status", "--report-head-socket"),
];

/// What the module is started with.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The GCS, `host:port`.
    pub gcs_address: &'a str,
    /// The session's sockets folder, where Ray's modules listen.
    pub sockets: &'a Path,
    /// Whether Ray's token authentication is on.
    pub token_auth: bool,
    /// How Ray masks runtime-env secrets for a browser.
    pub redaction: &'a Redaction,
}

/// Why no Ray state module is hosted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    /// `[ray] native_routes = false`.
    #[error("[ray] native_routes is off")]
    Off,
    /// No hosted module declares a route it serves.
    #[error("no hosted Ray module declares a route it serves")]
    NoRoute,
    /// This Ray masks secrets in a way the module cannot repeat.
    #[error("this Ray masks runtime-env secrets in a way head_facts.py could not read")]
    UnknownRedaction,
}

/// Takes the routes the Ray state module serves away from Ray's `modules`
/// and returns the module that serves them (each with the route's shared
/// answer setting).
pub fn take_routes(
    modules: &mut [ModuleSpec],
    launch: &Launch<'_>,
    supervision: Supervision,
) -> Result<ModuleSpec, Skipped> {
    let mut args: Vec<String> = [builtin::RAY_STATE, "--gcs-address", launch.gcs_address]
        .map(str::to_owned)
        .to_vec();
    match launch.redaction {
        Redaction::None => {}
        Redaction::Masks {
            fields,
            placeholder,
        } => {
            for field in fields {
                args.extend(["--redact-field".to_owned(), field.clone()]);
            }
            args.extend(["--redact-placeholder".to_owned(), placeholder.clone()]);
        }
        Redaction::Unknown => return Err(Skipped::UnknownRedaction),
    }
    // A route a release's module lacks is left out; the others are taken.
    // So is the route of a module started on demand: the Ray state module
    // forwards what it declines to the module's socket, which is not
    // there until something starts it.
    let mut routes = Vec::new();
    for (class, path, flag) in TAKEN {
        let at = modules.iter().enumerate().find_map(|(m, spec)| {
            (spec.name == *class && spec.start == Start::AtLaunch)
                .then(|| {
                    spec.routes.iter().position(|r| {
                        r.method == http::Method::GET
                            && r.path == *path
                            && r.kind == crate::routes::RouteKind::Http
                    })
                })
                .flatten()
                .map(|r| (m, r))
        });
        let Some((m, r)) = at else { continue };
        routes.push(modules[m].routes.remove(r));
        let socket = launch
            .sockets
            .join(ray_dashd_contract::names::socket_name(class));
        args.extend([(*flag).to_owned(), socket.display().to_string()]);
    }
    if routes.is_empty() {
        return Err(Skipped::NoRoute);
    }
    let mode = if launch.token_auth {
        "token"
    } else {
        "disabled"
    };
    Ok(ModuleSpec {
        name: MODULE.to_owned(),
        program: builtin::SELF_PROGRAM.to_owned(),
        args,
        env: [("RAY_AUTH_MODE".to_owned(), mode.to_owned())].into(),
        routes,
        supervision,
        start: Start::AtLaunch,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::routes::{RouteKind, RouteSpec};

    fn route(method: http::Method, path: &str, cache: Option<Duration>) -> RouteSpec {
        RouteSpec {
            method,
            path: path.to_owned(),
            kind: RouteKind::Http,
            cache,
        }
    }

    fn ray_module(name: &str, routes: Vec<RouteSpec>) -> ModuleSpec {
        ModuleSpec {
            name: name.to_owned(),
            program: "python".to_owned(),
            args: Vec::new(),
            env: Default::default(),
            routes,
            supervision: Supervision::default(),
            start: Start::AtLaunch,
        }
    }

    fn ray_modules() -> Vec<ModuleSpec> {
        let shared = Some(Duration::from_secs(2));
        vec![
            ray_module(
                "JobHead",
                vec![
                    route(http::Method::POST, "/api/jobs/", None),
                    route(http::Method::GET, "/api/jobs/", shared),
                ],
            ),
            ray_module(
                "ReportHead",
                vec![route(http::Method::GET, "/api/cluster_status", shared)],
            ),
        ]
    }

    fn launch(redaction: &Redaction) -> Launch<'_> {
        Launch {
            gcs_address: "127.0.0.1:6379",
            sockets: Path::new("/s/sockets"),
            token_auth: true,
            redaction,
        }
    }

    #[test]
    fn the_routes_are_taken_from_rays_modules_with_their_sharing() {
        let mut modules = ray_modules();
        let masks = Redaction::Masks {
            fields: vec!["env_vars".to_owned()],
            placeholder: "<redacted>".to_owned(),
        };
        let spec =
            take_routes(&mut modules, &launch(&masks), Supervision::default()).expect("taken");
        let shared = Some(Duration::from_secs(2));
        assert_eq!(
            spec.routes,
            [
                route(http::Method::GET, "/api/jobs/", shared),
                route(http::Method::GET, "/api/cluster_status", shared),
            ]
        );
        assert_eq!(
            modules[0].routes,
            [route(http::Method::POST, "/api/jobs/", None)]
        );
        assert!(modules[1].routes.is_empty());
        assert_eq!(
            spec.args,
            [
                "ray-state",
                "--gcs-address",
                "127.0.0.1:6379",
                "--redact-field",
                "env_vars",
                "--redact-placeholder",
                "<redacted>",
                "--job-head-socket",
                "/s/sockets/dash_JobHead",
                "--report-head-socket",
                "/s/sockets/dash_ReportHead",
            ]
        );
        assert_eq!(spec.env["RAY_AUTH_MODE"], "token");
    }

    #[test]
    fn nothing_is_taken_when_the_module_cannot_stand_in() {
        let mut modules = ray_modules();
        assert_eq!(
            take_routes(
                &mut modules,
                &launch(&Redaction::Unknown),
                Supervision::default()
            )
            .expect_err("unknown masking"),
            Skipped::UnknownRedaction
        );
        assert_eq!(modules[0].routes.len(), 2);
        // A route no module declares is left out.
        let mut jobs_only = vec![ray_modules().remove(0)];
        let spec = take_routes(
            &mut jobs_only,
            &launch(&Redaction::None),
            Supervision::default(),
        )
        .expect("the job list alone");
        assert_eq!(spec.routes.len(), 1);
        assert!(!spec.args.iter().any(|a| a == "--report-head-socket"));
        // Nor a route of a module started on demand: its socket may not be
        // there for what the Ray state module declines.
        let mut modules = ray_modules();
        modules[0].start = Start::OnDemand;
        let spec = take_routes(
            &mut modules,
            &launch(&Redaction::None),
            Supervision::default(),
        )
        .expect("the status alone");
        assert_eq!(spec.routes[0].path, "/api/cluster_status");
        assert_eq!(spec.routes.len(), 1);
        assert_eq!(modules[0].routes.len(), 2);
        assert!(!spec.args.iter().any(|a| a == "--job-head-socket"));
        let mut none: Vec<ModuleSpec> = Vec::new();
        assert_eq!(
            take_routes(&mut none, &launch(&Redaction::None), Supervision::default())
                .expect_err("no module"),
            Skipped::NoRoute
        );
    }
}
