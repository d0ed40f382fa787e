//! Bare exchanges: a bodiless `GET` for a module's `http` or `stream`
//! route, spoken over a bare connection from the module's pool rather than
//! through hyper's client, its answer passed on to the client as it comes.
//!
//! hyper's client connection runs in a task of its own, builds a header
//! map of the answer and hands head and body over channels: about 12,400
//! instructions per small `GET` (callgrind, 64 connections). Here the
//! request's task writes the request head, reads the answer's head into a
//! buffer, checks it with `httparse` and writes the client's head from it
//! (hop-by-hop headers out, `Date` added when missing, the framing the
//! body needs), then relays the body: counted (`Content-Length`), or
//! decoded from chunks and chunked again, or read to the module's close.
//!
//! What holds as on hyper's path: the answer's deadline
//! (`http_response_timeout`, from before the connect; none for a stream),
//! a stream's ticket under `max_long_lived_connections` and its slot let
//! go once answered, its connection never reused, the incarnation's
//! cancellation (the exchange fails the moment it does), a client that
//! leaves while the module is silent giving the answer up, the 502 on a
//! `Content-Length` beside a `Transfer-Encoding` and on any malformed
//! head or framing, the route's metrics and the module's byte count. An
//! idle connection the module closed is found closed before any answer
//! and the request goes again on another (a `GET`, safe to repeat).
//! Routes with shared answers or a fallback, a module whose every slot is
//! taken, and requests under a URL prefix take the usual path.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use futures_util::future::Either;
use futures_util::FutureExt;
use http::{Request, StatusCode};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::body::ModuleFailed;
use super::client_socket::{put, put_chunk, put_chunk_of, ClientConn, MAX_CHUNK_PIECES};
use super::error::{ProxyError, UpstreamFailure};
use super::headers::{
    connection_tokens, is_hop_by_hop, put_date_line, put_framing_line, put_header_line,
    put_status_line, strip_hop_by_hop,
};
use super::{Proxy, Routed};
use crate::connection::{BareConn, Hold, ModulePool, PoolError};
use crate::metrics::OpenGuard;
use crate::routes::{Lookup, RouteKind};
use crate::supervisor::ModuleHandle;
use axum::body::Body;

/// Most header lines in an answer's head (hyper's client default).
const MAX_ANSWER_LINES: usize = 100;
/// Most bytes of an answer's head, informational ones included (about
/// what hyper's client buffer allows).
const MAX_ANSWER_HEAD_BYTES: usize = 400 * 1024;
/// What the module read buffer starts at; a head grows it.
const READ_BUFFER_BYTES: usize = 8 * 1024;
/// The room a body read asks for at first; doubled, up to
/// [`MAX_BODY_READ_BYTES`], each time a read fills it (a stream that
/// keeps the socket full is then read in fewer, larger reads, as hyper's
/// growing buffer did).
const BODY_READ_BYTES: usize = 64 * 1024;
/// The most a body read asks for.
const MAX_BODY_READ_BYTES: usize = 256 * 1024;
/// Most bytes of a chunk-size line or of the trailers.
const MAX_CHUNK_META_BYTES: usize = 64 * 1024;
/// Most idle connections tried for one request before a new one.
const MAX_TRIES: usize = 8;

/// A module's answer to a request the fast path took.
#[derive(Debug)]
pub enum Answer {
    /// Answered the usual way (or refused, or failed): a response to write.
    Response(Response),
    /// A bare exchange's answer, head read, body to relay.
    Bare(BareAnswer),
}

impl Answer {
    /// The answer's status.
    pub fn status(&self) -> StatusCode {
        match self {
            Answer::Response(response) => response.status(),
            Answer::Bare(answer) => answer.read.status,
        }
    }
}

/// A bodiless `GET` for a bare exchange, not sent yet.
pub struct BareGet {
    routed: Routed,
    request: Request<Body>,
    module: ModuleHandle,
    route: usize,
    kind: RouteKind,
}

impl std::fmt::Debug for BareGet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareGet")
            .field("module", &self.module.name())
            .field("uri", self.request.uri())
            .finish()
    }
}

