//! The module task in process, on a paused clock: a [`FakeSpawner`] child
//! (see [`super::fake_child`]) in place of a process, so that exits, hangs,
//! slow starts, backoff and restarts are checked in virtual time, and what
//! they change is read from the module's status, as `/api/modules` reads it.
//! What needs a real process (signals, process groups, the contract's
//! environment) stays in `tests/supervisor.rs`.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fake_child::{Cpu, FakeSpawner, Healthz, Plan};
use super::spawn::{Processes, Spawner};
use super::state::Status;
use super::task::{ModuleTask, MIN_RESTART_INTERVAL};
use super::{ModuleHandle, ModuleReport, ModuleShared, ModuleState};
use crate::config::{ModuleSpec, Start, Supervision};
use crate::metrics::Metrics;
use crate::session::Session;

/// The longest any test waits for a state, in (virtual) time.
const BOUND: Duration = Duration::from_secs(120);

/// Quick settings: checks every second, 500 ms each, three in a row.
fn supervision() -> Supervision {
    Supervision {
        startup_timeout: Duration::from_secs(2),
        health_interval: Duration::from_secs(1),
        health_timeout: Duration::from_millis(500),
        failure_threshold: 3,
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(8),
        stable_after: Duration::from_secs(10),
        stop_grace: Duration::from_secs(2),
        ..Supervision::default()
    }
}

/// One module task, running.
struct Module {
    handle: ModuleHandle,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
    session: Session,
    _dir: tempfile::TempDir,
}

/// Starts the task of a module `program` supervised with `sup`, whose
/// incarnations `spawner` starts.
fn start<S: Spawner>(spawner: S, program: &str, sup: Supervision) -> Module {
    start_as(spawner, program, sup, Start::AtLaunch)
}

/// [`start`], for a module that starts `when` says.
fn start_as<S: Spawner>(spawner: S, program: &str, sup: Supervision, when: Start) -> Module {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = Session::prepare(dir.path()).expect("session");
    let spec = ModuleSpec {
        name: "m".to_owned(),
        program: program.to_owned(),
        args: Vec::new(),
        env: Default::default(),
        routes: Vec::new(),
        supervision: sup,
        start: when,
    };
    let (controls_tx, controls) = mpsc::channel(1);
    let shutdown = CancellationToken::new();
    let socket = session.socket_path(&spec.name);
    let metrics = Arc::new(Metrics::new()).module(&spec.name, &spec.routes);
    let shared = Arc::new(ModuleShared::new(
        spec,
        socket,
        controls_tx,
        shutdown.clone(),
        CancellationToken::new(),
        metrics,
    ));
    let task = ModuleTask {
        spawner,
        shared: Arc::clone(&shared),
        session: session.clone(),
        controls,
        shutdown: shutdown.clone(),
        early: None,
        after: None,
    };
    Module {
        handle: ModuleHandle { shared },
        shutdown,
        task: tokio::spawn(task.run()),
        session,
        _dir: dir,
    }
}

