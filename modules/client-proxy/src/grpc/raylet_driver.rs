//! `RayletDriver` calls: answered here when Ray's proxier would, sent to
//! the GCS before the client has a server, otherwise forwarded to the
//! client's server at the HTTP/2 level, body and trailers untouched.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use ray_proto::rpc::cluster_info_response::ResponseType;
use ray_proto::rpc::cluster_info_type::TypeEnum as ClusterInfoType;
use ray_proto::rpc::{ClusterInfoRequest, ClusterInfoResponse};
use tonic::body::Body;
use tonic::Status;
use tracing::warn;

use super::framing::{buffered, decode, reply, single_message, trailers, unary_reply};
use super::kv::gcs_call;
use super::{client_id, known_client};
use crate::proxy::Proxy;
use crate::servers::SpecificServer;

/// A `RayletDriver` call: answered here when Ray's proxier would, otherwise
/// forwarded untouched to the client's server. Only the calls the proxy may
/// answer have their (small, unary) request read first.
pub(super) async fn driver_call(
    proxy: Arc<Proxy>,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status> {
    let (parts, body) = request.into_parts();
    let method = parts.uri.path().rsplit('/').next().unwrap_or_default();
    let body = match method {
        "ClusterInfo" => {
            let frame = buffered(body).await?;
            let asked: ClusterInfoRequest = decode(&single_message(&frame)?)?;
            if asked.r#type == ClusterInfoType::Ping as i32 {
                return Ok(unary_reply(reply(ClusterInfoResponse {
                    r#type: asked.r#type,
                    response_type: Some(ResponseType::Json("{}".into())),
                })));
            }
            Body::new(http_body_util::Full::new(frame))
        }
        "PrepRuntimeEnv" => return Err(Status::unimplemented("PrepRuntimeEnv is not implemented")),
        "KVGet" | "KVPut" | "KVDel" | "KVList" | "KVExists" | "PinRuntimeEnvURI" => {
            let id = client_id(&parts.headers)?;
            let has_server = proxy.client(&id).and_then(|c| c.ready_server()).is_some();
            if !has_server {
                let frame = buffered(body).await?;
                let answer = gcs_call(&proxy, method, &single_message(&frame)?).await;
                return Ok(unary_reply(answer));
            }
            body
        }
        _ => body,
    };
    let client = known_client(&proxy, &parts.headers)?;
    let server = client
        .server(proxy.settings.server_wait)
        .await
        .map_err(|why| Status::not_found(why.to_string()))?;
    forward(&server, parts, body).await
}

/// Sends a call to `server` as it came: same method, path, metadata and
/// body (already gRPC-framed), and returns the server's response as it
/// comes, its data frames the same `Bytes`.
async fn forward(
    server: &SpecificServer,
    parts: http::request::Parts,
    body: Body,
) -> Result<http::Response<Body>, Status> {
    let mut uri = server.origin.clone().into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    let mut request = http::Request::new(body);
    *request.method_mut() = parts.method;
    *request.uri_mut() =
        http::Uri::from_parts(uri).expect("UNWRAP: an http origin with a path is a valid URI");
    *request.version_mut() = http::Version::HTTP_2;
    *request.headers_mut() = onward_headers(parts.headers);
    let response = server.driver.call(request).await.map_err(|e| {
        Status::unavailable(format!(
            "cannot reach the Ray client server on port {}: {}",
            server.port,
            causes(&e)
        ))
    })?;
    let (mut parts, body) = response.into_parts();
    // The extensions are this hop's (hyper's connection details).
    parts.extensions.clear();
    let body = Passthrough {
        inner: body,
        port: server.port,
        broken: false,
    };
    Ok(http::Response::from_parts(parts, Body::new(body)))
}

/// The metadata of a call as it goes on to the server: all of it but the
/// hop-by-hop fields (RFC 9110 §7.6.1; RFC 9113 §8.2.2 bars them from
/// HTTP/2 anyway) and `host`, which would name this proxy rather than the
/// server (the server's authority comes from its origin). `te: trailers`
/// stays: gRPC requires it.
fn onward_headers(mut headers: http::HeaderMap) -> http::HeaderMap {
    if let Some(connection) = headers.remove(http::header::CONNECTION) {
        if let Ok(options) = connection.to_str() {
            for name in options.split(',') {
                headers.remove(name.trim());
            }
        }
    }
    for name in [
        http::header::HOST,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::HeaderName::from_static("keep-alive"),
        http::HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if headers
        .get(http::header::TE)
        .is_some_and(|te| te != "trailers")
    {
        headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    }
    headers
}

/// An error with its causes, `outer: inner: ...`.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A server's answer passed through frame by frame. If the server breaks
/// off (it died, or its connection did), the answer ends with an
/// UNAVAILABLE status naming the server rather than a bare stream reset, as
/// a client would see of any broken gRPC call.
struct Passthrough<B> {
    inner: B,
    /// The server's port, for the status.
    port: u16,
    /// Whether the status for a break has been sent: the answer is over.
    broken: bool,
}

impl<B> http_body::Body for Passthrough<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error,
{
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        if self.broken {
            return Poll::Ready(None);
        }
        match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(frame)) => Poll::Ready(Some(Ok(frame))),
            None => Poll::Ready(None),
            Some(Err(e)) => {
                self.broken = true;
                let port = self.port;
                let cause = causes(&e);
                warn!(port, error = %cause, "Ray client server broke off an answer");
                let status = Status::unavailable(format!(
                    "the Ray client server on port {port} broke off the answer: {cause}"
                ));
                Poll::Ready(Some(Ok(trailers(&status))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.broken || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.broken {
            http_body::SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::BodyExt;

    /// The metadata goes on but for the hop-by-hop fields and `host`.
    #[test]
    fn onward_headers_keep_metadata_and_drop_hop_by_hop_fields() {
        let mut headers = http::HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "5S"),
            ("client_id", "c1"),
            ("x-bin-bin", "AAEC"),
            ("authorization", "Bearer t"),
            ("host", "proxy:10001"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("upgrade", "h2c"),
        ] {
            headers.insert(
                http::HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            );
        }
        let onward = onward_headers(headers);
        let mut names: Vec<&str> = onward.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "authorization",
                "client_id",
                "content-type",
                "grpc-timeout",
                "te",
                "x-bin-bin"
            ]
        );
        assert_eq!(onward["te"], "trailers");
        assert_eq!(onward["client_id"], "c1");
    }

    /// The server's frames pass as the same `Bytes`; a break in its answer
    /// ends the answer with UNAVAILABLE naming the server's port.
    #[tokio::test]
    async fn passthrough_hands_frames_on_and_turns_a_break_into_unavailable() {
        let chunk = Bytes::from(vec![7u8; 1 << 20]);
        let frames = stream::iter([
            Ok(http_body::Frame::data(chunk.clone())),
            Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset",
            )),
            Ok(http_body::Frame::data(Bytes::from_static(b"never"))),
        ]);
        let mut body = Passthrough {
            inner: http_body_util::StreamBody::new(frames),
            port: 23001,
            broken: false,
        };
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.as_ptr(), chunk.as_ptr(), "the chunk was copied");
        let last = body.frame().await.unwrap().unwrap();
        let trailers = last.into_trailers().unwrap();
        assert_eq!(trailers["grpc-status"], "14");
        let message = trailers["grpc-message"].to_str().unwrap();
        assert!(message.contains("23001"), "{message}");
        assert!(http_body::Body::is_end_stream(&body));
        assert!(body.frame().await.is_none());
    }
}
