//! Whether a server's port is its alone: gRPC's SO_REUSEPORT lets another
//! process listen on it too (see [`crate::listeners`]).

use std::time::{Duration, Instant};

use tracing::debug;

use crate::listeners;

/// How long a server's own listener is looked for when only another
/// process's is seen on its port.
const OWN_LISTENER_WAIT: Duration = Duration::from_secs(3);

/// Whether the server of process group `group`, which answers on `port`,
/// shares the port with another process's listener, or does not listen on
/// it at all while another process does. When only another's listener is
/// there, the server's own may be a moment from binding beside it: it is
/// looked for a little while; after that the port counts as another's, so
/// a process that bound it between the pool's check and the server's own
/// bind never gets a client's calls (its metadata and token included),
/// unless `own_listener` is off.
pub(super) async fn shared_port(port: u16, group: u32, own_listener: bool) -> bool {
    let deadline = Instant::now() + OWN_LISTENER_WAIT;
    loop {
        match listeners::census(port, group) {
            Ok(census) if census.strangers == 0 => return false,
            Ok(census) if census.ours > 0 => return true,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => return own_listener,
            Err(e) => {
                debug!(port, error = %e, "cannot tell who listens on the port");
                return false;
            }
        }
    }
}
