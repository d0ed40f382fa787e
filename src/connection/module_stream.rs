//! A connection to a module's Unix socket, watched for readability only.
//!
//! Linux wakes the writer of a Unix socket each time its peer takes data
//! out (there is room again), whether or not the writer was waiting for
//! room. tokio's `UnixStream` is registered for both directions, so each
//! request or websocket message a module read could wake the host once
//! more, for nothing: at one connection the host slept and woke about 2.35
//! times per request or echo where 2 suffice. Here the socket is registered
//! for reading only. A write goes straight to the socket; only a write that
//! finds it full registers a duplicate of the descriptor for writability,
//! kept until a write goes through at the first try again.

use std::io::{self, IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// A connected module socket; reads and writes as tokio's streams do.
#[derive(Debug)]
pub(crate) struct ModuleStream {
    /// Registered for readability alone.
    socket: AsyncFd<StdUnixStream>,
    /// Registered for writability while writes find the socket full.
    room: Option<AsyncFd<OwnedFd>>,
}

impl ModuleStream {
    /// Connects to the socket at `path`.
    pub(crate) async fn connect(path: &Path) -> io::Result<ModuleStream> {
        let stream = tokio::net::UnixStream::connect(path).await?.into_std()?;
        stream.set_nonblocking(true)?;
        Ok(ModuleStream {
            socket: register(stream, Interest::READABLE)?,
            room: None,
        })
    }

    /// The connected socket, for checks of its peer.
    pub(crate) fn socket(&self) -> &StdUnixStream {
        self.socket.get_ref()
    }

    /// Whether the connection waits idle: open, with nothing sent by the
    /// module (which, between exchanges, sends only to close).
    pub(crate) fn is_idle(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        let mut byte = [0u8; 1];
        matches!(
            recv(
                self.socket.get_ref().as_raw_fd(),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            ),
            Err(nix::errno::Errno::EAGAIN)
        )
    }

    /// Runs `write` until it goes through, waiting for room when the socket
    /// is full.
    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&StdUnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let mut waited = false;
        loop {
            match write(self.socket.get_ref()) {
                Ok(n) => {
                    if !waited {
                        // Room at the first try: stop watching for it.
                        self.room = None;
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.room.is_none() {
                        let copy = self.socket.get_ref().as_fd().try_clone_to_owned()?;
                        self.room = Some(register(copy, Interest::WRITABLE)?);
                    }
                    let room = self.room.as_ref().expect("UNWRAP: registered just above");
                    let mut guard = ready!(room.poll_write_ready(cx))?;
                    guard.clear_ready();
                    waited = true;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for ModuleStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.socket.poll_read_ready(cx))?;
            let wanted = buf.remaining();
            match guard.try_io(|socket| read_into(socket.get_ref(), buf)) {
                Ok(Ok(n)) => {
                    // A short read emptied the socket: the next one would
                    // only say so.
                    if n > 0 && n < wanted {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Reads from `socket` into `buf`'s room as it is, uninitialized: zeroing
/// it first, as a safe read must, would cost about what copying every
/// streamed byte once more does.
#[allow(unsafe_code)]
fn read_into(socket: &StdUnixStream, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
    // SAFETY: the room is only written to, by `read(2)` through rustix,
    // which takes `MaybeUninit` bytes and de-initializes none.
    let room = unsafe { buf.unfilled_mut() };
    let (filled, _) = rustix::io::read(socket, room)?;
    let n = filled.len();
    // SAFETY: those `n` bytes, at the start of the room, were just written.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Ok(n)
}

/// Registers `io` with the runtime for `interest` alone.
#[allow(unsafe_code)]
fn register<T: AsRawFd>(io: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `io` (a socket or an `OwnedFd`) owns its descriptor, which
    // stays open, and the same, until the `AsyncFd` drops it.
    unsafe { AsyncFd::register_with_interest(io, interest) }.map_err(|e| e.into_parts().1)
}

impl AsyncWrite for ModuleStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_with(cx, |mut socket| socket.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_with(cx, |mut socket| socket.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.socket.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Writes far beyond the socket's buffer wait for room and lose nothing;
    /// shutdown ends the peer's reading, and the stream still reads.
    #[tokio::test]
    async fn a_full_socket_waits_for_room_and_loses_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let (stream, accepted) = tokio::join!(ModuleStream::connect(&path), listener.accept());
        let mut stream = stream.expect("connect");
        let (mut peer, _) = accepted.expect("accept");

        let sent: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        let expected = sent.clone();
        let writing = tokio::spawn(async move {
            stream.write_all(&sent).await.expect("write all");
            stream.shutdown().await.expect("shutdown");
            stream
        });
        // Let the writer fill the socket before anything is read.
        tokio::task::yield_now().await;
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.expect("read to end");
        assert!(
            got == expected,
            "{} bytes arrived of {}",
            got.len(),
            expected.len()
        );
        let mut stream = writing.await.expect("writer");

        peer.write_all(b"back").await.expect("answer");
        drop(peer);
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        assert_eq!(answer, b"back");
    }
}
