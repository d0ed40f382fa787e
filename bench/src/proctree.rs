//! A process and its descendants, read from `/proc`: finding one by its
//! command line, their memory (PSS from `smaps_rollup`), and stopping them
//! all by pid. Used by `ray_dashboard.sh` for both dashboards alike.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use ray_dashd_contract::proc;
use serde_json::json;

/// Pause between two looks while waiting for processes to exit.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// One process, as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: u32,
    pub(crate) ppid: u32,
    /// Start time in clock ticks after boot (field 22): with the pid, it
    /// names the process even if the pid is reused.
    pub(crate) start_ticks: u64,
}

/// `pid`, unless it is gone or has ended (a zombie).
fn read_proc(pid: u32) -> Option<Proc> {
    let stat = proc::stat(pid).ok().filter(|stat| !stat.is_dead())?;
    Some(Proc {
        pid: stat.pid,
        ppid: stat.ppid,
        start_ticks: stat.start,
    })
}

/// Every live (not zombie) process on the host.
fn all_processes() -> anyhow::Result<Vec<Proc>> {
    Ok(proc::pids()
        .context("read /proc")?
        .filter_map(read_proc)
        .collect())
}

/// `root` (first) and all its live descendants, parents before children.
/// Empty when `root` is gone.
pub(crate) fn tree(root: u32) -> anyhow::Result<Vec<Proc>> {
    let all = all_processes()?;
    let mut children: HashMap<u32, Vec<&Proc>> = HashMap::new();
    for p in &all {
        children.entry(p.ppid).or_default().push(p);
    }
    let Some(first) = all.iter().find(|p| p.pid == root) else {
        return Ok(vec![]);
    };
    let mut out = vec![];
    let mut queue = VecDeque::from([first]);
    while let Some(p) = queue.pop_front() {
        out.push(p.clone());
        if let Some(kids) = children.get(&p.pid) {
            queue.extend(kids.iter().copied());
        }
    }
    Ok(out)
}

/// The command line of `pid`, arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    proc::cmdline(pid).unwrap_or_default().join(" ")
}

/// The first descendant of `root` (breadth first, `root` excluded) whose
/// command line contains `needle`: `{pid, cmdline}`.
pub(crate) fn find_descendant(root: u32, needle: &str) -> anyhow::Result<serde_json::Value> {
    let found = tree(root)?
        .into_iter()
        .skip(1)
        .map(|p| (p.pid, cmdline(p.pid)))
        .find(|(_, cmd)| cmd.contains(needle));
    match found {
        Some((pid, cmd)) => Ok(json!({ "pid": pid, "cmdline": cmd })),
        None => anyhow::bail!("no descendant of pid {root} has {needle:?} in its command line"),
    }
}

/// Memory of one process from `/proc/<pid>/smaps_rollup`, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Mem {
    /// Proportional set size: private pages plus each shared page divided
    /// by the number of processes mapping it. Summing PSS over processes
    /// counts every page once.
    pss: u64,
    rss: u64,
    /// Private (clean + dirty): what exiting this process alone would free.
    uss: u64,
}

fn parse_smaps_rollup(text: &str) -> Mem {
    let mut mem = Mem::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let Ok(kib) = value.trim().trim_end_matches("kB").trim().parse::<u64>() else {
            continue;
        };
        match key {
            "Pss" => mem.pss = kib,
            "Rss" => mem.rss = kib,
            "Private_Clean" | "Private_Dirty" => mem.uss += kib,
            _ => {}
        }
    }
    mem
}

fn read_mem(pid: u32) -> anyhow::Result<Mem> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    Ok(parse_smaps_rollup(&text))
}

/// PSS, RSS and USS of `root` and of its whole tree:
/// `{parent_pss_kib, total_pss_kib, total_rss_kib, total_uss_kib,
///   processes, per_process: [{pid, ppid, pss_kib, rss_kib, uss_kib, cmdline}]}`.
/// A descendant that exits between the listing and the reading is left out.
pub(crate) fn tree_mem(root: u32) -> anyhow::Result<serde_json::Value> {
    let procs = tree(root)?;
    if procs.is_empty() {
        anyhow::bail!("pid {root} is not running");
    }
    let parent = read_mem(root)?;
    let mut total = Mem::default();
    let mut per_process = vec![];
    for p in &procs {
        let Ok(mem) = read_mem(p.pid) else { continue };
        total.pss += mem.pss;
        total.rss += mem.rss;
        total.uss += mem.uss;
        let mut cmd = cmdline(p.pid);
        if cmd.len() > 160 {
            let cut = (0..=160)
                .rev()
                .find(|&i| cmd.is_char_boundary(i))
                .unwrap_or(0);
            cmd.truncate(cut);
            cmd.push('…');
        }
        per_process.push(json!({
            "pid": p.pid,
            "ppid": p.ppid,
            "pss_kib": mem.pss,
            "rss_kib": mem.rss,
            "uss_kib": mem.uss,
            "cmdline": cmd,
        }));
    }
    Ok(json!({
        "parent_pss_kib": parent.pss,
        "parent_rss_kib": parent.rss,
        "total_pss_kib": total.pss,
        "total_rss_kib": total.rss,
        "total_uss_kib": total.uss,
        "processes": per_process.len(),
        "per_process": per_process,
    }))
}

