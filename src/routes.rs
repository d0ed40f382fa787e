//! The route table: which module serves a method and path, and how.

use http::Method;

use crate::config::{normalize_pattern, ModuleSpec, RouteKind};

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Index of the module in the configuration (and the supervisor).
    pub module: usize,
    /// How it is forwarded.
    pub kind: RouteKind,
}

/// The outcome of a lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// A route matches.
    Found(Target),
    /// The path is known, the method is not; carries the `Allow` value.
    MethodNotAllowed(String),
    /// No route has this path.
    NotFound,
}

/// All module routes, matched by path first, then by method.
#[derive(Debug, Default)]
pub struct RouteTable {
    paths: matchit::Router<Vec<(Method, Target)>>,
}

impl RouteTable {
    /// Builds the table. The config was validated, so paths are well formed
    /// and no method and path is claimed twice.
    pub fn new(modules: &[ModuleSpec]) -> RouteTable {
        let mut grouped: Vec<(String, Vec<(Method, Target)>)> = Vec::new();
        for (index, module) in modules.iter().enumerate() {
            for route in &module.routes {
                let key = normalize_pattern(&route.path);
                let target = Target {
                    module: index,
                    kind: route.kind,
                };
                match grouped.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, methods)) => methods.push((route.method.clone(), target)),
                    None => grouped.push((key, vec![(route.method.clone(), target)])),
                }
            }
        }
        let mut paths = matchit::Router::new();
        for (key, methods) in grouped {
            paths
                .insert(key, methods)
                .expect("UNWRAP: validated patterns with normalized names do not conflict");
        }
        RouteTable { paths }
    }

    /// Finds the route for `method` on `path`. `HEAD` falls back to `GET`.
    pub fn lookup(&self, method: &Method, path: &str) -> Lookup {
        let Ok(found) = self.paths.at(path) else {
            return Lookup::NotFound;
        };
        let methods = found.value;
        let pick = |m: &Method| methods.iter().find(|(candidate, _)| candidate == m);
        let hit = pick(method).or_else(|| {
            (method == Method::HEAD)
                .then(|| pick(&Method::GET))
                .flatten()
        });
        match hit {
            Some((_, target)) => Lookup::Found(*target),
            None => {
                let mut allow: Vec<&str> = methods.iter().map(|(m, _)| m.as_str()).collect();
                if allow.contains(&"GET") && !allow.contains(&"HEAD") {
                    allow.push("HEAD");
                }
                Lookup::MethodNotAllowed(allow.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RouteSpec, Supervision};

    fn module(name: &str, routes: &[(&str, &str, RouteKind)]) -> ModuleSpec {
        ModuleSpec {
            name: name.into(),
            program: "x".into(),
            args: vec![],
            env: Default::default(),
            routes: routes
                .iter()
                .map(|(m, p, k)| RouteSpec {
                    method: Method::from_bytes(m.as_bytes()).expect("method"),
                    path: (*p).into(),
                    kind: *k,
                })
                .collect(),
            supervision: Supervision::default(),
        }
    }

    #[test]
    fn matches_params_methods_and_head() {
        let table = RouteTable::new(&[
            module(
                "jobs",
                &[
                    ("GET", "/api/jobs/", RouteKind::Http),
                    ("GET", "/api/jobs/{id}", RouteKind::Http),
                    ("GET", "/api/jobs/{id}/logs/tail", RouteKind::Websocket),
                ],
            ),
            module("other", &[("POST", "/api/jobs/", RouteKind::Stream)]),
        ]);
        let found = |m: Method, p: &str| table.lookup(&m, p);
        assert_eq!(
            found(Method::GET, "/api/jobs/abc/logs/tail"),
            Lookup::Found(Target {
                module: 0,
                kind: RouteKind::Websocket
            })
        );
        assert_eq!(
            found(Method::POST, "/api/jobs/"),
            Lookup::Found(Target {
                module: 1,
                kind: RouteKind::Stream
            })
        );
        assert_eq!(
            found(Method::HEAD, "/api/jobs/x"),
            Lookup::Found(Target {
                module: 0,
                kind: RouteKind::Http
            })
        );
        assert_eq!(
            found(Method::DELETE, "/api/jobs/x"),
            Lookup::MethodNotAllowed("GET, HEAD".into())
        );
        assert_eq!(found(Method::GET, "/api/jobs"), Lookup::NotFound);
        assert_eq!(found(Method::GET, "/api/jobs/a/b"), Lookup::NotFound);
    }
}
