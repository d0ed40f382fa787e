//! The `ray-dashd` binary: parse, load the config, hand over to the library.

use std::process::ExitCode;

use ray_dashd::cli::Cli;
use ray_dashd::config::Config;

/// The exit status of a bad command line or config (`EX_USAGE`).
const USAGE: u8 = 64;

fn main() -> ExitCode {
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
    match ray_dashd::launch(config) {
        Ok(stopped) => ExitCode::from(stopped.exit_code()),
        Err(e) => {
            eprintln!("ray-dashd: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
