//! A client's plain TCP connection as the host's HTTP server sees it: what
//! it reads and writes is noted, so that the server can tell a connection
//! idle between requests and park it (`server/waiting.rs`), and a parked
//! connection keeps what hyper had read and not parsed.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::descriptors::ClientStream;
use crate::proxy::WriteTimeout;

/// A client connection as the host's accept loop hands it over.
pub(crate) type Client = WriteTimeout<ClientStream>;

/// What the driver and the connection's socket and service share.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Requests whose answer hyper has not finished writing: from the
    /// service's call to the drop of the answer's body.
    pub(crate) answering: AtomicUsize,
    /// Requests taken by the service, ever.
    pub(crate) requests: AtomicU64,
    /// Bumped by every read that brings bytes and every write that takes
    /// some.
    pub(crate) moves: AtomicU64,
    /// The last write (or flush) waits for the client to take bytes.
    pub(crate) write_blocked: AtomicBool,
    /// Bytes were read since the last answer ended: a request may be half
    /// sent. hyper would not end such a connection at once, only answer it
    /// with `connection: close`.
    pub(crate) unparsed: AtomicBool,
    /// The driver asked hyper to end the connection to park it: the
    /// shutdown of the socket that hyper then makes is not passed on.
    pub(crate) parking: AtomicBool,
}

impl Activity {
    fn moved(&self) {
        self.moves.fetch_add(1, Relaxed);
    }

    fn read(&self) {
        self.moved();
        self.unparsed.store(true, Relaxed);
    }

    /// An answer is under way, until [`Activity::answered`].
    pub(crate) fn answering(&self) {
        self.answering.fetch_add(1, Relaxed);
        self.requests.fetch_add(1, Relaxed);
    }

    /// An answer is done (written, or given up).
    pub(crate) fn answered(&self) {
        self.answering.fetch_sub(1, Relaxed);
        self.unparsed.store(false, Relaxed);
    }

    /// Nothing under way: no answer being made or written, and nothing
    /// read since the last.
    pub(crate) fn quiet(&self) -> bool {
        self.answering.load(Relaxed) == 0
            && !self.write_blocked.load(Relaxed)
            && !self.unparsed.load(Relaxed)
    }
}

/// A client's connection as a relay writes to it, which can also tell
/// when the client has gone.
pub(crate) trait ClientConn: AsyncWrite + Unpin + Send {
    /// Resolves once the client has closed its connection (or it failed);
    /// never, once it has sent more (a next request, read later).
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send + '_;
}

/// A body piece up to this size is copied behind what precedes it and
/// goes out in the same write; a larger one goes out with it in one
/// vectored write.
pub(crate) const COALESCE_BYTES: usize = 16 * 1024;

/// Most data pieces one chunk of [`put_chunk_of`] gathers: with the size
/// line before them and the line's end after, one vectored write stays far
/// below the kernel's limit on slices (`IOV_MAX`, 1024).
pub(crate) const MAX_CHUNK_PIECES: usize = 64;

/// Appends `data` to what goes to the client, or, when it is large,
/// writes both now in one vectored write (and what it leaves, until all
/// is written).
pub(crate) async fn put(
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
    data: &[u8],
) -> io::Result<()> {
    if data.len() <= COALESCE_BYTES {
        write.extend_from_slice(data);
        return Ok(());
    }
    write_all_slices(client, &mut [IoSlice::new(write), IoSlice::new(data)]).await?;
    write.clear();
    Ok(())
}

/// Appends `data` as one chunk (its size line, the data, the line's
/// end), as [`put`] does.
pub(crate) async fn put_chunk(
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
    data: &[u8],
) -> io::Result<()> {
    put_chunk_of(client, write, &[data]).await
}

