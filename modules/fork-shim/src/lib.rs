//! The fork shim: the process ray-dashd supervises for a Python module that
//! the zygote (`modules/ray/zygote.py`) forks. It asks the zygote for the
//! module, stands for it until it ends, and runs the module standalone
//! (exec, same pid) when the zygote cannot. [`main`] is the whole program,
//! run as `ray-dashd fork-shim` (what ray-dashd starts) or as the
//! `ray-dashd-fork-shim` binary; it never returns.
//!
//! ```text
//! ray-dashd fork-shim --zygote NAME [--wait SECS] [--reply-timeout SECS] MODULE -- FALLBACK...
//! ```
//!
//! # Theory of operation
//!
//! - The zygote listens on `<dir of $RAY_DASHD_SOCKET>/dash_NAME.fork`. The
//!   shim connects (retrying for `--wait` seconds while nothing listens, for
//!   a zygote that is just being started), sends its environment, folder and
//!   process group, and passes its stdin, stdout and stderr plus one end of a
//!   "lifeline" socket pair. The forked child joins the shim's process group,
//!   writes where the shim writes, and kills itself when the lifeline closes,
//!   which happens when the shim is gone, however it died (SIGKILL included).
//! - Signals ray-dashd (or anyone) sends the shim are forwarded to the child,
//!   but for a signal from ray-dashd while the child is in the shim's
//!   group: ray-dashd signals whole groups, so the child has it already.
//! - The shim exits when the child does, with its status: the zygote (its
//!   parent) reports it; the end of the lifeline tells the shim the child
//!   ended even when the zygote is gone (the status is then unknown: 1).
//! - No zygote, a refusal, a zygote that dies before answering or does not
//!   answer within `--reply-timeout`: the shim replaces itself with FALLBACK
//!   (`execvp`), the standalone command, so the module always starts.

mod args;
mod zygote;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::exit;
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, raise, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::MsgFlags;
use nix::unistd::{getpgrp, getppid, Pid};

use crate::args::Args;
use crate::zygote::{Reply, Started};

/// Exit status for a bad command line (as ray-dashd's own).
const EXIT_USAGE: i32 = 64;
/// Exit status when the child ended but nobody could tell how.
const EXIT_UNKNOWN: i32 = 1;
/// Signals the shim forwards to the child.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];
/// After the child's end, how long the zygote has to report its status.
const STATUS_GRACE_MS: u16 = 2000;

/// Runs the shim with `argv`, the arguments after the program name (after
/// `fork-shim` for `ray-dashd fork-shim`). Exits with the module's status,
/// or becomes the standalone command.
pub fn main(argv: impl IntoIterator<Item = std::ffi::OsString>) -> ! {
    let args = match Args::parse(argv) {
        Ok(args) => args,
        Err(e) => {
            say("?", &format!("{e}"));
            say("?", args::USAGE);
            exit(EXIT_USAGE);
        }
    };
    // Blocked and read through a signalfd from here on, so none is lost
    // between connecting and forwarding; unblocked again before an exec.
    let mut mask = SigSet::empty();
    for signal in FORWARDED {
        mask.add(signal);
    }
    let signals = match mask
        .thread_block()
        .and_then(|()| SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK))
    {
        Ok(fd) => fd,
        Err(e) => fall_back(&args, &mask, &format!("cannot set up signal handling: {e}")),
    };
    match zygote::start(&args, &signals) {
        Ok(Started::Child {
            pid,
            zygote,
            lifeline,
        }) => {
            let status = stand_for(&args, pid, zygote, lifeline, &signals);
            finish(&mask, status)
        }
        Ok(Started::Stopped(signal)) => die_by(&mask, signal),
        Err(reason) => fall_back(&args, &mask, &reason.to_string()),
    }
}

