//! The Ray Client proxy module (`ray-dashd-client-proxy`) under the host,
//! with fake Ray client servers (`ray-dashd-fake-client-server`) standing in
//! for Ray's: forwarding, metadata, PING, num_clients, reconnects, cleanup,
//! port reclaim, failures, KV before a server exists, 500 clients, the
//! module being killed and restarted by the host, and (with a server the
//! test serves itself) driver calls passed through byte for byte and a
//! server dying mid-answer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use nix::sys::signal::Signal;
use prost::Message;
use ray_proto::rpc::cluster_info_response::ResponseType;
use ray_proto::rpc::cluster_info_type::TypeEnum as ClusterInfoType;
use ray_proto::rpc::internal_kv_gcs_service_server::{
    InternalKvGcsService, InternalKvGcsServiceServer,
};
use ray_proto::rpc::raylet_data_streamer_client::RayletDataStreamerClient;
use ray_proto::rpc::raylet_data_streamer_server::{RayletDataStreamer, RayletDataStreamerServer};
use ray_proto::rpc::raylet_driver_client::RayletDriverClient;
use ray_proto::rpc::raylet_driver_server::{RayletDriver, RayletDriverServer};
use ray_proto::rpc::raylet_log_streamer_client::RayletLogStreamerClient;
use ray_proto::rpc::runtime_env_gcs_service_server::{
    RuntimeEnvGcsService, RuntimeEnvGcsServiceServer,
};
use ray_proto::rpc::{
    data_request, data_response, ClientPinRuntimeEnvUriRequest, ClusterInfoRequest,
    ConnectionCleanupRequest, ConnectionInfoRequest, DataRequest, DataResponse, GcsStatus,
    GetRequest, GetResponse, InitRequest, InitResponse, InternalKvExistsReply,
    InternalKvExistsRequest, InternalKvGetReply, InternalKvGetRequest, InternalKvPutReply,
    InternalKvPutRequest, KvExistsRequest, KvGetRequest, KvPutRequest, KvPutResponse,
    LogSettingsRequest, PinRuntimeEnvUriReply, PinRuntimeEnvUriRequest, PrepRuntimeEnvRequest,
    PutRequest,
};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Streaming};

use crate::support::{
    bin_dir, client, command_module, dashd, eventually, file_with, kill, process_gone, Dashd, WAIT,
};

const MODULE: &str = "ray_client_proxy";
/// A gRPC message's prefix: a compressed flag and a 4-byte length.
const PREFIX: usize = 5;

struct Setup {
    ports: String,
    warm_spare: bool,
    gcs: Option<String>,
    env: Vec<(String, String)>,
    server_command: Option<Vec<String>>,
    args: Vec<String>,
}

/// The proxy module with fake servers, each on a port the kernel picks
/// (`--port-range auto`), so that tests running at once (and any other
/// process on the machine) never compete for a hand-picked block.
fn setup() -> Setup {
    Setup {
        ports: "auto".into(),
        warm_spare: false,
        gcs: None,
        env: vec![],
        server_command: None,
        args: vec![],
    }
}

impl Setup {
    /// Server ports from `range` (FIRST-LAST) instead of the kernel.
    fn ports(mut self, range: String) -> Self {
        self.ports = range;
        self
    }

    /// One more argument for the proxy module.
    fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.into());
        self
    }

    fn spare(mut self) -> Self {
        self.warm_spare = true;
        self
    }

    fn gcs(mut self, address: String) -> Self {
        self.gcs = Some(address);
        self
    }

    fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Servers started with `argv` rather than the fake server.
    fn server_command(mut self, argv: &[&str]) -> Self {
        self.server_command = Some(argv.iter().map(|&a| a.to_owned()).collect());
        self
    }

    /// ray-dashd with the proxy module on a free client port.
    async fn start(self) -> (Dashd, u16) {
        let proxy = bin_dir()
            .join("ray-dashd-client-proxy")
            .display()
            .to_string();
        let fake = bin_dir()
            .join("ray-dashd-fake-client-server")
            .display()
            .to_string();
        let spare = self.warm_spare.to_string();
        let server_command = self.server_command.unwrap_or_else(|| vec![fake]);
        let mut command = vec![proxy.as_str(), "--ray-client-port", "0"];
        for word in &server_command {
            command.extend(["--server-command", word.as_str()]);
        }
        command.extend([
            "--port-range",
            self.ports.as_str(),
            "--warm-spare",
            spare.as_str(),
        ]);
        if let Some(gcs) = &self.gcs {
            command.extend(["--gcs-address", gcs.as_str()]);
        }
        command.extend(self.args.iter().map(String::as_str));
        let mut module = command_module(MODULE, &command).routes(&[(
            "GET",
            "/api/client_proxy/clients",
            "http",
        )]);
        for (k, v) in &self.env {
            module = module.env(k, v);
        }
        let d = dashd().module(module).start();
        d.healthy(MODULE, 0).await;
        let port = grpc_port(&d).await;
        (d, port)
    }
}

async fn clients_view(d: &Dashd) -> Value {
    client()
        .get(d.url("/api/client_proxy/clients"))
        .send()
        .await
        .expect("clients request")
        .json()
        .await
        .expect("clients json")
}

