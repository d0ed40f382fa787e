//! The per-module task: it alone owns the module's process, and runs its
//! life: spawn, wait for ready, health-check, fail, stop, back off, respawn.

use std::future::Future;
use std::io;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ray_dashd_contract::{proc, Backoff};
use tokio::sync::mpsc;
// Tokio's clock, not std's: the same in production, and the one the
// supervisor's tests pause and advance.
use tokio::time::{interval_at, sleep, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::health::check_health;
use super::spawn::{log_name, tail, Incarnation, Processes, Spawner};
use super::state::{Gate, ModuleState};
use super::usage::{busy_doing, Miss, Usage, Vitals};
use super::ModuleShared;
use crate::config::{Start, Supervision};
use crate::connection::{listener_pid, ModulePool};
use crate::session::Session;

/// The pauses between startup probes: 2 ms first, doubling up to 50 ms. A
/// compiled module listens within a few milliseconds of its start (the
/// test module in 1.5 ms), and a Python one takes a second or more: the
/// first few probes come quickly, the rest at the cap. Readiness is seen
/// within the cap; a probe of a socket nobody listens on yet costs one
/// failed connect.
const STARTUP_POLLS: Backoff = Backoff::new(Duration::from_millis(2), Duration::from_millis(50));
/// Lines of each log quoted when a module fails.
const TAIL_LINES: usize = 10;
/// The least time between two starts of a module, whatever the settings: a
/// command that cannot even be spawned fails without awaiting anything, and
/// restarting it at once would spin the runtime's thread.
pub(crate) const MIN_RESTART_INTERVAL: Duration = Duration::from_millis(100);

/// A request to a module task.
#[derive(Debug)]
pub(crate) enum Control {
    /// Stop the current incarnation and start a new one now, without backoff.
    Restart,
}

/// How an incarnation ended.
enum End {
    /// It exited, hung, failed its checks or never became ready.
    Failed(String),
    /// An operator asked for a restart.
    Restart,
    /// The host is shutting down.
    Shutdown,
}

/// Where an incarnation is in its life, for what its exit means.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Not ready yet.
    Starting,
    /// Ready; its exit may be the kernel's kill at its memory budget.
    Running {
        /// Its `memory_budget`.
        memory_budget: Option<u64>,
    },
}

/// Generic over its [`Spawner`] so that tests can run it with a fake child;
/// the host runs it with [`Processes`].
pub(crate) struct ModuleTask<S: Spawner = Processes> {
    pub(crate) spawner: S,
    pub(crate) shared: Arc<ModuleShared>,
    pub(crate) session: Session,
    pub(crate) controls: mpsc::Receiver<Control>,
    pub(crate) shutdown: CancellationToken,
    /// Incarnation 0, when the host started it before the supervisor.
    pub(crate) early: Option<(S::Incarnation, SystemTime)>,
    /// Cancelled when the module's previous task (before a reload changed
    /// the module) has stopped: the first incarnation waits for it.
    pub(crate) after: Option<CancellationToken>,
}

