//! The reverse proxy: forwards a request to the module that owns its route,
//! over the module's Unix socket, as plain HTTP, a stream or a websocket.
//! Bodies stream in both directions; nothing is buffered whole.

mod bare;
mod body;
mod client_socket;
mod error;
mod headers;
mod idle;
mod shared;
mod websocket;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use axum::body::Body;
use axum::response::Response;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::uri::PathAndQuery;
use http::{header, HeaderValue, Method, Request, Uri, Version};
use http_body_util::{LengthLimitError, Limited};
use tracing::debug;

use crate::config::ServerSettings;
use crate::connection::{Hold, PoolError, PooledBody};
use crate::error::error_chain;
use crate::metrics::OpenGuard;
use crate::routes::{Lookup, RouteKind, RouteTable};
use crate::supervisor::{Gate, ModuleHandle};

pub use bare::{Answer, BareAnswer, BareGet};
pub(crate) use body::CancelableBody;
#[cfg(test)]
pub(crate) use client_socket::COALESCE_BYTES;
pub(crate) use client_socket::{put, put_chunk, Activity, Client, ClientConn, ClientSocket};
pub use error::{ProxyError, SharedError, UpstreamFailure};
pub(crate) use headers::{
    connection_tokens, declined, from_browser, put_date_line, put_framing_line, put_header_line,
    put_status_line, strip_hop_by_hop,
};
pub(crate) use idle::{is_send_timeout, WriteTimeout};
use idle::{BodyTimeout, ClientBodyError};
use shared::{Shared, SharedAnswers};

/// The first of `error` and its causes that is an `E`.
fn cause<'a, E: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        current = e.source();
    }
    None
}

/// The module routes and what is needed to forward to them.
#[derive(Debug)]
pub struct Proxy {
    /// Replaced whole by a reload ([`Proxy::set_modules`]); each request
    /// takes a snapshot, so a lookup and its forward see the same table.
    routing: ArcSwap<Routing>,
    settings: ServerSettings,
    /// The kept and pending answers of cacheable routes.
    shared: Arc<SharedAnswers>,
}

/// The route table and the modules its targets index.
#[derive(Debug)]
struct Routing {
    table: RouteTable,
    modules: Arc<[ModuleHandle]>,
}

impl Routing {
    fn new(modules: Arc<[ModuleHandle]>) -> Routing {
        Routing {
            table: RouteTable::new(modules.iter().map(|m| m.spec().routes.as_slice())),
            modules,
        }
    }

    /// The module named `name`, if the table's modules have it.
    fn module_named(&self, name: &str) -> Option<&ModuleHandle> {
        self.modules.iter().find(|m| m.name() == name)
    }
}

/// A request's route, looked up in one snapshot of the table.
#[derive(Debug)]
pub struct Routed {
    routing: Arc<Routing>,
    lookup: Lookup,
}

impl Routed {
    /// Whether no module route has the request's path.
    pub fn is_not_found(&self) -> bool {
        self.lookup == Lookup::NotFound
    }

    /// The module and route kind found, if any.
    pub fn target(&self) -> Option<(&str, RouteKind)> {
        match &self.lookup {
            Lookup::Found(target) => {
                Some((self.routing.modules[target.module].name(), target.kind))
            }
            Lookup::MethodNotAllowed(_) | Lookup::NotFound => None,
        }
    }
}

impl Proxy {
    /// A proxy to `modules` (in configuration order, as the table indexes them).
    pub fn new(modules: Arc<[ModuleHandle]>, settings: ServerSettings) -> Proxy {
        Proxy {
            routing: ArcSwap::from_pointee(Routing::new(modules)),
            settings,
            shared: Arc::default(),
        }
    }

    /// Routes requests to `modules` from now on; requests already routed
    /// keep the modules they were routed to.
    pub fn set_modules(&self, modules: Arc<[ModuleHandle]>) {
        self.routing.store(Arc::new(Routing::new(modules)));
        self.shared.clear();
    }

