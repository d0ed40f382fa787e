//! Open-file descriptors: the limit ray-dashd raises for itself at start,
//! the one its modules get back, and how many client connections the limit
//! leaves room for when `server.max_connections` is not set.

use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, info, warn};

/// Descriptors kept for the host itself, whatever its modules: the listener,
/// its log files and stderr, the runtime's epoll, eventfd, signalfd and
/// timers, Ray's GCS channel, and the `/proc` and cgroup files read while a
/// module stops. Counted generously (about 20 are open at rest): a surplus
/// costs client slots only when the limit is low.
pub const HOST_RESERVE: u64 = 64;

/// Descriptors kept per module besides its connection pool: the extra
/// connection of a health check when the pool is full, a start-up probe,
/// the module's two log files while it is spawned, and the pidfd the
/// runtime holds on its process.
pub const PER_MODULE_RESERVE: u64 = 4;

/// Connections accepted beyond `max_connections` that are still served,
/// `/api/healthz` only, one request each (see `server::accept`), so a
/// health check gets through while idle clients hold every slot.
pub const OVERFLOW_CONNECTIONS: usize = 32;

/// The least the derived cap goes: below this the dashboard is unusable
/// anyway, and the warning at start says why.
pub const MIN_MAX_CONNECTIONS: usize = 16;

/// The `RLIMIT_NOFILE` ray-dashd was started with, when it raised its own:
/// what its modules get back.
static STARTED_WITH: OnceLock<Rlimit> = OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (with an infinite hard
/// limit, to the kernel's `fs.nr_open`), and logs the old and new values.
/// Returns the soft limit in force afterwards (`u64::MAX`: none).
///
/// A soft limit of 1,024 is what most systems start a process with, and a
/// dashboard with a thousand idle clients (or a browser's worth of
/// followed logs) needs more. The hard limit is the administrator's: it is
/// never raised.
pub fn raise_nofile_limit() -> u64 {
    let before = getrlimit(Resource::Nofile);
    let soft = before.current.unwrap_or(u64::MAX);
    let Some(target) = before.maximum.or_else(nr_open) else {
        debug!(soft, "open-file limit has no bound; not raised");
        return soft;
    };
    if soft >= target {
        debug!(
            soft,
            hard = target,
            "open-file limit is at its hard limit already"
        );
        return soft;
    }
    let raised = Rlimit {
        current: Some(target),
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            // Set once, before any module starts.
            let _ = STARTED_WITH.set(before);
            info!(
                soft_before = soft,
                soft = target,
                hard = target,
                "raised the open-file limit (RLIMIT_NOFILE) to the hard limit"
            );
            target
        }
        Err(error) => {
            warn!(soft, hard = target, %error, "cannot raise the open-file limit; keeping it");
            soft
        }
    }
}

/// The `RLIMIT_NOFILE` a module should run with: the one ray-dashd was
/// started with, when ray-dashd raised its own. Code that uses `select(2)`
/// cannot take descriptors above 1,023, which is why systems keep the soft
/// limit low and leave raising it to each program (Go's runtime restores it
/// for its children the same way).
pub(crate) fn limit_for_modules() -> Option<Rlimit> {
    STARTED_WITH.get().copied()
}

/// Restores `limit` in a child between fork and exec: one system call, safe
/// there.
pub(crate) fn restore(limit: Rlimit) -> std::io::Result<()> {
    setrlimit(Resource::Nofile, limit).map_err(std::io::Error::from)
}

