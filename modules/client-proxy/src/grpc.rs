//! The gRPC side: Ray's three client services, served on the client port.
//!
//! Every call is forwarded to the server of the client that names itself in
//! the `client_id` metadata. `RayletDriver` calls (`GetObject` included) go
//! through at the HTTP/2 level, body and trailers untouched, as
//! [`forward`] does. The exceptions are the ones Ray's own proxier makes:
//! `ClusterInfo(PING)` is answered here; KV calls and `PinRuntimeEnvURI`
//! made before the client has a server go to the GCS; `PrepRuntimeEnv` is
//! not implemented; and `Datapath` is watched for the `init` (which decides
//! the server) and rewritten in one place (`connection_info.num_clients` is
//! the proxy's count), so it and `Logstream` are forwarded message by
//! message.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::Stream;
use http::uri::PathAndQuery;
use http_body_util::BodyExt;
use prost::Message;
use ray_proto::rpc::cluster_info_response::ResponseType;
use ray_proto::rpc::cluster_info_type::TypeEnum as ClusterInfoType;
use ray_proto::rpc::{
    data_response, ClientPinRuntimeEnvUriRequest, ClientPinRuntimeEnvUriResponse,
    ClusterInfoRequest, ClusterInfoResponse, DataResponse, InitResponse, KvDelRequest,
    KvDelResponse, KvExistsRequest, KvExistsResponse, KvGetRequest, KvGetResponse, KvListRequest,
    KvListResponse, KvPutRequest, KvPutResponse,
};
use tonic::body::Body;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use crate::auth;
use crate::codec::{RawCodec, MAX_MESSAGE_BYTES};
use crate::proxy::{Client, ClientError, Proxy};
use crate::servers::{H2Client, SpecificServer};
use crate::wire;

type Messages = BoxStream<'static, Result<Bytes, Status>>;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

const DRIVER: &str = "ray.rpc.RayletDriver";
const DATA: &str = "ray.rpc.RayletDataStreamer";
const LOGS: &str = "ray.rpc.RayletLogStreamer";
const DATAPATH: &str = "/ray.rpc.RayletDataStreamer/Datapath";
const LOGSTREAM: &str = "/ray.rpc.RayletLogStreamer/Logstream";
/// The path prefix of `RayletDriver` calls.
const DRIVER_PREFIX: &str = "/ray.rpc.RayletDriver/";
/// The gRPC message prefix: a compressed flag and a 4-byte length.
const PREFIX_BYTES: usize = 5;

/// The metadata key a client names itself with.
const CLIENT_ID: &str = "client_id";
/// The metadata key a client sets when it resumes a dropped connection.
const RECONNECTING: &str = "reconnecting";

/// One of the three services; `NAME` tells which.
#[derive(Debug)]
pub struct Service<const KIND: u8> {
    proxy: Arc<Proxy>,
}

impl<const KIND: u8> Clone for Service<KIND> {
    fn clone(&self) -> Self {
        Service {
            proxy: self.proxy.clone(),
        }
    }
}

/// `ray.rpc.RayletDriver`.
pub type DriverService = Service<0>;
/// `ray.rpc.RayletDataStreamer`.
pub type DataService = Service<1>;
/// `ray.rpc.RayletLogStreamer`.
pub type LogService = Service<2>;

impl<const KIND: u8> Service<KIND> {
    /// The service, backed by `proxy`.
    pub fn new(proxy: Arc<Proxy>) -> Self {
        Service { proxy }
    }
}

impl NamedService for Service<0> {
    const NAME: &'static str = DRIVER;
}
impl NamedService for Service<1> {
    const NAME: &'static str = DATA;
}
impl NamedService for Service<2> {
    const NAME: &'static str = LOGS;
}

fn client_grpc(server: &SpecificServer) -> tonic::client::Grpc<H2Client> {
    tonic::client::Grpc::with_origin(server.client.clone(), server.origin.clone())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

impl<const KIND: u8> tower::Service<http::Request<Body>> for Service<KIND> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let proxy = self.proxy.clone();
        if let Some(token) = &proxy.settings.token {
            let presented = request
                .headers()
                .get(auth::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if !presented.is_some_and(|value| token.accepts(value)) {
                let refused = Status::unauthenticated(auth::UNAUTHENTICATED).into_http();
                return Box::pin(async move { Ok(refused) });
            }
        }
        Box::pin(async move {
            let response = match request.uri().path() {
                DATAPATH => framed(datapath(proxy, incoming(request)).await),
                LOGSTREAM => framed(logstream(proxy, incoming(request)).await),
                p if p.starts_with(DRIVER_PREFIX) => driver_call(proxy, request)
                    .await
                    .unwrap_or_else(Status::into_http),
                p => Status::unimplemented(format!("unknown method {p}")).into_http(),
            };
            Ok(response)
        })
    }
}

