//! `tcp-relay`: the least a proxy hop can cost on this machine.
//!
//! A byte relay with no protocol in it: each accepted TCP connection gets
//! one connection of its own to the target (a backend's Unix socket, or a
//! Ray client server's port), and bytes are copied both ways as they come
//! (Tokio's `copy_bidirectional`, TCP_NODELAY, one current-thread runtime,
//! as the proxies it is set beside). It parses nothing, so it can neither
//! route, nor pool, nor limit, nor answer health checks: it is not a
//! product, only the floor under every column. Whatever a real proxy adds
//! on top of it is the price of what the proxy does; whatever this relay
//! already costs is the price of one more process and one more pair of
//! sockets on the path, which no proxy can avoid.
//!
//! Runs until SIGTERM or SIGINT, then prints one JSON line:
//! `{connections, failed_accepts, failed_connects, bytes_to_target,
//! bytes_from_target}`; the byte counts are those of the connections that
//! ended cleanly before the signal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::net::Target;

/// Copy buffer per direction: large enough that a bulk transfer moves in
/// few system calls (the proxies it is compared with read up to 256 KiB).
const BUFFER_BYTES: usize = 256 << 10;

#[derive(Debug, Default)]
struct Totals {
    failed_connects: AtomicU64,
    to_target: AtomicU64,
    from_target: AtomicU64,
}

/// Relays every connection accepted on `listen` to `to` until SIGTERM or
/// SIGINT.
pub(crate) async fn run(listen: SocketAddr, to: Target) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        listen.ip().is_loopback(),
        "--listen must be a loopback address"
    );
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let totals = Arc::new(Totals::default());
    let to = Arc::new(to);
    let (mut connections, mut failed_accepts) = (0u64, 0u64);
    loop {
        let (mut client, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors under load, say: not the relay's end.
                    eprintln!("tcp-relay: accept failed: {e}");
                    failed_accepts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        };
        connections += 1;
        let (totals, to) = (totals.clone(), to.clone());
        tokio::spawn(async move {
            if client.set_nodelay(true).is_err() {
                return;
            }
            let Ok(mut target) = to.connect().await else {
                totals.failed_connects.fetch_add(1, Ordering::Relaxed);
                return;
            };
            // An error is one side going away: the other is closed by the
            // drop, as a proxy would.
            if let Ok((up, down)) = tokio::io::copy_bidirectional_with_sizes(
                &mut client,
                &mut target,
                BUFFER_BYTES,
                BUFFER_BYTES,
            )
            .await
            {
                totals.to_target.fetch_add(up, Ordering::Relaxed);
                totals.from_target.fetch_add(down, Ordering::Relaxed);
            }
        });
    }
    Ok(json!({
        "connections": connections,
        "failed_accepts": failed_accepts,
        "failed_connects": totals.failed_connects.load(Ordering::Relaxed),
        "bytes_to_target": totals.to_target.load(Ordering::Relaxed),
        "bytes_from_target": totals.from_target.load(Ordering::Relaxed),
    }))
}
