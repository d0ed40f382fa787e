//! The `ray-dashd` binary: parse, run a built-in program or load the config
//! and hand over to the library.

use std::process::ExitCode;

use ray_dashd::cli::Cli;
use ray_dashd::config::Config;

/// The exit status of a bad command line or config (`EX_USAGE`).
const USAGE: u8 = 64;

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _faults = ray_dashd::fault::from_env();
    // Never returns when the command line is `ray-dashd fork-shim …`.
    ray_dashd::builtin::fork_shim_if_asked();
    // Not an option for people: how the host starts its cgroup warden.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(ray_dashd::supervisor::WARDEN_FLAG)) {
        if let (Some(base), None) = (args.next(), args.next()) {
            return ray_dashd::supervisor::run_warden(std::path::Path::new(&base));
        }
    }
    let cli = match Cli::parse_args() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` come here too, to stdout; they
            // succeed. A real error is printed as clap words it.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // `ray-dashd module logs`, `fork-shim`, `client-proxy`: not the server.
    if let Some(builtin) = cli.builtin {
        return builtin.run();
    }
    let config = match Config::load(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ray-dashd: {e}");
            return ExitCode::from(USAGE);
        }
    };
    if cli.check_config {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    match ray_dashd::launch(cli, config) {
        Ok(stopped) => ExitCode::from(stopped.exit_code()),
        Err(e) => {
            eprintln!("ray-dashd: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
