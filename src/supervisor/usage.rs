//! What a module incarnation's processes use right now: CPU time, whether
//! one is stopped, resident memory. The task samples it at every health
//! check, to tell a *busy* module (its event loop blocked while it works:
//! a missed check is no failure yet) from a *hung* one (stopped, or idle
//! and silent), and to hold the module to its memory budget. Blocking:
//! every sample reads `/proc`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ray_dashd_contract::proc;
// Tokio's clock: the supervisor's tests pause and advance it.
use ray_dashd_contract::LockExt;
use tokio::time::Instant;

use super::containment::containment;

/// The least share of one CPU that a module's processes must have used
/// since the previous sample for a missed health check to count as busy:
/// an event loop blocked on a computation uses a whole CPU, or what the
/// scheduler leaves it on a crowded machine; one blocked waiting on
/// something that never comes uses next to none.
pub(crate) const BUSY_CPU_SHARE: f64 = 0.2;

/// One look at an incarnation's processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// CPU time used so far by its live processes together, user and
    /// kernel, in clock ticks.
    pub(crate) cpu_ticks: u64,
    /// The clock ticks in a second (`sysconf(_SC_CLK_TCK)`).
    pub(crate) ticks_per_sec: u64,
    /// Nanoseconds its processes' main threads waited to run (runnable, on
    /// a run queue), from `/proc/<pid>/schedstat`: a busy process starved
    /// of CPU by others waits instead of running.
    pub(crate) wait_ns: u64,
    /// Whether one of its processes is stopped (`T`, a SIGSTOP) or stopped
    /// by a tracer (`t`).
    pub(crate) stopped: bool,
    /// Whether one of its processes' main threads (where a module's event
    /// loop runs) is running or waiting to run (`R`). On a crowded machine
    /// a busy process may wait for the CPU through a whole interval, and
    /// `wait_ns` counts a wait only once it has ended: the share then reads
    /// near 0, while the state says it is working.
    pub(crate) runnable: bool,
    /// Their resident memory together (`VmRSS`), in bytes.
    pub(crate) rss_bytes: u64,
    /// How many live processes it has.
    pub(crate) processes: usize,
}

impl Usage {
    /// The share of one CPU used between `earlier` and this sample, taken
    /// `elapsed` apart, the time its main threads waited to run counted as
    /// used: a module busy computing on a crowded machine (it runs nicer
    /// than the rest) waits for the CPU more than it gets it. 0 when no
    /// time passed.
    pub(crate) fn cpu_share_since(&self, earlier: &Usage, elapsed: Duration) -> f64 {
        let secs = elapsed.as_secs_f64();
        if secs <= 0.0 || self.ticks_per_sec == 0 {
            return 0.0;
        }
        let ticks = self.cpu_ticks.saturating_sub(earlier.cpu_ticks);
        let waited = self.wait_ns.saturating_sub(earlier.wait_ns);
        (ticks as f64 / self.ticks_per_sec as f64 + waited as f64 / 1e9) / secs
    }
}

/// Samples the live processes of the incarnation led by `leader` (itself,
/// its process group, and what it started elsewhere; see
/// [`super::descendants`]). `None` once none of them is left.
pub(crate) fn sample(leader: u32) -> Option<Usage> {
    crate::fault::fault_point!("module-usage-sample");
    let owned = owned_by(leader);
    let mut usage = Usage {
        ticks_per_sec: ticks_per_sec(),
        ..Usage::default()
    };
    for p in owned {
        let Ok(stat) = proc::stat(p.id.pid) else {
            continue;
        };
        if stat.is_dead() || stat.start != p.id.start {
            continue;
        }
        usage.processes += 1;
        usage.cpu_ticks += stat.utime + stat.stime;
        usage.wait_ns += run_queue_wait_ns(p.id.pid).unwrap_or(0);
        usage.stopped |= matches!(stat.state, 'T' | 't');
        usage.runnable |= stat.state == 'R';
        usage.rss_bytes += proc::status_kib(p.id.pid, "VmRSS").unwrap_or(0) * 1024;
    }
    (usage.processes > 0).then_some(usage)
}

/// How old a look at the host's descendants may be for a sample: every
/// module task samples once per health check, and one walk of the tree
/// serves all the samples taken within this.
const LOOK_REUSE: Duration = Duration::from_millis(500);

/// The processes of `leader`'s incarnation, from a look at most
/// [`LOOK_REUSE`] old (a process started since counts from the next).
fn owned_by(leader: u32) -> Vec<super::descendants::Proc> {
    type Look = Vec<(super::descendants::Proc, Option<u32>)>;
    static LAST: Mutex<Option<(std::time::Instant, Arc<Look>)>> = Mutex::new(None);
    let recent = {
        let last = LAST.locked();
        last.as_ref()
            .filter(|(at, _)| at.elapsed() < LOOK_REUSE)
            .map(|(_, look)| Arc::clone(look))
    };
    let look = recent.unwrap_or_else(|| {
        let look = Arc::new(containment().descendants.look());
        *LAST.locked() = Some((std::time::Instant::now(), Arc::clone(&look)));
        look
    });
    look.iter()
        .filter(|(p, owner)| !p.zombie && *owner == Some(leader))
        .map(|(p, _)| *p)
        .collect()
}

