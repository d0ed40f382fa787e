//! gRPC's framing of messages: a unary request's one message read whole,
//! a streamed answer framed without copying its payloads, trailers with
//! the status.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream::{self, StreamExt};
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;
use tonic::{Request, Response, Status, Streaming};

use super::Messages;
use crate::codec::{RawCodec, MAX_MESSAGE_BYTES};

/// The gRPC message prefix: a compressed flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

/// The whole request body of a unary call, at most one message of
/// [`MAX_MESSAGE_BYTES`] with its prefix. Trailers, which a request does not
/// carry in gRPC, are dropped.
pub(super) async fn buffered(mut body: Body) -> Result<Bytes, Status> {
    let limit = MAX_MESSAGE_BYTES + PREFIX_BYTES;
    let mut chunks: Vec<Bytes> = Vec::with_capacity(1);
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        total += data.len();
        if total > limit {
            return Err(Status::resource_exhausted(format!(
                "request message over {MAX_MESSAGE_BYTES} bytes"
            )));
        }
        chunks.push(data);
    }
    Ok(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => {
            let mut whole = BytesMut::with_capacity(total);
            for chunk in chunks {
                whole.put(chunk);
            }
            whole.freeze()
        }
    })
}

/// The message of a unary request body: a gRPC length-prefixed message
/// (flag byte, 4-byte big-endian length), alone.
pub(super) fn single_message(body: &Bytes) -> Result<Bytes, Status> {
    let Some((prefix, payload)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return Err(Status::internal("the call has no request message"));
    };
    let [compressed, len @ ..] = *prefix;
    if compressed != 0 {
        return Err(Status::unimplemented(
            "compressed request messages are not supported",
        ));
    }
    if u32::from_be_bytes(len) as usize != payload.len() {
        return Err(Status::internal(
            "the request body of a unary call is not one whole message",
        ));
    }
    Ok(body.slice(PREFIX_BYTES..))
}

/// A unary answer made here: the message, then an OK status.
pub(super) fn unary_reply(answer: Result<Bytes, Status>) -> http::Response<Body> {
    framed(
        answer.map(|message| Response::new(stream::once(std::future::ready(Ok(message))).boxed())),
    )
}

/// The messages of an incoming streaming call, as tonic decodes them.
pub(super) fn incoming(request: http::Request<Body>) -> Request<Streaming<Bytes>> {
    let (parts, body) = request.into_parts();
    let messages = Streaming::new_request(RawCodec, body, None, Some(MAX_MESSAGE_BYTES));
    Request::from_http(http::Request::from_parts(parts, messages))
}

/// A streamed answer as an HTTP response. The messages are framed here
/// rather than by tonic's encoder so that each payload goes to h2 as the
/// same `Bytes` it arrived in, without a copy.
pub(super) fn framed(result: Result<Response<Messages>, Status>) -> http::Response<Body> {
    let response = match result {
        Ok(response) => response,
        Err(status) => return status.into_http(),
    };
    let (metadata, messages, _) = response.into_parts();
    let mut http = http::Response::new(Body::new(Framed {
        messages,
        payload: None,
        done: false,
    }));
    *http.headers_mut() = metadata.into_headers();
    http.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    http
}

/// gRPC framing of a message stream: a 5-byte prefix, the payload as is,
/// then trailers with the status.
struct Framed {
    messages: Messages,
    payload: Option<Bytes>,
    done: bool,
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(payload) = self.payload.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(payload))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let next = std::task::ready!(self.messages.poll_next_unpin(cx));
        let status = match next {
            Some(Ok(message)) => {
                let Ok(len) = u32::try_from(message.len()) else {
                    self.done = true;
                    return Poll::Ready(Some(Ok(trailers(&Status::resource_exhausted(
                        "message over 4 GiB",
                    )))));
                };
                let mut prefix = BytesMut::with_capacity(PREFIX_BYTES);
                prefix.put_u8(0);
                prefix.put_u32(len);
                if !message.is_empty() {
                    self.payload = Some(message);
                }
                return Poll::Ready(Some(Ok(http_body::Frame::data(prefix.freeze()))));
            }
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.done = true;
        Poll::Ready(Some(Ok(trailers(&status))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.payload.is_none()
    }
}

pub(super) fn trailers(status: &Status) -> http_body::Frame<Bytes> {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    http_body::Frame::trailers(map)
}

pub(super) fn decode<M: Message + Default>(bytes: &Bytes) -> Result<M, Status> {
    M::decode(bytes.as_ref())
        .map_err(|e| Status::invalid_argument(format!("bad request message: {e}")))
}

pub(super) fn reply<M: Message>(message: M) -> Result<Bytes, Status> {
    Ok(message.encode_to_vec().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed_message(flag: u8, declared: u32, payload: &[u8]) -> Bytes {
        let mut body = BytesMut::new();
        body.put_u8(flag);
        body.put_u32(declared);
        body.put_slice(payload);
        body.freeze()
    }

    /// The one message of a unary body comes out without a copy; anything
    /// but exactly one uncompressed message is refused.
    #[test]
    fn single_message_takes_exactly_one_uncompressed_message() {
        let body = framed_message(0, 3, b"abc");
        let message = single_message(&body).unwrap();
        assert_eq!(message, &b"abc"[..]);
        assert_eq!(message.as_ptr(), body[PREFIX_BYTES..].as_ptr());
        assert_eq!(single_message(&framed_message(0, 0, b"")).unwrap(), "");

        let refused = |body: Bytes| single_message(&body).unwrap_err().code();
        assert_eq!(refused(Bytes::from_static(b"\0\0")), tonic::Code::Internal);
        assert_eq!(
            refused(framed_message(1, 3, b"abc")),
            tonic::Code::Unimplemented
        );
        assert_eq!(refused(framed_message(0, 4, b"abc")), tonic::Code::Internal);
        assert_eq!(refused(framed_message(0, 2, b"abc")), tonic::Code::Internal);
    }

    /// A body that arrives in several frames is put together; one over the
    /// limit would be refused by the same count.
    #[tokio::test]
    async fn buffered_joins_the_frames_of_a_body() {
        let frames = stream::iter(
            [&b"\0\0\0"[..], b"\0\x02", b"hi"]
                .map(|chunk| Ok::<_, Status>(http_body::Frame::data(Bytes::from_static(chunk)))),
        );
        let body = Body::new(http_body_util::StreamBody::new(frames));
        let whole = buffered(body).await.unwrap();
        assert_eq!(single_message(&whole).unwrap(), "hi");
    }
}
