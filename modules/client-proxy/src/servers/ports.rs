//! The pool of ports servers listen on.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::Mutex;

use super::ServerError;

/// The ports servers may listen on. A port is in use from the moment it is
/// handed out until its server's exit has been reaped.
#[derive(Debug)]
pub struct PortPool {
    range: RangeInclusive<u16>,
    in_use: Mutex<PoolState>,
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
        PortPool {
            range,
            in_use: Mutex::new(PoolState {
                taken: BTreeSet::new(),
                next,
            }),
        }
    }

    /// Takes a port nobody listens on, going round the range downwards so
    /// that a port just given back is the last to be reused. Downwards from
    /// the top: Ray's own proxier takes the lowest free port of the same
    /// default range, so the two meet only when both are busy.
    pub fn take(&self) -> Result<u16, ServerError> {
        let (first, last) = (*self.range.start(), *self.range.end());
        let mut state = self.in_use.lock().expect("UNWRAP: pool lock poisoned");
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

    /// Gives `port` back.
    pub fn give_back(&self, port: u16) {
        let mut state = self.in_use.lock().expect("UNWRAP: pool lock poisoned");
        state.taken.remove(&port);
    }

    /// How many ports are handed out.
    pub fn in_use(&self) -> usize {
        self.in_use
            .lock()
            .expect("UNWRAP: pool lock poisoned")
            .taken
            .len()
    }
}

/// Whether nothing listens on `port` on loopback right now.
pub(crate) fn bindable(port: u16) -> bool {
    TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    #[test]
    fn pool_goes_round_and_skips_taken_ports() {
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
        let first = (61_500..65_000)
            .find(|&port| (port..port + 3).all(bindable))
            .expect("three free ports above the ephemeral range");
        let pool = PortPool::new(first..=first + 2);
        let order: Vec<u16> = (0..3).map(|_| pool.take().expect("a port")).collect();
        assert_eq!(order, [first + 2, first + 1, first]);
        pool.give_back(first + 1);
        assert_eq!(pool.take().expect("the port given back"), first + 1);
    }
}
