//! `ray-clients`: how many Ray clients a Ray Client proxy serves at once.
//!
//! Clients connect one after another over a TCP connection each, as an
//! unmodified Ray client does (a `ClusterInfo` PING; `Datapath` with the
//! `client_id` and `reconnecting` metadata, whose first message is `init`;
//! `Logstream` with its `LogSettingsRequest`; `connection_info`), then make
//! one `ClusterInfo` call, and stay connected. The ramp stops at `--max`, at
//! the first client that does not finish within `--timeout` (the proxy is
//! saturated), or after `--max-errors` clients failed otherwise. With
//! every client still connected, each makes one more `ClusterInfo` call.
//!
//! `Logstream` is opened once `init` has been answered, not before: Ray's
//! proxier finds the client's server for a `Logstream` only once the
//! `Datapath` has registered the client, and this client cannot see when
//! that happened. Either order holds the same streams open.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt;
use ray_proto::rpc::cluster_info_type::TypeEnum as ClusterInfoType;
use ray_proto::rpc::raylet_data_streamer_client::RayletDataStreamerClient;
use ray_proto::rpc::raylet_driver_client::RayletDriverClient;
use ray_proto::rpc::raylet_log_streamer_client::RayletLogStreamerClient;
use ray_proto::rpc::{
    data_request, data_response, ClusterInfoRequest, ConnectionInfoRequest, DataRequest,
    DataResponse, InitRequest, LogData, LogSettingsRequest,
};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Streaming};

use crate::procfs;

/// What the ramp does.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The proxy's client port (loopback).
    pub(crate) target: SocketAddr,
    /// Stop after this many clients.
    pub(crate) max: usize,
    /// A client that has not finished connecting and its call in this long
    /// means the proxy is saturated: the ramp stops.
    pub(crate) timeout: Duration,
    /// Stop after this many clients failed (other than by a timeout).
    pub(crate) max_errors: usize,
    /// Seconds the proxy keeps a dropped client's server (`init`'s
    /// `reconnect_grace_period`; Ray's client sends 30).
    pub(crate) grace: i32,
    /// Open a `Logstream` per client, as Ray's client does.
    pub(crate) logstream: bool,
    /// The proxy's pid, whose RSS and CPU time are reported.
    pub(crate) proxy_pid: Option<u32>,
    /// Kernel clock ticks per second.
    pub(crate) clk_tck: u64,
    /// A prefix for the `client_id`s, so that two runs never share one.
    pub(crate) id_prefix: String,
}

/// One connected client; dropping it closes its connection.
#[derive(Debug)]
pub(crate) struct Held {
    /// Its `client_id`.
    pub(crate) id: String,
    /// Its connection.
    pub(crate) channel: Channel,
    /// Its `Datapath` requests (req_id 1 and 2 are taken).
    pub(crate) data: mpsc::Sender<DataRequest>,
    /// Its `Datapath` answers.
    pub(crate) answers: Streaming<DataResponse>,
    _log_settings: Option<mpsc::Sender<LogSettingsRequest>>,
    _logs: Option<Streaming<LogData>>,
}

/// Where a client's connection failed.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The step that failed: connect, ping, datapath, init, logstream,
    /// connection_info or cluster_info.
    pub(crate) stage: &'static str,
    /// Why.
    pub(crate) error: String,
}

pub(crate) fn with_id<T>(message: T, id: &str) -> anyhow::Result<Request<T>> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("client_id", id.parse().context("client id is not ASCII")?);
    Ok(request)
}

/// One `ClusterInfo(NODES)` call as client `id`.
pub(crate) async fn cluster_info(channel: &Channel, id: &str) -> Result<(), String> {
    RayletDriverClient::new(channel.clone())
        .cluster_info(
            with_id(
                ClusterInfoRequest {
                    r#type: ClusterInfoType::Nodes as i32,
                },
                id,
            )
            .map_err(|e| e.to_string())?,
        )
        .await
        .map(|_| ())
        .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

/// Connects one client the way Ray's client does; the stage that failed.
pub(crate) async fn connect(plan: &Plan, id: &str) -> Result<Held, Failure> {
    let fail = |stage: &'static str| move |error: String| Failure { stage, error };
    let channel = Endpoint::from_shared(format!("http://{}", plan.target))
        .map_err(|e| fail("connect")(e.to_string()))?
        .connect_timeout(plan.timeout)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| fail("connect")(format!("{e:#}")))?;
    RayletDriverClient::new(channel.clone())
        .cluster_info(ClusterInfoRequest {
            r#type: ClusterInfoType::Ping as i32,
        })
        .await
        .map_err(|s| fail("ping")(format!("{:?}: {}", s.code(), s.message())))?;

    // The init waits in the stream's buffer: a proxy may send the stream's
    // response headers only with its first answer.
    let (data, data_rx) = mpsc::channel(4);
    data.send(DataRequest {
        req_id: 1,
        r#type: Some(data_request::Type::Init(InitRequest {
            job_config: vec![],
            ray_init_kwargs: r#"{"runtime_env": {}, "_skip_env_hook": true}"#.into(),
            reconnect_grace_period: plan.grace,
        })),
    })
    .await
    .map_err(|e| fail("init")(e.to_string()))?;
    let mut request =
        with_id(ReceiverStream::new(data_rx), id).map_err(|e| fail("datapath")(e.to_string()))?;
    request.metadata_mut().insert(
        "reconnecting",
        tonic::metadata::MetadataValue::from_static("False"),
    );
    let mut answers = RayletDataStreamerClient::new(channel.clone())
        .datapath(request)
        .await
        .map_err(|s| fail("datapath")(format!("{:?}: {}", s.code(), s.message())))?
        .into_inner();
    let init = next_answer(&mut answers).await.map_err(fail("init"))?;
    match init.r#type {
        Some(data_response::Type::Init(init)) if init.ok => {}
        Some(data_response::Type::Init(init)) => {
            return Err(fail("init")(format!(
                "init refused: {}",
                first_line(&init.msg)
            )))
        }
        other => return Err(fail("init")(format!("not an init answer: {other:?}"))),
    }

    let (log_settings, logs) = if plan.logstream {
        let (tx, rx) = mpsc::channel(1);
        tx.send(LogSettingsRequest {
            enabled: true,
            loglevel: 20,
        })
        .await
        .map_err(|e| fail("logstream")(e.to_string()))?;
        let logs = RayletLogStreamerClient::new(channel.clone())
            .logstream(
                with_id(ReceiverStream::new(rx), id)
                    .map_err(|e| fail("logstream")(e.to_string()))?,
            )
            .await
            .map_err(|s| fail("logstream")(format!("{:?}: {}", s.code(), s.message())))?
            .into_inner();
        (Some(tx), Some(logs))
    } else {
        (None, None)
    };

    data.send(DataRequest {
        req_id: 2,
        r#type: Some(data_request::Type::ConnectionInfo(ConnectionInfoRequest {})),
    })
    .await
    .map_err(|e| fail("connection_info")(e.to_string()))?;
    let info = next_answer(&mut answers)
        .await
        .map_err(fail("connection_info"))?;
    if !matches!(info.r#type, Some(data_response::Type::ConnectionInfo(_))) {
        return Err(fail("connection_info")(format!(
            "not a connection_info answer: {:?}",
            info.r#type
        )));
    }
    cluster_info(&channel, id)
        .await
        .map_err(fail("cluster_info"))?;
    Ok(Held {
        id: id.to_owned(),
        channel,
        data,
        answers,
        _log_settings: log_settings,
        _logs: logs,
    })
}

