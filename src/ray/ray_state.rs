//! The Ray state module (`modules/ray-state`) in Ray's module set: which of
//! Ray's routes it takes over (`GET /api/jobs/` from JobHead, `GET
//! /api/cluster_status` from ReportHead), and how it is started. Ray's
//! module keeps the route's other methods, and is each taken route's
//! `fallback`: it answers what the Ray state module declines.

use crate::builtin;
use crate::config::{ModuleSpec, Start, Supervision};

use super::Redaction;

/// The Ray state module's name.
pub const MODULE: &str = "ray_state";

/// The routes it serves: Ray's module that declares each, the path, and
/// the module's name for the route (its `--serve`).
const TAKEN: &[(&str, &str, &str)] = &[
    ("JobHead", "/api/jobs/", "jobs"),
    ("ReportHead", "/api/cluster_status", "cluster-status"),
];

/// What the module is started with.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The GCS, `host:port`.
    pub gcs_address: &'a str,
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
    // A route a release's module lacks is left out; the others are taken,
    // with the module as their fallback (started by the first decline, if
    // it is started on demand).
    let mut routes = Vec::new();
    for (class, path, route) in TAKEN {
        let at = modules.iter().enumerate().find_map(|(m, spec)| {
            (spec.name == *class)
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
        let mut taken = modules[m].routes.remove(r);
        taken.fallback = Some((*class).to_owned());
        routes.push(taken);
        args.extend(["--serve".to_owned(), (*route).to_owned()]);
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
            fallback: None,
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
        let fallback_to = |module: &str, mut route: RouteSpec| {
            route.fallback = Some(module.to_owned());
            route
        };
        assert_eq!(
            spec.routes,
            [
                fallback_to("JobHead", route(http::Method::GET, "/api/jobs/", shared)),
                fallback_to(
                    "ReportHead",
                    route(http::Method::GET, "/api/cluster_status", shared)
                ),
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
                "--serve",
                "jobs",
                "--serve",
                "cluster-status",
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
        assert!(!spec.args.iter().any(|a| a == "cluster-status"));
        let mut none: Vec<ModuleSpec> = Vec::new();
        assert_eq!(
            take_routes(&mut none, &launch(&Redaction::None), Supervision::default())
                .expect_err("no module"),
            Skipped::NoRoute
        );
    }
}
