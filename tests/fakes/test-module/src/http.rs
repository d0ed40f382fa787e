//! Plain-HTTP routes of the test-module: health switching, echo, streamed
//! request and response bodies, status codes, odd headers and the routes
//! that crash or block the process.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{AppendHeaders, IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::StreamExt;
use ray_dashd_contract::LockExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::state::{AppState, HealthMode};

/// How long `POST /test/hang` blocks the runtime thread: longer than any test.
const HANG_FOR: Duration = Duration::from_secs(3600);

/// `GET /api/healthz`: answers according to the current [`HealthMode`].
pub(crate) async fn healthz(State(state): State<AppState>) -> Response {
    match state.health() {
        HealthMode::Ok => (StatusCode::OK, "ok").into_response(),
        HealthMode::Fail => (StatusCode::INTERNAL_SERVER_ERROR, "unhealthy").into_response(),
        HealthMode::NeverReady => {
            tokio::time::sleep(state.not_ready.delay).await;
            (
                StatusCode::SERVICE_UNAVAILABLE,
                state.not_ready.body.clone(),
            )
                .into_response()
        }
        HealthMode::Hang => std::future::pending().await,
    }
}

/// `POST /test/health/{mode}`: switches how `/api/healthz` answers.
pub(crate) async fn set_health(
    State(state): State<AppState>,
    Path(mode): Path<String>,
) -> Response {
    match HealthMode::parse(&mode) {
        Some(parsed) => {
            state.set_health(parsed);
            tracing::info!(mode = %mode, "health mode switched");
            format!("health {mode}").into_response()
        }
        None => (
            StatusCode::BAD_REQUEST,
            format!("unknown health mode {mode}"),
        )
            .into_response(),
    }
}

/// `/test/echo` and `/test/echo/{*rest}`, any method: describes the request.
pub(crate) async fn echo(State(state): State<AppState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body_len = match count_body(body).await {
        Ok(n) => n,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    // HeaderMap keeps values of one name in order, but groups repeated names
    // at the position of their first occurrence.
    let headers: Vec<[String; 2]> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            [name.as_str().to_owned(), value]
        })
        .collect();
    Json(json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path(),
        "query": parts.uri.query(),
        "headers": headers,
        "body_len": body_len,
        "incarnation": state.incarnation,
        "pid": std::process::id(),
        "module": state.module,
    }))
    .into_response()
}

/// `POST /test/body`: counts the request body chunk by chunk.
pub(crate) async fn body(request: Request) -> Response {
    match count_body(request.into_body()).await {
        Ok(bytes) => Json(json!({ "bytes": bytes })).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// `POST /test/early`: answers 200 at once and reads the request body
/// afterwards, in the background, as a module that answers before the
/// upload is over does. The connection stays busy until the body ends.
pub(crate) async fn early(request: Request) -> Response {
    tokio::spawn(count_body(request.into_body()));
    (StatusCode::OK, "answered before the body").into_response()
}

/// Consumes `body` without buffering it and returns its length in bytes.
async fn count_body(body: Body) -> Result<u64, axum::Error> {
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        total += chunk?.len() as u64;
    }
    Ok(total)
}

/// Query of `GET /test/stream`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamQuery {
    /// Number of chunks (default 10).
    chunks: Option<usize>,
    /// Bytes per chunk (default 16).
    size: Option<usize>,
    /// Milliseconds to wait before each chunk after the first (default 0).
    delay_ms: Option<u64>,
}

