//! The programs the `ray-dashd` binary carries besides the server, so that
//! one binary, copied or installed alone, has everything its default config
//! and Ray's modules start: `ray-dashd module logs|example`, `ray-dashd
//! fork-shim …`, `ray-dashd client-proxy …` and `ray-dashd ray-state …`. Each runs the code of its
//! crate under `modules/`, whose own binary stays for configs that name it.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};

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
