//! A stand-in for Ray's client server ("specific server"), for testing the
//! client proxy without a cluster. It takes the flags Ray gives a server
//! (`--port=`, `--serialized-runtime-env-context=`, others ignored) and
//! serves Ray's three client services with behaviour tests can check:
//!
//! - `ClusterInfo` answers JSON naming this server (port, pid, context) and
//!   the metadata of the call, so a test sees where a call landed;
//! - `Datapath` answers `init` (ok), `connection_info` (num_clients 1),
//!   `put` (stores the data, answers its id), `get` (the stored data, or
//!   `valid = false`), `connection_cleanup`; each answer keeps the req_id.
//!   The metadata of each opened stream is recorded for `ClusterInfo`;
//! - `GetObject` streams three chunks; the KV calls use a map of its own;
//! - `Logstream` sends one line naming the server, then waits.
//!
//! Like Ray's server, it exits when `TIMEOUT_FOR_SPECIFIC_SERVER_S` (here
//! only when set) seconds pass without a client: here, before any
//! `Datapath` stream was opened.
//!
//! `FAKE_SERVER_REUSEPORT=1` makes it listen with SO_REUSEPORT, as
//! gRPC's own servers do on Linux.
//!
//! `FAKE_SERVER_FAIL=1` makes it exit with an error before listening;
//! `FAKE_SERVER_DELAY_MS=n` makes it wait before listening.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use ray_dashd_contract::LockExt;
use ray_proto::rpc::raylet_data_streamer_server::{RayletDataStreamer, RayletDataStreamerServer};
use ray_proto::rpc::raylet_driver_server::{RayletDriver, RayletDriverServer};
use ray_proto::rpc::raylet_log_streamer_server::{RayletLogStreamer, RayletLogStreamerServer};
use ray_proto::rpc::{
    cluster_info_response, data_request, data_response, ClusterInfoRequest, ClusterInfoResponse,
    ConnectionCleanupResponse, ConnectionInfoResponse, DataRequest, DataResponse, GetRequest,
    GetResponse, InitResponse, KvGetRequest, KvGetResponse, KvPutRequest, KvPutResponse, LogData,
    LogSettingsRequest, PutResponse,
};
use tonic::{Request, Response, Status, Streaming};

type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The server's state, shared by its three services.
#[derive(Debug, Clone)]
struct Shared(Arc<Fake>);

impl std::ops::Deref for Shared {
    type Target = Fake;
    fn deref(&self) -> &Fake {
        &self.0
    }
}

#[derive(Debug, Default)]
struct Fake {
    port: u16,
    context: String,
    objects: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    kv: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    streams: Mutex<Vec<serde_json::Value>>,
}

fn metadata_json(metadata: &tonic::metadata::MetadataMap) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for key in ["client_id", "reconnecting", "x-test"] {
        if let Some(value) = metadata.get(key).and_then(|v| v.to_str().ok()) {
            map.insert(key.into(), value.into());
        }
    }
    map.into()
}

#[tonic::async_trait]
impl RayletDriver for Shared {
    async fn cluster_info(
        &self,
        request: Request<ClusterInfoRequest>,
    ) -> Result<Response<ClusterInfoResponse>, Status> {
        let json = serde_json::json!({
            "port": self.port,
            "pid": std::process::id(),
            "context": self.context,
            "metadata": metadata_json(request.metadata()),
            "datapath_streams": *self.streams.locked(),
        });
        Ok(Response::new(ClusterInfoResponse {
            r#type: request.get_ref().r#type,
            response_type: Some(cluster_info_response::ResponseType::Json(json.to_string())),
        }))
    }

    async fn kv_put(
        &self,
        request: Request<KvPutRequest>,
    ) -> Result<Response<KvPutResponse>, Status> {
        let r = request.into_inner();
        let already_exists = self.kv.locked().insert(r.key, r.value).is_some();
        Ok(Response::new(KvPutResponse { already_exists }))
    }

    async fn kv_get(
        &self,
        request: Request<KvGetRequest>,
    ) -> Result<Response<KvGetResponse>, Status> {
        let value = self.kv.locked().get(&request.get_ref().key).cloned();
        Ok(Response::new(KvGetResponse { value }))
    }

    async fn get_object(
        &self,
        request: Request<GetRequest>,
    ) -> Result<Response<Answers<GetResponse>>, Status> {
        let port = self.port;
        let total = 3;
        let chunks = request.into_inner().ids.len().max(1) as u64;
        let answers = futures_util::stream::iter(0..total).map(move |i| {
            Ok(GetResponse {
                valid: true,
                data: format!("chunk {i} of {total} from {port} ({chunks} ids)").into_bytes(),
                chunk_id: i,
                total_chunks: total,
                ..Default::default()
            })
        });
        Ok(Response::new(answers.boxed()))
    }
}