impl<S: Spawner> ModuleTask<S> {
    pub(crate) async fn run(mut self) {
        let supervision = self.shared.spec.supervision.clone();
        if let Some(after) = self.after.take() {
            tokio::select! {
                () = after.cancelled() => {}
                () = self.shutdown.cancelled() => {
                    self.shared.update(|s| s.state = ModuleState::Stopped);
                    return;
                }
            }
        }
        if self.shared.spec.start == Start::OnDemand
            && self.early.is_none()
            && !self.dormant().await
        {
            self.shared.update(|s| s.state = ModuleState::Stopped);
            return;
        }
        let mut failures_in_row = 0u32;
        for incarnation in 0.. {
            let started = Instant::now();
            let (end, healthy_for) = self.run_incarnation(incarnation, &supervision).await;
            match end {
                End::Shutdown => break,
                End::Restart => failures_in_row = self.failures_start_over(),
                End::Failed(_) => {
                    if healthy_for >= supervision.stable_after {
                        failures_in_row = 0;
                    }
                    failures_in_row += 1;
                    let delay = restart_delay(&supervision, failures_in_row, started.elapsed());
                    self.shared.update(|s| {
                        s.failures_in_row = failures_in_row;
                        s.backoff = Some(delay);
                        s.pid = None;
                        if !delay.is_zero() {
                            s.state = ModuleState::Backoff;
                            s.next_start_at = Some(SystemTime::now() + delay);
                        }
                    });
                    if !delay.is_zero() {
                        info!(
                            delay_ms = delay.as_millis() as u64,
                            failures_in_row, "module backing off"
                        );
                        tokio::select! {
                            _ = sleep(delay) => {}
                            _ = self.shutdown.cancelled() => break,
                            Some(Control::Restart) = self.controls.recv() => {
                                failures_in_row = self.failures_start_over();
                            }
                        }
                    }
                }
            }
        }
        self.shared.update(|s| {
            s.state = ModuleState::Stopped;
            s.pid = None;
            s.gate = None;
            s.next_start_at = None;
            s.record("stopped", "host shutting down, or module removed");
        });
        if let Err(e) = remove_stale_socket(&self.shared.socket) {
            warn!(error = %e, "cannot remove module socket");
        }
        info!("module stopped");
    }

    /// Waits, with no process, for the first request for one of the
    /// module's routes (or an operator's restart); false when the host
    /// shuts down or the module is removed first.
    async fn dormant(&mut self) -> bool {
        self.shared.update(|s| {
            s.state = ModuleState::Dormant;
            s.record(
                "dormant",
                "starts on the first request for one of its routes",
            );
        });
        info!("module dormant until a request for one of its routes");
        let why = tokio::select! {
            () = self.shared.wake.notified() => "a request for one of its routes",
            Some(Control::Restart) = self.controls.recv() => "an operator's restart",
            () = self.shutdown.cancelled() => return false,
        };
        self.shared.update(|s| s.record("woken", why));
        info!(by = why, "module woken");
        true
    }

    /// An operator's restart starts the count of failures in a row over,
    /// in the report too; the new count, 0.
    fn failures_start_over(&self) -> u32 {
        self.shared.update(|s| s.failures_in_row = 0);
        0
    }

