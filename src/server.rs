//! The HTTP server, the top layer below `lib.rs`: the service every
//! connection runs ([`Dispatch`]: `server.url_prefix` taken off
//! (`prefix.rs`), the request [`guard`], then a module route straight to
//! the proxy, else the host's [`router`]), the router
//! built from the host's routes (its API in `api.rs`, the UI's files in
//! `assets.rs`), and [`serve`], which runs the port's layers
//! (`listener.rs`: accepting, admission under the client cap in
//! `accept.rs`, TLS in [`tls`], HTTP/1.1, the graceful drain). On plain
//! connections, bodiless GETs for module `http` routes skip hyper's server
//! (`fast_path.rs`).

mod accept;
mod api;
mod assets;
mod fast_path;
pub mod guard;
mod listener;
mod prefix;
pub mod tls;
mod waiting;

pub(crate) use api::reload_all;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::FutureExt;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_http::trace::TraceLayer;
use tracing::{debug, Instrument};

use crate::config::ServerSettings;
use crate::metrics::Metrics;
use crate::proxy::{Answer, Proxy, ProxyError, Routed};
use crate::ray::{self, auth, RayParent};
use crate::reload::Reloader;
use crate::routes::host::{HostHandler, HOST_ROUTES};
use crate::routes::RouteKind;
use crate::supervisor::Supervisor;
use guard::{Guard, Refusal};
use prefix::{Placed, UrlPrefix};
use tls::ServerTls;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The modules.
    pub supervisor: Arc<Supervisor>,
    /// The module routes.
    pub proxy: Arc<Proxy>,
    /// When Ray's modules are hosted: what Ray's dashboard parent would
    /// serve itself (its web UI at `/`, `/timezone`, …).
    pub ray: Option<Arc<RayParent>>,
    /// Whether Ray's modules are hosted, and why not.
    pub ray_status: Arc<ray::RayStatus>,
    /// What `POST /api/reload` runs; `None` where there is nothing to read
    /// again.
    pub reloader: Option<Arc<Reloader>>,
    /// The dashboard port's TLS, whose files `POST /api/reload` reads
    /// again too; `None`: plain HTTP.
    pub tls: Option<Arc<tls::ServerTls>>,
}

/// The host's routes ([`HOST_ROUTES`]), with the proxy (then the UI)
/// behind them.
pub fn router(state: AppState) -> Router {
    let ray_ui = state.ray.as_ref().and_then(|ray| ray.ui_dir.clone());
    let mut router = Router::new();
    for route in HOST_ROUTES {
        router = match route.handler {
            HostHandler::Api(api) => router.route(route.path, api::handler(api)),
            // The fallback serves the UI's files.
            HostHandler::Ui => router,
            // Ray's own UI takes `/`; ours stays at `/dashd/`.
            HostHandler::RayUi(part) => match &ray_ui {
                Some(ui) => assets::ray_ui_route(router, route.path, part, ui),
                None => router,
            },
            // Below, with their own state.
            HostHandler::RayParent(_) => router,
        };
    }
    if let Some(ray) = &state.ray {
        router = router.merge(ray::parent::routes(Arc::clone(ray)));
    }
    router
        .fallback(fallback)
        .with_state(state)
        // Outermost, so every request the router answers gets a span (and
        // its start and end logged at debug). Module routes never reach the
        // router: Dispatch gives them a span of their own.
        .layer(TraceLayer::new_for_http())
}

/// Paths that neither the host nor a module claims: the UI's files, or 404.
async fn fallback(State(state): State<AppState>, request: Request<Body>) -> Response {
    let lookup = state.proxy.lookup(&request);
    if lookup.is_not_found() {
        if let Some(response) =
            assets::static_asset(request.method(), request.uri().path(), request.headers())
        {
            return response;
        }
    }
    forward(&state.proxy, lookup, request).await
}

/// The service every connection runs: module routes go straight to the
/// proxy (the hot path: no router, no layers, a request span only when
/// debug logging is on); everything else goes to the host's router.
#[derive(Debug, Clone)]
pub struct Dispatch {
    proxy: Arc<Proxy>,
    router: Router,
    /// Which requests are answered at all (Host, Origin; Ray's browser
    /// rule when Ray's modules are hosted).
    guard: Arc<Guard>,
    /// Ray's token, when its token authentication is on (whether or not
    /// Ray's modules are hosted): every request but the public ones must
    /// bear it.
    token: Option<auth::Token>,
    /// `server.url_prefix`, when set: only paths under it are answered.
    prefix: Option<UrlPrefix>,
    /// Where the accept loop says how many clients it serves.
    metrics: Arc<Metrics>,
}

