//! A response body that ends with an error the moment its module's
//! incarnation fails, so that a stream from a hung module is cut at once,
//! and that counts its bytes for the module's metrics.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::metrics::OpenGuard;

/// The body error seen by the client's connection when the module failed.
#[derive(Debug, thiserror::Error)]
#[error("module {0} failed while answering")]
pub(crate) struct ModuleFailed(pub(crate) String);

/// A body from a module, cut when `cancelled` fires.
pub(crate) struct CancelableBody<B> {
    inner: B,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    module: Arc<str>,
    /// Counts the data bytes passed on.
    bytes: Option<Counter>,
    /// Counts a stream open while the body lives.
    _open: Option<OpenGuard>,
}

impl<B> std::fmt::Debug for CancelableBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelableBody")
            .field("module", &self.module)
            .finish()
    }
}

impl<B> CancelableBody<B> {
    pub(crate) fn new(inner: B, cancel: &CancellationToken, module: &Arc<str>) -> Self {
        CancelableBody {
            inner,
            cancelled: Box::pin(cancel.clone().cancelled_owned()),
            module: Arc::clone(module),
            bytes: None,
            _open: None,
        }
    }

    /// Counts the body's data bytes into `bytes`, and holds `open` until
    /// the body is dropped.
    pub(crate) fn counted(mut self, bytes: Counter, open: Option<OpenGuard>) -> Self {
        self.bytes = Some(bytes);
        self._open = open;
        self
    }
}

impl<B> Body for CancelableBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(ModuleFailed(self.module.to_string()).into())));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(bytes)) = (&polled, &self.bytes) {
            if let Some(data) = frame.data_ref() {
                bytes.inc_by(data.len() as u64);
            }
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
