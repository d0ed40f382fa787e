//! The processes a module incarnation leaves behind, found through `/proc`
//! whatever session or process group they moved to, and killed when the
//! incarnation ends; and the zombies of the orphans the host adopts,
//! reaped. Blocking: every call here reads `/proc`.
//!
//! # Who owns a process
//!
//! The host is a child subreaper (`PR_SET_CHILD_SUBREAPER`): an orphan
//! anywhere below it is re-parented to the host, not to init, so whatever
//! a module starts stays in the host's subtree until it exits. A process
//! there belongs to the incarnation
//!
//! 1. that it is, or whose process group it is in: the group the host
//!    starts each module in, which a module forked by the zygote joins
//!    too, though it is the zygote's child;
//! 2. else, that its parent belongs to: a child that called `setsid()`,
//!    and everything below it;
//! 3. else, that an earlier look found it to belong to: an orphan
//!    re-parented to the host since (the host looks every second, and
//!    once more just before it stops an incarnation);
//! 4. else, for an orphan adopted before any look saw its parent (a double
//!    fork is over in a millisecond), the one its environment names
//!    (`RAY_DASHD_MODULE`, `RAY_DASHD_INCARNATION`, as they were at its
//!    exec: a process may clear them).
//!
//! Anything else belongs to no incarnation and is killed when the host
//! exits. Where cgroups can be used ([`super::cgroup`]) they make this
//! exact; this is what is left without them, and the net beneath them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;
use ray_dashd_contract::names::{INCARNATION_VAR, MODULE_VAR};
use ray_dashd_contract::proc;
use ray_dashd_contract::LockExt;
use rustix::process::{pidfd_open, pidfd_send_signal, PidfdFlags, Signal};
use tracing::{debug, warn};

/// Rounds of look-and-kill when an incarnation ends: each round kills what
/// it sees, and what those had just forked shows up in the next.
const KILL_ROUNDS: usize = 20;
/// Between two rounds: long enough for the killed to exit and their
/// children to be re-parented.
const KILL_ROUND_PAUSE: Duration = Duration::from_millis(10);

/// A process, told apart from a later one with the same pid by its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ProcId {
    pub(crate) pid: u32,
    /// Clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub(crate) start: u64,
}

/// What one look at `/proc/<pid>/stat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) id: ProcId,
    pub(crate) ppid: u32,
    pub(crate) pgid: u32,
    pub(crate) zombie: bool,
}

/// A process the host started as a module incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leader {
    pub(crate) module: String,
    pub(crate) incarnation: u32,
}

/// What the host knows about the processes below it.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Module processes by pid, from just before their spawn returns until
    /// their incarnation's descendants are killed. Never reaped here:
    /// their exit status is their task's.
    leaders: HashMap<u32, Leader>,
    /// Other children of the host that are not adopted orphans (the cgroup
    /// warden): never reaped here.
    protected: HashSet<u32>,
    /// Owners found by earlier looks (rule 3), by process.
    seen: HashMap<ProcId, u32>,
}

/// The host's view of its descendants.
#[derive(Debug)]
pub(crate) struct Descendants {
    host: u32,
    /// The host's process group: a zombie child in it is a helper the host
    /// started itself (whoever started it waits for it), never reaped here.
    host_pgid: u32,
    registry: Mutex<Registry>,
}