impl Proxy {
    /// A bare exchange for `request` (a bodiless HTTP/1.1 `GET`) if its
    /// route may have one: an `http` or `stream` route with neither shared
    /// answers nor a fallback. Else both back.
    pub fn bare_get(
        &self,
        routed: Routed,
        request: Request<Body>,
    ) -> Result<BareGet, Box<(Routed, Request<Body>)>> {
        let Lookup::Found(target) = routed.lookup else {
            return Err(Box::new((routed, request)));
        };
        let module = &routed.routing.modules[target.module];
        let route = &module.spec().routes[target.route];
        if target.kind == RouteKind::Websocket || route.cache.is_some() || route.fallback.is_some()
        {
            return Err(Box::new((routed, request)));
        }
        let module = module.clone();
        Ok(BareGet {
            routed,
            request,
            module,
            route: target.route,
            kind: target.kind,
        })
    }

    /// Forwards `request` as [`Proxy::forward`] does; a failure becomes its
    /// response, logged when it is the module's.
    pub async fn answer(&self, routed: Routed, request: Request<Body>) -> Response {
        match self.forward(routed, request).await {
            Ok(response) => response,
            Err(error) => error_response(error),
        }
    }
}

/// The response for `error`; the module's failures are the operator's
/// concern and logged, the client's own mistakes (405, 413, 400) are not.
fn error_response(error: ProxyError) -> Response {
    if error.is_upstream() {
        tracing::warn!(error = %crate::error::error_chain(&error), "request failed");
    }
    axum::response::IntoResponse::into_response(error)
}

impl BareGet {
    /// Sends the request and reads the answer's head; the usual path when
    /// the module has no slot free.
    pub async fn answer(self, proxy: &Proxy) -> Answer {
        let started = Instant::now();
        let BareGet {
            routed,
            request,
            module,
            route,
            kind,
        } = self;
        let gate = match module.admit_or_start().await {
            Ok(gate) => gate,
            Err(why) => {
                return Answer::Response(recorded(
                    &module,
                    (kind, route),
                    started,
                    ProxyError::not_ready(&module, why),
                ))
            }
        };
        // A stream has no deadline for its head, as on hyper's path.
        let (deadline, hold) = match kind {
            RouteKind::Http => (Some(proxy.settings.http_response_timeout), Hold::Exchange),
            RouteKind::Stream | RouteKind::Websocket => (None, Hold::LongLived),
        };
        let head = request_head(request);
        let exchange = exchange(&gate.client, &head, hold);
        tokio::pin!(exchange);
        let bounded = match deadline {
            Some(after) => Either::Left(
                tokio::time::timeout(after, exchange.as_mut()).map(move |r| r.map_err(|_| after)),
            ),
            None => Either::Right(exchange.as_mut().map(Ok)),
        };
        let name = || module.name().to_owned();
        let result = tokio::select! {
            biased;
            () = gate.cancel.cancelled() => Err(ProxyError::Upstream {
                module: name(),
                reason: UpstreamFailure::IncarnationFailed { incarnation: gate.incarnation },
            }),
            result = bounded => match result {
                Ok(Ok(Some(answer))) => Ok(answer),
                Ok(Ok(None)) => {
                    // No slot free: the usual path, which queues.
                    let request = replay(&head);
                    return Answer::Response(Box::pin(proxy.answer(routed, request)).await);
                }
                Ok(Err(Refused::Pool(PoolError::LongLivedFull { limit }))) => {
                    Err(ProxyError::LongLivedFull { module: name(), limit })
                }
                Ok(Err(Refused::Pool(e))) => Err(ProxyError::Upstream {
                    module: name(),
                    reason: UpstreamFailure::Exchange(Arc::new(e)),
                }),
                Ok(Err(Refused::Failed(failure))) => Err(ProxyError::Upstream {
                    module: name(),
                    reason: failure,
                }),
                Err(after) => Err(ProxyError::Timeout { module: name(), after }),
            },
        };
        match result {
            Ok((conn, read)) => {
                conn.answered();
                module
                    .metrics()
                    .record(kind, route, read.status, started.elapsed());
                Answer::Bare(BareAnswer {
                    conn,
                    pool: gate.client.clone(),
                    read,
                    cancel: gate.cancel.clone(),
                    module: Arc::clone(module.shared_name()),
                    bytes_out: module.metrics().bytes_out().clone(),
                    _open: (kind == RouteKind::Stream).then(|| module.metrics().stream_open()),
                })
            }
            Err(error) => Answer::Response(recorded(&module, (kind, route), started, error)),
        }
    }
}