/// The time `pid`'s main thread has waited on a run queue, in ns: the
/// second field of `/proc/<pid>/schedstat` (`None` without schedstats).
fn run_queue_wait_ns(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux in use.
fn ticks_per_sec() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// What a missed health check (no answer in time) means, given the
/// module's processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Miss {
    /// Its processes used this share of a CPU since the last sample (or
    /// were runnable at it), and none is stopped: it is working, its loop
    /// blocked. It has been so since `for_` ago; not a failure until
    /// `busy_max`. No share: the look with this miss was not taken in
    /// time, and the busy run it interrupts goes on (a run starts only
    /// with a share).
    Busy { share: Option<f64>, for_: Duration },
    /// Busy, but for longer than `busy_max`: a loop that never ends.
    BusyTooLong { for_: Duration },
    /// Stopped, or idle and silent, or not sampled in time: a failure.
    Hung,
}

/// What a module judged busy with `share` of a CPU was doing, for people:
/// using the CPU, or (below [`BUSY_CPU_SHARE`], judged busy because it was
/// runnable) waiting for one.
pub(crate) fn busy_doing(share: f64) -> String {
    if share >= BUSY_CPU_SHARE {
        format!("using {}% of a CPU", (share * 100.0).round())
    } else {
        "waiting for a CPU".to_owned()
    }
}

/// The samples of one incarnation, and how long it has been busy.
#[derive(Debug, Default)]
pub(crate) struct Vitals {
    last: Option<(Usage, Instant)>,
    /// When the current run of busy misses began.
    busy_since: Option<Instant>,
}

impl Vitals {
    /// Takes a new sample (taken at `at`); returns the CPU share used since
    /// the previous one, when there was one. A sample that could not be
    /// taken (`None`: too slow on a crowded machine) leaves the previous
    /// one in place, so that the next share spans both intervals: one slow
    /// look costs one unjudged miss, not two.
    pub(crate) fn record(&mut self, usage: Option<Usage>, at: Instant) -> Option<f64> {
        let now = usage?;
        let share = self
            .last
            .map(|(before, then)| now.cpu_share_since(&before, at.saturating_duration_since(then)));
        self.last = Some((now, at));
        share
    }

    /// Judges a missed check at `at`, given the share [`Vitals::record`]
    /// returned for the sample taken with it.
    pub(crate) fn missed(&mut self, share: Option<f64>, at: Instant, busy_max: Duration) -> Miss {
        let (stopped, runnable) = self
            .last
            .map_or((false, false), |(u, _)| (u.stopped, u.runnable));
        let busy = match share {
            Some(share) => (share >= BUSY_CPU_SHARE || runnable) && !stopped,
            // No share (the look not taken in time on a crowded machine):
            // nothing new is known, so a busy run under way goes on, and
            // busy_max still bounds it; without one, the miss is a failure.
            None => self.busy_since.is_some(),
        };
        if !busy {
            self.busy_since = None;
            return Miss::Hung;
        }
        let since = *self.busy_since.get_or_insert(at);
        let for_ = at.saturating_duration_since(since);
        if for_ >= busy_max {
            Miss::BusyTooLong { for_ }
        } else {
            Miss::Busy { share, for_ }
        }
    }

    /// The module answered: whatever run of busy misses there was is over.
    pub(crate) fn answered(&mut self) {
        self.busy_since = None;
    }

    /// The resident memory of the last sample taken, in bytes.
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        self.last.map(|(u, _)| u.rss_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy_at(ticks: u64) -> Option<Usage> {
        Some(Usage {
            cpu_ticks: ticks,
            ticks_per_sec: 100,
            processes: 1,
            ..Usage::default()
        })
    }

    #[test]
    fn a_module_using_cpu_is_busy_until_busy_max() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let max = Duration::from_secs(3);
        let mut v = Vitals::default();
        assert_eq!(v.record(busy_at(0), s(0)), None);
        // With no share known (the first sample) a miss is a failure.
        assert_eq!(v.missed(None, s(0), max), Miss::Hung);
        let share = v.record(busy_at(90), s(1));
        assert_eq!(share, Some(0.9));
        assert_eq!(
            v.missed(share, s(1), max),
            Miss::Busy {
                share: Some(0.9),
                for_: Duration::ZERO
            }
        );
        let share = v.record(busy_at(190), s(2));
        assert!(
            matches!(v.missed(share, s(2), max), Miss::Busy { for_, .. } if for_ == Duration::from_secs(1))
        );
        let share = v.record(busy_at(290), s(4));
        assert_eq!(
            v.missed(share, s(4), max),
            Miss::BusyTooLong {
                for_: Duration::from_secs(3)
            }
        );
        // An answer ends the run: the next busy miss starts a new one.
        v.answered();
        let share = v.record(busy_at(390), s(5));
        assert!(matches!(v.missed(share, s(5), max), Miss::Busy { for_, .. } if for_.is_zero()));
    }