    /// Finds the route for `request`.
    pub fn lookup(&self, request: &Request<Body>) -> Routed {
        let routing = self.routing.load_full();
        let lookup = routing.table.lookup(request.method(), request.uri().path());
        Routed { routing, lookup }
    }

    /// Forwards `request` to the module `routed` found for it; every failure
    /// is a [`ProxyError`].
    pub async fn forward(
        &self,
        routed: Routed,
        request: Request<Body>,
    ) -> Result<Response, ProxyError> {
        let Routed { routing, lookup } = routed;
        let target = match lookup {
            Lookup::Found(target) => target,
            Lookup::MethodNotAllowed(allow) => {
                return Err(ProxyError::MethodNotAllowed {
                    method: request.method().to_string(),
                    path: request.uri().path().to_owned(),
                    allow,
                })
            }
            Lookup::NotFound => {
                return Err(ProxyError::NotFound {
                    path: request.uri().path().to_owned(),
                })
            }
        };
        let module = &routing.modules[target.module];
        let started = std::time::Instant::now();
        let route = &module.spec().routes[target.route];
        let fallback = route
            .fallback
            .as_deref()
            .and_then(|name| routing.module_named(name));
        // The rarer paths' futures are boxed: every request's future is
        // moved and allocated whole, at the size of its largest path.
        let result = 'answered: {
            let request = match route.cache {
                Some(max) if request.method() == Method::GET && !has_body(&request) => {
                    match Box::pin(
                        self.shared
                            .get(module, fallback, request, max, &self.settings),
                    )
                    .await
                    {
                        Shared::Answered(result) => break 'answered result,
                        Shared::Forward(request) => request,
                    }
                }
                _ if is_write(request.method()) => {
                    self.shared.written();
                    let result = self.forward_to(module, request, target.kind).await;
                    // Done (or failed) by the time its answer starts.
                    self.shared.written();
                    break 'answered result;
                }
                _ => request,
            };
            match may_fall_back(fallback, &request) {
                Some(fallback) => {
                    Box::pin(self.forward_with_fallback(module, fallback, request, target.kind))
                        .await
                }
                None => self.forward_to(module, request, target.kind).await,
            }
        };
        let status = match &result {
            Ok(response) => response.status(),
            Err(error) => error.status(),
        };
        module
            .metrics()
            .record(target.kind, target.route, status, started.elapsed());
        result
    }

    /// Forwards `request` to `module`; if the module declines it, to
    /// `fallback` as it came (see [`may_fall_back`]).
    async fn forward_with_fallback(
        &self,
        module: &ModuleHandle,
        fallback: &ModuleHandle,
        request: Request<Body>,
        kind: RouteKind,
    ) -> Result<Response, ProxyError> {
        let again = replay(&request);
        let response = self.forward_to(module, request, kind).await?;
        match declined(response.status(), response.headers()) {
            Some(why) => {
                falling_back(module, fallback, &why);
                self.forward_to(fallback, again, kind).await
            }
            None => Ok(response),
        }
    }

    /// Forwards `request` for a route of `kind` to `module`, if it is ready.
    async fn forward_to(
        &self,
        module: &ModuleHandle,
        request: Request<Body>,
        kind: RouteKind,
    ) -> Result<Response, ProxyError> {
        let gate = module
            .admit_or_start()
            .await
            .map_err(|why| ProxyError::not_ready(module, why))?;
        if kind == RouteKind::Websocket && websocket::is_upgrade(&request) {
            return Box::pin(websocket::forward(module, gate, request, &self.settings)).await;
        }
        // Not a function of its own: each async level on this path adds its
        // arguments and its whole state to every request's future.
        let (upstream, deadline, hold) = self.upstream_http(module, request, kind)?;
        let response = send(module, &gate, upstream, deadline, hold, &self.settings).await?;
        let open = (kind == RouteKind::Stream).then(|| module.metrics().stream_open());
        Ok(downstream_response(module, &gate, response, open))
    }

    /// The request for the module, its body bounded, with the deadline for
    /// its answer and how long it holds its connection.
    fn upstream_http(
        &self,
        module: &ModuleHandle,
        request: Request<Body>,
        kind: RouteKind,
    ) -> Result<(Request<Body>, Option<Duration>, Hold), ProxyError> {
        let limit = self.settings.max_request_body_bytes;
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit) {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        let (parts, body) = request.into_parts();
        let body = Body::new(Limited::new(
            BodyTimeout::new(
                body,
                self.settings.client_body_timeout,
                module.shared_name(),
                module.metrics().bytes_in().clone(),
            ),
            usize::try_from(limit).unwrap_or(usize::MAX),
        ));
        let upstream = upstream_request(parts, body);
        let (deadline, hold) = match kind {
            RouteKind::Http => (Some(self.settings.http_response_timeout), Hold::Exchange),
            RouteKind::Stream | RouteKind::Websocket => (None, Hold::LongLived),
        };
        Ok((upstream, deadline, hold))
    }
}