/// Waits for the child `pid` to end, forwarding signals meanwhile. Returns
/// its exit code (negative: killed by that signal), or None when unknown.
fn stand_for(
    args: &Args,
    pid: Pid,
    mut zygote: Option<OwnedFd>,
    lifeline: OwnedFd,
    signals: &SignalFd,
) -> Option<i32> {
    let mut ended_at: Option<Instant> = None;
    loop {
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        let zygote_slot = zygote.as_ref().map(|z| {
            fds.push(PollFd::new(z.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        // Once closed, the lifeline stays readable: no longer watched.
        let lifeline_slot = ended_at.is_none().then(|| {
            fds.push(PollFd::new(lifeline.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let timeout = match ended_at {
            None => PollTimeout::NONE,
            Some(_) => PollTimeout::from(50u16),
        };
        if let Err(e) = poll(&mut fds, timeout) {
            if e != nix::errno::Errno::EINTR {
                say(&args.module, &format!("poll failed: {e}"));
                return None;
            }
            continue;
        }
        let ready = |slot: Option<usize>| {
            slot.and_then(|i| fds.get(i))
                .and_then(PollFd::revents)
                .is_some_and(|r| !r.is_empty())
        };
        let sig_ready = ready(Some(0));
        let zygote_ready = ready(zygote_slot);
        let life_ready = ready(lifeline_slot);
        drop(fds);
        if sig_ready {
            forward(args, pid, signals);
        }
        if zygote_ready {
            match zygote.as_ref().map(zygote::read_reply) {
                Some(Ok(Reply::Exit(code))) => return Some(code),
                Some(Ok(other)) => {
                    say(
                        &args.module,
                        &format!("unexpected from the zygote: {other:?}"),
                    );
                }
                Some(Err(e)) => {
                    say(
                        &args.module,
                        &format!("lost the zygote ({e}); the module (pid {pid}) keeps running"),
                    );
                    zygote = None;
                }
                None => {}
            }
        }
        if life_ready && ended_at.is_none() && lifeline_closed(&lifeline) {
            ended_at = Some(Instant::now());
        }
        if let Some(at) = ended_at {
            let why = if zygote.is_none() {
                "its zygote is gone"
            } else if at.elapsed().as_millis() > u128::from(STATUS_GRACE_MS) {
                "its zygote did not report it"
            } else {
                continue;
            };
            say(
                &args.module,
                &format!("the module (pid {pid}) ended; its status is unknown ({why})"),
            );
            return None;
        }
    }
}

/// Whether the child's end of the lifeline is closed (it never writes; a
/// stray byte is read and dropped).
fn lifeline_closed(lifeline: &OwnedFd) -> bool {
    let mut buf = [0u8; 64];
    match nix::sys::socket::recv(raw(lifeline), &mut buf, MsgFlags::MSG_DONTWAIT) {
        Ok(0) => true,
        Ok(_) | Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => false,
        Err(_) => true,
    }
}

/// Forwards pending signals to the child.
fn forward(args: &Args, pid: Pid, signals: &SignalFd) {
    while let Ok(Some(info)) = signals.read_signal() {
        let Ok(signal) = Signal::try_from(info.ssi_signo as i32) else {
            continue;
        };
        // ray-dashd signals the whole group; a child in our group got it too.
        let from_supervisor = info.ssi_pid as i32 == getppid().as_raw();
        if from_supervisor && in_group(pid) {
            continue;
        }
        if let Err(e) = kill(pid, signal) {
            say(
                &args.module,
                &format!("cannot forward {signal} to pid {pid}: {e}"),
            );
        }
    }
}

/// Whether `pid` is in this process's process group.
fn in_group(pid: Pid) -> bool {
    nix::unistd::getpgid(Some(pid)).is_ok_and(|g| g == getpgrp())
}

/// Ends the shim the way the child ended.
fn finish(mask: &SigSet, status: Option<i32>) -> ! {
    match status {
        Some(code) if code >= 0 => exit(code),
        Some(code) => {
            let signal = Signal::try_from(-code).unwrap_or(Signal::SIGKILL);
            die_by(mask, signal)
        }
        None => exit(EXIT_UNKNOWN),
    }
}

/// Ends the shim by `signal` (its default action), as the child ended.
fn die_by(mask: &SigSet, signal: Signal) -> ! {
    let _ = mask.thread_unblock();
    let _ = raise(signal);
    // A signal whose default is not to terminate, or one the Rust runtime
    // handles (SIGSEGV, SIGPIPE): the shell's convention instead.
    exit(128 + signal as i32)
}

/// Replaces the shim with the standalone command.
fn fall_back(args: &Args, mask: &SigSet, reason: &str) -> ! {
    say(
        &args.module,
        &format!("{reason}; starting the module standalone"),
    );
    let _ = mask.thread_unblock();
    let err = args.exec_fallback();
    say(
        &args.module,
        &format!("cannot run {:?}: {err}", args.fallback_program()),
    );
    exit(127)
}

/// One line on stderr (the module's `.err` log), as the launcher writes them.
fn say(module: &str, message: &str) {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
    eprintln!("{now}\tfork-shim ({module}): {message}");
}

/// The raw fd of `fd`, for the system calls that want one.
fn raw(fd: &impl AsRawFd) -> i32 {
    fd.as_raw_fd()
}
