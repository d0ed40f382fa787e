//! `ray-dashd-client-proxy`: the Ray Client proxy module as a binary of its
//! own, kept for configs that name it; `ray-dashd client-proxy` runs the
//! same code. See the crate docs.

use clap::Parser;

fn main() -> std::process::ExitCode {
    ray_dashd_client_proxy::main(ray_dashd_client_proxy::args::Args::parse())
}
