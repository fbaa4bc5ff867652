//! One module per command group; `main.rs` parses the command line and dispatches here.

pub(crate) mod admin;
pub(crate) mod bench;
pub(crate) mod control_requests;
pub(crate) mod device;
pub(crate) mod events;
pub(crate) mod files_to_create;
pub(crate) mod metrics;
pub(crate) mod serve;
pub(crate) mod share;
pub(crate) mod spares;
pub(crate) mod stats;
pub(crate) mod volume;