async fn grpc_port(d: &Dashd) -> u16 {
    let view = clients_view(d).await;
    let listen = view["listen"]
        .as_str()
        .unwrap_or_else(|| panic!("not listening: {view}"));
    listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

async fn channel(port: u16) -> Channel {
    Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect to the proxy")
}

fn with_id<T>(message: T, id: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("client_id", id.parse().expect("ascii id"));
    request
}

/// A Ray client as the proxy sees one: a data stream and the driver calls.
struct TestClient {
    id: String,
    channel: Channel,
    sender: mpsc::Sender<DataRequest>,
    answers: Streaming<DataResponse>,
    next_req: i32,
}

impl TestClient {
    /// Opens the data stream (no message sent yet).
    async fn open(
        channel: Channel,
        id: &str,
        reconnecting: bool,
    ) -> Result<TestClient, tonic::Status> {
        let (sender, receiver) = mpsc::channel(16);
        let mut request = with_id(ReceiverStream::new(receiver), id);
        request.metadata_mut().insert(
            "reconnecting",
            if reconnecting { "True" } else { "False" }
                .parse()
                .expect("ascii"),
        );
        let answers = RayletDataStreamerClient::new(channel.clone())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
            .datapath(request)
            .await?
            .into_inner();
        Ok(TestClient {
            id: id.to_owned(),
            channel,
            sender,
            answers,
            next_req: 1,
        })
    }

    /// Connects as a new client: PING, data stream, init, connection_info.
    async fn connect(port: u16, id: &str, grace: i32) -> TestClient {
        let channel = channel(port).await;
        let ping = RayletDriverClient::new(channel.clone())
            .cluster_info(ClusterInfoRequest {
                r#type: ClusterInfoType::Ping as i32,
            })
            .await
            .expect("PING answered without metadata");
        assert_eq!(
            ping.get_ref().response_type,
            Some(ResponseType::Json("{}".into()))
        );
        let mut c = TestClient::open(channel, id, false)
            .await
            .expect("data stream opens");
        let init = c.init(grace).await;
        let Some(data_response::Type::Init(init)) = init.r#type else {
            panic!("not an init answer: {init:?}")
        };
        assert!(init.ok, "init failed: {}", init.msg);
        c
    }

    async fn send(&mut self, kind: data_request::Type) -> DataResponse {
        let req_id = self.next_req;
        self.next_req += 1;
        self.sender
            .send(DataRequest {
                req_id,
                r#type: Some(kind),
            })
            .await
            .expect("data stream open");
        let answer = tokio::time::timeout(WAIT, self.answers.message())
            .await
            .expect("answer in time")
            .expect("answer, not an error")
            .expect("stream still open");
        assert_eq!(answer.req_id, req_id, "answer to another request");
        answer
    }

    async fn init(&mut self, grace: i32) -> DataResponse {
        self.send(data_request::Type::Init(InitRequest {
            job_config: vec![],
            ray_init_kwargs: r#"{"runtime_env": {}, "_skip_env_hook": true}"#.into(),
            reconnect_grace_period: grace,
        }))
        .await
    }

    async fn num_clients(&mut self) -> i32 {
        match self
            .send(data_request::Type::ConnectionInfo(ConnectionInfoRequest {}))
            .await
            .r#type
        {
            Some(data_response::Type::ConnectionInfo(info)) => info.num_clients,
            other => panic!("not a connection_info answer: {other:?}"),
        }
    }

    /// What the fake server behind this client says of itself.
    async fn whoami(&self) -> Value {
        let mut request = with_id(
            ClusterInfoRequest {
                r#type: ClusterInfoType::Nodes as i32,
            },
            &self.id,
        );
        request
            .metadata_mut()
            .insert("x-test", "forwarded".parse().expect("ascii"));
        let answer = RayletDriverClient::new(self.channel.clone())
            .cluster_info(request)
            .await
            .expect("ClusterInfo forwarded");
        match &answer.get_ref().response_type {
            Some(ResponseType::Json(json)) => serde_json::from_str(json).expect("fake server json"),
            other => panic!("unexpected ClusterInfo answer {other:?}"),
        }
    }

    async fn cleanup(mut self) {
        let answer = self
            .send(data_request::Type::ConnectionCleanup(
                ConnectionCleanupRequest {},
            ))
            .await;
        assert!(matches!(
            answer.r#type,
            Some(data_response::Type::ConnectionCleanup(_))
        ));
    }
}

/// The entry of `id` in the proxy's client list.
async fn entry(d: &Dashd, id: &str) -> Option<Value> {
    let view = clients_view(d).await;
    view["clients"]
        .as_array()?
        .iter()
        .find(|c| c["id"] == id)
        .cloned()
}

/// Two clients get two servers; every call lands on the caller's own server
/// with its metadata; num_clients is the proxy's count; streams, GetObject
/// and 12 MiB put/get cross intact; the log stream reaches the right server.
#[tokio::test]
async fn forwards_each_clients_calls_to_its_own_server() {
    let (d, port) = setup().start().await;
    let mut a = TestClient::connect(port, "client-a", 30).await;
    let b = TestClient::connect(port, "client-b", 30).await;
    assert_eq!(
        a.num_clients().await,
        2,
        "num_clients is the proxy's count, not the server's 1"
    );

    let (who_a, who_b) = (a.whoami().await, b.whoami().await);
    assert_ne!(who_a["port"], who_b["port"], "two clients share a server");
    assert_eq!(clients_view(&d).await["server_ports"], "auto");
    assert_eq!(who_a["metadata"]["client_id"], "client-a");
    assert_eq!(
        who_a["metadata"]["x-test"], "forwarded",
        "metadata dropped: {who_a}"
    );
    assert_eq!(who_a["datapath_streams"][0]["reconnecting"], "False");
    let listed = entry(&d, "client-a").await.expect("client-a listed");
    assert_eq!(listed["server_port"], who_a["port"]);
    assert_eq!(listed["server_pid"], who_a["pid"]);
    assert_eq!(listed["attached"], true);
    assert!(
        who_a["context"]
            .as_str()
            .expect("context")
            .contains("\"env_vars\":{}"),
        "{who_a}"
    );

    // 12 MiB each way through the data stream.
    let payload: Vec<u8> = (0..12 << 20).map(|i: u32| (i % 251) as u8).collect();
    let put = a
        .send(data_request::Type::Put(PutRequest {
            data: payload.clone(),
            ..Default::default()
        }))
        .await;
    let Some(data_response::Type::Put(put)) = put.r#type else {
        panic!("not a put answer")
    };
    let got = a
        .send(data_request::Type::Get(GetRequest {
            ids: vec![put.id],
            ..Default::default()
        }))
        .await;
    let Some(data_response::Type::Get(got)) = got.r#type else {
        panic!("not a get answer")
    };
    assert!(got.valid);
    assert!(got.data == payload, "12 MiB object changed in transit");

    // Server streaming.
    let mut chunks = RayletDriverClient::new(a.channel.clone())
        .get_object(with_id(
            GetRequest {
                ids: vec![vec![1]],
                ..Default::default()
            },
            "client-a",
        ))
        .await
        .expect("GetObject")
        .into_inner();
    let mut seen = vec![];
    while let Some(chunk) = chunks.message().await.expect("chunk") {
        seen.push(String::from_utf8(chunk.data).expect("utf8"));
    }
    assert_eq!(seen.len(), 3);
    assert!(
        seen[2].contains(&format!("from {}", who_a["port"])),
        "{seen:?}"
    );

    // The log stream goes to the client's server too.
    let (log_tx, log_rx) = mpsc::channel(1);
    log_tx
        .send(LogSettingsRequest {
            enabled: true,
            loglevel: 20,
        })
        .await
        .expect("send");
    let mut logs = RayletLogStreamerClient::new(b.channel.clone())
        .logstream(with_id(ReceiverStream::new(log_rx), "client-b"))
        .await
        .expect("Logstream")
        .into_inner();
    let line = tokio::time::timeout(WAIT, logs.message())
        .await
        .expect("log in time")
        .expect("log")
        .expect("a line");
    assert_eq!(
        line.msg,
        format!("log line from the server on port {}", who_b["port"])
    );
    drop(log_tx);
}

