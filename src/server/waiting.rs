//! Client connections that wait between requests, holding no HTTP state.
//!
//! hyper keeps a connection's buffers (8 KiB to read, 8 KiB for response
//! heads), its parsed-header map and its dispatcher for as long as the
//! connection is open, requests or not: about 13 KiB per idle keep-alive
//! client. A dashboard's clients are mostly idle (a tab polls every few
//! seconds; a probe holds its connection between checks), so here a plain
//! HTTP/1.1 connection that has had no traffic for [`WAIT_AFTER`], with no
//! answer under way, is *parked*: its hyper connection is ended without
//! closing the socket (hyper's shutdown of the socket is not passed on), and
//! the task only waits for the socket to become readable; then the fast
//! path (`fast_path.rs`) takes it up, with whatever hyper had read and not
//! parsed, and gives each request it does not serve to a new hyper
//! connection, which keeps the connection until it is parked again. The
//! fast path parks it the same way after [`WAIT_AFTER`] without a request.
//! A new connection waits the same way for its first bytes. nginx does the
//! same (its idle keep-alive connections keep no buffers).
//!
//! A parked connection is closed once it has waited [`HEADER_READ_TIMEOUT`]
//! less the time it took to park (what hyper's header read timeout gives an
//! idle connection), or at once when the host drains. TLS connections are
//! not parked: the TLS session's state lives in the stream.
//!
//! hyper's header read timeout on these connections runs on
//! [`PolledTimer`]: a deadline checked whenever hyper polls it, never entered
//! in tokio's timer wheel. While a connection is served, its task wakes at
//! least every [`WAIT_AFTER`] (the park check), and each wake polls hyper,
//! which polls its timeout; so the timeout fires at most that late, and a
//! request costs no timer registration (hyper arms the timeout anew for
//! every request head: with tokio's timer, a boxed sleep entered in the
//! wheel while the connection waits and taken out once the head is in).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::fast_path::{self, Served};
use super::Dispatch;
use crate::proxy::{is_send_timeout, Activity, Client, ClientSocket};

/// How long a connection has had no traffic, with no answer under way,
/// before it is parked. Long enough that a client sending request after
/// request keeps its hyper connection; short enough that tabs polling every
/// few seconds mostly wait parked. Between one and two of these pass: the
/// check runs this often.
pub(super) const WAIT_AFTER: Duration = Duration::from_secs(1);

/// How long a client may take to send a request's head, and how long an
/// idle connection is kept.
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

// === impl PolledTimer ===

/// hyper's timer for the connections [`drive`] serves: its sleeps are
/// deadlines compared with the clock when polled, and never wake a task of
/// their own accord. Sound only where the task is woken at least every
/// [`WAIT_AFTER`] while hyper may wait on one (as [`serve_until_idle`]
/// does); hyper's HTTP/1 server uses its timer for the header read timeout
/// only.
#[derive(Debug, Clone, Copy)]
pub(super) struct PolledTimer;

/// A deadline that [`PolledTimer`] made.
#[derive(Debug)]
struct PolledSleep {
    deadline: std::time::Instant,
}

impl Future for PolledSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now().into_std() >= self.deadline {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for PolledSleep {}

impl hyper::rt::Timer for PolledTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(PolledSleep { deadline })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, deadline: std::time::Instant) {
        match sleep.as_mut().downcast_mut_pin::<PolledSleep>() {
            Some(polled) => polled.get_mut().deadline = deadline,
            None => *sleep = self.sleep_until(deadline),
        }
    }

    /// tokio's clock, so that tests with paused time see it move.
    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

// === impl Tracked ===

/// The host's service on one connection, counting the answers under way.
#[derive(Debug, Clone)]
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

/// Counts one answer as under way until dropped.
#[derive(Debug)]
struct Answering(Arc<Activity>);

impl Answering {
    fn new(activity: &Arc<Activity>) -> Answering {
        activity.answering();
        Answering(Arc::clone(activity))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answered();
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<AnswerBody<B>>;
    type Error = Infallible;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let answering = Answering::new(&self.activity);
        TrackedFuture {
            inner: self.inner.call(request),
            answering: Some(answering),
        }
    }
}

