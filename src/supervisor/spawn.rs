//! The process boundary: starting a module's process in its own process
//! group (and cgroup, where there are), tied to the host's life, and
//! stopping the whole group. The module task reaches it through
//! [`Spawner`] and [`Incarnation`] only, so that its tests can put a fake
//! child in its place (as watchexec's supervisor does with its test child).

use std::future::Future;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use ray_dashd_contract::names::{
    CGROUP_VAR, INCARNATION_VAR, LOG_DIR_VAR, MODULE_VAR, SESSION_DIR_VAR, SOCKET_VAR,
};
use ray_dashd_contract::LockExt;
use rustix::process::Rlimit;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tracing::warn;

use super::cgroup::{self, IncarnationCgroup};
use super::containment::{after_stop, before_stop, containment};
use super::usage::{self, Usage};
use crate::config::ModuleSpec;
use crate::connection::PeerCheck;
use crate::descriptors;
use crate::session::{LogDir, RotatingFile, Session};

/// How much of a log file's end is read to quote its last lines.
const TAIL_BYTES: u64 = 4096;

/// Starts a module's incarnations: [`Processes`] for real, a fake child in
/// the supervisor's tests. Called by the module task only, never on the
/// request path.
pub(crate) trait Spawner: Send + Sync + 'static {
    /// What one start gives.
    type Incarnation: Incarnation;

    /// Starts incarnation `incarnation` of `spec`, to serve on `socket`
    /// (which the caller has checked is free).
    fn spawn(
        &self,
        spec: &ModuleSpec,
        session: &Session,
        socket: &Path,
        incarnation: u32,
    ) -> impl Future<Output = io::Result<Self::Incarnation>> + Send;
}

/// One started incarnation, owned by its module task from its spawn to its
/// end.
pub(crate) trait Incarnation: Send + Sync + 'static {
    /// The pid of its process, leader of its process group. Read once,
    /// right after the spawn.
    fn pid(&self) -> u32;

    /// Who must serve its socket (see [`PeerCheck`]); `None`: anyone.
    fn peer(&self) -> Option<PeerCheck>;

    /// Resolves when it exits, with how. Cancel-safe: the task races it
    /// against everything else, again and again.
    fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>> + Send + '_;

    /// Stops it, unless it exited already (`exited`): SIGTERM, SIGKILL after
    /// `grace`, and whatever it started outside its group. Returns how it
    /// ended.
    fn stop(
        &mut self,
        exited: Option<ExitStatus>,
        grace: Duration,
    ) -> impl Future<Output = Option<ExitStatus>> + Send + '_;

    /// Once it has stopped: kills what is left of it anywhere (its cgroup,
    /// processes it left behind) and forgets it.
    fn clean_up(self) -> impl Future<Output = ()> + Send;

    /// What its processes use now ([`Usage`]); `None` once none is left.
    fn usage(&self) -> impl Future<Output = Option<Usage>> + Send;

    /// Whether the kernel killed one of its processes for going over its
    /// memory budget (the cgroup's `memory.max`), once it has exited.
    fn killed_at_budget(&self) -> impl Future<Output = bool> + Send;
}

/// The real [`Spawner`]: [`spawn_module`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Processes;

impl Spawner for Processes {
    type Incarnation = Spawned;

    /// On the launcher thread ([`launch`]): the fork waits for the child's
    /// exec, and the child first moves into its cgroup, for which the
    /// kernel waits out an RCU grace period (14 ms measured here). On the
    /// runtime's thread that stalled every request and health check for as
    /// long.
    fn spawn(
        &self,
        spec: &ModuleSpec,
        session: &Session,
        socket: &Path,
        incarnation: u32,
    ) -> impl Future<Output = io::Result<Spawned>> + Send {
        let (spec, session, socket) = (spec.clone(), session.clone(), socket.to_path_buf());
        launch(move || spawn_module(&spec, &session, &socket, incarnation))
    }
}

/// A start of a module's process, run on the launcher thread.
type Job = Box<dyn FnOnce() + Send>;

/// Runs `start` on the launcher thread, within the caller's runtime; its
/// result.
///
/// One thread that lives as long as the host forks every module. A
/// child's parent-death signal fires when the *thread* that forked it
/// ends, not the process: a module forked from one of tokio's blocking
/// threads, which end after 10 s without work, was SIGKILLed then. Where
/// the thread cannot be made (no memory, a task limit reached), the start
/// fails, and is tried again after the module's backoff, the thread with
/// it: starting on the runtime's thread instead would stall every request
/// for as long as the fork and a failed start's clean-up take.
fn launch(
    start: impl FnOnce() -> io::Result<Spawned> + Send + 'static,
) -> impl Future<Output = io::Result<Spawned>> + Send {
    static LAUNCHER: Mutex<Option<mpsc::Sender<Job>>> = Mutex::new(None);
    async move {
        let (done, result) = oneshot::channel();
        let runtime = tokio::runtime::Handle::current();
        let job: Job = Box::new(move || {
            // tokio's process support registers the child with the runtime.
            let _entered = runtime.enter();
            let _ = done.send(start());
        });
        {
            let mut launcher = LAUNCHER.locked();
            let jobs = match &*launcher {
                Some(jobs) => jobs.clone(),
                None => {
                    let jobs = start_launcher()?;
                    *launcher = Some(jobs.clone());
                    jobs
                }
            };
            if jobs.send(job).is_err() {
                // Made again for the next start.
                *launcher = None;
                return Err(io::Error::other("the launcher thread has ended"));
            }
        }
        result
            .await
            .unwrap_or_else(|_| Err(io::Error::other("the module's start panicked")))
    }
}

