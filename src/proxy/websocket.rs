//! Websocket routes: the host completes the handshake with the module first,
//! answers the client with the module's own handshake response, then hands
//! both sockets to the [`relay`].

mod head;
mod relay;

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, Request, StatusCode};
use tracing::debug;

use super::headers::tokens;
use super::ProxyError;
use super::{downstream_response, send, strip_hop_by_hop, upstream_request};
use crate::config::ServerSettings;
use crate::connection::Hold;
use crate::supervisor::{Gate, ModuleHandle};

/// Whether `request` asks for a websocket (RFC 6455 §4.1).
pub(super) fn is_upgrade(request: &Request<Body>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        tokens(request.headers(), name).any(|t| t.eq_ignore_ascii_case(token))
    };
    request.method() == http::Method::GET
        && has_token(header::CONNECTION, "upgrade")
        && has_token(header::UPGRADE, "websocket")
}

/// Opens the websocket to the module, answers the client with the module's
/// own handshake response, and relays messages in a task of their own. A
/// module that answers with plain HTTP has that answer passed on unchanged.
pub(super) async fn forward(
    module: &ModuleHandle,
    gate: Gate,
    mut request: Request<Body>,
    settings: &ServerSettings,
) -> Result<Response, ProxyError> {
    let client_upgrade = hyper::upgrade::on(&mut request);
    let (parts, _) = request.into_parts();
    let mut upstream = upstream_request(parts, Body::empty());
    let headers = upstream.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    // Messages are relayed one by one, so no extension (compression) may
    // change the frames of one hop only.
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);

    // The handshake has no body, so the limit is never reached.
    let mut response = send(
        module,
        &gate,
        upstream,
        Some(settings.http_response_timeout),
        Hold::LongLived,
        settings,
    )
    .await?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(downstream_response(module, &gate, response, None));
    }
    let module_upgrade = hyper::upgrade::on(&mut response);
    // Open, the websocket counts under the module's
    // `max_long_lived_connections` until it closes.
    let ticket = response.body_mut().take_ticket();

    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = std::mem::take(response.headers_mut());
    strip_hop_by_hop(&mut headers);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    *answer.headers_mut() = headers;

    let module_failed = gate.cancel;
    let max_message = settings.max_websocket_message_bytes;
    let name = module.shared_name().clone();
    let shutdown = module.shutdown_token().clone();
    let open = module.metrics().websocket_open();
    tokio::spawn(async move {
        let _open = open;
        let (client_io, module_io) = match tokio::try_join!(client_upgrade, module_upgrade) {
            Ok(ios) => ios,
            Err(e) => {
                debug!(module = %name, error = %e, "websocket upgrade failed");
                return;
            }
        };
        relay::relay(
            relay::Socket::from_upgraded(client_io),
            relay::Socket::from_upgraded(module_io),
            module_failed,
            shutdown,
            max_message,
            name,
        )
        .await;
        drop(ticket);
    });
    Ok(answer)
}
