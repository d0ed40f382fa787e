//! Websocket routes of the test-module: an echo endpoint that can be told to
//! close, a server-push endpoint, and a route that refuses the upgrade.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt;
use serde::Deserialize;

use crate::state::{AppState, CloseRecord};

/// Largest websocket message (and frame) accepted: big enough for the
/// host's large-message tests.
const MAX_MESSAGE_SIZE: usize = 128 << 20;

/// How long to wait for the client's Close reply after sending ours.
const CLOSE_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Close code recorded for a Close frame without a status (RFC 6455 §7.4.1).
const NO_STATUS_RECEIVED: u16 = 1005;

/// `GET /test/ws/echo`: echoes text and binary messages; `close:<code>:<reason>`
/// makes it close with that code and reason.
pub(crate) async fn echo(State(state): State<AppState>, upgrade: WebSocketUpgrade) -> Response {
    upgrade
        .max_message_size(MAX_MESSAGE_SIZE)
        .max_frame_size(MAX_MESSAGE_SIZE)
        .on_upgrade(move |socket| echo_loop(socket, state))
}

async fn echo_loop(mut socket: WebSocket, state: AppState) {
    while let Some(message) = socket.recv().await {
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                tracing::debug!(error = %e, "websocket echo read failed");
                return;
            }
        };
        let sent = match message {
            Message::Text(text) => match close_command(text.as_str()) {
                Some(frame) => {
                    close(socket, frame).await;
                    return;
                }
                None => socket.send(Message::Text(text)).await,
            },
            Message::Binary(data) => socket.send(Message::Binary(data)).await,
            // tungstenite queues the Pong (or the Close reply) itself; flush
            // so it leaves now rather than with the next write.
            Message::Ping(_) | Message::Pong(_) => socket.flush().await,
            Message::Close(frame) => {
                let record = match frame {
                    Some(frame) => CloseRecord {
                        code: frame.code,
                        reason: frame.reason.as_str().to_owned(),
                    },
                    None => CloseRecord {
                        code: NO_STATUS_RECEIVED,
                        reason: String::new(),
                    },
                };
                tracing::info!(code = record.code, reason = %record.reason, "websocket closed by client");
                state.record_ws_close(record);
                socket.flush().await
            }
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "websocket echo write failed");
            return;
        }
    }
}

/// Parses `close:<code>:<reason>` (the reason may be absent).
fn close_command(text: &str) -> Option<CloseFrame> {
    let rest = text.strip_prefix("close:")?;
    let (code, reason) = rest.split_once(':').unwrap_or((rest, ""));
    Some(CloseFrame {
        code: code.parse().ok()?,
        reason: reason.into(),
    })
}

/// Sends `frame` and waits (bounded) for the client's Close reply.
async fn close(mut socket: WebSocket, frame: CloseFrame) {
    if let Err(e) = socket.send(Message::Close(Some(frame))).await {
        tracing::debug!(error = %e, "websocket close failed");
        return;
    }
    let drain = async { while let Some(Ok(_)) = socket.recv().await {} };
    if tokio::time::timeout(CLOSE_REPLY_TIMEOUT, drain)
        .await
        .is_err()
    {
        tracing::debug!("no close reply from websocket client");
    }
}

/// Query of `GET /test/ws/out`.
#[derive(Debug, Deserialize)]
pub(crate) struct OutQuery {
    /// Number of messages to send (default 10).
    count: Option<u32>,
    /// Milliseconds to hold the socket afterwards, reading nothing, before
    /// closing (default 0): a peer that neither answers nor hangs up.
    hold_ms: Option<u64>,
    /// Bytes of zeros after each binary message's `i` (default 0): a few
    /// such messages fill the kernel's buffers where millions of short
    /// ones take seconds of CPU.
    pad: Option<usize>,
}

/// `GET /test/ws/out?count=N[&hold_ms=M][&pad=P]`: sends N messages (even
/// `i`: text `msg-<i>`, odd `i`: binary big-endian `i` then P zero bytes),
/// holds the socket M ms without reading, then closes with 1000 `done`.
pub(crate) async fn out(Query(query): Query<OutQuery>, upgrade: WebSocketUpgrade) -> Response {
    let count = query.count.unwrap_or(10);
    let hold = Duration::from_millis(query.hold_ms.unwrap_or(0));
    let pad = query.pad.unwrap_or(0);
    upgrade.on_upgrade(move |mut socket| async move {
        for i in 0..count {
            let message = if i % 2 == 0 {
                Message::Text(format!("msg-{i}").into())
            } else {
                let mut bytes = i.to_be_bytes().to_vec();
                bytes.resize(bytes.len() + pad, 0);
                Message::Binary(bytes.into())
            };
            if let Err(e) = socket.send(message).await {
                tracing::debug!(error = %e, sent = i, "websocket out write failed");
                return;
            }
        }
        tokio::time::sleep(hold).await;
        let done = CloseFrame {
            code: 1000,
            reason: "done".into(),
        };
        close(socket, done).await;
    })
}

/// `GET /test/ws/not`: ignores the upgrade and answers plain HTTP 403.
pub(crate) async fn not_websocket() -> impl IntoResponse {
    (
        StatusCode::FORBIDDEN,
        [("x-test", "fallback")],
        "no websocket here",
    )
}
