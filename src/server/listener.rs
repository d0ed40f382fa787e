//! The dashboard port's layers, from the listening socket to HTTP/1.1 on
//! each connection: accepting, with failed accepts paced ([`Accepting`]);
//! admission under the client cap (`accept.rs`); each admitted socket's
//! options, its TLS handshake and its HTTP/1.1 connection, run as a task
//! that a drain can finish ([`Connections`]), parked between requests when
//! plain (`waiting.rs`).

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::accept::{self, AcceptBackoff};
use super::tls::ServerTls;
use super::waiting::{self, HEADER_READ_TIMEOUT};
use super::Dispatch;
use crate::config::ServerSettings;
use crate::descriptors::ClientStream;
use crate::proxy::WriteTimeout;

/// The least each client connection's buffers may grow to (hyper's
/// default). hyper's `max_buf_size` bounds both a connection's read buffer
/// and its write buffer, which decides how many chunks of a streamed answer
/// go out in one write: held to `max_header_bytes` (64 KiB), every 64 KiB
/// chunk of a stream took a write (and a wake-up of the client) of its own.
/// The head's limit is hyper's `max_header_size`, which counts the head as
/// it came.
const MIN_CONNECTION_BUFFER_BYTES: usize = 8192 + 4096 * 100;
/// TCP keepalive of client connections: first probe after this much
/// silence, then every `KEEPALIVE_INTERVAL`, dropped after
/// `KEEPALIVE_RETRIES` unanswered. A client that vanished without a word
/// (a laptop put to sleep in the middle of a websocket or a followed log)
/// is noticed within about 90 s and its relay and module request let go.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;

/// The listening socket, with the pacing of accepts that fail.
pub(super) struct Accepting {
    listener: TcpListener,
    backoff: AcceptBackoff,
}

impl Accepting {
    pub(super) fn new(listener: TcpListener) -> Accepting {
        Accepting {
            listener,
            backoff: AcceptBackoff::default(),
        }
    }

    /// The next connection, or `None` once `shutdown` resolves. A failed
    /// accept is logged (at most once a second) and, when it says the
    /// process ran out of descriptors or memory, paced.
    pub(super) async fn next(
        &mut self,
        mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) -> Option<(TcpStream, SocketAddr)> {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => {
                        self.backoff.succeeded();
                        return Some(accepted);
                    }
                    Err(e) => {
                        let pause = self.backoff.failed(&e);
                        if !pause.is_zero() {
                            tokio::select! {
                                _ = tokio::time::sleep(pause) => {}
                                _ = shutdown.as_mut() => return None,
                            }
                        }
                    }
                },
                _ = shutdown.as_mut() => return None,
            }
        }
    }
}

/// The connections being served, each in a task of its own, and what they
/// are served with.
pub(super) struct Connections {
    service: Dispatch,
    /// For TLS connections.
    http: http1::Builder,
    /// For plain connections: `http` with hyper's header read timeout on
    /// [`waiting::PolledTimer`].
    plain_http: http1::Builder,
    /// A connection over the cap answers one request, quickly.
    overflow_http: http1::Builder,
    overflow_service: accept::Overflow,
    tls: Option<Arc<ServerTls>>,
    send_timeout: Duration,
    /// The most a request head may take (`server.max_header_bytes`).
    max_header_bytes: usize,
    tasks: TaskTracker,
    drain: CancellationToken,
    /// Plain connections parked between requests now (`waiting.rs`).
    waiting: Arc<AtomicUsize>,
}

impl Connections {
    pub(super) fn new(
        service: Dispatch,
        settings: &ServerSettings,
        max_connections: usize,
        tls: Option<Arc<ServerTls>>,
    ) -> Connections {
        // HTTP/1.1 only: the dashboard's clients (browsers, Ray's CLI and
        // SDK, probes) all speak it (over TLS too: ALPN offers nothing
        // else), and a plain connection lets a websocket relay take the
        // bare socket back after the upgrade.
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(settings.max_header_bytes.max(MIN_CONNECTION_BUFFER_BYTES))
            .max_header_size(settings.max_header_bytes);
        // The number of header lines is left at hyper's default (100, beyond
        // which 431): any other count makes hyper place the parser's two
        // header arrays (4 KiB each) on the heap, for every request.

        // Plain connections are served by `waiting::drive`, which wakes
        // them often enough for a timer that is only polled.
        let mut plain_http = http.clone();
        plain_http.timer(waiting::PolledTimer);
        let mut overflow_http = http.clone();
        overflow_http
            .keep_alive(false)
            .header_read_timeout(accept::OVERFLOW_DEADLINE);
        let overflow_service = accept::Overflow {
            dispatch: service.clone(),
            max: max_connections,
        };
        Connections {
            service,
            http,
            plain_http,
            overflow_http,
            overflow_service,
            tls,
            send_timeout: settings.client_send_timeout,
            max_header_bytes: settings.max_header_bytes,
            tasks: TaskTracker::new(),
            drain: CancellationToken::new(),
            waiting: Arc::default(),
        }
    }