/// The service's answer to come, counted as under way.
#[derive(Debug)]
struct TrackedFuture<F> {
    inner: F,
    answering: Option<Answering>,
}

impl<F, B> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, Infallible>> + Unpin,
{
    type Output = Result<Response<AnswerBody<B>>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Ok(response) = ready!(Pin::new(&mut self.inner).poll(cx));
        let answering = self.answering.take();
        Poll::Ready(Ok(response.map(|body| AnswerBody {
            body,
            _answering: answering,
        })))
    }
}

/// An answer's body, counted as under way until hyper drops it (written, or
/// given up).
#[derive(Debug)]
struct AnswerBody<B> {
    body: B,
    _answering: Option<Answering>,
}

impl<B: Body + Unpin> Body for AnswerBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

// === the driver ===

/// How a hyper connection on a client's socket ended.
enum Ended {
    /// Ended by the driver, idle: the socket is open, to be parked.
    Parked,
    /// Closed, upgraded, or drained; with hyper's error if it failed.
    Done(hyper::Result<()>),
}

/// Serves one plain client connection until the client closes it, it stays
/// idle too long, or the host drains; parked while idle. `waiting` counts
/// the connections parked now.
pub(super) async fn drive(
    http: http1::Builder,
    io: Client,
    service: Dispatch,
    drain: CancellationToken,
    peer: SocketAddr,
    waiting: Arc<AtomicUsize>,
    max_header_bytes: usize,
) {
    let activity = Arc::new(Activity::default());
    let mut socket = ClientSocket::new(io, Arc::clone(&activity));
    // Parked first: a new connection holds nothing until it sends.
    let mut patience = HEADER_READ_TIMEOUT;
    // After a park that found a request half sent, none until it is taken:
    // parking again would restart hyper's header read timeout each time.
    let mut no_park_before: Option<u64> = None;
    // Whether the fast path takes the connection's next request; not the
    // one it has just handed over.
    let mut fast = true;
    loop {
        if !socket.has_early() {
            let _waiting = Counted::new(&waiting);
            // A peek, not `readable()`: tokio may call a socket readable
            // that has nothing to read (a new one, for one).
            let mut first = [0u8; 1];
            let sent = socket.tcp().peek(&mut first);
            tokio::select! {
                sent = tokio::time::timeout(patience, sent) => match sent {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "idle client connection failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "idle client connection closed: nothing sent in time");
                        return;
                    }
                },
                _ = drain.cancelled() => return,
            }
        } else {
            no_park_before = Some(activity.requests.load(Relaxed) + 1);
        }
        activity.parking.store(false, Relaxed);
        if fast {
            // Boxed, as hyper's connection is below.
            let served = Box::pin(fast_path::serve(
                &mut socket,
                &service,
                &drain,
                max_header_bytes,
                peer,
            ))
            .await;
            match served {
                Served::Closed => return,
                Served::Idle => patience = HEADER_READ_TIMEOUT.saturating_sub(WAIT_AFTER),
                Served::Handover => fast = false,
            }
            continue;
        }
        fast = true;
        let tracked = Tracked {
            inner: service.clone(),
            activity: Arc::clone(&activity),
        };
        // Boxed, so that a parked connection's task is small.
        let mut connection = Box::new(
            http.serve_connection(TokioIo::new(socket), tracked)
                .with_upgrades(),
        );
        let ended = serve_until_idle(
            &mut *connection,
            |c| Pin::new(c).graceful_shutdown(),
            &activity,
            &drain,
            no_park_before,
        )
        .await;
        match ended {
            Ended::Parked => match connection.into_parts() {
                Some(parts) => {
                    socket = parts.io.into_inner();
                    socket.unread(parts.read_buf);
                    patience = HEADER_READ_TIMEOUT.saturating_sub(WAIT_AFTER);
                    no_park_before = None;
                }
                None => return,
            },
            Ended::Done(ended) => return log_end(ended, peer),
        }
    }
}