/// The kernel's ceiling on a process's descriptors.
fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The client connections a soft limit of `limit` descriptors leaves room
/// for, with modules whose pools hold at most `pools` connections each,
/// and that may hold `long_lived` streams and websockets in all: the
/// largest `c` with
///
/// ```text
/// HOST_RESERVE + OVERFLOW_CONNECTIONS + PER_MODULE_RESERVE × modules
///   + c + Σ min(pool, c) + min(long_lived, c)  ≤  limit
/// ```
///
/// A client connection carries one request at a time, so it holds at most
/// one module connection; but a pool keeps connections open after the
/// burst that opened them, so over time every module may hold as many as
/// there were clients, up to its own cap: hence `min(pool, c)` per module.
/// A stream or a websocket holds a module connection outside the pools,
/// for as long as its client's connection stays open: at most one per
/// client. Never less than [`MIN_MAX_CONNECTIONS`].
pub fn max_connections_for(limit: u64, pools: &[usize], long_lived: usize) -> usize {
    let reserve = HOST_RESERVE
        + OVERFLOW_CONNECTIONS as u64
        + PER_MODULE_RESERVE.saturating_mul(pools.len() as u64);
    let room = limit.saturating_sub(reserve);
    let long_lived = long_lived as u64;
    let needs = |c: u64| -> u64 {
        pools
            .iter()
            .fold(c.saturating_add(long_lived.min(c)), |sum, &pool| {
                sum.saturating_add((pool as u64).min(c))
            })
    };
    // `needs` grows with `c`: the largest `c` that fits, by bisection.
    let (mut fits, mut too_many) = (0u64, room.saturating_add(1));
    while too_many - fits > 1 {
        let mid = fits + (too_many - fits) / 2;
        if needs(mid) <= room {
            fits = mid;
        } else {
            too_many = mid;
        }
    }
    usize::try_from(fits)
        .unwrap_or(usize::MAX)
        .max(MIN_MAX_CONNECTIONS)
}

/// A client's TCP connection with its slot under the client cap, held
/// until the connection is closed: after a websocket upgrade too, when the
/// relay takes the socket over ([`ClientStream::into_parts`]).
#[derive(Debug)]
pub struct ClientStream {
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
}

impl ClientStream {
    /// `stream`, counted under the cap by `slot`.
    pub fn new(stream: TcpStream, slot: OwnedSemaphorePermit) -> ClientStream {
        ClientStream { stream, slot }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        &self.stream
    }

    /// The bare socket, and the slot to hold for as long as it is open.
    pub fn into_parts(self) -> (TcpStream, OwnedSemaphorePermit) {
        (self.stream, self.slot)
    }
}

impl AsyncRead for ClientStream {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientStream {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    #[inline]
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    #[inline]
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_what_the_reserve_and_the_pools_leave() {
        // No module: everything but the host's reserve and the overflow.
        assert_eq!(max_connections_for(256, &[], 0), 256 - 64 - 32);
        // One module of 100: c + min(100, c) ≤ 256 - 100.
        assert_eq!(max_connections_for(256, &[100], 0), 78);
        // ... and each client may hold a websocket too.
        assert_eq!(max_connections_for(256, &[100], 2048), 52);
        // Ray's fifteen modules at 1,024: each could hold as many as there
        // are clients, and each client a websocket.
        let ray = [100; 15];
        let c = max_connections_for(1024, &ray, 15 * 2048);
        assert_eq!(c, (1024 - 64 - 32 - 60) / 17);
        // Large limits: the pools and the streams are full and the rest is
        // the clients'.
        assert_eq!(
            max_connections_for(1 << 20, &ray, 15 * 2048),
            (1 << 20) - 64 - 32 - 60 - 1500 - 15 * 2048
        );
        // 20,000: half for clients, half for their websockets.
        assert_eq!(
            max_connections_for(20_000, &ray, 15 * 2048),
            (20_000 - 64 - 32 - 60 - 1500) / 2
        );
    }

    #[test]
    fn the_cap_never_goes_below_its_floor() {
        assert_eq!(max_connections_for(0, &[], 0), MIN_MAX_CONNECTIONS);
        assert_eq!(max_connections_for(100, &[100; 3], 0), MIN_MAX_CONNECTIONS);
        // No overflow at the other end.
        assert!(max_connections_for(u64::MAX, &[usize::MAX], usize::MAX) > 1 << 61);
    }
}
