//! Who else listens on a server's port, read from `/proc`.
//!
//! A server counts as up when its port accepts connections. But gRPC sets
//! SO_REUSEPORT on Linux, so two processes of one user can listen on the
//! same port, and the kernel then deals new connections out between them.
//! Ray's own proxier, when it runs beside this one, takes its servers'
//! ports from the same range: if it picks a port while a server of ours is
//! starting on it, the client's calls would be split between its server
//! and a stranger. So once a server is up, the listening sockets on its
//! port are counted: the server's own process group's and the rest.
//!
//! The same look tells who holds the client port when the proxy cannot
//! bind it ([`holders`]): most often Ray's own proxier.

use std::collections::HashSet;
use std::fs;
use std::io;

use ray_dashd_contract::proc;

/// The inodes of the sockets listening on TCP `port`, any address, as the
/// kernel's socket diagnostics tell them (what `ss -tl` reads). Asked for
/// listening sockets only, the kernel goes through its (small) table of
/// listeners and not through the connections; `/proc/net/tcp` would make it
/// walk every bucket of the connection table on each read.
fn listening_inodes(port: u16) -> io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        each_listener(family, |local_port, inode| {
            if local_port == port {
                inodes.insert(u64::from(inode));
            }
        })?;
    }
    Ok(inodes)
}

/// The states asked for: only `TCP_LISTEN` (10), as a bit.
const TCPF_LISTEN: u32 = 1 << 10;
/// `SOCK_DIAG_BY_FAMILY`, the request and answer type of socket diagnostics.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// The netlink header: length, type, flags, sequence number, port id.
const NLMSG_HEADER: usize = 16;
/// `struct inet_diag_msg`: family, state, timer, retransmits, the socket's
/// id (local port at bytes 4–5, big-endian), expiry, queues, uid, inode
/// (bytes 68–71).
const DIAG_MSG_BYTES: usize = 72;

