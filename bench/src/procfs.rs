//! A process's CPU time and memory peaks, read from `/proc` through
//! ray-dashd-contract's reader.

use anyhow::Context as _;
use ray_dashd_contract::proc;
use serde_json::json;

/// utime + stime, in clock ticks, of every thread of `pid` (not of its
/// children).
pub(crate) fn process_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = proc::stat(pid).with_context(|| format!("read /proc/{pid}/stat"))?;
    Ok(stat.utime + stat.stime)
}

/// The summed utime + stime of `pids`, in clock ticks.
pub(crate) fn cpu_ticks(pids: &[u32]) -> anyhow::Result<u64> {
    pids.iter().map(|&p| process_ticks(p)).sum()
}

/// CPU time of a set of processes over a window, in microseconds.
#[derive(Debug, Clone)]
pub(crate) struct CpuMeter {
    pids: Vec<u32>,
    clk_tck: u64,
    start: u64,
}

impl CpuMeter {
    /// Starts measuring `pids` (none: the meter reads zero).
    pub(crate) fn start(pids: &[u32], clk_tck: u64) -> anyhow::Result<CpuMeter> {
        Ok(CpuMeter {
            pids: pids.to_vec(),
            clk_tck: clk_tck.max(1),
            start: cpu_ticks(pids)?,
        })
    }

    /// Whether any process is measured.
    pub(crate) fn is_active(&self) -> bool {
        !self.pids.is_empty()
    }

    /// Microseconds of CPU used since [`CpuMeter::start`].
    pub(crate) fn elapsed_us(&self) -> anyhow::Result<f64> {
        let ticks = cpu_ticks(&self.pids)?.saturating_sub(self.start);
        Ok(ticks as f64 * 1e6 / self.clk_tck as f64)
    }
}

/// A `kB` line of `/proc/<pid>/status`, such as `VmHWM`.
pub(crate) fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    proc::status_kib(pid, key).with_context(|| format!("/proc/{pid}/status: no {key} line"))
}

/// `{vmhwm_kib, vmrss_kib, rssanon_kib, rssfile_kib, pids}` summed over
/// `pids`. `RssAnon` is the memory the processes own; `RssFile` is mostly
/// the executable's pages, shared with the page cache and every process
/// running the same file, and as large as the kernel's fault-around makes
/// it (up to 64 KiB mapped around each page of code touched).
pub(crate) fn rss_json(pids: &[u32]) -> anyhow::Result<serde_json::Value> {
    let mut hwm = 0;
    let mut rss = 0;
    let mut anon = 0;
    let mut file = 0;
    for &pid in pids {
        hwm += status_kib(pid, "VmHWM")?;
        rss += status_kib(pid, "VmRSS")?;
        anon += status_kib(pid, "RssAnon")?;
        file += status_kib(pid, "RssFile")?;
    }
    Ok(json!({
        "vmhwm_kib": hwm,
        "vmrss_kib": rss,
        "rssanon_kib": anon,
        "rssfile_kib": file,
        "pids": pids,
    }))
}

/// Whether `pid` is gone or a zombie (dead, not yet reaped).
pub(crate) fn is_dead(pid: u32) -> bool {
    proc::stat(pid).ok().is_none_or(|stat| stat.is_dead())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        process_ticks(me).expect("ticks");
        assert!(status_kib(me, "VmHWM").expect("hwm") > 0);
        assert!(!is_dead(me));
    }
}