impl Module {
    /// Waits until `ready` holds of the status, for at most [`BOUND`] of
    /// virtual time; panics with the module's report if it never does.
    async fn until(&self, what: &str, ready: impl Fn(&Status) -> bool) {
        let deadline = Instant::now() + BOUND;
        while !self.handle.shared.update(|s| ready(s)) {
            assert!(
                Instant::now() < deadline,
                "never {what}: {:?}",
                self.handle.report()
            );
            // Under the paused clock, this is the clock advancing.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until incarnation `n` is healthy.
    async fn healthy(&self, n: u32) {
        self.until(&format!("healthy as incarnation {n}"), |s| {
            s.incarnation == Some(n) && s.state == ModuleState::Healthy
        })
        .await;
    }

    fn last_error(&self) -> String {
        self.handle.report().last_error.unwrap_or_default()
    }

    /// Shuts the module down and waits for its task to end.
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(BOUND, self.task)
            .await
            .expect("the task ends")
            .expect("the task did not panic");
    }
}

/// The gaps between the spawns of consecutive incarnations.
fn gaps(fake: &FakeSpawner) -> Vec<Duration> {
    fake.record(|r| r.spawns.windows(2).map(|w| w[1].1 - w[0].1).collect())
}

/// A module that exits is stopped, its exit is its error, and the next
/// incarnation starts at once (it ran long enough) and serves.
#[tokio::test(start_paused = true)]
async fn restarts_module_after_it_exits() {
    let fake = FakeSpawner::new(|n| match n {
        0 => Plan::healthy().exits(Duration::from_secs(3), 1),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(0).await;
    m.healthy(1).await;
    let report = m.handle.report();
    assert_eq!(report.restarts, 1);
    assert_eq!(report.failures_in_row, 1);
    assert_eq!(m.last_error(), "exited (exit status: 1)");
    assert_eq!(gaps(&fake), [Duration::from_secs(3)]);
    // Stopped already exited, then cleaned up.
    fake.record(|r| {
        assert!(matches!(r.stops[..], [(0, _, true)]), "{:?}", r.stops);
        assert_eq!(r.cleaned, [0]);
    });
    m.stop().await;
}

/// A module started on demand runs nothing until a request comes; that
/// request starts it and waits for it to be ready, as does one that comes
/// while it starts; then it is supervised as any other.
#[tokio::test(start_paused = true)]
async fn a_module_started_on_demand_waits_for_its_first_request() {
    let slow_start = Plan::healthy()
        .answering(Healthz::Answer {
            status: 503,
            body: "loading",
            delay: Duration::ZERO,
        })
        .then(Duration::from_millis(1500), Healthz::Ok);
    let fake = FakeSpawner::new(move |n| match n {
        0 => slow_start.clone().exits(Duration::from_secs(5), 1),
        _ => Plan::healthy(),
    });
    let sup = Supervision {
        startup_timeout: Duration::from_secs(10),
        ..supervision()
    };
    let m = start_as(fake.clone(), "fake", sup, Start::OnDemand);
    m.until("dormant", |s| s.state == ModuleState::Dormant)
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    fake.record(|r| assert!(r.spawns.is_empty(), "spawned unasked: {:?}", r.spawns));
    assert_eq!(m.handle.report().state, ModuleState::Dormant);
    assert!(m.handle.admit().is_err(), "a dormant module admits nothing");

    let asked = Instant::now();
    let first = tokio::spawn({
        let handle = m.handle.clone();
        async move { handle.admit_or_start().await.map(|g| g.incarnation) }
    });
    m.until("starting", |s| s.state == ModuleState::Starting)
        .await;
    let second = tokio::spawn({
        let handle = m.handle.clone();
        async move { handle.admit_or_start().await.map(|g| g.incarnation) }
    });
    assert_eq!(first.await.expect("joined").ok(), Some(0));
    assert_eq!(second.await.expect("joined").ok(), Some(0));
    assert!(
        asked.elapsed() >= Duration::from_millis(1500),
        "let in before ready"
    );
    let events: Vec<_> = m.handle.report().events.iter().map(|e| e.kind).collect();
    assert_eq!(
        events[..4],
        ["dormant", "woken", "spawned", "ready"],
        "{events:?}"
    );
    // Once started, a failure restarts it as any module (never dormant again).
    m.healthy(1).await;
    fake.record(|r| assert_eq!(r.spawns.len(), 2));
    m.stop().await;
}

/// A request waits for a module started on demand no longer than its
/// `startup_timeout`, then is told why it is not ready; a module that
/// fails is not waited for; shutdown ends a dormant module's task.
#[tokio::test(start_paused = true)]
async fn a_request_waits_for_a_module_started_on_demand_within_its_startup_timeout() {
    let fake = FakeSpawner::new(|_| Plan::never_listening());
    let m = start_as(fake.clone(), "fake", supervision(), Start::OnDemand);
    m.until("dormant", |s| s.state == ModuleState::Dormant)
        .await;
    let asked = Instant::now();
    let refused = m.handle.admit_or_start().await.expect_err("never ready");
    // Either still starting at the deadline, or already failed by it.
    assert!(
        matches!(
            refused.state,
            ModuleState::Starting | ModuleState::Unhealthy | ModuleState::Backoff
        ),
        "{:?}",
        refused.state
    );
    assert!(asked.elapsed() <= supervision().startup_timeout + Duration::from_millis(100));
    m.stop().await;

    let idle = FakeSpawner::new(|_| Plan::healthy());
    let m = start_as(idle.clone(), "fake", supervision(), Start::OnDemand);
    m.until("dormant", |s| s.state == ModuleState::Dormant)
        .await;
    m.stop().await;
    idle.record(|r| assert!(r.spawns.is_empty()));
}

/// A health check that hangs counts as failed after the health timeout;
/// `failure_threshold` of them in a row and the incarnation is replaced.
#[tokio::test(start_paused = true)]
async fn replaces_module_whose_health_check_hangs() {
    let fake = FakeSpawner::new(|n| match n {
        0 => Plan::healthy().then(Duration::from_millis(1500), Healthz::Hang),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(0).await;
    m.healthy(1).await;
    assert_eq!(
        m.last_error(),
        "3 health checks failed in a row; last: healthz did not answer within 500ms"
    );
    // Checks at 2, 3 and 4 s, each given up on 500 ms later; stopped then.
    fake.record(|r| {
        let (n, stopped, exited) = r.stops[0];
        assert_eq!((n, exited), (0, false));
        assert_eq!(stopped - r.spawns[0].1, Duration::from_millis(4500));
    });
    m.stop().await;
}

/// Runs a module whose health checks hang from 1.5 s on while its
/// processes use a CPU as `cpu` says, with `busy_max` 20 s, and checks what
/// every such run shows: 10 s after it was first seen busy, its first
/// incarnation is still reported busy with no failed check; it is then
/// replaced for being busy past `busy_max`, `within` its spawn. Returns
/// that report and the reason it was replaced with.
async fn replaced_by_busy_max(cpu: Cpu, within: Range<Duration>) -> (ModuleReport, String) {
    let fake = FakeSpawner::new(move |n| match n {
        0 => Plan::healthy()
            .using(cpu)
            .then(Duration::from_millis(1500), Healthz::Hang),
        _ => Plan::healthy(),
    });
    let sup = Supervision {
        busy_max: Duration::from_secs(20),
        ..supervision()
    };
    let m = start(fake.clone(), "fake", sup);
    m.healthy(0).await;
    m.until("busy", |s| s.busy_since.is_some()).await;
    // Well past three missed checks.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let report = m.handle.report();
    m.healthy(1).await;
    let error = m.last_error();
    let stopped_after = fake.record(|r| {
        let (n, stopped, _) = r.stops[0];
        assert_eq!(n, 0);
        stopped - r.spawns[0].1
    });
    m.stop().await;
    assert_eq!(report.incarnation, Some(0), "{report:?}");
    assert_eq!(report.failed_checks, 0, "{report:?}");
    assert!(report.busy_since_ms.is_some(), "{report:?}");
    assert!(
        error.starts_with("busy for 2") && error.contains("(busy_max_secs 20)"),
        "{error}"
    );
    assert!(within.contains(&stopped_after), "{stopped_after:?}");
    (report, error)
}

/// A module whose health checks go unanswered while its processes use a
/// CPU is busy (its event loop blocked building a big answer), not hung:
/// it is kept, for as long as `busy_max` allows, and says so.
#[tokio::test(start_paused = true)]
async fn a_busy_module_is_kept_until_busy_max() {
    let within = Duration::from_secs(22)..Duration::from_secs(24);
    let (report, error) = replaced_by_busy_max(Cpu::Busy, within).await;
    assert_eq!(report.state, ModuleState::Healthy, "{report:?}");
    assert!(
        report.events.iter().any(|e| e.kind == "busy"),
        "{:?}",
        report.events
    );
    // Busy for longer than busy_max is a loop that never ends.
    assert!(
        error.starts_with("busy for 20s without answering its health check (busy_max_secs 20)"),
        "{error}"
    );
}

/// A busy module on a machine so crowded that every look at its processes
/// takes longer than the health timeout: the host waits for the look, so
/// every miss is judged busy, none failed, and `busy_max` ends the run.
#[tokio::test(start_paused = true)]
async fn a_busy_module_seen_slowly_is_kept_until_busy_max() {
    let within = Duration::from_secs(21)..Duration::from_secs(26);
    replaced_by_busy_max(Cpu::BusySlowLooks, within).await;
}

/// A busy module starved of the CPU by others: its share reads 0, but its
/// main thread is runnable at every look, so it is busy, not hung.
#[tokio::test(start_paused = true)]
async fn a_busy_module_waiting_for_the_cpu_is_kept_until_busy_max() {
    let within = Duration::from_secs(22)..Duration::from_secs(24);
    let (_, error) = replaced_by_busy_max(Cpu::Starved, within).await;
    assert!(error.starts_with("busy for 20s "), "{error}");
}

/// A busy module whose every other look never ends: the first miss, before
/// a busy run is seen, is judged hung; after that the lost looks continue
/// the run, so it is never replaced for failed checks, and `busy_max`
/// still ends it.
#[tokio::test(start_paused = true)]
async fn a_busy_module_seen_every_other_check_is_kept_until_busy_max() {
    let within = Duration::from_secs(21)..Duration::from_secs(28);
    replaced_by_busy_max(Cpu::BusyLostLooks, within).await;
}

/// A stopped module (SIGSTOP) that used CPU before it stopped is hung, not
/// busy: replaced after `failure_threshold` misses as any hang.
#[tokio::test(start_paused = true)]
async fn a_stopped_module_is_hung_not_busy() {
    let fake = FakeSpawner::new(|n| match n {
        0 => Plan::healthy()
            .using(Cpu::Stopped)
            .then(Duration::from_millis(1500), Healthz::Hang),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(0).await;
    m.healthy(1).await;
    assert_eq!(
        m.last_error(),
        "3 health checks failed in a row; last: healthz did not answer within 500ms"
    );
    fake.record(|r| assert_eq!(r.stops[0].1 - r.spawns[0].1, Duration::from_millis(4500)));
    m.stop().await;
}

/// A module whose processes grow past its memory budget is replaced at the
/// next check, and the reason names the budget; its memory is reported.
#[tokio::test(start_paused = true)]
async fn a_module_over_its_memory_budget_is_replaced() {
    let fake = FakeSpawner::new(|n| match n {
        0 => Plan::healthy().growing_to(Duration::from_millis(3500), 300 << 20),
        _ => Plan::healthy(),
    });
    let sup = Supervision {
        memory_budget: Some(256 << 20),
        ..supervision()
    };
    let m = start(fake.clone(), "fake", sup);
    m.healthy(0).await;
    m.until("its memory known", |s| s.memory_bytes == Some(10 << 20))
        .await;
    let report = m.handle.report();
    assert_eq!(report.memory_budget_bytes, Some(256 << 20));
    m.healthy(1).await;
    assert_eq!(
        m.last_error(),
        "over its memory budget: its processes hold 300.0 MiB resident, the budget is 256.0 MiB (memory_budget_mib)"
    );
    // Checks at 1, 2, 3 s were under; the one at 4 s was over.
    fake.record(|r| assert_eq!(r.stops[0].1 - r.spawns[0].1, Duration::from_secs(4)));
    m.stop().await;
}

/// `/api/healthz` answering non-200 several times in a row makes the module
/// unhealthy and replaced; its answer is the error.
#[tokio::test(start_paused = true)]
async fn replaces_module_whose_healthz_fails() {
    let broken = Healthz::Answer {
        status: 500,
        body: "broken",
        delay: Duration::ZERO,
    };
    let fake = FakeSpawner::new(move |n| match n {
        0 => Plan::healthy().then(Duration::from_millis(1500), broken.clone()),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(0).await;
    m.until("failing its checks", |s| s.failed_checks == 2)
        .await;
    assert_eq!(m.handle.report().state, ModuleState::Healthy);
    m.healthy(1).await;
    assert_eq!(
        m.last_error(),
        "3 health checks failed in a row; last: healthz answered 500 Internal Server Error: broken"
    );
    m.stop().await;
}

/// A module that never answers is given up on after its startup budget and
/// tried again; requests are refused meanwhile.
#[tokio::test(start_paused = true)]
async fn never_ready_module_times_out_and_retries() {
    let fake = FakeSpawner::new(|_| Plan::never_listening());
    let m = start(fake.clone(), "fake", supervision());
    m.until("starting", |s| {
        s.state == ModuleState::Starting && s.pid.is_some()
    })
    .await;
    let refused = m.handle.admit().expect_err("not ready");
    assert_eq!(refused.state, ModuleState::Starting);
    m.until("retried", |s| s.restarts >= 2).await;
    let error = m.last_error();
    assert!(
        error.starts_with("not ready within 2s: healthz request failed"),
        "{error}"
    );
    // The first retry at once, the second after the initial backoff: each
    // after the full budget and the last probe's connect.
    let gaps = gaps(&fake);
    assert!(gaps[0] >= Duration::from_secs(2), "{gaps:?}");
    assert!(
        gaps[1] >= Duration::from_secs(3) && gaps[1] < Duration::from_millis(3100),
        "{gaps:?}"
    );
    fake.record(|r| assert!(matches!(r.stops[0], (0, _, false)), "{:?}", r.stops));
    m.stop().await;
}

/// A module that answers 503 with its reason (in 20 ms, as a Python module
/// might) until its start-up deadline fails with that reason: the last
/// probe gets a whole health timeout, not what is left of the budget
/// (nothing). The next incarnation, starting, shows the reason.
#[tokio::test(start_paused = true)]
async fn a_module_not_ready_at_its_deadline_fails_with_its_own_reason() {
    let fake = FakeSpawner::new(|_| {
        Plan::healthy().answering(Healthz::Answer {
            status: 503,
            body: "not ready: reason X, the fake's",
            delay: Duration::from_millis(20),
        })
    });
    let sup = Supervision {
        startup_timeout: Duration::from_secs(1),
        ..supervision()
    };
    let m = start(fake, "fake", sup);
    m.until("retried", |s| s.restarts >= 1).await;
    assert_eq!(
        m.last_error(),
        "not ready within 1s: healthz answered 503 Service Unavailable: not ready: reason X, the fake's"
    );
    m.until("starting with its reason", |s| {
        s.state == ModuleState::Starting
            && s.reason.as_deref()
                == Some("healthz answered 503 Service Unavailable: not ready: reason X, the fake's")
    })
    .await;
    m.stop().await;
}

/// A module that exits at once is restarted with delays that double up to
/// the cap, never in a hot loop (the first after the minimum interval);
/// meanwhile requests are refused with a `Retry-After` up to the next start.
#[tokio::test(start_paused = true)]
async fn backs_off_crash_loop_doubling_to_the_cap() {
    let fake = FakeSpawner::new(|_| Plan::healthy().exits(Duration::ZERO, 1));
    let m = start(fake.clone(), "fake", supervision());
    m.until("failed seven times", |s| s.failures_in_row >= 7)
        .await;
    m.until("backing off", |s| s.state == ModuleState::Backoff)
        .await;
    let refused = m.handle.admit().expect_err("not ready");
    assert_eq!(refused.state, ModuleState::Backoff);
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_secs(8),
        "{refused:?}"
    );
    let s = |n| Duration::from_secs(n);
    assert_eq!(
        gaps(&fake)[..6],
        [MIN_RESTART_INTERVAL, s(1), s(2), s(4), s(8), s(8)]
    );
    let report = m.handle.report();
    assert_eq!(report.backoff_ms, Some(8000));
    assert_eq!(m.last_error(), "exited during startup (exit status: 1)");
    m.stop().await;
}

/// A module that was healthy for `stable_after` starts over: its next
/// failure is restarted at once, and the one after that with the initial
/// backoff, not where the crash loop before it had got to.
#[tokio::test(start_paused = true)]
async fn backoff_resets_after_stable_uptime() {
    let fake = FakeSpawner::new(|n| match n {
        // Three quick failures: the backoff is at 2 s.
        0..=2 => Plan::healthy().exits(Duration::ZERO, 1),
        // Healthy for longer than `stable_after` (10 s).
        3 => Plan::healthy().exits(Duration::from_secs(12), 1),
        4 => Plan::healthy().exits(Duration::ZERO, 1),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(5).await;
    let s = |n| Duration::from_secs(n);
    assert_eq!(
        gaps(&fake),
        // 0 → 1 → 2 → 3 backing off; 3 ran 12 s and 4 followed at once;
        // 5 after the initial backoff, not 4 s.
        [MIN_RESTART_INTERVAL, s(1), s(2), s(12), s(1)]
    );
    assert_eq!(m.handle.report().failures_in_row, 2);
    m.stop().await;
}

/// A command that cannot be spawned (none there) is reported with the
/// reason and retried with backoff, for ever; requests are refused.
#[tokio::test(start_paused = true)]
async fn missing_command_is_reported_and_retried() {
    let m = start(
        Processes,
        "/nonexistent/ray-dashd-ghost",
        Supervision {
            backoff_max: Duration::from_secs(2),
            ..supervision()
        },
    );
    m.until("failed ten times", |s| s.failures_in_row >= 10)
        .await;
    let report = m.handle.report();
    let error = report.last_error.expect("last_error");
    assert!(
        error.starts_with("cannot start /nonexistent/ray-dashd-ghost: No such file"),
        "{error}"
    );
    assert_eq!(report.pid, None);
    assert_eq!(report.backoff_ms, Some(2000));
    m.until("backing off", |s| s.state == ModuleState::Backoff)
        .await;
    assert_eq!(
        m.handle.admit().expect_err("not ready").state,
        ModuleState::Backoff
    );
    m.stop().await;
}

/// A failed spawn (from the fake) is retried like any failure: the module
/// serves once a spawn succeeds.
#[tokio::test(start_paused = true)]
async fn failed_spawn_is_retried_until_it_succeeds() {
    let fake = FakeSpawner::new(|n| match n {
        0..=2 => Plan::spawn_fails(nix::libc::ENOENT),
        _ => Plan::healthy(),
    });
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(3).await;
    assert_eq!(
        gaps(&fake),
        [
            MIN_RESTART_INTERVAL,
            Duration::from_secs(1),
            Duration::from_secs(2)
        ]
    );
    // Nothing was spawned, so nothing was stopped.
    fake.record(|r| assert!(r.stops.is_empty(), "{:?}", r.stops));
    m.stop().await;
}

/// A restart control stops the healthy incarnation and starts the next at
/// once, and the failures in a row start over; during a backoff, it cuts it
/// short.
#[tokio::test(start_paused = true)]
async fn restart_starts_new_incarnation_without_backoff() {
    let fake = FakeSpawner::new(|n| match n {
        // Two quick failures: 30 s of backoff after the second.
        0 | 1 => Plan::healthy().exits(Duration::ZERO, 1),
        // Restarted: then two quick failures again, the backoff cut short.
        3 | 4 => Plan::healthy().exits(Duration::ZERO, 1),
        _ => Plan::healthy(),
    });
    let sup = Supervision {
        backoff_initial: Duration::from_secs(30),
        backoff_max: Duration::from_secs(60),
        ..supervision()
    };
    let m = start(fake.clone(), "fake", sup);
    m.healthy(2).await;
    assert!(m.handle.restart());
    m.until("backing off 30 s after 4", |s| {
        s.incarnation == Some(4)
            && s.state == ModuleState::Backoff
            && s.backoff == Some(Duration::from_secs(30))
    })
    .await;
    assert!(m.handle.restart());
    m.until("the count of failures started over", |s| {
        s.failures_in_row == 0 && s.incarnation == Some(5)
    })
    .await;
    m.healthy(5).await;
    let report = m.handle.report();
    assert_eq!(report.restarts, 5);
    assert_eq!(report.failures_in_row, 0);
    assert!(
        report.events.iter().any(|e| e.kind == "restart"),
        "{:?}",
        report.events
    );
    let gaps = gaps(&fake);
    // 3 failing was the first failure in a row, and the 30 s after 4 were
    // cut short.
    assert_eq!(gaps[1], Duration::from_secs(30), "{gaps:?}");
    assert_eq!(gaps[3], MIN_RESTART_INTERVAL, "{gaps:?}");
    assert!(gaps[4] < Duration::from_secs(1), "{gaps:?}");
    // The healthy one stopped and replaced at once.
    fake.record(|r| {
        let (n, stopped, exited) = r.stops[2];
        assert_eq!((n, exited), (2, false));
        assert_eq!(r.spawns[3].1, stopped);
    });
    m.stop().await;
}

/// Shutdown stops the incarnation (SIGKILL after the grace when it ignores
/// SIGTERM), removes its socket and leaves the module stopped.
#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_child() {
    let fake = FakeSpawner::new(|_| Plan::healthy().ignoring_sigterm());
    let m = start(fake.clone(), "fake", supervision());
    m.healthy(0).await;
    let socket = m.handle.socket().to_path_buf();
    assert!(socket.exists());
    let handle = m.handle.clone();
    let asked = Instant::now();
    let session = m.session.clone();
    m.stop().await;
    // The grace (2 s) waited out, as the fake ignores SIGTERM.
    assert_eq!(asked.elapsed(), Duration::from_secs(2));
    let report = handle.report();
    assert_eq!(report.state, ModuleState::Stopped);
    assert_eq!(report.pid, None);
    assert!(!socket.exists(), "socket left in {}", session.dir.display());
    fake.record(|r| {
        assert!(matches!(r.stops[..], [(0, _, false)]), "{:?}", r.stops);
        assert_eq!(r.cleaned, [0]);
    });
}

/// When a module turns unhealthy, its in-flight requests are told at once
/// (the gate's token), while its process is still in its stop grace.
#[tokio::test(start_paused = true)]
async fn unhealthy_module_fails_in_flight_work_before_it_is_stopped() {
    let fake = FakeSpawner::new(|n| match n {
        0 => Plan::healthy()
            .then(Duration::from_millis(1500), Healthz::Hang)
            .ignoring_sigterm(),
        _ => Plan::healthy(),
    });
    let sup = Supervision {
        stop_grace: Duration::from_secs(60),
        ..supervision()
    };
    let m = start(fake.clone(), "fake", sup);
    m.healthy(0).await;
    let gate = m.handle.admit().expect("admitted");
    assert_eq!(gate.incarnation, 0);
    let cancelled = tokio::time::timeout(BOUND, gate.cancel.cancelled()).await;
    assert!(cancelled.is_ok(), "the gate was never closed");
    let failed_at = Instant::now();
    assert_eq!(m.handle.report().state, ModuleState::Unhealthy);
    assert_eq!(
        m.handle.admit().expect_err("not admitted").state,
        ModuleState::Unhealthy
    );
    // Only then is it stopped, and only after its grace replaced.
    m.healthy(1).await;
    fake.record(|r| {
        let (_, stopped, _) = r.stops[0];
        assert!(stopped >= failed_at, "stopped before the gate closed");
        assert_eq!(r.spawns[1].1 - stopped, Duration::from_secs(60));
    });
    m.stop().await;
}

/// A process started through [`Processes`] outlives the thread, and the
/// runtime, that asked for it. The kernel sends a child's parent-death
/// signal when the *thread* that forked it ends: forked from one of the
/// runtime's blocking threads, a module was SIGKILLed once that thread
/// ended (10 s idle in the host; here, with the runtime).
#[test]
fn a_started_process_outlives_the_thread_that_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = Session::prepare(dir.path()).expect("session");
    let spec = ModuleSpec {
        name: "m".to_owned(),
        program: "sleep".to_owned(),
        args: vec!["30".to_owned()],
        env: Default::default(),
        routes: Vec::new(),
        supervision: supervision(),
        start: Default::default(),
    };
    let socket = session.socket_path(&spec.name);
    let spawned = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime
            .block_on(Processes.spawn(&spec, &session, &socket, 0))
            .expect("sleep started")
        // The runtime, its blocking threads and this thread end here.
    })
    .join()
    .expect("the starting thread");
    let pid = spawned.pid;
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit(") ").next().map(|rest| rest.chars().next()))
            .flatten()
    };
    // A parent-death SIGKILL is sent as the thread ends: within a second
    // the child would be dead (a zombie, as nothing reaps it here).
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < deadline {
        let now = state();
        assert!(
            matches!(now, Some(c) if c != 'Z' && c != 'X'),
            "the started process died with the thread that asked for it: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
}
