//! `ray-dashd-client-proxy`: the Ray Client proxy module. See the crate docs.

use clap::Parser;

// One thread: servers are tied to the proxy by a parent-death signal, which
// the kernel ties to the thread that started them.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    ray_dashd_sdk::init_tracing();
    let args = ray_dashd_client_proxy::args::Args::parse();
    ray_dashd_client_proxy::run(args).await
}
