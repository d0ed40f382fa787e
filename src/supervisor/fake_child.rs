//! A fake module child for the supervisor's tests: [`FakeSpawner`] stands in
//! for [`super::spawn::Processes`], and each [`FakeChild`] serves
//! `/api/healthz` on the module's real socket from a task in the test's
//! runtime, exits, hangs or never gets ready as its [`Plan`] says.
//!
//! Only the process boundary is faked: the health checks stay the host's own
//! (its pool, probe and timeouts against a real Unix socket), so what the
//! tests check is what runs in production. That works under a paused clock:
//! tokio advances it only when every task is idle, and a request on a Unix
//! socket served in the same runtime wakes its server at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, sleep_until, Instant};

use super::spawn::{Incarnation, Spawner};
use super::usage::Usage;
use crate::config::ModuleSpec;
use crate::connection::PeerCheck;
use crate::session::Session;

/// The first fake pid: above any `pid_max` (2^22), so that a signal sent to
/// it by mistake reaches nobody.
const FAKE_PID_BASE: u32 = 0x4000_0000;

/// How `/api/healthz` answers.
#[derive(Debug, Clone)]
pub(crate) enum Healthz {
    /// 200.
    Ok,
    /// `status` with `body`, after `delay`.
    Answer {
        status: u16,
        body: &'static str,
        delay: Duration,
    },
    /// Never: the request hangs until the child ends.
    Hang,
}

/// What one incarnation does.
/// How a fake child's processes use the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cpu {
    /// Not at all: asleep.
    Idle,
    /// A whole CPU, all the time.
    Busy,
    /// Stopped (SIGSTOP), after using a whole CPU.
    Stopped,
    /// A whole CPU, on a machine so crowded that every look at its
    /// processes takes twice the health timeout of the tests.
    BusySlowLooks,
    /// A whole CPU, and every other look at its processes never ends (the
    /// host's bound on a look ends it).
    BusyLostLooks,
    /// Computing, on a machine so crowded that it waits for a CPU through
    /// every interval between looks: no CPU time, no wait ended, runnable.
    Starved,
}

#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// How its processes look to a sample: CPU used while running, stopped.
    cpu: Cpu,
    /// Its resident memory, in bytes, from its start; and, after a while,
    /// another.
    rss: (u64, Option<(Duration, u64)>),
    /// Its spawn fails with this `errno`.
    spawn_error: Option<i32>,
    /// Whether it listens on its socket at all.
    listens: bool,
    /// How `/api/healthz` answers from its start.
    healthz: Healthz,
    /// From this long after its start, `/api/healthz` answers so instead.
    then: Option<(Duration, Healthz)>,
    /// It exits with this code this long after its start.
    exit: Option<(Duration, i32)>,
    /// It ignores SIGTERM: only SIGKILL, after the stop grace, ends it.
    ignores_term: bool,
}

impl Plan {
    /// Ready at once, healthy for ever.
    pub(crate) fn healthy() -> Plan {
        Plan {
            cpu: Cpu::Idle,
            rss: (10 << 20, None),
            spawn_error: None,
            listens: true,
            healthz: Healthz::Ok,
            then: None,
            exit: None,
            ignores_term: false,
        }
    }

    /// Its spawn fails with `errno`, as a missing program's does.
    pub(crate) fn spawn_fails(errno: i32) -> Plan {
        Plan {
            spawn_error: Some(errno),
            ..Plan::healthy()
        }
    }

    /// Never listens on its socket: every probe fails to connect.
    pub(crate) fn never_listening() -> Plan {
        Plan {
            listens: false,
            ..Plan::healthy()
        }
    }

    /// `/api/healthz` answers so from the start.
    pub(crate) fn answering(self, healthz: Healthz) -> Plan {
        Plan { healthz, ..self }
    }

    /// `/api/healthz` answers so from `after` its start on.
    pub(crate) fn then(self, after: Duration, healthz: Healthz) -> Plan {
        Plan {
            then: Some((after, healthz)),
            ..self
        }
    }

    /// Exits with `code` `after` its start.
    pub(crate) fn exits(self, after: Duration, code: i32) -> Plan {
        Plan {
            exit: Some((after, code)),
            ..self
        }
    }

