//! SALSA engine: a log-structured host translation layer in user space.
//!
//! Layers, top to bottom (each module says what it owns and which invariants it keeps):
//! - [`pool`]: the public API (pools, volumes, statistics);
//! - [`controller`]: volumes' logical-to-physical mapping (the LSA page map);
//! - [`engine`]: the shared paths: write records, flush, allocation, GC; [`policy`]: placement
//!   and victim selection, by name; [`recovery`]: checkpoint load and crash scan; [`scan`]: record-chain walks;
//! - [`payload`]: write payloads that records hold instead of copying;
//! - [`capacity`]: segments, free queues, valid counts; [`durability`]: record ids and syncs;
//! - [`array`](mod@array): devices combined into one address space; [`device`]: the devices;
//! - [`format`](mod@format): every on-disk structure.

pub mod array;
pub mod capacity;
pub mod controller;
pub mod device;
pub mod durability;
pub mod engine;
pub mod error;
pub mod format;
pub mod layout;
pub mod payload;
pub mod policy;
pub mod pool;
pub mod recovery;
pub mod scan;
pub mod util;
pub mod write_back;

pub use device::{Device, StorageType};
pub use error::{Error, ErrorKind, Result};
pub use policy::Registry;
pub use pool::{OpenOptions, OpenedFrom, Pool, PoolConfig, Stats, Volume, VolumeStats};
