//! State shared by the test-module's handlers: identity, the switchable
//! health mode, stream, websocket and connection counters, and the
//! in-flight request count kept by the [`track_in_flight`] middleware.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use ray_dashd_contract::LockExt;

/// Handle to the shared state given to every handler.
pub(crate) type AppState = Arc<Shared>;

/// How `GET /api/healthz` answers; switched by `POST /test/health/{mode}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum HealthMode {
    /// 200 `ok`.
    Ok = 0,
    /// 500 `unhealthy`.
    Fail = 1,
    /// Never answers.
    Hang = 2,
    /// 503 `not ready`: the start-up mode under `TEST_MODULE_NEVER_READY=1`.
    NeverReady = 3,
}

impl HealthMode {
    /// Parses the `{mode}` of `POST /test/health/{mode}`.
    pub(crate) fn parse(mode: &str) -> Option<Self> {
        match mode {
            "ok" => Some(Self::Ok),
            "fail" => Some(Self::Fail),
            "hang" => Some(Self::Hang),
            _ => None,
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            1 => Self::Fail,
            2 => Self::Hang,
            3 => Self::NeverReady,
            _ => Self::Ok,
        }
    }
}

/// A websocket Close frame received from a client.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct CloseRecord {
    /// Close code; 1005 when the frame carried none (RFC 6455 §7.4.1).
    pub(crate) code: u16,
    /// Close reason, possibly empty.
    pub(crate) reason: String,
}

/// How `/api/healthz` answers while the module is not ready.
#[derive(Debug, Clone)]
pub(crate) struct NotReady {
    /// The 503's body.
    pub(crate) body: String,
    /// How long the answer takes (a Python module's takes a few ms).
    pub(crate) delay: std::time::Duration,
}

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Module name from `RAY_DASHD_MODULE`.
    pub(crate) module: String,
    /// Incarnation from `RAY_DASHD_INCARNATION`.
    pub(crate) incarnation: u32,
    /// Socket path from `RAY_DASHD_SOCKET`.
    pub(crate) socket: PathBuf,
    /// Current [`HealthMode`], stored as its `u8` discriminant.
    health: AtomicU8,
    /// How healthz answers in [`HealthMode::NeverReady`].
    pub(crate) not_ready: NotReady,
    /// `/test/stream` bodies created.
    pub(crate) streams_started: AtomicU64,
    /// `/test/stream` bodies that yielded every chunk.
    pub(crate) streams_completed: AtomicU64,
    /// `/test/stream` bodies dropped before the last chunk.
    pub(crate) streams_cancelled: AtomicU64,
    /// Requests whose handler or response body is still alive.
    pub(crate) requests_in_flight: AtomicU64,
    /// Connections accepted and not yet closed.
    pub(crate) connections_open: AtomicU64,
    /// The most connections open at once so far.
    pub(crate) connections_peak: AtomicU64,
    /// Last Close frame a client sent to `/test/ws/echo`.
    pub(crate) ws_last_close: Mutex<Option<CloseRecord>>,
}

impl Shared {
    /// Creates the state with all counters at zero.
    pub(crate) fn new(
        module: String,
        incarnation: u32,
        socket: PathBuf,
        health: HealthMode,
        not_ready: NotReady,
    ) -> Self {
        Self {
            module,
            incarnation,
            socket,
            health: AtomicU8::new(health as u8),
            not_ready,
            streams_started: AtomicU64::new(0),
            streams_completed: AtomicU64::new(0),
            streams_cancelled: AtomicU64::new(0),
            requests_in_flight: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_peak: AtomicU64::new(0),
            ws_last_close: Mutex::new(None),
        }
    }

    /// The current health mode.
    pub(crate) fn health(&self) -> HealthMode {
        HealthMode::from_u8(self.health.load(Ordering::Relaxed))
    }

    /// Switches the health mode.
    pub(crate) fn set_health(&self, mode: HealthMode) {
        self.health.store(mode as u8, Ordering::Relaxed);
    }

    /// Records a Close frame received from a websocket client.
    pub(crate) fn record_ws_close(&self, record: CloseRecord) {
        *self.ws_last_close.locked() = Some(record);
    }

    /// The last recorded websocket Close frame.
    pub(crate) fn ws_last_close(&self) -> Option<CloseRecord> {
        self.ws_last_close.locked().clone()
    }
}

/// Middleware counting a request as in flight from its arrival until its
/// handler is dropped unfinished or its response body is finished or dropped.
pub(crate) async fn track_in_flight(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let guard = InFlight::enter(state);
    next.run(request).await.map(|inner| {
        Body::new(InFlightBody {
            inner,
            _guard: guard,
        })
    })
}

/// Holds one unit of `requests_in_flight` until dropped.
#[derive(Debug)]
struct InFlight(AppState);

impl InFlight {
    fn enter(state: AppState) -> Self {
        state.requests_in_flight.fetch_add(1, Ordering::Relaxed);
        Self(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.requests_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request counted as in flight.
#[derive(Debug)]
struct InFlightBody {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for InFlightBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
