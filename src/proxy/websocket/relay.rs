//! The websocket relay: frames' bytes are forwarded as they arrive, in
//! both directions at once, with only their headers parsed. That keeps the
//! per-message cost near a plain byte copy while the relay still knows
//! where frames begin, so that it can answer pings on each hop, enforce the
//! message size limit, see close frames cross, and close the client's
//! socket with 1012 when the module's incarnation fails.
//!
//! # Theory of operation
//!
//! Each direction (client → module, module → client) is a [`Half`]: it
//! reads from its source, parses frame headers ([`Scan`]), and writes
//! whole runs of bytes to its sink; with nothing waiting, from an array on
//! the stack, so that only what the sink does not take at once is kept in
//! a buffer. Data frames and close frames are
//! forwarded unchanged (masked as they came: the client masks towards us as
//! we must towards the module, and the module's frames are unmasked as they
//! must be towards the client). Pings are answered by the relay itself, on
//! the hop they came from, and pongs are dropped: each hop keeps itself
//! alive. Frames the relay makes (pongs, closes) are queued on the half
//! that owns the sink they go to, and written only between two frames.
//!
//! Both halves are one hand-written future, [`Relay`], polled as one task:
//! its whole state is the two halves' positions and buffers (let go while
//! a source has nothing to read), so that thousands of idle websockets
//! cost little more than their sockets. A half never reads while it has
//! bytes still to write: a slow sink slows its source, and only it.

use std::collections::VecDeque;
use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::head::Head;
use crate::connection::ModuleStream;
use crate::descriptors::ClientStream;
use crate::proxy::idle::{is_send_timeout, WriteTimeout};
use crate::proxy::ClientSocket;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::debug;

/// How long the closing handshake may take once a close was sent.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Read buffer per direction to begin with: while nothing waits in a
/// half's buffer, a read of this size lands on the stack and only what
/// the sink does not take is kept ([`Half::pass_fresh`]). A read that
/// fills it (a large message streaming through) moves the half to a
/// buffer that doubles, up to [`MAX_READ_BUFFER`], each time a read fills
/// it; its bytes start again at its front whenever it is empty, and it is
/// let go while the source has nothing to read ([`Half::poll_read`]): an
/// idle websocket holds no buffer, and a busy one only the front of one.
const READ_BUFFER: usize = 4 * 1024;
/// The most the read buffer grows to; a frame larger than this streams
/// through.
const MAX_READ_BUFFER: usize = 64 * 1024;
/// Frames the relay may queue for one sink (pongs, closes); more are
/// dropped (a peer that sends pings faster than it reads its pongs).
const QUEUED_FRAMES: usize = 16;
/// Longest close reason (RFC 6455 §5.5: control payloads are at most 125
/// bytes, two of which are the code).
const MAX_CLOSE_REASON: usize = 123;

/// Which peer a sink writes to; it decides masking (RFC 6455 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// The browser or client: frames to it are unmasked, from it masked.
    Client,
    /// The module: frames to it are masked, from it unmasked.
    Module,
}

/// A frame the relay makes itself.
#[derive(Debug)]
enum Made {
    Pong(Vec<u8>),
    Close(CloseCode, String),
}

impl Made {
    fn encode(self, to: Peer) -> Vec<u8> {
        let mut frame = match self {
            Made::Pong(payload) => Frame::pong(payload),
            Made::Close(code, reason) => Frame::close(Some(CloseFrame {
                code,
                reason: truncate(&reason, MAX_CLOSE_REASON).to_owned().into(),
            })),
        };
        if to == Peer::Module {
            frame.header_mut().mask = Some(rand::random());
        }
        let mut bytes = Vec::with_capacity(frame.len());
        frame
            .format(&mut bytes)
            .expect("UNWRAP: formatting into a Vec cannot fail");
        bytes
    }
}

fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Anything the relay reads frames from and writes frames to.
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One side of the relay: its connection, whole (the relay's one task reads
/// and writes it; no halves, no lock), and the bytes hyper had already read
/// past the handshake.
pub(super) struct Socket {
    io: Box<dyn Io>,
    early: Bytes,
}

impl Socket {
    /// Takes the bare socket back from an upgraded connection when it is
    /// one of ours (TCP from a client, with its send timeout and its slot
    /// under `server.max_connections`; a Unix socket to a module), so that
    /// reads and writes skip hyper's adapters.
    pub(super) fn from_upgraded(upgraded: Upgraded) -> Socket {
        let upgraded = match upgraded.downcast::<TokioIo<WriteTimeout<ClientStream>>>() {
            Ok(parts) => return Socket::new(parts.io.into_inner(), parts.read_buf),
            Err(upgraded) => upgraded,
        };
        let upgraded = match upgraded.downcast::<TokioIo<ClientSocket>>() {
            Ok(parts) => {
                // What hyper read, then what it had not read yet of what an
                // earlier connection on the socket had.
                let mut socket = parts.io.into_inner();
                socket.unread(parts.read_buf);
                let (client, early) = socket.into_parts();
                return Socket::new(client, early);
            }
            Err(upgraded) => upgraded,
        };
        let upgraded = match upgraded.downcast::<TokioIo<ModuleStream>>() {
            Ok(parts) => return Socket::new(parts.io.into_inner(), parts.read_buf),
            Err(upgraded) => upgraded,
        };
        debug!("websocket relay on hyper's upgraded stream (not a bare socket)");
        Socket::new(TokioIo::new(upgraded), Bytes::new())
    }

    fn new(io: impl Io + 'static, early: Bytes) -> Socket {
        Socket {
            io: Box::new(io),
            early,
        }
    }
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket")
            .field("early", &self.early.len())
            .finish()
    }
}

