//! NBD server for SALSA volumes.
//!
//! - [`proto`]: the protocol, sans IO: the handshake state machine, request parsing and
//!   validation, reply encoding. It never touches a socket, so it is fuzzed and property-tested
//!   directly.
//! - [`server`]: connection handling over TCP and Unix sockets: per connection a small set of
//!   threads that take turns reading requests (leader/follower); the thread that read a request
//!   executes it and replies as soon as it completes (possibly out of order), and replies ready
//!   while another thread sends are combined into its write.
//!
//! What is served is any `salsa_core::frontend::BlockVolume`: a pool's volumes, or a device
//! served raw (for baselines); this crate keeps only the protocol.
//! - `fuzzing` (feature `fuzzing`): the driver the `cargo fuzz` target and the codec's
//!   property tests feed bytes through; not part of the server's API.

#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod proto;
pub mod server;
pub mod tls;