impl Descendants {
    /// The view of the running process.
    pub(crate) fn new() -> Descendants {
        Descendants {
            host: std::process::id(),
            host_pgid: nix::unistd::getpgrp().as_raw() as u32,
            registry: Mutex::new(Registry::default()),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.locked()
    }

    /// Runs `spawn` (the spawn of incarnation `incarnation` of `module`) and
    /// registers the process, both under the registry's lock: a look that
    /// finds it a zombie in between would otherwise reap it and steal the
    /// exit status its task waits for.
    pub(crate) fn spawn<C>(
        &self,
        module: &str,
        incarnation: u32,
        spawn: impl FnOnce() -> io::Result<C>,
        pid_of: impl FnOnce(&C) -> Option<u32>,
    ) -> io::Result<C> {
        let mut registry = self.registry();
        let child = spawn()?;
        if let Some(pid) = pid_of(&child) {
            registry.leaders.insert(
                pid,
                Leader {
                    module: module.to_owned(),
                    incarnation,
                },
            );
        }
        Ok(child)
    }

    /// Marks `pid`, a child the host started itself, as never to be reaped
    /// here.
    pub(crate) fn protect_pid(&self, pid: u32) {
        self.registry().protected.insert(pid);
    }

    /// Forgets the incarnation led by `leader`, once its task has its exit
    /// status and its descendants are dead.
    pub(crate) fn release(&self, leader: u32) {
        let mut registry = self.registry();
        registry.leaders.remove(&leader);
        registry.seen.retain(|_, owner| *owner != leader);
    }

    /// Looks at every descendant of the host: records who owns it, reaps
    /// the zombies of adopted orphans, and returns the owners found.
    pub(crate) fn look(&self) -> Vec<(Proc, Option<u32>)> {
        let tree = walk(self.host);
        let mut registry = self.registry();
        let owners = owners(&tree, self.host, &registry, env_tag);
        // Merged, not replaced: another look may have walked later and
        // locked sooner. What has exited since is let go.
        let found: Vec<(ProcId, u32)> = tree
            .iter()
            .zip(&owners)
            .filter(|(p, _)| !p.zombie)
            .filter_map(|(p, owner)| owner.map(|o| (p.id, o)))
            .collect();
        registry.seen.extend(found);
        let walked: HashSet<ProcId> = tree.iter().map(|p| p.id).collect();
        registry.seen.retain(|id, _| {
            walked.contains(id) || stat(id.pid).is_some_and(|p| p.id == *id && !p.zombie)
        });
        for p in &tree {
            if self.adopted_zombie(p, &registry) {
                self.reap_one(p);
            }
        }
        tree.into_iter().zip(owners).collect()
    }

    /// Reaps the zombies of adopted orphans among the host's children; a
    /// look at the host's children only, cheap enough for every SIGCHLD.
    pub(crate) fn reap(&self) {
        let Ok(pids) = children(self.host) else {
            return;
        };
        let zombies: Vec<Proc> = pids
            .into_iter()
            .filter_map(stat)
            .filter(|p| p.zombie)
            .collect();
        if zombies.is_empty() {
            return;
        }
        let registry = self.registry();
        for p in &zombies {
            if self.adopted_zombie(p, &registry) {
                self.reap_one(p);
            }
        }
    }

    fn reap_one(&self, p: &Proc) {
        match waitpid(Pid::from_raw(p.id.pid as i32), Some(WaitPidFlag::WNOHANG)) {
            Ok(_) | Err(Errno::ECHILD) => {}
            Err(e) => debug!(pid = p.id.pid, error = %e, "cannot reap adopted orphan"),
        }
    }

    /// Whether `p` is a zombie the host adopted as a subreaper: its child,
    /// but none that the host started itself.
    fn adopted_zombie(&self, p: &Proc, registry: &Registry) -> bool {
        p.zombie
            && p.ppid == self.host
            && p.pgid != self.host_pgid
            && !registry.leaders.contains_key(&p.id.pid)
            && !registry.protected.contains(&p.id.pid)
    }

    /// The live processes that belong to the incarnation led by `leader`
    /// (itself included), after a fresh look.
    pub(crate) fn owned_by(&self, leader: u32) -> Vec<Proc> {
        self.look()
            .into_iter()
            .filter(|(p, owner)| !p.zombie && *owner == Some(leader))
            .map(|(p, _)| p)
            .collect()
    }

    /// Sends `signals`, in order, to the processes of `leader`'s
    /// incarnation that its process group does not reach (they left it);
    /// returns how many there were.
    pub(crate) fn signal_outside_group(&self, leader: u32, signals: &[Signal]) -> usize {
        let outside: Vec<Proc> = self
            .owned_by(leader)
            .into_iter()
            .filter(|p| p.pgid != leader)
            .collect();
        for signal in signals {
            for p in &outside {
                send(p, *signal);
            }
        }
        outside.len()
    }

    /// Kills every process left of `leader`'s incarnation, look after look
    /// until none is left; returns how many were killed.
    pub(crate) fn kill_owned(&self, leader: u32) -> usize {
        self.kill_until_none(|| {
            self.owned_by(leader)
                .into_iter()
                .filter(|p| p.id.pid != leader)
                .collect()
        })
    }

    /// Kills every descendant of the host but those it protects: on exit,
    /// once the modules are stopped, so that nothing a module started (and
    /// no look could tell whose) outlives the host.
    pub(crate) fn kill_all(&self) -> usize {
        self.kill_until_none(|| {
            let protected = self.registry().protected.clone();
            self.look()
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| !p.zombie && !protected.contains(&p.id.pid))
                .collect()
        })
    }

