//! Module supervision: one task per module owns its process; cloneable
//! [`ModuleHandle`]s let the proxy and the API read its state and steer it.
//!
//! # Theory of operation
//!
//! Each module runs in its own task ([`task::ModuleTask`]), which spawns an
//! incarnation, probes `/api/healthz` until it answers 200, then checks it
//! every `health_interval`, racing every wait against the process's exit, a
//! control message and shutdown. When the incarnation fails, the task
//! cancels the incarnation's [`CancellationToken`] (in-flight requests end at
//! once), stops the process group (SIGTERM, SIGKILL after a grace), kills
//! whatever the incarnation started that left the group (see
//! [`containment`]), and starts the next incarnation after a backoff that
//! doubles with each failure in a row. Nothing here runs on the request
//! path but [`ModuleHandle::admit`], which reads the status under a
//! short-held mutex.
//! A module task never blocks another one or the HTTP server.

mod cgroup;
mod containment;
mod descendants;
#[cfg(test)]
mod fake_child;
mod health;
mod spawn;
mod state;
mod task;
#[cfg(test)]
mod tests;
mod usage;

pub use cgroup::{run_warden, WARDEN_FLAG};
pub use containment::contain;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use ray_dashd_contract::{LockExt, RwLockExt};
use serde::Serialize;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::{ModuleSpec, Start};
use crate::connection::ConnectionStats;
use crate::metrics::{Metrics, ModuleMetrics};
use crate::session::Session;

pub(crate) use state::Gate;
use state::{epoch_ms, Status};
pub use state::{Event, ModuleState};
use task::{Control, ModuleTask};

/// What a module shares between its task and its handles.
#[derive(Debug)]
pub(crate) struct ModuleShared {
    pub(crate) spec: ModuleSpec,
    /// The module's name, shared cheaply with response bodies.
    pub(crate) name: Arc<str>,
    /// `<session>/sockets/dash_<name>`.
    pub(crate) socket: PathBuf,
    status: Mutex<Status>,
    controls: mpsc::Sender<Control>,
    /// Cancelled when the host shuts down, or the module is removed by a
    /// reload, before any incarnation's gate: what ends a request then is
    /// the module going away, not a failure.
    pub(crate) shutdown: CancellationToken,
    /// Cancelled once the module's task has ended: its process stopped and
    /// its socket removed.
    stopped: CancellationToken,
    /// Its series, which the proxy records into.
    pub(crate) metrics: ModuleMetrics,
    /// Starts a dormant module (one started on demand): a request for one
    /// of its routes has come.
    wake: Notify,
    /// Notified whenever the state changes, for requests that wait for a
    /// module started on demand to be ready.
    changed: Notify,
}

impl ModuleShared {
    pub(crate) fn new(
        spec: ModuleSpec,
        socket: PathBuf,
        controls: mpsc::Sender<Control>,
        shutdown: CancellationToken,
        stopped: CancellationToken,
        metrics: ModuleMetrics,
    ) -> ModuleShared {
        ModuleShared {
            name: Arc::from(spec.name.as_str()),
            spec,
            socket,
            status: Mutex::new(Status::default()),
            controls,
            shutdown,
            stopped,
            metrics,
            wake: Notify::new(),
            changed: Notify::new(),
        }
    }

    /// Runs `f` on the status. The lock is never held across an await.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut Status) -> R) -> R {
        let (result, changed) = {
            let mut status = self.status.locked();
            let before = status.state;
            let result = f(&mut status);
            (result, status.state != before)
        };
        if changed {
            self.changed.notify_waiters();
        }
        result
    }
}

/// A cloneable reference to one supervised module.
#[derive(Debug, Clone)]
pub struct ModuleHandle {
    shared: Arc<ModuleShared>,
}

impl ModuleHandle {
    /// The module's name.
    pub fn name(&self) -> &str {
        &self.shared.spec.name
    }

    /// The module's configuration.
    pub fn spec(&self) -> &ModuleSpec {
        &self.shared.spec
    }

    /// The socket the module listens on.
    pub fn socket(&self) -> &std::path::Path {
        &self.shared.socket
    }