    #[test]
    fn a_module_waiting_for_the_cpu_is_busy() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let max = Duration::from_secs(60);
        let mut v = Vitals::default();
        v.record(busy_at(0), s(0));
        // No CPU got, no wait ended, but runnable at the look: starved.
        let starved = busy_at(1).map(|u| Usage {
            runnable: true,
            ..u
        });
        let share = v.record(starved, s(1));
        assert_eq!(share, Some(0.01));
        assert!(matches!(v.missed(share, s(1), max), Miss::Busy { for_, .. } if for_.is_zero()));
        // The same, asleep: hung.
        let share = v.record(busy_at(2), s(2));
        assert_eq!(v.missed(share, s(2), max), Miss::Hung);
        // One of its processes runnable and another stopped: stopped wins.
        let both = starved.map(|u| Usage {
            stopped: true,
            cpu_ticks: 3,
            ..u
        });
        let share = v.record(both, s(3));
        assert_eq!(v.missed(share, s(3), max), Miss::Hung);
    }

    #[test]
    fn an_idle_or_stopped_module_is_hung() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let max = Duration::from_secs(60);
        let mut v = Vitals::default();
        v.record(busy_at(0), s(0));
        // 5 ticks in a second: 5 % of a CPU, below the busy share.
        let share = v.record(busy_at(5), s(1));
        assert_eq!(v.missed(share, s(1), max), Miss::Hung);
        // Using CPU but stopped (the sample's CPU was used before the stop).
        let stopped = busy_at(100).map(|u| Usage { stopped: true, ..u });
        let share = v.record(stopped, s(2));
        assert_eq!(share, Some(0.95));
        assert_eq!(v.missed(share, s(2), max), Miss::Hung);
        // Gone, or too slow to sample: nothing to judge by.
        let share = v.record(None, s(3));
        assert_eq!(v.missed(share, s(3), max), Miss::Hung);
    }

    #[test]
    fn a_sample_not_taken_leaves_the_one_before() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let max = Duration::from_secs(60);
        let mut v = Vitals::default();
        assert_eq!(v.rss_bytes(), None);
        v.record(busy_at(0), s(0));
        // The look at s(1) took too long: that miss cannot be judged busy...
        let share = v.record(None, s(1));
        assert_eq!(v.missed(share, s(1), max), Miss::Hung);
        // ...but the next is, against the sample at s(0): 190 ticks in 2 s.
        let share = v.record(busy_at(190), s(2));
        assert_eq!(share, Some(0.95));
        assert!(matches!(v.missed(share, s(2), max), Miss::Busy { for_, .. } if for_.is_zero()));
        assert_eq!(v.rss_bytes(), Some(0));
        // Another look too slow continues the busy run it interrupts; the
        // miss is not a failure.
        let share = v.record(None, s(3));
        assert_eq!(
            v.missed(share, s(3), max),
            Miss::Busy {
                share: None,
                for_: Duration::from_secs(1)
            }
        );
        let share = v.record(busy_at(390), s(4));
        assert!(
            matches!(v.missed(share, s(4), max), Miss::Busy { for_, .. } if for_ == Duration::from_secs(2))
        );
        // Looks never taken do not keep it busy past busy_max.
        let share = v.record(None, s(62));
        assert_eq!(
            v.missed(share, s(62), max),
            Miss::BusyTooLong {
                for_: Duration::from_secs(60)
            }
        );
    }

    #[test]
    fn cpu_share_is_the_ticks_used_over_the_time_passed() {
        let at = |ticks| Usage {
            cpu_ticks: ticks,
            ticks_per_sec: 100,
            processes: 1,
            ..Usage::default()
        };
        let second = Duration::from_secs(1);
        assert_eq!(at(150).cpu_share_since(&at(50), second), 1.0);
        assert_eq!(
            at(60).cpu_share_since(&at(50), Duration::from_secs(2)),
            0.05
        );
        // A process that ended takes its ticks with it: never negative.
        assert_eq!(at(10).cpu_share_since(&at(50), second), 0.0);
        assert_eq!(at(150).cpu_share_since(&at(50), Duration::ZERO), 0.0);
        // Starved: 5 ticks run, 400 ms waited to run, in a second.
        let waited = |ticks, wait_ns| Usage {
            wait_ns,
            ..at(ticks)
        };
        let share = waited(55, 400_000_000).cpu_share_since(&waited(50, 0), second);
        assert!((share - 0.45).abs() < 1e-9, "{share}");
        assert!(run_queue_wait_ns(std::process::id()).is_some());
    }
}
