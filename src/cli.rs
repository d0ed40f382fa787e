//! The command line. Every flag can also come from a `RAY_DASHD_*` variable;
//! a flag wins over the variable, and both win over the config file.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

use crate::builtin::Builtin;

/// Where Ray keeps the newest session's folder.
pub const DEFAULT_SESSION_DIR: &str = "/tmp/ray/session_latest";

/// ray-dashd: the head-node web process of a Ray cluster. It serves the
/// dashboard on one HTTP port and supervises dashboard modules, child
/// processes that each serve HTTP on a Unix socket in the session folder.
#[derive(Debug, Clone, Parser)]
#[command(name = "ray-dashd", version, about, long_about = None)]
pub struct Cli {
    /// One of the programs this binary carries besides the server (ray-dashd
    /// starts them itself); without one, the server runs.
    #[command(subcommand)]
    pub builtin: Option<Builtin>,

    /// The Ray session folder; created (with sockets/ and logs/) when missing.
    /// [default: /tmp/ray/session_latest]
    #[arg(long, env = "RAY_DASHD_SESSION_DIR", value_name = "DIR")]
    pub session_dir: Option<PathBuf>,

    /// The address to bind the HTTP server to. [default: 127.0.0.1]
    #[arg(long, env = "RAY_DASHD_HOST", value_name = "ADDR")]
    pub host: Option<IpAddr>,

    /// The TCP port of the HTTP server; 0 picks a free one. [default: 8265]
    #[arg(long, env = "RAY_DASHD_PORT")]
    pub port: Option<u16>,

    /// The port of the Ray Client proxy (`ray://host:PORT`), on the same
    /// address as the dashboard; 0 turns it off. Only with Ray's modules.
    /// [default: 10001]
    #[arg(long, env = "RAY_DASHD_RAY_CLIENT_PORT")]
    pub ray_client_port: Option<u16>,

    /// The Python that has `ray[default]`, for Ray's modules and the Ray
    /// Client proxy. [default: the Python of the Ray head's own processes,
    /// else that of the wheel ray-dashd was installed from, else python3
    /// on PATH]
    #[arg(long, env = "RAY_DASHD_RAY_PYTHON", value_name = "PATH")]
    pub ray_python: Option<String>,

    /// Whether `ray_python` came from `RAY_DASHD_RAY_PYTHON` rather than
    /// the flag (for the log line that says where the Python came from).
    #[arg(skip)]
    pub ray_python_from_env: bool,

    /// Size in bytes at which `ray-dashd.log` and the modules' `.out` and
    /// `.err` are rotated; 0: never (Ray's variable; default 512 MiB).
    #[arg(long, env = "RAY_ROTATION_MAX_BYTES", value_name = "BYTES")]
    pub log_rotation_max_bytes: Option<u64>,

    /// How many rotated files of each are kept (Ray's variable; default 5).
    #[arg(long, env = "RAY_ROTATION_BACKUP_COUNT", value_name = "N")]
    pub log_rotation_backup_count: Option<u32>,

    /// The certificate chain (PEM) to serve HTTPS and WSS with on the
    /// dashboard port, read again on SIGHUP; needs --tls-key.
    #[arg(long, env = "RAY_DASHD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RAY_DASHD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// Serve everything (the UI, the API, module routes, websockets)
    /// under this path, as a reverse proxy that mounts the dashboard
    /// there expects: `/` then segments, no trailing `/`. [default: /]
    #[arg(long, env = "RAY_DASHD_URL_PREFIX", value_name = "PATH")]
    pub url_prefix: Option<String>,

    /// A TOML config file (modules, limits, supervision settings), laid
    /// over the built-in config/default.toml: what it sets replaces the
    /// built-in setting; the built-in modules stay unless it lists its own.
    #[arg(long, env = "RAY_DASHD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Check the config and print the effective settings as TOML (which
    /// `--config` loads back unchanged), then exit.
    #[arg(long)]
    pub check_config: bool,
}

impl Cli {
    /// Parses the process's arguments (and `RAY_DASHD_*` variables), noting
    /// which values came from the environment.
    pub fn parse_args() -> Result<Cli, clap::Error> {
        let matches = Cli::command().try_get_matches()?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        cli.ray_python_from_env =
            matches.value_source("ray_python") == Some(ValueSource::EnvVariable);
        Ok(cli)
    }
}
