//! The HTTP/2 settings the proxy sets on both of its sides, the clients'
//! (tonic's server) and the servers' (hyper's client and the driver
//! connection), so that what one side lets in the other lets through.

/// The HTTP/2 flow-control windows the proxy opens, on both of its sides,
/// per stream and per connection: an object chunk (5 MiB) in flight at once.
pub const STREAM_WINDOW_BYTES: u32 = 8 << 20;
/// See [`STREAM_WINDOW_BYTES`].
pub const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;

/// The largest HTTP/2 frame the proxy accepts, on both sides. gRPC's core
/// sends frames up to what its peer allows, and h2 reads a frame in as many
/// reads as its buffer takes: with HTTP/2's default of 16 KiB an object
/// chunk of `put`/`get` crossed the proxy in one read per 8 KiB.
pub const MAX_FRAME_BYTES: u32 = 1 << 20;