impl Dispatch {
    /// Serves `state`'s module routes through the proxy and the rest through
    /// [`router`], what `guard` admits of either, to requests bearing
    /// `token` when one is given, under `url_prefix` (`""`: at `/`).
    pub fn new(
        state: AppState,
        guard: Guard,
        token: Option<auth::Token>,
        url_prefix: &str,
    ) -> Dispatch {
        Dispatch {
            proxy: Arc::clone(&state.proxy),
            guard: Arc::new(guard),
            token,
            metrics: Arc::clone(state.supervisor.metrics()),
            router: router(state),
            prefix: UrlPrefix::new(url_prefix),
        }
    }

    /// `path` as the routes see it: without the prefix; `None` when it is
    /// not under the prefix.
    pub(crate) fn route_path<'p>(&self, path: &'p str) -> Option<&'p str> {
        match &self.prefix {
            Some(prefix) => prefix.strip(path),
            None => Some(path),
        }
    }

    /// Runs the guard and Ray's token check, on the host's routes and the
    /// module routes alike: the protocol and the host first (a request for
    /// another host is for no route here), then, in Ray's order, the token,
    /// then the browser and origin rules. `None` when `request` may pass.
    fn refuse(&self, request: &Request<Body>) -> Option<Response> {
        let refused = |refusal: Refusal| {
            debug!(%refusal, method = %request.method(), path = request.uri().path(), "request refused");
            Some(refusal.into_response())
        };
        let host = match self.guard.check_host(request) {
            Ok(host) => host,
            Err(refusal) => return refused(refusal),
        };
        if let Some(token) = &self.token {
            if let Some(response) = auth::refuse_unauthenticated(token, request) {
                return Some(response);
            }
        }
        self.guard
            .check_origin(request, host)
            .err()
            .and_then(refused)
    }

    /// Answers a request whose path is as the routes see it (the prefix
    /// taken off).
    fn route(
        &self,
        request: Request<Body>,
    ) -> <Self as hyper::service::Service<Request<Incoming>>>::Future {
        if let Some(refused) = self.refuse(&request) {
            return Box::pin(async move { Ok(refused) });
        }
        let lookup = self.proxy.lookup(&request);
        if lookup.is_not_found() {
            let router = self.router.clone();
            return Box::pin(async move { router.oneshot(request).await });
        }
        Box::pin(self.forward_module(lookup, request).map(Ok))
    }

    /// Forwards a request for a module route (`lookup` found it), in a
    /// request span when debug logging is on.
    fn forward_module(
        &self,
        lookup: Routed,
        request: Request<Body>,
    ) -> impl Future<Output = Response> + Send + 'static {
        let span = request_span(&lookup, &request);
        let proxy = Arc::clone(&self.proxy);
        async move { in_span(span, forward(&proxy, lookup, request), Response::status).await }
    }

    /// The answer to come for a request the fast path may serve
    /// (`fast_path.rs`): one for a module's `http` route, under the URL
    /// prefix if there is one, or for a `stream` route that a bare exchange
    /// serves, answered as hyper's path (`Dispatch::call`)
    /// would answer it (refused by the guard or the token check, or
    /// forwarded). `None` for any other request, which hyper then serves.
    pub(super) fn fast_answer(
        &self,
        mut request: Request<Body>,
    ) -> Option<Pin<Box<dyn Future<Output = Answer> + Send>>> {
        let prefix = match &self.prefix {
            None => None,
            Some(prefix) => match prefix.place(request.uri()) {
                Placed::Under(uri) => {
                    *request.uri_mut() = uri;
                    Some(prefix.clone())
                }
                Placed::Bare | Placed::Outside => return None,
            },
        };
        // The route first, then the guard: `route` runs them the other way,
        // but a refusal does not depend on the path, so the answer is the
        // same.
        let lookup = self.proxy.lookup(&request);
        // A stream only as a bare exchange, which watches for the client
        // leaving while the module is silent (as hyper's server does).
        let stream = match lookup.target() {
            Some((_, RouteKind::Http)) => false,
            Some((_, RouteKind::Stream)) if prefix.is_none() => true,
            _ => return None,
        };
        if let Some(refused) = self.refuse(&request) {
            return Some(Box::pin(std::future::ready(Answer::Response(refused))));
        }
        // A bare exchange writes the module's head as it came: not under a
        // prefix, whose redirects get it back on their `Location`.
        let (lookup, request) = if prefix.is_none() {
            let span = request_span(&lookup, &request);
            match self.proxy.bare_get(lookup, request) {
                Ok(get) => {
                    let proxy = Arc::clone(&self.proxy);
                    return Some(Box::pin(async move {
                        in_span(span, get.answer(&proxy), Answer::status).await
                    }));
                }
                Err(_) if stream => return None,
                Err(back) => *back,
            }
        } else {
            (lookup, request)
        };
        let answer = self.forward_module(lookup, request);
        Some(match prefix {
            None => Box::pin(answer.map(Answer::Response)),
            Some(prefix) => Box::pin(async move {
                let mut response = answer.await;
                prefix.restore_location(&mut response);
                Answer::Response(response)
            }),
        })
    }
}