/// Relays frames between the client's and the module's sockets until both
/// sides have closed, one side is gone, or `module_failed` fires (after
/// `shutdown`, when ray-dashd is shutting down).
pub(super) fn relay(
    client: Socket,
    module: Socket,
    module_failed: CancellationToken,
    shutdown: CancellationToken,
    max_message: usize,
    name: Arc<str>,
) -> Relay {
    Relay {
        client: client.io,
        module: module.io,
        halves: [
            Half::new(Peer::Client, client.early),
            Half::new(Peer::Module, module.early),
        ],
        failed: Some(Box::pin(module_failed.clone().cancelled_owned())),
        module_failed,
        watching: None,
        shutdown,
        deadline: None,
        max_message,
        name,
    }
}

/// Both directions of one websocket as one future (see the module's theory
/// of operation). Ready once both halves are done, or once the closing
/// handshake has taken [`CLOSE_TIMEOUT`]; its sockets close when it drops.
pub(super) struct Relay {
    client: Box<dyn Io>,
    module: Box<dyn Io>,
    /// Client → module, then module → client.
    halves: [Half; 2],
    /// Fires when the module's incarnation fails; `None` once it has.
    failed: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// The token `failed` waits on: while it is not cancelled and the relay
    /// is polled with the waker `failed` holds already (a task's waker does
    /// not change), `failed` needs no poll of its own. Polling it anyway
    /// locked its notifier and compared wakers on every message.
    module_failed: CancellationToken,
    /// The waker `failed` was last polled with.
    watching: Option<Waker>,
    shutdown: CancellationToken,
    /// Set once a close has crossed or been made, or a half has stopped:
    /// the rest of the relay must end by then.
    deadline: Option<Pin<Box<Sleep>>>,
    max_message: usize,
    name: Arc<str>,
}

impl Future for Relay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let [up, down] = &mut this.halves;
        let name = &*this.name;
        let watched = this
            .watching
            .as_ref()
            .is_some_and(|waker| waker.will_wake(cx.waker()));
        if let Some(failed) = this
            .failed
            .as_mut()
            .filter(|_| !watched || this.module_failed.is_cancelled())
        {
            if failed.as_mut().poll(cx).is_pending() {
                this.watching = Some(cx.waker().clone());
            } else {
                this.failed = None;
                this.watching = None;
                // The supervisor marks a shutdown before it ends the
                // incarnations, so this tells the two apart.
                let shutting_down = this.shutdown.is_cancelled();
                let stop = || {
                    if shutting_down {
                        Stop::Shutdown
                    } else {
                        Stop::ModuleFailed
                    }
                };
                if up.is_running() {
                    up.stop(stop(), &mut down.queue, name);
                }
                if down.is_running() {
                    down.stop(stop(), &mut up.queue, name);
                }
            }
        }
        // A half may queue a frame for the other's sink (a pong, a close):
        // the other is driven again to write it.
        let (client, module) = (&mut *this.client, &mut *this.module);
        loop {
            let mut ends = Ends {
                source: &mut *client,
                sink: &mut *module,
                reply: &mut down.queue,
            };
            up.drive(cx, &mut ends, this.max_message, name);
            let queued = up.queue.len();
            let mut ends = Ends {
                source: &mut *module,
                sink: &mut *client,
                reply: &mut up.queue,
            };
            down.drive(cx, &mut ends, this.max_message, name);
            if up.is_done() || up.queue.len() <= queued {
                break;
            }
        }
        if up.is_done() && down.is_done() {
            return Poll::Ready(());
        }
        if this.deadline.is_none() && (up.scan.closing || down.scan.closing) {
            this.deadline = Some(Box::pin(tokio::time::sleep(CLOSE_TIMEOUT)));
        }
        if let Some(deadline) = &mut this.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                debug!(module = %name, "websocket closing handshake timed out");
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

/// What one half works on: the connection it reads, the one it writes, and
/// the other half's queue (frames for the source's peer).
struct Ends<'a> {
    source: &'a mut dyn Io,
    sink: &'a mut dyn Io,
    reply: &'a mut VecDeque<Vec<u8>>,
}

/// One direction of the relay: where the parser is in what its source
/// sends, and what waits to be written to its sink.
struct Half {
    /// Whose frames the source carries.
    from: Peer,
    /// Bytes read from `source` and not yet written or dropped; the first
    /// `pass` of them are checked and wait to be written to `sink`.
    buf: BytesMut,
    pass: usize,
    /// What the read buffer is sized to now (see [`READ_BUFFER`]).
    size: usize,
    scan: Scan,
    /// Frames the relay made for `sink` (pongs, closes), encoded, written
    /// at frame boundaries.
    queue: VecDeque<Vec<u8>>,
    /// How much of the first queued frame is written, once it is begun.
    sending: Option<u32>,
    state: State,
}

/// Where the parser is in a source's frames, and what it has seen.
#[derive(Debug)]
struct Scan {
    position: Position,
    /// Length of the data message in progress, across its fragments.
    message: u64,
    /// `sink` was sent a close (this source's, or one the relay made):
    /// whatever the source sends after it is dropped.
    closed: bool,
    /// A close crossed or was made, or this half stopped: the relay's
    /// closing deadline runs.
    closing: bool,
}

