//! Which Python runs Ray's modules: the one named (`--ray-python`,
//! `RAY_DASHD_RAY_PYTHON`, `[ray] python`, in that order), else the first
//! of [`SEARCH`] that can import Ray: the Python the Ray head's own
//! processes run, the wheel's (the environment ray-dashd was installed
//! into), `python3` on `PATH`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ray_dashd_contract::proc;

use crate::config::ray_settings::{PythonSource, RayPython};

/// Where a Python is looked for when none is named, in this order; the
/// first candidate that can import Ray is taken.
///
/// The head's first: it runs the very Ray whose GCS the modules talk to,
/// even when ray-dashd was installed into another environment.
const SEARCH: &[Search] = &[Search::Head, Search::Wheel, Search::Path];

/// One place to look for a Python.
#[derive(Debug, Clone, Copy)]
enum Search {
    /// The interpreters of the head's own Python processes, the dashboard
    /// agent's first: the Python that `ray start` ran, so the one with
    /// this very Ray.
    Head,
    /// The wheel's own Python ([`crate::wheel::wheel_python`]).
    Wheel,
    /// `python3` on `PATH`.
    Path,
}

/// How long asking a candidate whether it has Ray may take: it only looks
/// the package up (no import), which takes some 30 ms.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// A candidate that was passed over, and why.
#[derive(Debug)]
pub struct Tried {
    /// The program.
    pub program: String,
    /// Where it came from.
    pub source: PythonSource,
    /// Why it was passed over.
    pub why: Unfit,
}

/// Why a candidate Python cannot run Ray's modules.
#[derive(Debug, thiserror::Error)]
pub enum Unfit {
    /// It could not be started.
    #[error("cannot run it: {0}")]
    CannotRun(#[source] std::io::Error),
    /// It runs, and finds no `ray` package.
    #[error("no ray")]
    NoRay,
    /// It failed otherwise.
    #[error("it failed ({0})")]
    Failed(ExitStatus),
    /// It did not answer within [`PROBE_TIMEOUT`].
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    /// Waiting for it failed.
    #[error("cannot wait for it: {0}")]
    Wait(#[source] std::io::Error),
}

/// The first Python of [`SEARCH`] that can import Ray, for the head whose
/// session folder is `session`; or every candidate tried, and why each was
/// passed over.
pub fn find(session: &Path) -> Result<RayPython, Vec<Tried>> {
    let mut tried: Vec<Tried> = Vec::new();
    for search in SEARCH {
        let candidates = match search {
            Search::Head => head_pythons(session),
            Search::Wheel => crate::wheel::wheel_python()
                .map(|p| RayPython {
                    program: p.to_string_lossy().into_owned(),
                    source: PythonSource::Wheel,
                })
                .into_iter()
                .collect(),
            Search::Path => vec![RayPython {
                program: "python3".to_owned(),
                source: PythonSource::Path,
            }],
        };
        for candidate in candidates {
            // One process's Python is often another's: ask each once.
            if tried.iter().any(|t| t.program == candidate.program) {
                continue;
            }
            match has_ray(&candidate.program) {
                Ok(()) => return Ok(candidate),
                Err(why) => tried.push(Tried {
                    program: candidate.program,
                    source: candidate.source,
                    why,
                }),
            }
        }
    }
    Err(tried)
}

/// The words for [`find`] finding nothing: what was tried, and the fix.
pub fn not_found(tried: &[Tried]) -> String {
    let list = tried
        .iter()
        .map(|t| format!("{} ({}: {})", t.program, t.source, t.why))
        .collect::<Vec<_>>()
        .join(", ");
    let head = if tried
        .iter()
        .any(|t| matches!(t.source, PythonSource::Head(_)))
    {
        ""
    } else {
        " (no Python process of this head runs as this user)"
    };
    format!("no Python with Ray found{head}: tried {list}; {NAME_IT}")
}

/// How to name the Python with Ray.
pub const NAME_IT: &str = "name the Python that has ray[default] with --ray-python, \
     RAY_DASHD_RAY_PYTHON or [ray] python";

/// Whether `program` runs and finds the `ray` package (without importing
/// it: that takes seconds, and the zygote does it next anyway).
fn has_ray(program: &str) -> Result<(), Unfit> {
    let mut child = Command::new(program)
        .args([
            "-c",
            "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('ray') else 3)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(Unfit::CannotRun)?;
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) if status.code() == Some(3) => return Err(Unfit::NoRay),
            Ok(Some(status)) => return Err(Unfit::Failed(status)),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Unfit::NoAnswer(PROBE_TIMEOUT));
            }
            Err(e) => return Err(Unfit::Wait(e)),
        }
    }
}

