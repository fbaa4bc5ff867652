//! Controllers map a volume's logical address space onto the capacity manager's segments. Each
//! volume is one controller instance with its own page size and allocation streams.
//!
//! Owns: the [`Controller`] trait, everything the layers below ask of a volume: the GC upcall
//! that moves a victim's live data (the one call up from the core), replay of scanned records
//! at recovery, the live references that the segment counts are derived from, and the
//! checkpoint image. A controller writes through the log ([`crate::log::Log`]) and its own
//! allocation streams ([`crate::log::stream::Streams`]), which the log registers, seals on
//! flush and closes; it keeps only its map. The engine, the GC, recovery and the checkpoint
//! hold volumes only as `Arc<dyn Controller>`; a new controller (dual mapping, hybrid,
//! append-only, extent map) implements this trait and its own front-end, and the core does not
//! change. The LSA page-map controller ([`lsa::LsaVolume`]) is the default and the only one
//! built so far.
//!
//! Invariants every controller keeps (the engine relies on them, and asserts what it can):
//! - it writes only through its [`Controller::streams`], registered with the log, one open
//!   segment per stream;
//! - after [`Controller::relocate`] returns `Ok`, it references nothing in the victim;
//! - [`Controller::account`] reports exactly the grains and tombstones it references, so that
//!   the segment counts derived from it at open match what the write path maintains.

pub mod lsa;
pub mod map;

use crate::error::Result;
use crate::format::RecordMeta;
use crate::log::stream::Streams;
use crate::log::Log;
use crate::util::Decoder;
use std::any::Any;
use std::sync::Arc;

/// A record found by the recovery scan, handed to its volume's controller, oldest first.
pub struct ScannedRecord<'a> {
    pub segment: u32,
    pub meta: &'a RecordMeta,
    /// Per data page of the record: does its crc32c match its entry?
    pub intact: &'a [bool],
    /// The record was durable (its id is at most the largest synced-through seen): all its
    /// entries count, not only the intact ones.
    pub trusted: bool,
}

/// One live reference a controller holds into a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// `grains` grains of live data in `segment`.
    Data { segment: u32, grains: u32 },
    /// A tombstone (a trim that must outlive older copies) kept in `segment`.
    Tombstone { segment: u32 },
}

impl Reference {
    /// The segment referenced.
    pub fn segment(self) -> u32 {
        match self {
            Reference::Data { segment, .. } | Reference::Tombstone { segment } => segment,
        }
    }
}

/// What a volume reports for the pool's statistics.
#[derive(Debug, Clone, Default)]
pub struct ControllerStats {
    pub name: String,
    pub size_bytes: u64,
    pub page_bytes: u32,
    pub mapped_bytes: u64,
    pub map_memory_bytes: u64,
    pub placement: String,
    /// Memory the placement policy holds (per-page history and the like).
    pub placement_memory_bytes: u64,
}

/// What the engine core asks of a volume (see the module documentation).
pub trait Controller: Send + Sync + 'static {
    /// The volume's id in the volume table.
    fn id(&self) -> u32;
    fn name(&self) -> &str;
    /// Its allocation streams (the log seals them on flush and counts them for the usable
    /// space: each may hold a partly written segment).
    fn streams(&self) -> Arc<Streams>;
    fn stats(&self) -> ControllerStats;

    // ----- GC -----

    /// Moves everything live out of `victim`, a segment this volume owns.
    fn relocate(&self, log: &Log, victim: u32) -> Result<()>;

    // ----- recovery and checkpoint -----

    /// Forgets every mapping (before a scan replaces a checkpoint that could not be used).
    fn clear(&self);
    /// A recovery scan is about to replay records.
    fn begin_replay(&self);
    /// Applies one scanned record of this volume; records come oldest first.
    fn replay(&self, log: &Log, record: &ScannedRecord<'_>);
    /// The scan is over.
    fn end_replay(&self);
    /// Calls `visit` for every live reference and returns the grains of live data, from which
    /// the engine derives segment counts, owners and states at open.
    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64>;
    /// Bytes [`Controller::encode_image`] appends.
    fn image_bytes(&self) -> u64;
    /// Appends the checkpoint image of the volume's mapping.
    fn encode_image(&self, out: &mut Vec<u8>);
    /// Loads an image written by [`Controller::encode_image`]; an error leaves the volume to a
    /// recovery scan.
    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()>;

    /// The concrete controller, for the front-end that serves its kind of volume.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}
