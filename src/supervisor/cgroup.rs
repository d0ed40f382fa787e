//! cgroup v2 containment, where the host may make cgroups: every module
//! incarnation runs in a cgroup of its own, `<host's cgroup>/ray-dashd-<pid>/
//! <module>-<incarnation>`, which is killed whole (`cgroup.kill`) when the
//! incarnation ends, whatever session, group or parent its processes moved
//! to. A small process, the warden, kills `ray-dashd-<pid>` when the host
//! dies without doing so itself (SIGKILL, a crash).
//!
//! Usable when cgroup v2 is mounted, the host's own cgroup is writable to
//! it (root, or a subtree delegated to its user: systemd's `Delegate=yes`)
//! and the kernel has `cgroup.kill` (Linux 5.14). Otherwise the host says
//! why at start and relies on [`super::descendants`] alone.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ray_dashd_contract::LockExt;
use tracing::{debug, warn};

/// The hidden flag that runs `ray-dashd` as the warden.
pub const WARDEN_FLAG: &str = "--cgroup-warden";

/// Between two looks at whether a killed cgroup is empty.
const EMPTY_POLL: Duration = Duration::from_millis(5);
/// How long a killed cgroup may take to empty: SIGKILL is immediate, but a
/// process in uninterruptible sleep (a hung NFS read) dies when it wakes.
const EMPTY_WITHIN: Duration = Duration::from_secs(2);

/// Why the host cannot put its modules in cgroups here.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unusable {
    /// A `/proc` file that names the host's cgroup could not be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// `/proc/self/mountinfo` or `/proc/self/cgroup`.
        file: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// No cgroup2 file system is mounted.
    #[error("cgroup v2 is not mounted")]
    NotMounted,
    /// The host is in cgroup v1 hierarchies only.
    #[error("not in a cgroup v2 (only v1 hierarchies in /proc/self/cgroup)")]
    NotInV2,
    /// The host's cgroup is outside the part of the hierarchy mounted.
    #[error("cgroup {own} is not under the cgroup2 mount at {mount}")]
    OutsideMount {
        /// The cgroup, as `/proc/self/cgroup` names it.
        own: String,
        /// Where cgroup2 is mounted.
        mount: String,
    },
    /// The host may not move processes between cgroups below its own.
    #[error("{}/cgroup.procs is not writable: {source}", own.display())]
    NotWritable {
        /// The host's cgroup folder.
        own: PathBuf,
        /// The cause.
        #[source]
        source: rustix::io::Errno,
    },
    /// The host's module cgroup could not be made.
    #[error("cannot make {}: {source}", dir.display())]
    Create {
        /// `<host's cgroup>/ray-dashd-<pid>`.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The kernel cannot kill a cgroup whole.
    #[error("the kernel has no cgroup.kill (Linux 5.14 or later)")]
    NoKill,
}

/// The host's cgroup for its modules, and the warden watching over it.
#[derive(Debug)]
pub(crate) struct Cgroups {
    /// `<host's cgroup>/ray-dashd-<pid>`.
    base: PathBuf,
    /// The warden's stdin: the warden acts when it reads end-of-file, that
    /// is when the host closes this or dies.
    lifeline: Mutex<Option<ChildStdin>>,
    /// The warden's pid, never reaped as an adopted orphan.
    warden: Option<u32>,
}

impl Cgroups {
    /// Makes the host's module cgroup and starts its warden, or says why
    /// cgroups cannot be used here.
    pub(crate) fn set_up() -> Result<Cgroups, Unusable> {
        let own = own_cgroup()?;
        // Moving a process between two cgroups takes write access to the
        // `cgroup.procs` of their common ancestor: the host's own.
        rustix::fs::access(own.join("cgroup.procs"), rustix::fs::Access::WRITE_OK).map_err(
            |source| Unusable::NotWritable {
                own: own.clone(),
                source,
            },
        )?;
        let base = own.join(format!("ray-dashd-{}", std::process::id()));
        match fs::create_dir(&base) {
            Ok(()) => {}
            // A host with this pid died before it could clean up, and so
            // did its warden: what is left in there is orphaned.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                warn!(cgroup = %base.display(), "removing the cgroup a previous ray-dashd left");
                kill_and_remove(&base, true);
                fs::create_dir(&base).map_err(|source| Unusable::Create {
                    dir: base.clone(),
                    source,
                })?;
            }
            Err(source) => return Err(Unusable::Create { dir: base, source }),
        }
        if !base.join("cgroup.kill").exists() {
            let _ = fs::remove_dir(&base);
            return Err(Unusable::NoKill);
        }
        // For modules' memory budgets (`memory.max`): possible only where
        // the host's own cgroup hands the memory controller down to this
        // one; without it the budgets are held by a watch of resident
        // memory.
        if let Err(e) = fs::write(base.join("cgroup.subtree_control"), b"+memory") {
            debug!(error = %e, "no memory controller for the modules' cgroups; memory budgets are watched, not set in the kernel");
        }
        let (warden, lifeline) = match start_warden(&base) {
            Ok(mut child) => {
                let stdin = child.stdin.take();
                (Some(child), stdin)
            }
            Err(e) => {
                warn!(error = %e, "cannot start the cgroup warden; modules in other sessions will outlive a SIGKILL of ray-dashd");
                (None, None)
            }
        };
        Ok(Cgroups {
            base,
            lifeline: Mutex::new(lifeline),
            warden: warden.as_ref().map(Child::id),
        })
    }

    /// The folder of the host's module cgroup.
    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// The warden's pid, if it runs.
    pub(crate) fn warden(&self) -> Option<u32> {
        self.warden
    }

    /// Makes the cgroup of incarnation `incarnation` of module `module`.
    pub(crate) fn create(&self, module: &str, incarnation: u32) -> io::Result<IncarnationCgroup> {
        // Module names are [A-Za-z0-9_-]+ and the number has no dash, so
        // the name is unique and never one of the interface files (those
        // all have a dot).
        let dir = self.base.join(format!("{module}-{incarnation}"));
        match fs::create_dir(&dir) {
            Ok(()) => {}
            // Left by an incarnation whose processes would not die.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => kill_and_remove(&dir, true),
            Err(e) => return Err(e),
        }
        if !dir.exists() {
            fs::create_dir(&dir)?;
        }
        let procs = OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.procs"))
            .inspect_err(|_| {
                let _ = fs::remove_dir(&dir);
            })?;
        Ok(IncarnationCgroup {
            dir,
            procs: procs.into(),
        })
    }

    /// Kills whatever is left in the host's module cgroups and removes
    /// them; then lets the warden go.
    pub(crate) fn remove_all(&self) {
        kill_and_remove(&self.base, false);
        let lifeline = self.lifeline.locked().take();
        drop(lifeline);
    }
}