impl hyper::service::Service<Request<Incoming>> for Dispatch {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let mut request = request.map(Body::new);
        let Some(prefix) = &self.prefix else {
            return self.route(request);
        };
        match prefix.place(request.uri()) {
            Placed::Under(uri) => *request.uri_mut() = uri,
            Placed::Bare => {
                let response = prefix.redirect_bare(request.uri());
                return Box::pin(async move { Ok(response) });
            }
            Placed::Outside => {
                let path = request.uri().path().to_owned();
                return Box::pin(async move { Ok(ProxyError::NotFound { path }.into_response()) });
            }
        }
        let prefix = prefix.clone();
        let routed = self.route(request);
        Box::pin(async move {
            let mut response = routed.await?;
            prefix.restore_location(&mut response);
            Ok(response)
        })
    }
}

/// The span of a request for a module route, as the router's `TraceLayer`
/// gives its own requests (`request`, with the method, URI and version),
/// plus the module and the route's kind, and the status and the time to
/// the response head once known. Disabled, and made for nearly nothing
/// (one check of the level, no field evaluated), unless debug logging is
/// on for this module.
fn request_span(routed: &Routed, request: &Request<Body>) -> tracing::Span {
    // A path known to no method has no module.
    let target = routed.target();
    tracing::debug_span!(
        "request",
        method = %request.method(),
        uri = %request.uri(),
        version = ?request.version(),
        module = target.map(|(module, _)| module),
        kind = target.map(|(_, kind)| tracing::field::display(kind)),
        status = tracing::field::Empty,
        latency_us = tracing::field::Empty,
    )
}

/// Awaits `answer` in `span` (a request span) unless it is disabled; then
/// records the status `status_of` reads from the answer and the time to
/// it, and logs the request's end.
async fn in_span<T>(
    span: tracing::Span,
    answer: impl Future<Output = T>,
    status_of: impl FnOnce(&T) -> http::StatusCode,
) -> T {
    if span.is_disabled() {
        return answer.await;
    }
    let started = tokio::time::Instant::now();
    let answer = answer.instrument(span.clone()).await;
    span.record("status", status_of(&answer).as_u16());
    span.record("latency_us", started.elapsed().as_micros() as u64);
    span.in_scope(|| debug!("finished processing request"));
    answer
}

/// Forwards a request a module route claims; failures become responses.
async fn forward(proxy: &Proxy, lookup: Routed, request: Request<Body>) -> Response {
    proxy.answer(lookup, request).await
}