/// Calls `each(local port, inode)` for every TCP socket of `family` in the
/// listening state.
///
/// The request and the answers are packed and read here rather than
/// through `netlink-packet-sock-diag` + `netlink-sys`, measured side by side
/// (both families, opt-level 3, same answers): with 21 listeners the crates
/// took 63–66 µs against 56–63 µs here, with 201 listeners 211–260 µs
/// against 121–140 µs, since they parse every answer into an owned
/// structure with its attributes where only two fields are read; and they
/// would add three crates.
fn each_listener(family: i32, mut each: impl FnMut(u16, u32)) -> io::Result<()> {
    use nix::sys::socket::{
        recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
        SockType,
    };
    use std::os::fd::AsRawFd;

    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    // A dump request: the netlink header, then `struct inet_diag_req_v2`
    // (family, protocol, extensions, padding, states, a zeroed socket id).
    let mut request = Vec::with_capacity(NLMSG_HEADER + 56);
    request.extend(((NLMSG_HEADER + 56) as u32).to_ne_bytes());
    request.extend(SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    request.extend(((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    request.extend(1u32.to_ne_bytes());
    request.extend(0u32.to_ne_bytes());
    request.extend([family as u8, libc::IPPROTO_TCP as u8, 0, 0]);
    request.extend(TCPF_LISTEN.to_ne_bytes());
    request.extend([0u8; 48]);
    sendto(
        fd.as_raw_fd(),
        &request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let malformed = || io::Error::other("a malformed socket diagnostics answer");
    let mut answer = [0u8; 8 << 10];
    loop {
        let n = recv(fd.as_raw_fd(), &mut answer, MsgFlags::empty())?;
        if n == 0 {
            return Err(malformed());
        }
        let mut at = 0;
        while at + NLMSG_HEADER <= n {
            let word = |i: usize| {
                u32::from_ne_bytes([answer[i], answer[i + 1], answer[i + 2], answer[i + 3]])
            };
            let len = word(at) as usize;
            let kind = u16::from_ne_bytes([answer[at + 4], answer[at + 5]]);
            if len < NLMSG_HEADER || at + len > n {
                return Err(malformed());
            }
            match i32::from(kind) {
                libc::NLMSG_DONE => return Ok(()),
                libc::NLMSG_ERROR => {
                    let errno = i32::from_ne_bytes(word(at + NLMSG_HEADER).to_ne_bytes());
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                _ if kind == SOCK_DIAG_BY_FAMILY && len >= NLMSG_HEADER + DIAG_MSG_BYTES => {
                    let msg = at + NLMSG_HEADER;
                    let local_port = u16::from_be_bytes([answer[msg + 4], answer[msg + 5]]);
                    each(local_port, word(msg + 68));
                }
                _ => {}
            }
            // Messages are aligned to 4 bytes.
            at += (len + 3) & !3;
        }
    }
}

/// The process group of `pid`.
fn process_group(pid: u32) -> Option<u32> {
    proc::stat(pid).ok().map(|stat| stat.pgrp)
}

/// The socket inodes among the open files of `pid`.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return HashSet::new();
    };
    fds.flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The sockets listening on a port, by whose they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Census {
    /// Listening sockets of the process group asked about.
    pub ours: usize,
    /// Listening sockets of anyone else (or of processes this user cannot
    /// look into).
    pub strangers: usize,
}

/// Counts the sockets listening on `port`, those of process group `group`
/// apart from the rest.
///
/// The group's leader, which is most often the listener itself, is looked
/// into first; the rest of `/proc` only when some listener is not its.
pub fn census(port: u16, group: u32) -> io::Result<Census> {
    let mut listening = listening_inodes(port)?;
    let all = listening.len();
    for inode in socket_inodes(group) {
        listening.remove(&inode);
    }
    if listening.is_empty() {
        return Ok(Census {
            ours: all,
            strangers: 0,
        });
    }
    for pid in proc::pids()? {
        if process_group(pid) == Some(group) {
            for inode in socket_inodes(pid) {
                listening.remove(&inode);
            }
        }
    }
    Ok(Census {
        ours: all - listening.len(),
        strangers: listening.len(),
    })
}

/// A process listening on a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its command line, arguments joined by spaces, cut to
    /// [`COMMAND_SHOWN`] characters.
    pub command: String,
}

/// Characters of a holder's command line shown: enough for Ray's proxier's
/// `python -m ray.util.client.server … --mode=proxy`, not a whole raylet's.
const COMMAND_SHOWN: usize = 200;

/// The processes with a socket listening on TCP `port` (any address), by
/// pid. Only processes whose open files this user may read are found:
/// another user's listener is counted by [`census`] but named by no one.
pub fn holders(port: u16) -> io::Result<Vec<Holder>> {
    let listening = listening_inodes(port)?;
    if listening.is_empty() {
        return Ok(Vec::new());
    }
    let mut pids: Vec<u32> = proc::pids()?.collect();
    pids.sort_unstable();
    Ok(pids
        .into_iter()
        .filter(|&pid| !socket_inodes(pid).is_disjoint(&listening))
        .map(|pid| Holder {
            pid,
            command: command_line(pid),
        })
        .collect())
}

/// The command line of `pid`, arguments joined by spaces and cut to
/// [`COMMAND_SHOWN`] characters; its name in `stat` when it has none.
fn command_line(pid: u32) -> String {
    let line = proc::cmdline(pid).unwrap_or_default().join(" ");
    if line.is_empty() {
        return fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| format!("[{}]", comm.trim()))
            .unwrap_or_else(|_| "?".to_owned());
    }
    match line.char_indices().nth(COMMAND_SHOWN) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Debug;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    /// `probe`'s answer once it is `want`, or its last after a bound. A
    /// process another test is spawning holds a copy of this process's
    /// sockets from its fork to its exec, and is seen listening meanwhile
    /// (and keeps a closed listener open).
    fn settled<T: PartialEq + Debug>(want: &T, probe: impl Fn() -> T) -> T {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let got = probe();
            if got == *want || Instant::now() >= deadline {
                return got;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn the_holder_of_a_port_is_named() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let me = std::process::id();
        let pids = |found: &[Holder]| found.iter().map(|h| h.pid).collect::<Vec<_>>();
        let found = settled(&vec![me], || pids(&holders(port).expect("read /proc")));
        assert_eq!(found, [me]);
        let found = holders(port).expect("read /proc");
        let own = found.iter().find(|h| h.pid == me).expect("this process");
        let exe = std::env::current_exe().expect("exe");
        let name = exe.file_name().expect("name").to_string_lossy();
        assert!(own.command.contains(name.as_ref()), "{found:?}");
        drop(listener);
        let found = settled(&vec![], || holders(port).expect("read /proc"));
        assert_eq!(found, []);
    }

    #[test]
    fn a_listener_of_this_process_group_is_no_stranger() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let own_group = process_group(std::process::id()).expect("own group");
        let census_of = |group| census(port, group).expect("read /proc");
        assert_eq!(
            census_of(own_group),
            Census {
                ours: 1,
                strangers: 0
            }
        );
        // Seen from any other group, the same listener is a stranger.
        assert_eq!(
            census_of(u32::MAX),
            Census {
                ours: 0,
                strangers: 1
            }
        );
        drop(listener);
        let none = Census {
            ours: 0,
            strangers: 0,
        };
        assert_eq!(settled(&none, || census_of(u32::MAX)), none);
    }
}
