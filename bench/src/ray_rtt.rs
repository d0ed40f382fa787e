//! `ray-rtt`: what one hop through a Ray Client proxy costs per message,
//! against fake specific servers (no Ray in the way).
//!
//! One client connects as Ray's does, then makes, one at a time (closed
//! loop), `--iterations` of each of: a `Datapath` request and its answer (a
//! `get` of an unknown object: passed through untouched by a proxy, answered
//! at once by the fake), a unary `ClusterInfo` call, and a `GetObject`
//! server-streaming call (three small chunks from the fake). The same run
//! straight against a fake server gives the no-proxy baseline. The client
//! ends with a `connection_cleanup`, as Ray's does on `ray.shutdown()`.

use std::time::{Duration, Instant};

use ray_proto::rpc::raylet_driver_client::RayletDriverClient;
use ray_proto::rpc::{data_request, ConnectionCleanupRequest, DataRequest, GetRequest};
use serde_json::json;

use crate::procfs;
use crate::ray_clients::{self, cluster_info, next_answer, percentile, with_id, Held};

/// What to measure.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Where to connect: a proxy's client port or a fake server's port.
    pub(crate) target: std::net::SocketAddr,
    /// Measured operations of each kind.
    pub(crate) iterations: usize,
    /// Unmeasured operations of each kind first.
    pub(crate) warmup: usize,
    /// The proxy's pid, whose CPU time per operation is reported.
    pub(crate) proxy_pid: Option<u32>,
    /// Kernel clock ticks per second.
    pub(crate) clk_tck: u64,
    /// The client's `client_id`.
    pub(crate) id: String,
    /// Which operations to time: `datapath`, `unary`, `get_object`.
    pub(crate) kinds: Vec<String>,
}

async fn datapath_get(client: &mut Held, req_id: i32) -> anyhow::Result<()> {
    client
        .data
        .send(DataRequest {
            req_id,
            r#type: Some(data_request::Type::Get(GetRequest {
                ids: vec![b"no-such-object".to_vec()],
                ..Default::default()
            })),
        })
        .await?;
    let answer = next_answer(&mut client.answers)
        .await
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(answer.req_id == req_id, "answer to another request");
    Ok(())
}

async fn get_object(client: &Held) -> anyhow::Result<()> {
    let mut chunks = RayletDriverClient::new(client.channel.clone())
        .get_object(with_id(
            GetRequest {
                ids: vec![b"x".to_vec()],
                ..Default::default()
            },
            &client.id,
        )?)
        .await?
        .into_inner();
    let mut n = 0;
    while chunks.message().await?.is_some() {
        n += 1;
    }
    anyhow::ensure!(n > 0, "GetObject streamed nothing");
    Ok(())
}

/// Times `iterations` runs of one kind of operation.
macro_rules! measure {
    ($plan:expr, $op:expr) => {{
        for _ in 0..$plan.warmup {
            $op.await?;
        }
        let ticks = $plan.proxy_pid.map(procfs::process_ticks).transpose()?;
        let mut us = Vec::with_capacity($plan.iterations);
        let started = Instant::now();
        for _ in 0..$plan.iterations {
            let t0 = Instant::now();
            $op.await?;
            us.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let elapsed = started.elapsed();
        let cpu_us = match ($plan.proxy_pid, ticks) {
            (Some(pid), Some(before)) => Some(
                procfs::process_ticks(pid)?.saturating_sub(before) as f64 * 1e6
                    / $plan.clk_tck.max(1) as f64
                    / $plan.iterations as f64,
            ),
            _ => None,
        };
        us.sort_by(f64::total_cmp);
        json!({
            "median_us": percentile(&us, 50.0),
            "p90_us": percentile(&us, 90.0),
            "p99_us": percentile(&us, 99.0),
            "ops_per_s": $plan.iterations as f64 / elapsed.as_secs_f64(),
            "proxy_cpu_us_per_op": cpu_us,
        })
    }};
}

/// Runs the three measurements; one JSON object.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    let connect_plan = ray_clients::Plan {
        target: plan.target,
        max: 1,
        timeout: Duration::from_secs(60),
        max_errors: 1,
        // Nothing to resume: a proxy may drop this client at once.
        grace: 0,
        logstream: true,
        proxy_pid: None,
        clk_tck: plan.clk_tck,
        id_prefix: String::new(),
    };
    let mut client = ray_clients::connect(&connect_plan, &plan.id)
        .await
        .map_err(|f| anyhow::anyhow!("connecting: {}: {}", f.stage, f.error))?;
    let mut out = serde_json::Map::new();
    let mut req_id = 10;
    for kind in &plan.kinds {
        let measured = match kind.as_str() {
            "datapath" => measure!(plan, {
                req_id += 1;
                datapath_get(&mut client, req_id)
            }),
            "unary" => measure!(plan, async {
                cluster_info(&client.channel, &client.id)
                    .await
                    .map_err(anyhow::Error::msg)
            }),
            "get_object" => measure!(plan, get_object(&client)),
            other => anyhow::bail!("unknown kind {other}: datapath, unary or get_object"),
        };
        out.insert(kind.clone(), measured);
    }
    // Leave as Ray's client does on ray.shutdown(), so that no proxy keeps
    // this client for a reconnect.
    req_id += 1;
    client
        .data
        .send(DataRequest {
            req_id,
            r#type: Some(data_request::Type::ConnectionCleanup(
                ConnectionCleanupRequest {},
            )),
        })
        .await?;
    next_answer(&mut client.answers)
        .await
        .map_err(anyhow::Error::msg)?;
    out.insert("target".into(), plan.target.to_string().into());
    out.insert("iterations".into(), plan.iterations.into());
    Ok(out.into())
}
