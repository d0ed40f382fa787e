//! The `ray-dashd` binary: parse, load the config, hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use ray_dashd::cli::Cli;
use ray_dashd::config::Config;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("ray-dashd: {e}");
            return ExitCode::from(64);
        }
    };
    if cli.check_config {
        println!("{config:#?}");
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
