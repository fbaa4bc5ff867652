//! SALSA engine: a log-structured host translation layer in user space. It owns one or more
//! devices, writes them only in large sequential segments, does its own garbage collection,
//! keeps every volume's logical-to-physical map, and survives crashes.
//!
//! Layers, top to bottom; each knows only the one below, and each module's documentation says
//! what it owns and which invariants it keeps (`docs/DESIGN.md` has the whole map):
//! - [`frontend`]: the front-end-neutral volume interface ([`frontend::BlockVolume`]) that the
//!   NBD server, the C API and the Python package serve volumes through;
//! - `pool`: the public API: pools, volumes, statistics ([`Pool`], [`Volume`], [`Stats`]);
//! - `controller`: volumes' logical-to-physical mapping (the LSA page map), behind the
//!   `Controller` trait;
//! - `engine`: the space manager: volumes, segment allocation with throttling, the GC;
//!   `recovery`: checkpoint and crash scan; [`policy`]: placement and victim selection;
//! - `log`: geometry, capacity, sequence numbers, allocation streams, records, write-back,
//!   flush and durability, sticky errors;
//! - `array`: devices combined into one address space of segments; [`device`]: the devices
//!   and device models;
//! - `format` and `layout`: every on-disk structure and where it sits.
//!
//! Only `pool`, [`frontend`], [`device`], [`policy`], [`spec`] and [`error`] are public; the
//! rest is the engine's own.
//!
//! # Embedding a pool
//!
//! ```
//! use salsa_core::device::MemoryDevice;
//! use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
//! use std::sync::Arc;
//!
//! // A pool on one 64 MiB device (a file or block device works the same: `FileDevice`).
//! let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem0", 64 << 20));
//! let cfg = PoolConfig { segment_bytes: Some(1 << 20), ..PoolConfig::default() };
//! let pool = Pool::create(vec![dev.clone()], &cfg, &OpenOptions::default())?;
//! // A thin volume of 32 MiB with 4 KiB pages.
//! let vol = pool.create_volume("db", 32 << 20, 4096)?;
//! vol.write(8192, b"hello")?;
//! vol.flush()?; // durable from here on
//! let mut back = [0u8; 5];
//! vol.read(8192, &mut back)?;
//! assert_eq!(&back, b"hello");
//! pool.close()?; // a checkpoint: the next open needs no scan
//!
//! let pool = Pool::open(vec![dev], &OpenOptions::default())?;
//! assert_eq!(pool.opened_from(), salsa_core::OpenedFrom::Checkpoint);
//! pool.volume("db")?.read(8192, &mut back)?;
//! assert_eq!(&back, b"hello");
//! # Ok::<(), salsa_core::Error>(())
//! ```

pub(crate) mod array;
pub(crate) mod controller;
pub mod device;
pub(crate) mod dirty;
pub(crate) mod engine;
pub mod error;
pub(crate) mod format;
pub mod frontend;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod layout;
pub(crate) mod log;
pub(crate) mod pacing;
pub mod policy;
pub mod pool;
pub(crate) mod recovery;
pub mod spec;
pub(crate) mod util;

pub use array::{MemberStatus, ParityBufferStatus};
pub use controller::compression::Compression;
pub use controller::hybrid::HybridSpec;
pub use controller::ControllerStats;
pub use device::{Device, StorageType};
pub use dirty::PagedPayload;
pub use error::{Error, ErrorKind, Result};
pub use format::{StreamKind, MAX_POLICY_NAME_BYTES};
pub use log::payload::WriteBuffer;
pub use log::read_cache::ReadCacheStats;
pub use log::write_back::{WRITE_BACK_DEPTH, WRITE_BACK_DEPTH_MAX};
pub use log::Geometry;
pub use log::StorageClass;
pub use pacing::{ack_due, sleep_until_ack_time};
pub use policy::Registry;
pub use pool::{
    ArrayKind, ControllerKind, OpenOptions, OpenedFrom, Pool, PoolConfig, RebuildOptions, RebuildProgress, RebuildReport, ScrubReport,
    ShareRange, Stats, Volume, VolumeSpec, VolumeStats, WrittenNow,
};
pub use util::AlignedBuf;
