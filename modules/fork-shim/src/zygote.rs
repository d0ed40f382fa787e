//! The shim's side of the zygote protocol (see `modules/ray/zygote.py`):
//! SOCK_SEQPACKET, one JSON object per message.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, socketpair, AddressFamily, ControlMessage, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use nix::unistd::{getpgrp, Pid};
use serde::Deserialize;

use crate::args::Args;
use crate::raw;

/// The protocol version both sides speak.
const PROTOCOL: u32 = 1;
/// Between two connection attempts while nothing listens.
const RETRY_MS: u16 = 20;
/// The largest message the zygote sends.
const MAX_REPLY: usize = 64 * 1024;

/// What the zygote sends.
#[derive(Debug)]
pub(crate) enum Reply {
    /// It forked the module as this pid.
    Forked(i32),
    /// It will not fork it, and why.
    Refused(String),
    /// The child ended: its exit code, or minus the signal that killed it.
    Exit(i32),
}

/// A message as it is on the wire: exactly one field is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    pid: Option<i32>,
    error: Option<String>,
    exit: Option<i32>,
}

/// How asking the zygote turned out, when it did not fail.
#[derive(Debug)]
pub(crate) enum Started {
    /// The zygote forked the module.
    Child {
        /// The forked child.
        pid: Pid,
        /// The connection on which the zygote reports the child's end.
        zygote: Option<OwnedFd>,
        /// The shim's end of the lifeline; the child holds the other.
        lifeline: OwnedFd,
    },
    /// A signal to stop arrived before there was a child to forward it to.
    Stopped(Signal),
}

/// Asks the zygote to fork the module. `Err` says why the shim must run the
/// module standalone instead.
pub(crate) fn start(args: &Args, signals: &SignalFd) -> Result<Started, String> {
    let path = args.zygote_socket()?;
    let conn = match connect_retrying(&path, args, signals)? {
        Connected::Yes(conn) => conn,
        Connected::Stopped(signal) => return Ok(Started::Stopped(signal)),
    };
    let request = request(args)?;
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("cannot make the lifeline: {e}"))?;
    let fds = [0, 1, 2, raw(&theirs)];
    sendmsg::<UnixAddr>(
        raw(&conn),
        &[IoSlice::new(&request)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| format!("cannot send the request to {}: {e}", path.display()))?;
    // Only the child may hold the other end, or its end would never close.
    drop(theirs);

    let deadline = Instant::now() + args.reply_timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "the zygote at {} did not answer within {:?}",
                path.display(),
                args.reply_timeout
            ));
        }
        match wait_readable(
            &conn,
            signals,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(Ready::Signal(signal)) => return Ok(Started::Stopped(signal)),
            Ok(Ready::Fd) => {}
            Ok(Ready::Nothing) => continue,
            Err(e) => return Err(format!("waiting for the zygote: {e}")),
        }
        return match read_reply(&conn) {
            Ok(Reply::Forked(pid)) => Ok(Started::Child {
                pid: Pid::from_raw(pid),
                zygote: Some(conn),
                lifeline: ours,
            }),
            Ok(Reply::Refused(error)) => Err(format!("the zygote refused: {error}")),
            Ok(Reply::Exit(code)) => Err(format!("the zygote sent an exit ({code}) first")),
            Err(e) => Err(format!("the zygote did not answer: {e}")),
        };
    }
}

/// Reads one message from the zygote.
pub(crate) fn read_reply(conn: &OwnedFd) -> Result<Reply, String> {
    let mut buf = vec![0u8; MAX_REPLY];
    let n = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(raw(conn), &mut iov, None, MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => break msg.bytes,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
    };
    if n == 0 {
        return Err("it closed the connection".into());
    }
    let text = &buf[..n];
    let unreadable = |why: &str| {
        format!(
            "unreadable message {:?}: {why}",
            String::from_utf8_lossy(text)
        )
    };
    let message: Message = serde_json::from_slice(text).map_err(|e| unreadable(&e.to_string()))?;
    match message {
        Message {
            pid: Some(pid),
            error: None,
            exit: None,
        } => Ok(Reply::Forked(pid)),
        Message {
            pid: None,
            error: Some(error),
            exit: None,
        } => Ok(Reply::Refused(error)),
        Message {
            pid: None,
            error: None,
            exit: Some(code),
        } => Ok(Reply::Exit(code)),
        _ => Err(unreadable("expected exactly one of pid, error, exit")),
    }
}

enum Connected {
    Yes(OwnedFd),
    Stopped(Signal),
}

/// Connects to `path`, retrying while nothing listens there, for `args.wait`.
fn connect_retrying(
    path: &std::path::Path,
    args: &Args,
    signals: &SignalFd,
) -> Result<Connected, String> {
    let addr =
        UnixAddr::new(path).map_err(|e| format!("bad socket path {}: {e}", path.display()))?;
    let deadline = Instant::now() + args.wait;
    loop {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| format!("cannot make a socket: {e}"))?;
        match connect(sock.as_raw_fd(), &addr) {
            Ok(()) => return Ok(Connected::Yes(sock)),
            Err(Errno::EINTR) => continue,
            Err(e @ (Errno::ENOENT | Errno::ECONNREFUSED)) => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "no zygote at {} ({e}) within {:?}",
                        path.display(),
                        args.wait
                    ));
                }
            }
            Err(e) => {
                return Err(format!(
                    "cannot reach the zygote at {}: {e}",
                    path.display()
                ))
            }
        }
        // The pause between attempts doubles as the check for a stop signal.
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(RETRY_MS)) {
            Ok(n) if n > 0 => {
                if let Some(signal) = pending_signal(signals) {
                    return Ok(Connected::Stopped(signal));
                }
            }
            _ => {}
        }
    }
}

enum Ready {
    Fd,
    Signal(Signal),
    Nothing,
}

fn wait_readable(conn: &OwnedFd, signals: &SignalFd, timeout: PollTimeout) -> Result<Ready, Errno> {
    let mut fds = [
        PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        PollFd::new(conn.as_fd(), PollFlags::POLLIN),
    ];
    match poll(&mut fds, timeout) {
        Ok(0) | Err(Errno::EINTR) => return Ok(Ready::Nothing),
        Ok(_) => {}
        Err(e) => return Err(e),
    }
    let signal_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
    let conn_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
    if signal_ready {
        if let Some(signal) = pending_signal(signals) {
            return Ok(Ready::Signal(signal));
        }
    }
    Ok(if conn_ready {
        Ready::Fd
    } else {
        Ready::Nothing
    })
}

fn pending_signal(signals: &SignalFd) -> Option<Signal> {
    match signals.read_signal() {
        Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32).ok(),
        _ => None,
    }
}

/// The request: which module, and the world the child should live in.
fn request(args: &Args) -> Result<Vec<u8>, String> {
    let mut env = serde_json::Map::new();
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            return Err(format!("the environment variable {key:?} is not UTF-8"));
        };
        env.insert(key.to_owned(), value.into());
    }
    let cwd = std::env::current_dir().map_err(|e| format!("no current folder: {e}"))?;
    let cwd = cwd
        .to_str()
        .ok_or_else(|| format!("the current folder {} is not UTF-8", cwd.display()))?;
    let request = serde_json::json!({
        "v": PROTOCOL,
        "module": args.module,
        "env": env,
        "cwd": cwd,
        "pgid": getpgrp().as_raw(),
    });
    serde_json::to_vec(&request).map_err(|e| format!("cannot encode the request: {e}"))
}
