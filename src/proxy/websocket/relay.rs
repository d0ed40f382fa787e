//! The websocket relay: frames' bytes are forwarded as they arrive, in
//! both directions at once, with only their headers parsed. That keeps the
//! per-message cost near a plain byte copy while the relay still knows
//! where frames begin, so that it can answer pings on each hop, enforce the
//! message size limit, see close frames cross, and close the client's
//! socket with 1012 when the module's incarnation fails.
//!
//! # Theory of operation
//!
//! Each direction (client → module, module → client) is one loop that
//! reads from its source into a buffer, parses frame headers, and writes
//! whole runs of bytes to its sink. Data frames and close frames are
//! forwarded unchanged (masked as they came: the client masks towards us as
//! we must towards the module, and the module's frames are unmasked as they
//! must be towards the client). Pings are answered by the relay itself, on
//! the hop they came from, and pongs are dropped: each hop keeps itself
//! alive. Frames the relay makes (pongs, closes) reach a sink only through
//! the loop that owns it, and only between two frames.

use std::future::Future as _;
use std::io::Cursor;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use ray_dashd_contract::LockExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::connection::ModuleStream;
use crate::descriptors::ClientStream;
use crate::proxy::idle::{is_send_timeout, WriteTimeout};
use crate::proxy::ClientSocket;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Control, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How long the closing handshake may take once a close was sent.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Read buffer per direction to begin with. It doubles, up to
/// [`MAX_READ_BUFFER`], each time a read fills it (a large message
/// streaming through); its bytes start again at its front whenever it is
/// empty, and it is let go while the source has nothing to read
/// ([`read_some`]): an idle websocket holds no buffer, and a busy one only
/// the front of one.
const READ_BUFFER: usize = 4 * 1024;
/// The most the read buffer grows to; a frame larger than this streams
/// through.
const MAX_READ_BUFFER: usize = 64 * 1024;
/// Frames the relay may queue for one sink (pongs, closes).
const QUEUED_FRAMES: usize = 16;
/// Longest close reason (RFC 6455 §5.5: control payloads are at most 125
/// bytes, two of which are the code).
const MAX_CLOSE_REASON: usize = 123;

/// The frames one direction makes for the other's sink (pongs, closes):
/// rarely any, so a small shared queue rather than a channel (tokio's
/// `mpsc` allocates its first block of 32 slots up front: about 1.5 KB per
/// direction with the channel itself).
#[derive(Default)]
struct Mailbox {
    state: std::sync::Mutex<MailState>,
    posted: tokio::sync::Notify,
}

#[derive(Default)]
struct MailState {
    frames: std::collections::VecDeque<Made>,
    /// The sending side is gone: nothing more will come.
    closed: bool,
}

/// The sending side of a [`Mailbox`]; dropping it closes the box.
struct Outbox(std::sync::Arc<Mailbox>);

/// The receiving side of a [`Mailbox`].
struct Inbox(std::sync::Arc<Mailbox>);

fn mailbox() -> (Outbox, Inbox) {
    let shared = std::sync::Arc::new(Mailbox::default());
    (Outbox(shared.clone()), Inbox(shared))
}

impl Outbox {
    /// Queues `made` unless [`QUEUED_FRAMES`] wait already.
    fn try_send(&self, made: Made) {
        let mut state = self.0.state.locked();
        if state.frames.len() < QUEUED_FRAMES {
            state.frames.push_back(made);
            drop(state);
            self.0.posted.notify_one();
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.0.state.locked().closed = true;
        self.0.posted.notify_one();
    }
}

impl Inbox {
    fn try_recv(&mut self) -> Option<Made> {
        self.0.state.locked().frames.pop_front()
    }

    /// The next frame; `None` once the box is closed and empty.
    async fn recv(&mut self) -> Option<Made> {
        loop {
            {
                let mut state = self.0.state.locked();
                if let Some(made) = state.frames.pop_front() {
                    return Some(made);
                }
                if state.closed {
                    return None;
                }
            }
            self.0.posted.notified().await;
        }
    }
}

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

/// Reads into `buf`, which must have room. While the source has nothing
/// to read, an empty `buf` is let go, and taken again (`size`) when the
/// source wakes the relay: an idle direction holds no buffer.
async fn read_some<R: AsyncRead + Unpin>(
    source: &mut R,
    buf: &mut BytesMut,
    size: usize,
) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| {
        if buf.capacity() == 0 {
            buf.reserve(size);
        }
        let read = std::pin::pin!(source.read_buf(buf)).poll(cx);
        if read.is_pending() && buf.is_empty() {
            *buf = BytesMut::new();
        }
        read
    })
    .await
}