/// With `RAY_AUTH_MODE=token`, every call must carry the cluster's token,
/// as with Ray's own proxier.
#[tokio::test]
async fn token_mode_refuses_calls_without_the_token() {
    let (_d, port) = setup()
        .env("RAY_AUTH_MODE", "token")
        .env("RAY_AUTH_TOKEN", "proxy-test-token")
        .start()
        .await;
    let channel = channel(port).await;
    let ping = ClusterInfoRequest {
        r#type: ClusterInfoType::Ping as i32,
    };
    for presented in [None, Some("Bearer wrong-token"), Some("proxy-test-token")] {
        let mut request = Request::new(ping);
        if let Some(value) = presented {
            request
                .metadata_mut()
                .insert("authorization", value.parse().expect("ascii"));
        }
        let status = RayletDriverClient::new(channel.clone())
            .cluster_info(request)
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{presented:?}: {status:?}"
        );
    }
    let mut request = Request::new(ping);
    request.metadata_mut().insert(
        "authorization",
        "Bearer proxy-test-token".parse().expect("ascii"),
    );
    RayletDriverClient::new(channel.clone())
        .cluster_info(request)
        .await
        .expect("the right token is accepted");
}

/// The reference's edge answers.
#[tokio::test]
async fn answers_edge_cases_like_rays_proxier() {
    let (_d, port) = setup().start().await;
    let channel = channel(port).await;

    let (_tx, rx) = mpsc::channel::<DataRequest>(1);
    let status = RayletDataStreamerClient::new(channel.clone())
        .datapath(Request::new(ReceiverStream::new(rx)))
        .await
        .expect_err("a data stream without client_id is refused");
    assert_eq!(status.code(), Code::FailedPrecondition);

    let status = match TestClient::open(channel.clone(), "never-seen", true).await {
        Ok(mut c) => c
            .answers
            .message()
            .await
            .expect_err("reconnect of an unknown client"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    let mut c = TestClient::open(channel.clone(), "no-init", false)
        .await
        .expect("opens");
    let answer = c
        .send(data_request::Type::ConnectionInfo(ConnectionInfoRequest {}))
        .await;
    let Some(data_response::Type::Init(init)) = answer.r#type else {
        panic!("not an init answer: {answer:?}")
    };
    assert!(!init.ok);
    assert!(init.msg.contains("must be an init"), "{}", init.msg);

    let status = RayletDriverClient::new(channel.clone())
        .prep_runtime_env(with_id(PrepRuntimeEnvRequest::default(), "x"))
        .await
        .expect_err("PrepRuntimeEnv");
    assert_eq!(status.code(), Code::Unimplemented);

    let status = RayletDriverClient::new(channel.clone())
        .schedule(with_id(Default::default(), "nobody"))
        .await
        .expect_err("a call of an unknown client");
    assert_eq!(status.code(), Code::NotFound);
}

/// A client whose connection drops and comes back within its grace period
/// keeps its server; `connection_cleanup` ends the server at once and its
/// port goes back to the pool.
#[tokio::test]
async fn reconnect_resumes_and_cleanup_frees_server_and_port() {
    let (d, port) = setup().start().await;
    let c = TestClient::connect(port, "roamer", 30).await;
    let before = c.whoami().await;
    let pid = before["pid"].as_u64().expect("pid") as u32;
    // The connection drops: the data stream ends without a cleanup.
    drop(c);
    let detached = eventually(WAIT, || async {
        entry(&d, "roamer").await.filter(|e| e["attached"] == false)
    })
    .await;
    assert!(detached.is_some(), "client not shown detached");
    assert!(!process_gone(pid), "server stopped within the grace period");

    let mut c = TestClient::open(channel(port).await, "roamer", true)
        .await
        .expect("reconnect accepted");
    assert_eq!(c.num_clients().await, 1);
    let after = c.whoami().await;
    assert_eq!(after["pid"], before["pid"], "reconnect got another server");
    assert_eq!(
        after["datapath_streams"][1]["reconnecting"], "True",
        "{after}"
    );
    assert_eq!(
        entry(&d, "roamer").await.expect("listed")["reconnected"],
        true
    );

    c.cleanup().await;
    let gone = eventually(WAIT, || async { process_gone(pid).then_some(()) }).await;
    assert!(
        gone.is_some(),
        "server {pid} still runs after connection_cleanup"
    );
    let freed = eventually(WAIT, || async {
        let view = clients_view(&d).await;
        (view["ports_in_use"] == 0 && view["num_clients"] == 0).then_some(())
    })
    .await;
    assert!(
        freed.is_some(),
        "port or client kept: {}",
        clients_view(&d).await
    );
}

/// A client that never comes back is dropped after its grace period, and
/// a server that dies gives its port back at once.
#[tokio::test]
async fn grace_expiry_and_server_death_free_ports() {
    let (d, port) = setup().start().await;
    let short = TestClient::connect(port, "short-grace", 1).await;
    let pid = short.whoami().await["pid"].as_u64().expect("pid") as u32;
    drop(short);
    let gone = eventually(WAIT, || async {
        (process_gone(pid) && entry(&d, "short-grace").await.is_none()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "client kept past its 1 s grace");

    let mut doomed = TestClient::connect(port, "doomed", 30).await;
    let pid = doomed.whoami().await["pid"].as_u64().expect("pid");
    assert_eq!(clients_view(&d).await["ports_in_use"], 1);
    kill(pid, Signal::SIGKILL);
    let freed = eventually(WAIT, || async {
        (clients_view(&d).await["ports_in_use"] == 0).then_some(())
    })
    .await;
    assert!(freed.is_some(), "the dead server's port was not given back");
    let broken = tokio::time::timeout(WAIT, doomed.answers.message())
        .await
        .expect("stream ends in time");
    assert!(
        !matches!(broken, Ok(Some(_))),
        "the data stream of a dead server goes on"
    );
    // The pool still serves new clients.
    TestClient::connect(port, "after", 30).await;
}

/// `n` consecutive loopback ports, each bound by the returned listeners so
/// that they stay free until the test lets them go: a block above the
/// kernel's ephemeral range (so that no outgoing connection takes a port
/// once it is let go), found by binding it, the search starting at an
/// offset the kernel picks (a port of its own) so that tests running at
/// once start apart. Never a hand-picked block.
fn held_port_range(n: u16) -> Vec<std::net::TcpListener> {
    let ephemeral_end: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(60_999);
    let first = ephemeral_end
        .checked_add(1)
        .expect("room above the ephemeral range");
    let span = (u16::MAX - first)
        .checked_sub(n)
        .expect("room above the ephemeral range")
        + 1;
    let seed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port from the kernel")
        .port();
    (0..span)
        .map(|i| first + (seed.wrapping_add(i)) % span)
        .find_map(|base| {
            (base..base + n)
                .map(|port| std::net::TcpListener::bind(("127.0.0.1", port)).ok())
                .collect::<Option<Vec<_>>>()
        })
        .expect("a block of free ports above the ephemeral range")
}

/// Range mode (the default, Ray's): ports come from the top of the range
/// down, a port someone else holds is skipped, and a client that finds
/// every port in use is told so in its init answer.
#[tokio::test]
async fn a_port_range_skips_held_ports_and_says_when_used_up() {
    let mut held = held_port_range(3);
    let port_of = |l: &std::net::TcpListener| l.local_addr().expect("addr").port();
    let (first, last) = (port_of(&held[0]), port_of(&held[2]));
    // The top port stays held by the test; the two below are let go for
    // the pool.
    let stranger = held.pop().expect("the top port");
    drop(held);
    let (d, port) = setup().ports(format!("{first}-{last}")).start().await;
    assert_eq!(
        clients_view(&d).await["server_ports"],
        format!("{first}-{last}")
    );
    let a = TestClient::connect(port, "range-a", 30).await;
    let b = TestClient::connect(port, "range-b", 30).await;
    let ports = [
        a.whoami().await["port"].clone(),
        b.whoami().await["port"].clone(),
    ];
    assert_eq!(
        ports,
        [first + 1, first].map(serde_json::Value::from),
        "not from the top down, skipping the held port {last}"
    );
    let mut c = TestClient::open(channel(port).await, "range-c", false)
        .await
        .expect("opens");
    let answer = c.init(30).await;
    let Some(data_response::Type::Init(init)) = answer.r#type else {
        panic!("not an init answer: {answer:?}")
    };
    assert!(!init.ok, "a server with every port in use");
    assert!(
        init.msg
            .contains(&format!("no free port in {first}-{last}")),
        "{}",
        init.msg
    );
    drop(stranger);
}

/// A server that cannot start: the client's init answer says so and names
/// the log file to read; nothing hangs and the port is returned.
#[tokio::test]
async fn failed_server_start_is_reported_in_the_init_answer() {
    let (d, port) = setup().env("FAKE_SERVER_FAIL", "1").start().await;
    let mut c = TestClient::open(channel(port).await, "unlucky", false)
        .await
        .expect("opens");
    let answer = c.init(30).await;
    let Some(data_response::Type::Init(init)) = answer.r#type else {
        panic!("not an init answer: {answer:?}")
    };
    assert!(!init.ok);
    let log = init
        .msg
        .split_whitespace()
        .find(|w| w.contains("ray_client_server_") && w.ends_with(".err"))
        .unwrap_or_else(|| panic!("no log file named in {:?}", init.msg));
    let text = std::fs::read_to_string(log).expect("named log file exists");
    assert!(text.contains("failing on purpose"), "{text}");
    let view = clients_view(&d).await;
    assert_eq!(view["ports_in_use"], 0, "{view}");
    // Nothing to resume: the client is forgotten without its grace period.
    drop(c);
    let forgotten = eventually(WAIT, || async {
        (clients_view(&d).await["num_clients"] == 0).then_some(())
    })
    .await;
    assert!(
        forgotten.is_some(),
        "a client without a server kept: {}",
        clients_view(&d).await
    );
}

/// What the fake GCS saw.
#[derive(Debug, Default, Clone)]
struct FakeGcs {
    kv: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>>,
    pinned: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl InternalKvGcsService for FakeGcs {
    async fn internal_kv_get(
        &self,
        request: Request<InternalKvGetRequest>,
    ) -> Result<tonic::Response<InternalKvGetReply>, tonic::Status> {
        let value = self
            .kv
            .lock()
            .expect("lock")
            .get(&request.get_ref().key)
            .cloned();
        let status = match value {
            Some(_) => None,
            None => Some(GcsStatus {
                code: 17,
                message: "not found".into(),
            }),
        };
        Ok(tonic::Response::new(InternalKvGetReply {
            status,
            value: value.unwrap_or_default(),
        }))
    }

    async fn internal_kv_put(
        &self,
        request: Request<InternalKvPutRequest>,
    ) -> Result<tonic::Response<InternalKvPutReply>, tonic::Status> {
        let r = request.into_inner();
        let added = self
            .kv
            .lock()
            .expect("lock")
            .insert(r.key, r.value)
            .is_none();
        Ok(tonic::Response::new(InternalKvPutReply {
            status: None,
            added,
        }))
    }

    async fn internal_kv_exists(
        &self,
        request: Request<InternalKvExistsRequest>,
    ) -> Result<tonic::Response<InternalKvExistsReply>, tonic::Status> {
        let exists = self
            .kv
            .lock()
            .expect("lock")
            .contains_key(&request.get_ref().key);
        Ok(tonic::Response::new(InternalKvExistsReply {
            status: None,
            exists,
        }))
    }
}

#[tonic::async_trait]
impl RuntimeEnvGcsService for FakeGcs {
    async fn pin_runtime_env_uri(
        &self,
        request: Request<PinRuntimeEnvUriRequest>,
    ) -> Result<tonic::Response<PinRuntimeEnvUriReply>, tonic::Status> {
        self.pinned
            .lock()
            .expect("lock")
            .push(request.into_inner().uri);
        Ok(tonic::Response::new(PinRuntimeEnvUriReply { status: None }))
    }
}

/// KV calls made before the client has a server (the working_dir upload)
/// are served by the GCS; once it has one, they go to its server.
#[tokio::test]
async fn kv_calls_before_a_server_exists_go_to_the_gcs() {
    let gcs = FakeGcs::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake gcs");
    let gcs_addr = listener.local_addr().expect("addr");
    let server = tonic::transport::Server::builder()
        .add_service(InternalKvGcsServiceServer::new(gcs.clone()))
        .add_service(RuntimeEnvGcsServiceServer::new(gcs.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let gcs_task = tokio::spawn(server);

    let (_d, port) = setup().gcs(gcs_addr.to_string()).start().await;
    let channel = channel(port).await;
    let mut driver = RayletDriverClient::new(channel.clone());
    let uri = "gcs://_ray_pkg_0123.zip".to_owned();
    driver
        .pin_runtime_env_uri(with_id(
            ClientPinRuntimeEnvUriRequest {
                uri: uri.clone(),
                expiration_s: 600,
            },
            "early",
        ))
        .await
        .expect("pin served");
    let exists = driver
        .kv_exists(with_id(
            KvExistsRequest {
                key: uri.clone().into_bytes(),
                namespace: None,
            },
            "early",
        ))
        .await
        .expect("exists served");
    assert!(!exists.get_ref().exists);
    let put = driver
        .kv_put(with_id(
            KvPutRequest {
                key: uri.clone().into_bytes(),
                value: b"zip".to_vec(),
                overwrite: true,
                namespace: None,
            },
            "early",
        ))
        .await
        .expect("put served");
    assert!(!put.get_ref().already_exists);
    assert_eq!(
        gcs.kv
            .lock()
            .expect("lock")
            .get(uri.as_bytes())
            .map(Vec::as_slice),
        Some(&b"zip"[..])
    );
    assert_eq!(*gcs.pinned.lock().expect("lock"), vec![uri.clone()]);
    let missing = driver
        .kv_get(with_id(
            KvGetRequest {
                key: b"missing".to_vec(),
                namespace: None,
            },
            "early",
        ))
        .await
        .expect("a missing key is an OK call");
    assert_eq!(missing.get_ref().value, None);

    // With a server, KV calls go there (the fake server has its own map).
    let c = TestClient::connect(port, "early", 30).await;
    let get = driver
        .kv_get(with_id(
            KvGetRequest {
                key: uri.clone().into_bytes(),
                namespace: None,
            },
            "early",
        ))
        .await
        .expect("get forwarded");
    assert_eq!(
        get.get_ref().value,
        None,
        "served by the GCS although the client has a server"
    );
    drop(c);
    gcs_task.abort();
}

/// kill -9 of the proxy module: its servers die with it, the host restarts
/// it, and clients can connect again.
#[tokio::test]
async fn proxy_killed_is_restarted_and_its_servers_do_not_outlive_it() {
    let (d, port) = setup().spare().start().await;
    let c = TestClient::connect(port, "before", 30).await;
    let server_pid = c.whoami().await["pid"].as_u64().expect("pid") as u32;
    let spare_ready = eventually(WAIT, || async {
        (clients_view(&d).await["spare_ready"] == true).then_some(())
    })
    .await;
    assert!(spare_ready.is_some(), "no spare server");
    let module = d.module(MODULE).await;
    kill(module["pid"].as_u64().expect("module pid"), Signal::SIGKILL);
    let dead = eventually(WAIT, || async { process_gone(server_pid).then_some(()) }).await;
    assert!(dead.is_some(), "a client server outlived its proxy");
    drop(c);
    d.healthy(MODULE, 1).await;
    let port = grpc_port(&d).await;
    let mut again = TestClient::connect(port, "after", 30).await;
    assert_eq!(again.num_clients().await, 1);
}

/// The warm spare waits for its client however long that takes: it is
/// started without Ray's idle exit (`TIMEOUT_FOR_SPECIFIC_SERVER_S`, which
/// the fake server honours like Ray's), so it is not replaced every half
/// minute, and a client that comes later gets it.
#[tokio::test]
async fn the_spare_server_does_not_idle_out() {
    let (d, port) = setup()
        .spare()
        .env("TIMEOUT_FOR_SPECIFIC_SERVER_S", "1")
        .start()
        .await;
    let spare = eventually(WAIT, || async {
        clients_view(&d).await["spare_pid"].as_u64()
    })
    .await
    .expect("a spare server") as u32;
    // Well past the 1 s after which such a server quits without a client.
    let watch_until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < watch_until {
        let view = clients_view(&d).await;
        assert_eq!(
            view["spare_pid"].as_u64(),
            Some(u64::from(spare)),
            "the spare idled out and was replaced: {view}"
        );
        assert!(!process_gone(spare), "the spare exited");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let c = TestClient::connect(port, "late", 30).await;
    assert_eq!(
        c.whoami().await["pid"].as_u64(),
        Some(u64::from(spare)),
        "the waiting spare was not the one given"
    );
}

/// A client that hangs up while its server is still starting leaves
/// nothing behind: the start runs to its end, and the server that comes up
/// for a client already forgotten is stopped and its port freed.
#[tokio::test]
async fn a_client_gone_while_its_server_starts_leaves_no_server() {
    let (d, port) = setup().env("FAKE_SERVER_DELAY_MS", "1500").start().await;
    let c = TestClient::open(channel(port).await, "hasty", false)
        .await
        .expect("data stream opens");
    c.sender
        .send(DataRequest {
            req_id: 1,
            r#type: Some(data_request::Type::Init(InitRequest {
                job_config: vec![],
                ray_init_kwargs: r#"{"runtime_env": {}}"#.into(),
                reconnect_grace_period: 1,
            })),
        })
        .await
        .expect("init sent");
    let starting = eventually(WAIT, || async {
        (clients_view(&d).await["ports_in_use"] == 1).then_some(())
    })
    .await;
    assert!(starting.is_some(), "no server start began");
    drop(c);
    let drained = eventually(Duration::from_secs(30), || async {
        let view = clients_view(&d).await;
        (view["ports_in_use"] == 0 && view["num_clients"] == 0).then_some(())
    })
    .await;
    assert!(drained.is_some(), "left behind: {}", clients_view(&d).await);
}

/// A server whose port another process listens on too (gRPC's servers set
/// SO_REUSEPORT, so both can bind it, and Ray's own proxier takes ports
/// from the same range) is not used: the kernel would split the client's
/// calls between the two. It is stopped and the client gets a server on
/// another port.
#[tokio::test]
async fn a_server_port_shared_with_a_stranger_is_given_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fake = bin_dir()
        .join("ray-dashd-fake-client-server")
        .display()
        .to_string();
    // Each server start says its port, then waits for the test's go-ahead.
    let script = r#"dir=$0; fake=$1; shift
for a; do case "$a" in --port=*) p=${a#--port=};; esac; done
echo "$p" > "$dir/port.new" && mv "$dir/port.new" "$dir/port"
i=0; while [ ! -e "$dir/go_$p" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
exec "$fake" "$@""#;
    let dir_arg = dir.path().display().to_string();
    let (d, port) = setup()
        .server_command(&["/bin/sh", "-c", script, &dir_arg, &fake])
        .env("FAKE_SERVER_REUSEPORT", "1")
        .start()
        .await;
    let started_on = |dir: std::path::PathBuf| async move {
        std::fs::read_to_string(dir.join("port"))
            .ok()
            .and_then(|text| text.trim().parse::<u16>().ok())
    };
    let connecting = tokio::spawn(async move { TestClient::connect(port, "shared", 30).await });
    let first = eventually(WAIT, || started_on(dir.path().to_path_buf()))
        .await
        .expect("a server start began");
    // The stranger: another listener on the same port, SO_REUSEPORT too.
    let stranger =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    stranger.set_reuse_port(true).expect("SO_REUSEPORT");
    stranger
        .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], first)).into())
        .expect("bind beside the server's port");
    stranger.listen(16).expect("listen");
    std::fs::write(dir.path().join(format!("go_{first}")), b"").expect("go");
    let second = eventually(WAIT, || async {
        started_on(dir.path().to_path_buf())
            .await
            .filter(|&p| p != first)
    })
    .await
    .expect("a server start on another port");
    std::fs::write(dir.path().join(format!("go_{second}")), b"").expect("go");
    let c = tokio::time::timeout(WAIT, connecting)
        .await
        .expect("connected in time")
        .expect("client connects");
    assert_eq!(
        c.whoami().await["port"].as_u64(),
        Some(u64::from(second)),
        "the client's server is not on the unshared port"
    );
    // `file_with` panics, quoting the file, if the proxy never says why.
    file_with(
        &d.session()
            .join("logs")
            .join(format!("dashboard_{MODULE}.err")),
        "another process listens",
    )
    .await;
    drop(stranger);
}

