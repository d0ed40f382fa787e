//! Streaming throughput: one large GET at a time, its body drained and
//! counted, timed from writing the request to the body's last byte.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::net::{self, Target};
use crate::procfs::CpuMeter;

/// The longest one transfer may take.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);

/// Makes `runs` transfers one after another; reports the best and each one.
pub(crate) async fn run(
    target: &Target,
    path: &str,
    expect_bytes: Option<u64>,
    runs: usize,
    cpu_pids: &[u32],
    clk_tck: u64,
) -> anyhow::Result<serde_json::Value> {
    let mut rates = Vec::with_capacity(runs);
    let mut bytes = 0;
    let mut total_bytes = 0u64;
    let cpu = CpuMeter::start(cpu_pids, clk_tck)?;
    for _ in 0..runs {
        let mut sender = net::open(target).await?;
        let t0 = Instant::now();
        let net::Drained {
            status, bytes: n, ..
        } = tokio::time::timeout(
            TRANSFER_TIMEOUT,
            net::get_drained(&mut sender, target, path),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!("GET {path} on {target}: not done in {TRANSFER_TIMEOUT:?}")
        })??;
        let secs = t0.elapsed().as_secs_f64();
        if !status.is_success() {
            anyhow::bail!("GET {path} on {target} answered {status}");
        }
        if let Some(want) = expect_bytes {
            if n != want {
                anyhow::bail!("GET {path} on {target}: {n} bytes, expected {want}");
            }
        }
        bytes = n;
        total_bytes += n;
        rates.push(n as f64 / (1024.0 * 1024.0) / secs);
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let mut out = json!({
        "mib_per_s": best,
        "median_mib_per_s": median,
        "runs_mib_per_s": rates,
        "bytes": bytes,
    });
    if cpu.is_active() && total_bytes > 0 {
        let gib = total_bytes as f64 / (1u64 << 30) as f64;
        out["cpu_ms_per_gib"] = json!(cpu.elapsed_us()? / 1000.0 / gib);
    }
    Ok(out)
}
