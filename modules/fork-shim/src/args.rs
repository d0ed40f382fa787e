//! The shim's command line, and the standalone command it can become.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use ray_dashd_contract::names::{fork_socket_name, SOCKET_VAR};

/// One line of usage, printed after a bad command line.
pub(crate) const USAGE: &str = "usage: ray-dashd fork-shim --zygote NAME [--wait SECS] \
     [--reply-timeout SECS] MODULE -- FALLBACK-COMMAND...";

/// How long to keep trying to reach a zygote that does not listen yet.
const DEFAULT_WAIT: Duration = Duration::from_secs(3);
/// How long a zygote that accepted the request may take to fork (it may
/// still be preloading: about 2 s for Ray on 2 cores); short of ray-dashd's
/// default start-up timeout (30 s), so that a standalone start still fits.
const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// The parsed command line.
#[derive(Debug)]
pub(crate) struct Args {
    /// The zygote's ray-dashd module name: its fork socket is
    /// `<dir of $RAY_DASHD_SOCKET>/dash_<zygote>.fork`.
    pub(crate) zygote: String,
    /// How long to retry connecting while nothing listens.
    pub(crate) wait: Duration,
    /// How long to wait for the zygote's answer once connected.
    pub(crate) reply_timeout: Duration,
    /// The module to ask for (for Ray: the class name).
    pub(crate) module: String,
    /// The standalone command, run in place of the shim when the zygote
    /// cannot fork the module.
    fallback: Vec<CString>,
}

/// A bad command line.
#[derive(Debug)]
pub(crate) struct BadArgs(String);

/// Why the zygote's socket cannot be found: the module's own socket, which
/// it is beside, is not named as the host names it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoSocket {
    /// The host's variable is not set.
    #[error("{var} is not set (the shim is meant to be started by ray-dashd)", var = SOCKET_VAR)]
    Unset,
    /// The variable names no folder.
    #[error("{var} has no folder", var = SOCKET_VAR)]
    NoFolder,
}

impl std::fmt::Display for BadArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Args {
    /// Parses the arguments after the program name.
    pub(crate) fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Args, BadArgs> {
        let mut argv = argv.into_iter();
        let mut zygote = None;
        let mut wait = DEFAULT_WAIT;
        let mut reply_timeout = DEFAULT_REPLY_TIMEOUT;
        let mut module = None;
        loop {
            let Some(arg) = argv.next() else {
                return Err(BadArgs("missing `-- FALLBACK-COMMAND...`".into()));
            };
            let arg = arg
                .into_string()
                .map_err(|a| BadArgs(format!("argument {a:?} is not UTF-8")))?;
            match arg.as_str() {
                "--" => break,
                "--zygote" => zygote = Some(value(&mut argv, "--zygote")?),
                "--wait" => wait = seconds(&value(&mut argv, "--wait")?, "--wait")?,
                "--reply-timeout" => {
                    reply_timeout =
                        seconds(&value(&mut argv, "--reply-timeout")?, "--reply-timeout")?
                }
                flag if flag.starts_with('-') => {
                    return Err(BadArgs(format!("unknown flag {flag}")))
                }
                _ if module.is_some() => return Err(BadArgs(format!("unexpected argument {arg}"))),
                _ => module = Some(arg),
            }
        }
        let zygote = zygote.ok_or_else(|| BadArgs("--zygote NAME is required".into()))?;
        if zygote.is_empty() || zygote.contains('/') {
            return Err(BadArgs(format!("--zygote {zygote:?} is not a module name")));
        }
        let module = module.ok_or_else(|| BadArgs("MODULE is required".into()))?;
        let fallback = argv
            .map(|a| CString::new(a.into_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| BadArgs("the fallback command contains a NUL byte".into()))?;
        if fallback.is_empty() {
            return Err(BadArgs("the fallback command after `--` is empty".into()));
        }
        Ok(Args {
            zygote,
            wait,
            reply_timeout,
            module,
            fallback,
        })
    }

    /// The zygote's fork socket, beside the module's own socket.
    pub(crate) fn zygote_socket(&self) -> Result<PathBuf, NoSocket> {
        let own = std::env::var_os(SOCKET_VAR).ok_or(NoSocket::Unset)?;
        let dir = PathBuf::from(own)
            .parent()
            .map(PathBuf::from)
            .ok_or(NoSocket::NoFolder)?;
        Ok(dir.join(fork_socket_name(&self.zygote)))
    }

    /// The fallback program's name, for messages.
    pub(crate) fn fallback_program(&self) -> &CString {
        &self.fallback[0]
    }

    /// Replaces this process with the fallback command; returns only on failure.
    pub(crate) fn exec_fallback(&self) -> nix::errno::Errno {
        match nix::unistd::execvp(&self.fallback[0], &self.fallback) {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }
}

fn value(argv: &mut impl Iterator<Item = OsString>, flag: &str) -> Result<String, BadArgs> {
    argv.next()
        .and_then(|v| v.into_string().ok())
        .ok_or_else(|| BadArgs(format!("{flag} needs a value")))
}

fn seconds(text: &str, flag: &str) -> Result<Duration, BadArgs> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| BadArgs(format!("{flag} {text:?}: expected seconds")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, BadArgs> {
        Args::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_module_flags_and_fallback() {
        let a = parse(&[
            "--zygote",
            "RayZygote",
            "--wait",
            "0.5",
            "JobHead",
            "--",
            "python",
            "launcher.py",
            "JobHead",
        ])
        .expect("valid");
        assert_eq!(a.zygote, "RayZygote");
        assert_eq!(a.wait, Duration::from_millis(500));
        assert_eq!(a.reply_timeout, DEFAULT_REPLY_TIMEOUT);
        assert_eq!(a.module, "JobHead");
        assert_eq!(a.fallback.len(), 3);
        assert_eq!(a.fallback_program().to_str(), Ok("python"));
    }

    #[test]
    fn refuses_incomplete_command_lines() {
        for bad in [
            &["JobHead", "--", "python"][..],
            &["--zygote", "Z", "--", "python"],
            &["--zygote", "Z", "JobHead"],
            &["--zygote", "Z", "JobHead", "--"],
            &["--zygote", "a/b", "JobHead", "--", "python"],
            &["--zygote", "Z", "--wait", "-1", "JobHead", "--", "python"],
            &["--zygote", "Z", "--bogus", "JobHead", "--", "python"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
