//! Counts the test-module's open connections, and the most open at once,
//! for `GET /test/stats`: tests check the host's cap on its connections.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;

use crate::state::AppState;

/// An accepted connection, counted as open until dropped (when the server
/// is done with it, which is when either side closed it).
#[derive(Debug)]
pub(crate) struct Counted {
    stream: UnixStream,
    state: AppState,
}

impl Counted {
    /// Counts `stream` as open.
    pub(crate) fn new(stream: UnixStream, state: AppState) -> Counted {
        let open = state.connections_open.fetch_add(1, Ordering::Relaxed) + 1;
        state.connections_peak.fetch_max(open, Ordering::Relaxed);
        Counted { stream, state }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.state.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