/// A `RayletDriver` call: answered here when Ray's proxier would, otherwise
/// forwarded untouched to the client's server. Only the calls the proxy may
/// answer have their (small, unary) request read first.
async fn driver_call(
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
        .map_err(Status::not_found)?;
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

/// The whole request body of a unary call, at most one message of
/// [`MAX_MESSAGE_BYTES`] with its prefix. Trailers, which a request does not
/// carry in gRPC, are dropped.
async fn buffered(mut body: Body) -> Result<Bytes, Status> {
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
fn single_message(body: &Bytes) -> Result<Bytes, Status> {
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
fn unary_reply(answer: Result<Bytes, Status>) -> http::Response<Body> {
    framed(
        answer.map(|message| Response::new(stream::once(std::future::ready(Ok(message))).boxed())),
    )
}

/// The messages of an incoming streaming call, as tonic decodes them.
fn incoming(request: http::Request<Body>) -> Request<Streaming<Bytes>> {
    let (parts, body) = request.into_parts();
    let messages = Streaming::new_request(RawCodec, body, None, Some(MAX_MESSAGE_BYTES));
    Request::from_http(http::Request::from_parts(parts, messages))
}

/// A streamed answer as an HTTP response. The messages are framed here
/// rather than by tonic's encoder so that each payload goes to h2 as the
/// same `Bytes` it arrived in, without a copy.
fn framed(result: Result<Response<Messages>, Status>) -> http::Response<Body> {
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

fn trailers(status: &Status) -> http_body::Frame<Bytes> {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    http_body::Frame::trailers(map)
}

/// The `client_id` in a call's metadata; FAILED_PRECONDITION without one.
fn client_id(headers: &http::HeaderMap) -> Result<String, Status> {
    match headers.get(CLIENT_ID).and_then(|v| v.to_str().ok()) {
        Some(id) if !id.is_empty() => Ok(id.to_owned()),
        _ => Err(Status::failed_precondition(
            "the call carries no client_id metadata",
        )),
    }
}

fn known_client(proxy: &Proxy, headers: &http::HeaderMap) -> Result<Arc<Client>, Status> {
    let id = client_id(headers)?;
    proxy
        .client(&id)
        .ok_or_else(|| Status::not_found(format!("no Ray client server for client {id}")))
}

fn path_of(path: &str) -> PathAndQuery {
    PathAndQuery::try_from(path).expect("UNWRAP: a path tonic routed is a valid path")
}

async fn ready(
    grpc: &mut tonic::client::Grpc<H2Client>,
    server: &SpecificServer,
) -> Result<(), Status> {
    grpc.ready().await.map_err(|e| {
        Status::unavailable(format!(
            "cannot reach the Ray client server on port {}: {e}",
            server.port
        ))
    })
}

fn decode<M: Message + Default>(bytes: &Bytes) -> Result<M, Status> {
    M::decode(bytes.as_ref())
        .map_err(|e| Status::invalid_argument(format!("bad request message: {e}")))
}

fn reply<M: Message>(message: M) -> Result<Bytes, Status> {
    Ok(message.encode_to_vec().into())
}

/// A KV call of a client that has no server yet, made on the GCS.
async fn gcs_call(proxy: &Proxy, method: &str, body: &Bytes) -> Result<Bytes, Status> {
    let gcs = proxy.gcs.as_ref().ok_or_else(|| {
        Status::unavailable(
            "the proxy knows no GCS to serve this call before the client's server exists",
        )
    })?;
    debug!(method, "served by the GCS before the client has a server");
    match method {
        "KVGet" => {
            let r: KvGetRequest = decode(body)?;
            let value = gcs.kv_get(r.namespace.unwrap_or_default(), r.key).await?;
            reply(KvGetResponse { value })
        }
        "KVPut" => {
            let r: KvPutRequest = decode(body)?;
            let already_exists = gcs
                .kv_put(r.namespace.unwrap_or_default(), r.key, r.value, r.overwrite)
                .await?;
            reply(KvPutResponse { already_exists })
        }
        "KVDel" => {
            let r: KvDelRequest = decode(body)?;
            let deleted_num = gcs
                .kv_del(r.namespace.unwrap_or_default(), r.key, r.del_by_prefix)
                .await?;
            reply(KvDelResponse { deleted_num })
        }
        "KVList" => {
            let r: KvListRequest = decode(body)?;
            let keys = gcs
                .kv_keys(r.namespace.unwrap_or_default(), r.prefix)
                .await?;
            reply(KvListResponse { keys })
        }
        "KVExists" => {
            let r: KvExistsRequest = decode(body)?;
            let exists = gcs
                .kv_exists(r.namespace.unwrap_or_default(), r.key)
                .await?;
            reply(KvExistsResponse { exists })
        }
        "PinRuntimeEnvURI" => {
            let r: ClientPinRuntimeEnvUriRequest = decode(body)?;
            gcs.pin_runtime_env_uri(r.uri, r.expiration_s).await?;
            reply(ClientPinRuntimeEnvUriResponse {})
        }
        _ => Err(Status::internal(format!("{method} is not a KV call"))),
    }
}

/// The client's messages that go on to its server: all of them, until the
/// client's stream ends or breaks (a break ends ours to the server too, so
/// that the server waits for a reconnect as it would for a direct client).
fn onward(inbound: Streaming<Bytes>) -> impl Stream<Item = Bytes> + Send + 'static {
    inbound
        .take_while(|message| {
            if let Err(status) = message {
                debug!(%status, "client stream broke");
            }
            std::future::ready(message.is_ok())
        })
        .filter_map(|message| std::future::ready(message.ok()))
}

async fn datapath(
    proxy: Arc<Proxy>,
    request: Request<Streaming<Bytes>>,
) -> Result<Response<Messages>, Status> {
    let id = client_id(request.metadata().as_ref())?;
    let reconnecting = request
        .metadata()
        .get(RECONNECTING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let (mut metadata, _, inbound) = request.into_parts();
    metadata.insert(
        RECONNECTING,
        MetadataValue::from_static(if reconnecting { "True" } else { "False" }),
    );

    if reconnecting {
        let (client, generation) = proxy.attach_again(&id).map_err(|e| match e {
            ClientError::Unknown(_) => Status::not_found(e.to_string()),
            ClientError::Duplicate(_) => Status::already_exists(e.to_string()),
        })?;
        let guard = Detach::new(&proxy, &client, generation);
        let server = client
            .server(proxy.settings.server_wait)
            .await
            .map_err(Status::not_found)?;
        let responses =
            open_datapath(&proxy, &client, &server, metadata, onward(inbound).boxed()).await?;
        return Ok(Response::new(
            Guarded {
                inner: responses,
                _guard: guard,
            }
            .boxed(),
        ));
    }

    let (client, generation) = proxy
        .attach_new(&id)
        .map_err(|e| Status::already_exists(e.to_string()))?;
    let guard = Detach::new(&proxy, &client, generation);
    // Answer at once; the server is found while the client waits for its
    // `init` answer, which is what a failure is reported in.
    let setup = async move {
        match first_contact(&proxy, &client, metadata, inbound).await {
            Ok(responses) => responses,
            Err((req_id, why)) => {
                // Nothing to wait for: a reconnect or a call of this client
                // learns why at once.
                client.fail_if_starting(&why);
                stream::once(std::future::ready(Ok(init_failure(req_id, &why)))).boxed()
            }
        }
    };
    let responses = stream::once(setup).flatten().boxed();
    Ok(Response::new(
        Guarded {
            inner: responses,
            _guard: guard,
        }
        .boxed(),
    ))
}

/// Reads a new client's `init`, gets it a server and opens its data stream
/// there. `Err` is the `init` answer (ok = false) that says why not.
async fn first_contact(
    proxy: &Arc<Proxy>,
    client: &Arc<Client>,
    metadata: MetadataMap,
    mut inbound: Streaming<Bytes>,
) -> Result<Messages, (i32, String)> {
    let first =
        match tokio::time::timeout(proxy.settings.first_message_timeout, inbound.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err((0, "the data stream closed before its init".into())),
            Ok(Err(status)) => {
                return Err((
                    0,
                    format!("the data stream broke before its init: {status}"),
                ))
            }
            Err(_) => return Err((0, "no init within the time limit".into())),
        };
    let envelope = wire::envelope(&first).unwrap_or_default();
    let init = match wire::init_request(&first) {
        Ok(Some(init)) => init,
        _ => {
            return Err((
                envelope.req_id,
                format!(
                    "the first message of a data stream must be an init, not field {}",
                    envelope.kind.map_or("none".to_owned(), |k| k.to_string())
                ),
            ))
        }
    };
    let server = proxy.start_server(client, init).await.map_err(|why| {
        (
            envelope.req_id,
            format!("Starting Ray client server failed: {why}"),
        )
    })?;
    let outbound = stream::once(std::future::ready(first))
        .chain(onward(inbound))
        .boxed();
    open_datapath(proxy, client, &server, metadata, outbound)
        .await
        .map_err(|status| {
            (
                envelope.req_id,
                format!(
                    "Proxy failed to connect to the Ray client server: {}; see {}",
                    status.message(),
                    proxy.launcher.error_log(server.port).display()
                ),
            )
        })
}

fn init_failure(req_id: i32, msg: &str) -> Bytes {
    DataResponse {
        req_id,
        r#type: Some(data_response::Type::Init(InitResponse {
            ok: false,
            msg: msg.to_owned(),
        })),
    }
    .encode_to_vec()
    .into()
}

/// Opens the client's data stream on its server and returns the answers,
/// with `connection_info` rewritten and `connection_cleanup` noted.
async fn open_datapath(
    proxy: &Arc<Proxy>,
    client: &Arc<Client>,
    server: &SpecificServer,
    metadata: MetadataMap,
    outbound: BoxStream<'static, Bytes>,
) -> Result<Messages, Status> {
    let mut grpc = client_grpc(server);
    ready(&mut grpc, server).await?;
    let request = Request::from_parts(metadata, Default::default(), outbound);
    let answers = grpc
        .streaming(request, path_of(DATAPATH), RawCodec)
        .await?
        .into_inner();
    let (proxy, client) = (proxy.clone(), client.clone());
    Ok(answers
        .map(move |answer| {
            let message = answer?;
            match wire::envelope(&message).map(|e| e.kind) {
                Ok(Some(wire::field::CONNECTION_INFO)) => {
                    let count = i32::try_from(proxy.num_clients()).unwrap_or(i32::MAX);
                    wire::set_num_clients(&message, count)
                        .map_err(|e| Status::internal(e.to_string()))
                }
                Ok(Some(wire::field::CONNECTION_CLEANUP)) => {
                    client.cleanup_confirmed();
                    Ok(message)
                }
                _ => Ok(message),
            }
        })
        .boxed())
}

async fn logstream(
    proxy: Arc<Proxy>,
    request: Request<Streaming<Bytes>>,
) -> Result<Response<Messages>, Status> {
    let id = client_id(request.metadata().as_ref())?;
    // The log stream may open before the data stream has registered the
    // client: look a few times.
    let mut client = proxy.client(&id);
    for _ in 1..proxy.settings.logstream_tries {
        if client.is_some() {
            break;
        }
        tokio::time::sleep(proxy.settings.logstream_pause).await;
        client = proxy.client(&id);
    }
    let client = client.ok_or_else(|| {
        Status::not_found(format!(
            "Logstream proxy failed to connect. Channel for client {id} not found."
        ))
    })?;
    let server = client
        .server(proxy.settings.server_wait)
        .await
        .map_err(Status::not_found)?;
    let (metadata, _, inbound) = request.into_parts();
    let mut grpc = client_grpc(&server);
    ready(&mut grpc, &server).await?;
    let request = Request::from_parts(metadata, Default::default(), onward(inbound));
    let answers = grpc
        .streaming(request, path_of(LOGSTREAM), RawCodec)
        .await
        .map_err(|status| {
            warn!(client_id = %id, %status, "Logstream to the Ray client server failed");
            status
        })?;
    Ok(answers.map(|s| s.boxed()))
}

/// Tells the proxy when a `Datapath` stream ends, however it ends.
struct Detach {
    proxy: Arc<Proxy>,
    client: Arc<Client>,
    generation: u64,
}

impl Detach {
    fn new(proxy: &Arc<Proxy>, client: &Arc<Client>, generation: u64) -> Detach {
        Detach {
            proxy: proxy.clone(),
            client: client.clone(),
            generation,
        }
    }
}

impl Drop for Detach {
    fn drop(&mut self) {
        self.proxy.detach(self.client.clone(), self.generation);
    }
}

/// A response stream that carries a [`Detach`].
struct Guarded {
    inner: Messages,
    _guard: Detach,
}

impl Stream for Guarded {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
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