/// `GET /test/stream`: a body of `chunks` chunks of `size` bytes, chunk `i`
/// filled with `b'a' + i % 26`.
pub(crate) async fn stream(
    State(state): State<AppState>,
    Query(query): Query<StreamQuery>,
) -> Response {
    let chunks = query.chunks.unwrap_or(10);
    let size = query.size.unwrap_or(16);
    // One allocation holds every distinct chunk; each chunk is a cheap slice.
    let distinct = chunks.min(26);
    let pattern: Vec<u8> = (0..distinct)
        .flat_map(|i| std::iter::repeat_n(b'a' + (i % 26) as u8, size))
        .collect();
    state.streams_started.fetch_add(1, Ordering::Relaxed);
    let body = StreamBody {
        state,
        pattern: Bytes::from(pattern),
        size,
        chunks,
        next: 0,
        delay: Duration::from_millis(query.delay_ms.unwrap_or(0)),
        finished: false,
    };
    let stream = futures_util::stream::unfold(body, |mut body| async move {
        if body.next == body.chunks {
            body.finished = true;
            // Dropping the state now is what counts the stream as completed.
            drop(body);
            return None;
        }
        if body.next > 0 && !body.delay.is_zero() {
            tokio::time::sleep(body.delay).await;
        }
        let start = (body.next % 26) * body.size;
        let chunk = body.pattern.slice(start..start + body.size);
        body.next += 1;
        Some((Ok::<_, Infallible>(chunk), body))
    });
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// State of one `/test/stream` body; counts itself completed or cancelled
/// when dropped.
#[derive(Debug)]
struct StreamBody {
    state: AppState,
    /// `min(chunks, 26)` chunks laid end to end.
    pattern: Bytes,
    size: usize,
    chunks: usize,
    /// Index of the next chunk to yield.
    next: usize,
    delay: Duration,
    /// Set once the stream has yielded its end.
    finished: bool,
}

impl Drop for StreamBody {
    fn drop(&mut self) {
        let counter = if self.finished {
            &self.state.streams_completed
        } else {
            tracing::info!(sent = self.next, chunks = self.chunks, "stream cancelled");
            &self.state.streams_cancelled
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `GET /test/stats`: stream, websocket, request and connection counters.
pub(crate) async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(json!({
        "streams_started": state.streams_started.load(Ordering::Relaxed),
        "streams_completed": state.streams_completed.load(Ordering::Relaxed),
        "streams_cancelled": state.streams_cancelled.load(Ordering::Relaxed),
        "ws_last_close": state.ws_last_close(),
        "requests_in_flight": state.requests_in_flight.load(Ordering::Relaxed),
        "connections_open": state.connections_open.load(Ordering::Relaxed),
        "connections_peak": state.connections_peak.load(Ordering::Relaxed),
    }))
}

/// `POST /test/crash`: exits with code 3 without answering.
pub(crate) async fn crash() -> Response {
    tracing::warn!("crashing on request");
    std::process::exit(3)
}

/// `POST /test/hang`: blocks the only runtime thread, so nothing else
/// (health checks included) is served any more.
pub(crate) async fn hang() -> Response {
    tracing::warn!("blocking the runtime thread on request");
    std::thread::sleep(HANG_FOR);
    (StatusCode::OK, "hang over").into_response()
}

/// Query of `GET /test/count`.
#[derive(Debug, Deserialize)]
pub(crate) struct CountQuery {
    /// Milliseconds to wait before answering (default 0).
    ms: Option<u64>,
    /// A header to answer with, `name:value` (say `set-cookie:a=b`).
    header: Option<String>,
    /// The status to answer with (default 200).
    status: Option<u16>,
    /// Characters of padding in the answer (`"pad"`), to make it large.
    pad: Option<usize>,
}

/// `GET /test/count?ms=N`: counts the requests that reached the module
/// and answers, after `N` ms, with the count so far (`{"n": …}`): how
/// shared answers are seen to spare the module.
pub(crate) async fn count(Query(query): Query<CountQuery>) -> Response {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed) + 1;
    tokio::time::sleep(Duration::from_millis(query.ms.unwrap_or(0))).await;
    let status = StatusCode::from_u16(query.status.unwrap_or(200)).unwrap_or(StatusCode::OK);
    let pad = "x".repeat(query.pad.unwrap_or(0).min(64 << 20));
    let mut response = (status, Json(json!({ "n": n, "pad": pad }))).into_response();
    if let Some((name, value)) = query.header.as_deref().and_then(|h| h.split_once(':')) {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            header::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Query of `POST /test/spin`.
#[derive(Debug, Deserialize)]
pub(crate) struct SpinQuery {
    /// Milliseconds of CPU work.
    ms: u64,
}

/// `POST /test/spin?ms=N`: computes for `N` ms on the only runtime thread,
/// as a module building a big answer does: busy, not hung, though nothing
/// else (health checks included) is served meanwhile.
pub(crate) async fn spin(Query(query): Query<SpinQuery>) -> Response {
    tracing::warn!(ms = query.ms, "computing on the runtime thread on request");
    let until = std::time::Instant::now() + Duration::from_millis(query.ms);
    let mut x = 0u64;
    while std::time::Instant::now() < until {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    (StatusCode::OK, format!("spun {x:x}")).into_response()
}

/// Query of `POST /test/grow`.
#[derive(Debug, Deserialize)]
pub(crate) struct GrowQuery {
    /// MiB to allocate, touch and keep.
    mib: usize,
}

/// `POST /test/grow?mib=N`: answers, then (100 ms later, so that the
/// answer has gone) allocates `N` MiB more, touches every page (so it is
/// resident) and keeps it for the life of the process. Grown first, the
/// module could be replaced over its memory budget before its answer left,
/// and the client would get 502.
pub(crate) async fn grow(Query(query): Query<GrowQuery>) -> Response {
    static KEPT: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
    let mib = query.mib;
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let block = vec![1u8; mib << 20];
        KEPT.locked().push(block);
    });
    (StatusCode::OK, format!("growing by {mib} MiB")).into_response()
}

/// Query of `POST /test/print`.
#[derive(Debug, Deserialize)]
pub(crate) struct PrintQuery {
    /// How many lines.
    lines: usize,
    /// `out` or `err` (default `out`).
    stream: Option<String>,
}

/// `POST /test/print?lines=N&stream=out|err`: writes `N` numbered lines of
/// 100 bytes each (`line 000042 xxx…`) to stdout or stderr.
pub(crate) async fn print(Query(query): Query<PrintQuery>) -> Response {
    use std::io::Write;
    let text: String = (0..query.lines)
        .map(|i| format!("line {i:06} {}\n", "x".repeat(88)))
        .collect();
    let written = match query.stream.as_deref().unwrap_or("out") {
        "out" => std::io::stdout().lock().write_all(text.as_bytes()),
        "err" => std::io::stderr().lock().write_all(text.as_bytes()),
        other => return (StatusCode::BAD_REQUEST, format!("no stream {other}")).into_response(),
    };
    match written {
        Ok(()) => (StatusCode::OK, format!("{}", text.len())).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Query of `GET /test/slow`.
#[derive(Debug, Deserialize)]
pub(crate) struct SlowQuery {
    /// Milliseconds to wait before answering (default 1000).
    ms: Option<u64>,
}

/// `GET /test/slow?ms=N`: answers after `N` milliseconds.
pub(crate) async fn slow(Query(query): Query<SlowQuery>) -> &'static str {
    tokio::time::sleep(Duration::from_millis(query.ms.unwrap_or(1000))).await;
    "slow done"
}

/// `GET /test/status/{code}`: answers with that status code; redirects
/// point at `/test/echo?redirected=1`.
pub(crate) async fn status(Path(code): Path<u16>) -> Response {
    let Ok(status) = StatusCode::from_u16(code) else {
        return (StatusCode::BAD_REQUEST, format!("invalid status {code}")).into_response();
    };
    let body = format!("status {code}");
    match code {
        301 | 302 | 303 | 307 | 308 => (
            status,
            [(header::LOCATION, "/test/echo?redirected=1")],
            body,
        )
            .into_response(),
        _ => (status, body).into_response(),
    }
}

/// `GET /test/cookies`: three separate `set-cookie` headers.
pub(crate) async fn cookies() -> impl IntoResponse {
    (
        AppendHeaders([
            (header::SET_COOKIE, "a=1"),
            (header::SET_COOKIE, "b=2"),
            (header::SET_COOKIE, "c=3"),
        ]),
        "cookies",
    )
}

/// `GET /test/hop`: hop-by-hop response headers a proxy must strip
/// (RFC 9110 §7.6.1), plus one end-to-end header it must keep.
pub(crate) async fn hop() -> impl IntoResponse {
    (
        [
            ("x-hop-resp", "secret"),
            ("connection", "x-hop-resp"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic"),
            ("proxy-connection", "keep-alive"),
            ("trailer", "x-trail"),
            ("x-end-to-end", "kept"),
        ],
        "hop",
    )
}

/// `GET /test/info`: identity and the `RAY_DASHD_*` environment.
pub(crate) async fn info(State(state): State<AppState>) -> Json<Value> {
    let env: serde_json::Map<String, Value> = std::env::vars_os()
        .filter_map(|(name, value)| {
            let name = name.into_string().ok()?;
            name.starts_with("RAY_DASHD_").then(|| {
                let value = value.to_string_lossy().into_owned();
                (name, Value::String(value))
            })
        })
        .collect();
    Json(json!({
        "pid": std::process::id(),
        "incarnation": state.incarnation,
        "module": state.module,
        "socket": state.socket.to_string_lossy(),
        "env": env,
    }))
}

/// `GET /test/decline`: with `TEST_MODULE_DECLINE=1` in its environment,
/// declines the request (421 with the contract's decline header), so that
/// the host asks the route's fallback module; else the module's info.
pub(crate) async fn decline(state: State<AppState>) -> Response {
    use ray_dashd_contract::names::{DECLINE_HEADER, DECLINE_STATUS};
    if std::env::var("TEST_MODULE_DECLINE").is_ok_and(|v| v == "1") {
        let status = StatusCode::from_u16(DECLINE_STATUS).expect("421 is a status");
        return (
            status,
            [(DECLINE_HEADER, "the test module declines")],
            "declined",
        )
            .into_response();
    }
    info(state).await.into_response()
}
