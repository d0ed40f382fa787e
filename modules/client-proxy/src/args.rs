//! Command line of the client proxy module.

use std::num::ParseIntError;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// The Ray Client proxy, as a ray-dashd module: serves `ray://` clients on
/// the client port, each with a Ray client server of its own.
#[derive(Debug, Clone, Parser)]
#[command(name = "ray-dashd-client-proxy", version)]
pub struct Args {
    /// Address to listen on for Ray clients.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on for Ray clients; 0 picks a free one.
    #[arg(long = "ray-client-port", default_value_t = 10001)]
    pub port: u16,
    /// The GCS (`host:port`); default: read from `<temp dir>/ray_current_cluster`
    /// of the session in RAY_DASHD_SESSION_DIR.
    #[arg(long)]
    pub gcs_address: Option<String>,
    /// The runtime env agent (`http://host:port`); default: the head's, from the GCS.
    #[arg(long)]
    pub runtime_env_agent_address: Option<String>,
    /// The Python that has Ray installed.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The command that starts a Ray client server, one argument per use of
    /// the flag; Ray's flags (`--address --host --port --mode ...`) are
    /// appended. Default: `<python> <ray>/_private/workers/setup_worker.py -m
    /// ray.util.client.server`, as Ray starts it.
    #[arg(long = "server-command", allow_hyphen_values = true)]
    pub server_command: Vec<String>,
    /// Ports the servers listen on: FIRST-LAST (taken from the top down,
    /// skipping ports someone holds), or `auto` (also `0`) for a free port
    /// the kernel picks for each server (from its ephemeral range). The
    /// environment variable reaches the proxy ray-dashd hosts.
    #[arg(
        long,
        env = "RAY_DASHD_CLIENT_PROXY_PORT_RANGE",
        default_value = "23000-23999",
        value_parser = parse_port_source
    )]
    pub port_range: PortSource,
    /// Keep one server started ahead of need, so that a client without a
    /// runtime env connects at once.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub warm_spare: bool,
    /// Longest time a new server may take to accept connections.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub server_ready_timeout: Duration,
    /// Longest wait for a client's server, its runtime env included.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    pub server_wait: Duration,
    /// How often the connection of a server's `RayletDriver` calls is
    /// pinged; a server that leaves a ping unanswered for as long (at most
    /// 20 s) is taken as hung and its calls fail.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub server_ping: Duration,
    /// Require a server's listener to be its own: a port on which only
    /// another process's listener is found (once the server had 3 s to
    /// bind) is given up like a shared one. Off: a server that listens
    /// through a process of another group (a relay, a container) is
    /// trusted when nothing of its own shows.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub own_listener: bool,
    /// Where the servers' `ray_client_server_<port>.out/.err` go; default
    /// `<session>/logs`.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

/// Where the servers' ports come from (`--port-range`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSource {
    /// The ports of a range, as Ray's proxier takes them (23000–23999).
    Range(RangeInclusive<u16>),
    /// A free port the kernel picks (a bind of port 0) for each server.
    Auto,
}

impl std::fmt::Display for PortSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortSource::Range(range) => write!(f, "{}-{}", range.start(), range.end()),
            PortSource::Auto => f.write_str("auto"),
        }
    }
}

/// Why a `--port-range` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    /// It is not `FIRST-LAST`.
    #[error("expected FIRST-LAST, as 23000-23999 (or auto)")]
    Shape,
    /// The first port is not a port number.
    #[error("bad first port: {0} (or auto)")]
    First(#[source] ParseIntError),
    /// The last port is not a port number.
    #[error("bad last port: {0} (or auto)")]
    Last(#[source] ParseIntError),
    /// The ports are no range: the first is 0 or after the last.
    #[error("{first}-{last} is not a range of ports (or auto)")]
    NotARange {
        /// The first port.
        first: u16,
        /// The last port.
        last: u16,
    },
}

fn parse_port_source(text: &str) -> Result<PortSource, PortRangeError> {
    match text.trim() {
        "auto" | "0" => Ok(PortSource::Auto),
        range => parse_range(range).map(PortSource::Range),
    }
}

fn parse_range(text: &str) -> Result<RangeInclusive<u16>, PortRangeError> {
    let (first, last) = text.split_once('-').ok_or(PortRangeError::Shape)?;
    let first: u16 = first.trim().parse().map_err(PortRangeError::First)?;
    let last: u16 = last.trim().parse().map_err(PortRangeError::Last)?;
    if first == 0 || first > last {
        return Err(PortRangeError::NotARange { first, last });
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_rays() {
        let args = Args::parse_from(["ray-dashd-client-proxy"]);
        assert_eq!(args.port, 10001);
        assert_eq!(args.port_range, PortSource::Range(23000..=23999));
        assert!(args.warm_spare);
        assert_eq!(args.server_ready_timeout, Duration::from_secs(30));
    }

    #[test]
    fn server_command_takes_hyphenated_words_and_ranges_are_checked() {
        let args = Args::parse_from([
            "x",
            "--server-command",
            "python3",
            "--server-command",
            "-m",
            "--port-range",
            "40000-40009",
            "--warm-spare",
            "false",
        ]);
        assert_eq!(args.server_command, ["python3", "-m"]);
        assert_eq!(args.port_range, PortSource::Range(40000..=40009));
        assert!(!args.warm_spare);
        assert!(parse_range("9-3").is_err());
        assert!(parse_range("0-3").is_err());
        assert!(parse_range("3").is_err());
    }

    #[test]
    fn auto_or_zero_asks_the_kernel_and_prints_back() {
        for word in ["auto", "0"] {
            let args = Args::parse_from(["x", "--port-range", word]);
            assert_eq!(args.port_range, PortSource::Auto);
        }
        assert_eq!(PortSource::Auto.to_string(), "auto");
        assert_eq!(
            parse_port_source("40000-40009").map(|s| s.to_string()),
            Ok("40000-40009".to_owned())
        );
        let bad = parse_port_source("automatic")
            .expect_err("not a source")
            .to_string();
        assert!(bad.contains("or auto"), "{bad}");
    }
}