/// Starts the launcher thread; the queue it takes starts from.
fn start_launcher() -> io::Result<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("dashd-launcher".into())
        .spawn(move || {
            // It forks the modules, which inherit its scheduling.
            crate::sched::default_slice();
            for job in queue {
                // A start that panics fails its own caller only.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start the launcher thread: {e}")))?;
    Ok(jobs)
}

impl Incarnation for Spawned {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn peer(&self) -> Option<PeerCheck> {
        Some(PeerCheck::group_of(self.pid()))
    }

    fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>> + Send + '_ {
        // Cancel-safe, as tokio documents it.
        self.child.wait()
    }

    async fn stop(&mut self, exited: Option<ExitStatus>, grace: Duration) -> Option<ExitStatus> {
        let pid = self.pid;
        let mut exited = exited;
        // What the module started outside its group is found now, while
        // its parents still live, and asked to stop along with the group.
        before_stop(pid).await;
        let exit = std::pin::pin!(self.child.wait());
        stop_child(pid, exit, &mut exited, grace).await
    }

    async fn clean_up(self) {
        // Then nothing of it may linger: setsid() children that ignore
        // SIGTERM, double-forked daemons, what a forked module started.
        after_stop(self.pid, self.cgroup).await;
    }

    async fn usage(&self) -> Option<Usage> {
        let pid = self.pid;
        tokio::task::spawn_blocking(move || usage::sample(pid))
            .await
            .ok()
            .flatten()
    }

    async fn killed_at_budget(&self) -> bool {
        let Some(dir) = self.cgroup.as_ref().map(|c| c.dir().to_path_buf()) else {
            return false;
        };
        tokio::task::spawn_blocking(move || cgroup::oom_kills(&dir) > 0)
            .await
            .unwrap_or(false)
    }
}

/// A started incarnation.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// Its pid, kept for after the process is reaped.
    pub(crate) pid: u32,
    /// Its process.
    pub(crate) child: Child,
    /// Its cgroup, when cgroups are in use.
    pub(crate) cgroup: Option<IncarnationCgroup>,
}

/// Starts one incarnation of `spec`. Its stdout and stderr are appended to
/// `<logs>/dashboard_<name>.out` and `.err` (through pipes, rotated by
/// size); one that cannot be opened (a link, say) is refused with a warning
/// and that output discarded.
pub(crate) fn spawn_module(
    spec: &ModuleSpec,
    session: &Session,
    socket: &Path,
    incarnation: u32,
) -> io::Result<Spawned> {
    // Any local user can put a link (or a FIFO, or a file they own and the
    // host cannot open) where a module's log goes, since Ray makes `logs/`
    // writable by all. That must not keep the module from starting, so the
    // module runs without that log. Not onto the host's stderr: its lines
    // would go around the host's bounded log writer (a stalled stderr would
    // then stall the module, and its health checks) and mix unlabelled with
    // the host's own.
    // Written through a pipe, so that the host can rotate the file under
    // the module (see `RotatingFile`).
    let append = |ext: &str| match session
        .log_file(&log_name(&spec.name, ext))
        .and_then(RotatingFile::piped)
    {
        Ok(pipe) => Stdio::from(pipe),
        Err(error) => {
            tracing::warn!(
                module = %spec.name,
                incarnation,
                %error,
                "module log file refused; this output of the module is discarded"
            );
            Stdio::null()
        }
    };
    let cgroup = containment().cgroup_for(&spec.name, incarnation);
    if let (Some(cgroup), Some(budget)) = (&cgroup, spec.supervision.memory_budget) {
        // Where the kernel can hold the module to its budget, it does; the
        // task's watch of its resident memory is there either way.
        if let Err(error) = cgroup.limit_memory(budget) {
            tracing::debug!(module = %spec.name, incarnation, %error, "no memory.max for the module's cgroup; its memory is watched");
        }
    }
    let mut cmd = Command::new(spec.program());
    cmd.args(&spec.args)
        .envs(&spec.env)
        .env(SOCKET_VAR, socket)
        .env(SESSION_DIR_VAR, &session.dir)
        .env(LOG_DIR_VAR, &session.logs)
        .env(MODULE_VAR, &spec.name)
        .env(INCARNATION_VAR, incarnation.to_string())
        .stdin(Stdio::null())
        .stdout(append("out"))
        .stderr(append("err"))
        .kill_on_drop(true);
    let containment = containment();
    if let Some(cgroup) = &cgroup {
        // A Python module forked by the zygote moves itself there before
        // it runs.
        cmd.env(CGROUP_VAR, cgroup.dir());
    }
    prepare_child(
        &mut cmd,
        cgroup.as_ref().map(IncarnationCgroup::procs_fd),
        descriptors::limit_for_modules(),
        module_priority(spec.supervision.nice),
    );
    let child =
        match containment
            .descendants
            .spawn(&spec.name, incarnation, || cmd.spawn(), Child::id)
        {
            Ok(child) => child,
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    cgroup.kill_and_remove();
                }
                return Err(e);
            }
        };
    if let (Some(cgroup), Some(pid)) = (&cgroup, child.id()) {
        if !cgroup.holds(pid) {
            warn!(
                module = %spec.name,
                incarnation,
                pid,
                cgroup = %cgroup.dir().display(),
                "module did not join its cgroup; what it leaves behind is found through /proc only"
            );
        }
    }
    let pid = child
        .id()
        .expect("UNWRAP: a child not yet awaited has a pid");
    Ok(Spawned { pid, child, cgroup })
}