/// One incarnation's cgroup.
#[derive(Debug)]
pub(crate) struct IncarnationCgroup {
    dir: PathBuf,
    /// Its `cgroup.procs`, open for writing: the new process writes `0`
    /// there between fork and exec, and so is inside before the module's
    /// code runs.
    procs: OwnedFd,
}

impl IncarnationCgroup {
    /// Its folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The descriptor a child writes `0` to, to move itself in.
    pub(crate) fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Whether process `pid` is in it (`/proc/<pid>/cgroup` names it).
    pub(crate) fn holds(&self, pid: u32) -> bool {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        let Some(name) = self.dir.file_name() else {
            return false;
        };
        let Some(parent) = self.dir.parent().and_then(Path::file_name) else {
            return false;
        };
        text.lines()
            .filter_map(|line| line.strip_prefix("0::"))
            .any(|path| {
                let mut parts = Path::new(path).iter().rev();
                parts.next() == Some(name) && parts.next() == Some(parent)
            })
    }

    /// Caps the memory of its processes at `bytes` (`memory.max`): past it
    /// the kernel reclaims, then kills one of them. An error when the
    /// memory controller is not enabled for it (no `memory.max`).
    /// Blocking: one file write.
    pub(crate) fn limit_memory(&self, bytes: u64) -> io::Result<()> {
        fs::write(self.dir.join("memory.max"), bytes.to_string())?;
        // The kernel's OOM kill takes the whole module, not one helper of
        // it while the rest runs on.
        fs::write(self.dir.join("memory.oom.group"), b"1")
    }

    /// Kills every process in it, waits (within [`EMPTY_WITHIN`]) until it
    /// is empty, and removes it. Blocking: a few file writes and reads.
    pub(crate) fn kill_and_remove(self) {
        kill_and_remove(&self.dir, false);
    }
}

/// How many times the kernel killed a process of cgroup `dir` for going
/// over its `memory.max` (`oom_kill` in `memory.events`); 0 without the
/// memory controller. Blocking: one file read.
pub(crate) fn oom_kills(dir: &Path) -> u64 {
    fs::read_to_string(dir.join("memory.events"))
        .ok()
        .and_then(|events| {
            events
                .lines()
                .find_map(|line| line.strip_prefix("oom_kill "))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Kills everything in cgroup `dir` (and the cgroups under it), waits until
/// it is empty, and removes it and the cgroups under it. Failures are
/// logged (`quiet`: at debug level).
fn kill_and_remove(dir: &Path, quiet: bool) {
    crate::fault::fault_point!("cgroup-remove");
    if let Err(e) = fs::write(dir.join("cgroup.kill"), b"1") {
        if e.kind() == io::ErrorKind::NotFound {
            return;
        }
        if quiet {
            debug!(cgroup = %dir.display(), error = %e, "cannot kill cgroup");
        } else {
            warn!(cgroup = %dir.display(), error = %e, "cannot kill cgroup");
        }
    }
    let deadline = Instant::now() + EMPTY_WITHIN;
    while populated(dir) && Instant::now() < deadline {
        std::thread::sleep(EMPTY_POLL);
    }
    if let Err(e) = remove_tree(dir) {
        if quiet {
            debug!(cgroup = %dir.display(), error = %e, "cannot remove cgroup");
        } else {
            warn!(cgroup = %dir.display(), error = %e, "cannot remove cgroup; a process in it would not die");
        }
    }
}

/// Whether cgroup `dir` or one under it still holds a process.
fn populated(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.events"))
        .map(|events| events.lines().any(|line| line == "populated 1"))
        .unwrap_or(false)
}

/// Removes cgroup `dir` and the (empty) cgroups under it, deepest first.
fn remove_tree(dir: &Path) -> io::Result<()> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&entry.path())?;
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match fs::remove_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The folder of the host's own cgroup v2.
fn own_cgroup() -> Result<PathBuf, Unusable> {
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").map_err(|source| Unusable::Read {
            file: "/proc/self/mountinfo",
            source,
        })?;
    let (root, mount) = cgroup2_mount(&mountinfo).ok_or(Unusable::NotMounted)?;
    let cgroups = fs::read_to_string("/proc/self/cgroup").map_err(|source| Unusable::Read {
        file: "/proc/self/cgroup",
        source,
    })?;
    let own = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or(Unusable::NotInV2)?;
    cgroup_dir(&root, &mount, own).ok_or_else(|| Unusable::OutsideMount {
        own: own.to_owned(),
        mount,
    })
}

