//! The connections to one incarnation of a module: HTTP/1.1 over its Unix
//! socket, each reused once the response on it has ended, at most
//! `max_connections` of them.
//!
//! A pool serves exactly one socket and one incarnation, so it needs no
//! keys, no hashing and no expiry of its own: idle connections sit in a
//! stack, a connection the module closed is noticed at checkout, and the
//! whole pool goes when the incarnation does. (hyper-util's general client
//! hashes a pool key and hops through a dispatch future on every request;
//! measured on the proxy path, this is cheaper.)
//!
//! Each connection is run by a task of its own (hyper's connection future),
//! which holds the connection's slot until its socket closes; a request
//! hands its message to that task and waits for the answer's head, and the
//! answer's body comes back the same way. An upload therefore goes on while
//! the client is slow to read the answer, and a connection the module
//! closes while idle is seen closed at once. (Running each connection in
//! the task of the request that uses it saves the hand-over, but measured
//! through the benchmark at 16 connections it cost more than it saved:
//! about 1.7 µs of proxy CPU per request and 10 % of the throughput, with
//! twice the host's context switches: the host woke for each exchange
//! rather than for many at once.)
//!
//! # The cap
//!
//! A connect to a Unix socket whose listen backlog is full fails at once
//! with EAGAIN (there is no SYN to resend, as TCP has), and aiohttp listens
//! with a backlog of 128: with a connection per concurrent request, a burst
//! of a few hundred had some answered 502. So each connection holds a
//! [`Slot`], one of `max_connections`, from before its connect: an `http`
//! exchange's until its socket is closed (while idle too), a stream's or a
//! websocket's until its answer has started, which proves the module took
//! it off its backlog. A request that finds no idle connection and no free
//! slot waits in a FIFO queue (at most `max_queued` long; beyond,
//! [`PoolError::Busy`]) until its deadline ([`PoolError::Waited`]). A
//! connection given back goes straight to the oldest waiter, and a slot
//! let go too, so the idle stack holds anything only while nobody waits.
//! The idle stack, the count and the queue share the one lock the idle
//! stack always had: taking an idle connection and giving it back costs
//! what it did before the cap, one short lock each. Health probes never
//! wait: see [`ModulePool::probe`].
//!
//! # Long-lived exchanges
//!
//! A stream or a websocket may stay open for hours, so once answered it
//! gives its slot back (counting it there let 100 followed logs starve
//! every other request) and holds a [`LongLived`] ticket instead, one of
//! `max_long_lived`, until it ends; its connection is never reused. With
//! every ticket taken the next one is refused at once
//! ([`PoolError::LongLivedFull`]), never queued: a ticket comes free only
//! when someone closes a tab.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::Either;
use http::{Request, Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use ray_dashd_contract::{Backoff, LockExt};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::debug;

use super::module_stream::ModuleStream;
use super::peer::PeerCheck;
use crate::config::ConnectionLimits;

/// The pauses before connecting again when the module's listen backlog
/// was full: 1 ms first, doubling up to 32 ms between two connects.
const CONNECT_RETRY: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(32));
/// How long a connect refused with EAGAIN is tried again. An event loop
/// takes everything pending in its backlog each time it comes round (asyncio
/// up to the backlog's length at once), so a backlog stays full only while
/// a handler holds the loop, for milliseconds as a rule; a module that
/// accepts nothing for a quarter of a second is better answered with a 502
/// now than waited on.
const CONNECT_RETRY_BUDGET: Duration = Duration::from_millis(250);

/// Why a request could not be sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    /// The socket refused or is missing.
    #[error("cannot connect to {socket}: {source}")]
    Connect {
        /// The module's socket.
        socket: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// Every connection is in use and the queue is full.
    #[error("all {connections} connections in use and {queued} requests queued")]
    Busy {
        /// Connections open (the cap).
        connections: usize,
        /// Requests waiting.
        queued: usize,
    },
    /// The request waited for a connection until its deadline.
    #[error("no connection came free in time (all {connections} in use)")]
    Waited {
        /// Connections open (the cap).
        connections: usize,
    },
    /// As many streams and websockets as may be are open already.
    #[error("all {limit} streams and websockets allowed are open")]
    LongLivedFull {
        /// The cap: `max_long_lived_connections`.
        limit: usize,
    },
}

/// What an exchange holds its connection for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// One request and its answer; the connection is reused after.
    Exchange,
    /// A stream or a websocket, open for as long as the client keeps it:
    /// counted under `max_long_lived`, not `max_connections`, once
    /// answered; its connection is not reused.
    LongLived,
}

