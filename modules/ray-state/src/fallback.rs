//! Ray's own module behind this one: a request this module does not answer
//! itself goes, as it came, to the module's Unix socket, and its answer
//! back, streamed.

use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// Sends `request` to the module listening on `socket`; its answer, or 502
/// with the reason when it cannot be had.
pub async fn forward(socket: &Path, request: Request<Body>) -> Response {
    match send(socket, request).await {
        Ok(response) => response.map(Body::new),
        Err(why) => (
            StatusCode::BAD_GATEWAY,
            format!("Ray's module at {} did not answer: {why}", socket.display()),
        )
            .into_response(),
    }
}

async fn send(
    socket: &Path,
    request: Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = UnixStream::connect(socket).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "connection to Ray's module ended");
        }
    });
    Ok(sender.send_request(request).await?)
}