/// The root and mount point of the first cgroup2 mount in `mountinfo`
/// (proc(5): `id parent dev root mountpoint options [tags] - fstype ...`).
fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace().skip(3);
        let root = unescape(fields.next()?);
        let mount = unescape(fields.next()?);
        Some((root, mount))
    })
}

/// The folder of cgroup `own` (as `/proc/self/cgroup` names it) in a
/// cgroup2 mount of the hierarchy's `root` at `mount`.
fn cgroup_dir(root: &str, mount: &str, own: &str) -> Option<PathBuf> {
    // `own` is relative to the cgroup namespace's root, as `root` is; a
    // cgroup outside the mounted part (" (deleted)", or above `root`)
    // cannot be reached.
    let rest = own.strip_prefix(root.trim_end_matches('/'))?;
    if !(rest.is_empty() || rest.starts_with('/')) || rest.contains("..") {
        return None;
    }
    Some(Path::new(mount).join(rest.trim_start_matches('/')))
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let octal = |b: &u8| (b'0'..=b'7').contains(b);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i + 1..i + 4) {
            Some(digits) if bytes[i] == b'\\' && digits.iter().all(octal) => {
                let code = digits
                    .iter()
                    .fold(0u32, |code, d| code * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(code).unwrap_or(b'?'));
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Starts the warden for `base`: this same executable, with
/// [`WARDEN_FLAG`], in a process group of its own (a signal to the host's
/// group leaves it alone), reading a pipe that only the host writes. The
/// faults set for the host (`FAILPOINTS`, see `fault`) are the host's: a
/// warden that kept one would carry it past the host's end.
fn start_warden(base: &Path) -> io::Result<Child> {
    Command::new("/proc/self/exe")
        .arg(WARDEN_FLAG)
        .arg(base)
        .env_remove("FAILPOINTS")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
}

/// The warden: waits for end-of-file on stdin (the host exited or died),
/// then kills whatever is left in `base` and removes it. Stop signals are
/// blocked: it must outlive the host, and ends by itself right after it.
pub fn run_warden(base: &Path) -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    let mut stop = SigSet::empty();
    for signal in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        stop.add(signal);
    }
    let _ = stop.thread_block();
    // Started as /proc/self/exe, it would show in `ps` as "exe".
    let _ = nix::sys::prctl::set_name(c"dashd-warden");
    // It only waits from here on: the binary's pages it mapped to start
    // (3 MiB) are let go, as the host lets go of its own.
    let _ = crate::file_pages::release();
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if base.exists() {
        kill_and_remove(base, true);
        if base.exists() {
            let _ = writeln!(
                io::stderr(),
                "ray-dashd cgroup warden: cannot remove {}",
                base.display()
            );
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_of_a_hybrid_hierarchy() {
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(("/".to_owned(), "/sys/fs/cgroup/unified".to_owned()))
        );
        assert_eq!(cgroup2_mount("31 23 0:28 / /x rw - tmpfs tmpfs rw\n"), None);
        let spaced = "41 31 0:38 /a\\040b /mnt/c\\040g rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(spaced),
            Some(("/a b".to_owned(), "/mnt/c g".to_owned()))
        );
    }

    #[test]
    fn maps_the_own_cgroup_into_the_mount() {
        let at = |root, mount, own| cgroup_dir(root, mount, own);
        assert_eq!(
            at("/", "/sys/fs/cgroup", "/"),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            at("/", "/sys/fs/cgroup", "/system.slice/ray.service"),
            Some(PathBuf::from("/sys/fs/cgroup/system.slice/ray.service"))
        );
        // A container that mounts only its part of the hierarchy.
        assert_eq!(
            at("/docker/abc", "/sys/fs/cgroup", "/docker/abc/app"),
            Some(PathBuf::from("/sys/fs/cgroup/app"))
        );
        assert_eq!(at("/docker/abc", "/sys/fs/cgroup", "/docker/abcd"), None);
        assert_eq!(at("/docker/abc", "/sys/fs/cgroup", "/other"), None);
        assert_eq!(at("/", "/sys/fs/cgroup", "/a/../b"), None);
    }
}