/// A pool's numbers now, for `/api/modules`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConnectionStats {
    /// The cap: `max_connections`.
    pub max: usize,
    /// Connections open (idle, in use, or being opened).
    pub open: usize,
    /// Of those, idle.
    pub idle: usize,
    /// Requests waiting for a connection.
    pub queued: usize,
    /// Most requests that may wait: `max_queued_requests`.
    pub max_queued: usize,
    /// Streams and websockets open.
    pub long_lived: usize,
    /// Most that may be: `max_long_lived_connections`.
    pub max_long_lived: usize,
}

impl ConnectionStats {
    /// The numbers of a module with no pool (no healthy incarnation).
    pub fn none(limits: ConnectionLimits) -> ConnectionStats {
        ConnectionStats {
            max: limits.max_connections,
            open: 0,
            idle: 0,
            queued: 0,
            max_queued: limits.max_queued,
            long_lived: 0,
            max_long_lived: limits.max_long_lived,
        }
    }
}

/// A cloneable handle to the pool of one incarnation.
#[derive(Debug, Clone)]
pub struct ModulePool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    limits: ConnectionLimits,
    /// Who must serve `socket`, when the pool belongs to a process ray-dashd
    /// started (see [`PeerCheck`]).
    peer: Option<PeerCheck>,
    state: Mutex<State>,
    /// [`LongLived`] tickets held.
    long_lived: AtomicUsize,
}

/// What the pool's lock guards. No [`Conn`] or [`Slot`] may be dropped
/// while it is held: dropping a slot takes it.
#[derive(Debug, Default)]
struct State {
    /// Connections ready for a request; only while `queue` is empty.
    idle: Vec<Conn>,
    /// Bare connections ready for a request ([`ModulePool::lease_bare`]),
    /// each with its slot; only while `queue` is empty.
    bare_idle: Vec<(ModuleStream, Slot)>,
    /// Slots held: connections open or being opened.
    open: usize,
    /// Requests waiting for a connection or a slot, oldest first. Some may
    /// have given up; their sends fail and the next is tried.
    queue: VecDeque<oneshot::Sender<Grant>>,
}

impl Inner {
    /// The pool's state (a panic elsewhere while it was held leaves it as
    /// it is: each idle connection is checked before use).
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Gives a connection or a slot to the oldest request still waiting;
    /// with none, the connection goes idle and the slot is let go.
    fn hand_on(&self, mut grant: Grant) {
        let mut state = self.state();
        while let Some(waiter) = state.queue.pop_front() {
            match waiter.send(grant) {
                Ok(()) => return,
                // It gave up; the grant comes back whole, nothing dropped.
                Err(back) => grant = back,
            }
        }
        match grant {
            Grant::Conn(conn) => state.idle.push(conn),
            Grant::Slot(slot) => {
                debug_assert!(state.open > 0, "a slot was let go twice");
                state.open = state.open.saturating_sub(1);
                // Counted off just above: its drop must not hand it on again.
                slot.forget();
            }
        }
    }
}

/// The right to one of the pool's `max_connections` connections, held by
/// whatever keeps that connection's socket open (or, for a long-lived
/// exchange, until it is answered); let go, it goes to the oldest waiting
/// request or back to the count.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Empty once let go.
    pool: Mutex<Weak<Inner>>,
}

impl Slot {
    fn new(pool: Weak<Inner>) -> Slot {
        Slot {
            pool: Mutex::new(pool),
        }
    }

    /// Gives the slot back now, though whatever holds it lives on; once.
    fn let_go(&self) {
        let pool = std::mem::take(&mut *self.pool.locked());
        if let Some(inner) = pool.upgrade() {
            inner.hand_on(Grant::Slot(Slot::new(pool)));
        }
    }

    /// Counted off already: dropping it does nothing.
    fn forget(self) {
        *self.pool.locked() = Weak::new();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.let_go();
    }
}

/// The right of a stream or a websocket to stay open, one of the pool's
/// `max_long_lived`; counted off when dropped.
#[derive(Debug)]
pub(crate) struct LongLived {
    pool: Weak<Inner>,
}

