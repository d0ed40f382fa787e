//! The connections to one incarnation of a module: HTTP/1.1 over its Unix
//! socket, each reused once the response on it has ended.
//!
//! A pool serves exactly one socket and one incarnation, so it needs no
//! keys, no hashing and no expiry of its own: idle connections sit in a
//! stack, a connection the module closed is noticed at checkout, and the
//! whole pool goes when the incarnation does. (hyper-util's general client
//! hashes a pool key and hops through a dispatch future on every request;
//! measured on the proxy path, this is cheaper.)
//!
//! A connection has no task of its own. Its hyper connection future is
//! polled by whoever is using it: the request waiting for its response
//! head, then the response body as the client's connection pulls it. So a
//! request and its answer cross no task boundary: the task that reads the
//! client's request writes it to the module, and the same task, woken by
//! the module's socket, reads the answer and writes it to the client. (With
//! a task per module connection every exchange took two more trips through
//! the runtime's queue, which under load is what widened the latency tail.)
//! An idle connection is polled by nobody (the health check's tick prunes
//! the ones the module closed meanwhile). A request with a body gets a
//! task for its connection at once: the upload must go on while the client
//! is slow to read the answer, which would otherwise stall it (a module
//! that streams while it reads, and a client that sends all before it
//! reads, would wait on each other). A 101's upgrade, and an upload the
//! module answered before reading, get a task too.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tracing::debug;

use super::module_stream::ModuleStream;

/// Most idle connections kept; more are closed when their response ends.
const MAX_IDLE: usize = 256;

/// Why a request could not be sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    /// The socket refused or is missing.
    #[error("cannot connect to {socket}: {source}")]
    Connect {
        /// The module's socket.
        socket: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// A cloneable handle to the pool of one incarnation.
#[derive(Debug, Clone)]
pub struct ModulePool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    idle: Mutex<Vec<Conn>>,
}

impl Inner {
    /// The idle connections (a panic elsewhere while they were held leaves
    /// them as they are: each is checked before use).
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// hyper's future that reads and writes one module connection.
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// Who runs a connection.
enum Runner {
    /// Its current user polls it.
    Inline(Driver),
    /// A task of its own does.
    Task,
    /// Nobody: it has ended (the module closed it, or it failed).
    Ended,
}

/// One connection: the handle that sends on it and what runs it.
struct Conn {
    sender: SendRequest<Body>,
    runner: Runner,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runner = match self.runner {
            Runner::Inline(_) => "inline",
            Runner::Task => "task",
            Runner::Ended => "ended",
        };
        f.debug_struct("Conn")
            .field("runner", &runner)
            .finish_non_exhaustive()
    }
}

fn spawn_driver(driver: Driver) {
    tokio::spawn(async move { log_end(driver.await) });
}

/// Notes how a connection ended, whoever ran it.
fn log_end(ended: hyper::Result<()>) {
    if let Err(e) = ended {
        debug!(error = %e, "module connection ended with an error");
    }
}

impl Conn {
    /// Lets an inline connection read and write what it can. Once it has
    /// ended it is never polled again.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Runner::Inline(driver) = &mut self.runner {
            if let Poll::Ready(ended) = driver.as_mut().poll(cx) {
                log_end(ended);
                self.runner = Runner::Ended;
            }
        }
    }

    /// Whether a new request can go on the connection now.
    fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx);
        !matches!(self.runner, Runner::Ended)
            && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }

    /// Gives the connection a task of its own; it stays usable.
    fn detach(&mut self) {
        if let Runner::Inline(driver) = std::mem::replace(&mut self.runner, Runner::Task) {
            spawn_driver(driver);
        }
    }

    /// Lets the connection finish what it still has to do (an upgrade, an
    /// upload) without its user, then close: without its sender, hyper
    /// closes it once idle.
    fn run_alone(mut self) {
        self.detach();
    }
}

