//! The HTTP/2 connection that a server's `RayletDriver` calls take.
//!
//! It speaks h2 directly rather than through hyper's client. hyper hands a
//! request body to a new stream only once the stream is open, that is once
//! its HEADERS have been written, so every call went to the server in two
//! writes (HEADERS, then its one DATA frame) and woke the server twice. Here
//! the body's first frame is queued together with the HEADERS and both
//! leave in one write; the rest of a larger body follows under the server's
//! flow control.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use ray_dashd_contract::LockExt;
use ray_dashd_tls::RayTls;
use tonic::body::Body;
use tracing::{debug, warn};

use crate::h2_settings::{CONNECTION_WINDOW_BYTES, MAX_FRAME_BYTES, STREAM_WINDOW_BYTES};

/// The longest wait for the TCP connection and the HTTP/2 handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a ping may go unanswered (Ray's channels send one every
/// 30 s, which its servers accept).
const MAX_PING_WAIT: Duration = Duration::from_secs(20);

/// Why a call could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// No connection could be made.
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    /// The handshake, the connection or the stream failed.
    #[error(transparent)]
    H2(#[from] h2::Error),
    /// The client's request body failed before it was sent on.
    #[error("the call's request broke off: {0}")]
    Request(String),
}

/// The host servers listen on, and the name their certificate must hold
/// with TLS on (Ray's proxier dials them there too).
const SERVER_HOST: &str = "127.0.0.1";

/// One multiplexed connection to a server, made at its first call and made
/// again when it has broken.
#[derive(Debug)]
pub struct DriverChannel {
    port: u16,
    /// Ray's TLS, when the servers speak it.
    tls: Option<RayTls>,
    /// How often the connection is pinged.
    ping: Duration,
    sender: Mutex<Option<SendRequest<Bytes>>>,
}

impl DriverChannel {
    /// A channel to `127.0.0.1:port`, with `tls` when given, its
    /// connection pinged every `ping`; nothing is connected yet.
    pub fn new(port: u16, ping: Duration, tls: Option<RayTls>) -> DriverChannel {
        DriverChannel {
            port,
            tls,
            ping,
            sender: Mutex::new(None),
        }
    }

    /// Sends `request` and returns the server's answer as it comes. The
    /// answer's body yields the server's frames and trailers unchanged.
    pub async fn call(
        &self,
        request: http::Request<Body>,
    ) -> Result<http::Response<AnswerBody>, DriverError> {
        let (parts, mut body) = request.into_parts();
        // A unary request's message arrives with its headers: wait for it,
        // so that it is sent with them.
        let first = match body.frame().await {
            Some(Ok(frame)) => Some(frame),
            Some(Err(e)) => return Err(DriverError::Request(e.to_string())),
            None => None,
        };
        let ended = first.is_none() || body.is_end_stream();
        let mut sender = self.ready_sender().await?;
        let head = http::Request::from_parts(parts, ());
        let (answer, mut stream) = sender.send_request(head, first.is_none())?;
        if let Some(frame) = first {
            send_frame(&mut stream, frame, ended)?;
        }
        if !ended {
            tokio::spawn(async move {
                let mut stream = stream;
                if let Err(e) = pump(body, &mut stream).await {
                    debug!(error = %e, "a driver call's request body broke off");
                    stream.send_reset(h2::Reason::CANCEL);
                }
            });
        }
        let answer = answer.await?;
        Ok(answer.map(|inner| AnswerBody {
            inner,
            data_done: false,
        }))
    }

    /// A sender that is ready for a new stream, on the cached connection
    /// or, when that one has gone, on a new one.
    async fn ready_sender(&self) -> Result<SendRequest<Bytes>, DriverError> {
        let cached = self.sender.locked().clone();
        if let Some(sender) = cached {
            match sender.ready().await {
                Ok(sender) => return Ok(sender),
                Err(e) => {
                    debug!(port = self.port, error = %e, "driver connection gone; reconnecting")
                }
            }
        }
        let sender = self.connect().await?;
        *self.sender.locked() = Some(sender.clone());
        Ok(sender.ready().await?)
    }