    /// The module's name as a shared string.
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.shared.name
    }

    /// The series the proxy records this module's requests into.
    pub(crate) fn metrics(&self) -> &ModuleMetrics {
        &self.shared.metrics
    }

    /// Cancelled when the host shuts down, before the gate of the
    /// incarnation it stops is.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shared.shutdown
    }

    /// Lets a request through to the healthy incarnation, first starting
    /// a module started on demand and waiting while it starts (at most its
    /// `startup_timeout`); else as [`ModuleHandle::admit`].
    pub(crate) async fn admit_or_start(&self) -> Result<Gate, NotReady> {
        if self.shared.spec.start != Start::OnDemand {
            return self.admit();
        }
        let deadline = tokio::time::Instant::now() + self.shared.spec.supervision.startup_timeout;
        loop {
            // Registered before the state is read, so that no change
            // between the two is missed.
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.admit() {
                Ok(gate) => return Ok(gate),
                Err(NotReady {
                    state: ModuleState::Dormant,
                    ..
                }) => self.shared.wake.notify_one(),
                Err(NotReady {
                    state: ModuleState::Starting,
                    ..
                }) => {}
                Err(not_ready) => return Err(not_ready),
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.admit();
            }
        }
    }

    /// Lets a request through to the healthy incarnation, or says why not.
    pub(crate) fn admit(&self) -> Result<Gate, NotReady> {
        self.shared.update(|s| match (&s.gate, s.state) {
            (Some(gate), ModuleState::Healthy) => Ok(gate.clone()),
            (_, state) => {
                let retry_after = s
                    .next_start_at
                    .and_then(|t| t.duration_since(SystemTime::now()).ok())
                    .unwrap_or(Duration::from_secs(1));
                Err(NotReady { state, retry_after })
            }
        })
    }

    /// What the module is doing now.
    pub fn state(&self) -> ModuleState {
        self.shared.update(|s| s.state)
    }

    /// Requests being served by the module or waiting for a connection
    /// to it.
    pub fn in_flight(&self) -> usize {
        self.shared.update(|s| {
            s.gate.as_ref().map_or(0, |gate| {
                let stats = gate.client.stats();
                stats.open - stats.idle + stats.queued
            })
        })
    }

    /// Asks for a restart of the module now. False when the module task is
    /// already busy with an earlier request.
    pub fn restart(&self) -> bool {
        self.shared.controls.try_send(Control::Restart).is_ok()
    }

    /// The module's state, as `/api/modules` reports it.
    pub fn report(&self) -> ModuleReport {
        let spec = &self.shared.spec;
        self.shared.update(|s| ModuleReport {
            name: spec.name.clone(),
            state: s.state,
            pid: s.pid,
            incarnation: s.incarnation,
            restarts: s.restarts,
            failures_in_row: s.failures_in_row,
            failed_checks: s.failed_checks,
            last_error: s.last_error.clone(),
            reason: s
                .reason
                .clone()
                .filter(|_| matches!(s.state, ModuleState::Starting | ModuleState::Waiting)),
            started_at_ms: s.started_at.map(epoch_ms),
            uptime_ms: s
                .ready_at
                .filter(|_| s.state == ModuleState::Healthy)
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .map(|d| d.as_millis() as u64),
            last_health_rtt_us: s.last_health_rtt.map(|d| d.as_micros() as u64),
            last_health_at_ms: s.last_health_at.map(epoch_ms),
            busy_since_ms: s
                .busy_since
                .filter(|_| s.state == ModuleState::Healthy)
                .map(epoch_ms),
            memory_bytes: s.memory_bytes.filter(|_| s.pid.is_some()),
            memory_budget_bytes: spec.supervision.memory_budget,
            backoff_ms: s.backoff.map(|d| d.as_millis() as u64),
            next_start_at_ms: s.next_start_at.map(epoch_ms),
            connections: s.gate.as_ref().map_or_else(
                || ConnectionStats::none(spec.supervision.connection_limits()),
                |gate| gate.client.stats(),
            ),
            socket: self.shared.socket.display().to_string(),
            command: std::iter::once(spec.program.clone())
                .chain(spec.args.iter().cloned())
                .collect(),
            routes: spec
                .routes
                .iter()
                .map(|r| RouteReport {
                    method: r.method.to_string(),
                    path: r.path.clone(),
                    kind: r.kind.to_string(),
                })
                .collect(),
            events: s.events.iter().cloned().collect(),
        })
    }
}

/// Why [`ModuleHandle::admit`] let a request not through: the module has no
/// healthy incarnation now. The proxy answers it (503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotReady {
    /// The module's state: starting, waiting, backing off, ….
    pub(crate) state: ModuleState,
    /// When to try again: when the next incarnation starts, else a second.
    pub(crate) retry_after: Duration,
}