/// One side of the relay: its two halves and the bytes hyper had already
/// read past the handshake.
pub(super) struct Socket {
    reader: Box<dyn AsyncRead + Send + Unpin>,
    writer: Box<dyn AsyncWrite + Send + Unpin>,
    early: Bytes,
    /// A client's slot under `server.max_connections`, held until the
    /// relay ends and the socket closes.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Socket {
    /// Takes the bare socket back from an upgraded connection when it is
    /// one of ours (TCP from a client, a Unix socket to a module), so that
    /// reads and writes skip hyper's adapters and the halves need no lock.
    /// A client's writing half keeps its send timeout.
    pub(super) fn from_upgraded(upgraded: Upgraded) -> Socket {
        let upgraded = match upgraded.downcast::<TokioIo<WriteTimeout<ClientStream>>>() {
            Ok(parts) => return Socket::client(parts.io.into_inner(), parts.read_buf),
            Err(upgraded) => upgraded,
        };
        let upgraded = match upgraded.downcast::<TokioIo<ClientSocket>>() {
            Ok(parts) => {
                // What hyper read, then what it had not read yet of what an
                // earlier connection on the socket had.
                let mut socket = parts.io.into_inner();
                socket.unread(parts.read_buf);
                let (client, early) = socket.into_parts();
                return Socket::client(client, early);
            }
            Err(upgraded) => upgraded,
        };
        let upgraded = match upgraded.downcast::<TokioIo<ModuleStream>>() {
            Ok(parts) => return Socket::split(parts.io.into_inner().into_split(), parts.read_buf),
            Err(upgraded) => upgraded,
        };
        debug!("websocket relay on hyper's upgraded stream (not a bare socket)");
        let (reader, writer) = tokio::io::split(TokioIo::new(upgraded));
        Socket::split((reader, writer), Bytes::new())
    }

    /// A client's TCP socket, its writing half under the send timeout.
    fn client(client: WriteTimeout<ClientStream>, early: Bytes) -> Socket {
        let (client, timeout, peer) = client.into_parts();
        let (stream, slot) = client.into_parts();
        let (reader, writer) = stream.into_split();
        let writer = WriteTimeout::new(writer, timeout, peer);
        let mut socket = Socket::split((reader, writer), early);
        socket.slot = Some(slot);
        socket
    }