/// Accepts connections on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish within the grace period.
/// At most `max_connections` clients are served at once; see
/// [`accept`] for the connections beyond. With `tls`, every connection
/// makes its handshake first, in its own task. The layers are
/// [`listener`]'s.
pub async fn serve(
    listener: TcpListener,
    service: Dispatch,
    settings: &ServerSettings,
    max_connections: usize,
    tls: Option<Arc<ServerTls>>,
    shutdown: impl Future<Output = ()>,
) {
    let mut admission = accept::Admission::new(max_connections);
    service
        .metrics
        .set_clients(max_connections, admission.clients_served());
    let metrics = Arc::clone(&service.metrics);
    let connections = listener::Connections::new(service, settings, max_connections, tls);
    metrics.set_waiting_clients(connections.waiting());
    let mut accepting = listener::Accepting::new(listener);
    tokio::pin!(shutdown);
    while let Some((stream, peer)) = accepting.next(shutdown.as_mut()).await {
        match admission.admit() {
            accept::Admitted::Client(permit) => connections.serve_client(stream, peer, permit),
            accept::Admitted::Overflow(permit) => connections.serve_overflow(stream, peer, permit),
            // Dropped: closed at once.
            accept::Admitted::Refused => {}
        }
    }
    drop(accepting);
    connections.drain(settings.shutdown_grace).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    use crate::cli::Cli;
    use crate::config::Config;
    use crate::ray::gcs::GcsStatus;
    use clap::Parser;

    /// The router of a host with Ray's modules hosted and Ray's web UI in
    /// `ui`, and no module of its own.
    fn router_with_ray_ui(ui: &std::path::Path) -> Router {
        let config = Config::builtin(&Cli::parse_from(["ray-dashd"])).expect("config");
        let parent = RayParent {
            ray_version: "2.60.0".to_owned(),
            ui_dir: Some(ui.to_path_buf()),
            timezone: serde_json::json!({ "offset": "+00:00", "value": "UTC" }),
            token: None,
            usage_stats_enabled: false,
            usage_stats_prompt_enabled: false,
            gcs: GcsStatus::default(),
            redaction: Default::default(),
        };
        router(AppState {
            supervisor: Arc::new(Supervisor::without_modules(
                &crate::session::Session::prepare(ui).expect("a session in the test's folder"),
            )),
            proxy: Arc::new(Proxy::new(Arc::from(Vec::new()), config.server)),
            ray: Some(Arc::new(parent)),
            ray_status: Arc::new(ray::RayStatus {
                state: ray::RayHosting::Hosted,
                message: String::new(),
                python: None,
                python_source: None,
                ray_version: Some("2.60.0".to_owned()),
            }),
            reloader: None,
            tls: None,
        })
    }

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Every path the host declares is answered by its router, none by the
    /// fallback's "no route" (with Ray's modules and web UI, when all are
    /// served), and Ray's UI paths by Ray's files: what the config keeps
    /// module routes off is what the router serves.
    #[tokio::test]
    async fn the_router_serves_every_reserved_path() {
        let ui = tempfile::tempdir().expect("tempdir");
        std::fs::write(ui.path().join("index.html"), "ray's index").expect("write");
        std::fs::write(ui.path().join("favicon.ico"), "ray's icon").expect("write");
        std::fs::create_dir(ui.path().join("static")).expect("mkdir");
        std::fs::write(ui.path().join("static/probe.js"), "ray's static").expect("write");
        let router = router_with_ray_ui(ui.path());
        for route in HOST_ROUTES {
            let rest = match route.handler {
                HostHandler::RayUi(_) => "probe.js",
                _ => "index.html",
            };
            let path = route.path.replace("{*path}", rest).replace("{name}", "x");
            let (status, body) = get(&router, &path).await;
            assert!(
                !(status == StatusCode::NOT_FOUND && body.contains("no route for")),
                "{} ({path}) is not served: {status} {body}",
                route.path
            );
            if let HostHandler::RayUi(_) = route.handler {
                assert_eq!(status, StatusCode::OK, "{path}");
                assert!(body.starts_with("ray's "), "{path}: {body}");
            }
        }
        // The probe can tell: a path nobody declared is the fallback's.
        let (status, body) = get(&router, "/api/not_a_host_path").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("no route for"), "{body}");
    }

    /// A module route whose module has no healthy incarnation (its command
    /// is missing: it fails and backs off for ever) is answered 503 with
    /// `Retry-After` and the module's name; an undeclared path next to it
    /// is 404.
    #[tokio::test]
    async fn a_module_not_ready_is_503_with_retry_after() {
        use crate::config::{ModuleSpec, Supervision};
        use crate::routes::{RouteKind, RouteSpec};

        let dir = tempfile::tempdir().expect("tempdir");
        let session = crate::session::Session::prepare(dir.path()).expect("session");
        let spec = ModuleSpec {
            name: "ghost".to_owned(),
            program: "/nonexistent/ray-dashd-ghost".to_owned(),
            args: Vec::new(),
            env: Default::default(),
            routes: vec![RouteSpec {
                method: http::Method::GET,
                path: "/ghost".to_owned(),
                kind: RouteKind::Http,
                cache: None,
                fallback: None,
            }],
            supervision: Supervision::default(),
            start: Default::default(),
        };
        let config = Config::builtin(&Cli::parse_from(["ray-dashd"])).expect("config");
        let supervisor = Arc::new(Supervisor::start(
            &[spec],
            &session,
            [],
            Arc::new(Metrics::new()),
        ));
        let router = router(AppState {
            proxy: Arc::new(Proxy::new(supervisor.modules(), config.server)),
            supervisor: Arc::clone(&supervisor),
            ray: None,
            ray_status: Arc::new(ray::RayStatus {
                state: ray::RayHosting::Off,
                message: String::new(),
                python: None,
                python_source: None,
                ray_version: None,
            }),
            reloader: None,
            tls: None,
        });
        let request = Request::get("/ghost").body(Body::empty()).expect("request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            response.headers().contains_key(http::header::RETRY_AFTER),
            "{:?}",
            response.headers()
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(body["module"], "ghost", "{body}");
        assert!(body["message"].as_str().is_some(), "{body}");
        let (status, _) = get(&router, "/ghost/elsewhere").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        supervisor.shutdown().await;
    }
}