/// A port another process binds before the server's own bind (between
/// the pool's check and the server's start): the server never listens,
/// and the stranger accepts. Its calls must not go there: the server is
/// stopped and the client gets one on another port.
#[tokio::test]
async fn a_server_port_taken_before_the_server_binds_is_given_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fake = bin_dir()
        .join("ray-dashd-fake-client-server")
        .display()
        .to_string();
    // Each server start says its port and waits for the test; a port the
    // test marks `hang_` gets a server that never binds.
    let script = r#"dir=$0; fake=$1; shift
for a; do case "$a" in --port=*) p=${a#--port=};; esac; done
echo "$p" > "$dir/port.new" && mv "$dir/port.new" "$dir/port"
i=0; while [ ! -e "$dir/go_$p" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
if [ -e "$dir/hang_$p" ]; then i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 1; fi
exec "$fake" "$@""#;
    let dir_arg = dir.path().display().to_string();
    let (d, port) = setup()
        .server_command(&["/bin/sh", "-c", script, &dir_arg, &fake])
        .start()
        .await;
    let started_on = |dir: std::path::PathBuf| async move {
        std::fs::read_to_string(dir.join("port"))
            .ok()
            .and_then(|text| text.trim().parse::<u16>().ok())
    };
    let connecting = tokio::spawn(async move { TestClient::connect(port, "taken", 30).await });
    let first = eventually(WAIT, || started_on(dir.path().to_path_buf()))
        .await
        .expect("a server start began");
    let stranger = std::net::TcpListener::bind(("127.0.0.1", first)).expect("bind the port first");
    std::fs::write(dir.path().join(format!("hang_{first}")), b"").expect("hang");
    std::fs::write(dir.path().join(format!("go_{first}")), b"").expect("go");
    let second = eventually(WAIT, || async {
        started_on(dir.path().to_path_buf())
            .await
            .filter(|&p| p != first)
    })
    .await
    .expect("a server start on another port");
    std::fs::write(dir.path().join(format!("go_{second}")), b"").expect("go");
    let c = tokio::time::timeout(WAIT, connecting)
        .await
        .expect("connected in time")
        .expect("client connects");
    assert_eq!(
        c.whoami().await["port"].as_u64(),
        Some(u64::from(second)),
        "the client's server is not on a port of its own"
    );
    // What reached the stranger: the readiness probe's connects, and no byte.
    stranger.set_nonblocking(true).expect("nonblocking");
    let mut bytes = 0;
    while let Ok((mut conn, _)) = stranger.accept() {
        conn.set_nonblocking(true).expect("nonblocking");
        let mut buf = [0u8; 1024];
        while let Ok(n) = std::io::Read::read(&mut conn, &mut buf) {
            if n == 0 {
                break;
            }
            bytes += n;
        }
    }
    assert_eq!(bytes, 0, "a client's bytes reached the stranger");
    // `file_with` panics, quoting the file, if the proxy never says why.
    file_with(
        &d.session()
            .join("logs")
            .join(format!("dashboard_{MODULE}.err")),
        "another process listens",
    )
    .await;
}

/// The client port taken by another process (a plain listener of this
/// test standing in for Ray's own proxier): within seconds the module is
/// `waiting`, its reason naming the holder (pid and command) and both ways
/// out, said once in the host's log; it is not restarted past its
/// start-up timeout, its own retries back off, and it takes the port once
/// it is free.
#[tokio::test]
async fn a_taken_client_port_is_reported_plainly() {
    /// Longer than the module's start-up timeout below: it would have been
    /// restarted (at least once) within this.
    const WATCH: Duration = Duration::from_secs(5);
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = holder.local_addr().expect("addr").port().to_string();
    let proxy = bin_dir()
        .join("ray-dashd-client-proxy")
        .display()
        .to_string();
    let fake = bin_dir()
        .join("ray-dashd-fake-client-server")
        .display()
        .to_string();
    let d = dashd()
        .module(
            command_module(
                MODULE,
                &[
                    &proxy,
                    "--ray-client-port",
                    &taken,
                    "--server-command",
                    &fake,
                    "--port-range",
                    "auto",
                ],
            )
            .supervision("startup_timeout_secs", "2"),
        )
        .start();
    let holder_pid = format!("pid {}", std::process::id());
    let waiting = eventually(Duration::from_secs(5), || async {
        let module = d.module(MODULE).await;
        (module["state"] == "waiting").then_some(module)
    })
    .await;
    let Some(waiting) = waiting else {
        panic!(
            "the module is not waiting: {}\n{}",
            d.module(MODULE).await,
            d.log()
        );
    };
    let reason = waiting["reason"].as_str().unwrap_or("").to_owned();
    let test_binary = std::env::current_exe().expect("exe");
    let test_binary = test_binary.file_name().expect("name").to_string_lossy();
    for expected in [
        format!("port 127.0.0.1:{taken} is taken by {holder_pid} ("),
        test_binary.into_owned(),
        "--ray-client-server-port".to_owned(),
        "--ray-client-port".to_owned(),
    ] {
        assert!(reason.contains(&expected), "{expected} not in {reason:?}");
    }
    let pid = waiting["pid"].as_u64().expect("pid");
    // Watched past the start-up timeout: the same process, no restart, and
    // the module's own pause between tries growing.
    let mut pauses = Vec::new();
    let watch_until = std::time::Instant::now() + WATCH;
    while std::time::Instant::now() < watch_until {
        let module = d.module(MODULE).await;
        assert_eq!(module["state"], "waiting", "{module}");
        assert_eq!(module["pid"].as_u64(), Some(pid), "{module}");
        assert_eq!(module["restarts"], 0, "{module}");
        if let Some(pause) = module["backoff_ms"].as_u64() {
            if pauses.last() != Some(&pause) {
                pauses.push(pause);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        pauses.len() >= 2 && pauses.windows(2).all(|w| w[0] < w[1]),
        "the module's retries did not back off: {pauses:?}"
    );
    let said = d
        .log()
        .lines()
        .filter(|line| line.contains("module waiting") && line.contains(MODULE))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(said[0].contains(&holder_pid), "{}", said[0]);
    drop(holder);
    let healthy = eventually(Duration::from_secs(60), || async {
        let module = d.module(MODULE).await;
        (module["state"] == "healthy").then_some(module)
    })
    .await;
    let Some(healthy) = healthy else {
        panic!("module did not take the freed port\n{}", d.log());
    };
    assert_eq!(healthy["pid"].as_u64(), Some(pid), "{healthy}");
}

/// 500 clients at once, each with its own (fake) server; each call lands on
/// its own server, and the proxy's memory per client stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_clients() {
    const CLIENTS: usize = 500;
    let (d, port) = setup().start().await;
    let proxy_pid = d.module(MODULE).await["pid"].as_u64().expect("pid") as u32;
    let rss_before = crate::support::rss_kib(proxy_pid);
    let mut tasks = tokio::task::JoinSet::new();
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    for i in 0..CLIENTS {
        let limit = limit.clone();
        tasks.spawn(async move {
            let _turn = limit.acquire_owned().await.expect("semaphore");
            let c = TestClient::connect(port, &format!("c{i}"), 30).await;
            let who = c.whoami().await;
            assert_eq!(who["metadata"]["client_id"], format!("c{i}"));
            (c, who["port"].as_u64().expect("port"))
        });
    }
    let mut connected = vec![];
    while let Some(done) = tokio::time::timeout(Duration::from_secs(300), tasks.join_next())
        .await
        .expect("500 clients connect within 5 minutes")
    {
        connected.push(done.expect("client task"));
    }
    let ports: HashSet<u64> = connected.iter().map(|(_, p)| *p).collect();
    assert_eq!(ports.len(), CLIENTS, "clients shared servers");
    let (mut first, _) = connected.pop().expect("a client");
    assert_eq!(first.num_clients().await, CLIENTS as i32);
    let rss_after = crate::support::rss_kib(proxy_pid);
    let per_client = (rss_after.saturating_sub(rss_before)) as f64 / CLIENTS as f64;
    eprintln!("proxy RSS {rss_before} KiB -> {rss_after} KiB with {CLIENTS} clients: {per_client:.1} KiB per client");
    assert!(per_client < 256.0, "{per_client:.1} KiB per client");
    // Every client cleans up: all servers and ports go.
    connected.push((first, 0));
    let mut cleanups = tokio::task::JoinSet::new();
    for (c, _) in connected {
        cleanups.spawn(c.cleanup());
    }
    while cleanups.join_next().await.is_some() {}
    let drained = eventually(Duration::from_secs(120), || async {
        let view = clients_view(&d).await;
        (view["ports_in_use"] == 0 && view["num_clients"] == 0).then_some(())
    })
    .await;
    assert!(
        drained.is_some(),
        "servers left: {}",
        clients_view(&d).await["ports_in_use"]
    );
}

/// A driver call as it reached the server: path, metadata, request body.
type Seen = (String, http::HeaderMap, bytes::Bytes);

/// A server the test controls, standing in for a client's server: `init`
/// is answered ok; `KVPut` answers with response metadata; `GetObject`
/// sends one chunk, then nothing until its connection goes. The driver
/// calls are recorded as they arrived.
#[derive(Debug, Clone, Default)]
struct Controlled {
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[tonic::async_trait]
impl RayletDriver for Controlled {
    async fn kv_put(
        &self,
        _request: Request<KvPutRequest>,
    ) -> Result<tonic::Response<KvPutResponse>, tonic::Status> {
        let mut response = tonic::Response::new(KvPutResponse {
            already_exists: true,
        });
        response
            .metadata_mut()
            .insert("x-served-by", "controlled".parse().expect("ascii"));
        Ok(response)
    }

    async fn get_object(
        &self,
        _request: Request<GetRequest>,
    ) -> Result<tonic::Response<tonic::codegen::BoxStream<GetResponse>>, tonic::Status> {
        let first = GetResponse {
            valid: true,
            data: vec![1; 1 << 20],
            chunk_id: 0,
            total_chunks: 2,
            ..Default::default()
        };
        let chunks = futures_util::stream::once(std::future::ready(Ok(first)))
            .chain(futures_util::stream::pending());
        Ok(tonic::Response::new(Box::pin(chunks)))
    }
}

#[tonic::async_trait]
impl RayletDataStreamer for Controlled {
    async fn datapath(
        &self,
        request: Request<Streaming<DataRequest>>,
    ) -> Result<tonic::Response<tonic::codegen::BoxStream<DataResponse>>, tonic::Status> {
        let answers = request.into_inner().filter_map(|r| {
            std::future::ready(match r {
                Ok(DataRequest {
                    req_id,
                    r#type: Some(data_request::Type::Init(_)),
                }) => Some(Ok(DataResponse {
                    req_id,
                    r#type: Some(data_response::Type::Init(InitResponse {
                        ok: true,
                        msg: String::new(),
                    })),
                })),
                _ => None,
            })
        });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

/// Records each driver call's path, metadata and body, then hands the call
/// on to the generated server.
#[derive(Debug, Clone)]
struct Recording(RayletDriverServer<Controlled>, Controlled);

impl tonic::server::NamedService for Recording {
    const NAME: &'static str = "ray.rpc.RayletDriver";
}

impl tower::Service<http::Request<tonic::body::Body>> for Recording {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let (mut inner, seen) = (self.0.clone(), self.1.seen.clone());
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = http_body_util::BodyExt::collect(body)
                .await
                .expect("request body")
                .to_bytes();
            seen.lock().expect("lock").push((
                parts.uri.path().to_owned(),
                parts.headers.clone(),
                bytes.clone(),
            ));
            let body = tonic::body::Body::new(http_body_util::Full::new(bytes));
            tower::Service::call(&mut inner, http::Request::from_parts(parts, body)).await
        })
    }
}

