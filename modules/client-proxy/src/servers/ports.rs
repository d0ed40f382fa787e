//! The pool of ports servers listen on: the ports of a range (Ray's way,
//! the default) or, with `--port-range auto`, a port the kernel picks for
//! each server.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::Mutex;

use ray_dashd_contract::LockExt;
use tracing::debug;

use super::ServerError;
use crate::args::PortSource;

/// How many times in a row the kernel may name a port the pool has already
/// handed out (its server not bound yet) before a take gives up.
const KERNEL_TRIES: usize = 16;

/// The ports servers may listen on. A port is in use from the moment it is
/// handed out until its server's exit has been reaped.
#[derive(Debug)]
pub struct PortPool {
    source: Source,
    in_use: Mutex<PoolState>,
}

#[derive(Debug)]
enum Source {
    /// The ports of the range, from the top down.
    Range(RangeInclusive<u16>),
    /// Whatever port the kernel picks for a bind of port 0 on this address.
    Kernel(IpAddr),
}

#[derive(Debug)]
struct PoolState {
    taken: BTreeSet<u16>,
    next: u16,
}

impl PortPool {
    /// A pool of the ports in `range`.
    pub fn new(range: RangeInclusive<u16>) -> PortPool {
        let next = *range.end();
        PortPool::with(Source::Range(range), next)
    }

