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

use serde_json::json;

use crate::net::{accept_until_signal, Target};

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
    let totals = Arc::new(Totals::default());
    let to = Arc::new(to);
    let accepted = accept_until_signal("tcp-relay", listen, |mut client| {
        let (totals, to) = (totals.clone(), to.clone());
        tokio::spawn(async move {
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
    })
    .await?;
    Ok(json!({
        "connections": accepted.connections,
        "failed_accepts": accepted.failed_accepts,
        "failed_connects": totals.failed_connects.load(Ordering::Relaxed),
        "bytes_to_target": totals.to_target.load(Ordering::Relaxed),
        "bytes_from_target": totals.from_target.load(Ordering::Relaxed),
    }))
}
