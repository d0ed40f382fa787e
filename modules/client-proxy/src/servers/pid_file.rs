//! The file of the servers' pids, so that a restarted proxy stops any
//! server an earlier run of it left behind.

use std::path::PathBuf;
use std::sync::Mutex;

use nix::sys::signal::Signal;
use ray_dashd_contract::proc;
use ray_dashd_contract::LockExt;
use tracing::warn;

use super::signal_group;

/// The pids of the servers this proxy started, with each one's start time
/// (from `/proc/<pid>/stat`) so that a reused pid is never mistaken for one.
#[derive(Debug)]
pub struct PidFile {
    path: Option<PathBuf>,
    pids: Mutex<Vec<(u32, u64)>>,
}

impl PidFile {
    /// A registry kept at `path` (none: kept in memory only).
    pub fn new(path: Option<PathBuf>) -> PidFile {
        PidFile {
            path,
            pids: Mutex::new(Vec::new()),
        }
    }

    /// Stops the servers an earlier run of the proxy left behind: every pid
    /// in the file that still names the same process (same start time).
    /// Returns how many were stopped.
    pub fn stop_leftovers(&self) -> usize {
        let Some(path) = &self.path else { return 0 };
        let Ok(text) = std::fs::read_to_string(path) else {
            return 0;
        };
        let mut stopped = 0;
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(Ok(pid)), Some(Ok(start))) = (
                parts.next().map(str::parse::<u32>),
                parts.next().map(str::parse::<u64>),
            ) else {
                continue;
            };
            if start_time(pid) == Some(start) {
                warn!(
                    pid,
                    "stopping a Ray client server left by an earlier run of the proxy"
                );
                signal_group(pid, Signal::SIGKILL);
                stopped += 1;
            }
        }
        self.save(&[]);
        stopped
    }

    pub(super) fn add(&self, pid: u32) {
        let Some(start) = start_time(pid) else { return };
        let mut pids = self.pids.locked();
        pids.push((pid, start));
        self.save(&pids);
    }

    pub(super) fn remove(&self, pid: u32) {
        let mut pids = self.pids.locked();
        pids.retain(|(p, _)| *p != pid);
        self.save(&pids);
    }

    fn save(&self, pids: &[(u32, u64)]) {
        let Some(path) = &self.path else { return };
        let text: String = pids
            .iter()
            .map(|(pid, start)| format!("{pid} {start}\n"))
            .collect();
        let tmp = path.with_extension("tmp");
        let result = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = result {
            warn!(path = %path.display(), error = %e, "cannot save the Ray client server pids");
        }
    }
}

/// The start time of `pid` in clock ticks since boot, if it runs.
fn start_time(pid: u32) -> Option<u64> {
    proc::stat(pid).ok().map(|stat| stat.start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_of_an_earlier_run_are_stopped_and_reused_pids_spared() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("servers");
        let mut leftover = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = leftover.id();
        {
            let earlier = PidFile::new(Some(path.clone()));
            earlier.add(pid);
            earlier.add(std::process::id());
        }
        // Our own pid, listed with another start time, stands for a reused pid.
        let text = std::fs::read_to_string(&path).unwrap().replace(
            &format!(
                "{} {}",
                std::process::id(),
                start_time(std::process::id()).unwrap()
            ),
            &format!("{} 1", std::process::id()),
        );
        std::fs::write(&path, text).unwrap();
        let stopped = PidFile::new(Some(path.clone())).stop_leftovers();
        assert_eq!(stopped, 1);
        let status = leftover.wait().unwrap();
        assert!(!status.success(), "the leftover was not killed: {status}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "",
            "the file still lists pids"
        );
    }

    #[test]
    fn start_time_reads_our_own_process() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
    }
}