impl Scan {
    /// Checks the frames in `bytes` from `*pass` on and moves `*pass` past
    /// every byte to be forwarded: data and close frames, whole or begun.
    /// Stops where it needs more bytes, at a ping or a pong, and at what
    /// follows a close (each left to [`Half::parse`]); a header that breaks
    /// a rule or the size limit stops it with an error, `*pass` at the
    /// frame before.
    fn run(
        &mut self,
        from: Peer,
        bytes: &[u8],
        pass: &mut usize,
        max_message: usize,
    ) -> Result<(), Stop> {
        loop {
            match self.position {
                Position::Payload { forward, .. } => {
                    let available = bytes.len() - *pass;
                    if available == 0 || !forward {
                        return Ok(());
                    }
                    *pass += self.take(available);
                }
                Position::Boundary => {
                    let Some(header) = Head::parse(&bytes[*pass..]) else {
                        return Ok(());
                    };
                    check(from, &header)?;
                    if self.closed
                        || matches!(
                            header.opcode,
                            OpCode::Control(Control::Ping | Control::Pong)
                        )
                    {
                        return Ok(());
                    }
                    self.count(&header, max_message)?;
                    *pass += header.size;
                    if header.opcode == OpCode::Control(Control::Close) {
                        self.closed = true;
                        self.closing = true;
                    }
                    if header.length > 0 {
                        self.position = Position::Payload {
                            left: header.length,
                            forward: true,
                        };
                    }
                }
            }
        }
    }

    /// Takes up to `available` bytes of the payload in progress: how many
    /// it took; at its end the parser is at a frame boundary again.
    fn take(&mut self, available: usize) -> usize {
        let Position::Payload { left, forward } = self.position else {
            return 0;
        };
        let here = available.min(usize::try_from(left).unwrap_or(usize::MAX));
        let left = left - here as u64;
        self.position = if left > 0 {
            Position::Payload { left, forward }
        } else {
            Position::Boundary
        };
        here
    }

    /// Adds a data frame to the message it belongs to, which must stay
    /// within `max_message` bytes.
    fn count(&mut self, header: &Head, max_message: usize) -> Result<(), Stop> {
        let message = match header.opcode {
            OpCode::Data(Data::Continue) => self.message.saturating_add(header.length),
            OpCode::Data(_) => header.length,
            OpCode::Control(_) => return Ok(()),
        };
        if message > max_message as u64 {
            return Err(Stop::Refuse(
                CloseCode::Size,
                format!("message over the limit of {max_message} bytes"),
            ));
        }
        self.message = message;
        Ok(())
    }
}

/// The checks RFC 6455 §5 asks of every frame header from `from`.
fn check(from: Peer, header: &Head) -> Result<(), Stop> {
    let refuse = |why: &str| Err(Stop::Refuse(CloseCode::Protocol, why.to_owned()));
    if header.reserved != 0 {
        return refuse("reserved bits set without an extension");
    }
    match (from, header.mask.is_some()) {
        (Peer::Client, false) => return refuse("client frames must be masked"),
        (Peer::Module, true) => return refuse("module frames must not be masked"),
        _ => {}
    }
    if let OpCode::Control(control) = header.opcode {
        if matches!(control, Control::Reserved(_)) {
            return refuse("reserved opcode");
        }
        if header.length > 125 || !header.fin {
            return refuse("control frames must be whole and at most 125 bytes");
        }
    } else if let OpCode::Data(Data::Reserved(_)) = header.opcode {
        return refuse("reserved opcode");
    }
    Ok(())
}

/// Where a half is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Forwarding frames.
    Running,
    /// Stopped: writing what is left for the sink (the checked bytes, then,
    /// between frames, the queued frames up to a close).
    Finishing,
    /// All written that could be: shutting the sink's stream.
    ShuttingDown,
    Done,
}

/// Where the parser is in the source's byte stream.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// At a frame boundary.
    Boundary,
    /// Inside a data or close frame's payload: `left` bytes still to come,
    /// forwarded or (after the source's close) dropped.
    Payload { left: u64, forward: bool },
}

/// Why a half stops forwarding.
#[derive(Debug)]
enum Stop {
    /// The source closed its stream.
    Eof,
    /// A read or write failed.
    Io(std::io::Error),
    /// The source broke the protocol or the size limit: close with this.
    Refuse(CloseCode, String),
    /// The module's incarnation failed (or is being restarted).
    ModuleFailed,
    /// ray-dashd is shutting down, its modules with it.
    Shutdown,
}

impl Half {
    fn new(from: Peer, early: Bytes) -> Half {
        Half {
            from,
            // What hyper had read past the handshake comes first.
            buf: BytesMut::from(&early[..]),
            pass: 0,
            size: READ_BUFFER,
            scan: Scan {
                position: Position::Boundary,
                message: 0,
                closed: false,
                closing: false,
            },
            queue: VecDeque::new(),
            sending: None,
            state: State::Running,
        }
    }

    fn to(&self) -> Peer {
        match self.from {
            Peer::Client => Peer::Module,
            Peer::Module => Peer::Client,
        }
    }

    fn is_running(&self) -> bool {
        self.state == State::Running
    }

    fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Drives this half as far as it goes without waiting.
    fn drive(&mut self, cx: &mut Context<'_>, ends: &mut Ends<'_>, max_message: usize, name: &str) {
        loop {
            match self.state {
                State::Running => match self.forward(cx, ends, max_message) {
                    Poll::Ready(stop) => self.stop(stop, ends.reply, name),
                    Poll::Pending => return,
                },
                State::Finishing | State::ShuttingDown => {
                    if self.poll_finish(cx, ends.sink).is_pending() {
                        return;
                    }
                }
                State::Done => return,
            }
        }
    }