impl Fake {
    fn answer(&self, request: DataRequest) -> Option<DataResponse> {
        let kind = match request.r#type? {
            data_request::Type::Init(_) => data_response::Type::Init(InitResponse {
                ok: true,
                msg: String::new(),
            }),
            data_request::Type::ConnectionInfo(_) => {
                data_response::Type::ConnectionInfo(ConnectionInfoResponse {
                    num_clients: 1,
                    ray_version: "fake".into(),
                    ray_commit: format!("port {}", self.port),
                    python_version: "3.11.0".into(),
                })
            }
            data_request::Type::Put(put) => {
                let id = format!("obj-{}-{}", self.port, request.req_id).into_bytes();
                self.objects.locked().insert(id.clone(), put.data);
                data_response::Type::Put(PutResponse {
                    id,
                    valid: true,
                    error: vec![],
                })
            }
            data_request::Type::Get(get) => {
                let data = get
                    .ids
                    .first()
                    .and_then(|id| self.objects.locked().get(id).cloned());
                data_response::Type::Get(GetResponse {
                    valid: data.is_some(),
                    data: data.unwrap_or_default(),
                    total_chunks: 1,
                    ..Default::default()
                })
            }
            data_request::Type::ConnectionCleanup(_) => {
                data_response::Type::ConnectionCleanup(ConnectionCleanupResponse {})
            }
            _ => return None,
        };
        Some(DataResponse {
            req_id: request.req_id,
            r#type: Some(kind),
        })
    }
}

#[tonic::async_trait]
impl RayletDataStreamer for Shared {
    async fn datapath(
        &self,
        request: Request<Streaming<DataRequest>>,
    ) -> Result<Response<Answers<DataResponse>>, Status> {
        self.streams
            .locked()
            .push(metadata_json(request.metadata()));
        let fake = self.0.clone();
        let answers = request
            .into_inner()
            .take_while(|r| std::future::ready(r.is_ok()))
            .filter_map(move |r| std::future::ready(r.ok().and_then(|r| fake.answer(r)).map(Ok)));
        Ok(Response::new(answers.boxed()))
    }
}

#[tonic::async_trait]
impl RayletLogStreamer for Shared {
    async fn logstream(
        &self,
        request: Request<Streaming<LogSettingsRequest>>,
    ) -> Result<Response<Answers<LogData>>, Status> {
        let line = LogData {
            msg: format!("log line from the server on port {}", self.port),
            level: 20,
            name: "fake".into(),
        };
        // One line, then open until the client closes its side.
        let rest = request
            .into_inner()
            .filter_map(|_| std::future::ready(None));
        Ok(Response::new(
            futures_util::stream::once(std::future::ready(Ok(line)))
                .chain(rest)
                .boxed(),
        ))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut fake = Fake::default();
    for arg in std::env::args().skip(1) {
        if let Some(port) = arg.strip_prefix("--port=") {
            fake.port = port.parse()?;
        } else if let Some(context) = arg.strip_prefix("--serialized-runtime-env-context=") {
            fake.context = context.to_owned();
        }
    }
    if std::env::var_os("FAKE_SERVER_FAIL").is_some() {
        eprintln!("fake client server: failing on purpose (FAKE_SERVER_FAIL)");
        std::process::exit(3);
    }
    if let Some(ms) = std::env::var("FAKE_SERVER_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let fake = Shared(Arc::new(fake));
    if let Some(idle_secs) = std::env::var("TIMEOUT_FOR_SPECIFIC_SERVER_S")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        let fake = fake.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(idle_secs)).await;
            if fake.streams.locked().is_empty() {
                eprintln!("fake client server: no client within {idle_secs} s; exiting");
                std::process::exit(0);
            }
        });
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], fake.port));
    eprintln!("fake client server on {addr}");
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if std::env::var_os("FAKE_SERVER_REUSEPORT").is_some() {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    let listener = tokio::net::TcpListener::from_std(socket.into())?;
    tonic::transport::Server::builder()
        .add_service(RayletDriverServer::new(fake.clone()).max_decoding_message_size(usize::MAX))
        .add_service(
            RayletDataStreamerServer::new(fake.clone()).max_decoding_message_size(usize::MAX),
        )
        .add_service(RayletLogStreamerServer::new(fake))
        .serve_with_incoming(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
        )
        .await?;
    Ok(())
}