/// Whether the process `p` names still runs (same pid, same start time).
fn still_running(p: &Proc) -> bool {
    read_proc(p.pid).is_some_and(|now| now.start_ticks == p.start_ticks)
}

/// Waits until none of `procs` runs, or `until`; the ones still running.
fn wait_gone(procs: &[Proc], until: Instant) -> Vec<Proc> {
    loop {
        let left: Vec<Proc> = procs.iter().filter(|p| still_running(p)).cloned().collect();
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(EXIT_POLL);
    }
}

fn signal_all(procs: &[Proc], signal: Signal) {
    for p in procs {
        // Checked just before the signal: a pid reused meanwhile is spared.
        if still_running(p) {
            if let Ok(raw) = i32::try_from(p.pid) {
                let _ = kill(Pid::from_raw(raw), signal);
            }
        }
    }
}

/// Stops `root` and every process below it, by pid: the tree is listed
/// first (children are re-parented once their parent exits), then SIGTERM
/// to `root` alone and up to `grace` for the tree to exit on its own (a
/// parent stops its children its own way), then SIGTERM to whatever is
/// left and up to `grace` again, then SIGKILL. `{processes, ms, sigterm_rest,
/// sigkilled}`.
pub(crate) fn stop_tree(root: u32, grace: Duration) -> anyhow::Result<serde_json::Value> {
    let procs = tree(root)?;
    let t0 = Instant::now();
    let Some(first) = procs.first() else {
        return Ok(json!({ "processes": 0, "ms": 0.0, "sigterm_rest": [], "sigkilled": [] }));
    };
    signal_all(std::slice::from_ref(first), Signal::SIGTERM);
    let left = wait_gone(&procs, Instant::now() + grace);
    let sigterm_rest: Vec<u32> = left.iter().map(|p| p.pid).collect();
    signal_all(&left, Signal::SIGTERM);
    let left = wait_gone(&left, Instant::now() + grace);
    let sigkilled: Vec<u32> = left.iter().map(|p| p.pid).collect();
    signal_all(&left, Signal::SIGKILL);
    let left = wait_gone(&left, Instant::now() + grace);
    if !left.is_empty() {
        anyhow::bail!(
            "pids {:?} still running after SIGKILL",
            left.iter().map(|p| p.pid).collect::<Vec<_>>()
        );
    }
    Ok(json!({
        "processes": procs.len(),
        "ms": t0.elapsed().as_secs_f64() * 1000.0,
        "sigterm_rest": sigterm_rest,
        "sigkilled": sigkilled,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs;

    #[test]
    fn smaps_rollup_sums_private_pages() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\nRss: 1000 kB\nPss: 600 kB\n\
                    Pss_Anon: 300 kB\nShared_Clean: 500 kB\nPrivate_Clean: 100 kB\nPrivate_Dirty: 250 kB\n";
        assert_eq!(
            parse_smaps_rollup(text),
            Mem {
                pss: 600,
                rss: 1000,
                uss: 350
            }
        );
    }

    #[test]
    fn own_tree_has_a_child_and_memory() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let me = std::process::id();
        let procs = tree(me).expect("tree");
        assert_eq!(procs.first().map(|p| p.pid), Some(me));
        assert!(procs.iter().any(|p| p.pid == child.id() && p.ppid == me));
        let mem = tree_mem(me).expect("mem");
        assert!(mem["parent_pss_kib"].as_u64().expect("pss") > 0);
        assert!(mem["total_pss_kib"].as_u64() >= mem["parent_pss_kib"].as_u64());
        let found = find_descendant(me, "sleep 30").expect("found");
        assert_eq!(found["pid"].as_u64(), Some(u64::from(child.id())));
        let stopped = stop_tree(child.id(), Duration::from_secs(5)).expect("stopped");
        assert_eq!(stopped["processes"], 1);
        child.wait().expect("reaped");
        assert!(procfs::is_dead(child.id()));
    }
}
