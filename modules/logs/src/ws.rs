//! The websocket route: the live tail of `follow`, one text message per
//! batch of lines, with `{"pause": bool}` from the client to stop and
//! resume reading, and close 1011 with the reason when the file cannot be read.

use std::borrow::Cow;

use axum::extract::rejection::QueryRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::error::LogsError;
use crate::files::LogDir;
use crate::follow::{Follower, Start};
use crate::routes::{parse_query, FollowQuery};
use crate::AppState;

/// Longest close reason allowed: a control frame's payload is at most
/// 125 bytes, two of which are the code (RFC 6455 §5.5).
const MAX_CLOSE_REASON: usize = 123;

/// A message from the client.
#[derive(Debug, Deserialize)]
struct Control {
    /// True to stop reading the file, false to resume where it stopped.
    pause: bool,
}

/// `GET /api/dashd/logs/ws`: upgrades, then streams the live tail.
///
/// A bad query or a refused name is answered 400 before the upgrade, as on
/// every route; any other failure to read the file (missing, a folder,
/// unreadable) happens after it and closes the socket with 1011, so that a
/// browser, which cannot read a failed handshake's answer, sees the reason.
pub(crate) async fn websocket(
    State(state): State<AppState>,
    query: Result<Query<FollowQuery>, QueryRejection>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, LogsError> {
    let query = parse_query(query)?;
    let start = query.start()?;
    refuse_early(state.dir.clone(), query.name.clone()).await?;
    Ok(upgrade.on_upgrade(move |socket| async move {
        let AppState { dir, shutdown } = state;
        tail_to_socket(socket, dir, query.name, start, shutdown).await;
    }))
}

/// Fails only for a refused name (including a symlink on the way, which is
/// looked up here, through no link); every other outcome is left to the
/// socket.
async fn refuse_early(dir: LogDir, name: String) -> Result<(), LogsError> {
    let for_error = name.clone();
    match tokio::task::spawn_blocking(move || dir.identify(&name)).await {
        Ok(Err(refused @ LogsError::Refused { .. })) => Err(refused),
        Ok(_) => Ok(()),
        Err(e) => Err(LogsError::from_join(&for_error, e)),
    }
}

/// Sends the initial tail, then each batch, until the client leaves, the
/// file fails or the module shuts down.
async fn tail_to_socket(
    mut socket: WebSocket,
    dir: LogDir,
    name: String,
    start: Start,
    shutdown: CancellationToken,
) {
    let opening = match Follower::open_async(dir, name.clone(), start).await {
        Ok(opening) => opening,
        Err(e) => return close(socket, close_code::ERROR, &e.client_message()).await,
    };
    let lines = Follower::stream(opening);
    futures_util::pin_mut!(lines);
    let mut paused = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                return close(socket, close_code::AWAY, "module shutting down").await;
            }
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<Control>(&text) {
                    Ok(control) => paused = control.pause,
                    Err(e) => tracing::debug!(name = %name, error = %e, "ignoring client message"),
                },
                // Pings are answered by the websocket layer itself.
                Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            },
            batch = lines.next(), if !paused => match batch {
                Some(Ok(batch)) => {
                    let text = String::from_utf8_lossy(&batch).into_owned();
                    if socket.send(Message::Text(text.into())).await.is_err() {
                        return;
                    }
                }
                Some(Err(e)) => {
                    tracing::info!(name = %name, error = %e, "follow ended");
                    return close(socket, close_code::ERROR, &e.client_message()).await;
                }
                None => return close(socket, close_code::ERROR, "follow ended").await,
            },
        }
    }
}

/// Sends a close frame with `code` and `reason` (cut to fit).
async fn close(mut socket: WebSocket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: truncate_reason(reason).into_owned().into(),
    };
    // The client may be gone already; nothing more to do then.
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// Cuts `reason` to [`MAX_CLOSE_REASON`] bytes at a character boundary.
fn truncate_reason(reason: &str) -> Cow<'_, str> {
    if reason.len() <= MAX_CLOSE_REASON {
        return Cow::Borrowed(reason);
    }
    let mut end = MAX_CLOSE_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Borrowed(&reason[..end])
}

#[cfg(test)]
mod tests;
