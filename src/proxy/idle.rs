//! Idle timeouts on the client's side of the proxy: a write the client does
//! not take ([`WriteTimeout`], nginx's `send_timeout`) and a request body
//! that stops coming ([`BodyTimeout`], nginx's `client_body_timeout`).
//!
//! Both are idle timeouts: only one wait that lasts the whole timeout ends
//! the exchange, and any progress starts the next wait afresh, so a slow
//! stream or upload that keeps moving is never cut, however long it lasts.
//! Each guard owns one timer, made when it first has to wait (most never
//! do) and reset in place, lazily (see [`IdleTimer`]); a write or a body
//! frame that goes through at once touches no timer and no clock.

use std::error::Error as StdError;
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tracing::info;

/// A timer for one wait at a time, that fires once a wait lasts `timeout`.
///
/// The timer is moved lazily: a wait that begins after progress only notes
/// when it began, and the timer, still set for an earlier wait, is moved to
/// this wait's deadline only when it fires. A stream to a client that keeps
/// reading waits for room after most writes; moving the timer at each of
/// those waits (a lock and a wheel update in tokio's timer) cost measurably,
/// this costs one clock read per wait and one move per timeout at most.
#[derive(Debug)]
struct IdleTimer {
    timeout: Duration,
    /// Made at the first wait and moved in place after that (boxed: a
    /// `Sleep` cannot move, and the guards must, as hyper's IO does).
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the wait under way began; `None` while there is none.
    since: Option<Instant>,
}

impl IdleTimer {
    fn new(timeout: Duration) -> IdleTimer {
        IdleTimer {
            timeout,
            sleep: None,
            since: None,
        }
    }

    /// The operation went through: the wait, if any, is over.
    fn progress(&mut self) {
        self.since = None;
    }

    /// The operation has to wait: `Ready` once this wait has lasted the
    /// timeout; else the timer wakes `cx` when it may have.
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = *self.since.get_or_insert_with(Instant::now) + self.timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            ready!(sleep.as_mut().poll(cx));
            // Set for this wait (deadlines only grow): it has lasted.
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            // Set for an earlier wait, which progress ended.
            sleep.as_mut().reset(deadline);
        }
    }
}

// === impl WriteTimeout ===

/// Why a write to a client failed: it took nothing for the send timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing written to it for {0:?}")]
pub(crate) struct SendTimedOut(Duration);

/// Whether `error`, or one of its causes, is a [`WriteTimeout`] expiring.
pub(crate) fn is_send_timeout(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        // An `io::Error`'s `source` skips the error it wraps: look inside.
        let inner = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn StdError + 'static));
        if e.is::<SendTimedOut>() || inner.is_some_and(|inner| inner.is::<SendTimedOut>()) {
            return true;
        }
        current = e.source();
    }
    false
}

/// A client's connection whose writes fail once one
/// of them has waited `timeout` for the client to take data: a client that
/// stops reading a stream then no longer holds its module request. Reads
/// pass through untouched.
#[derive(Debug)]
pub(crate) struct WriteTimeout<T> {
    io: T,
    timer: IdleTimer,
    /// The client, for the log line.
    peer: SocketAddr,
    /// Once expired, every write fails at once.
    expired: bool,
}

impl<T> WriteTimeout<T> {
    /// `io` with writes bounded by `timeout`; `peer` names the client.
    pub(crate) fn new(io: T, timeout: Duration, peer: SocketAddr) -> WriteTimeout<T> {
        WriteTimeout {
            io,
            timer: IdleTimer::new(timeout),
            peer,
            expired: false,
        }
    }

    /// The connection guarded.
    pub(crate) fn get_ref(&self) -> &T {
        &self.io
    }

    fn timed_out(&self) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, SendTimedOut(self.timer.timeout))
    }
}

