//! The gRPC side: Ray's three client services, served on the client port.
//!
//! Every call is forwarded as bytes to the server of the client that names
//! itself in the `client_id` metadata. The exceptions are the ones Ray's
//! own proxier makes: `ClusterInfo(PING)` is answered here; KV calls and
//! `PinRuntimeEnvURI` made before the client has a server go to the GCS;
//! `PrepRuntimeEnv` is not implemented; and `Datapath` is watched for the
//! `init` (which decides the server) and rewritten in one place
//! (`connection_info.num_clients` is the proxy's count).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::Stream;
use http::uri::PathAndQuery;
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
const GET_OBJECT: &str = "/ray.rpc.RayletDriver/GetObject";

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

fn grpc() -> tonic::server::Grpc<RawCodec> {
    tonic::server::Grpc::new(RawCodec)
        .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES))
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
        let path = request.uri().path().to_owned();
        if let Some(token) = &proxy.settings.token {
            let presented = request
                .headers()
                .get(auth::AUTHORIZATION)
                .map(|v| v.as_bytes());
            if !token.accepts(presented) {
                let refused = Status::unauthenticated(auth::UNAUTHENTICATED).into_http();
                return Box::pin(async move { Ok(refused) });
            }
        }
        Box::pin(async move {
            let call = Call {
                proxy,
                path: path.clone(),
            };
            let response = match path.as_str() {
                DATAPATH => framed(datapath(call.proxy, incoming(request)).await),
                LOGSTREAM => framed(logstream(call.proxy, incoming(request)).await),
                GET_OBJECT => match first_message(incoming(request)).await {
                    Ok(request) => framed(get_object(call.proxy, &call.path, request).await),
                    Err(status) => status.into_http(),
                },
                p if p.starts_with("/ray.rpc.RayletDriver/") => grpc().unary(call, request).await,
                _ => Status::unimplemented(format!("unknown method {path}")).into_http(),
            };
            Ok(response)
        })
    }
}

/// A unary call, handed to tonic's server machinery (streamed answers are
/// framed by [`framed`] instead).
struct Call {
    proxy: Arc<Proxy>,
    path: String,
}

impl tonic::server::UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = BoxFuture<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let (proxy, path) = (self.proxy.clone(), self.path.clone());
        Box::pin(async move { unary(proxy, path, request).await })
    }
}

/// `GetObject`: the one request goes to the client's server, its chunks
/// come back as they arrive.
async fn get_object(
    proxy: Arc<Proxy>,
    path: &str,
    request: Request<Bytes>,
) -> Result<Response<Messages>, Status> {
    let client = known_client(&proxy, request.metadata())?;
    let server = client
        .server(proxy.settings.server_wait)
        .await
        .map_err(Status::not_found)?;
    let mut grpc = client_grpc(&server);
    ready(&mut grpc, &server).await?;
    let response = grpc
        .server_streaming(forwardable(request), path_of(path), RawCodec)
        .await?;
    Ok(response.map(|s| s.boxed()))
}

/// The messages of an incoming streaming call, as tonic decodes them.
fn incoming(request: http::Request<Body>) -> Request<Streaming<Bytes>> {
    let (parts, body) = request.into_parts();
    let messages = Streaming::new_request(RawCodec, body, None, Some(MAX_MESSAGE_BYTES));
    Request::from_http(http::Request::from_parts(parts, messages))
}

/// The single message of a call whose request is not a stream.
async fn first_message(request: Request<Streaming<Bytes>>) -> Result<Request<Bytes>, Status> {
    let (metadata, extensions, mut messages) = request.into_parts();
    let message = messages
        .message()
        .await?
        .ok_or_else(|| Status::internal("the call has no request message"))?;
    Ok(Request::from_parts(metadata, extensions, message))
}

/// A streamed answer as an HTTP response. The messages are framed here
/// rather than by tonic's encoder so that each payload goes to h2 as the
/// same `Bytes` it arrived in, without a copy: object chunks of `get` are
/// megabytes each.
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
                let mut prefix = bytes::BytesMut::with_capacity(5);
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

