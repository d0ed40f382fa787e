//! The shim's side of the zygote protocol (see `modules/ray/zygote.py`):
//! SOCK_SEQPACKET, one JSON object per message.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

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

use crate::args::{Args, NoSocket};
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

/// Why the zygote did not fork the module: the shim runs it standalone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoFork {
    /// The zygote's socket cannot be found.
    #[error(transparent)]
    Socket(#[from] NoSocket),
    /// The socket's path does not fit in a Unix address.
    #[error("bad socket path {}: {source}", path.display())]
    BadPath {
        /// The zygote's socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Errno,
    },
    /// No socket could be made to connect with.
    #[error("cannot make a socket: {0}")]
    MakeSocket(#[source] Errno),
    /// Nothing listened at the socket for the whole wait.
    #[error("no zygote at {} ({source}) within {within:?}", path.display())]
    NotListening {
        /// The zygote's socket.
        path: PathBuf,
        /// The last connect's failure.
        #[source]
        source: Errno,
        /// The wait (`--wait`).
        within: Duration,
    },
    /// The connect failed otherwise.
    #[error("cannot reach the zygote at {}: {source}", path.display())]
    Connect {
        /// The zygote's socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Errno,
    },
    /// An environment variable cannot be sent (the protocol is JSON).
    #[error("the environment variable {0:?} is not UTF-8")]
    NonUtf8Var(OsString),
    /// The current folder cannot be read.
    #[error("no current folder: {0}")]
    NoCwd(#[source] std::io::Error),
    /// The current folder cannot be sent (the protocol is JSON).
    #[error("the current folder {} is not UTF-8", .0.display())]
    NonUtf8Cwd(PathBuf),
    /// The request could not be encoded.
    #[error("cannot encode the request: {0}")]
    Encode(#[source] serde_json::Error),
    /// The lifeline's socket pair could not be made.
    #[error("cannot make the lifeline: {0}")]
    Lifeline(#[source] Errno),
    /// The request could not be sent.
    #[error("cannot send the request to {}: {source}", path.display())]
    Send {
        /// The zygote's socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Errno,
    },
    /// The zygote did not answer in time (`--reply-timeout`).
    #[error("the zygote at {} did not answer within {within:?}", path.display())]
    NoAnswerWithin {
        /// The zygote's socket.
        path: PathBuf,
        /// The time it had.
        within: Duration,
    },
    /// Waiting for its answer failed.
    #[error("waiting for the zygote: {0}")]
    Wait(#[source] Errno),
    /// It will not fork the module, and says why.
    #[error("the zygote refused: {0}")]
    Refused(String),
    /// It sent a child's exit before forking one.
    #[error("the zygote sent an exit ({0}) first")]
    ExitFirst(i32),
    /// Its answer could not be read.
    #[error("the zygote did not answer: {0}")]
    NoReply(#[source] BadReply),
}

/// Why a message from the zygote could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadReply {
    /// Reading from its connection failed.
    #[error(transparent)]
    Recv(Errno),
    /// It closed its connection.
    #[error("it closed the connection")]
    Closed,
    /// The message is not JSON of the protocol's shape.
    #[error("unreadable message {text:?}: {source}")]
    Unreadable {
        /// The message.
        text: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The message has none or more than one of its fields.
    #[error("unreadable message {text:?}: expected exactly one of pid, error, exit")]
    NotOneField {
        /// The message.
        text: String,
    },
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
pub(crate) fn start(args: &Args, signals: &SignalFd) -> Result<Started, NoFork> {
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
    .map_err(NoFork::Lifeline)?;
    let fds = [0, 1, 2, raw(&theirs)];
    sendmsg::<UnixAddr>(
        raw(&conn),
        &[IoSlice::new(&request)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|source| NoFork::Send {
        path: path.clone(),
        source,
    })?;
    // Only the child may hold the other end, or its end would never close.
    drop(theirs);

    let deadline = Instant::now() + args.reply_timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NoFork::NoAnswerWithin {
                path,
                within: args.reply_timeout,
            });
        }
        match wait_readable(
            &conn,
            signals,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(Ready::Signal(signal)) => return Ok(Started::Stopped(signal)),
            Ok(Ready::Fd) => {}
            Ok(Ready::Nothing) => continue,
            Err(e) => return Err(NoFork::Wait(e)),
        }
        return match read_reply(&conn) {
            Ok(Reply::Forked(pid)) => Ok(Started::Child {
                pid: Pid::from_raw(pid),
                zygote: Some(conn),
                lifeline: ours,
            }),
            Ok(Reply::Refused(error)) => Err(NoFork::Refused(error)),
            Ok(Reply::Exit(code)) => Err(NoFork::ExitFirst(code)),
            Err(e) => Err(NoFork::NoReply(e)),
        };
    }
}

/// Reads one message from the zygote.
pub(crate) fn read_reply(conn: &OwnedFd) -> Result<Reply, BadReply> {
    let mut buf = vec![0u8; MAX_REPLY];
    let n = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(raw(conn), &mut iov, None, MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => break msg.bytes,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(BadReply::Recv(e)),
        }
    };
    if n == 0 {
        return Err(BadReply::Closed);
    }
    let text = &buf[..n];
    let quoted = || String::from_utf8_lossy(text).into_owned();
    let message: Message = serde_json::from_slice(text).map_err(|source| BadReply::Unreadable {
        text: quoted(),
        source,
    })?;
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
        _ => Err(BadReply::NotOneField { text: quoted() }),
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
) -> Result<Connected, NoFork> {
    let addr = UnixAddr::new(path).map_err(|source| NoFork::BadPath {
        path: path.to_owned(),
        source,
    })?;
    let deadline = Instant::now() + args.wait;
    loop {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(NoFork::MakeSocket)?;
        match connect(sock.as_raw_fd(), &addr) {
            Ok(()) => return Ok(Connected::Yes(sock)),
            Err(Errno::EINTR) => continue,
            Err(source @ (Errno::ENOENT | Errno::ECONNREFUSED)) => {
                if Instant::now() >= deadline {
                    return Err(NoFork::NotListening {
                        path: path.to_owned(),
                        source,
                        within: args.wait,
                    });
                }
            }
            Err(source) => {
                return Err(NoFork::Connect {
                    path: path.to_owned(),
                    source,
                })
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
fn request(args: &Args) -> Result<Vec<u8>, NoFork> {
    let mut env = serde_json::Map::new();
    for (key, value) in std::env::vars_os() {
        let (Some(key), Some(value)) = (key.to_str(), value.to_str()) else {
            return Err(NoFork::NonUtf8Var(key.clone()));
        };
        env.insert(key.to_owned(), value.into());
    }
    let cwd = std::env::current_dir().map_err(NoFork::NoCwd)?;
    let Some(cwd) = cwd.to_str() else {
        return Err(NoFork::NonUtf8Cwd(cwd.clone()));
    };
    let request = serde_json::json!({
        "v": PROTOCOL,
        "module": args.module,
        "env": env,
        "cwd": cwd,
        "pgid": getpgrp().as_raw(),
    });
    serde_json::to_vec(&request).map_err(NoFork::Encode)
}
