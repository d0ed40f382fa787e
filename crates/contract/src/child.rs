//! The set-up of a child process that a process owns: a process group of
//! its own, so that one signal to the group reaches whatever it starts,
//! and a parent-death signal, so that the kernel kills it when its parent
//! dies, even by SIGKILL. The host's modules and the client proxy's Ray
//! client servers are started so.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// Starts `cmd`'s child in a process group of its own (led by the child)
/// and has the kernel SIGKILL it when the *thread* that spawns it ends:
/// spawn it from a thread that lives as long as the process (a runtime of
/// one thread, or the main thread). Steps `cmd` already has before exec run
/// first; add any after this call to run after.
#[allow(unsafe_code)]
pub fn own_child(cmd: &mut Command) {
    cmd.process_group(0);
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe system calls (prctl, getppid, kill); it allocates
    // nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || die_with_parent(parent));
    }
}

/// In a child between fork and exec: makes the kernel SIGKILL it when its
/// parent dies, and kills it now if `parent` (the pid of the process that
/// forked it, read before the fork) has died already, before the request
/// took effect. Async-signal-safe.
pub fn die_with_parent(parent: Pid) -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid() != parent {
        nix::sys::signal::raise(Signal::SIGKILL)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc;

    /// The child leads a process group of its own.
    #[test]
    fn an_owned_child_leads_its_own_group() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        own_child(&mut cmd);
        let mut child = cmd.spawn().expect("spawn sleep");
        let stat = proc::stat(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let stat = stat.expect("the child's stat");
        assert_eq!(stat.pgrp, child.id());
        assert_eq!(stat.ppid, std::process::id());
    }

    /// The kernel kills the child when the thread that started it ends,
    /// as it would when the whole parent dies.
    #[test]
    fn an_owned_child_dies_with_the_thread_that_started_it() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            own_child(&mut cmd);
            cmd.spawn().expect("spawn sleep")
        })
        .join()
        .expect("the spawning thread");
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status}");
    }
}