    fn split<R, W>((reader, writer): (R, W), early: Bytes) -> Socket
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        Socket {
            reader: Box::new(reader),
            writer: Box::new(writer),
            early,
            slot: None,
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
pub(super) async fn relay(
    client: Socket,
    module: Socket,
    module_failed: CancellationToken,
    shutdown: CancellationToken,
    max_message: usize,
    name: &str,
) {
    // Let go when the relay ends, with the socket.
    let _slots = (client.slot, module.slot);
    let (to_client, to_client_queue) = mailbox();
    let (to_module, to_module_queue) = mailbox();
    // Set once a close has crossed (or been made): the rest has a deadline.
    let closing = CancellationToken::new();
    let upstream = Direction {
        from: Peer::Client,
        source: client.reader,
        early: client.early,
        sink: module.writer,
        queue: to_module_queue,
        reply: to_client,
        max_message,
        closing: closing.clone(),
    };
    let downstream = Direction {
        from: Peer::Module,
        source: module.reader,
        early: module.early,
        sink: client.writer,
        queue: to_client_queue,
        reply: to_module,
        max_message,
        closing: closing.clone(),
    };
    let both = async {
        tokio::join!(
            upstream.run(module_failed.clone(), &shutdown, name),
            downstream.run(module_failed.clone(), &shutdown, name)
        )
    };
    let deadline = async {
        closing.cancelled().await;
        tokio::time::sleep(CLOSE_TIMEOUT).await;
    };
    tokio::select! {
        _ = both => {}
        _ = deadline => debug!(module = %name, "websocket closing handshake timed out"),
    }
}

/// One direction of the relay.
struct Direction<R, W> {
    /// Whose frames `source` carries.
    from: Peer,
    source: R,
    /// Bytes read from `source` before the relay began.
    early: Bytes,
    sink: W,
    /// Frames made for this sink by the other direction.
    queue: Inbox,
    /// Frames for the source's peer, written by the other direction.
    reply: Outbox,
    max_message: usize,
    closing: CancellationToken,
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

/// Why a direction stops forwarding.
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

impl<R, W> Direction<R, W>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    fn to(&self) -> Peer {
        match self.from {
            Peer::Client => Peer::Module,
            Peer::Module => Peer::Client,
        }
    }

    async fn run(
        mut self,
        module_failed: CancellationToken,
        shutdown: &CancellationToken,
        name: &str,
    ) {
        let mut size = READ_BUFFER;
        let mut buf = BytesMut::with_capacity(READ_BUFFER.max(self.early.len()));
        buf.extend_from_slice(&std::mem::take(&mut self.early));
        let mut position = Position::Boundary;
        // Length of the data message in progress, across its fragments.
        let mut message = 0u64;
        // A close from this source was forwarded: ignore what follows.
        let mut closed = false;
        if !buf.is_empty() {
            if let Err(stop) = self
                .forward(&mut buf, &mut position, &mut message, &mut closed)
                .await
            {
                Box::pin(self.finish(stop, position, closed, name)).await;
                return;
            }
        }
        // Registered once: re-registering every turn would take the token's
        // lock once per message.
        let failed = module_failed.cancelled();
        tokio::pin!(failed);
        // Until the other direction has ended (its sender gone): a closed
        // queue answers at once, so polling it again would spin.
        let mut queue_open = true;
        let stop = loop {
            let at_boundary = matches!(position, Position::Boundary);
            tokio::select! {
                biased;
                // The supervisor marks a shutdown before it ends the
                // incarnations, so this tells the two apart.
                _ = &mut failed => break if shutdown.is_cancelled() {
                    Stop::Shutdown
                } else {
                    Stop::ModuleFailed
                },
                made = self.queue.recv(), if at_boundary && queue_open => {
                    let Some(made) = made else {
                        queue_open = false;
                        continue;
                    };
                    let is_close = matches!(made, Made::Close(..));
                    if let Err(e) = self.sink.write_all(&made.encode(self.to())).await {
                        break Stop::Io(e);
                    }
                    if is_close {
                        self.closing.cancel();
                    }
                }
                read = read_some(&mut self.source, &mut buf, size) => match read {
                    Ok(0) => break Stop::Eof,
                    Err(e) => break Stop::Io(e),
                    Ok(_) => {
                        // The read took all the room there was: more is coming.
                        if buf.len() == buf.capacity() && size < MAX_READ_BUFFER {
                            size *= 2;
                        }
                        match self.forward(&mut buf, &mut position, &mut message, &mut closed).await {
                            Ok(()) => {}
                            Err(stop) => break stop,
                        }
                        if buf.is_empty() && buf.capacity() < size {
                            // Back to the front: no copy, no allocation.
                            let _ = buf.try_reclaim(size);
                        }
                        if buf.capacity() - buf.len() < size / 4 {
                            buf.reserve(size);
                        }
                    }
                },
            }
        };
        Box::pin(self.finish(stop, position, closed, name)).await;
    }

    /// Forwards every complete piece of `buf`, answering pings and checking
    /// sizes; what is left is an incomplete header or ping.
    async fn forward(
        &mut self,
        buf: &mut BytesMut,
        position: &mut Position,
        message: &mut u64,
        closed: &mut bool,
    ) -> Result<(), Stop> {
        // The first `pass` bytes of `buf` are checked and wait to be written.
        let mut pass = 0usize;
        loop {
            match *position {
                Position::Payload { left, forward } => {
                    let available = buf.len() - pass;
                    if available == 0 {
                        break;
                    }
                    let here = available.min(usize::try_from(left).unwrap_or(usize::MAX));
                    if forward {
                        pass += here;
                    } else {
                        self.flush(buf, &mut pass).await?;
                        buf.advance(here);
                    }
                    let left = left - here as u64;
                    if left > 0 {
                        *position = Position::Payload { left, forward };
                        break;
                    }
                    *position = Position::Boundary;
                }
                Position::Boundary => {
                    let mut cursor = Cursor::new(&buf[pass..]);
                    let parsed = FrameHeader::parse(&mut cursor).map_err(|e| {
                        Stop::Refuse(CloseCode::Protocol, format!("bad frame: {e}"))
                    })?;
                    let Some((header, length)) = parsed else {
                        break;
                    };
                    let header_len = cursor.position() as usize;
                    self.check(&header, length)?;
                    match header.opcode {
                        OpCode::Control(control @ (Control::Ping | Control::Pong)) => {
                            let total = header_len + length as usize;
                            if buf.len() - pass < total {
                                break; // the rest of this small frame is still on its way
                            }
                            self.flush(buf, &mut pass).await?;
                            if control == Control::Ping && !*closed {
                                let mut payload = buf[header_len..total].to_vec();
                                if let Some(mask) = header.mask {
                                    for (i, byte) in payload.iter_mut().enumerate() {
                                        *byte ^= mask[i & 3];
                                    }
                                }
                                // A full queue means the peer is not reading
                                // its pongs anyway.
                                self.reply.try_send(Made::Pong(payload));
                            }
                            buf.advance(total);
                            continue;
                        }
                        OpCode::Control(Control::Close) => self.closing.cancel(),
                        OpCode::Data(Data::Continue) => *message += length,
                        OpCode::Data(_) => *message = length,
                        OpCode::Control(_) => {}
                    }
                    if matches!(header.opcode, OpCode::Data(_))
                        && *message > self.max_message as u64
                    {
                        return Err(Stop::Refuse(
                            CloseCode::Size,
                            format!("message over the limit of {} bytes", self.max_message),
                        ));
                    }
                    // Nothing may follow a close (RFC 6455 §5.5.1): drop it.
                    let forward = !*closed;
                    if forward {
                        pass += header_len;
                    } else {
                        self.flush(buf, &mut pass).await?;
                        buf.advance(header_len);
                    }
                    if header.opcode == OpCode::Control(Control::Close) {
                        *closed = true;
                    }
                    if length > 0 {
                        *position = Position::Payload {
                            left: length,
                            forward,
                        };
                    }
                }
            }
        }
        self.flush(buf, &mut pass).await
    }

    /// Writes the first `pass` bytes of `buf` to the sink and drops them.
    async fn flush(&mut self, buf: &mut BytesMut, pass: &mut usize) -> Result<(), Stop> {
        if *pass > 0 {
            self.sink.write_all(&buf[..*pass]).await.map_err(Stop::Io)?;
            buf.advance(*pass);
            *pass = 0;
        }
        Ok(())
    }

    /// The checks RFC 6455 §5 asks of every frame header.
    fn check(&self, header: &FrameHeader, length: u64) -> Result<(), Stop> {
        let refuse = |why: &str| Err(Stop::Refuse(CloseCode::Protocol, why.to_owned()));
        if header.rsv1 || header.rsv2 || header.rsv3 {
            return refuse("reserved bits set without an extension");
        }
        match (self.from, header.mask.is_some()) {
            (Peer::Client, false) => return refuse("client frames must be masked"),
            (Peer::Module, true) => return refuse("module frames must not be masked"),
            _ => {}
        }
        if let OpCode::Control(control) = header.opcode {
            if matches!(control, Control::Reserved(_)) {
                return refuse("reserved opcode");
            }
            if length > 125 || !header.is_final {
                return refuse("control frames must be whole and at most 125 bytes");
            }
        } else if let OpCode::Data(Data::Reserved(_)) = header.opcode {
            return refuse("reserved opcode");
        }
        Ok(())
    }

    /// Ends this direction: tells both peers why where it can, and closes
    /// the sink's stream.
    async fn finish(mut self, stop: Stop, position: Position, closed: bool, name: &str) {
        let at_boundary = matches!(position, Position::Boundary);
        let (to_sink, to_source) = match &stop {
            // A clean end: the close already crossed, or the peer just left.
            Stop::Eof if closed => (None, None),
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
            self.reply.try_send(Made::Close(code, reason));
        }
        if let Some((code, reason)) = to_sink {
            if at_boundary && !closed {
                let frame = Made::Close(code, reason).encode(self.to());
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.write_all(&frame)).await;
            }
        }
        self.closing.cancel();
        // Frames the other direction still queued for this sink (a close
        // reply, say) go out before the stream ends.
        while let Some(made) = self.queue.try_recv() {
            if !at_boundary {
                break;
            }
            let frame = made.encode(self.to());
            if self.sink.write_all(&frame).await.is_err() {
                break;
            }
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.sink.shutdown()).await;
    }
}