impl ModulePool {
    /// A pool of connections to `socket`; none is opened yet.
    pub fn new(socket: PathBuf) -> ModulePool {
        ModulePool {
            inner: Arc::new(Inner {
                socket,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Sends `request` (origin-form URI) on an idle connection, or a new one.
    /// A request that an idle connection could not take because the module
    /// had closed it is sent again on another; nothing is sent twice.
    pub(crate) async fn send(
        &self,
        mut request: Request<Body>,
    ) -> Result<Response<PooledBody>, PoolError> {
        loop {
            let (mut conn, reused) = match self.checkout().await {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            if !request.body().is_end_stream() {
                // An upload: it must not depend on the answer being read.
                conn.detach();
            }
            let mut answer = std::pin::pin!(conn.sender.try_send_request(request));
            let answered = std::future::poll_fn(|cx| {
                // The connection first, so that the request is written (and
                // the answer read) in this same poll.
                conn.drive(cx);
                answer.as_mut().poll(cx)
            })
            .await;
            match answered {
                Ok(response) => return Ok(self.attach(response, conn)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(PoolError::Http(e.into_error())),
                },
            }
        }
    }

    /// An idle connection that is ready now. One the module closed while it
    /// sat here is seen ending when it is polled now, and is let go.
    async fn checkout(&self) -> Option<Conn> {
        loop {
            let mut conn = self.inner.idle().pop()?;
            if std::future::poll_fn(|cx| Poll::Ready(conn.ready(cx))).await {
                return Some(conn);
            }
            debug!("pooled connection closed or busy; not reused");
        }
    }

    /// Lets go of the idle connections that the module closed (or that
    /// failed) since they were used. Nothing polls an idle connection, so
    /// without this one closed by the module would hold its socket until it
    /// was next checked out. Called on every health check.
    pub(crate) fn prune_idle(&self) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        self.inner.idle().retain_mut(|conn| conn.ready(&mut cx));
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.inner.idle().len()
    }

    async fn connect(&self) -> Result<Conn, PoolError> {
        let stream = ModuleStream::connect(&self.inner.socket)
            .await
            .map_err(|source| PoolError::Connect {
                socket: self.inner.socket.display().to_string(),
                source,
            })?;
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        Ok(Conn {
            sender,
            runner: Runner::Inline(Box::pin(connection.with_upgrades())),
        })
    }

    /// Ties `conn` to `response`'s body: it returns to the pool when the
    /// body ends, and is closed if the body is dropped before.
    fn attach(&self, response: Response<Incoming>, conn: Conn) -> Response<PooledBody> {
        let conn = if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The connection now belongs to the upgrade, which hyper
            // completes in the connection future: it runs on its own.
            conn.run_alone();
            None
        } else {
            Some(conn)
        };
        let pool = Arc::downgrade(&self.inner);
        let mut response = response.map(|inner| PooledBody { inner, conn, pool });
        if response.body().inner.is_end_stream() {
            // Nothing more to read: the connection can go back now, once
            // it has seen its exchange through.
            let waker = std::task::Waker::noop();
            response.body_mut().release(&mut Context::from_waker(waker));
        }
        response
    }
}

fn release(inner: &Inner, conn: Conn) {
    let mut idle = inner.idle();
    if idle.len() < MAX_IDLE {
        idle.push(conn);
    }
}

/// A module's response body. Polling it runs its connection; the
/// connection goes back to the pool when the body ends.
#[derive(Debug)]
pub(crate) struct PooledBody {
    inner: Incoming,
    conn: Option<Conn>,
    pool: Weak<Inner>,
}

impl PooledBody {
    /// The body has ended: the connection goes back to the pool if it can
    /// take a new request now. One still sending its request (the module
    /// answered before reading it all) finishes that on its own and closes.
    fn release(&mut self, cx: &mut Context<'_>) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if conn.ready(cx) {
            if let Some(pool) = self.pool.upgrade() {
                release(&pool, conn);
            }
        } else {
            conn.run_alone();
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(conn) = self.conn.as_mut() {
            conn.drive(cx);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(cx),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release(cx),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::UnixListener;

    /// Serves `ok` on a Unix socket (with `no_content`, a 204 without a
    /// body); counts accepted connections. With `close_after_each`, the
    /// server closes every connection after one response (as a module with
    /// keep-alive off, or an idle timeout, would).
    async fn server(
        path: &std::path::Path,
        close_after_each: bool,
        no_content: bool,
    ) -> Arc<AtomicUsize> {
        let listener = UnixListener::bind(path).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.expect("accept");
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req| async move {
                        let mut response = Response::new(http_body_util::Full::new(
                            Bytes::from_static(if no_content { b"" } else { b"ok" }),
                        ));
                        if no_content {
                            *response.status_mut() = StatusCode::NO_CONTENT;
                        }
                        Ok::<_, std::convert::Infallible>(response)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(!close_after_each)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        accepted
    }

    async fn get(pool: &ModulePool) -> String {
        use http_body_util::BodyExt;
        let request = Request::get("/")
            .header("host", "x")
            .body(Body::empty())
            .expect("request");
        let response = pool.send(request).await.expect("send");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        String::from_utf8(body.to_vec()).expect("utf8")
    }

    #[tokio::test]
    async fn reuses_a_connection_once_its_response_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, false).await;
        let pool = ModulePool::new(path);
        for _ in 0..5 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn connection_closed_by_the_module_is_replaced_without_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, true, false).await;
        let pool = ModulePool::new(path);
        for _ in 0..3 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn reuses_a_connection_whose_response_had_no_body() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let accepted = server(&path, false, true).await;
        let pool = ModulePool::new(path);
        for _ in 0..5 {
            assert_eq!(get(&pool).await, "");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// Reads one request head from `stream` (the tests' requests carry no
    /// body unless they say so in `content-length`); returns that length.
    async fn read_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> usize {
        use tokio::io::AsyncReadExt;
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.expect("head");
            head.push(byte[0]);
        }
        String::from_utf8_lossy(&head)
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn an_idle_connection_the_module_closed_is_let_go() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        // Answers with keep-alive, then closes the idle connection, as a
        // module's keep-alive timeout does.
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            read_head(&mut stream).await;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await
                .expect("answer");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        });
        let pool = ModulePool::new(path);
        assert_eq!(get(&pool).await, "ok");
        assert_eq!(pool.idle_count(), 1);
        let let_go = async {
            while pool.idle_count() > 0 {
                pool.prune_idle();
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), let_go)
            .await
            .expect("the closed connection is still held");
    }

    /// A module that answers at once and streams while it reads a large
    /// upload: the upload must reach it while nobody reads the answer yet
    /// (a client that sends everything before it reads).
    #[tokio::test]
    async fn an_upload_goes_on_while_the_answer_is_not_read() {
        use http_body_util::BodyExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const UPLOAD: usize = 4 << 20;
        const ANSWER: usize = 4 << 20;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        let (uploaded_tx, uploaded) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let length = read_head(&mut stream).await;
            let (mut reader, mut writer) = stream.into_split();
            tokio::spawn(async move {
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).await.expect("upload");
                let _ = uploaded_tx.send(body.len());
            });
            writer
                .write_all(
                    format!("HTTP/1.1 200 OK\r\ncontent-length: {ANSWER}\r\n\r\n").as_bytes(),
                )
                .await
                .expect("head");
            writer.write_all(&vec![b'x'; ANSWER]).await.expect("answer");
        });
        let pool = ModulePool::new(path);
        let request = Request::post("/")
            .header("host", "x")
            .body(Body::from(vec![b'u'; UPLOAD]))
            .expect("request");
        let response = pool.send(request).await.expect("send");
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), uploaded)
            .await
            .expect("the upload stalled while the answer was not read")
            .expect("server gone");
        assert_eq!(got, UPLOAD);
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes().len(), ANSWER);
    }

    #[tokio::test]
    async fn missing_socket_is_a_connect_error_naming_it() {
        let pool = ModulePool::new(PathBuf::from("/nonexistent/dash_x"));
        let request = Request::get("/").body(Body::empty()).expect("request");
        let error = pool.send(request).await.expect_err("no socket");
        assert!(error.to_string().contains("/nonexistent/dash_x"), "{error}");
    }
}