    /// Ignores SIGTERM.
    /// Its processes use a whole CPU from its start (or stop, `Stopped`).
    pub(crate) fn using(self, cpu: Cpu) -> Plan {
        Plan { cpu, ..self }
    }

    /// Its resident memory becomes `bytes` once it has run for `after`.
    pub(crate) fn growing_to(self, after: Duration, bytes: u64) -> Plan {
        Plan {
            rss: (self.rss.0, Some((after, bytes))),
            ..self
        }
    }

    pub(crate) fn ignoring_sigterm(self) -> Plan {
        Plan {
            ignores_term: true,
            ..self
        }
    }
}

/// What happened to the fake children, for the tests' assertions; times on
/// the (paused) tokio clock.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// When each incarnation was spawned, successfully or not, in order.
    pub(crate) spawns: Vec<(u32, Instant)>,
    /// When each incarnation was asked to stop (SIGTERM), and whether it
    /// had exited already.
    pub(crate) stops: Vec<(u32, Instant, bool)>,
    /// Incarnations cleaned up after their stop.
    pub(crate) cleaned: Vec<u32>,
}

/// Spawns [`FakeChild`]ren, each following the [`Plan`] its incarnation
/// number picks. Cloned, it shares the [`Record`].
#[derive(Clone)]
pub(crate) struct FakeSpawner {
    plan: Arc<dyn Fn(u32) -> Plan + Send + Sync>,
    record: Arc<Mutex<Record>>,
}

impl std::fmt::Debug for FakeSpawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSpawner").finish_non_exhaustive()
    }
}

impl FakeSpawner {
    /// Incarnation `n` follows `plan(n)`.
    pub(crate) fn new(plan: impl Fn(u32) -> Plan + Send + Sync + 'static) -> FakeSpawner {
        FakeSpawner {
            plan: Arc::new(plan),
            record: Arc::default(),
        }
    }

    /// Reads the record.
    pub(crate) fn record<R>(&self, f: impl FnOnce(&Record) -> R) -> R {
        f(&self.record.lock().expect("record lock"))
    }

    /// Starts incarnation `incarnation`, as its plan says.
    fn start(&self, socket: &Path, incarnation: u32) -> io::Result<FakeChild> {
        let plan = (self.plan)(incarnation);
        let started = Instant::now();
        self.record
            .lock()
            .expect("record lock")
            .spawns
            .push((incarnation, started));
        if let Some(errno) = plan.spawn_error {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let server = if plan.listens {
            let listener = UnixListener::bind(socket)?;
            Some(tokio::spawn(serve(listener, started, plan.clone())))
        } else {
            None
        };
        Ok(FakeChild {
            started,
            cpu: plan.cpu,
            rss: plan.rss,
            incarnation,
            looks: Default::default(),
            exit: plan.exit.map(|(after, code)| (started + after, code)),
            ignores_term: plan.ignores_term,
            status: None,
            server,
            record: Arc::clone(&self.record),
        })
    }
}

impl Spawner for FakeSpawner {
    type Incarnation = FakeChild;

    fn spawn(
        &self,
        _spec: &ModuleSpec,
        _session: &Session,
        socket: &Path,
        incarnation: u32,
    ) -> impl Future<Output = io::Result<FakeChild>> + Send {
        std::future::ready(self.start(socket, incarnation))
    }
}

/// One fake incarnation: a server task on its socket, and an exit planned
/// or caused by its stop.
#[derive(Debug)]
pub(crate) struct FakeChild {
    started: Instant,
    cpu: Cpu,
    rss: (u64, Option<(Duration, u64)>),
    incarnation: u32,
    /// How many times its usage was asked for.
    looks: std::sync::atomic::AtomicU32,
    /// When it exits by itself, and with which code.
    exit: Option<(Instant, i32)>,
    ignores_term: bool,
    /// How it ended, once it has.
    status: Option<ExitStatus>,
    /// Its server; aborted (its connections with it) when it ends.
    server: Option<JoinHandle<()>>,
    record: Arc<Mutex<Record>>,
}

impl FakeChild {
    /// Ends it: its server and every connection to it go.
    fn end(&mut self, status: ExitStatus) -> ExitStatus {
        self.status = Some(status);
        if let Some(server) = self.server.take() {
            server.abort();
        }
        status
    }
}

impl Drop for FakeChild {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// An exit status for `signal`, as `waitpid` gives it.
fn killed_by(signal: i32) -> ExitStatus {
    ExitStatus::from_raw(signal)
}

impl Incarnation for FakeChild {
    fn pid(&self) -> u32 {
        FAKE_PID_BASE + self.incarnation
    }

