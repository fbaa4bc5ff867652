//! NBD server for SALSA volumes.
//!
//! - [`proto`]: the protocol, sans IO: the handshake state machine, request parsing and
//!   validation, reply encoding. It never touches a socket, so it is fuzzed and property-tested
//!   directly.
//! - [`server`]: connection handling over TCP and Unix sockets: one reader thread per
//!   connection, requests executed concurrently by a bounded worker pool, replies written as
//!   they complete (out of order).

pub mod fuzzing;
pub mod proto;
pub mod server;