impl Drop for LongLived {
    fn drop(&mut self) {
        if let Some(inner) = self.pool.upgrade() {
            inner.long_lived.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// What a waiting request is given.
#[derive(Debug)]
enum Grant {
    /// A connection another request has finished with.
    Conn(Conn),
    /// A slot let go: open a connection with it.
    Slot(Slot),
}

/// What a request gets to send on.
enum Lease {
    /// An idle connection (the module may have closed it since).
    Idle(Conn),
    /// An idle bare connection, to run hyper on (the module may have
    /// closed it since).
    Bare(ModuleStream, Slot),
    /// A slot to open a new connection with.
    Open(Slot),
    /// Nothing counted: a connection beyond the cap, for one exchange.
    Extra,
}

/// One connection: the handle that sends on it. The task that runs the
/// connection holds its slot too, so the slot is let go once both are done
/// with it: the socket closed, and this handle dropped (or, after a 101,
/// the upgraded socket's holder done with it).
#[derive(Debug)]
struct Conn {
    sender: SendRequest<Body>,
    /// `None` beyond the cap.
    slot: Option<Arc<Slot>>,
}

impl Conn {
    /// Whether a new request can go on the connection now: not if the
    /// module closed it, nor while it is still sending an upload that the
    /// module answered before reading it all.
    fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }
}

/// A connection leased bare ([`ModulePool::lease_bare`]): the caller
/// speaks HTTP/1.1 on it itself, and gives it back with
/// [`ModulePool::give_back_bare`] when its exchange ended cleanly; dropped,
/// it closes and its slot is let go.
#[derive(Debug)]
pub(crate) struct BareConn {
    /// The socket.
    pub(crate) stream: ModuleStream,
    slot: Slot,
    /// Whether it waited idle, and so may have been closed by the module.
    pub(crate) reused: bool,
    /// A stream's ticket, held until the connection is dropped.
    ticket: Option<LongLived>,
}

impl BareConn {
    /// The answer's head came: a stream's connection gives its slot back
    /// (the module took it off its backlog) and counts under its ticket
    /// from now on; it is not given back to the pool after.
    pub(crate) fn answered(&self) {
        if self.ticket.is_some() {
            self.slot.let_go();
        }
    }

    /// Whether the connection may take another exchange once this one
    /// ended cleanly: not a stream's.
    pub(crate) fn reusable(&self) -> bool {
        self.ticket.is_none()
    }
}

impl ModulePool {
    /// A pool of at most `limits.max_connections` connections to `socket`;
    /// none is opened yet.
    pub fn new(socket: PathBuf, limits: ConnectionLimits) -> ModulePool {
        ModulePool::serving(socket, limits, None)
    }

    /// [`ModulePool::new`] whose every new connection is checked with
    /// `peer`: a socket served by another process is refused.
    pub fn serving(
        socket: PathBuf,
        limits: ConnectionLimits,
        peer: Option<PeerCheck>,
    ) -> ModulePool {
        ModulePool {
            inner: Arc::new(Inner {
                socket,
                limits,
                peer,
                state: Mutex::new(State::default()),
                long_lived: AtomicUsize::new(0),
            }),
        }
    }

    /// Sends `request` (origin-form URI) on an idle connection, or a new
    /// one; with all `max_connections` in use, it waits its turn until
    /// `until`. A request that an idle connection could not take because
    /// the module had closed it is sent again on another; nothing is sent
    /// twice. A [`Hold::LongLived`] exchange needs a free ticket first, and
    /// is refused at once without one.
    pub(crate) fn send(
        &self,
        request: Request<Body>,
        until: Instant,
        hold: Hold,
    ) -> impl Future<Output = Result<Response<PooledBody>, PoolError>> + Send + '_ {
        // Not an async fn: one async level less in every request's future.
        let ticket = match hold {
            Hold::Exchange => None,
            Hold::LongLived => match self.long_lived() {
                Ok(ticket) => Some(ticket),
                Err(refused) => return Either::Left(std::future::ready(Err(refused))),
            },
        };
        Either::Right(self.exchange(request, Some(until), ticket))
    }

    /// Sends a health probe: as [`ModulePool::send`], but never waiting for
    /// the cap. With every connection in use it opens one more, closed after
    /// the answer (probes are one at a time, so that is at most one more):
    /// a module busy with long streams, or a queue of requests, must not
    /// fail its health checks for it and be restarted.
    pub(crate) async fn probe(
        &self,
        request: Request<Body>,
    ) -> Result<Response<PooledBody>, PoolError> {
        self.exchange(request, None, None).await
    }

    /// One of the `max_long_lived` tickets, if any is free.
    fn long_lived(&self) -> Result<LongLived, PoolError> {
        let limit = self.inner.limits.max_long_lived;
        self.inner
            .long_lived
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < limit).then_some(held + 1)
            })
            .map_err(|_| PoolError::LongLivedFull { limit })?;
        Ok(LongLived {
            pool: Arc::downgrade(&self.inner),
        })
    }

    async fn exchange(
        &self,
        mut request: Request<Body>,
        until: Option<Instant>,
        ticket: Option<LongLived>,
    ) -> Result<Response<PooledBody>, PoolError> {
        loop {
            let (mut conn, reused, kept) = match self.lease(until).await? {
                Lease::Idle(mut conn) => {
                    // One the module closed while it sat idle is let go.
                    if !std::future::poll_fn(|cx| Poll::Ready(conn.ready(cx))).await {
                        debug!("pooled connection closed or busy; not reused");
                        continue;
                    }
                    (conn, true, true)
                }
                // Boxed: rarer than a pooled connection, and larger.
                Lease::Open(slot) => (Box::pin(self.connect(Some(slot))).await?, false, true),
                Lease::Bare(stream, slot) => (self.run(stream, Some(slot)).await?, true, true),
                Lease::Extra => (Box::pin(self.connect(None)).await?, false, false),
            };
            match conn.sender.try_send_request(request).await {
                Ok(response) => return Ok(self.attach(response, conn, kept, ticket)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(PoolError::Http(e.into_error())),
                },
            }
        }
    }

    /// An idle connection, else a slot for a new one, else (with `until`)
    /// a place in the queue until either comes or `until` passes; without
    /// `until`, a connection beyond the cap.
    async fn lease(&self, until: Option<Instant>) -> Result<Lease, PoolError> {
        let limits = self.inner.limits;
        loop {
            let (mut waiting, until) = {
                let mut state = self.inner.state();
                if let Some(conn) = state.idle.pop() {
                    return Ok(Lease::Idle(conn));
                }
                if let Some((stream, slot)) = state.bare_idle.pop() {
                    return Ok(Lease::Bare(stream, slot));
                }
                if state.open < limits.max_connections {
                    state.open += 1;
                    return Ok(Lease::Open(Slot::new(Arc::downgrade(&self.inner))));
                }
                let Some(until) = until else {
                    return Ok(Lease::Extra);
                };
                if state.queue.len() >= limits.max_queued {
                    // Requests that gave up (their client left, their
                    // deadline passed) keep their place until a grant skips
                    // them: count only those still waiting.
                    state.queue.retain(|waiter| !waiter.is_closed());
                    if state.queue.len() >= limits.max_queued {
                        return Err(PoolError::Busy {
                            connections: state.open,
                            queued: state.queue.len(),
                        });
                    }
                }
                let (grant, waiting) = oneshot::channel();
                state.queue.push_back(grant);
                (waiting, until)
            };
            match tokio::time::timeout_at(until, &mut waiting).await {
                Ok(Ok(Grant::Conn(conn))) => return Ok(Lease::Idle(conn)),
                Ok(Ok(Grant::Slot(slot))) => return Ok(Lease::Open(slot)),
                // The sender went without a grant, which only the pool's end
                // does, and a waiter holds the pool: ask again all the same.
                Ok(Err(_)) => continue,
                Err(_elapsed) => {
                    // A grant sent as the deadline passed goes on to the
                    // next waiter instead of being dropped (which would close
                    // a good connection).
                    waiting.close();
                    if let Ok(grant) = waiting.try_recv() {
                        self.inner.hand_on(grant);
                    }
                    return Err(PoolError::Waited {
                        connections: limits.max_connections,
                    });
                }
            }
        }
    }

    /// A bare connection (no hyper on it) for one exchange that the caller
    /// speaks itself: an idle one, else a new one while a slot is free and
    /// no request waits. A [`Hold::LongLived`] exchange needs a free ticket
    /// first, and is refused at once without one. `None` when every slot is taken: the caller then
    /// sends through [`ModulePool::send`], which queues. An idle one the
    /// module closed since shows as an end before any answer; `reused` says
    /// it may be that.
    pub(crate) async fn lease_bare(&self, hold: Hold) -> Result<Option<BareConn>, PoolError> {
        let ticket = match hold {
            Hold::Exchange => None,
            Hold::LongLived => Some(self.long_lived()?),
        };
        let slot = {
            let mut state = self.inner.state();
            if let Some((stream, slot)) = state.bare_idle.pop() {
                return Ok(Some(BareConn {
                    stream,
                    slot,
                    reused: true,
                    ticket,
                }));
            }
            if state.open >= self.inner.limits.max_connections || !state.queue.is_empty() {
                return Ok(None);
            }
            state.open += 1;
            Slot::new(Arc::downgrade(&self.inner))
        };
        // On failure the slot is dropped, and so let go.
        let stream = self.connect_stream().await?;
        Ok(Some(BareConn {
            stream,
            slot,
            reused: false,
            ticket,
        }))
    }

    /// Takes back a bare connection whose exchange ended cleanly, ready for
    /// another. With requests waiting (on hyper's path), hyper is run on it
    /// and it goes to the oldest: closing it and handing on its slot would
    /// have the module see one connection more than the cap until it
    /// noticed the close.
    pub(crate) async fn give_back_bare(&self, conn: BareConn) {
        let BareConn { stream, slot, .. } = conn;
        {
            let mut state = self.inner.state();
            if state.queue.is_empty() {
                state.bare_idle.push((stream, slot));
                return;
            }
        }
        // On failure the stream and its slot are dropped: closed, let go.
        if let Ok(conn) = self.run(stream, Some(slot)).await {
            self.inner.hand_on(Grant::Conn(conn));
        }
    }

    /// Lets go of the idle connections that the module closed (or that
    /// failed) since they were used: each holds its slot until let go, which
    /// would otherwise wait for its next checkout. Called on every health
    /// check.
    pub(crate) fn prune_idle(&self) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut closed = Vec::new();
        let closed_bare;
        {
            let mut state = self.inner.state();
            let mut i = 0;
            while i < state.idle.len() {
                if state.idle[i].ready(&mut cx) {
                    i += 1;
                } else {
                    closed.push(state.idle.swap_remove(i));
                }
            }
            let (open, shut): (Vec<_>, Vec<_>) = std::mem::take(&mut state.bare_idle)
                .into_iter()
                .partition(|(stream, _)| stream.is_idle());
            state.bare_idle = open;
            closed_bare = shut;
        }
        // Dropped here, outside the lock: each gives its slot back, which
        // takes the lock.
        drop(closed);
        drop(closed_bare);
    }

    /// The pool's numbers now.
    pub fn stats(&self) -> ConnectionStats {
        let limits = self.inner.limits;
        let state = self.inner.state();
        ConnectionStats {
            max: limits.max_connections,
            open: state.open,
            idle: state.idle.len() + state.bare_idle.len(),
            queued: state.queue.iter().filter(|w| !w.is_closed()).count(),
            max_queued: limits.max_queued,
            long_lived: self.inner.long_lived.load(Ordering::Acquire),
            max_long_lived: limits.max_long_lived,
        }
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.inner.state().idle.len()
    }

    /// Opens a connection, which holds `slot` (`None`: one beyond the cap).
    async fn connect(&self, slot: Option<Slot>) -> Result<Conn, PoolError> {
        let stream = self.connect_stream().await?;
        self.run(stream, slot).await
    }

    /// Runs hyper's client connection on `stream`, which holds `slot`.
    async fn run(&self, stream: ModuleStream, slot: Option<Slot>) -> Result<Conn, PoolError> {
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        let slot = slot.map(Arc::new);
        let held = slot.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                debug!(error = %e, "module connection ended with an error");
            }
            drop(held);
        });
        Ok(Conn { sender, slot })
    }

    /// Connects to the socket, again after a short pause while the module's
    /// listen backlog is full (EAGAIN), for at most
    /// [`CONNECT_RETRY_BUDGET`]. The cap keeps the host's own connects
    /// below the backlog a module usually sets; this covers a cap set
    /// higher, or a module that sets a shorter backlog. A request whose
    /// incarnation fails meanwhile is dropped, and its retries with it.
    async fn connect_stream(&self) -> Result<ModuleStream, PoolError> {
        self.connect_socket()
            .await
            .map_err(|source| PoolError::Connect {
                socket: self.inner.socket.display().to_string(),
                source,
            })
    }

    /// [`ModulePool::connect_stream`], its error bare.
    async fn connect_socket(&self) -> io::Result<ModuleStream> {
        let mut pauses = CONNECT_RETRY;
        let mut waited = Duration::ZERO;
        loop {
            match ModuleStream::connect(&self.inner.socket).await {
                Ok(stream) => {
                    if let Some(peer) = &self.inner.peer {
                        peer.verify(stream.socket())?;
                    }
                    return Ok(stream);
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock && waited < CONNECT_RETRY_BUDGET =>
                {
                    debug!(
                        socket = %self.inner.socket.display(),
                        waited_ms = waited.as_millis() as u64,
                        "module's listen backlog is full; connecting again"
                    );
                    let pause = pauses.next_delay();
                    tokio::time::sleep(pause).await;
                    waited += pause;
                }
                result => return result,
            }
        }
    }

    /// Ties `conn` to `response`'s body: it returns to the pool (when
    /// `kept`) when the body ends, and is closed if the body is dropped
    /// before. A long-lived exchange (with its `ticket`) gives its slot
    /// back now, and its connection is not reused.
    fn attach(
        &self,
        response: Response<Incoming>,
        mut conn: Conn,
        kept: bool,
        ticket: Option<LongLived>,
    ) -> Response<PooledBody> {
        let kept = kept && ticket.is_none();
        if ticket.is_some() {
            if let Some(slot) = conn.slot.take() {
                // Answered: the module took the connection off its backlog.
                slot.let_go();
            }
        }
        // After a 101 the connection belongs to the upgrade, which hyper
        // completes in the connection's task.
        let conn = (response.status() != StatusCode::SWITCHING_PROTOCOLS).then_some(conn);
        let pool = if kept {
            Arc::downgrade(&self.inner)
        } else {
            Weak::new()
        };
        let mut response = response.map(|inner| PooledBody {
            inner,
            conn,
            pool,
            ticket,
        });
        if response.body().inner.is_end_stream() {
            // Nothing more to read: the connection can go back now, once
            // it has seen its exchange through.
            let waker = std::task::Waker::noop();
            response.body_mut().release(&mut Context::from_waker(waker));
        }
        response
    }
}