/// The next `Datapath` answer.
pub(crate) async fn next_answer(
    answers: &mut Streaming<DataResponse>,
) -> Result<DataResponse, String> {
    match answers.message().await {
        Ok(Some(answer)) => Ok(answer),
        Ok(None) => Err("the data stream ended".into()),
        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
    }
}

fn first_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted.get(rank).copied()
}

/// Runs the ramp; one JSON object.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    let rss = |pid: Option<u32>| pid.and_then(|p| procfs::status_kib(p, "VmRSS").ok());
    let rss_before = rss(plan.proxy_pid);
    let cpu_before = plan.proxy_pid.and_then(|p| procfs::process_ticks(p).ok());
    let started = Instant::now();
    let mut held: Vec<Held> = Vec::with_capacity(plan.max);
    let mut latencies_ms = Vec::with_capacity(plan.max);
    let mut errors: Vec<serde_json::Value> = vec![];
    let mut saturated: Option<serde_json::Value> = None;
    for i in 0..plan.max {
        let id = format!("{}-{i}", plan.id_prefix);
        let t0 = Instant::now();
        match tokio::time::timeout(plan.timeout, connect(&plan, &id)).await {
            Ok(Ok(client)) => {
                latencies_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                held.push(client);
            }
            Ok(Err(failure)) => {
                errors.push(json!({
                    "client": i + 1,
                    "stage": failure.stage,
                    "error": failure.error,
                    "after_ms": t0.elapsed().as_millis() as u64,
                    "held": held.len(),
                }));
                if errors.len() >= plan.max_errors {
                    break;
                }
            }
            Err(_) => {
                saturated = Some(json!({
                    "client": i + 1,
                    "held": held.len(),
                    "timeout_s": plan.timeout.as_secs_f64(),
                }));
                break;
            }
        }
    }
    let ramp_s = started.elapsed().as_secs_f64();
    let rss_after = rss(plan.proxy_pid);
    let cpu_ms = match (plan.proxy_pid, cpu_before) {
        (Some(pid), Some(before)) => procfs::process_ticks(pid)
            .ok()
            .map(|after| after.saturating_sub(before) as f64 * 1e3 / plan.clk_tck.max(1) as f64),
        _ => None,
    };

    // Every client still connected makes one more call; a saturated proxy
    // may not answer them, so each is bounded.
    let verify_started = Instant::now();
    let answered = futures_util::stream::iter(held.iter())
        .map(|c| async move {
            tokio::time::timeout(plan.timeout, cluster_info(&c.channel, &c.id))
                .await
                .is_ok_and(|r| r.is_ok())
        })
        .buffer_unordered(64)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let verify_s = verify_started.elapsed().as_secs_f64();

    latencies_ms.sort_by(f64::total_cmp);
    let per_client_kib = match (rss_before, rss_after) {
        (Some(b), Some(a)) if !held.is_empty() => Some((a as f64 - b as f64) / held.len() as f64),
        _ => None,
    };
    Ok(json!({
        "target": plan.target.to_string(),
        "max": plan.max,
        "held": held.len(),
        "answered_after": answered,
        "reached_max": held.len() == plan.max,
        "saturated": saturated,
        "errors": errors.len(),
        "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
        "ramp_s": ramp_s,
        "verify_s": verify_s,
        "connect_ms_p50": percentile(&latencies_ms, 50.0),
        "connect_ms_p99": percentile(&latencies_ms, 99.0),
        "connect_ms_max": latencies_ms.last(),
        "logstream": plan.logstream,
        "proxy_rss_before_kib": rss_before,
        "proxy_rss_after_kib": rss_after,
        "proxy_kib_per_client": per_client_kib,
        "proxy_cpu_ms": cpu_ms,
    }))
}
