//! The programs the `ray-dashd` binary carries besides the server, so that
//! one binary, copied or installed alone, has everything its default config
//! and Ray's modules start: `ray-dashd module logs|example`, `ray-dashd
//! fork-shim …`, `ray-dashd client-proxy …` and `ray-dashd ray-state …`. Each runs the code of its
//! crate under `modules/`, whose own binary stays for configs that name it.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Subcommand, ValueEnum};
use ray_dashd_contract::names::SOCKET_VAR;
use tracing::{debug, info};

/// How often a built-in module looks whether its socket is bound yet.
const SOCKET_POLL: Duration = Duration::from_millis(100);

/// How long it looks: past that, it lets go of its start-up pages anyway.
const SERVING_WITHIN: Duration = Duration::from_secs(60);

/// The program name that stands for this very binary in a module's command
/// (see [`crate::config::ModuleSpec::program`]): the built-in config and
/// Ray's modules start `ray-dashd <builtin> …`.
pub const SELF_PROGRAM: &str = "ray-dashd";

/// The subcommand of the fork shim.
pub const FORK_SHIM: &str = "fork-shim";

/// The subcommand of the Ray Client proxy.
pub const CLIENT_PROXY: &str = "client-proxy";

/// The subcommand of the Ray state module.
pub const RAY_STATE: &str = "ray-state";

/// Runs the fork shim when the command line is `ray-dashd fork-shim …`,
/// before anything else: the shim is started once per Ray module and stands
/// for it all its life, so it skips clap, whose parser would fault in code
/// and allocate for nothing (the shim parses its own arguments). Returns
/// otherwise.
pub fn fork_shim_if_asked() {
    let mut argv = std::env::args_os();
    if argv.nth(1).is_some_and(|first| first == FORK_SHIM) {
        ray_dashd_fork_shim::main(argv)
    }
}

/// A program the binary runs in place of the server.
#[derive(Debug, Clone, Subcommand)]
pub enum Builtin {
    /// Run a built-in module, as ray-dashd starts it: the socket and the
    /// session come from the RAY_DASHD_* variables of the module contract.
    Module {
        /// Which module.
        name: BuiltinModule,
    },
    /// Ray's fork shim: the process ray-dashd supervises for a Ray module
    /// forked by Ray's zygote. Its arguments are its own: `--zygote NAME
    /// [--wait SECS] [--reply-timeout SECS] MODULE -- FALLBACK...`. (Run by
    /// [`fork_shim_if_asked`] before clap parses anything; here for `--help`.)
    #[command(disable_help_flag = true)]
    ForkShim {
        /// The shim's arguments, passed on unparsed.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<OsString>,
    },
    /// The Ray Client proxy module (`ray://`), which ray-dashd starts with
    /// Ray's modules.
    ClientProxy(ray_dashd_client_proxy::args::Args),
    /// The Ray state module, which answers some of Ray's routes from the
    /// GCS; ray-dashd starts it with Ray's modules.
    RayState(ray_dashd_ray_state::Args),
}

/// The modules built into the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BuiltinModule {
    /// The session's logs over http, stream and websocket (`modules/logs`).
    Logs,
    /// A small showcase module (`modules/example`).
    Example,
}

impl Builtin {
    /// Runs the program to its end; its exit status.
    pub fn run(self) -> ExitCode {
        if !matches!(self, Builtin::ForkShim { .. }) {
            let_go_once_serving();
        }
        match self {
            Builtin::Module {
                name: BuiltinModule::Logs,
            } => ray_dashd_logs::main(),
            Builtin::Module {
                name: BuiltinModule::Example,
            } => ray_dashd_example::main(),
            Builtin::ForkShim { args } => ray_dashd_fork_shim::main(args),
            Builtin::ClientProxy(args) => {
                lean_malloc();
                ray_dashd_client_proxy::main(args)
            }
            Builtin::RayState(args) => {
                lean_malloc();
                ray_dashd_ray_state::main(args)
            }
        }
    }
}

/// The host's malloc settings ([`crate::allocator`]), for a module that
/// decodes the GCS's big replies (megabytes on a big cluster, on each
/// refresh) on several threads: without them each thread's arena keeps
/// what it freed (the Ray state module held 15 MiB of its own at idle on
/// the 2,000-node synthetic cluster, having answered one job list).
fn lean_malloc() {
    crate::allocator::map_large_blocks();
    crate::allocator::trim_periodically();
}

/// Lets go of the module's start-up file pages, as the host does of its own
/// ([`crate::file_pages`]), once the module serves: a thread of its own
/// waits until the module's socket (`RAY_DASHD_SOCKET`) is bound by this
/// process (a file other than the one there when it started, if any: an
/// earlier incarnation's), for [`SERVING_WITHIN`] at most. Each built-in
/// module is the whole binary, and held 5.6 MiB of its pages after start
/// with the default config.
fn let_go_once_serving() {
    let Some(socket) = std::env::var_os(SOCKET_VAR).map(PathBuf::from) else {
        return;
    };
    // The file's identity: a new socket has another inode, or, should the
    // inode be reused, a later change time. (Not compared with the clock:
    // file times come from the kernel's coarse clock, which can be behind
    // the process's own reading of the time.)
    let identity = |path: &PathBuf| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
    };
    let earlier = identity(&socket);
    let spawned = std::thread::Builder::new()
        .name("file-pages".into())
        .spawn(move || {
            let deadline = Instant::now() + SERVING_WITHIN;
            let bound = || identity(&socket).is_some_and(|now| Some(now) != earlier);
            while !bound() && Instant::now() < deadline {
                std::thread::sleep(SOCKET_POLL);
            }
            match crate::file_pages::release() {
                Ok(released) => info!(
                    mappings = released.mappings,
                    released_kib = released.kib,
                    "start-up's file pages let go"
                ),
                Err(error) => debug!(%error, "start-up's file pages kept"),
            }
        });
    if let Err(error) = spawned {
        debug!(%error, "start-up's file pages kept: no thread");
    }
}