    /// Forwards until it must wait for its source or sink (`Pending`), or
    /// must stop (`Ready`, and why).
    fn forward(
        &mut self,
        cx: &mut Context<'_>,
        ends: &mut Ends<'_>,
        max_message: usize,
    ) -> Poll<Stop> {
        loop {
            if let Err(e) = ready!(self.poll_write_pending(cx, ends.sink)) {
                return Poll::Ready(Stop::Io(e));
            }
            if matches!(self.scan.position, Position::Boundary) && !self.queue.is_empty() {
                // Nothing may follow a close (RFC 6455 §5.5.1).
                if self.scan.closed {
                    self.queue.clear();
                } else {
                    self.begin_sending();
                }
                continue;
            }
            // Only bytes past the checked ones can be parsed.
            if self.buf.len() > self.pass {
                if let Err(stop) = self.parse(ends.reply, max_message) {
                    return Poll::Ready(stop);
                }
            }
            if self.pass > 0 {
                continue;
            }
            if self.buf.is_empty() && self.size == READ_BUFFER {
                if let Err(stop) = ready!(self.pass_fresh(cx, ends, max_message)) {
                    return Poll::Ready(stop);
                }
                continue;
            }
            match ready!(self.poll_read(cx, ends.source)) {
                Ok(0) => return Poll::Ready(Stop::Eof),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Stop::Io(e)),
            }
        }
    }

    /// Reads what the source has into the buffer once it holds bytes or
    /// has grown ([`Half::pass_fresh`] reads otherwise). While the source
    /// has nothing, an empty buffer is let go.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        source: &mut dyn Io,
    ) -> Poll<std::io::Result<usize>> {
        if self.buf.is_empty() && self.buf.capacity() < self.size {
            // Back to the front: no copy, no allocation.
            let _ = self.buf.try_reclaim(self.size);
        }
        if self.buf.capacity() - self.buf.len() < self.size / 4 {
            self.buf.reserve(self.size);
        }
        let read = tokio_util::io::poll_read_buf(Pin::new(source), cx, &mut self.buf);
        match read {
            Poll::Pending if self.buf.is_empty() => {
                self.buf = BytesMut::new();
                Poll::Pending
            }
            Poll::Ready(Ok(n)) if n > 0 => {
                // The read took all the room there was: more is coming.
                if self.buf.len() == self.buf.capacity() && self.size < MAX_READ_BUFFER {
                    self.size *= 2;
                }
                Poll::Ready(Ok(n))
            }
            read => read,
        }
    }

    /// Reads into a buffer on the stack when nothing waits in `buf` and it
    /// has not grown, and writes the frames' bytes that pass ([`Scan::run`])
    /// to the sink from there: a small message (the usual one) then costs
    /// no allocation and no copy, and only what the sink did not take, or
    /// what must be handled in place (a ping, bytes after a close), is kept
    /// in `buf`. A read that fills the array moves the half to a buffer
    /// that grows (see [`Half::poll_read`]). Allocating the whole read
    /// buffer for every poll, and letting it go when the poll found
    /// nothing, took two trips through the allocator's slow path per frame
    /// and the other half's (docs/benchmarks.md, session 25); a block of
    /// each frame's size still took one (session 31).
    fn pass_fresh(
        &mut self,
        cx: &mut Context<'_>,
        ends: &mut Ends<'_>,
        max_message: usize,
    ) -> Poll<Result<(), Stop>> {
        let mut stack = [MaybeUninit::<u8>::uninit(); READ_BUFFER];
        let mut read = ReadBuf::uninit(&mut stack);
        match Pin::new(&mut *ends.source).poll_read(cx, &mut read) {
            Poll::Pending => {
                self.buf = BytesMut::new();
                return Poll::Pending;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(Stop::Io(e))),
            Poll::Ready(Ok(())) => {}
        }
        let filled = read.filled();
        if filled.is_empty() {
            return Poll::Ready(Err(Stop::Eof));
        }
        if filled.len() == READ_BUFFER {
            // The read took all the room there was: more is coming, into a
            // buffer that grows.
            self.size *= 2;
            self.buf = BytesMut::with_capacity(self.size);
            self.buf.extend_from_slice(filled);
            return Poll::Ready(Ok(()));
        }
        let mut pass = 0;
        let checked = self.scan.run(self.from, filled, &mut pass, max_message);
        let mut written = 0;
        if checked.is_ok() && pass > 0 {
            match Pin::new(&mut *ends.sink).poll_write(cx, &filled[..pass]) {
                Poll::Ready(Ok(0)) => {
                    let zero = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Poll::Ready(Err(Stop::Io(zero)));
                }
                Poll::Ready(Ok(n)) => written = n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Stop::Io(e))),
                // Kept below; written once the sink has room.
                Poll::Pending => {}
            }
        }
        // What the sink did not take (checked, to be written first) and
        // what `run` left for `parse`.
        self.buf.extend_from_slice(&filled[written..]);
        self.pass = pass - written;
        Poll::Ready(checked)
    }

    /// Writes what waits for the sink: the frame the relay made that is
    /// begun, then the checked bytes.
    fn poll_write_pending(
        &mut self,
        cx: &mut Context<'_>,
        sink: &mut dyn Io,
    ) -> Poll<std::io::Result<()>> {
        let zero = || std::io::Error::from(std::io::ErrorKind::WriteZero);
        while let Some(written) = self.sending {
            let frame = self.queue.front().expect("UNWRAP: a frame is begun");
            let n = ready!(Pin::new(&mut *sink).poll_write(cx, &frame[written as usize..]))?;
            if n == 0 {
                return Poll::Ready(Err(zero()));
            }
            // A frame the relay makes is at most 131 bytes.
            let written = written + n as u32;
            if written as usize == frame.len() {
                self.queue.pop_front();
                self.sending = None;
            } else {
                self.sending = Some(written);
            }
        }
        while self.pass > 0 {
            let n = ready!(Pin::new(&mut *sink).poll_write(cx, &self.buf[..self.pass]))?;
            if n == 0 {
                return Poll::Ready(Err(zero()));
            }
            self.buf.advance(n);
            self.pass -= n;
        }
        Poll::Ready(Ok(()))
    }

    /// Begins writing the first queued frame to the sink.
    fn begin_sending(&mut self) {
        let is_close = self
            .queue
            .front()
            .is_some_and(|frame| frame[0] & 0x0f == u8::from(OpCode::Control(Control::Close)));
        if is_close {
            self.scan.closed = true;
            self.scan.closing = true;
        }
        self.sending = Some(0);
    }

    /// Parses the buffer past its checked bytes: data and close frames are
    /// checked and added to `pass` ([`Scan::run`]); at the front of the
    /// buffer, a ping is answered (its pong queued on `reply`) and dropped,
    /// as a pong is, and so is whatever follows a close. Returns when it
    /// needs more bytes, or when bytes are to be dropped while checked ones
    /// still wait to be written (the caller writes them and parses again);
    /// nothing is changed for a frame it returns at.
    fn parse(&mut self, reply: &mut VecDeque<Vec<u8>>, max_message: usize) -> Result<(), Stop> {
        loop {
            self.scan
                .run(self.from, &self.buf, &mut self.pass, max_message)?;
            if self.pass > 0 {
                return Ok(());
            }
            match self.scan.position {
                // All that came is passed; more is to come.
                Position::Payload { forward: true, .. } => return Ok(()),
                // After a close: dropped.
                Position::Payload { forward: false, .. } => {
                    if self.buf.is_empty() {
                        return Ok(());
                    }
                    let here = self.scan.take(self.buf.len());
                    self.buf.advance(here);
                }
                Position::Boundary => {
                    // `run` stopped at a whole header it checked: a ping or
                    // a pong, or a frame after the close.
                    let Some(header) = Head::parse(&self.buf) else {
                        return Ok(());
                    };
                    if let OpCode::Control(control @ (Control::Ping | Control::Pong)) =
                        header.opcode
                    {
                        let total = header.size + header.length as usize;
                        if self.buf.len() < total {
                            return Ok(());
                        }
                        if control == Control::Ping
                            && !self.scan.closed
                            && reply.len() < QUEUED_FRAMES
                        {
                            let mut payload = self.buf[header.size..total].to_vec();
                            if let Some(mask) = header.mask {
                                for (i, byte) in payload.iter_mut().enumerate() {
                                    *byte ^= mask[i & 3];
                                }
                            }
                            reply.push_back(Made::Pong(payload).encode(self.from));
                        }
                        self.buf.advance(total);
                        continue;
                    }
                    // Nothing may follow a close (RFC 6455 §5.5.1), but it
                    // still keeps to the size limit.
                    self.scan.count(&header, max_message)?;
                    self.buf.advance(header.size);
                    if header.length > 0 {
                        self.scan.position = Position::Payload {
                            left: header.length,
                            forward: false,
                        };
                    }
                }
            }
        }
    }

    /// Stops forwarding for `stop`: queues a close for the source's peer on
    /// `reply` and one for the sink where each should hear why, and turns
    /// to finishing.
    fn stop(&mut self, stop: Stop, reply: &mut VecDeque<Vec<u8>>, name: &str) {
        let (to_sink, to_source) = match &stop {
            // A clean end: the close already crossed, or the peer just left.
            Stop::Eof if self.scan.closed => (None, None),
            // The client took nothing for the send timeout: it hears
            // nothing more; the module is told the client is gone.
            Stop::Io(e) if is_send_timeout(e) => (
                None,
                Some((CloseCode::Away, "client stopped reading".to_owned())),
            ),
            Stop::Eof | Stop::Io(_) => match self.from {
                Peer::Client => (Some((CloseCode::Away, "client went away".to_owned())), None),
                Peer::Module => (
                    Some((CloseCode::Error, format!("module {name} connection lost"))),
                    None,
                ),
            },
            Stop::Refuse(code, reason) => {
                (Some((*code, reason.clone())), Some((*code, reason.clone())))
            }
            Stop::ModuleFailed => match self.to() {
                Peer::Client => (
                    Some((
                        CloseCode::Restart,
                        format!("module {name} failed; it is being restarted"),
                    )),
                    None,
                ),
                Peer::Module => (None, None),
            },
            // RFC 6455 §7.4.1: 1001, an endpoint "going away", such as a
            // server going down; both ends are told, the module before it
            // is stopped.
            Stop::Shutdown => (
                Some((
                    CloseCode::Away,
                    "going away: ray-dashd is shutting down".to_owned(),
                )),
                None,
            ),
        };
        if let Stop::Io(e) = &stop {
            // A send timeout was logged where it expired.
            if !is_send_timeout(e) {
                debug!(module = %name, from = ?self.from, error = %e, "websocket relay stopped");
            }
        }
        if let Some((code, reason)) = to_source {
            if reply.len() < QUEUED_FRAMES {
                reply.push_back(Made::Close(code, reason).encode(self.from));
            }
        }
        // After what the other half queued for the sink (a close reply,
        // say): only the first close reaches it.
        if let Some((code, reason)) = to_sink {
            self.queue
                .push_back(Made::Close(code, reason).encode(self.to()));
        }
        self.scan.closing = true;
        self.state = State::Finishing;
    }

    /// Writes what is left for the sink, then shuts its stream. Ready once
    /// done; a write that fails skips to the shutdown.
    fn poll_finish(&mut self, cx: &mut Context<'_>, sink: &mut dyn Io) -> Poll<()> {
        while self.state == State::Finishing {
            match ready!(self.poll_write_pending(cx, sink)) {
                Err(_) => self.state = State::ShuttingDown,
                // Between frames, and no close sent yet: the next queued.
                Ok(()) => {
                    if matches!(self.scan.position, Position::Boundary)
                        && !self.scan.closed
                        && !self.queue.is_empty()
                    {
                        self.begin_sending();
                    } else {
                        self.state = State::ShuttingDown;
                    }
                }
            }
        }
        if self.state == State::ShuttingDown {
            let _ = ready!(Pin::new(sink).poll_shutdown(cx));
            self.state = State::Done;
        }
        Poll::Ready(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

    const LIMIT: usize = 1000;

    /// A frame's bytes (any opcode, even one a peer must not send),
    /// masked when `masked`, as a client's are.
    fn frame(opcode: OpCode, fin: bool, payload: &[u8], masked: bool) -> Vec<u8> {
        let header = FrameHeader {
            is_final: fin,
            opcode,
            mask: masked.then_some([1, 2, 3, 4]),
            ..FrameHeader::default()
        };
        let mut bytes = Vec::new();
        header
            .format(payload.len() as u64, &mut bytes)
            .expect("format");
        let mut payload = payload.to_vec();
        if let Some(mask) = header.mask {
            for (i, byte) in payload.iter_mut().enumerate() {
                *byte ^= mask[i & 3];
            }
        }
        bytes.extend(payload);
        bytes
    }

    fn text(payload: &str) -> Vec<u8> {
        frame(OpCode::Data(Data::Text), true, payload.as_bytes(), true)
    }

    /// The next whole frame from `stream`: its header and unmasked payload.
    async fn next_frame(
        stream: &mut DuplexStream,
        pending: &mut Vec<u8>,
    ) -> (FrameHeader, Vec<u8>) {
        loop {
            let mut cursor = Cursor::new(&pending[..]);
            if let Some((header, length)) = FrameHeader::parse(&mut cursor).expect("a frame") {
                let start = cursor.position() as usize;
                let end = start + length as usize;
                if pending.len() >= end {
                    let mut payload = pending[start..end].to_vec();
                    if let Some(mask) = header.mask {
                        for (i, byte) in payload.iter_mut().enumerate() {
                            *byte ^= mask[i & 3];
                        }
                    }
                    pending.drain(..end);
                    return (header, payload);
                }
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk))
                .await
                .expect("a frame within 5 s")
                .expect("read");
            assert!(n > 0, "the stream ended; had {pending:?}");
            pending.extend_from_slice(&chunk[..n]);
        }
    }

    fn close_code(payload: &[u8]) -> u16 {
        u16::from_be_bytes([payload[0], payload[1]])
    }

    struct Ends {
        client: DuplexStream,
        module: DuplexStream,
        failed: CancellationToken,
        relay: tokio::task::JoinHandle<()>,
    }

    /// A relay between two duplex pipes, not yet polled, and the pipes'
    /// far ends (the client's and the module's) and its failure token.
    fn unstarted() -> (Relay, DuplexStream, DuplexStream, CancellationToken) {
        unstarted_with(LIMIT)
    }

    /// [`unstarted`] with messages of up to `limit` bytes.
    fn unstarted_with(limit: usize) -> (Relay, DuplexStream, DuplexStream, CancellationToken) {
        unstarted_sized(limit, 64 * 1024)
    }

    /// [`unstarted_with`], the module's pipe holding at most `room` bytes
    /// at a time.
    fn unstarted_sized(
        limit: usize,
        room: usize,
    ) -> (Relay, DuplexStream, DuplexStream, CancellationToken) {
        let (client_near, client) = tokio::io::duplex(64 * 1024);
        let (module_near, module) = tokio::io::duplex(room);
        let failed = CancellationToken::new();
        let relay = relay(
            Socket::new(client_near, Bytes::new()),
            Socket::new(module_near, Bytes::new()),
            failed.clone(),
            CancellationToken::new(),
            limit,
            "m".into(),
        );
        (relay, client, module, failed)
    }

    fn start() -> Ends {
        start_with(LIMIT)
    }

    /// [`start`] with messages of up to `limit` bytes.
    fn start_with(limit: usize) -> Ends {
        let (relay, client, module, failed) = unstarted_with(limit);
        Ends {
            client,
            module,
            failed,
            relay: tokio::spawn(relay),
        }
    }

    #[tokio::test]
    async fn frames_split_anywhere_cross_whole_and_pings_are_answered_on_their_hop() {
        let mut ends = start();
        let mut bytes = text("hello");
        bytes.extend(frame(OpCode::Control(Control::Ping), true, b"p1", true));
        bytes.extend(frame(OpCode::Data(Data::Binary), false, &[7; 300], true));
        bytes.extend(frame(OpCode::Data(Data::Continue), true, &[8; 5], true));
        // One byte at a time: every header and payload split across reads.
        for byte in &bytes {
            ends.client.write_all(&[*byte]).await.expect("write");
        }
        let (mut at_module, mut at_client) = (Vec::new(), Vec::new());
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            (header.opcode, &payload[..]),
            (OpCode::Data(Data::Text), &b"hello"[..])
        );
        assert!(header.mask.is_some(), "forwarded masked, as it came");
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            header.opcode,
            OpCode::Data(Data::Binary),
            "the ping is not forwarded"
        );
        assert_eq!(payload, vec![7; 300]);
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            (header.opcode, payload),
            (OpCode::Data(Data::Continue), vec![8; 5])
        );
        let (header, payload) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(
            (header.opcode, &payload[..]),
            (OpCode::Control(Control::Pong), &b"p1"[..])
        );
        assert!(header.mask.is_none(), "frames to a client are not masked");
        // And the other way.
        let reply = frame(OpCode::Data(Data::Text), true, b"back", false);
        ends.module.write_all(&reply).await.expect("write");
        let (header, payload) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(
            (header.opcode, &payload[..]),
            (OpCode::Data(Data::Text), &b"back"[..])
        );
        ends.relay.abort();
    }

    /// Frames that come in one read but that the module's socket takes a
    /// few bytes at a time: each crosses whole and in order, the ping
    /// between them is answered, and nothing is lost of what waited.
    #[tokio::test]
    async fn a_read_the_sink_takes_in_pieces_crosses_whole_and_in_order() {
        let (relay, mut client, mut module, _failed) = unstarted_sized(LIMIT, 7);
        let relay = tokio::spawn(relay);
        let mut bytes = text("first");
        bytes.extend(frame(OpCode::Control(Control::Ping), true, b"p", true));
        bytes.extend(frame(OpCode::Data(Data::Binary), false, &[7; 300], true));
        bytes.extend(frame(OpCode::Data(Data::Continue), true, &[8; 5], true));
        bytes.extend(text("last"));
        client.write_all(&bytes).await.expect("write");
        let mut at_module = Vec::new();
        let mut got = Vec::new();
        for _ in 0..4 {
            let (header, payload) = next_frame(&mut module, &mut at_module).await;
            got.push((header.opcode, payload));
        }
        assert_eq!(
            got,
            [
                (OpCode::Data(Data::Text), b"first".to_vec()),
                (OpCode::Data(Data::Binary), vec![7; 300]),
                (OpCode::Data(Data::Continue), vec![8; 5]),
                (OpCode::Data(Data::Text), b"last".to_vec()),
            ]
        );
        let (header, payload) = next_frame(&mut client, &mut Vec::new()).await;
        assert_eq!(
            (header.opcode, &payload[..]),
            (OpCode::Control(Control::Pong), &b"p"[..])
        );
        assert!(at_module.is_empty(), "nothing more: {at_module:?}");
        relay.abort();
    }

    #[tokio::test]
    async fn frames_before_a_bad_one_arrive_then_both_peers_get_1002() {
        let mut ends = start();
        let mut bytes = text("first");
        bytes.extend(frame(OpCode::Data(Data::Text), true, b"unmasked", false));
        ends.client.write_all(&bytes).await.expect("write");
        let (mut at_module, mut at_client) = (Vec::new(), Vec::new());
        let (_, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(payload, b"first");
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(header.opcode, OpCode::Control(Control::Close));
        assert_eq!(close_code(&payload), 1002);
        let (header, payload) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(header.opcode, OpCode::Control(Control::Close));
        assert_eq!(close_code(&payload), 1002);
        assert!(String::from_utf8_lossy(&payload).contains("client frames must be masked"));
        ends.relay.abort();
    }

    /// Each rule of RFC 6455 §5 the header check enforces, broken by a
    /// client frame: the client hears 1002 and which rule.
    #[tokio::test]
    async fn each_broken_header_rule_is_refused_with_1002_and_named() {
        let mut reserved_bit = text("x");
        reserved_bit[0] |= 0x40;
        let cases = [
            (reserved_bit, "reserved bits set"),
            (
                frame(OpCode::Data(Data::Reserved(3)), true, b"x", true),
                "reserved opcode",
            ),
            (
                frame(OpCode::Control(Control::Reserved(11)), true, b"", true),
                "reserved opcode",
            ),
            (
                frame(OpCode::Control(Control::Ping), true, &[7; 126], true),
                "control frames must be whole",
            ),
            (
                frame(OpCode::Control(Control::Ping), false, b"x", true),
                "control frames must be whole",
            ),
        ];
        for (bytes, why) in cases {
            let mut ends = start();
            ends.client.write_all(&bytes).await.expect("write");
            let (header, payload) = next_frame(&mut ends.client, &mut Vec::new()).await;
            assert_eq!(header.opcode, OpCode::Control(Control::Close), "{why}");
            assert_eq!(close_code(&payload), 1002, "{why}");
            assert!(
                String::from_utf8_lossy(&payload).contains(why),
                "{why}: {payload:?}"
            );
            ends.relay.abort();
        }
    }

    #[tokio::test]
    async fn a_message_over_the_limit_across_fragments_closes_with_1009() {
        let mut ends = start();
        let mut bytes = frame(OpCode::Data(Data::Text), false, &[b'a'; 600], true);
        bytes.extend(frame(
            OpCode::Data(Data::Continue),
            true,
            &[b'b'; 600],
            true,
        ));
        ends.client.write_all(&bytes).await.expect("write");
        let (mut at_module, mut at_client) = (Vec::new(), Vec::new());
        let (header, _) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            header.opcode,
            OpCode::Data(Data::Text),
            "the first part is within"
        );
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            (header.opcode, close_code(&payload)),
            (OpCode::Control(Control::Close), 1009)
        );
        let (_, payload) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(close_code(&payload), 1009);
        ends.relay.abort();
    }

    /// A continuation whose length, added to the message so far, would
    /// pass 2^64 is over the limit too (it would wrap to a small count).
    #[tokio::test]
    async fn a_fragment_length_near_two_to_the_64_closes_with_1009() {
        let mut ends = start();
        let mut bytes = frame(OpCode::Data(Data::Binary), false, &[1; 10], true);
        // FIN, continuation; masked, 64-bit length; the mask; no payload.
        bytes.extend([0x80, 0x80 | 127]);
        bytes.extend((u64::MAX - 5).to_be_bytes());
        bytes.extend([1, 2, 3, 4]);
        ends.client.write_all(&bytes).await.expect("write");
        let (_, payload) = next_frame(&mut ends.client, &mut Vec::new()).await;
        assert_eq!(close_code(&payload), 1009);
        ends.relay.abort();
    }

    #[tokio::test]
    async fn after_a_close_nothing_crosses_and_the_handshake_ends_the_relay() {
        let mut ends = start();
        let mut bytes = frame(
            OpCode::Control(Control::Close),
            true,
            &1000u16.to_be_bytes(),
            true,
        );
        bytes.extend(text("too late"));
        ends.client.write_all(&bytes).await.expect("write");
        let (mut at_module, mut at_client) = (Vec::new(), Vec::new());
        let (header, payload) = next_frame(&mut ends.module, &mut at_module).await;
        assert_eq!(
            (header.opcode, close_code(&payload)),
            (OpCode::Control(Control::Close), 1000)
        );
        // The module answers the close and hangs up.
        let reply = frame(
            OpCode::Control(Control::Close),
            true,
            &1000u16.to_be_bytes(),
            false,
        );
        ends.module.write_all(&reply).await.expect("write");
        drop(ends.module);
        let (header, _) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(header.opcode, OpCode::Control(Control::Close));
        drop(ends.client);
        tokio::time::timeout(Duration::from_secs(5), ends.relay)
            .await
            .expect("the relay ends with both sides")
            .expect("no panic");
        assert!(
            at_module.is_empty(),
            "nothing after the close: {at_module:?}"
        );
    }

    /// Small messages are read on the stack, a large one fills that read
    /// and goes on in a buffer that grows: each crosses whole, in order,
    /// both ways.
    #[tokio::test]
    async fn small_and_large_messages_cross_whole_both_ways() {
        /// Writes `payload` into `from` as one binary frame, masked as its
        /// writer must, and reads the frame that arrives at `to`.
        async fn cross(
            from: &mut DuplexStream,
            masked: bool,
            to: &mut DuplexStream,
            pending: &mut Vec<u8>,
            payload: &[u8],
        ) -> Vec<u8> {
            let binary = OpCode::Data(Data::Binary);
            from.write_all(&frame(binary, true, payload, masked))
                .await
                .expect("write");
            next_frame(to, pending).await.1
        }
        let mut ends = start_with(1 << 20);
        let large: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let messages = [&b"a"[..], &large, b"bc", &large[..READ_BUFFER], b"d"];
        let (mut at_module, mut at_client) = (Vec::new(), Vec::new());
        for payload in messages {
            let got = cross(
                &mut ends.client,
                true,
                &mut ends.module,
                &mut at_module,
                payload,
            )
            .await;
            assert!(got == payload, "{} bytes to the module", payload.len());
            let got = cross(
                &mut ends.module,
                false,
                &mut ends.client,
                &mut at_client,
                payload,
            )
            .await;
            assert!(got == payload, "{} bytes to the client", payload.len());
        }
        ends.relay.abort();
    }

    #[tokio::test]
    async fn a_failed_module_closes_the_client_with_1012() {
        let mut ends = start();
        ends.client.write_all(&text("hi")).await.expect("write");
        let mut at_module = Vec::new();
        next_frame(&mut ends.module, &mut at_module).await;
        ends.failed.cancel();
        let mut at_client = Vec::new();
        let (header, payload) = next_frame(&mut ends.client, &mut at_client).await;
        assert_eq!(
            (header.opcode, close_code(&payload)),
            (OpCode::Control(Control::Close), 1012)
        );
        drop(ends.client);
        drop(ends.module);
        tokio::time::timeout(Duration::from_secs(6), ends.relay)
            .await
            .expect("the relay ends")
            .expect("no panic");
    }

    #[tokio::test]
    async fn an_idle_relay_holds_no_buffer_and_is_small() {
        let (mut relay, mut client, mut module, _failed) = unstarted();
        client.write_all(&text("hi")).await.expect("write");
        // One poll reads the frame, forwards it, and finds both sockets
        // empty: it waits, its read buffers let go.
        assert!(futures_poll_once(&mut relay).await.is_pending());
        let (_, payload) = next_frame(&mut module, &mut Vec::new()).await;
        assert_eq!(payload, b"hi", "the frame crossed");
        assert!(relay.halves.iter().all(|h| h.buf.capacity() == 0));
        // The whole state of an idle websocket, beside its sockets.
        let size = std::mem::size_of::<Relay>();
        assert!(size <= 384, "Relay is {size} bytes");
    }

    async fn futures_poll_once(relay: &mut Relay) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *relay).poll(cx))).await
    }
}