    /// `work`'s output, unless the incarnation's life ends first: the host
    /// shuts down, an operator asks for a restart, or the process exits
    /// (`exited` then holds its status, and `phase` says how to tell it).
    async fn unless_ended<T>(
        &mut self,
        child: &mut S::Incarnation,
        exited: &mut Option<ExitStatus>,
        phase: Phase,
        work: impl Future<Output = T>,
    ) -> Result<T, End> {
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => Err(End::Shutdown),
            status = child.exited() => {
                *exited = status.as_ref().ok().copied();
                Err(End::Failed(match phase {
                    Phase::Starting => format!("exited during startup ({})", describe(&status)),
                    Phase::Running { memory_budget } => {
                        exit_reason(child, &status, memory_budget).await
                    }
                }))
            }
            Some(Control::Restart) = self.controls.recv() => Err(End::Restart),
            done = work => Ok(done),
        }
    }

    /// Runs one incarnation to its end; returns how it ended and how long it
    /// was healthy.
    async fn run_incarnation(&mut self, incarnation: u32, sup: &Supervision) -> (End, Duration) {
        let shared = Arc::clone(&self.shared);
        let socket = &shared.socket;
        shared.update(|s| {
            if s.incarnation.is_some() {
                s.restarts += 1;
            }
            s.state = ModuleState::Starting;
            s.incarnation = Some(incarnation);
            s.pid = None;
            s.failed_checks = 0;
            s.busy_since = None;
            s.memory_bytes = None;
            s.gate = None;
            s.ready_at = None;
            s.next_start_at = None;
            s.reason = None;
        });
        let (spawned, started_at) = match self.early.take() {
            Some((spawned, started_at)) => (Ok(spawned), started_at),
            None => {
                let checked = self.session.check_sockets();
                if checked.is_ok() {
                    warn_if_taken(socket).await;
                }
                let spawned = match checked.and_then(|()| remove_stale_socket(socket)) {
                    Ok(()) => {
                        self.spawner
                            .spawn(&shared.spec, &self.session, socket, incarnation)
                            .await
                    }
                    Err(e) => Err(e),
                };
                (spawned, SystemTime::now())
            }
        };
        let mut child = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                let reason = format!("cannot start {}: {e}", shared.spec.program().display());
                error!(incarnation, reason = %reason, "module failed");
                shared.update(|s| {
                    s.state = ModuleState::Unhealthy;
                    s.last_error = Some(reason.clone());
                    s.record("failed", reason.clone());
                });
                return (End::Failed(reason), Duration::ZERO);
            }
        };
        let pid = child.pid();
        info!(incarnation, pid, "module spawned");
        shared.update(|s| {
            s.pid = Some(pid);
            s.started_at = Some(started_at);
            s.record("spawned", format!("pid {pid}"));
        });

        let mut exited: Option<ExitStatus> = None;
        let client = ModulePool::serving(socket.clone(), sup.connection_limits(), child.peer());
        let mut ready_at = None;

        let end = 'life: {
            let starting = wait_ready(&client, sup, &shared, incarnation, pid);
            let ready = match self
                .unless_ended(&mut child, &mut exited, Phase::Starting, starting)
                .await
            {
                Ok(ready) => ready,
                Err(end) => break 'life end,
            };
            let rtt = match ready {
                Ok(rtt) => rtt,
                Err(never) => break 'life End::Failed(never.to_string()),
            };
            let cancel = CancellationToken::new();
            ready_at = Some(Instant::now());
            shared.update(|s| {
                s.state = ModuleState::Healthy;
                s.reason = None;
                s.ready_at = Some(SystemTime::now());
                s.last_health_rtt = Some(rtt);
                s.last_health_at = Some(SystemTime::now());
                s.gate = Some(Gate {
                    client: client.clone(),
                    cancel: cancel.clone(),
                    incarnation,
                });
                s.record("ready", format!("pid {pid}"));
            });
            info!(incarnation, pid, "module ready");

            let mut ticker = interval_at(
                tokio::time::Instant::now() + sup.health_interval,
                sup.health_interval,
            );
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut failed_checks = 0u32;
            let mut vitals = Vitals::default();
            vitals.record(
                usage_within(&child, sup.health_timeout).await,
                Instant::now(),
            );
            loop {
                let running = Phase::Running {
                    memory_budget: sup.memory_budget,
                };
                if let Err(end) = self
                    .unless_ended(&mut child, &mut exited, running, ticker.tick())
                    .await
                {
                    break 'life end;
                }
                let check = check_health(&client, sup.health_timeout);
                let checked = match self
                    .unless_ended(&mut child, &mut exited, running, check)
                    .await
                {
                    Ok(checked) => checked,
                    Err(end) => break 'life end,
                };
                // What its processes did since the last check tells a busy
                // module from a hung one.
                let usage = usage_within(&child, sup.health_timeout).await;
                let now = Instant::now();
                let share = vitals.record(usage, now);
                let rss = vitals.rss_bytes();
                shared.update(|s| s.memory_bytes = rss);
                if let (Some(rss), Some(budget)) = (rss, sup.memory_budget) {
                    if rss > budget {
                        break 'life End::Failed(over_budget(rss, budget));
                    }
                }
                let failure = match checked {
                    Ok(rtt) => {
                        failed_checks = 0;
                        vitals.answered();
                        shared.update(|s| {
                            s.failed_checks = 0;
                            s.busy_since = None;
                            s.last_health_rtt = Some(rtt);
                            s.last_health_at = Some(SystemTime::now());
                        });
                        continue;
                    }
                    Err(failure) => failure,
                };
                let reason = failure.reason;
                // A module that answered (not 200) is not busy: it said so;
                // nor one that refused the connection.
                let miss = if failure.answered || !failure.timed_out {
                    Miss::Hung
                } else {
                    vitals.missed(share, now, sup.busy_max)
                };
                match miss {
                    Miss::Busy { share, for_ } => {
                        // Working, not hung: a miss judged hung before (its
                        // look too slow to tell) does not count toward the
                        // threshold; busy_max bounds a run of these.
                        failed_checks = 0;
                        if let (true, Some(share)) = (for_.is_zero(), share) {
                            let cpu = (share * 100.0).round();
                            let doing = busy_doing(share);
                            info!(incarnation, pid, cpu_percent = cpu, reason = %reason, "module busy: its health check went unanswered while it is {doing}");
                            shared.update(|s| {
                                s.busy_since = Some(SystemTime::now());
                                s.record("busy", format!("{reason} while {doing}"));
                            });
                        }
                        shared.update(|s| {
                            s.failed_checks = 0;
                            s.last_health_at = Some(SystemTime::now());
                        });
                    }
                    Miss::BusyTooLong { for_ } => {
                        break 'life End::Failed(format!(
                            "busy for {}s without answering its health check (busy_max_secs {}); last: {reason}",
                            for_.as_secs(),
                            sup.busy_max.as_secs_f64()
                        ));
                    }
                    Miss::Hung => {
                        failed_checks += 1;
                        let cpu = share.map_or_else(
                            || "not seen in time".to_owned(),
                            |s| format!("{:.0}", s * 100.0),
                        );
                        warn!(incarnation, pid, failed_checks, cpu_percent = %cpu, reason = %reason, "module health check failed");
                        shared.update(|s| {
                            s.failed_checks = failed_checks;
                            s.busy_since = None;
                            s.last_health_at = Some(SystemTime::now());
                        });
                        if failed_checks >= sup.failure_threshold {
                            break 'life End::Failed(format!(
                                "{failed_checks} health checks failed in a row; last: {reason}"
                            ));
                        }
                    }
                }
            }
        };

        // In-flight requests end now, whatever happens to the process.
        let gate = shared.update(|s| s.gate.take());
        if let Some(gate) = gate {
            gate.cancel.cancel();
        }
        match &end {
            End::Failed(reason) => {
                shared.update(|s| {
                    s.state = ModuleState::Unhealthy;
                    s.last_error = Some(reason.clone());
                    s.record("failed", reason.clone());
                });
                let (out, err) = (
                    log_name(&shared.spec.name, "out"),
                    log_name(&shared.spec.name, "err"),
                );
                let logs = self.session.log_dir.clone();
                let (out_tail, err_tail) = tokio::task::spawn_blocking(move || {
                    (tail(&logs, &out, TAIL_LINES), tail(&logs, &err, TAIL_LINES))
                })
                .await
                .unwrap_or_default();
                error!(incarnation, pid, reason = %reason, stderr_tail = %err_tail, stdout_tail = %out_tail, "module failed");
            }
            End::Restart => shared.update(|s| {
                s.state = ModuleState::Stopping;
                s.record("restart", "restart requested");
                info!(incarnation, pid, "module restart requested");
            }),
            End::Shutdown => shared.update(|s| s.state = ModuleState::Stopping),
        }
        let status = child.stop(exited, sup.stop_grace).await;
        info!(incarnation, pid, exit = ?status, "module process ended");
        child.clean_up().await;
        let healthy_for = ready_at.map(|t| t.elapsed()).unwrap_or_default();
        (end, healthy_for)
    }
}

