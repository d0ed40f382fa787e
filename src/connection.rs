//! Connections to the modules: HTTP/1.1 over an incarnation's Unix socket,
//! pooled per incarnation ([`ModulePool`]), on a stream woken for reading
//! only ([`ModuleStream`]), to a listener checked to be the incarnation's
//! own ([`PeerCheck`]). The layer below both the supervisor, which opens a
//! pool for each incarnation and probes its health through it, and the
//! proxy, which sends requests through the pool the supervisor's gate holds.

mod module_stream;
mod peer;
mod pool;

pub(crate) use module_stream::ModuleStream;
pub(crate) use peer::listener_pid;
pub use peer::PeerCheck;
pub(crate) use pool::{BareConn, Hold, PoolError, PooledBody};
pub use pool::{ConnectionStats, ModulePool};
