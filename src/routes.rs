//! The module routes: what a route is ([`RouteSpec`], [`RouteKind`]) and
//! the table that finds which module serves a method and path. The bottom
//! layer with the config: it names no other part of the host.

pub mod host;

use std::fmt;

use http::Method;
use serde::{Deserialize, Serialize};

/// One route a module serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// The HTTP method (a `GET` route also answers `HEAD`).
    pub method: Method,
    /// The path pattern, aiohttp style: `/api/jobs/{job_id}`.
    pub path: String,
    /// How the host forwards it.
    pub kind: RouteKind,
    /// For a `GET` `http` route whose answers are the same for every
    /// client (cluster state polled by many pages): the most a shared
    /// answer may be aged when it is served (see `proxy::shared`). `None`:
    /// every request goes to the module.
    pub cache: Option<std::time::Duration>,
    /// For a `GET` `http` route: the module given a request this route's
    /// module declines (answers 421 with `x-ray-dashd-decline`), as it
    /// came. `None`: a declining answer goes to the client as it is.
    pub fallback: Option<String>,
}

/// How the host forwards a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    /// A request and a response, with a deadline for the response to start.
    Http,
    /// A long-lived response streamed chunk by chunk, with no deadline.
    Stream,
    /// A websocket, relayed message by message.
    Websocket,
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RouteKind::Http => "http",
            RouteKind::Stream => "stream",
            RouteKind::Websocket => "websocket",
        })
    }
}

/// The pattern with every parameter renamed by position, so that
/// `/a/{x}` and `/a/{y}` count as the same path.
pub fn normalize_pattern(path: &str) -> String {
    let mut n = 0;
    path.split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                n += 1;
                format!("{{p{n}}}")
            } else {
                segment.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Index of the module in the configuration (and the supervisor).
    pub module: usize,
    /// How it is forwarded.
    pub kind: RouteKind,
    /// Index of the route among the module's routes.
    pub route: usize,
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
    /// Builds the table of the modules' routes, one slice per module in
    /// configuration order. The config was validated, so paths are well
    /// formed and no method and path is claimed twice.
    pub fn new<'a>(modules: impl IntoIterator<Item = &'a [RouteSpec]>) -> RouteTable {
        let mut grouped: Vec<(String, Vec<(Method, Target)>)> = Vec::new();
        for (index, routes) in modules.into_iter().enumerate() {
            for (position, route) in routes.iter().enumerate() {
                let key = normalize_pattern(&route.path);
                let target = Target {
                    module: index,
                    kind: route.kind,
                    route: position,
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

    fn module(routes: &[(&str, &str, RouteKind)]) -> Vec<RouteSpec> {
        routes
            .iter()
            .map(|(m, p, k)| RouteSpec {
                method: Method::from_bytes(m.as_bytes()).expect("method"),
                path: (*p).into(),
                kind: *k,
                cache: None,
                fallback: None,
            })
            .collect()
    }

    #[test]
    fn matches_params_methods_and_head() {
        let modules = [
            module(&[
                ("GET", "/api/jobs/", RouteKind::Http),
                ("GET", "/api/jobs/{id}", RouteKind::Http),
                ("GET", "/api/jobs/{id}/logs/tail", RouteKind::Websocket),
            ]),
            module(&[("POST", "/api/jobs/", RouteKind::Stream)]),
        ];
        let table = RouteTable::new(modules.iter().map(Vec::as_slice));
        let found = |m: Method, p: &str| table.lookup(&m, p);
        assert_eq!(
            found(Method::GET, "/api/jobs/abc/logs/tail"),
            Lookup::Found(Target {
                module: 0,
                kind: RouteKind::Websocket,
                route: 2,
            })
        );
        assert_eq!(
            found(Method::POST, "/api/jobs/"),
            Lookup::Found(Target {
                module: 1,
                kind: RouteKind::Stream,
                route: 0,
            })
        );
        assert_eq!(
            found(Method::HEAD, "/api/jobs/x"),
            Lookup::Found(Target {
                module: 0,
                kind: RouteKind::Http,
                route: 1,
            })
        );
        assert_eq!(
            found(Method::DELETE, "/api/jobs/x"),
            Lookup::MethodNotAllowed("GET, HEAD".into())
        );
        assert_eq!(found(Method::GET, "/api/jobs"), Lookup::NotFound);
        assert_eq!(found(Method::GET, "/api/jobs/a/b"), Lookup::NotFound);
    }

    #[test]
    fn normalized_patterns_ignore_parameter_names() {
        assert_eq!(
            normalize_pattern("/a/{x}/b/{y}"),
            normalize_pattern("/a/{id}/b/{z}")
        );
        assert_ne!(normalize_pattern("/a/{x}"), normalize_pattern("/a/x"));
    }
}