/// `error`'s response, recorded in the metrics of `route` (its kind and
/// index).
fn recorded(
    module: &ModuleHandle,
    (kind, route): (RouteKind, usize),
    started: Instant,
    error: ProxyError,
) -> Response {
    module
        .metrics()
        .record(kind, route, error.status(), started.elapsed());
    error_response(error)
}

/// The request as the module gets it, and what the usual path needs to
/// send it again.
struct RequestHead {
    /// `GET <target> HTTP/1.1`, the end-to-end headers, the blank line.
    bytes: Vec<u8>,
    uri: http::Uri,
    headers: http::HeaderMap,
}

/// The head of `request` for the module: its target in origin form and
/// its end-to-end headers (`Host` among them: the guard requires it of
/// HTTP/1.1).
fn request_head(request: Request<Body>) -> RequestHead {
    let (parts, _) = request.into_parts();
    let (uri, mut headers) = (parts.uri, parts.headers);
    strip_hop_by_hop(&mut headers);
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut bytes = Vec::with_capacity(256);
    bytes.extend_from_slice(b"GET ");
    bytes.extend_from_slice(target.as_bytes());
    bytes.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &headers {
        bytes.extend_from_slice(name.as_str().as_bytes());
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    RequestHead {
        bytes,
        uri,
        headers,
    }
}

/// The request again, for the usual path.
fn replay(head: &RequestHead) -> Request<Body> {
    let mut again = Request::new(Body::empty());
    *again.uri_mut() = head.uri.clone();
    *again.headers_mut() = head.headers.clone();
    again
}

/// Why an exchange got no answer's head.
enum Refused {
    /// The pool gave no connection.
    Pool(PoolError),
    /// The exchange failed.
    Failed(UpstreamFailure),
}

/// The exchange up to the answer's head: a bare connection from `pool`
/// held as `hold` says, the request written, the head read. `None` when no
/// slot is free.
async fn exchange(
    pool: &ModulePool,
    head: &RequestHead,
    hold: Hold,
) -> Result<Option<(BareConn, ReadAnswer)>, Refused> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut conn = match pool.lease_bare(hold).await {
            Ok(Some(conn)) => conn,
            Ok(None) => return Ok(None),
            Err(e) => return Err(Refused::Pool(e)),
        };
        match send_and_read_head(&mut conn, &head.bytes).await {
            Ok(read) => return Ok(Some((conn, read))),
            // Closed while idle: another connection.
            Err(Failed::Closed(_)) if conn.reused && tries < MAX_TRIES => continue,
            Err(Failed::Closed(e)) | Err(Failed::Io(e)) => {
                return Err(Refused::Failed(UpstreamFailure::Exchange(Arc::new(e))))
            }
            Err(Failed::Answer(failure)) => return Err(Refused::Failed(failure)),
        }
    }
}

/// How an exchange failed before its answer's head.
enum Failed {
    /// The connection was found closed before any answer.
    Closed(io::Error),
    /// Reading or writing failed otherwise.
    Io(io::Error),
    /// The answer's head is not one to pass on.
    Answer(UpstreamFailure),
}

/// What was read of an answer: its head, parsed, and what came after it.
pub(crate) struct ReadAnswer {
    status: StatusCode,
    /// The client's head, without the blank line that ends it.
    head: Vec<u8>,
    framing: Framing,
    /// Whether the connection may take another request after the body.
    keep_alive: bool,
    /// The module's bytes; `buf[start..]` are the body's (and beyond).
    buf: Vec<u8>,
    start: usize,
    /// The room the next body read asks for.
    room: usize,
}

/// How the module frames the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