/// Appends `pieces`, back to back, as one chunk (as many as it takes of
/// [`MAX_CHUNK_PIECES`] pieces each), as [`put`] does: its size line,
/// the data and the line's end go out together, so that no write carries
/// a line's end alone. Nothing, when the pieces are empty: a chunk of no
/// bytes would end the body.
pub(crate) async fn put_chunk_of(
    client: &mut impl ClientConn,
    write: &mut Vec<u8>,
    pieces: &[&[u8]],
) -> io::Result<()> {
    for pieces in pieces.chunks(MAX_CHUNK_PIECES) {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        if len == 0 {
            continue;
        }
        // Straight into the buffer: no string made per chunk.
        std::io::Write::write_fmt(write, format_args!("{len:x}\r\n"))
            .expect("UNWRAP: writing to a Vec cannot fail");
        if len <= COALESCE_BYTES {
            for piece in pieces {
                write.extend_from_slice(piece);
            }
            write.extend_from_slice(b"\r\n");
            continue;
        }
        let mut slices = [IoSlice::new(&[]); MAX_CHUNK_PIECES + 2];
        slices[0] = IoSlice::new(write);
        for (slot, piece) in slices[1..].iter_mut().zip(pieces) {
            *slot = IoSlice::new(piece);
        }
        slices[pieces.len() + 1] = IoSlice::new(b"\r\n");
        write_all_slices(client, &mut slices[..pieces.len() + 2]).await?;
        write.clear();
    }
    Ok(())
}

/// Writes all of `slices`, in as many vectored writes as the client takes.
async fn write_all_slices(
    client: &mut impl ClientConn,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = client.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

// === impl ClientSocket ===

/// A client's plain socket as its hyper connection sees it: bytes read before
/// the connection was parked come first, and reads and writes are noted in
/// the connection's [`Activity`].
#[derive(Debug)]
pub(crate) struct ClientSocket {
    io: Client,
    /// Read by an earlier hyper connection and not parsed yet.
    early: Bytes,
    activity: Arc<Activity>,
}

impl ClientSocket {
    /// `io`, its reads and writes noted in `activity`.
    pub(crate) fn new(io: Client, activity: Arc<Activity>) -> ClientSocket {
        ClientSocket {
            io,
            early: Bytes::new(),
            activity,
        }
    }

    /// The socket.
    pub(crate) fn tcp(&self) -> &tokio::net::TcpStream {
        self.io.get_ref().tcp()
    }

    /// Whether bytes read earlier wait to be read first.
    pub(crate) fn has_early(&self) -> bool {
        !self.early.is_empty()
    }

    /// Puts `read` (read by a hyper connection, not parsed) before what
    /// waits to be read.
    pub(crate) fn unread(&mut self, read: Bytes) {
        if read.is_empty() {
            return;
        }
        let rest = std::mem::take(&mut self.early);
        self.early = if rest.is_empty() {
            read
        } else {
            [read, rest].concat().into()
        };
    }

    /// The client's socket, and what was read from it and not yet handled.
    pub(crate) fn into_parts(self) -> (Client, Bytes) {
        (self.io, self.early)
    }

    /// Notes how a write or flush went: whether it waits for the client,
    /// and, when `wrote` says it took bytes, a move.
    fn noted<T>(
        &self,
        polled: Poll<io::Result<T>>,
        wrote: impl Fn(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        self.activity
            .write_blocked
            .store(polled.is_pending(), Relaxed);
        if let Poll::Ready(Ok(done)) = &polled {
            if wrote(done) {
                self.activity.moved();
            }
        }
        polled
    }
}

impl ClientConn for ClientSocket {
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        let tcp = self.tcp();
        async move {
            let mut byte = [0u8; 1];
            match tcp.peek(&mut byte).await {
                Ok(0) | Err(_) => {}
                Ok(_) => std::future::pending().await,
            }
        }
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.early.is_empty() {
            let n = this.early.len().min(buf.remaining());
            buf.put_slice(&this.early[..n]);
            this.early.advance(n);
            this.activity.read();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.noted(polled, |n| *n > 0)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.noted(polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A flush moves nothing of its own: hyper flushes at every poll.
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.noted(polled, |()| false)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.activity.parking.load(Relaxed) {
            // Flushed by hyper already; the socket stays open, parked.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