    fn kill_until_none(&self, mut targets: impl FnMut() -> Vec<Proc>) -> usize {
        let mut killed = HashSet::new();
        for _ in 0..KILL_ROUNDS {
            let left = targets();
            if left.is_empty() {
                return killed.len();
            }
            for p in &left {
                if send(p, Signal::KILL) {
                    killed.insert(p.id);
                }
            }
            std::thread::sleep(KILL_ROUND_PAUSE);
        }
        let left: Vec<u32> = targets().iter().map(|p| p.id.pid).collect();
        if !left.is_empty() {
            warn!(pids = ?left, "processes a module left behind would not die");
        }
        killed.len()
    }
}

/// Which incarnation (by its leader's pid) owns each process of `tree`,
/// a walk from `host` that lists every parent before its children; see
/// the rules in the module's documentation. `tag` reads a process's
/// module and incarnation from its environment.
pub(crate) fn owners(
    tree: &[Proc],
    host: u32,
    registry: &Registry,
    tag: impl Fn(u32) -> Option<Leader>,
) -> Vec<Option<u32>> {
    let live = |leader: u32| registry.leaders.contains_key(&leader).then_some(leader);
    let mut found: HashMap<u32, Option<u32>> = HashMap::with_capacity(tree.len());
    let mut owners = Vec::with_capacity(tree.len());
    for p in tree {
        let owner = live(p.id.pid)
            .or_else(|| live(p.pgid))
            .or_else(|| {
                (p.ppid != host)
                    .then(|| found.get(&p.ppid).copied().flatten())
                    .flatten()
            })
            .or_else(|| registry.seen.get(&p.id).copied().and_then(live))
            .or_else(|| {
                (p.ppid == host)
                    .then(|| tag(p.id.pid))
                    .flatten()
                    .and_then(|tag| {
                        registry
                            .leaders
                            .iter()
                            .find(|(_, leader)| **leader == tag)
                            .map(|(pid, _)| *pid)
                    })
            });
        found.insert(p.id.pid, owner);
        owners.push(owner);
    }
    owners
}

/// Sends `signal` to `p` if it is still the process that was seen: the
/// pidfd pins whatever process has the pid now, and the start time says
/// whether that is the one.
fn send(p: &Proc, signal: Signal) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(p.id.pid as i32) else {
        return false;
    };
    let pidfd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => Some(fd),
        // Before Linux 5.3: a pid reused between the check and the kill
        // is the risk left.
        Err(rustix::io::Errno::NOSYS) => None,
        Err(_) => return false,
    };
    if stat(p.id.pid).map(|now| now.id) != Some(p.id) {
        return false;
    }
    match pidfd {
        Some(fd) => pidfd_send_signal(&fd, signal).is_ok(),
        None => rustix::process::kill_process(pid, signal).is_ok(),
    }
}