/// Passes every connection to `listener` on to `to`. Aborting the task
/// drops them all at once, as a server's death does; setting `frozen`
/// stops every byte while the connections stay open, as a hung server
/// does.
fn relay(
    listener: tokio::net::TcpListener,
    to: std::net::SocketAddr,
    frozen: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    async fn pass(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        frozen: Arc<std::sync::atomic::AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if frozen.load(std::sync::atomic::Ordering::SeqCst) {
                // Hung: hold both ends, pass nothing more.
                std::future::pending::<()>().await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }
    tokio::spawn(async move {
        let mut links = tokio::task::JoinSet::new();
        while let Ok((inbound, _)) = listener.accept().await {
            let frozen = frozen.clone();
            links.spawn(async move {
                if let Ok(outbound) = tokio::net::TcpStream::connect(to).await {
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::join!(
                        pass(in_read, out_write, frozen.clone()),
                        pass(out_read, in_write, frozen)
                    );
                }
            });
        }
    })
}

/// A proxy (with `args`) whose client `id` got the test's own `Controlled`
/// server in place of a server process: the process the proxy starts only
/// says its port, and the test serves that port through a [`relay`].
struct ControlledSetup {
    d: Dashd,
    controlled: Controlled,
    server_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    server_port: u16,
    link: tokio::task::JoinHandle<()>,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    client_channel: Channel,
    _client: TestClient,
    _dir: tempfile::TempDir,
}

async fn controlled_setup(id: &str, args: &[&str]) -> ControlledSetup {
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("port");
    let marker_arg = marker.display().to_string();
    let script = r#"for a; do case "$a" in --port=*) echo "${a#--port=}" > "$0.new" && mv "$0.new" "$0";; esac; done; exec sleep 600"#;
    // The test's relay, not the server's process, listens on the port.
    let mut proxy = setup()
        .server_command(&["/bin/sh", "-c", script, &marker_arg])
        .arg("--own-listener")
        .arg("false");
    for arg in args {
        proxy = proxy.arg(arg);
    }
    let (d, port) = proxy.start().await;

    let controlled = Controlled::default();
    let inner = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the controlled server");
    let inner_addr = inner.local_addr().expect("addr");
    let server_task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Recording(
                RayletDriverServer::new(controlled.clone()),
                controlled.clone(),
            ))
            .add_service(RayletDataStreamerServer::new(controlled.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(inner)),
    );

    let client_channel = channel(port).await;
    let owned_id = id.to_owned();
    let connecting = tokio::spawn(async move { TestClient::connect(port, &owned_id, 30).await });
    let server_port: u16 = eventually(WAIT, || async {
        std::fs::read_to_string(&marker)
            .ok()
            .and_then(|text| text.trim().parse().ok())
    })
    .await
    .expect("the server command was started");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", server_port))
        .await
        .expect("bind the server's port");
    let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let link = relay(listener, inner_addr, frozen.clone());
    let client = connecting.await.expect("client connects");
    ControlledSetup {
        d,
        controlled,
        server_task,
        server_port,
        link,
        frozen,
        client_channel,
        _client: client,
        _dir: dir,
    }
}

