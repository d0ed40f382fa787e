//! Keeping every process a module starts within reach: the host as a child
//! subreaper, each incarnation in a cgroup of its own where it can be, and
//! what an incarnation's end and the host's exit kill. Process-wide, as the
//! subreaper flag and the cgroup it goes with are: set once at start by
//! [`contain`], used by every module task.

use std::sync::OnceLock;
use std::time::Duration;

use rustix::process::Signal;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cgroup::{Cgroups, IncarnationCgroup};
use super::descendants::Descendants;
use crate::config::CgroupMode;

/// How often, at most, the host looks at all its descendants when it has
/// no cgroups: the staleness of who-owns-what for an orphan whose parent
/// dies (see [`super::descendants`]). With cgroups an incarnation's end
/// needs no memory of earlier looks, and the host looks only then.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A look reads a few small `/proc` files per process below the host and
/// per thread of each (500 single-threaded processes: about 45 ms in a
/// debug build): the pause after a look is at least this many times as
/// long as the look took, so that looking takes at most 2% of a core.
const LOOK_PAUSE_FACTOR: u32 = 50;

/// The process-wide containment.
#[derive(Debug)]
pub(crate) struct Containment {
    pub(crate) descendants: Descendants,
    /// `None` when cgroups are off or cannot be used here.
    pub(crate) cgroups: Option<Cgroups>,
}

static CONTAINMENT: OnceLock<Containment> = OnceLock::new();

/// Makes the host a child subreaper and sets up the modules' cgroups as
/// `mode` asks; logs what it could do. Call once, before any module starts.
pub fn contain(mode: CgroupMode) {
    // Orphans below the host come to it instead of init: they stay in its
    // subtree, where an incarnation's end can find them.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        warn!(error = %e, "cannot become a child subreaper; orphaned module processes go to init, out of reach");
    }
    let cgroups = match mode {
        CgroupMode::Off => {
            info!("cgroups off (server.cgroups); module processes in other sessions outlive a SIGKILL of ray-dashd");
            None
        }
        CgroupMode::Auto => match Cgroups::set_up() {
            Ok(cgroups) => {
                info!(cgroup = %cgroups.base().display(), "each module incarnation runs in a cgroup of its own");
                Some(cgroups)
            }
            Err(reason) => {
                info!(%reason, "cgroups not usable; module processes are found through /proc, and those in other sessions outlive a SIGKILL of ray-dashd");
                None
            }
        },
    };
    let descendants = Descendants::new();
    let containment = Containment {
        descendants,
        cgroups,
    };
    if let Some(warden) = containment.cgroups.as_ref().and_then(Cgroups::warden) {
        containment.descendants.protect_pid(warden);
    }
    if let Err(extra) = CONTAINMENT.set(containment) {
        // Set up twice: the second cgroup goes again.
        if let Some(cgroups) = extra.cgroups {
            cgroups.remove_all();
        }
    }
}

/// The containment: what [`contain`] set up, or (without it) no cgroups.
pub(crate) fn containment() -> &'static Containment {
    CONTAINMENT.get_or_init(|| Containment {
        descendants: Descendants::new(),
        cgroups: None,
    })
}

impl Containment {
    /// Makes the cgroup of a new incarnation, when cgroups are in use; a
    /// failure is logged, and the incarnation runs without.
    pub(crate) fn cgroup_for(&self, module: &str, incarnation: u32) -> Option<IncarnationCgroup> {
        let cgroups = self.cgroups.as_ref()?;
        match cgroups.create(module, incarnation) {
            Ok(cgroup) => Some(cgroup),
            Err(error) => {
                warn!(module, incarnation, %error, "cannot make the incarnation's cgroup; it runs without");
                None
            }
        }
    }
}

/// Just before an incarnation led by `leader` is stopped: records who
/// belongs to it while their parents still live, and sends SIGTERM (and
/// SIGCONT) to those of them that its process group does not reach.
pub(crate) async fn before_stop(leader: u32) {
    let signalled = tokio::task::spawn_blocking(move || {
        // A stopped (SIGSTOP) process acts on SIGTERM once continued.
        containment()
            .descendants
            .signal_outside_group(leader, &[Signal::TERM, Signal::CONT])
    })
    .await
    .unwrap_or_default();
    if signalled > 0 {
        debug!(
            pid = leader,
            signalled, "sent SIGTERM to module processes outside its group"
        );
    }
}

/// Once the incarnation led by `leader` has stopped (its process reaped):
/// kills its cgroup and whatever else of it is left, and forgets it.
pub(crate) async fn after_stop(leader: u32, cgroup: Option<IncarnationCgroup>) {
    let killed = tokio::task::spawn_blocking(move || {
        if let Some(cgroup) = cgroup {
            cgroup.kill_and_remove();
        }
        let descendants = &containment().descendants;
        let killed = descendants.kill_owned(leader);
        descendants.release(leader);
        killed
    })
    .await
    .unwrap_or_default();
    if killed > 0 {
        info!(
            pid = leader,
            killed, "killed processes the module left behind"
        );
    }
}

/// Until `stop`: reaps adopted orphans whenever a child of the host exits,
/// and, without cgroups, looks at all the host's descendants every
/// [`LOOK_EVERY`] (or [`LOOK_PAUSE_FACTOR`] times as long as the last look
/// took) to remember who owns what.
pub(crate) async fn watch(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut exits = match signal(SignalKind::child()) {
        Ok(exits) => Some(exits),
        Err(e) => {
            warn!(error = %e, "cannot watch SIGCHLD; adopted orphans are reaped once a second");
            None
        }
    };
    let looks = containment().cgroups.is_none();
    let mut next_look = tokio::time::Instant::now() + LOOK_EVERY;
    loop {
        let child_exited = tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next_look) => false,
            Some(()) = async { match exits.as_mut() {
                Some(exits) => exits.recv().await,
                None => std::future::pending().await,
            } } => true,
        };
        if child_exited || !looks {
            // The signal, or (with cgroups) the timer as a net for
            // signals that coalesced: the host's own children only.
            let _ = tokio::task::spawn_blocking(|| containment().descendants.reap()).await;
            if !child_exited {
                next_look = tokio::time::Instant::now() + LOOK_EVERY;
            }
            continue;
        }
        let started = tokio::time::Instant::now();
        let _ = tokio::task::spawn_blocking(|| containment().descendants.look()).await;
        next_look =
            tokio::time::Instant::now() + LOOK_EVERY.max(started.elapsed() * LOOK_PAUSE_FACTOR);
    }
}

/// On exit, once every module is stopped: kills what is left below the
/// host and removes its cgroups.
pub(crate) async fn sweep() {
    let killed = tokio::task::spawn_blocking(|| {
        let containment = containment();
        if let Some(cgroups) = &containment.cgroups {
            cgroups.remove_all();
        }
        containment.descendants.kill_all()
    })
    .await
    .unwrap_or_default();
    if killed > 0 {
        info!(killed, "killed processes the modules left behind");
    }
}