/// An incarnation that did not answer its health check with 200 within its
/// `startup_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("not ready within {within:?}: {last}")]
struct NeverReady {
    /// The `startup_timeout` that passed.
    within: Duration,
    /// What the last probe found, and what the module last said.
    last: String,
}

/// Probes `/api/healthz` until it answers 200, within `startup_timeout`.
///
/// A module that answers 503 with `Retry-After` is alive and waiting for
/// something outside itself (a port another process holds): restarting it
/// would change nothing. It is shown as `waiting` with its words (logged
/// once for each thing it says), checked every `health_interval`, and its
/// start-up clock starts over at each such answer, so it is never restarted
/// for it. Any other answer, and no answer, count against the clock; the
/// error at the end says what the last probe found and what the module
/// last said, if it said anything.
async fn wait_ready(
    client: &ModulePool,
    sup: &Supervision,
    shared: &ModuleShared,
    incarnation: u32,
    pid: u32,
) -> Result<Duration, NeverReady> {
    let mut deadline = Instant::now() + sup.startup_timeout;
    let mut pauses = STARTUP_POLLS;
    // The module's latest non-200 answer, and what a waiting module said last.
    let mut said: Option<String> = None;
    let mut waiting_for: Option<String> = None;
    loop {
        // Every probe gets the whole health timeout, the last one too: one
        // cut to what is left of the budget (nothing, at the deadline) would
        // fail without hearing the module's answer.
        let failure = match check_health(client, sup.health_timeout).await {
            Ok(rtt) => return Ok(rtt),
            Err(failure) => failure,
        };
        if let Some(retry_after) = failure.waiting {
            // Its words are the whole story: the status adds nothing.
            let reason = failure.words.unwrap_or(failure.reason);
            let new = waiting_for.as_deref() != Some(reason.as_str());
            if new {
                warn!(
                    incarnation,
                    pid,
                    retry_after_s = retry_after.as_secs(),
                    "module waiting: {reason}"
                );
            }
            shared.update(|s| {
                s.state = ModuleState::Waiting;
                s.reason = Some(reason.clone());
                s.backoff = Some(retry_after);
                if new {
                    s.record("waiting", reason.clone());
                }
            });
            said = Some(reason.clone());
            waiting_for = Some(reason);
            deadline = Instant::now() + sup.startup_timeout;
            sleep(sup.health_interval).await;
            continue;
        }
        if failure.answered {
            said = Some(failure.reason.clone());
        }
        shared.update(|s| {
            // It no longer says it waits: it is starting again.
            if s.state == ModuleState::Waiting {
                s.state = ModuleState::Starting;
            }
            if failure.answered {
                s.reason = Some(failure.reason.clone());
            }
        });
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let last = match said {
                Some(said) if !failure.answered => format!("{failure}; it last said: {said}"),
                _ => failure.reason,
            };
            return Err(NeverReady {
                within: sup.startup_timeout,
                last,
            });
        }
        sleep(pauses.next_delay().min(left)).await;
    }
}

