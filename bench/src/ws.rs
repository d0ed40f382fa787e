//! Websocket echo load: N websockets, each sending a small text message and
//! waiting for its echo before sending the next.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::net::{self, micros, BoxIo, Target};
use crate::procfs::CpuMeter;

/// What to run.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) target: Target,
    pub(crate) path: String,
    pub(crate) connections: usize,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) message_bytes: usize,
    pub(crate) cpu_pids: Vec<u32>,
    pub(crate) clk_tck: u64,
}

/// How long past the end of the window an echo may still take before the
/// run gives up on it.
const GRACE: Duration = Duration::from_secs(10);
/// How long opening one websocket may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Tally {
    hist: Histogram<u64>,
    messages: u64,
    error: Option<String>,
}

type Socket = tokio_tungstenite::WebSocketStream<BoxIo>;

async fn open(target: &Target, path: &str) -> anyhow::Result<Socket> {
    tokio::time::timeout(OPEN_TIMEOUT, open_unbounded(target, path))
        .await
        .map_err(|_| anyhow::anyhow!("websocket to {target}{path}: not open in {OPEN_TIMEOUT:?}"))?
}

async fn open_unbounded(target: &Target, path: &str) -> anyhow::Result<Socket> {
    let io = target.connect().await?;
    let url = format!("ws://{}{}", target.authority(), path);
    let (socket, _) = tokio_tungstenite::client_async(url.as_str(), io)
        .await
        .with_context(|| format!("websocket handshake with {target} for {path}"))?;
    Ok(socket)
}

/// Runs the plan and returns its JSON summary.
pub(crate) async fn run(plan: Plan) -> anyhow::Result<serde_json::Value> {
    // All sockets open before the clock starts; a failure here is fatal.
    let mut sockets = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        sockets.push(open(&plan.target, &plan.path).await?);
    }
    let payload: String = "abcdefghijklmnopqrstuvwxyz0123456789"
        .chars()
        .cycle()
        .take(plan.message_bytes)
        .collect();
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let until = measure_from + plan.duration;
    let workers: Vec<_> = sockets
        .into_iter()
        .map(|socket| tokio::spawn(worker(socket, payload.clone(), measure_from, until)))
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu = CpuMeter::start(&plan.cpu_pids, plan.clk_tck)?;
    let window_start = Instant::now();
    let mut hist = net::histogram();
    let mut messages = 0;
    let mut errors = 0;
    let mut first_error = None;
    for w in workers {
        let t = w.await?;
        hist.add(&t.hist)?;
        messages += t.messages;
        if let Some(e) = t.error {
            errors += 1;
            first_error.get_or_insert(e);
        }
    }
    let elapsed = window_start.elapsed().as_secs_f64();
    let mut out = json!({
        "msgs_per_s": messages as f64 / elapsed,
        "p50_us": hist.value_at_quantile(0.50),
        "p99_us": hist.value_at_quantile(0.99),
        "messages": messages,
        "errors": errors,
        "seconds": elapsed,
        "connections": plan.connections,
    });
    if cpu.is_active() && messages > 0 {
        out["cpu_us_per_msg"] = json!(cpu.elapsed_us()? / messages as f64);
    }
    if let Some(e) = first_error {
        out["first_error"] = json!(e);
    }
    Ok(out)
}

/// One websocket's echo loop; a broken socket ends it with an error.
async fn worker(
    mut socket: Socket,
    payload: String,
    measure_from: Instant,
    until: Instant,
) -> Tally {
    let mut tally = Tally {
        hist: net::histogram(),
        messages: 0,
        error: None,
    };
    let result: anyhow::Result<()> = async {
        loop {
            let t0 = Instant::now();
            if t0 >= until {
                break;
            }
            let exchange = echo(&mut socket, &payload);
            tokio::time::timeout_at((until + GRACE).into(), exchange)
                .await
                .map_err(|_| anyhow::anyhow!("no echo within {GRACE:?} of the end"))??;
            if t0 >= measure_from {
                tally.hist.saturating_record(micros(t0.elapsed()));
                tally.messages += 1;
            }
        }
        let _ = tokio::time::timeout(GRACE, socket.close(None)).await;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        tally.error = Some(format!("{e:#}"));
    }
    tally
}

/// Sends one message and waits for its echo.
pub(crate) async fn echo(socket: &mut Socket, payload: &str) -> anyhow::Result<()> {
    socket.send(Message::text(payload)).await.context("send")?;
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(echo))) => {
                if echo.len() != payload.len() {
                    anyhow::bail!("echo of {} bytes, sent {}", echo.len(), payload.len());
                }
                return Ok(());
            }
            Some(Ok(Message::Close(frame))) => anyhow::bail!("closed by peer: {frame:?}"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(e).context("receive"),
            None => anyhow::bail!("connection ended"),
        }
    }
}