async fn send_and_read_head(conn: &mut BareConn, head: &[u8]) -> Result<ReadAnswer, Failed> {
    let closed = |e: io::Error| match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Failed::Closed(e),
        _ => Failed::Io(e),
    };
    conn.stream.write_all(head).await.map_err(closed)?;
    let mut buf = Vec::with_capacity(READ_BUFFER_BYTES);
    loop {
        if !buf.is_empty() {
            match parse_answer(&buf)? {
                Parsed::Partial => {}
                Parsed::Informational(len) => {
                    // Dropped, so that a module sending them without end
                    // holds no more than one until its deadline.
                    buf.drain(..len);
                    continue;
                }
                Parsed::Final(mut read) => {
                    read.buf = buf;
                    return Ok(read);
                }
            }
        }
        if buf.len() >= MAX_ANSWER_HEAD_BYTES {
            return Err(Failed::Answer(UpstreamFailure::BadAnswer(format!(
                "its answer's head is over {MAX_ANSWER_HEAD_BYTES} bytes"
            ))));
        }
        if buf.capacity() == buf.len() {
            buf.reserve(buf.capacity());
        }
        let n = conn.stream.read_buf(&mut buf).await.map_err(|e| {
            if buf.is_empty() {
                closed(e)
            } else {
                Failed::Io(e)
            }
        })?;
        if n == 0 {
            let e = io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the module closed the connection before answering",
            );
            return Err(if buf.is_empty() {
                Failed::Closed(e)
            } else {
                Failed::Io(e)
            });
        }
    }
}

/// An answer's head parsed.
enum Parsed {
    /// Not all here yet.
    Partial,
    /// A 1xx head of this length, to skip.
    Informational(usize),
    /// The final head; `start` is its length.
    Final(ReadAnswer),
}

/// Parses the answer head at the start of `bytes` and writes the client's.
fn parse_answer(bytes: &[u8]) -> Result<Parsed, Failed> {
    let bad = |why: String| Failed::Answer(UpstreamFailure::BadAnswer(why));
    let mut lines = [httparse::EMPTY_HEADER; MAX_ANSWER_LINES];
    let mut answer = httparse::Response::new(&mut lines);
    let len = match answer.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => return Err(bad(format!("its answer's head is malformed: {e}"))),
    };
    let code = answer.code.unwrap_or_default();
    let status = StatusCode::from_u16(code)
        .map_err(|_| bad(format!("its answer's status {code} is not valid")))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(bad("it switched protocols on a plain GET".to_owned()));
    }
    if status.is_informational() {
        return Ok(Parsed::Informational(len));
    }
    let mut keep_alive = answer.version == Some(1);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut coded = false;
    let mut date = false;
    for line in answer.headers.iter() {
        if line.name.eq_ignore_ascii_case("content-length") {
            let value = std::str::from_utf8(line.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| bad("its Content-Length is not a number".to_owned()))?;
            if length.is_some_and(|l| l != value) {
                return Err(bad("it sent differing Content-Lengths".to_owned()));
            }
            length = Some(value);
        } else if line.name.eq_ignore_ascii_case("transfer-encoding") {
            coded = true;
            // Chunked, if the last coding named is (RFC 9112 §6.3).
            chunked = line
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if line.name.eq_ignore_ascii_case("connection") {
            keep_alive &= !connection_tokens(line.value).any(|t| t.eq_ignore_ascii_case(b"close"));
        } else if line.name.eq_ignore_ascii_case("date") {
            date = true;
        }
    }
    if coded && length.is_some() {
        return Err(Failed::Answer(UpstreamFailure::AmbiguousLength));
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::Empty
    } else if coded {
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(length) = length {
        Framing::Length(length)
    } else {
        Framing::UntilClose
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    // The client's head.
    let mut head = Vec::with_capacity(len + 64);
    put_status_line(&mut head, status);
    let named: Vec<&[u8]> = answer
        .headers
        .iter()
        .filter(|l| l.name.eq_ignore_ascii_case("connection"))
        .flat_map(|l| connection_tokens(l.value))
        .collect();
    for line in answer.headers.iter() {
        if is_hop_by_hop(line.name)
            || line.name.eq_ignore_ascii_case("content-length")
            || named
                .iter()
                .any(|n| n.eq_ignore_ascii_case(line.name.as_bytes()))
        {
            continue;
        }
        put_header_line(&mut head, line.name.as_bytes(), line.value);
    }
    if !date {
        put_date_line(&mut head);
    }
    match framing {
        Framing::Empty => {}
        Framing::Length(length) => put_framing_line(&mut head, Some(length)),
        Framing::Chunked | Framing::UntilClose => put_framing_line(&mut head, None),
    }
    Ok(Parsed::Final(ReadAnswer {
        status,
        head,
        framing,
        keep_alive,
        buf: Vec::new(),
        start: len,
        room: BODY_READ_BYTES,
    }))
}

/// A bare exchange's answer, its head read: relayed to the client with
/// [`BareAnswer::relay`].
pub struct BareAnswer {
    conn: BareConn,
    pool: ModulePool,
    read: ReadAnswer,
    cancel: CancellationToken,
    module: Arc<str>,
    bytes_out: Counter,
    /// A stream's count as open, until the relay ends.
    _open: Option<OpenGuard>,
}

impl std::fmt::Debug for BareAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareAnswer")
            .field("module", &self.module)
            .field("status", &self.read.status)
            .finish()
    }
}