/// The `client_id` in `metadata`; FAILED_PRECONDITION without one.
fn client_id(metadata: &MetadataMap) -> Result<String, Status> {
    match metadata.get(CLIENT_ID).and_then(|v| v.to_str().ok()) {
        Some(id) if !id.is_empty() => Ok(id.to_owned()),
        _ => Err(Status::failed_precondition(
            "the call carries no client_id metadata",
        )),
    }
}

fn known_client(proxy: &Proxy, metadata: &MetadataMap) -> Result<Arc<Client>, Status> {
    let id = client_id(metadata)?;
    proxy
        .client(&id)
        .ok_or_else(|| Status::not_found(format!("no Ray client server for client {id}")))
}

fn path_of(path: &str) -> PathAndQuery {
    PathAndQuery::try_from(path).expect("UNWRAP: a path tonic routed is a valid path")
}

/// The request as it goes on: the same metadata, without the extensions of
/// this hop.
fn forwardable<T>(request: Request<T>) -> Request<T> {
    let (metadata, _, message) = request.into_parts();
    Request::from_parts(metadata, Default::default(), message)
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

fn reply<M: Message>(message: M) -> Result<Response<Bytes>, Status> {
    Ok(Response::new(message.encode_to_vec().into()))
}

async fn unary(
    proxy: Arc<Proxy>,
    path: String,
    request: Request<Bytes>,
) -> Result<Response<Bytes>, Status> {
    let method = path.rsplit('/').next().unwrap_or_default();
    match method {
        "ClusterInfo" => {
            let asked: ClusterInfoRequest = decode(request.get_ref())?;
            if asked.r#type == ClusterInfoType::Ping as i32 {
                return reply(ClusterInfoResponse {
                    r#type: asked.r#type,
                    response_type: Some(ResponseType::Json("{}".into())),
                });
            }
        }
        "PrepRuntimeEnv" => return Err(Status::unimplemented("PrepRuntimeEnv is not implemented")),
        "KVGet" | "KVPut" | "KVDel" | "KVList" | "KVExists" | "PinRuntimeEnvURI" => {
            let id = client_id(request.metadata())?;
            let has_server = proxy.client(&id).and_then(|c| c.ready_server()).is_some();
            if !has_server {
                return gcs_call(&proxy, method, request.get_ref()).await;
            }
        }
        _ => {}
    }
    let client = known_client(&proxy, request.metadata())?;
    let server = client
        .server(proxy.settings.server_wait)
        .await
        .map_err(Status::not_found)?;
    let mut grpc = client_grpc(&server);
    ready(&mut grpc, &server).await?;
    grpc.unary(forwardable(request), path_of(&path), RawCodec)
        .await
}

/// A KV call of a client that has no server yet, made on the GCS.
async fn gcs_call(proxy: &Proxy, method: &str, body: &Bytes) -> Result<Response<Bytes>, Status> {
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
    let id = client_id(request.metadata())?;
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
            Err(failure) => stream::once(std::future::ready(Ok(failure))).boxed(),
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
) -> Result<Messages, Bytes> {
    let first =
        match tokio::time::timeout(proxy.settings.first_message_timeout, inbound.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err(init_failure(0, "the data stream closed before its init")),
            Ok(Err(status)) => {
                return Err(init_failure(
                    0,
                    &format!("the data stream broke before its init: {status}"),
                ))
            }
            Err(_) => return Err(init_failure(0, "no init within the time limit")),
        };
    let envelope = wire::envelope(&first).unwrap_or_default();
    let init = match wire::init_request(&first) {
        Ok(Some(init)) => init,
        _ => {
            return Err(init_failure(
                envelope.req_id,
                &format!(
                    "the first message of a data stream must be an init, not field {}",
                    envelope.kind.map_or("none".to_owned(), |k| k.to_string())
                ),
            ))
        }
    };
    let server = proxy.start_server(client, &init).await.map_err(|why| {
        init_failure(
            envelope.req_id,
            &format!("Starting Ray client server failed: {why}"),
        )
    })?;
    let outbound = stream::once(std::future::ready(first))
        .chain(onward(inbound))
        .boxed();
    open_datapath(proxy, client, &server, metadata, outbound)
        .await
        .map_err(|status| {
            init_failure(
                envelope.req_id,
                &format!(
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
    let id = client_id(request.metadata())?;
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