impl<T: AsyncWrite + Unpin> WriteTimeout<T> {
    /// Runs one write operation, timing the wait when it has to wait.
    fn poll_guarded<R>(
        &mut self,
        cx: &mut Context<'_>,
        op: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if self.expired {
            return Poll::Ready(Err(self.timed_out()));
        }
        match op(Pin::new(&mut self.io), cx) {
            Poll::Pending => {
                ready!(self.timer.poll_wait(cx));
                self.expired = true;
                info!(
                    peer = %self.peer,
                    timeout_ms = self.timer.timeout.as_millis() as u64,
                    "client took nothing written to it for the send timeout; closing its connection"
                );
                Poll::Ready(Err(self.timed_out()))
            }
            done => {
                self.timer.progress();
                done
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_guarded(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_guarded(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_guarded(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

// === impl BodyTimeout ===

/// Why a client's request body could not be forwarded: the client's fault,
/// never the module's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientBodyError {
    /// Nothing of the body came for the body timeout.
    #[error("the client sent nothing of the request body for {0:?}")]
    TimedOut(Duration),
    /// The body broke off or is malformed (a bad chunk, say).
    #[error("the request body is malformed or was cut off")]
    Broken(#[source] Box<dyn StdError + Send + Sync>),
}

/// A client's request body that fails once it has sent nothing for
/// `timeout` while the module waited for it, and whose own failures are
/// told apart from the module's.
#[derive(Debug)]
pub(crate) struct BodyTimeout<B> {
    inner: B,
    timer: IdleTimer,
    /// The module the body goes to, for the log line.
    module: Arc<str>,
    expired: bool,
    /// Counts the data bytes passed on, for the module's metrics.
    bytes: Counter,
}

impl<B> BodyTimeout<B> {
    /// `inner`, bounded by `timeout` per wait, on its way to `module`, its
    /// data bytes counted into `bytes`.
    pub(crate) fn new(
        inner: B,
        timeout: Duration,
        module: &Arc<str>,
        bytes: Counter,
    ) -> BodyTimeout<B> {
        BodyTimeout {
            inner,
            timer: IdleTimer::new(timeout),
            module: Arc::clone(module),
            expired: false,
            bytes,
        }
    }
}

impl<B> Body for BodyTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Some(Err(ClientBodyError::TimedOut(this.timer.timeout))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                ready!(this.timer.poll_wait(cx));
                this.expired = true;
                info!(
                    module = %this.module,
                    timeout_ms = this.timer.timeout.as_millis() as u64,
                    "client sent nothing of its request body for the body timeout; request cancelled"
                );
                Poll::Ready(Some(Err(ClientBodyError::TimedOut(this.timer.timeout))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(ClientBodyError::Broken(e.into())))),
            Poll::Ready(Some(Ok(frame))) => {
                this.timer.progress();
                if let Some(data) = frame.data_ref() {
                    this.bytes.inc_by(data.len() as u64);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => Poll::Ready(None),
        }
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
    use tokio::io::AsyncWriteExt;

    /// A writer that takes `room` bytes, then waits until given more.
    struct Sink {
        room: usize,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.room == 0 {
                return Poll::Pending;
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn peer() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 1))
    }

    /// A write that waits the whole timeout fails with the send timeout,
    /// and every write after it fails at once.
    #[tokio::test(start_paused = true)]
    async fn a_write_waiting_the_whole_timeout_fails() {
        let mut w = WriteTimeout::new(Sink { room: 4 }, Duration::from_secs(60), peer());
        w.write_all(b"abcd").await.expect("room for it");
        let started = Instant::now();
        let e = w.write_all(b"e").await.expect_err("times out");
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert!(is_send_timeout(&e), "{e}");
        let again = w.write_all(b"f").await.expect_err("still failed");
        assert!(is_send_timeout(&again));
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    /// Progress starts the timeout over: waits each shorter than it never
    /// fail, whatever they add up to.
    #[tokio::test(start_paused = true)]
    async fn progress_restarts_the_send_timeout() {
        let mut w = WriteTimeout::new(Sink { room: 0 }, Duration::from_secs(60), peer());
        for _ in 0..5 {
            let polled = tokio::time::timeout(Duration::from_secs(50), w.write_all(b"x")).await;
            assert!(polled.is_err(), "waits while the client takes nothing");
            w.io.room = 1;
            w.write_all(b"x").await.expect("the client took it");
        }
    }
}