impl BareAnswer {
    /// Writes the answer to `client`, with `connection: close` when
    /// `close`, `write` as the buffer. An error leaves the client's
    /// connection unusable: the caller closes it. The module's connection
    /// goes back to the pool when its answer ended cleanly.
    pub(crate) async fn relay(
        self,
        client: &mut impl ClientConn,
        write: &mut Vec<u8>,
        close: bool,
    ) -> io::Result<()> {
        let BareAnswer {
            mut conn,
            pool,
            mut read,
            cancel,
            module,
            bytes_out,
            _open,
        } = self;
        write.clear();
        write.extend_from_slice(&read.head);
        if close {
            write.extend_from_slice(b"connection: close\r\n");
        }
        write.extend_from_slice(b"\r\n");
        let relayed = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(io::Error::other(ModuleFailed(module.to_string()))),
            relayed = relay_body(&mut conn, &mut read, client, write) => relayed?,
        };
        bytes_out.inc_by(relayed.bytes);
        if relayed.clean && read.keep_alive && read.start == read.buf.len() && conn.reusable() {
            pool.give_back_bare(conn).await;
        }
        Ok(())
    }
}

/// How a body went.
struct Relayed {
    bytes: u64,
    /// Ended where its framing said, nothing read beyond.
    clean: bool,
}

async fn relay_body(
    conn: &mut BareConn,
    read: &mut ReadAnswer,
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
) -> io::Result<Relayed> {
    let mut bytes = 0u64;
    match read.framing {
        Framing::Empty => {}
        Framing::Length(length) => {
            bytes = pass(
                conn,
                read,
                client,
                write,
                length,
                "before its Content-Length",
            )
            .await?;
        }
        Framing::UntilClose => loop {
            let here = read.buf.len() - read.start;
            if here > 0 {
                put_chunk(client, write, &read.buf[read.start..]).await?;
                read.start += here;
                bytes += here as u64;
            }
            if !more(conn, read, client, write).await? {
                write.extend_from_slice(b"0\r\n\r\n");
                break;
            }
        },
        Framing::Chunked => bytes = relay_chunked(conn, read, client, write).await?,
    }
    client.write_all(write).await?;
    write.clear();
    Ok(Relayed {
        bytes,
        clean: read.framing != Framing::UntilClose,
    })
}

/// Where the walk through a chunked body stands between reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkAt {
    /// At a chunk's size line.
    Size,
    /// In a chunk's data, this many bytes of it still to come.
    Data(u64),
    /// At the line's end after a chunk's data.
    End,
}

impl ChunkAt {
    /// Where the module's close would cut the body, for its error.
    fn place(self) -> &'static str {
        match self {
            ChunkAt::Size => "in a chunk's size",
            ChunkAt::Data(_) => "in a chunk",
            ChunkAt::End => "after a chunk",
        }
    }
}

/// How a walk through what one read brought ended.
enum Walked {
    /// Everything here is walked; more must be read.
    NeedMore,
    /// [`MAX_CHUNK_PIECES`] pieces gathered; more is here.
    Full,
    /// At the last chunk (size 0), its size line walked.
    Last,
}