/// One module in `GET /api/modules`.
#[derive(Debug, Clone, Serialize)]
pub struct ModuleReport {
    /// The module's name.
    pub name: String,
    /// Its state.
    pub state: ModuleState,
    /// The pid of the current process, if one runs.
    pub pid: Option<u32>,
    /// The current (or last) incarnation, counted from 0.
    pub incarnation: Option<u32>,
    /// Incarnations started after the first.
    pub restarts: u32,
    /// Failures since the module was last stable (they set the backoff).
    pub failures_in_row: u32,
    /// Failed health checks in a row of the current incarnation.
    pub failed_checks: u32,
    /// Why the module last failed.
    pub last_error: Option<String>,
    /// While starting or waiting: why it is not ready yet, in its own words
    /// (its latest non-200 `/api/healthz` answer).
    pub reason: Option<String>,
    /// When the current process started (ms since the epoch).
    pub started_at_ms: Option<u64>,
    /// How long the current incarnation has been healthy.
    pub uptime_ms: Option<u64>,
    /// The last successful health check's round trip, in microseconds.
    pub last_health_rtt_us: Option<u64>,
    /// When the last health check finished (ms since the epoch).
    pub last_health_at_ms: Option<u64>,
    /// While the module is busy (its health checks unanswered while its
    /// processes use CPU): since when (ms since the epoch).
    pub busy_since_ms: Option<u64>,
    /// The resident memory of its processes at the last health check.
    pub memory_bytes: Option<u64>,
    /// Its memory budget (`memory_budget_mib`), when it has one.
    pub memory_budget_bytes: Option<u64>,
    /// The last restart delay chosen, in milliseconds; while waiting, how
    /// long the module itself waits between tries (its `Retry-After`).
    pub backoff_ms: Option<u64>,
    /// While backing off: when the next incarnation starts.
    pub next_start_at_ms: Option<u64>,
    /// Its connections now: open, idle, requests waiting for one, and the
    /// limits (all zero but the limits without a healthy incarnation).
    pub connections: ConnectionStats,
    /// The Unix socket it serves on.
    pub socket: String,
    /// Its command line.
    pub command: Vec<String>,
    /// The routes forwarded to it.
    pub routes: Vec<RouteReport>,
    /// Its recent history, oldest first.
    pub events: Vec<Event>,
}

/// One route in a [`ModuleReport`].
#[derive(Debug, Clone, Serialize)]
pub struct RouteReport {
    /// The HTTP method.
    pub method: String,
    /// The path pattern.
    pub path: String,
    /// `http`, `stream` or `websocket`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// How long [`EarlyStart::stderr_tail`] waits for output still in a pipe.
const TAIL_DRAIN: Duration = Duration::from_millis(500);

/// A module's first incarnation, started before the supervisor: the host
/// starts Ray's zygote while it reads other things, and learns the other
/// modules' routes from it. [`Supervisor::start`] takes it over as the
/// module's incarnation 0; dropped instead, its process group is killed.
#[derive(Debug)]
pub struct EarlyStart {
    name: String,
    spawned: Option<spawn::Spawned>,
    started_at: SystemTime,
}

impl EarlyStart {
    /// Starts incarnation 0 of `spec` exactly as its module task would
    /// (stale socket removed, own process group, tied to the host's life,
    /// logs in `<logs>/dashboard_<name>.out`/`.err`). Call within the
    /// runtime.
    pub fn spawn(spec: &ModuleSpec, session: &Session) -> std::io::Result<EarlyStart> {
        let socket = session.socket_path(&spec.name);
        task::remove_stale_socket(&socket)?;
        let spawned = spawn::spawn_module(spec, session, &socket, 0)?;
        Ok(EarlyStart {
            name: spec.name.clone(),
            spawned: Some(spawned),
            started_at: SystemTime::now(),
        })
    }

    /// Its exit status, once it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.spawned
            .as_mut()
            .and_then(|s| s.child.try_wait().ok().flatten())
    }

    /// The last lines of its stderr log, for a failure report. Its output
    /// reaches the log through a pump thread, so this first waits (at most
    /// [`TAIL_DRAIN`]) for the pumps to copy what it wrote before exiting.
    pub fn stderr_tail(&self, session: &Session, lines: usize) -> String {
        crate::session::rotating::drain(TAIL_DRAIN);
        spawn::tail(&session.log_dir, &spawn::log_name(&self.name, "err"), lines)
    }