/// Every descendant of `root`, each parent before its children.
pub(crate) fn walk(root: u32) -> Vec<Proc> {
    match children(root) {
        Ok(first) => walk_down(first, |pid| children(pid).unwrap_or_default()),
        // No `/proc/<pid>/task/<tid>/children` (a kernel without
        // CONFIG_PROC_CHILDREN): every process's parent, from a scan.
        Err(_) => {
            let mut by_parent: HashMap<u32, Vec<u32>> = HashMap::new();
            for p in scan() {
                by_parent.entry(p.ppid).or_default().push(p.id.pid);
            }
            let first = by_parent.remove(&root).unwrap_or_default();
            walk_down(first, |pid| {
                by_parent.get(&pid).cloned().unwrap_or_default()
            })
        }
    }
}

fn walk_down(first: Vec<u32>, mut children: impl FnMut(u32) -> Vec<u32>) -> Vec<Proc> {
    let mut tree = Vec::new();
    let mut visited = HashSet::new();
    let mut queue: VecDeque<u32> = first.into();
    while let Some(pid) = queue.pop_front() {
        if !visited.insert(pid) {
            continue;
        }
        let Some(p) = stat(pid) else { continue };
        tree.push(p);
        // A zombie too: `stat` says Z once the main thread has exited,
        // while other threads may live on, holding the main thread's
        // children (seen: a forked Python module being killed, its
        // setsid() child invisible beneath it until the host had exited).
        queue.extend(children(pid));
    }
    tree
}

/// The children of every thread of `pid` (a process's orphans are
/// re-parented to whichever of the subreaper's threads is alive).
fn children(pid: u32) -> io::Result<Vec<u32>> {
    let mut all = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("children");
        match fs::read_to_string(&path) {
            Ok(text) => all.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            // The feature is missing: the caller scans instead.
            Err(e) if e.kind() == io::ErrorKind::NotFound && pid == std::process::id() => {
                return Err(e)
            }
            // A thread that ended meanwhile.
            Err(_) => {}
        }
    }
    Ok(all)
}

/// Every process on the system.
fn scan() -> Vec<Proc> {
    let Ok(pids) = proc::pids() else {
        return Vec::new();
    };
    pids.filter_map(stat).collect()
}

/// `/proc/<pid>/stat`, or `None` once the process is gone.
pub(crate) fn stat(pid: u32) -> Option<Proc> {
    proc::stat(pid).ok().map(|stat| Proc {
        id: ProcId {
            pid: stat.pid,
            start: stat.start,
        },
        ppid: stat.ppid,
        pgid: stat.pgrp,
        zombie: stat.is_dead(),
    })
}