/// Relays a chunked body: the data of whatever chunks (or parts of
/// chunks) a read brought goes on as one chunk, in one write with its
/// size line and line's end (a proxy may chunk a body anew: the body
/// leaves in as many chunks as it took reads, whatever the module's
/// chunks were). Chunk extensions and trailers are dropped. Returns the
/// data's length.
async fn relay_chunked(
    conn: &mut BareConn,
    read: &mut ReadAnswer,
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
) -> io::Result<u64> {
    let malformed = || io::Error::other("the module's chunked body is malformed");
    let mut at = ChunkAt::Size;
    let mut bytes = 0u64;
    loop {
        let mut pieces = [(0usize, 0usize); MAX_CHUNK_PIECES];
        let mut gathered = 0;
        let walked = loop {
            if gathered == MAX_CHUNK_PIECES {
                break Walked::Full;
            }
            let rest = &read.buf[read.start..];
            match at {
                ChunkAt::Data(left) => {
                    if rest.is_empty() {
                        break Walked::NeedMore;
                    }
                    let take = left.min(rest.len() as u64) as usize;
                    pieces[gathered] = (read.start, read.start + take);
                    gathered += 1;
                    read.start += take;
                    at = match left - take as u64 {
                        0 => ChunkAt::End,
                        left => ChunkAt::Data(left),
                    };
                }
                ChunkAt::End => {
                    if rest.len() < 2 {
                        break Walked::NeedMore;
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(malformed());
                    }
                    read.start += 2;
                    at = ChunkAt::Size;
                }
                ChunkAt::Size => match httparse::parse_chunk_size(rest) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        read.start += used;
                        if size == 0 {
                            break Walked::Last;
                        }
                        at = ChunkAt::Data(size);
                    }
                    Ok(httparse::Status::Partial) if rest.len() < MAX_CHUNK_META_BYTES => {
                        break Walked::NeedMore;
                    }
                    _ => return Err(malformed()),
                },
            }
        };
        let mut data: [&[u8]; MAX_CHUNK_PIECES] = [&[]; MAX_CHUNK_PIECES];
        for (slot, &(from, to)) in data.iter_mut().zip(&pieces[..gathered]) {
            *slot = &read.buf[from..to];
            bytes += (to - from) as u64;
        }
        put_chunk_of(client, write, &data[..gathered]).await?;
        match walked {
            Walked::NeedMore => fill(conn, read, client, write, at.place()).await?,
            Walked::Full => {}
            Walked::Last => break,
        }
    }
    // The trailers, dropped, up to the blank line.
    loop {
        let rest = &read.buf[read.start..];
        if rest.starts_with(b"\r\n") {
            read.start += 2;
            break;
        }
        if let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            read.start += end + 4;
            break;
        }
        if rest.len() >= MAX_CHUNK_META_BYTES {
            return Err(io::Error::other("the module's trailers are too long"));
        }
        fill(conn, read, client, write, "in its trailers").await?;
    }
    write.extend_from_slice(b"0\r\n\r\n");
    Ok(bytes)
}

/// Passes the next `length` bytes of the answer on to the client, read as
/// they come; an end before them is an error (`place` says where).
async fn pass(
    conn: &mut BareConn,
    read: &mut ReadAnswer,
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
    length: u64,
    place: &str,
) -> io::Result<u64> {
    let mut remaining = length;
    loop {
        let here = (read.buf.len() - read.start) as u64;
        let take = here.min(remaining) as usize;
        put(client, write, &read.buf[read.start..read.start + take]).await?;
        read.start += take;
        remaining -= take as u64;
        if remaining == 0 {
            return Ok(length);
        }
        fill(conn, read, client, write, place).await?;
    }
}

/// Reads more of the module's answer, what waits for the client written
/// first; an end of the connection is an error (`where` says where).
async fn fill(
    conn: &mut BareConn,
    read: &mut ReadAnswer,
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
    place: &str,
) -> io::Result<()> {
    if !more(conn, read, client, write).await? {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the module closed the connection {place}"),
        ));
    }
    Ok(())
}

/// Reads more of the module's answer, what waits for the client written
/// first; `false` at the end of the connection.
async fn more(
    conn: &mut BareConn,
    read: &mut ReadAnswer,
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
) -> io::Result<bool> {
    if !write.is_empty() {
        client.write_all(write).await?;
        write.clear();
    }
    if read.start == read.buf.len() {
        read.buf.clear();
        read.start = 0;
    } else if read.start > 0 {
        read.buf.drain(..read.start);
        read.start = 0;
    }
    read.buf.reserve(
        read.room
            .saturating_sub(read.buf.capacity() - read.buf.len()),
    );
    // A client that leaves while the module is silent gives the answer up,
    // as on hyper's path.
    let n = tokio::select! {
        biased;
        n = conn.stream.read_buf(&mut read.buf) => {
            let n = n?;
            if n >= read.room {
                read.room = (read.room * 2).min(MAX_BODY_READ_BYTES);
            }
            n
        }
        () = client.gone() => {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the client closed its connection",
            ))
        }
    };
    Ok(n > 0)
}

#[cfg(test)]
mod tests;