    fn take(mut self) -> (spawn::Spawned, SystemTime) {
        let spawned = self
            .spawned
            .take()
            .expect("UNWRAP: an early start holds its child until taken");
        (spawned, self.started_at)
    }
}

impl Drop for EarlyStart {
    fn drop(&mut self) {
        let Some(spawned) = self.spawned.take() else {
            return;
        };
        if let Some(pid) = spawned.child.id() {
            spawn::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
        // Its cgroup, and the rest at the host's exit (its registration
        // stays: the runtime still reaps the process). Emptying a cgroup
        // waits for its processes to die: off the runtime's threads.
        if let Some(cgroup) = spawned.cgroup {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || cgroup.kill_and_remove())),
                Err(_) => cgroup.kill_and_remove(),
            }
        }
    }
}

/// All the modules of one host.
#[derive(Debug)]
pub struct Supervisor {
    /// The modules now, in configuration order: replaced whole by
    /// [`Supervisor::apply`], read as a snapshot (never held across an
    /// await).
    modules: RwLock<Arc<[ModuleHandle]>>,
    /// Modules a reload removed or changed, by name, until their task has
    /// stopped (the token): a module of the same name added meanwhile
    /// waits for it, as its socket is the same.
    retiring: Mutex<HashMap<String, CancellationToken>>,
    session: Session,
    tracker: TaskTracker,
    stop: CancellationToken,
    /// Where each module's series are made.
    metrics: Arc<Metrics>,
}

/// What [`Supervisor::apply`] changed, by module name.
#[derive(Debug, Default)]
pub struct Applied {
    /// Modules new to the config, starting.
    pub added: Vec<String>,
    /// Modules no longer in the config.
    pub removed: Vec<String>,
    /// Modules whose command, environment, routes or supervision changed:
    /// started again once their old process has stopped.
    pub changed: Vec<String>,
    /// Modules left as they were, open connections and all.
    pub unchanged: Vec<String>,
    /// The handles of the removed and changed modules as they were, for
    /// [`Supervisor::retire`] once no route leads to them any more.
    pub retired: Vec<ModuleHandle>,
}

impl Supervisor {
    /// Spawns a task for every module; each starts its first incarnation at
    /// once and independently of the others, or takes over the one in
    /// `early` of its name.
    pub fn start(
        specs: &[ModuleSpec],
        session: &Session,
        early: impl IntoIterator<Item = EarlyStart>,
        metrics: Arc<Metrics>,
    ) -> Supervisor {
        let mut early: HashMap<String, EarlyStart> =
            early.into_iter().map(|e| (e.name.clone(), e)).collect();
        let tracker = TaskTracker::new();
        let stop = CancellationToken::new();
        tracker.spawn(containment::watch(stop.clone()));
        let supervisor = Supervisor {
            modules: RwLock::new(Arc::from(Vec::new())),
            retiring: Mutex::new(HashMap::new()),
            session: session.clone(),
            tracker,
            stop,
            metrics,
        };
        let modules: Vec<ModuleHandle> = specs
            .iter()
            .map(|spec| supervisor.spawn_task(spec, early.remove(&spec.name), None))
            .collect();
        *supervisor.modules.write_locked() = Arc::from(modules);
        // Closed so that `shutdown` can wait for it to empty; a reload
        // still spawns tasks on it.
        supervisor.tracker.close();
        supervisor
    }

    /// Starts the task of module `spec`, taking over `early`; with `after`,
    /// the first incarnation waits until that token is cancelled (the
    /// module's previous task has stopped its process and freed its socket).
    fn spawn_task(
        &self,
        spec: &ModuleSpec,
        early: Option<EarlyStart>,
        after: Option<CancellationToken>,
    ) -> ModuleHandle {
        let (controls_tx, controls_rx) = mpsc::channel(1);
        let socket = self.session.socket_path(&spec.name);
        let shutdown = self.stop.child_token();
        let stopped = CancellationToken::new();
        let shared = Arc::new(ModuleShared::new(
            spec.clone(),
            socket,
            controls_tx,
            shutdown.clone(),
            stopped.clone(),
            self.metrics.module(&spec.name, &spec.routes),
        ));
        let task = ModuleTask {
            spawner: spawn::Processes,
            shared: Arc::clone(&shared),
            session: self.session.clone(),
            controls: controls_rx,
            shutdown,
            early: early.map(EarlyStart::take),
            after,
        };
        let span = tracing::info_span!("module", module = %spec.name);
        self.tracker.spawn(
            async move {
                task.run().await;
                stopped.cancel();
            }
            .instrument(span),
        );
        ModuleHandle { shared }
    }

