//! Who serves a module's socket. Ray's session folder is 0777: another
//! local user could rename `sockets/` and listen on `sockets/dash_<name>`
//! in a folder of their own, and requests (with their `Authorization`
//! headers and cookies) would reach that listener. So each new connection
//! to a module is checked with `SO_PEERCRED`: the process that listens must
//! run as this user and belong to the incarnation's process group (a
//! module runs in a group of its own, led by the process ray-dashd started;
//! a Ray module forked by the zygote joins its shim's group).

use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use nix::unistd::{getpgid, Pid, Uid};

/// What the listener of a module's socket must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCheck {
    /// This user.
    uid: u32,
    /// The incarnation's process group.
    pgid: i32,
}

impl PeerCheck {
    /// The listener must run as this user in the process group led by
    /// `pid` (the incarnation's process).
    pub fn group_of(pid: u32) -> PeerCheck {
        PeerCheck {
            uid: Uid::effective().as_raw(),
            pgid: i32::try_from(pid).expect("UNWRAP: pids fit in i32"),
        }
    }

    /// Checks the peer of the connected socket `socket`.
    pub(crate) fn verify(&self, socket: &impl AsFd) -> io::Result<()> {
        let creds = getsockopt(socket, PeerCredentials).map_err(io::Error::from)?;
        let refuse = |what: String| {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the socket is served by {what}, not by the module (uid {}, process group {}): refused", self.uid, self.pgid),
            ))
        };
        if creds.uid() != self.uid {
            return refuse(format!("pid {} of uid {}", creds.pid(), creds.uid()));
        }
        match getpgid(Some(Pid::from_raw(creds.pid()))) {
            Ok(group) if group.as_raw() == self.pgid => Ok(()),
            Ok(group) => refuse(format!(
                "pid {} of process group {}",
                creds.pid(),
                group.as_raw()
            )),
            Err(e) => refuse(format!("pid {} ({e})", creds.pid())),
        }
    }
}

/// Who listens on the Unix socket at `path`: `None` when no process
/// accepts a connection within `within` (a file whose listener is gone
/// refuses it), else the listener's pid, or why it could not be read. The
/// connection is closed at once, nothing sent.
pub(crate) async fn listener_pid(path: &Path, within: Duration) -> Option<io::Result<u32>> {
    let connect = tokio::net::UnixStream::connect(path);
    let stream = tokio::time::timeout(within, connect).await.ok()?.ok()?;
    let creds = getsockopt(&stream, PeerCredentials).map_err(io::Error::from);
    Some(creds.and_then(|creds| u32::try_from(creds.pid()).map_err(io::Error::other)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn a_listener_outside_the_group_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("s");
        let _listener = UnixListener::bind(&path).expect("bind");
        let stream = UnixStream::connect(&path).expect("connect");
        let mine = nix::unistd::getpgrp().as_raw() as u32;
        PeerCheck::group_of(mine)
            .verify(&stream)
            .expect("this process's own group");
        let err = PeerCheck::group_of(1)
            .verify(&stream)
            .expect_err("not init's group");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("process group"), "{err}");
    }

    #[tokio::test]
    async fn the_listener_is_named_and_a_left_file_is_not() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        let within = Duration::from_secs(5);
        let pid = listener_pid(&path, within).await.expect("a listener");
        assert_eq!(pid.expect("its pid"), std::process::id());
        drop(listener);
        assert!(path.exists(), "the socket file stays");
        assert!(listener_pid(&path, within).await.is_none());
        assert!(listener_pid(&tmp.path().join("none"), within)
            .await
            .is_none());
    }
}
