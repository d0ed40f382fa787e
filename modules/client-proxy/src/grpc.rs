//! The gRPC side: Ray's three client services, served on the client port.
//!
//! Every call is forwarded to the server of the client that names itself in
//! the `client_id` metadata. `RayletDriver` calls (`GetObject` included) go
//! through at the HTTP/2 level, body and trailers untouched, as
//! `raylet_driver` does. The exceptions are the ones Ray's own proxier makes:
//! `ClusterInfo(PING)` is answered here; KV calls and `PinRuntimeEnvURI`
//! made before the client has a server go to the GCS; `PrepRuntimeEnv` is
//! not implemented; and `Datapath` is watched for the `init` (which decides
//! the server) and rewritten in one place (`connection_info.num_clients` is
//! the proxy's count), so it and `Logstream` are forwarded message by
//! message.
//!
//! Layout: this file takes a call and sends it to its service's handler:
//! `raylet_driver` (with `kv` for the calls the GCS answers), `datapath`
//! and `logstream`; `framing` reads and writes gRPC's length-prefixed
//! messages.

mod datapath;
mod framing;
mod kv;
mod logstream;
mod raylet_driver;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use futures_util::Stream;
use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Status, Streaming};
use tracing::debug;

use self::datapath::datapath;
use self::framing::{framed, incoming};
use self::logstream::logstream;
use self::raylet_driver::driver_call;
use crate::auth;
use crate::codec::MAX_MESSAGE_BYTES;
use crate::proxy::{Client, Proxy};
use crate::servers::{H2Client, SpecificServer};

type Messages = BoxStream<'static, Result<Bytes, Status>>;
type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

const DRIVER: &str = "ray.rpc.RayletDriver";
const DATA: &str = "ray.rpc.RayletDataStreamer";
const LOGS: &str = "ray.rpc.RayletLogStreamer";
const DATAPATH: &str = "/ray.rpc.RayletDataStreamer/Datapath";
const LOGSTREAM: &str = "/ray.rpc.RayletLogStreamer/Logstream";
/// The path prefix of `RayletDriver` calls.
const DRIVER_PREFIX: &str = "/ray.rpc.RayletDriver/";
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