/// Between fork and exec: moves the child into its cgroup (the descriptor
/// of the cgroup's `cgroup.procs`), gives it back the open-file limit the
/// host started with; then, as every child the host owns, puts it in a
/// process group of its own, so that stopping it reaches the processes it
/// starts, and makes the kernel SIGKILL it when the host dies, even by
/// SIGKILL.
#[allow(unsafe_code)]
fn prepare_child(
    cmd: &mut Command,
    cgroup_procs: Option<RawFd>,
    nofile: Option<Rlimit>,
    priority: Option<i32>,
) {
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe system calls (write, setrlimit, setpriority,
    // getpriority, sched_setattr); it allocates
    // nothing and takes no lock. The descriptor stays open in the parent
    // until the spawn has returned.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = cgroup_procs {
                // "0" is the writer itself. A failure leaves the module
                // outside its cgroup, which the parent sees and reports:
                // the module still starts.
                let _ = rustix::io::write(BorrowedFd::borrow_raw(fd), b"0");
            }
            if let Some(limit) = nofile {
                descriptors::restore(limit)?;
            }
            if let Some(priority) = priority {
                // Raising one's nice value needs no privilege; a failure
                // leaves the module at the host's.
                let _ = rustix::process::setpriority_process(None, priority);
            }
            // Whichever thread forked it, the default time slice (after
            // the nice value, which it keeps).
            crate::sched::default_slice();
            Ok(())
        });
    }
    ray_dashd_contract::child::own_child(cmd.as_std_mut());
}

/// The nice value for a module `nice` nicer than the host (at most 19);
/// `None` when that is the host's own.
fn module_priority(nice: i32) -> Option<i32> {
    if nice == 0 {
        return None;
    }
    let host = rustix::process::getpriority_process(None).unwrap_or(0);
    Some(host.saturating_add(nice).min(19))
}

/// `dashboard_<name>.<ext>`: a module's log file in `<session>/logs`.
pub(crate) fn log_name(name: &str, ext: &str) -> String {
    format!("dashboard_{name}.{ext}")
}

/// Sends `signal` to the process group led by `pid`; a group that is gone
/// already is not an error.
pub(crate) fn signal_group(pid: u32, signal: Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pid, %signal, error = %e, "cannot signal module process group"),
    }
}

/// Stops an incarnation: SIGTERM to its group, SIGKILL after `grace`, then
/// SIGKILL to whatever is left of the group. Returns how it ended.
pub(crate) async fn stop_child(
    pid: u32,
    exit: std::pin::Pin<&mut impl std::future::Future<Output = io::Result<ExitStatus>>>,
    exited: &mut Option<ExitStatus>,
    grace: Duration,
) -> Option<ExitStatus> {
    if exited.is_none() {
        signal_group(pid, Signal::SIGTERM);
        // A stopped (SIGSTOP) process cannot act on SIGTERM until continued.
        signal_group(pid, Signal::SIGCONT);
        let mut exit = exit;
        match tokio::time::timeout(grace, exit.as_mut()).await {
            Ok(status) => *exited = status.ok(),
            Err(_) => {
                tracing::warn!(
                    pid,
                    grace_ms = grace.as_millis() as u64,
                    "module ignored SIGTERM, sending SIGKILL"
                );
                signal_group(pid, Signal::SIGKILL);
                *exited = exit.await.ok();
            }
        }
    }
    // The leader is gone; its children in the group must not linger.
    signal_group(pid, Signal::SIGKILL);
    *exited
}

/// The last `lines` lines of a log file in `logs`, for the failure report;
/// empty when there are none. Opened as it is written, never through a
/// link: the lines are quoted in the host's log, which other users may read.
pub(crate) fn tail(logs: &LogDir, name: &str, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = logs.read(name) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .is_err()
    {
        return String::new();
    }
    let mut buf = Vec::with_capacity(TAIL_BYTES as usize);
    if file.take(TAIL_BYTES).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
