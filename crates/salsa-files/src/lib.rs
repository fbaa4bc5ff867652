//! A small file store on an append-only (AMF) volume of a SALSA pool: the storage a key-value
//! store's files need (RocksDB's SST, WAL and MANIFEST files, through the plugin in
//! `plugins/rocksdb`), laid out the way the AMF paper's ALSM lays out an LSM tree.
//!
//! - Each file owns whole segments of the volume and only appends into them; a deleted file's
//!   segments are trimmed whole, so SALSA's GC never copies a file's bytes.
//! - The file table (names, extents, sizes, times, directories) is kept by a journal in the
//!   volume's segments 0 and 1 ([`journal`]), from which the store rebuilds its state at open.
//! - A sync makes a file's data durable, then its extents: what a sync returned from survives
//!   a crash (tested at every point of the journal in `tests/crash.rs`).
//!
//! Layers: [`store`] (the public API: [`FileStore`], [`FileWriter`], [`FileReader`]) over
//! [`journal`] (the table on the volume) over [`table`] (the table in memory) and [`record`]
//! (the journal's records, without I/O).

pub mod error;
pub mod journal;
pub mod record;
pub mod store;
pub mod table;

pub use error::{Error, Result};
pub use store::{inspect, FileReader, FileStore, FileWriter, StoreStats, HELD_BYTES_DEFAULT, WRITE_CHUNK_BYTES};
pub use table::{FileKind, KindStats};
