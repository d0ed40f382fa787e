//! Why Ray's modules cannot be hosted with the Python named or found, one
//! case per way it fails, and the fix each case has: the host says both in
//! one line (in its log, and in `/api/dashd/status`).

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use super::python;

/// Why Ray's modules cannot be hosted with the Python named or found.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotHosted {
    /// A helper the Python ran (`head_facts.py`, `routes.py`) failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The thread that ran `head_facts.py` panicked.
    #[error("head_facts.py runner panicked")]
    FactsRunnerPanicked,
    /// `head_facts.py` printed something else than its facts.
    #[error("head_facts.py printed no facts: {0}")]
    NoFacts(#[source] serde_json::Error),
    /// Ray's Kubernetes authentication mode is on.
    #[error(
        "Ray's Kubernetes token authentication (RAY_AUTH_MODE=k8s) is not supported by ray-dashd"
    )]
    K8sAuthMode,
    /// Ray's token mode is on with Kubernetes tokens.
    #[error("Ray's Kubernetes token authentication (RAY_ENABLE_K8S_TOKEN_AUTH) is not supported by ray-dashd")]
    K8sTokenAuth,
    /// Ray's token mode is on, and Ray found no token.
    #[error("RAY_AUTH_MODE=token, but Ray found no token")]
    NoToken,
    /// Ray named an authentication mode the host does not know.
    #[error("unknown Ray authentication mode {0:?}")]
    UnknownAuthMode(String),
    /// The zygote's report of an earlier start could not be removed.
    #[error("cannot remove {}: {source}", path.display())]
    RemoveReport {
        /// The report.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The zygote's report could not be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadReport {
        /// The report.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The zygote could not be started.
    #[error("cannot start {python}: {source}")]
    StartZygote {
        /// The Python.
        python: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The zygote exited before it reported Ray's modules.
    #[error(
        "Ray's zygote ({command}) exited ({status}) before reporting Ray's modules: {last_line} \
         (the whole error is in {})",
        log.display()
    )]
    ZygoteExited {
        /// Its command line.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// The last line of its stderr: the exception, for a traceback.
        last_line: String,
        /// What that line says of a failed import.
        missing: Option<MissingImport>,
        /// Its stderr log.
        log: PathBuf,
    },
    /// The zygote reported nothing in time.
    #[error("Ray's zygote did not report Ray's modules within {within:?}")]
    ZygoteSilent {
        /// The time it had.
        within: Duration,
    },
}

impl NotHosted {
    /// How to fix it, to append to its line: when the Python does not
    /// run, or lacks Ray, name another; when it lacks one of Ray's
    /// dependencies, install `ray[default]` into it or name another; else
    /// nothing (Ray's own words say what differs).
    pub(super) fn fix(&self) -> String {
        let missing = match self {
            NotHosted::Run(RunError::Spawn { .. }) | NotHosted::StartZygote { .. } => {
                Some(MissingImport::Ray)
            }
            NotHosted::Run(RunError::Failed { missing, .. })
            | NotHosted::ZygoteExited { missing, .. } => *missing,
            _ => None,
        };
        match missing {
            Some(MissingImport::Ray) => format!("; to fix: {}", python::NAME_IT),
            Some(MissingImport::Other) => format!(
                "; to fix: install ray[default] into it (pip install 'ray[default]'), or {}",
                python::NAME_IT
            ),
            None => String::new(),
        }
    }
}

/// How a helper run with the Python failed (see `run`).
#[derive(Debug, thiserror::Error)]
pub(super) enum RunError {
    /// It could not be started.
    #[error("cannot run {command}: {source}")]
    Spawn {
        /// The program and its arguments (paths by their file names).
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It did not finish in time, and was killed.
    #[error("{command} did not finish within {within:?}")]
    TimedOut {
        /// The program and its arguments.
        command: String,
        /// The time it had.
        within: Duration,
    },
    /// Waiting for it failed.
    #[error("{command}: {source}")]
    Wait {
        /// The program and its arguments.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It exited with a failure.
    #[error("{command} failed ({status}): {last_line}")]
    Failed {
        /// The program and its arguments.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// The last line of its stderr: the exception, for a traceback.
        last_line: String,
        /// What that line says of a failed import.
        missing: Option<MissingImport>,
    },
}

/// An import that a Python failed on: the failures that another Python,
/// or Ray installed into this one, fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MissingImport {
    /// `ray` itself: this Python has no Ray.
    Ray,
    /// Something else (one of `ray[default]`'s dependencies, say).
    Other,
}

impl MissingImport {
    /// What `line`, the last line of a Python's stderr, says: a traceback
    /// ends with `<exception class>: <message>`, and a failed import raises
    /// `ModuleNotFoundError` (whose message for a top-level package is
    /// `No module named '<name>'`) or `ImportError`.
    pub(super) fn from_traceback(line: &str) -> Option<MissingImport> {
        let (class, message) = line.split_once(": ").unwrap_or((line, ""));
        let class = class.rsplit('.').next().unwrap_or(class);
        match class {
            "ModuleNotFoundError" if message.trim() == "No module named 'ray'" => {
                Some(MissingImport::Ray)
            }
            "ModuleNotFoundError" | "ImportError" => Some(MissingImport::Other),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Python without Ray, or that cannot run, is to be replaced; one
    /// without a dependency of Ray's gets it installed; Ray's own words
    /// need no fix.
    #[test]
    fn the_fix_follows_what_failed() {
        let failed = |last_line: &str| {
            NotHosted::Run(RunError::Failed {
                command: "python3 routes.py".to_owned(),
                status: std::os::unix::process::ExitStatusExt::from_raw(1 << 8),
                last_line: last_line.to_owned(),
                missing: MissingImport::from_traceback(last_line),
            })
        };
        assert!(failed("ModuleNotFoundError: No module named 'ray'")
            .fix()
            .contains("--ray-python"));
        let cannot_run = NotHosted::Run(RunError::Spawn {
            command: "/no/python head_facts.py".to_owned(),
            source: std::io::ErrorKind::NotFound.into(),
        });
        assert!(cannot_run.fix().contains("--ray-python"));
        let dependency = failed("ModuleNotFoundError: No module named 'aiohttp'").fix();
        assert!(
            dependency.contains("pip install 'ray[default]'"),
            "{dependency}"
        );
        assert!(
            failed("ImportError: cannot import name 'x' from 'ray._private'")
                .fix()
                .contains("pip install 'ray[default]'")
        );
        assert_eq!(failed("ray 2.44.0 is older than 2.45.0").fix(), "");
        assert_eq!(NotHosted::NoToken.fix(), "");
    }

    #[test]
    fn a_traceback_names_the_import_that_failed() {
        for (line, missing) in [
            (
                "ModuleNotFoundError: No module named 'ray'",
                Some(MissingImport::Ray),
            ),
            (
                "ModuleNotFoundError: No module named 'ray.dashboard'",
                Some(MissingImport::Other),
            ),
            (
                "ImportError: cannot import name 'x'",
                Some(MissingImport::Other),
            ),
            ("RuntimeError: ray 2.61 differs", None),
            ("(no output)", None),
        ] {
            assert_eq!(MissingImport::from_traceback(line), missing, "{line}");
        }
    }
}