/// `fallback`, if `request` may go to it when its module declines: a `GET`
/// or `HEAD` with no body, which can be sent again.
fn may_fall_back<'m>(
    fallback: Option<&'m ModuleHandle>,
    request: &Request<Body>,
) -> Option<&'m ModuleHandle> {
    fallback
        .filter(|_| matches!(*request.method(), Method::GET | Method::HEAD) && !has_body(request))
}

/// Whether a request may change what a module answers to others: any
/// method but the safe ones (RFC 9110 §9.2.1).
fn is_write(method: &Method) -> bool {
    !matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// Logs that `module` declined a request (`why`), which goes to `fallback`.
fn falling_back(module: &ModuleHandle, fallback: &ModuleHandle, why: &str) {
    debug!(
        module = module.name(),
        fallback = fallback.name(),
        why,
        "declined; asking the fallback"
    );
}

/// A copy of `request`, which has no body, to send again: its method,
/// URI, version and headers.
fn replay(request: &Request<Body>) -> Request<Body> {
    let mut again = Request::new(Body::empty());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.version_mut() = request.version();
    *again.headers_mut() = request.headers().clone();
    again
}

/// Whether a request says it carries a body (a `GET` with one is never
/// answered from shared answers, which would drop it).
fn has_body(request: &Request<Body>) -> bool {
    request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// Rewrites the client's request for the module: same method, path, query,
/// headers and body; HTTP/1.1 to the module's socket, hop-by-hop headers out.
fn upstream_request(mut parts: http::request::Parts, body: Body) -> Request<Body> {
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if !parts.headers.contains_key(header::HOST) {
        // HTTP/2 clients name the host in the URI (HTTP/1.0 ones may not name
        // it at all); HTTP/1.1 needs the header.
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or(HeaderValue::from_static("localhost"));
        parts.headers.insert(header::HOST, host);
    }
    strip_hop_by_hop(&mut parts.headers);
    parts.uri = Uri::from(path_and_query);
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

/// The module's response for the client: hop-by-hop headers out, the body
/// cut if the incarnation fails; its bytes counted, and, with `open`, the
/// stream counted open until the body is done with.
fn downstream_response(
    module: &ModuleHandle,
    gate: &Gate,
    response: http::Response<PooledBody>,
    open: Option<OpenGuard>,
) -> Response {
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let body = Body::new(
        CancelableBody::new(body, &gate.cancel, module.shared_name())
            .counted(module.metrics().bytes_out().clone(), open),
    );
    Response::from_parts(parts, body)
}

/// Sends `request` and waits for the response head, bounded by `deadline`
/// and by the incarnation's health; `hold` says for how long the answer
/// keeps its connection. The wait for a free connection counts
/// within `deadline`; a request without one (a stream) may wait for a
/// connection as long as an `http` route's answer. The 413 for a body over
/// the limit names `settings.max_request_body_bytes`, the limit it was
/// wrapped in.
async fn send(
    module: &ModuleHandle,
    gate: &Gate,
    request: Request<Body>,
    deadline: Option<Duration>,
    hold: Hold,
    settings: &ServerSettings,
) -> Result<http::Response<PooledBody>, ProxyError> {
    let name = module.name();
    let started = tokio::time::Instant::now();
    let queue_wait = deadline.unwrap_or(settings.http_response_timeout);
    // The queue's deadline and the answer's are the same instant, so a
    // request that waited its whole deadline for a connection is told so.
    let exchange = gate.client.send(request, started + queue_wait, hold);
    // Pinned where it is: the wrappers below hold a pointer to it, so
    // building them moves a few bytes, not the whole exchange.
    tokio::pin!(exchange);
    let bounded = match deadline {
        Some(after) => Either::Left(
            tokio::time::timeout_at(started + after, exchange.as_mut())
                .map(move |r| r.map_err(|_| after)),
        ),
        None => Either::Right(exchange.as_mut().map(Ok)),
    };
    let result = tokio::select! {
        biased;
        _ = gate.cancel.cancelled() => {
            return Err(ProxyError::Upstream {
                module: name.to_owned(),
                reason: UpstreamFailure::IncarnationFailed { incarnation: gate.incarnation },
            });
        }
        result = bounded => result,
    };
    match result {
        Ok(Ok(response)) => check_framing(name, response),
        Ok(Err(PoolError::Busy {
            connections,
            queued,
        })) => Err(ProxyError::Busy {
            module: name.to_owned(),
            connections,
            queued,
        }),
        Ok(Err(PoolError::Waited { connections })) => Err(ProxyError::NoConnection {
            module: name.to_owned(),
            after: queue_wait,
            connections,
        }),
        Ok(Err(PoolError::LongLivedFull { limit })) => Err(ProxyError::LongLivedFull {
            module: name.to_owned(),
            limit,
        }),
        Ok(Err(e)) if cause::<LengthLimitError>(&e).is_some() => Err(ProxyError::BodyTooLarge {
            limit: settings.max_request_body_bytes,
        }),
        // The client's body failed the exchange, not the module.
        Ok(Err(e)) => match cause::<ClientBodyError>(&e) {
            Some(ClientBodyError::TimedOut(after)) => {
                Err(ProxyError::BodyTimeout { after: *after })
            }
            Some(broken) => Err(ProxyError::BadBody {
                reason: error_chain(broken),
            }),
            None => Err(ProxyError::Upstream {
                module: name.to_owned(),
                reason: UpstreamFailure::Exchange(Arc::new(e)),
            }),
        },
        Err(after) => Err(ProxyError::Timeout {
            module: name.to_owned(),
            after,
        }),
    }
}

/// Refuses a module's answer whose framing is ambiguous: with both
/// `Transfer-Encoding` and `Content-Length`, hyper reads the body as the
/// transfer coding says (RFC 9112 §6.3), but the `Content-Length` would
/// reach the client, which would read a different body from the same
/// bytes: a response-splitting shape the RFC says ought to be handled as
/// an error. Dropping the answer closes its module connection, whose
/// framing can no longer be trusted.
fn check_framing(
    module: &str,
    response: http::Response<PooledBody>,
) -> Result<http::Response<PooledBody>, ProxyError> {
    let headers = response.headers();
    if headers.contains_key(header::TRANSFER_ENCODING)
        && headers.contains_key(header::CONTENT_LENGTH)
    {
        return Err(ProxyError::Upstream {
            module: module.to_owned(),
            reason: UpstreamFailure::AmbiguousLength,
        });
    }
    Ok(response)
}