    async fn connect(&self) -> Result<SendRequest<Bytes>, DriverError> {
        let handshake = async {
            let stream = ray_dashd_tls::connect(self.tls.as_ref(), SERVER_HOST, self.port)
                .await
                .map_err(DriverError::Connect)?;
            let (sender, connection) = h2::client::Builder::new()
                .initial_window_size(STREAM_WINDOW_BYTES)
                .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                .max_frame_size(MAX_FRAME_BYTES)
                .handshake::<_, Bytes>(stream)
                .await?;
            Ok::<_, DriverError>((sender, connection))
        };
        let (sender, connection) = tokio::time::timeout(CONNECT_TIMEOUT, handshake)
            .await
            .map_err(|_| {
                DriverError::Connect(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no HTTP/2 connection within {CONNECT_TIMEOUT:?}"),
                ))
            })??;
        let port = self.port;
        let mut connection = connection;
        let pings = connection.ping_pong();
        let (interval, patience) = (self.ping, self.ping.min(MAX_PING_WAIT));
        tokio::spawn(async move {
            // A server that stops answering pings is hung: dropping the
            // connection fails its calls (UNAVAILABLE to the client) rather
            // than leaving them waiting for ever.
            let hung = async {
                let Some(mut pings) = pings else {
                    return std::future::pending().await;
                };
                loop {
                    tokio::time::sleep(interval).await;
                    match tokio::time::timeout(patience, pings.ping(h2::Ping::opaque())).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return e.to_string(),
                        Err(_) => return format!("no answer to a ping within {patience:?}"),
                    }
                }
            };
            tokio::select! {
                ended = &mut connection => if let Err(e) = ended {
                    debug!(port, error = %e, "driver connection ended");
                },
                why = hung => warn!(port, why, "Ray client server not answering; dropping its driver connection"),
            }
        });
        Ok(sender)
    }
}

/// Queues one request frame on `stream` (h2 holds data beyond the stream's
/// window until the server grants it).
fn send_frame(
    stream: &mut SendStream<Bytes>,
    frame: Frame<Bytes>,
    end: bool,
) -> Result<(), h2::Error> {
    match frame.into_data() {
        Ok(data) => stream.send_data(data, end),
        Err(frame) => match frame.into_trailers() {
            Ok(trailers) => stream.send_trailers(trailers),
            Err(_) => Ok(()),
        },
    }
}

/// Sends the rest of a request body, each frame once the server's window
/// has room for it, so that a large body is never held here whole.
async fn pump(mut body: Body, stream: &mut SendStream<Bytes>) -> Result<(), DriverError> {
    let mut ended = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| DriverError::Request(e.to_string()))?;
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    stream.send_trailers(trailers)?;
                    return Ok(());
                }
                continue;
            }
        };
        let end = body.is_end_stream();
        ended = end;
        if data.is_empty() {
            stream.send_data(data, end)?;
            continue;
        }
        while data.has_remaining() {
            stream.reserve_capacity(data.len());
            let granted = match std::future::poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(granted) => granted?,
                None => return Err(DriverError::Request("the server closed the stream".into())),
            };
            if granted == 0 {
                continue;
            }
            let chunk = data.split_to(granted.min(data.len()));
            stream.send_data(chunk, end && data.is_empty())?;
        }
    }
    if !ended {
        stream.send_data(Bytes::new(), true)?;
    }
    Ok(())
}

/// The body of a server's answer: its DATA frames as they come (each one's
/// window given back to the server once it is handed on), then its
/// trailers.
#[derive(Debug)]
pub struct AnswerBody {
    inner: RecvStream,
    data_done: bool,
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        if !self.data_done {
            match std::task::ready!(self.inner.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.inner.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => self.data_done = true,
            }
        }
        match std::task::ready!(self.inner.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
