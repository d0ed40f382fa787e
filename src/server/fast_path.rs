//! The fast path: the commonest request a dashboard gets, a `GET` without a
//! body for a module's `http` route (or a `stream` route, when a bare
//! exchange serves it) on a plain HTTP/1.1 connection, read, answered and
//! written by the connection's task itself, without a hyper server
//! connection.
//!
//! hyper's server connection is general (bodies both ways, upgrades,
//! `Expect`, HTTP/1.0, its dispatcher and buffers); for a bodiless `GET` it
//! cost about 14,600 instructions per request of the host's 32,000
//! (callgrind, 64 connections), against nginx's 19,600 for the whole
//! request. Here a request head is parsed with `httparse` (what hyper
//! uses) into the same `http::Request`, answered by the same
//! [`Dispatch`] (guard, token, prefix, route lookup, the proxy and its
//! deadlines, cancellation and metrics), and its answer written as hyper
//! would write it: hop-by-hop headers already out, `Date` added when
//! missing, framed by its `Content-Length` or chunked.
//!
//! Only a request that is plainly one of these is taken; anything else
//! ([`plain_get`] says what) is handed, with every byte read so far, to a
//! hyper connection, as parking does (`waiting.rs`): a request with a body
//! or framing headers, an upgrade, `Expect`, HTTP/1.0, a head not complete
//! in what has arrived, a path no module `http` route claims. So anything
//! unusual about a request (a bad head, a slow one, a large one) meets
//! hyper's checks and answers, never this module's: there is no framing
//! here to get wrong, as the only requests taken have no body.

use std::io;
use std::net::SocketAddr;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::waiting::WAIT_AFTER;
use super::Dispatch;
use crate::proxy::{
    connection_tokens, is_send_timeout, put, put_chunk, put_date_line, put_framing_line,
    put_header_line, put_status_line, Answer, ClientConn, ClientSocket,
};

/// Most header lines in a request head: hyper's default, beyond which hyper
/// answers 431 (such a head goes to hyper).
const MAX_HEADER_LINES: usize = 100;
/// What a connection's read buffer starts at: a browser's request head with
/// its cookies fits; a larger one grows it, up to the header limit.
const READ_BUFFER_BYTES: usize = 4096;
/// A write buffer grown beyond this by one answer is let go after it.
const KEEP_WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// How a run of the fast path on a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Served {
    /// No request for [`WAIT_AFTER`] or more: the connection is to be
    /// parked.
    Idle,
    /// A request for hyper: its bytes, and any after them, are back in the
    /// socket.
    Handover,
    /// The connection is done: closed by the client, failed, answered with
    /// `connection: close`, or drained.
    Closed,
}

/// Serves requests on `socket` while they are for the fast path; returns
/// when one is not (its bytes put back), when the connection has been idle
/// for [`WAIT_AFTER`], or when it is done. `max_header_bytes` bounds a
/// head, as hyper's `max_header_size` does on hyper's path.
pub(super) async fn serve(
    socket: &mut ClientSocket,
    service: &Dispatch,
    drain: &CancellationToken,
    max_header_bytes: usize,
    peer: SocketAddr,
) -> Served {
    let mut read = Vec::with_capacity(READ_BUFFER_BYTES.min(max_header_bytes));
    let mut write = Vec::new();
    // One timer for the run, not one per request: checked every
    // `WAIT_AFTER`, the run ends when no request came between two checks.
    let check = tokio::time::sleep(WAIT_AFTER);
    tokio::pin!(check);
    let drained = drain.cancelled();
    tokio::pin!(drained);
    let mut active = true;
    loop {
        if read.is_empty() {
            tokio::select! {
                biased;
                got = socket.read_buf(&mut read) => match got {
                    Ok(0) => return Served::Closed,
                    Ok(_) => {}
                    Err(e) => {
                        debug!(%peer, error = %e, "client connection failed");
                        return Served::Closed;
                    }
                },
                () = &mut drained => return Served::Closed,
                () = &mut check => {
                    if !active {
                        return Served::Idle;
                    }
                    active = false;
                    check.as_mut().reset(Instant::now() + WAIT_AFTER);
                    continue;
                }
            }
        }
        let taken = if read.len() > max_header_bytes {
            None
        } else {
            plain_get(&read).and_then(|(request, len, close)| {
                service
                    .fast_answer(request)
                    .map(|answer| (answer, len, close))
            })
        };
        let Some((answer, len, close)) = taken else {
            socket.unread(Bytes::from(std::mem::take(&mut read)));
            return Served::Handover;
        };
        read.drain(..len);
        active = true;
        // A client that closes its connection gives up its request, as on
        // hyper's path: the module's exchange is dropped.
        let response = tokio::select! {
            biased;
            response = answer => response,
            () = socket.gone() => return Served::Closed,
        };
        let close = close || drain.is_cancelled();
        let written = match response {
            Answer::Response(response) => write_response(socket, &mut write, response, close).await,
            Answer::Bare(answer) => answer.relay(socket, &mut write, close).await,
        };
        if let Err(e) = written {
            if !is_send_timeout(&e) {
                debug!(%peer, error = %e, "answer not written");
            }
            return Served::Closed;
        }
        if write.capacity() > KEEP_WRITE_BUFFER_BYTES {
            write = Vec::new();
        }
        if close {
            let _ = socket.shutdown().await;
            return Served::Closed;
        }
    }
}