    /// A pool that asks the kernel for a free port on loopback (where the
    /// servers listen) for each server.
    pub fn auto() -> PortPool {
        PortPool::auto_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// The pool `source` names.
    pub fn from_source(source: &PortSource) -> PortPool {
        match source {
            PortSource::Range(range) => PortPool::new(range.clone()),
            PortSource::Auto => PortPool::auto(),
        }
    }

    fn auto_on(host: IpAddr) -> PortPool {
        PortPool::with(Source::Kernel(host), 0)
    }

    fn with(source: Source, next: u16) -> PortPool {
        PortPool {
            source,
            in_use: Mutex::new(PoolState {
                taken: BTreeSet::new(),
                next,
            }),
        }
    }

    /// Takes a port nobody listens on.
    ///
    /// From a range: going round it downwards, so that a port just given
    /// back is the last to be reused. Downwards from the top: Ray's own
    /// proxier takes the lowest free port of the same default range, so the
    /// two meet only when both are busy.
    ///
    /// Automatic: the port the kernel gives a bind of port 0 (a port no
    /// socket holds), let go at once for the server to bind; asked again
    /// when it is one the pool has handed out and whose server has not
    /// bound yet.
    pub fn take(&self) -> Result<u16, ServerError> {
        match &self.source {
            Source::Range(range) => self.take_from(range),
            Source::Kernel(host) => self.take_with(|| kernel_port(*host)),
        }
    }

    fn take_from(&self, range: &RangeInclusive<u16>) -> Result<u16, ServerError> {
        let (first, last) = (*range.start(), *range.end());
        let mut state = self.in_use.locked();
        let span = u32::from(last - first) + 1;
        for step in 0..span {
            let port = last - ((u32::from(last - state.next) + step) % span) as u16;
            if state.taken.contains(&port) || !bindable(port) {
                continue;
            }
            state.taken.insert(port);
            state.next = if port == first { last } else { port - 1 };
            return Ok(port);
        }
        Err(ServerError::NoPort { first, last })
    }

    /// Takes the first port `ask` names that the pool has not handed out.
    fn take_with(&self, mut ask: impl FnMut() -> io::Result<u16>) -> Result<u16, ServerError> {
        let mut state = self.in_use.locked();
        for _ in 0..KERNEL_TRIES {
            let port = ask().map_err(|e| ServerError::NoKernelPort {
                reason: e.to_string(),
            })?;
            if state.taken.insert(port) {
                return Ok(port);
            }
            debug!(
                port,
                "the kernel named a port already handed out; asking again"
            );
        }
        Err(ServerError::NoKernelPort {
            reason: format!("it named {KERNEL_TRIES} ports already handed out in a row"),
        })
    }

    /// Gives `port` back.
    pub fn give_back(&self, port: u16) {
        let mut state = self.in_use.locked();
        state.taken.remove(&port);
    }

    /// Where the ports come from, as `--port-range` takes it: `FIRST-LAST`
    /// or `auto`.
    pub fn source(&self) -> String {
        match &self.source {
            Source::Range(range) => PortSource::Range(range.clone()).to_string(),
            Source::Kernel(_) => PortSource::Auto.to_string(),
        }
    }

    /// How many ports are handed out.
    pub fn in_use(&self) -> usize {
        self.in_use.locked().taken.len()
    }
}

/// The port the kernel picks for a bind of port 0 on `host`, let go.
fn kernel_port(host: IpAddr) -> io::Result<u16> {
    let port = TcpListener::bind(SocketAddr::from((host, 0)))?
        .local_addr()?
        .port();
    if port == 0 {
        return Err(io::Error::other("the kernel bound port 0"));
    }
    Ok(port)
}

/// Whether nothing listens on `port` on loopback right now.
pub(crate) fn bindable(port: u16) -> bool {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashSet;
    use std::sync::PoisonError;
    use std::time::Duration;

    /// Held by each test here that binds ports: between a take and the
    /// test's own bind of that port, another test's bind (of port 0, or a
    /// probe of the same free port above the ephemeral range) could hold
    /// it. CI saw it once.
    static PORT_BINDERS: Mutex<()> = Mutex::new(());

    fn alone() -> std::sync::MutexGuard<'static, ()> {
        PORT_BINDERS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[test]
    fn pool_goes_round_and_skips_taken_ports() {
        let _alone = alone();
        // A port above the kernel's ephemeral range (32768–60999), so that
        // no outgoing connection takes it once it is let go.
        let holder = (61_500..65_500)
            .find_map(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok())
            .expect("a free port above the ephemeral range");
        let busy = holder.local_addr().unwrap().port();
        let pool = PortPool::new(busy..=busy);
        assert!(
            matches!(pool.take(), Err(ServerError::NoPort { .. })),
            "a port someone listens on was handed out"
        );
        drop(holder);
        // A child another test is spawning may hold a copy of the socket
        // until its exec: wait for the port with a bound.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let taken = loop {
            match pool.take() {
                Ok(port) => break port,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("the freed port is not handed out: {e}"),
            }
        };
        assert_eq!(taken, busy);
        assert!(pool.take().is_err(), "a port was handed out twice");
        pool.give_back(busy);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.take().unwrap(), busy);
    }

    #[test]
    fn pool_hands_out_ports_from_the_top_down() {
        let _alone = alone();
        let first = (61_500..65_000)
            .find(|&port| (port..port + 3).all(bindable))
            .expect("three free ports above the ephemeral range");
        let pool = PortPool::new(first..=first + 2);
        assert_eq!(pool.source(), format!("{first}-{}", first + 2));
        let order: Vec<u16> = (0..3).map(|_| pool.take().expect("a port")).collect();
        assert_eq!(order, [first + 2, first + 1, first]);
        pool.give_back(first + 1);
        assert_eq!(pool.take().expect("the port given back"), first + 1);
    }

    /// Each automatic port can be bound at once, and none is handed out
    /// twice while in use.
    #[test]
    fn auto_ports_are_bindable_and_not_handed_out_twice() {
        let _alone = alone();
        assert_eq!(PortPool::auto().source(), "auto");
        // An address of loopback no other test of this crate binds: their
        // listeners and connections on 127.0.0.1 cannot take its ports.
        let host = Ipv4Addr::new(127, 0, 77, 1);
        let pool = PortPool::auto_on(IpAddr::V4(host));
        let mut seen = HashSet::new();
        for _ in 0..100 {
            let port = pool.take().expect("a port from the kernel");
            assert_ne!(port, 0);
            assert!(seen.insert(port), "port {port} handed out twice");
            // Held only for the check: the kernel could name it again, and
            // the pool must then ask once more.
            let bound = TcpListener::bind((host, port));
            assert!(bound.is_ok(), "port {port} is not bindable: {bound:?}");
        }
        assert_eq!(pool.in_use(), 100);
        for &port in &seen {
            pool.give_back(port);
        }
        assert_eq!(pool.in_use(), 0);
    }

    /// A port some socket holds is never handed out: a plain listener on
    /// loopback or on every address, and a SO_REUSEPORT one (as gRPC's
    /// servers, Ray's and ours, listen).
    #[test]
    fn auto_never_hands_out_a_held_port() {
        let _alone = alone();
        let mut held = HashSet::new();
        let mut holders = Vec::new();
        for i in 0..150 {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            if i % 3 == 0 {
                socket.set_reuse_port(true).expect("SO_REUSEPORT");
            }
            let ip = if i % 3 == 1 {
                Ipv4Addr::UNSPECIFIED
            } else {
                Ipv4Addr::LOCALHOST
            };
            socket
                .bind(&SocketAddr::from((ip, 0)).into())
                .expect("bind an ephemeral port");
            socket.listen(8).expect("listen");
            let port = socket
                .local_addr()
                .expect("address")
                .as_socket()
                .expect("an inet address")
                .port();
            held.insert(port);
            holders.push(socket);
        }
        let pool = PortPool::auto();
        for _ in 0..1000 {
            let port = pool.take().expect("a port from the kernel");
            assert!(!held.contains(&port), "held port {port} handed out");
            pool.give_back(port);
        }
        drop(holders);
    }

    /// The kernel is asked again while it names ports already handed out,
    /// up to a bound; a port given back may be handed out again.
    #[test]
    fn auto_asks_again_for_a_port_already_handed_out() {
        let pool = PortPool::auto();
        assert_eq!(pool.take_with(|| Ok(40_001)).expect("a port"), 40_001);
        let mut answers = [40_001, 40_001, 40_002].into_iter();
        let port = pool.take_with(|| Ok(answers.next().expect("asked too often")));
        assert_eq!(port.expect("the second port"), 40_002);
        let mut asked = 0;
        let stuck = pool.take_with(|| {
            asked += 1;
            Ok(40_002)
        });
        assert!(
            matches!(stuck, Err(ServerError::NoKernelPort { .. })),
            "{stuck:?}"
        );
        assert_eq!(asked, KERNEL_TRIES);
        pool.give_back(40_001);
        assert_eq!(pool.take_with(|| Ok(40_001)).expect("given back"), 40_001);
        assert_eq!(pool.in_use(), 2);
    }

    /// A bind the kernel refuses is an error naming why, not a port.
    #[test]
    fn auto_fails_when_the_kernel_gives_no_port() {
        // TEST-NET-1 (RFC 5737): never an address of this machine.
        let pool = PortPool::auto_on(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
        let error = pool.take().expect_err("no port on a foreign address");
        assert!(
            matches!(error, ServerError::NoKernelPort { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("kernel"), "{error}");
        assert_eq!(pool.in_use(), 0);
        let refused = pool.take_with(|| Err(io::Error::from(io::ErrorKind::AddrInUse)));
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(pool.in_use(), 0);
    }
}
