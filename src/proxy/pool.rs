//! The connections to one incarnation of a module: HTTP/1.1 over its Unix
//! socket, each reused once the response on it has ended.
//!
//! A pool serves exactly one socket and one incarnation, so it needs no
//! keys, no hashing and no expiry of its own: idle connections sit in a
//! stack, a connection the module closed is noticed at checkout, and the
//! whole pool goes when the incarnation does. (hyper-util's general client
//! hashes a pool key and hops through a dispatch future on every request;
//! measured on the proxy path, this is cheaper.)

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
    idle: Mutex<Vec<SendRequest<Body>>>,
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
            let (mut sender, reused) = match self.checkout().await {
                Some(sender) => (sender, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.attach(response, sender)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(PoolError::Http(e.into_error())),
                },
            }
        }
    }

    /// An idle connection that is ready now. A connection goes back to the
    /// pool when its response has ended, which can be before its request
    /// has: a module may answer before it has read an upload. Such a
    /// connection, like one the module closed, is not ready, and it is let
    /// go rather than waited on, so that no request waits for another's
    /// upload.
    async fn checkout(&self) -> Option<SendRequest<Body>> {
        loop {
            let mut sender = self
                .inner
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()?;
            let ready = std::future::poll_fn(|cx| Poll::Ready(sender.poll_ready(cx))).await;
            match ready {
                Poll::Ready(Ok(())) => return Some(sender),
                Poll::Ready(Err(_)) => {}
                Poll::Pending => debug!("pooled connection still busy; not reused"),
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, PoolError> {
        let stream = ModuleStream::connect(&self.inner.socket)
            .await
            .map_err(|source| PoolError::Connect {
                socket: self.inner.socket.display().to_string(),
                source,
            })?;
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                debug!(error = %e, "module connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Ties `sender` to `response`'s body: it returns to the pool when the
    /// body ends, and is closed if the body is dropped before.
    fn attach(
        &self,
        response: Response<Incoming>,
        sender: SendRequest<Body>,
    ) -> Response<PooledBody> {
        // After a 101 the connection belongs to the upgrade.
        let keep = response.status() != StatusCode::SWITCHING_PROTOCOLS;
        let mut sender = keep.then_some(sender);
        if response.body().is_end_stream() {
            if let Some(sender) = sender.take() {
                release(&self.inner, sender);
            }
        }
        let pool = Arc::downgrade(&self.inner);
        response.map(|inner| PooledBody {
            inner,
            sender,
            pool,
        })
    }
}

fn release(inner: &Inner, sender: SendRequest<Body>) {
    let mut idle = inner.idle.lock().unwrap_or_else(|e| e.into_inner());
    if idle.len() < MAX_IDLE {
        idle.push(sender);
    }
}

/// A module's response body that gives its connection back when it ends.
#[derive(Debug)]
pub(crate) struct PooledBody {
    inner: Incoming,
    sender: Option<SendRequest<Body>>,
    pool: Weak<Inner>,
}

impl PooledBody {
    fn release(&mut self) {
        if let (Some(sender), Some(pool)) = (self.sender.take(), self.pool.upgrade()) {
            release(&pool, sender);
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
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.release(),
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

    /// Serves `ok` on a Unix socket; counts accepted connections. With
    /// `close_after_each`, the server closes every connection after one
    /// response (as a module with keep-alive off, or an idle timeout, would).
    async fn server(path: &std::path::Path, close_after_each: bool) -> Arc<AtomicUsize> {
        let listener = UnixListener::bind(path).expect("bind");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.expect("accept");
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok"),
                        )))
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
        let accepted = server(&path, false).await;
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
        let accepted = server(&path, true).await;
        let pool = ModulePool::new(path);
        for _ in 0..3 {
            assert_eq!(get(&pool).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn missing_socket_is_a_connect_error_naming_it() {
        let pool = ModulePool::new(PathBuf::from("/nonexistent/dash_x"));
        let request = Request::get("/").body(Body::empty()).expect("request");
        let error = pool.send(request).await.expect_err("no socket");
        assert!(error.to_string().contains("/nonexistent/dash_x"), "{error}");
    }
}