/// The delay before the next incarnation after `failures` failures in a
/// row: none after the first, then `initial`, doubling, capped at `max`.
pub(crate) fn backoff_delay(sup: &Supervision, failures: u32) -> Duration {
    if failures <= 1 {
        return Duration::ZERO;
    }
    Backoff::new(sup.backoff_initial, sup.backoff_max).nth_delay(failures - 2)
}

/// The delay before the next incarnation after `failures` failures in a
/// row, the last of which started `since_start` ago: the backoff, but never
/// less than what is left of [`MIN_RESTART_INTERVAL`].
pub(crate) fn restart_delay(sup: &Supervision, failures: u32, since_start: Duration) -> Duration {
    backoff_delay(sup, failures).max(MIN_RESTART_INTERVAL.saturating_sub(since_start))
}

/// Why a ready incarnation ended by itself: its exit status, and, when the
/// kernel killed it at its memory budget, that.
async fn exit_reason<I: Incarnation>(
    child: &I,
    status: &io::Result<ExitStatus>,
    budget: Option<u64>,
) -> String {
    match budget {
        Some(budget) if child.killed_at_budget().await => format!(
            "exited ({}): killed by the kernel at its memory budget of {} (memory_budget_mib)",
            describe(status),
            mib(budget)
        ),
        _ => format!("exited ({})", describe(status)),
    }
}

/// The failure of a module whose processes hold more than its budget.
fn over_budget(rss: u64, budget: u64) -> String {
    format!(
        "over its memory budget: its processes hold {} resident, the budget is {} (memory_budget_mib)",
        mib(rss),
        mib(budget)
    )
}

