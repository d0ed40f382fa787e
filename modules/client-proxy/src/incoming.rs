//! The client port's connections, as the gRPC server takes them: accepted
//! TCP, and with Ray's TLS on, each after its TLS handshake (the client
//! must present a certificate from Ray's CA, as Ray's proxier requires).
//!
//! Each handshake runs in a task of its own, bounded in time, so a client
//! that is slow or silent in its handshake holds up no other client.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use ray_dashd_tls::{RayTls, ServerTlsStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tracing::info;

/// The longest a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY_BACKLOG: usize = 64;

/// A client's connection.
#[derive(Debug)]
pub enum Conn {
    /// TLS is off.
    Plain(TcpStream),
    /// With Ray's TLS (boxed: its state is large next to a socket's).
    Tls(Box<ServerTlsStream>),
}

/// The connections of `listener`, handshaken with `tls` when given. With
/// TLS, a failed handshake is logged and left out; an accept error is
/// passed on as it is without TLS (the server decides whether it ends).
pub fn incoming(
    listener: TcpListener,
    tls: Option<RayTls>,
) -> Pin<Box<dyn Stream<Item = io::Result<Conn>> + Send>> {
    let Some(tls) = tls else {
        return TcpListenerStream::new(listener)
            .map(|accepted| {
                let tcp = accepted?;
                tcp.set_nodelay(true)?;
                Ok(Conn::Plain(tcp))
            })
            .boxed();
    };
    let (ready, taken) = mpsc::channel(READY_BACKLOG);
    tokio::spawn(accept_loop(listener, tls, ready));
    ReceiverStream::new(taken).boxed()
}

/// Accepts until the server drops the stream.
async fn accept_loop(listener: TcpListener, tls: RayTls, ready: mpsc::Sender<io::Result<Conn>>) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = ready.closed() => return,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if ready.send(Err(e)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let tls = tls.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            if let Err(e) = tcp.set_nodelay(true) {
                info!(%peer, error = %e, "Ray client connection lost before its TLS handshake");
                return;
            }
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send(Ok(Conn::Tls(Box::new(stream)))).await;
                }
                // Logged, not sent on: the server would count it against the
                // port, and an operator needs to see why a client was turned
                // away (no certificate, another CA, plain gRPC).
                Ok(Err(e)) => {
                    info!(%peer, error = %e, "Ray client refused: TLS handshake failed")
                }
                Err(_) => info!(
                    %peer,
                    timeout = ?HANDSHAKE_TIMEOUT,
                    "Ray client refused: no TLS handshake in time"
                ),
            }
        });
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Plain(tcp) => tcp.connect_info(),
            Conn::Tls(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