/// A `GetObject` for `id` whose first chunk has arrived.
async fn half_answered_get(channel: &Channel, id: &str) -> Streaming<GetResponse> {
    let mut chunks = RayletDriverClient::new(channel.clone())
        .max_decoding_message_size(usize::MAX)
        .get_object(with_id(
            GetRequest {
                ids: vec![vec![1]],
                ..Default::default()
            },
            id,
        ))
        .await
        .expect("GetObject answered")
        .into_inner();
    let first = tokio::time::timeout(WAIT, chunks.message())
        .await
        .expect("first chunk in time")
        .expect("first chunk")
        .expect("a chunk");
    assert_eq!(first.data.len(), 1 << 20);
    chunks
}

/// The metadata and request bytes of driver calls reach the server as the
/// client sent them and its answer metadata comes back; a `GetObject`
/// whose server dies mid-answer ends with UNAVAILABLE naming the server's
/// port, not a hang.
#[tokio::test]
async fn driver_calls_pass_through_and_a_server_death_mid_answer_is_unavailable() {
    let ControlledSetup {
        d,
        controlled,
        server_task,
        server_port,
        link,
        client_channel,
        ..
    } = controlled_setup("mortal", &[]).await;

    // A unary call that goes through untouched, metadata both ways.
    let put = KvPutRequest {
        key: vec![0, 255, 7],
        value: (0..=255).collect(),
        overwrite: true,
        namespace: Some("ns".into()),
    };
    let mut request = with_id(put.clone(), "mortal");
    request
        .metadata_mut()
        .insert("x-test", "forwarded".parse().expect("ascii"));
    request.metadata_mut().insert_bin(
        "x-raw-bin",
        tonic::metadata::MetadataValue::from_bytes(&[0, 1, 254, 255]),
    );
    request.set_timeout(Duration::from_secs(7));
    let answer = RayletDriverClient::new(client_channel.clone())
        .kv_put(request)
        .await
        .expect("KVPut forwarded");
    assert!(answer.get_ref().already_exists);
    assert_eq!(
        answer.metadata().get("x-served-by").expect("metadata back"),
        "controlled"
    );

    let seen = controlled.seen.lock().expect("lock").clone();
    let (path, headers, body) = seen
        .iter()
        .find(|(path, ..)| path.ends_with("/KVPut"))
        .expect("KVPut reached the server");
    assert_eq!(path, "/ray.rpc.RayletDriver/KVPut");
    let message = put.encode_to_vec();
    let mut framed = vec![0];
    framed.extend((message.len() as u32).to_be_bytes());
    framed.extend(&message);
    assert_eq!(body.as_ref(), framed.as_slice(), "request bytes changed");
    assert_eq!(headers["client_id"], "mortal");
    assert_eq!(headers["x-test"], "forwarded");
    assert_eq!(headers["x-raw-bin"], "AAH+/w");
    assert_eq!(headers["te"], "trailers");
    assert_eq!(headers["content-type"], "application/grpc");
    assert!(headers.contains_key("grpc-timeout"), "{headers:?}");
    let user_agent = headers["user-agent"].to_str().expect("ascii");
    assert!(
        user_agent.starts_with("tonic/"),
        "the client's user-agent: {user_agent}"
    );
    assert!(!headers.contains_key("host"), "{headers:?}");

    // A request far larger than the server's stream window (h2's default
    // 64 KiB here) goes on in pieces as the server grants room, unchanged.
    let big = KvPutRequest {
        key: b"big".to_vec(),
        value: (0..3u32 << 20).map(|i| (i % 253) as u8).collect(),
        overwrite: true,
        namespace: None,
    };
    RayletDriverClient::new(client_channel.clone())
        .max_encoding_message_size(usize::MAX)
        .kv_put(with_id(big.clone(), "mortal"))
        .await
        .expect("a 3 MiB KVPut forwarded");
    let seen = controlled.seen.lock().expect("lock").clone();
    let (_, _, body) = seen
        .iter()
        .rfind(|(path, ..)| path.ends_with("/KVPut"))
        .expect("the big KVPut reached the server");
    let message = big.encode_to_vec();
    assert_eq!(body.len(), PREFIX + message.len(), "request size changed");
    assert!(body[PREFIX..] == message[..], "request bytes changed");

    // The server dies while a GetObject answer is half sent.
    let mut chunks = half_answered_get(&client_channel, "mortal").await;
    let server_pid = entry(&d, "mortal").await.expect("listed")["server_pid"]
        .as_u64()
        .expect("server pid");
    kill(server_pid, Signal::SIGKILL);
    link.abort();
    let ended = tokio::time::timeout(WAIT, chunks.message())
        .await
        .expect("the answer ends, not hangs");
    let status = ended.expect_err("a broken answer is an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&server_port.to_string()),
        "the status names the server: {status:?}"
    );
    server_task.abort();
}

/// A server that hangs in the middle of a `GetObject` answer (its
/// connection open, nothing answered, pings included) is found out by the
/// proxy's pings: the call ends with UNAVAILABLE naming the server rather
/// than waiting for ever.
#[tokio::test]
async fn a_hung_server_fails_its_calls_with_unavailable() {
    let setup = controlled_setup("stuck", &["--server-ping", "1s"]).await;
    let mut chunks = half_answered_get(&setup.client_channel, "stuck").await;
    setup
        .frozen
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let ended = tokio::time::timeout(WAIT, chunks.message())
        .await
        .expect("the answer ends, not hangs");
    let status = ended.expect_err("a hung answer is an error");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains(&setup.server_port.to_string()),
        "the status names the server: {status:?}"
    );
    setup.link.abort();
    setup.server_task.abort();
}