/// The least time the host waits for a look at a module's processes. The
/// look is the host's own work, slow only on a machine so crowded that
/// its blocking thread waits to run: waiting for it spaces this module's
/// checks out, where giving up soon would judge the miss it explains
/// without it.
const LOOK_WITHIN: Duration = Duration::from_secs(2);

/// What `child`'s processes used, if `/proc` tells within the health
/// timeout or [`LOOK_WITHIN`], whichever is longer: the read runs on the
/// blocking pool, and one stuck there (a process in the middle of an exit
/// holding its memory map, say) must not hold up the module's health
/// checks for good. A late sample counts as none.
async fn usage_within<C: Incarnation>(child: &C, health_timeout: Duration) -> Option<Usage> {
    tokio::time::timeout(health_timeout.max(LOOK_WITHIN), child.usage())
        .await
        .ok()
        .flatten()
}

/// Bytes in MiB, for people.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn describe(status: &io::Result<ExitStatus>) -> String {
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}

/// How long the host waits to learn whether anything listens on a module's
/// socket before the module is started there.
const TAKEN_PROBE: Duration = Duration::from_millis(200);

/// Warns when a process listens on `path` before its module is started
/// there. A socket file an earlier run left has no listener; one that
/// answers belongs to a live process, as a rule Ray's own dashboard (Ray's
/// full dashboard names its modules' sockets `dash_<Module>` in the same
/// folder). The module takes the path over, so that process's own parent
/// then reaches ray-dashd's module instead of its own.
async fn warn_if_taken(path: &Path) {
    let Some(pid) = listener_pid(path, TAKEN_PROBE).await.map(Result::ok) else {
        return;
    };
    // `/proc` is read off the runtime.
    let command = match pid {
        Some(pid) => tokio::task::spawn_blocking(move || proc::cmdline(pid))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|args| args.join(" ")),
        None => None,
    };
    warn!(
        socket = %path.display(),
        listener_pid = %pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string()),
        listener = command.as_deref().unwrap_or("unknown"),
        "another process listens on the module's socket; the module takes the path over \
         (is Ray's own dashboard running? start Ray with --include-dashboard=false)"
    );
}

/// Removes a socket file left by an earlier run; refuses to remove anything
/// that is not a socket.
pub(crate) fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::other(format!(
            "{} exists and is not a socket; not removing it",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_at_zero_doubles_and_caps() {
        let sup = Supervision {
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            ..Supervision::default()
        };
        let delays: Vec<u64> = (1..=10)
            .map(|n| backoff_delay(&sup, n).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [0, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(backoff_delay(&sup, u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn restarts_are_never_closer_than_the_minimum_interval() {
        // Settings the config refuses, as if they got through anyway.
        let zero = Supervision {
            backoff_initial: Duration::ZERO,
            backoff_max: Duration::ZERO,
            stable_after: Duration::ZERO,
            ..Supervision::default()
        };
        for failures in [1, 2, 10] {
            assert_eq!(
                restart_delay(&zero, failures, Duration::ZERO),
                MIN_RESTART_INTERVAL
            );
            assert_eq!(
                restart_delay(&zero, failures, Duration::from_millis(30)),
                Duration::from_millis(70)
            );
        }
        // A module that ran a while is restarted at once the first time.
        let sup = Supervision::default();
        assert_eq!(
            restart_delay(&sup, 1, Duration::from_secs(5)),
            Duration::ZERO
        );
        assert_eq!(restart_delay(&sup, 1, Duration::ZERO), MIN_RESTART_INTERVAL);
        assert_eq!(
            restart_delay(&sup, 3, Duration::ZERO),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn stale_socket_removed_but_other_files_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        drop(listener);
        remove_stale_socket(&sock).expect("removed");
        assert!(!sock.exists());
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(remove_stale_socket(&file).is_err());
        assert!(file.exists());
        remove_stale_socket(&dir.path().join("missing")).expect("missing is fine");
    }
}