/// A module's response body. Polling it runs its connection; the
/// connection goes back to the pool when the body ends.
#[derive(Debug)]
pub(crate) struct PooledBody {
    inner: Incoming,
    conn: Option<Conn>,
    /// Where the connection goes back to; empty for one not reused.
    pool: Weak<Inner>,
    /// A long-lived exchange's ticket, held until the body is dropped or,
    /// after a 101, by whoever takes it.
    ticket: Option<LongLived>,
}

impl PooledBody {
    /// The body has ended: the connection goes back to the pool if it can
    /// take a new request now. One still sending its request (the module
    /// answered before reading it all) finishes that on its own and closes.
    fn release(&mut self, cx: &mut Context<'_>) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if conn.ready(cx) {
            if let Some(pool) = self.pool.upgrade() {
                pool.hand_on(Grant::Conn(conn));
            }
        }
        // Else it is let go: without its sender, hyper closes it once it
        // has sent the rest of its request.
    }

    /// After a 101: the websocket's ticket, for whoever keeps its socket
    /// (counted off when dropped).
    pub(crate) fn take_ticket(&mut self) -> Option<LongLived> {
        self.ticket.take()
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(cx),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release(cx),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::UnixListener;

    /// Serves `ok` on a Unix socket (with `no_content`, a 204 without a
    /// body); counts accepted connections. With `close_after_each`, the
    /// server closes every connection after one response (as a module with
    /// keep-alive off, or an idle timeout, would).
    async fn server(
        path: &std::path::Path,
        close_after_each: bool,
        no_content: bool,
    ) -> Arc<AtomicUsize> {
        let listener = UnixListener::bind(path).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.expect("accept");
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req| async move {
                        let mut response = Response::new(http_body_util::Full::new(
                            Bytes::from_static(if no_content { b"" } else { b"ok" }),
                        ));
                        if no_content {
                            *response.status_mut() = StatusCode::NO_CONTENT;
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(!close_after_each)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        accepted
    }

    fn limits(max_connections: usize, max_queued: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            max_queued,
            max_long_lived: 2,
        }
    }

    /// A deadline no test reaches.
    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    fn request() -> Request<Body> {
        Request::get("/")
            .header("host", "x")
            .body(Body::empty())
            .expect("request")
    }

    async fn text(response: Response<PooledBody>) -> String {
        use http_body_util::BodyExt;
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        String::from_utf8(body.to_vec()).expect("utf8")
    }

    async fn get(pool: &ModulePool) -> String {
        text(
            pool.send(request(), later(), Hold::Exchange)
                .await
                .expect("send"),
        )
        .await
    }

    /// Polls `future` once: its output if it is ready at once.
    async fn poll_once<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| match Pin::new(&mut *future).poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }

    #[tokio::test]
    async fn reuses_a_connection_once_its_response_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 0));
        for _ in 0..5 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn connection_closed_by_the_module_is_replaced_without_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, true, false).await;
        // One slot: each connection the module closed gives its slot back.
        let pool = ModulePool::new(path, limits(1, 0));
        for _ in 0..3 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn reuses_a_connection_whose_response_had_no_body() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, true).await;
        let pool = ModulePool::new(path, limits(1, 0));
        for _ in 0..5 {
            assert_eq!(get(&pool).await, "");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// Reads one request head from `stream` (the tests' requests carry no
    /// body unless they say so in `content-length`); returns that length.
    async fn read_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> usize {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.expect("head");
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head)
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn an_idle_connection_the_module_closed_is_let_go() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        // Answers with keep-alive, then closes the idle connection, as a
        // module's keep-alive timeout does.
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            read_head(&mut stream).await;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .expect("answer");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
        let pool = ModulePool::new(path, limits(4, 4));
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(pool.idle_count(), 1);
        let let_go = async {
            while pool.idle_count() > 0 {
                pool.prune_idle();
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), let_go)
            .await
            .expect("the closed connection is still held");
    }

    /// A module that answers at once and streams while it reads a large
    /// upload: the upload must reach it while nobody reads the answer yet
    /// (a client that sends everything before it reads).
    #[tokio::test]
    async fn an_upload_goes_on_while_the_answer_is_not_read() {
        use http_body_util::BodyExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const UPLOAD: usize = 4 << 20;
        const ANSWER: usize = 4 << 20;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        let (uploaded_tx, uploaded) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let length = read_head(&mut stream).await;
            let (mut reader, mut writer) = stream.into_split();
            tokio::spawn(async move {
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).await.expect("upload");
                let _ = uploaded_tx.send(body.len());
            });
            writer
                .write_all(
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {ANSWER}\r\n\r\n").as_bytes(),
                )
                .await
                .expect("head");
            writer.write_all(&vec![b'x'; ANSWER]).await.expect("answer");
        });
        let pool = ModulePool::new(path, limits(4, 4));
        let request = Request::post("/")
            .header("host", "x")
            .body(Body::from(vec![b'u'; UPLOAD]))
            .expect("request");
        let response = pool
            .send(request, later(), Hold::Exchange)
            .await
            .expect("send");
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), uploaded)
            .await
            .expect("the upload stalled while the answer was not read")
            .expect("server gone");
        assert_eq!(got, UPLOAD);
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes().len(), ANSWER);
    }

    #[tokio::test]
    async fn missing_socket_is_a_connect_error_naming_it() {
        let pool = ModulePool::new(PathBuf::from("/nonexistent/dash_x"), limits(1, 0));
        let error = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect_err("no socket");
        assert!(error.to_string().contains("/nonexistent/dash_x"), "{error}");
    }

    /// With every connection in use, a request waits, and takes the first
    /// connection given back: no new one is opened.
    #[tokio::test]
    async fn a_request_beyond_the_cap_waits_for_a_connection_given_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 8));
        let held = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect("send");
        let mut waiting = std::pin::pin!(get(&pool));
        assert!(poll_once(&mut waiting).await.is_none(), "went past the cap");
        let stats = pool.stats();
        assert_eq!((stats.open, stats.idle, stats.queued), (1, 0, 1));
        assert_eq!(text(held).await, "ok");
        assert_eq!(waiting.await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.stats().queued, 0);
    }

    /// A connection closed while requests wait (its answer dropped half
    /// read) gives its slot to the first of them, which opens a new one.
    #[tokio::test]
    async fn a_closed_connection_gives_its_slot_to_a_waiting_request() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 8));
        let held = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect("send");
        let mut waiting = std::pin::pin!(get(&pool));
        assert!(poll_once(&mut waiting).await.is_none(), "went past the cap");
        drop(held);
        assert_eq!(waiting.await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.stats().open, 1);
    }

    /// With every connection in use and the queue full, a request is
    /// refused at once.
    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 1));
        let _held = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect("send");
        let mut waiting = std::pin::pin!(get(&pool));
        assert!(poll_once(&mut waiting).await.is_none(), "went past the cap");
        let mut refused = std::pin::pin!(pool.send(request(), later(), Hold::Exchange));
        match poll_once(&mut refused).await {
            Some(Err(PoolError::Busy {
                connections: 1,
                queued: 1,
            })) => {}
            other => panic!("expected busy at once, got {other:?}"),
        }
    }

    /// A request waits for a connection no longer than its deadline; the
    /// connection given back later goes idle past the place it gave up.
    #[tokio::test]
    async fn a_request_waits_no_longer_than_its_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 8));
        let held = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect("send");
        let soon = Instant::now() + Duration::from_millis(50);
        let error = tokio::time::timeout(
            Duration::from_secs(10),
            pool.send(request(), soon, Hold::Exchange),
        )
        .await
        .expect("waited past its deadline")
        .expect_err("no connection was free");
        assert!(
            matches!(error, PoolError::Waited { connections: 1 }),
            "{error:?}"
        );
        assert_eq!(pool.stats().queued, 0);
        assert_eq!(text(held).await, "ok");
        assert_eq!(pool.idle_count(), 1);
    }

    /// A health probe does not wait behind a full pool: it opens one
    /// connection more, which is closed after its answer, not kept.
    #[tokio::test]
    async fn a_probe_does_not_wait_for_a_full_pool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 8));
        let held = pool
            .send(request(), later(), Hold::Exchange)
            .await
            .expect("send");
        let probed = tokio::time::timeout(Duration::from_secs(10), pool.probe(request()))
            .await
            .expect("the probe waited for the cap")
            .expect("probe");
        assert_eq!(text(probed).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let stats = pool.stats();
        assert_eq!((stats.open, stats.idle), (1, 0));
        assert_eq!(text(held).await, "ok");
        assert_eq!(pool.idle_count(), 1);
    }

    /// A connect refused because the module's listen backlog is full
    /// (EAGAIN) is tried again, and goes through once the module accepts.
    #[tokio::test]
    async fn a_connect_to_a_full_backlog_is_tried_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let socket = tokio::net::UnixSocket::new_stream().expect("socket");
        socket.bind(&path).expect("bind");
        let listener = socket.listen(1).expect("listen");
        // Connections nobody accepts, until the backlog refuses one.
        let mut waiting_in_backlog = Vec::new();
        let mut full = false;
        for _ in 0..64 {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(stream) => waiting_in_backlog.push(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    full = true;
                    break;
                }
                Err(e) => panic!("connect: {e}"),
            }
        }
        assert!(full, "the backlog never filled");
        let pool = ModulePool::new(path, limits(4, 0));
        let mut sending = std::pin::pin!(pool.send(request(), later(), Hold::Exchange));
        if let Some(result) = poll_once(&mut sending).await {
            panic!("a connect to a full backlog was not tried again: {result:?}");
        }
        // Room again: the module takes what waited in its backlog.
        for _ in 0..waiting_in_backlog.len() {
            listener.accept().await.expect("accept");
        }
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let service = hyper::service::service_fn(|_req| async {
                let body = http_body_util::Full::new(Bytes::from_static(b"ok"));
                Ok::<_, std::convert::Infallible>(Response::new(body))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let response = tokio::time::timeout(Duration::from_secs(10), sending)
            .await
            .expect("still trying")
            .expect("sent once the backlog had room");
        assert_eq!(text(response).await, "ok");
    }

    /// A stream or websocket gives its slot back once answered: with a cap
    /// of one connection, a request goes through while it stays open.
    /// Its connection is not reused once it ends.
    #[tokio::test]
    async fn a_long_lived_exchange_gives_its_slot_back_once_answered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 0));
        let open = pool
            .send(request(), later(), Hold::LongLived)
            .await
            .expect("long-lived");
        let stats = pool.stats();
        assert_eq!((stats.open, stats.long_lived), (0, 1), "{stats:?}");
        // No queue (0 may wait): with the slot still held this would be Busy.
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(text(open).await, "ok");
        assert_eq!(pool.stats().long_lived, 0);
        assert_eq!(get(&pool).await, "ok");
        // The long-lived one's connection, and one kept for requests.
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Beyond `max_long_lived` open, the next is refused at once; one
    /// closed makes room again.
    #[tokio::test]
    async fn long_lived_exchanges_beyond_the_cap_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        server(&path, false, false).await;
        let pool = ModulePool::new(path, limits(1, 0));
        let first = pool.send(request(), later(), Hold::LongLived).await;
        let second = pool.send(request(), later(), Hold::LongLived).await;
        let third = pool.send(request(), later(), Hold::LongLived).await;
        assert!(
            matches!(third, Err(PoolError::LongLivedFull { limit: 2 })),
            "{third:?}"
        );
        drop(first.expect("first"));
        let fourth = pool.send(request(), later(), Hold::LongLived).await;
        assert_eq!(text(fourth.expect("after one closed")).await, "ok");
        assert_eq!(text(second.expect("second")).await, "ok");
        assert_eq!(pool.stats().long_lived, 0);
    }
}
