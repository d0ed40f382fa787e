//! Dialling a Ray gRPC server, in the clear or with Ray's TLS: the stream
//! ([`ClientStream`]), the dial ([`connect`]), and the same as a connector
//! for tonic channels and hyper clients ([`Connector`], [`ClientIo`]).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::either::Either;

use crate::RayTls;

/// A connection to a server: plain TCP (`Left`), or Ray's TLS over it
/// (`Right`, boxed: its state is large next to a socket's). tokio-util's
/// `Either` forwards reads and writes, vectored writes included.
pub type ClientStream = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// Connects to `host:port` (Nagle off: gRPC's small frames must not wait),
/// then, with `tls`, makes the TLS handshake, checking the server's
/// certificate against `host`. Errors say which step failed and where.
pub async fn connect(tls: Option<&RayTls>, host: &str, port: u16) -> io::Result<ClientStream> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let tcp = TcpStream::connect((bare, port))
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("connect to {host}:{port}: {e}")))?;
    tcp.set_nodelay(true)?;
    match tls {
        None => Ok(Either::Left(tcp)),
        Some(tls) => {
            let stream = tls.handshake(host, tcp).await.map_err(|e| {
                io::Error::new(e.kind(), format!("TLS handshake with {host}:{port}: {e}"))
            })?;
            Ok(Either::Right(Box::new(stream)))
        }
    }
}

/// Dials the host and port of each URI it is given with [`connect`]: a
/// tonic channel's connector (`Endpoint::connect_with_connector_lazy`) and
/// a hyper client's.
#[derive(Debug, Clone, Default)]
pub struct Connector {
    tls: Option<RayTls>,
    timeout: Option<Duration>,
}

impl Connector {
    /// Dials with `tls`, or in the clear when `None`.
    pub fn new(tls: Option<RayTls>) -> Connector {
        Connector { tls, timeout: None }
    }

    /// Bounds the connection and handshake by `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Connector {
        self.timeout = Some(timeout);
        self
    }
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = ClientIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<ClientIo>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: no host"))
            })?;
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let dial = connect(tls.as_ref(), host, port);
            let stream = match timeout {
                None => dial.await?,
                Some(limit) => tokio::time::timeout(limit, dial).await.map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no connection to {host}:{port} within {limit:?}"),
                    )
                })??,
            };
            Ok(ClientIo(TokioIo::new(stream)))
        })
    }
}

/// A [`ClientStream`] as hyper's I/O (what tonic's channels and hyper's
/// clients read and write).
#[derive(Debug)]
pub struct ClientIo(TokioIo<ClientStream>);

impl ClientIo {
    /// The stream.
    pub fn into_inner(self) -> ClientStream {
        self.0.into_inner()
    }
}

impl hyper::rt::Read for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ClientIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        hyper::rt::Write::is_write_vectored(&self.0)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for ClientIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}
