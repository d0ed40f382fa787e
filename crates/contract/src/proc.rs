//! Reading `/proc` (proc(5)): the one parser of a process's `stat` line,
//! and the few other files more than one side reads. Blocking, like any
//! file read; a process that is gone reads as an error.

use std::fs;
use std::io;

/// What `/proc/<pid>/stat` says of a process, the fields in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Its pid (field 1).
    pub pid: u32,
    /// Its state (field 3): `R`, `S`, `D`, `Z`, `T`, …
    pub state: char,
    /// Its parent's pid (field 4); 0 for the first process of a pid
    /// namespace.
    pub ppid: u32,
    /// Its process group (field 5).
    pub pgrp: u32,
    /// Clock ticks it ran in user mode (field 14), its threads included.
    pub utime: u64,
    /// Clock ticks it ran in kernel mode (field 15), its threads included.
    pub stime: u64,
    /// When it started, in clock ticks after boot (field 22): with the pid,
    /// it tells a process from a later one that got the same pid.
    pub start: u64,
}

impl Stat {
    /// Parses a `stat` line. The command (field 2) is in parentheses and
    /// may hold any byte, spaces and parentheses too, so the fields after
    /// it are found after the line's *last* `)`. `None` when the line is
    /// cut short or a field used is not a number.
    pub fn parse(text: &str) -> Option<Stat> {
        let (head, rest) = text.rsplit_once(')')?;
        let (pid, _command) = head.split_once(" (")?;
        // `rest` starts at field 3, so field N is at index N − 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let narrow = |n: usize| u32::try_from(field(n)?).ok();
        let mut state = fields.first()?.chars();
        Some(Stat {
            pid: pid.trim().parse().ok()?,
            state: state.next().filter(|_| state.next().is_none())?,
            ppid: narrow(4)?,
            pgrp: narrow(5)?,
            utime: field(14)?,
            stime: field(15)?,
            start: field(22)?,
        })
    }

    /// Whether the process has ended: a zombie (`Z`, not yet reaped) or
    /// dead (`X`).
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// `/proc/<pid>/stat`; an error once the process is gone, or if the line
/// does not parse.
pub fn stat(pid: u32) -> io::Result<Stat> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path)?;
    Stat::parse(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path}: not a stat line"),
        )
    })
}

/// The pids of every process in `/proc`, in the order the folder lists
/// them; those that end meanwhile may still be among them.
pub fn pids() -> io::Result<impl Iterator<Item = u32>> {
    Ok(fs::read_dir("/proc")?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok()))
}

/// The command line of `pid`, its arguments (empty ones left out) decoded
/// lossily; empty for a kernel thread or a zombie.
pub fn cmdline(pid: u32) -> io::Result<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline"))?;
    Ok(raw
        .split(|&b| b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect())
}

/// A `kB` value of `/proc/<pid>/status`, such as `VmRSS` or `VmHWM`, in
/// KiB; `None` when the process is gone or has no such line (a kernel
/// thread has no memory lines).
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kib(&text, key)
}

fn parse_status_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command with spaces and parentheses, the closing one followed by
    /// more text, does not shift the fields.
    #[test]
    fn a_command_with_spaces_and_parentheses_parses() {
        let line = "4242 (a (b) c) S 17 4243 4243 0 -1 4194560 1 0 0 0 3 4 0 0 20 0 1 0 987654 0 0";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                pid: 4242,
                state: 'S',
                ppid: 17,
                pgrp: 4243,
                utime: 3,
                stime: 4,
                start: 987654,
            })
        );
        let tricky = "7 () S ) R 1 7 7 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 12 0 0\n";
        let stat = Stat::parse(tricky).expect("parses");
        assert_eq!(
            (stat.pid, stat.state, stat.ppid, stat.start),
            (7, 'R', 1, 12)
        );
        let empty = "9 () S 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0";
        assert_eq!(Stat::parse(empty).map(|s| s.start), Some(3));
    }

    /// A zombie and a dead process have ended; the rest have not.
    #[test]
    fn zombies_and_the_dead_have_ended() {
        let line = |state: &str| {
            format!("7 (x) {state} 3 5 5 0 -1 4227148 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0")
        };
        for (state, dead) in [("Z", true), ("X", true), ("S", false), ("R", false)] {
            let stat = Stat::parse(&line(state)).expect("parses");
            assert_eq!(stat.is_dead(), dead, "{state}");
            assert_eq!(stat.ppid, 3);
        }
    }

    /// A line cut short, or with a field that is no number, is refused.
    #[test]
    fn broken_lines_are_refused() {
        for line in [
            "",
            "7 (x",
            "7 (x) S 3 5 5",
            "x (x) S 3 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0",
            "7 (x) S -3 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0",
            "7 (x) SS 3 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0",
            "7 (x) S 3 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0 0",
        ] {
            assert_eq!(Stat::parse(line), None, "{line:?}");
        }
    }

    /// This process reads as itself, alive, among the pids, with its
    /// command line and memory.
    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id();
        let own = stat(me).expect("own stat");
        assert_eq!(own.pid, me);
        assert!(!own.is_dead());
        assert_eq!(own.ppid, nix::unistd::getppid().as_raw() as u32);
        assert!(pids().expect("pids").any(|pid| pid == me));
        let exe = std::env::current_exe().expect("exe");
        let args = cmdline(me).expect("own cmdline");
        let first = std::path::Path::new(&args[0]).file_name();
        assert_eq!(first, exe.file_name());
        assert!(status_kib(me, "VmRSS").expect("VmRSS") > 0);
        assert_eq!(status_kib(me, "NoSuchKey"), None);
        assert!(stat(u32::MAX).is_err());
    }

    #[test]
    fn status_values_are_read_in_kib() {
        let text = "Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 1000 kB\nThreads:\t3\n";
        assert_eq!(parse_status_kib(text, "VmHWM"), Some(1234));
        assert_eq!(parse_status_kib(text, "VmRSS"), Some(1000));
        assert_eq!(parse_status_kib(text, "Threads"), None);
        assert_eq!(parse_status_kib(text, "Vm"), None);
    }
}