/// The module and incarnation that `pid`'s environment (at its exec) names.
fn env_tag(pid: u32) -> Option<Leader> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let var = |name: &str| {
        environ.split(|b| *b == 0).find_map(|entry| {
            let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
            String::from_utf8(value.to_vec()).ok()
        })
    };
    Some(Leader {
        module: var(MODULE_VAR)?,
        incarnation: var(INCARNATION_VAR)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: u32 = 100;

    fn proc(pid: u32, ppid: u32, pgid: u32) -> Proc {
        Proc {
            id: ProcId { pid, start: 7 },
            ppid,
            pgid,
            zombie: false,
        }
    }

    fn registry(leaders: &[(u32, &str, u32)]) -> Registry {
        Registry {
            leaders: leaders
                .iter()
                .map(|&(pid, module, incarnation)| {
                    (
                        pid,
                        Leader {
                            module: module.to_owned(),
                            incarnation,
                        },
                    )
                })
                .collect(),
            ..Registry::default()
        }
    }

    #[test]
    fn setsid_children_belong_to_their_parents_incarnation() {
        let reg = registry(&[(200, "a", 0), (300, "b", 4)]);
        let tree = [
            proc(200, HOST, 200),
            proc(300, HOST, 300),
            // a's child, in a's group; its child called setsid().
            proc(201, 200, 200),
            proc(202, 201, 202),
            // b's grandchild in a session of its own.
            proc(301, 300, 300),
            proc(302, 301, 302),
            proc(303, 302, 302),
        ];
        let owners = owners(&tree, HOST, &reg, |_| None);
        assert_eq!(
            owners,
            [
                Some(200),
                Some(300),
                Some(200),
                Some(200),
                Some(300),
                Some(300),
                Some(300)
            ]
        );
    }

    #[test]
    fn a_forked_module_belongs_to_its_shims_group_not_to_the_zygote() {
        // 200 is the zygote's incarnation, 300 the shim of module alpha;
        // the zygote forked 201, which joined the shim's group, and 201
        // started 202 in a session of its own.
        let reg = registry(&[(200, "Z", 0), (300, "alpha", 0)]);
        let tree = [
            proc(200, HOST, 200),
            proc(300, HOST, 300),
            proc(201, 200, 300),
            proc(202, 201, 202),
        ];
        let owners = owners(&tree, HOST, &reg, |_| None);
        assert_eq!(owners, [Some(200), Some(300), Some(300), Some(300)]);
    }

    #[test]
    fn adopted_orphans_are_known_by_an_earlier_look_or_their_environment() {
        let mut reg = registry(&[(200, "a", 3), (300, "b", 0)]);
        // Seen below a's incarnation before its parent exited.
        reg.seen.insert(ProcId { pid: 401, start: 7 }, 200);
        // Seen below an incarnation that is over: no longer its.
        reg.seen.insert(ProcId { pid: 402, start: 7 }, 999);
        let tree = [
            proc(200, HOST, 200),
            proc(401, HOST, 401),
            proc(402, HOST, 402),
            proc(403, HOST, 403),
            proc(404, HOST, 404),
            // Below an orphan nobody owns: nobody's either.
            proc(405, 404, 404),
        ];
        let tag = |pid| match pid {
            403 => Some(Leader {
                module: "b".into(),
                incarnation: 0,
            }),
            // A tag of an incarnation that is over.
            404 => Some(Leader {
                module: "a".into(),
                incarnation: 2,
            }),
            _ => None,
        };
        let owners = owners(&tree, HOST, &reg, tag);
        assert_eq!(owners, [Some(200), Some(200), None, Some(300), None, None]);
        // The same pid started later is another process.
        let later = Proc {
            id: ProcId { pid: 401, start: 8 },
            ..proc(401, HOST, 401)
        };
        assert_eq!(owners_of(&[later], &reg), [None]);
    }

    fn owners_of(tree: &[Proc], reg: &Registry) -> Vec<Option<u32>> {
        owners(tree, HOST, reg, |_| None)
    }

    #[test]
    fn the_walk_finds_a_child_and_its_setsid_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("read pid");
        let grandchild: u32 = line.trim().parse().expect("pid");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stat(grandchild).map(|p| p.pgid) != Some(grandchild) {
            assert!(std::time::Instant::now() < deadline, "setsid never ran");
            std::thread::sleep(Duration::from_millis(5));
        }
        let tree = walk(std::process::id());
        let _ = nix::sys::signal::kill(
            Pid::from_raw(grandchild as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
        let sh = tree
            .iter()
            .position(|p| p.id.pid == child.id())
            .expect("the child is found");
        let sleep = tree
            .iter()
            .position(|p| p.id.pid == grandchild)
            .expect("the grandchild is found");
        assert!(sh < sleep, "parents come first");
        assert_eq!(tree[sleep].ppid, child.id());
        assert_eq!(tree[sleep].pgid, grandchild, "setsid made its own group");
    }
}