/// The request whose head starts `read`, if it is for the fast path: a
/// complete HTTP/1.1 `GET` head for an origin-form target, with no
/// `Content-Length`, `Transfer-Encoding`, `Upgrade` or `Expect`. Returns it
/// with the head's length and whether it asked to close the connection.
fn plain_get(read: &[u8]) -> Option<(Request<Body>, usize, bool)> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADER_LINES];
    let mut head = httparse::Request::new(&mut lines);
    let httparse::Status::Complete(len) = head.parse(read).ok()? else {
        return None;
    };
    if head.method != Some("GET") || head.version != Some(1) {
        return None;
    }
    let path = head.path.filter(|p| p.starts_with('/'))?;
    let uri = Uri::try_from(path).ok()?;
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    let mut close = false;
    for line in head.headers.iter() {
        let name = HeaderName::from_bytes(line.name.as_bytes()).ok()?;
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::UPGRADE
            || name == header::EXPECT
        {
            return None;
        }
        let value = HeaderValue::from_bytes(line.value).ok()?;
        if name == header::CONNECTION {
            close |= connection_tokens(value.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close"));
        }
        headers.append(name, value);
    }
    // `Request::new` is a GET over HTTP/1.1.
    let mut request = Request::new(Body::empty());
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Some((request, len, close))
}

/// How an answer's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// None may follow the head (204, 304).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked: the length is not known before the end.
    Chunked,
}

/// Writes `response` to `socket` as HTTP/1.1, with `write` as its buffer:
/// the head with `Date` when the answer has none and the framing header
/// its body calls for, then the body, each chunk as it comes (small ones
/// with what precedes them). An answer whose body fails or does not match
/// its `Content-Length` is an error: the connection must close.
async fn write_response(
    socket: &mut impl ClientConn,
    write: &mut Vec<u8>,
    response: Response,
    close: bool,
) -> io::Result<()> {
    let (parts, mut body) = response.into_parts();
    write.clear();
    let framing = write_head(
        write,
        parts.status,
        &parts.headers,
        body.size_hint().exact(),
        close,
    )?;
    let mut sent: u64 = 0;
    while !body.is_end_stream() {
        // A client that leaves while the body is silent gives it up.
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            () = socket.gone() => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the client closed its connection",
                ))
            }
        };
        let Some(frame) = frame else {
            break;
        };
        let frame = frame.map_err(io::Error::other)?;
        // Trailers are dropped, as hyper's server drops them for a client
        // that did not ask for them.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        sent += data.len() as u64;
        match framing {
            Framing::Empty => continue,
            Framing::Length(length) if sent > length => {
                return Err(io::Error::other(
                    "the answer's body is longer than its Content-Length",
                ));
            }
            Framing::Length(_) => put(socket, write, &data).await?,
            Framing::Chunked => put_chunk(socket, write, &data).await?,
        }
        if !body.is_end_stream() {
            // More to come, perhaps not soon: what is here goes now.
            socket.write_all(write).await?;
            write.clear();
        }
    }
    match framing {
        Framing::Length(length) if sent != length => {
            return Err(io::Error::other(
                "the answer's body is shorter than its Content-Length",
            ));
        }
        Framing::Chunked => write.extend_from_slice(b"0\r\n\r\n"),
        _ => {}
    }
    socket.write_all(write).await?;
    write.clear();
    Ok(())
}

/// Writes an answer's head into `write`: the status line, `headers`,
/// `Date` when they have none, the framing header (`Content-Length` from
/// the body's `exact` size when they have none, else chunked), and
/// `connection: close` when `close`. Returns the body's framing.
fn write_head(
    write: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    exact: Option<u64>,
    close: bool,
) -> io::Result<Framing> {
    if status.is_informational() {
        return Err(io::Error::other(format!(
            "an informational status ({status}) as a final answer"
        )));
    }
    put_status_line(write, status);
    for (name, value) in headers {
        put_header_line(write, name.as_str().as_bytes(), value.as_bytes());
    }
    if !headers.contains_key(header::DATE) {
        put_date_line(write);
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Empty
    } else if let Some(length) = headers.get(header::CONTENT_LENGTH) {
        let length = length
            .to_str()
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| io::Error::other("the answer's Content-Length is not a number"))?;
        Framing::Length(length)
    } else {
        put_framing_line(write, exact);
        exact.map_or(Framing::Chunked, Framing::Length)
    };
    if close {
        write.extend_from_slice(b"connection: close\r\n");
    }
    write.extend_from_slice(b"\r\n");
    Ok(framing)
}

#[cfg(test)]
mod tests;
