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

use std::collections::HashSet;
use std::fs;
use std::io;

/// The inodes of the sockets listening on TCP `port`, any address.
fn listening_inodes(port: u16) -> io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match fs::read_to_string(table) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode`
        for row in text.lines().skip(1) {
            let fields: Vec<&str> = row.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let local_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            // 0A is LISTEN.
            if local_port == Some(port) && *state == "0A" {
                if let Ok(inode) = inode.parse() {
                    inodes.insert(inode);
                }
            }
        }
    }
    Ok(inodes)
}

/// The process group of `pid` (field 5 of its stat).
fn process_group(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    after_name.split_whitespace().nth(2)?.parse().ok()
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
pub fn census(port: u16, group: u32) -> io::Result<Census> {
    let mut listening = listening_inodes(port)?;
    let all = listening.len();
    if all == 0 {
        return Ok(Census {
            ours: 0,
            strangers: 0,
        });
    }
    for entry in fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

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
        assert_eq!(
            census_of(u32::MAX),
            Census {
                ours: 0,
                strangers: 0
            }
        );
    }
}