/// Runs `connection` until it ends; once it has been idle for
/// [`WAIT_AFTER`] (and `no_park_before` requests were taken, if given), ends
/// it for parking. Once `drain` is cancelled, finishes the request in
/// flight and ends. `shut_down` is hyper's graceful shutdown.
async fn serve_until_idle<F>(
    connection: &mut F,
    mut shut_down: impl FnMut(&mut F),
    activity: &Activity,
    drain: &CancellationToken,
    no_park_before: Option<u64>,
) -> Ended
where
    F: Future<Output = hyper::Result<()>> + Unpin,
{
    // Armed until the connection ends, parking and draining too: it also
    // wakes the task for hyper's header read timeout (`PolledTimer`).
    let check = tokio::time::sleep(WAIT_AFTER);
    tokio::pin!(check);
    let mut moves = activity.moves.load(Relaxed);
    let mut parking = false;
    let mut draining = false;
    loop {
        tokio::select! {
            // The connection first: it is what wakes the task nearly always.
            biased;
            ended = &mut *connection => {
                return if parking && !draining && ended.is_ok() {
                    Ended::Parked
                } else {
                    Ended::Done(ended)
                };
            }
            _ = drain.cancelled(), if !draining => {
                draining = true;
                shut_down(connection);
            }
            _ = &mut check => {
                check.as_mut().reset(Instant::now() + WAIT_AFTER);
                if parking || draining {
                    continue;
                }
                let now = activity.moves.load(Relaxed);
                let allowed =
                    no_park_before.is_none_or(|n| activity.requests.load(Relaxed) >= n);
                if now == moves && allowed && activity.quiet() {
                    parking = true;
                    activity.parking.store(true, Relaxed);
                    shut_down(connection);
                } else {
                    moves = now;
                }
            }
        }
    }
}

/// Logs how a client connection ended, if it failed: a send timeout was
/// logged where it expired. (TLS connections too, `listener.rs`.)
pub(super) fn log_end(ended: hyper::Result<()>, peer: SocketAddr) {
    match ended {
        Err(e) if is_send_timeout(&e) => {}
        Err(e) => debug!(%peer, error = %e, "connection ended with an error"),
        Ok(()) => {}
    }
}

/// One more in a count, until dropped.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Counted<'a> {
        count.fetch_add(1, Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// hyper's header read timeout on [`PolledTimer`], with nothing but the
    /// park check to wake the task: a head left half sent ends the
    /// connection once the timeout has passed, not before, and at most a
    /// check or two after.
    #[tokio::test(start_paused = true)]
    async fn a_head_half_sent_times_out_on_the_polled_timer() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut http = http1::Builder::new();
        http.timer(PolledTimer)
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let service = hyper::service::service_fn(|_: Request<Incoming>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new())))
        });
        let mut connection = Box::new(http.serve_connection(TokioIo::new(server), service));
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: loc")
            .await
            .expect("write");
        let activity = Activity::default();
        let drain = CancellationToken::new();
        let started = Instant::now();
        // Not parked: no request has been taken.
        let served = serve_until_idle(
            &mut *connection,
            |c| Pin::new(c).graceful_shutdown(),
            &activity,
            &drain,
            Some(1),
        );
        let ended = tokio::time::timeout(HEADER_READ_TIMEOUT * 2, served)
            .await
            .expect("the header read timeout never fired");
        let waited = started.elapsed();
        match ended {
            Ended::Done(Err(e)) => assert!(e.is_timeout(), "ended with {e}, not the timeout"),
            Ended::Done(Ok(())) => panic!("ended cleanly, not by the timeout"),
            Ended::Parked => panic!("parked"),
        }
        assert!(
            waited >= HEADER_READ_TIMEOUT && waited <= HEADER_READ_TIMEOUT + 2 * WAIT_AFTER,
            "the timeout fired after {waited:?}"
        );
    }
}