    fn peer(&self) -> Option<PeerCheck> {
        // Its server is this test process, in no group of the fake pid.
        None
    }

    async fn exited(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let Some((at, code)) = self.exit else {
            return std::future::pending().await;
        };
        sleep_until(at).await;
        Ok(self.end(ExitStatus::from_raw(code << 8)))
    }

    async fn stop(&mut self, exited: Option<ExitStatus>, grace: Duration) -> Option<ExitStatus> {
        self.record.lock().expect("record lock").stops.push((
            self.incarnation,
            Instant::now(),
            exited.is_some(),
        ));
        if exited.is_some() {
            return exited;
        }
        if !self.ignores_term {
            return Some(self.end(killed_by(nix::libc::SIGTERM)));
        }
        tokio::select! {
            status = self.exited() => status.ok(),
            () = sleep(grace) => Some(self.end(killed_by(nix::libc::SIGKILL))),
        }
    }

    async fn usage(&self) -> Option<Usage> {
        if self.status.is_some() {
            return None;
        }
        let look = self
            .looks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.cpu {
            // The caller's timeout ends this look.
            Cpu::BusyLostLooks if look % 2 == 1 => return std::future::pending().await,
            Cpu::BusySlowLooks => sleep(Duration::from_secs(1)).await,
            _ => {}
        }
        let ran = self.started.elapsed();
        let ticks_per_sec = 100;
        let cpu_ticks = match self.cpu {
            Cpu::Idle | Cpu::Starved => 0,
            Cpu::Busy | Cpu::Stopped | Cpu::BusySlowLooks | Cpu::BusyLostLooks => {
                (ran.as_millis() / 10) as u64
            }
        };
        let rss_bytes = match self.rss {
            (_, Some((after, bytes))) if ran >= after => bytes,
            (bytes, _) => bytes,
        };
        Some(Usage {
            cpu_ticks,
            ticks_per_sec,
            wait_ns: 0,
            stopped: self.cpu == Cpu::Stopped,
            runnable: self.cpu == Cpu::Starved,
            rss_bytes,
            processes: 1,
        })
    }

    async fn killed_at_budget(&self) -> bool {
        false
    }

    async fn clean_up(mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
        self.record
            .lock()
            .expect("record lock")
            .cleaned
            .push(self.incarnation);
    }
}

/// Serves `listener` until aborted: `/api/healthz` as `plan` says, and
/// `/slow` never (a request in flight).
async fn serve(listener: UnixListener, started: Instant, plan: Plan) {
    let plan = Arc::new(plan);
    // Dropped with this task when the child ends: its connections go too.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let plan = Arc::clone(&plan);
        let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let plan = Arc::clone(&plan);
            async move { Ok::<_, Infallible>(answer(&plan, started, request.uri().path()).await) }
        });
        connections.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to a request for `path` now.
async fn answer(plan: &Plan, started: Instant, path: &str) -> http::Response<Full<Bytes>> {
    let respond = |status: u16, body: &'static str| {
        http::Response::builder()
            .status(status)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("UNWRAP: a valid static response")
    };
    if path != ray_dashd_contract::names::HEALTHZ_PATH {
        return std::future::pending().await;
    }
    let healthz = match &plan.then {
        Some((after, then)) if started.elapsed() >= *after => then,
        _ => &plan.healthz,
    };
    match healthz {
        Healthz::Ok => respond(200, "ok"),
        Healthz::Answer {
            status,
            body,
            delay,
        } => {
            sleep(*delay).await;
            respond(*status, body)
        }
        Healthz::Hang => std::future::pending().await,
    }
}