/// The Pythons that the head of `session` runs, best first: the dashboard
/// agent's (from the raylet's `--dashboard_agent_command`), then those of
/// the head's Python processes that name the session in their command line
/// (`dashboard.py`, `log_monitor.py`, `monitor.py`), then the workers'. Only
/// this user's processes count: another user's Python is not ours to run.
///
/// Each is the program as the process was started (`argv[0]`), which for a
/// venv is the venv's `bin/python`, the one that sees the venv's packages;
/// `/proc/<pid>/exe` names the interpreter the venv links to, which does
/// not, so it comes last.
fn head_pythons(session: &Path) -> Vec<RayPython> {
    let Ok(real) = std::fs::canonicalize(session) else {
        return Vec::new();
    };
    let real = real.to_string_lossy().into_owned();
    let uid = nix::unistd::geteuid().as_raw();
    let (mut agents, mut scripts, mut workers, mut exes) = (vec![], vec![], vec![], vec![]);
    let Ok(pids) = proc::pids() else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = pids.collect();
    pids.sort_unstable();
    for pid in pids {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if std::fs::metadata(&proc_dir).map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        let Ok(args) = proc::cmdline(pid) else {
            continue;
        };
        if !args.iter().any(|a| names_session(a, &real)) {
            continue;
        }
        for (flag, list, whose) in [
            (
                "--dashboard_agent_command=",
                &mut agents,
                "the dashboard agent's",
            ),
            ("--python_worker_command=", &mut workers, "the workers'"),
        ] {
            let program = args
                .iter()
                .find_map(|a| a.strip_prefix(flag))
                .and_then(|command| command.split_whitespace().next());
            if let Some(program) = program.filter(|p| Path::new(p).is_absolute()) {
                list.push(RayPython {
                    program: program.to_owned(),
                    source: PythonSource::Head(format!(
                        "{whose} Python, from the raylet (pid {pid}) of this session"
                    )),
                });
            }
        }
        let Some(argv0) = args.first() else { continue };
        let is_python = Path::new(argv0)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"));
        if !is_python {
            continue;
        }
        let what = script_of(&args);
        if Path::new(argv0).is_absolute() {
            scripts.push(RayPython {
                program: argv0.clone(),
                source: PythonSource::Head(format!("the Python of the head's {what} (pid {pid})")),
            });
        }
        if let Ok(exe) = std::fs::read_link(proc_dir.join("exe")) {
            exes.push(RayPython {
                program: exe.to_string_lossy().into_owned(),
                source: PythonSource::Head(format!(
                    "the interpreter of the head's {what} (pid {pid}), from /proc/{pid}/exe"
                )),
            });
        }
    }
    agents
        .into_iter()
        .chain(scripts)
        .chain(workers)
        .chain(exes)
        .collect()
}

/// Whether the command-line argument `arg` names the session folder `real`
/// (as `--session-dir=<real>`, `--logs-dir=<real>/logs`, …); another
/// session's folder whose name merely starts the same does not count.
fn names_session(arg: &str, real: &str) -> bool {
    let value = arg.split_once('=').map_or(arg, |(_, v)| v);
    value == real
        || value
            .strip_prefix(real)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The script (`dashboard.py`) or module (`-m ray.util.client.server`) a
/// Python command line runs, for the log line.
fn script_of(args: &[String]) -> String {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "-m" {
            return rest.next().cloned().unwrap_or_else(|| "-m".to_owned());
        }
        if !arg.starts_with('-') {
            return Path::new(arg)
                .file_name()
                .map_or_else(|| arg.clone(), |n| n.to_string_lossy().into_owned());
        }
    }
    "Python process".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_sessions_folder_counts() {
        let real = "/tmp/ray/session_1";
        assert!(names_session("--session-dir=/tmp/ray/session_1", real));
        assert!(names_session("--logs-dir=/tmp/ray/session_1/logs", real));
        assert!(names_session("/tmp/ray/session_1", real));
        assert!(!names_session("--session-dir=/tmp/ray/session_12", real));
        assert!(!names_session("--temp-dir=/tmp/ray", real));
    }

    #[test]
    fn the_script_or_module_is_named() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            script_of(&args(&[
                "python3",
                "-u",
                "/x/ray/dashboard/dashboard.py",
                "--a=b"
            ])),
            "dashboard.py"
        );
        assert_eq!(
            script_of(&args(&["python3", "-m", "ray.util.client.server"])),
            "ray.util.client.server"
        );
        assert_eq!(script_of(&args(&["python3"])), "Python process");
    }

    #[test]
    fn nothing_found_says_what_was_tried_and_the_fix() {
        let tried = [Tried {
            program: "python3".to_owned(),
            source: PythonSource::Path,
            why: Unfit::NoRay,
        }];
        let line = not_found(&tried);
        assert_eq!(
            line,
            format!(
                "no Python with Ray found (no Python process of this head runs as this user): \
                 tried python3 (python3 on PATH: no ray); {NAME_IT}"
            )
        );
        assert!(!line.contains('\n'));
    }
}
