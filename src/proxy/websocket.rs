//! Websocket routes: the host completes the handshake with the module first,
//! then relays messages both ways. Each hop answers its own pings; close
//! codes and reasons cross in both directions; messages are size-limited.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderValue, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{downstream_response, send, strip_hop_by_hop, upstream_request, SendError};
use crate::config::ServerSettings;
use crate::error::ProxyError;
use crate::supervisor::{Gate, ModuleHandle};

/// How long a closing handshake may take before the connections are dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `request` asks for a websocket (RFC 6455 §4.1).
pub(super) fn is_upgrade(request: &Request<Body>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        request
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
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
    let mut upstream = upstream_request(module, parts, Body::empty());
    let headers = upstream.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    // Messages are relayed one by one, so no extension (compression) may
    // change the frames of one hop only.
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);

    let mut response = send(
        module,
        &gate,
        upstream,
        Some(settings.http_response_timeout),
    )
    .await
    .map_err(|e| match e {
        SendError::Proxy(e) => e,
        SendError::BodyTooLarge => ProxyError::BadRequest {
            reason: "a websocket handshake has no body".into(),
        },
    })?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(downstream_response(module, &gate, response));
    }
    let module_upgrade = hyper::upgrade::on(&mut response);

    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = std::mem::take(response.headers_mut());
    strip_hop_by_hop(&mut headers);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    *answer.headers_mut() = headers;

    let config = WebSocketConfig::default()
        .max_message_size(Some(settings.max_websocket_message_bytes))
        .max_frame_size(Some(settings.max_websocket_message_bytes));
    let name = module.name().to_owned();
    tokio::spawn(async move {
        let (client_io, module_io) = match tokio::try_join!(client_upgrade, module_upgrade) {
            Ok(ios) => ios,
            Err(e) => {
                debug!(module = %name, error = %e, "websocket upgrade failed");
                return;
            }
        };
        let client =
            WebSocketStream::from_raw_socket(TokioIo::new(client_io), Role::Server, Some(config))
                .await;
        let module =
            WebSocketStream::from_raw_socket(TokioIo::new(module_io), Role::Client, Some(config))
                .await;
        relay(client, module, gate.cancel, &name).await;
    });
    Ok(answer)
}

/// Which side a message or an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Module,
}

/// Relays messages until both sides have closed, either side is gone, or
/// the module's incarnation fails.
async fn relay<C, M>(
    client: WebSocketStream<C>,
    module: WebSocketStream<M>,
    cancel: CancellationToken,
    name: &str,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    M: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut client_tx, mut client_rx) = client.split();
    let (mut module_tx, mut module_rx) = module.split();
    // Once a side has sent its Close, we only wait for the other's reply.
    let mut closing = false;
    loop {
        let (from, next) = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                let frame = close_frame(CloseCode::Restart, &format!("module {name} failed; it is being restarted"));
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, client_tx.send(Message::Close(Some(frame)))).await;
                return;
            }
            next = client_rx.next() => (Side::Client, next),
            next = module_rx.next() => (Side::Module, next),
        };
        let result = match (from, next) {
            (_, Some(Ok(Message::Ping(_) | Message::Pong(_)))) => Ok(()),
            (side, Some(Ok(message @ Message::Close(_)))) => {
                closing = true;
                let result = match side {
                    Side::Client => module_tx.send(message).await,
                    Side::Module => client_tx.send(message).await,
                };
                // The other side may have closed first: its reply is moot.
                if result.is_err() {
                    break;
                }
                Ok(())
            }
            (Side::Client, Some(Ok(message))) => module_tx.send(message).await,
            (Side::Module, Some(Ok(message))) => client_tx.send(message).await,
            (side, Some(Err(e))) => {
                debug!(module = %name, ?side, error = %e, "websocket read failed");
                let (code, reason) = match &e {
                    tungstenite::Error::Capacity(c) => {
                        (CloseCode::Size, format!("message too big: {c}"))
                    }
                    _ if side == Side::Client => (CloseCode::Away, "client went away".to_owned()),
                    _ => (CloseCode::Error, format!("module {name} connection lost")),
                };
                let frame = close_frame(code, &reason);
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
                    let _ = client_tx.send(Message::Close(Some(frame.clone()))).await;
                    let _ = module_tx.send(Message::Close(Some(frame))).await;
                })
                .await;
                break;
            }
            (side, None) => {
                if !closing {
                    let (code, reason) = match side {
                        Side::Client => (CloseCode::Away, "client went away".to_owned()),
                        Side::Module => {
                            (CloseCode::Error, format!("module {name} connection lost"))
                        }
                    };
                    let frame = Message::Close(Some(close_frame(code, &reason)));
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
                        match side {
                            Side::Client => module_tx.send(frame).await,
                            Side::Module => client_tx.send(frame).await,
                        }
                    })
                    .await;
                }
                break;
            }
        };
        if let Err(e) = result {
            debug!(module = %name, ?from, error = %e, "websocket write failed");
            break;
        }
    }
    // Let queued close replies reach the wire before the sockets drop.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let _ = client_tx.close().await;
        let _ = module_tx.close().await;
    })
    .await;
}

fn close_frame(code: CloseCode, reason: &str) -> CloseFrame {
    // A close reason may hold at most 123 bytes (RFC 6455 §5.5).
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    CloseFrame {
        code,
        reason: reason[..end].to_owned().into(),
    }
}