    /// A supervisor of no modules that runs no task, for router tests.
    #[cfg(test)]
    pub(crate) fn without_modules(session: &Session) -> Supervisor {
        Supervisor {
            modules: RwLock::new(Arc::from(Vec::new())),
            retiring: Mutex::new(HashMap::new()),
            session: session.clone(),
            tracker: TaskTracker::new(),
            stop: CancellationToken::new(),
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// Where the modules' series are.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Every module now, in configuration order.
    pub fn modules(&self) -> Arc<[ModuleHandle]> {
        Arc::clone(&self.modules.read_locked())
    }

    /// The module named `name`.
    pub fn get(&self, name: &str) -> Option<ModuleHandle> {
        self.modules().iter().find(|m| m.name() == name).cloned()
    }

    /// Makes `specs` the modules, in their order: a module whose spec is
    /// unchanged keeps its task, process and connections; a new one is
    /// started; a changed one gets a new task that starts once the old one
    /// has stopped. The old handles of removed and changed modules are
    /// returned for [`Supervisor::retire`]: they keep serving what they
    /// serve until then.
    pub fn apply(&self, specs: &[ModuleSpec]) -> Applied {
        let old = self.modules();
        let mut applied = Applied::default();
        let mut modules = Vec::with_capacity(specs.len());
        for spec in specs {
            match old.iter().find(|m| m.name() == spec.name) {
                Some(module) if module.spec() == spec => {
                    applied.unchanged.push(spec.name.clone());
                    modules.push(module.clone());
                }
                Some(module) => {
                    applied.changed.push(spec.name.clone());
                    let after = module.shared.stopped.clone();
                    self.retiring_now(module);
                    modules.push(self.spawn_task(spec, None, Some(after)));
                    applied.retired.push(module.clone());
                }
                None => {
                    applied.added.push(spec.name.clone());
                    // Removed by an earlier reload and still stopping?
                    let after = self.retiring.locked().get(&spec.name).cloned();
                    modules.push(self.spawn_task(spec, None, after));
                }
            }
        }
        for module in old.iter() {
            if !specs.iter().any(|s| s.name == module.name()) {
                applied.removed.push(module.name().to_owned());
                self.retiring_now(module);
                applied.retired.push(module.clone());
            }
        }
        *self.modules.write_locked() = Arc::from(modules);
        applied
    }

    /// Notes that `module` is being retired, until its task has stopped.
    fn retiring_now(&self, module: &ModuleHandle) {
        let stopped = module.shared.stopped.clone();
        self.retiring
            .locked()
            .insert(module.name().to_owned(), stopped);
    }

    /// Runs `work` on the supervisor's tracker: [`Supervisor::shutdown`]
    /// waits for it too.
    pub fn track(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(work);
    }

    /// Stops `module`, which no route leads to any more: once its requests
    /// in flight have finished, or after `grace`, its process is stopped as
    /// at shutdown (open websockets closed with 1001) and its socket
    /// removed. Returns when it has stopped.
    pub async fn retire(&self, module: &ModuleHandle, grace: Duration) {
        /// How often the requests in flight are counted.
        const POLL: Duration = Duration::from_millis(20);
        let deadline = tokio::time::Instant::now() + grace;
        while module.in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        module.shared.shutdown.cancel();
        module.shared.stopped.cancelled().await;
        let mut retiring = self.retiring.locked();
        // Unless a later retirement of the same name took its place.
        if retiring
            .get(module.name())
            .is_some_and(|t| t.is_cancelled())
        {
            retiring.remove(module.name());
        }
    }

    /// Stops every module (SIGTERM, then SIGKILL after its grace) and waits
    /// until all are stopped and their sockets removed.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        self.tracker.wait().await;
    }

    /// Kills whatever is left below the host (what modules started and no
    /// incarnation's end could attribute, or all of it when the modules
    /// did not stop in time) and removes the modules' cgroups. Last thing
    /// before exit.
    pub async fn sweep(&self) {
        containment::sweep().await;
    }
}