    /// The plain connections parked between requests now.
    pub(super) fn waiting(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.waiting)
    }

    /// Serves a connection over the cap: one request within
    /// [`accept::OVERFLOW_DEADLINE`], `permit` held meanwhile.
    pub(super) fn serve_overflow(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
    ) {
        let http = self.overflow_http.clone();
        let service = self.overflow_service.clone();
        let tls = self.tls.clone();
        let connection = async move {
            match tls {
                None => http.serve_connection(TokioIo::new(stream), service).await?,
                Some(tls) => {
                    let stream = tls.accept(stream, |tcp| tcp).await?;
                    http.serve_connection(TokioIo::new(stream), service).await?
                }
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        };
        self.tasks.spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(accept::OVERFLOW_DEADLINE, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "connection over the cap ended with an error")
                }
                Err(_) => debug!(%peer, "connection over the cap timed out"),
            }
        });
    }

    /// Serves an admitted client: its socket's options, its TLS handshake
    /// (in its task), then HTTP/1.1 until it closes or a drain finishes its
    /// request in flight. The slot (`permit`) goes with the socket, into a
    /// websocket relay too; every write to the client waits at most the
    /// send timeout. A plain connection is parked while idle (`waiting.rs`).
    pub(super) fn serve_client(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
    ) {
        tune(&stream);
        let send_timeout = self.send_timeout;
        let drain = self.drain.clone();
        let service = self.service.clone();
        let Some(tls) = self.tls.clone() else {
            let stream = WriteTimeout::new(ClientStream::new(stream, permit), send_timeout, peer);
            let waiting = Arc::clone(&self.waiting);
            self.tasks.spawn(waiting::drive(
                self.plain_http.clone(),
                stream,
                service,
                drain,
                peer,
                waiting,
                self.max_header_bytes,
            ));
            return;
        };
        let http = self.http.clone();
        self.tasks.spawn(async move {
            let handshake = tokio::select! {
                handshake = tls.accept(stream, |tcp| ClientStream::new(tcp, permit)) => handshake,
                _ = drain.cancelled() => return,
            };
            match handshake {
                Ok(stream) => {
                    let stream = WriteTimeout::new(stream, send_timeout, peer);
                    drive(&http, stream, service, drain, peer).await;
                }
                Err(e) => debug!(%peer, error = %e, "TLS handshake failed"),
            }
        });
    }

    /// Lets the connections finish their requests in flight, then close,
    /// within `grace`.
    pub(super) async fn drain(self, grace: Duration) {
        info!(
            connections = self.tasks.len(),
            "stopped accepting; draining"
        );
        self.drain.cancel();
        self.tasks.close();
        tokio::select! {
            _ = self.tasks.wait() => info!("drained"),
            _ = tokio::time::sleep(grace) => {
                warn!(grace_ms = grace.as_millis() as u64, "drain timed out");
            }
        }
    }
}

/// A client socket's options: no Nagle delay, and TCP keepalive so that a
/// client gone without a word is let go.
fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        debug!(error = %e, "cannot set TCP keepalive");
    }
}

/// Serves one TLS client connection over `stream` until it ends, or, once
/// `drain` is cancelled, until the request in flight is answered.
fn drive<S>(
    http: &http1::Builder,
    stream: S,
    service: Dispatch,
    drain: CancellationToken,
    peer: SocketAddr,
) -> impl std::future::Future<Output = ()> + Send + 'static
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = http
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    async move {
        tokio::pin!(connection);
        let ended = tokio::select! {
            ended = connection.as_mut() => ended,
            _ = drain.cancelled() => {
                // Finish the request in flight, then close.
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        waiting::log_end(ended, peer);
    }
}
