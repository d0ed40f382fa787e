//! Targets (a Unix socket or a loopback TCP port), connecting to them, and
//! HTTP/1.1 client connections (hyper's low-level `conn` API) over them.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context as _;
use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// A byte stream to a target, whichever kind it is.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// A boxed [`Io`].
pub(crate) type BoxIo = Box<dyn Io>;

/// Where load goes.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// A Unix socket (a backend module's own socket).
    Unix(PathBuf),
    /// A TCP address on the loopback interface (ray-dashd, nginx).
    Tcp(SocketAddr),
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            let addr: SocketAddr = addr
                .parse()
                .map_err(|e| format!("{addr:?} is not IP:PORT: {e}"))?;
            if !addr.ip().is_loopback() {
                return Err(format!("{addr} is not a loopback address"));
            }
            return Ok(Target::Tcp(addr));
        }
        Err(format!(
            "{s:?}: expected unix:/path/to.sock or tcp:127.0.0.1:PORT"
        ))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
            Target::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl Target {
    /// Opens a new byte stream to the target (TCP with Nagle off).
    pub(crate) async fn connect(&self) -> anyhow::Result<BoxIo> {
        Ok(match self {
            Target::Unix(path) => Box::new(
                UnixStream::connect(path)
                    .await
                    .with_context(|| format!("connect {}", path.display()))?,
            ),
            Target::Tcp(addr) => {
                let stream = TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("connect {addr}"))?;
                stream.set_nodelay(true).context("TCP_NODELAY")?;
                Box::new(stream)
            }
        })
    }

    /// The `Host` header (and websocket URL authority) for this target.
    pub(crate) fn authority(&self) -> String {
        match self {
            Target::Unix(_) => "localhost".to_owned(),
            Target::Tcp(addr) => addr.to_string(),
        }
    }
}

/// The request half of one HTTP/1.1 keep-alive connection.
pub(crate) type Sender = http1::SendRequest<Empty<Bytes>>;

/// Opens a connection and drives it in a task of its own.
pub(crate) async fn open(target: &Target) -> anyhow::Result<Sender> {
    let io = target.connect().await?;
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .context("HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        // The connection ends with the run, or with an error that the
        // sender's next request reports.
        let _ = connection.await;
    });
    Ok(sender)
}

/// What the load tool calls itself in `User-Agent` (Ray 2.45's dashboard
/// answers 500 to a request without one).
pub(crate) const USER_AGENT: &str = concat!("ray-dashd-bench/", env!("CARGO_PKG_VERSION"));

/// Whether a response's headers leave its connection open (no
/// `Connection: close`).
pub(crate) fn keeps_alive(headers: &http::HeaderMap) -> bool {
    !headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("close"))
}

/// A GET of `path` (with query) for `target`.
pub(crate) fn get(target: &Target, path: &str) -> anyhow::Result<Request<Empty<Bytes>>> {
    Request::get(path)
        .header(header::HOST, target.authority())
        .header(header::USER_AGENT, USER_AGENT)
        .body(Empty::new())
        .with_context(|| format!("bad request path {path:?}"))
}

/// What [`get_drained`] saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    pub(crate) status: StatusCode,
    /// Body bytes.
    pub(crate) bytes: u64,
    /// False when the server said `Connection: close`: the connection ends
    /// after this response (nginx does so after `keepalive_requests`).
    pub(crate) keep_alive: bool,
}

/// Sends a GET on `sender` and drains the body.
pub(crate) async fn get_drained(
    sender: &mut Sender,
    target: &Target,
    path: &str,
) -> anyhow::Result<Drained> {
    sender.ready().await.context("connection closed")?;
    let response = sender
        .send_request(get(target, path)?)
        .await
        .context("request failed")?;
    let status = response.status();
    let keep_alive = keeps_alive(response.headers());
    let mut body = response.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("response body failed")?;
        if let Some(data) = frame.data_ref() {
            bytes += data.len() as u64;
        }
    }
    Ok(Drained {
        status,
        bytes,
        keep_alive,
    })
}

/// How long [`get_once`] may take in all.
const GET_ONCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One GET on a fresh connection, within [`GET_ONCE_TIMEOUT`]: status and
/// body.
pub(crate) async fn get_once(target: &Target, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    tokio::time::timeout(GET_ONCE_TIMEOUT, get_once_unbounded(target, path))
        .await
        .map_err(|_| {
            anyhow::anyhow!("GET {path} on {target}: no answer within {GET_ONCE_TIMEOUT:?}")
        })?
}

async fn get_once_unbounded(target: &Target, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    let mut sender = open(target).await?;
    sender.ready().await.context("connection closed")?;
    let response = sender
        .send_request(get(target, path)?)
        .await
        .context("request failed")?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .context("response body failed")?
        .to_bytes();
    Ok((status, body))
}

/// A latency histogram in microseconds, 1 µs to 60 s, 3 significant digits.
pub(crate) fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)
        .expect("constant bounds 1..60e6 with 3 digits are valid")
}

/// Microseconds in `d`, at least 1 (the histogram's lowest value).
pub(crate) fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// How many connections [`accept_until_signal`] took, and how many
/// accepts failed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accepted {
    pub(crate) connections: u64,
    pub(crate) failed_accepts: u64,
}

/// Accepts connections on `listen` (a loopback address) until SIGTERM or
/// SIGINT, and hands each, with Nagle off, to `serve`; `name` says whose
/// failed accepts are logged. The relays' listening side.
pub(crate) async fn accept_until_signal(
    name: &str,
    listen: SocketAddr,
    mut serve: impl FnMut(TcpStream),
) -> anyhow::Result<Accepted> {
    use tokio::signal::unix::{signal, SignalKind};

    anyhow::ensure!(
        listen.ip().is_loopback(),
        "--listen must be a loopback address"
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut accepted = Accepted {
        connections: 0,
        failed_accepts: 0,
    };
    loop {
        let (client, _) = tokio::select! {
            next = listener.accept() => match next {
                Ok(next) => next,
                Err(e) => {
                    // Out of descriptors under load, say: not the relay's end.
                    eprintln!("{name}: accept failed: {e}");
                    accepted.failed_accepts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        accepted.connections += 1;
        if client.set_nodelay(true).is_ok() {
            serve(client);
        }
    }
    Ok(accepted)
}
