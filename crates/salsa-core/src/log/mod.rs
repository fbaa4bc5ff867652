//! The log layer: everything below the controllers that writes the pool as a log of records in
//! segments. Controllers, the GC, recovery and the checkpoint all stand on it and call down.
//!
//! Owns, behind private fields and the small API of [`Log`]:
//! - the pool's geometry, the array, the capacity manager ([`capacity`]) and the per-grain
//!   checksum table;
//! - sequence numbers and epochs (a new epoch is made durable before one runs out);
//! - allocation streams and the records they fill ([`stream`], [`record`]), write-back of
//!   sealed records ([`write_back`]), payload buffers that records hold ([`payload`]);
//! - durability bookkeeping ([`durability`]): flush (seal every stream, wait, sync once for all
//!   concurrent callers) and the release of segments waiting for a sync;
//! - sticky I/O errors: after a failed write or sync the log is poisoned until reopen;
//! - the live-data accounting the GC and the thin-provisioning limit read (valid grains and
//!   tombstones per segment, mapped grains, invalidations in flight).
//!
//! It also routes user writes and trims to the victim policies that watch them
//! ([`write_watchers`]).
//!
//! The one way it calls up is [`SegmentSource`]: when a stream needs a new segment it asks the
//! space manager above (the engine, which throttles writers and runs the GC) for one.
//!
//! Invariants: a record is written once, whole, at the next free grain of its segment; records
//! of one stream reach the device in the order they were sealed; `synced_through` covers only
//! records complete before the sync that published it; a segment is handed out again only
//! after the metadata that emptied it is durable (the capacity manager's pending list).

pub mod capacity;
pub mod chain;
pub mod durability;
pub mod memory_reads;
pub mod payload;
pub mod read_cache;
pub mod record;
pub mod stream;
pub mod write_back;
pub mod write_watchers;

use crate::array::Array;
use crate::device::StorageType;
use crate::error::{Error, Result};
use crate::format::{DeviceLayout, PoolMeta, RecordMeta, SegmentHeader, StreamKind};
use crate::policy::placement::SegmentView;
use capacity::{Capacity, Purpose, SegmentState};
use durability::{Tracker, EPOCH_SHIFT, MAX_EPOCHS, SEQ_EPOCH_SHIFT};
use parking_lot::{Mutex, RwLock};
use record::SealedRecord;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use stream::Streams;

/// Pool geometry, fixed at format time.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub grain_bytes: u32,
    pub segment_bytes: u64,
    pub grains_per_segment: u32,
    pub total_segments: u32,
    pub total_grains: u64,
    /// Entries one metadata page holds.
    pub meta_entries: u32,
    /// Entries the metadata page of a sized record holds (each data page's size beside it).
    pub sized_meta_entries: u32,
    /// A metadata page follows at most this many data pages.
    pub meta_interval_pages: u32,
}

impl Geometry {
    /// Grains of a segment that hold data: all but the metadata pages.
    pub fn data_grains_per_segment(&self) -> u32 {
        let gps = self.grains_per_segment;
        gps - gps.div_ceil(self.meta_interval_pages + 1)
    }

    /// The segment holding physical grain `grain`.
    pub fn segment_of(&self, grain: u64) -> u32 {
        (grain / self.grains_per_segment as u64) as u32
    }
}

/// Counters, readable at any time.
#[derive(Default)]
pub struct Counters {
    pub user_bytes_written: AtomicU64,
    pub user_bytes_read: AtomicU64,
    pub gc_bytes_relocated: AtomicU64,
    /// Bytes the GC read from victims (their metadata and live pages, or whole victims).
    pub gc_bytes_read: AtomicU64,
    pub device_bytes_written: AtomicU64,
    pub meta_bytes_written: AtomicU64,
    pub gc_segments_cleaned: AtomicU64,
    pub flushes: AtomicU64,
    pub syncs: AtomicU64,
    /// Time spent in device syncs.
    pub sync_micros: AtomicU64,
    /// GC releases whose records a sync begun after them covered, so that they synced nothing
    /// themselves (group commit of releases).
    pub releases_sharing_a_sync: AtomicU64,
    /// Time the GC spent reading victims and relocating (excluding syncs).
    pub gc_micros: AtomicU64,
    pub throttled_allocations: AtomicU64,
    /// Victims whose count the GC waited a full second for writers to settle.
    pub gc_wait_timeouts: AtomicU64,
    /// User bytes that records held in the writers' payloads instead of copying.
    pub user_bytes_held: AtomicU64,
    /// Bytes compressing volumes' writes did not store: their pages' bytes less the bytes
    /// of their stored forms.
    pub compressed_bytes_saved: AtomicU64,
    /// Zeros written after records so that flushes end on full stripes (parity arrays
    /// without a parity buffer).
    pub pad_bytes_written: AtomicU64,
    /// Bytes of freed segments discarded on the devices.
    pub discarded_bytes: AtomicU64,
    /// Bursts of GC records written together ([`Log::set_gc_burst_bytes`]), and the records
    /// they held.
    pub gc_bursts: AtomicU64,
    pub gc_burst_records: AtomicU64,
    /// Discards a device refused with an error (advisory: nothing is lost).
    pub discard_errors: AtomicU64,
    /// Freed segments not discarded because the discard would cost an allocation at their
    /// imminent reuse (see `Log::discard_released`).
    pub discards_skipped: AtomicU64,
    /// Zeros written into free segments over holes of their pool file (see `Log::fill_holes`).
    pub hole_fill_bytes: AtomicU64,
    /// Pages remapped by share batches (SHARE), and the batches.
    pub pages_shared: AtomicU64,
    pub share_batches: AtomicU64,
    /// User records written ahead of their flush by write-behind ([`Log::write_ahead`]).
    pub records_written_ahead: AtomicU64,
}

/// Where streams get new segments: the space manager above the log, which throttles writers
/// and cleans (the engine). The log's only call upwards.
pub trait SegmentSource: Send + Sync {
    /// A free segment for a stream of `purpose`, prepared for writing from its start. May wait
    /// for (or run) the GC; fails only when no space can be made.
    /// The segment is of one of `types`, in preference order.
    fn allocate_segment(&self, purpose: Purpose, types: &'static [StorageType]) -> Result<u32>;
}

/// Write payload buffers out at once (being received, or held by records not yet written);
/// past it writes are copied into records instead (see [`payload`]).
pub const PAYLOAD_BUDGET_BYTES: usize = 64 << 20;

/// Most bytes of GC records a GC stream holds back for one burst ([`Log::set_gc_burst_bytes`]):
/// their buffers stay in memory until written.
pub const GC_BURST_BYTES_MAX: u64 = 32 << 20;

/// Allocation preference of every stream: SALSA is multi-type by design; this build places
/// user and GC data on any type, preferring flash, then NVM, then disks, and keeps the
/// conventional zones of SMR drives for last (checkpoints want them).
pub const ANY_TYPE: [StorageType; 5] = [
    StorageType::Flash,
    StorageType::Nvm,
    StorageType::Hdd,
    StorageType::SmrSequential,
    StorageType::SmrConventional,
];

/// The slow tier of a hybrid volume: disks, whose failure the fast tier never stands in for.
pub const SLOW_TYPES: [StorageType; 3] = [StorageType::Hdd, StorageType::SmrSequential, StorageType::SmrConventional];

/// The fast tier of a hybrid volume: where copies of hot data go.
pub const FAST_TYPES: [StorageType; 2] = [StorageType::Flash, StorageType::Nvm];

/// Which storage types a volume's data may be written to (its streams' constraint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StorageClass {
    /// Any type, flash first (`ANY_TYPE`).
    #[default]
    Any = 0,
    /// Flash and NVM only (`FAST_TYPES`).
    Fast = 1,
    /// Disks only (`SLOW_TYPES`).
    Slow = 2,
}

impl StorageClass {
    pub const ALL: [StorageClass; 3] = [StorageClass::Any, StorageClass::Fast, StorageClass::Slow];

    /// The types, in preference order.
    pub fn types(self) -> &'static [StorageType] {
        match self {
            StorageClass::Any => &ANY_TYPE,
            StorageClass::Fast => &FAST_TYPES,
            StorageClass::Slow => &SLOW_TYPES,
        }
    }

    /// The name users write (`--storage fast`).
    pub fn name(self) -> &'static str {
        match self {
            StorageClass::Any => "any",
            StorageClass::Fast => "fast",
            StorageClass::Slow => "slow",
        }
    }

    pub fn from_name(name: &str) -> Option<StorageClass> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    pub fn from_u64(v: u64) -> Option<StorageClass> {
        Self::ALL.into_iter().find(|c| *c as u64 == v)
    }
}

/// Allocation preference of checkpoints: conventional zones first, where a zoned drive has them.
pub const CHECKPOINT_TYPES: [StorageType; 5] = [
    StorageType::SmrConventional,
    StorageType::Nvm,
    StorageType::Flash,
    StorageType::Hdd,
    StorageType::SmrSequential,
];

/// What reading a mapped page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageRead {
    /// `out` holds the page and it matched its checksum.
    Intact,
    /// The page's segment was reused while it was read, or its map entry moved: look it up
    /// again.
    Moved,
    /// The bytes do not match the page's checksum.
    Damaged,
}

/// The log (see the module documentation).
pub struct Log {
    pool_id: u128,
    geo: Geometry,
    array: Box<dyn Array>,
    capacity: Capacity,
    tracker: Tracker,
    /// crc32c of the page that starts at each grain (the in-memory half of the back-pointers).
    crc_table: Box<[AtomicU32]>,
    seq: AtomicU64,
    epoch_lock: Mutex<()>,
    poison: Mutex<Option<String>>,
    poisoned: AtomicBool,
    /// A fill of free segments' holes failed: no more are tried until the pool reopens.
    hole_fill_stopped: AtomicBool,
    read_only: bool,
    counters: Counters,
    /// The durable pool metadata (volume table); held while it is rewritten.
    meta: Mutex<PoolMeta>,
    /// Every volume's allocation streams, by volume id.
    streams: RwLock<BTreeMap<u32, Arc<Streams>>>,
    /// Sealed user records on their way to the device.
    write_back: write_back::WriteBack,
    /// Grains held by mapped pages across all volumes (for the thin-provisioning limit).
    mapped_grains: AtomicU64,
    /// Grains the write buffer holds for pages no controller maps yet: room promised to
    /// writes it acknowledged, which the limit counts as taken.
    reserved_grains: AtomicU64,
    /// Writes and trims between replacing a map entry and accounting for the place it left;
    /// the GC waits for them before it judges a cleaned victim.
    invalidations_in_flight: AtomicU64,
    /// Recycled record and read buffers.
    buffers: Arc<crate::util::BufferPool>,
    /// Buffers that write payloads are received into and records hold (zero-copy writes).
    payloads: Arc<payload::PayloadPool>,
    /// The space manager streams ask for segments (set once the engine above exists).
    segment_source: OnceLock<Weak<dyn SegmentSource>>,
    /// Victim policies told of user writes.
    pub write_watchers: write_watchers::WriteWatchers,
    /// Records sealed for a flush end on a multiple of this many grains in their segment (the
    /// array's [`Array::flush_alignment_grains`]).
    /// Grows to a whole row when a RAID-5 parity buffer goes out of service.
    pub(super) flush_alignment_grains: AtomicU32,
    /// A segment that closes, and a clean shutdown, pad the log to a multiple of this many
    /// grains (the array's [`Array::row_grains`]), so no row is left without its parity.
    pub(super) row_grains: u32,
    /// Where a RAID-5 array's parity goes: records add their bytes' parity as they are filled
    /// ([`crate::array::WriteParity`]); `None` for arrays without parity.
    pub(super) parity_geometry: Option<crate::array::ParityGeometry>,
    /// Copies of pages read from the devices (see [`read_cache`]); unset: no cache.
    read_cache: OnceLock<read_cache::ReadCache>,
    /// Whether the writers flush after every write (see [`Log::write_behind_due`]).
    write_behind: WriteBehind,
    /// Grains of GC records a GC stream holds back before writing them together (0: each
    /// record as it is sealed); see [`Log::set_gc_burst_bytes`].
    gc_burst_grains: AtomicU32,
}

/// Write-behind for writers that flush after every write (a database's log at queue depth 1).
/// A front-end that has answered a write and has no other request of its client under way
/// asks for it ([`crate::engine::Engine::write_behind`]): the open user records are sealed and
/// written then, as the next flush would, so the device write runs while the reply travels
/// and the client sends its flush, which then only waits for it and syncs (nbdkit's
/// `cache=none` starts the kernel's writeback at each write for the same reason). Whether the
/// writers flush after every write is learnt from the flushes:
/// - `score` rises by one (up to [`WriteBehind::MAX_SCORE`]) at each flush that follows
///   writes (it seals a user record, or records were written ahead of it), and halves at each
///   write-ahead that no flush followed before the next one; write-behind runs from
///   [`WriteBehind::MIN_SCORE`]. A writer that never flushes pays for at most two records
///   sealed early (a metadata page each) before it stops; one that flushes now and then
///   never reaches the threshold.
/// - the score drops to zero after [`WriteBehind::MAX_UNFLUSHED_WRITES`] writes with no flush
///   (a bulk load after a database's commits): without it, a writer at a depth that never
///   leaves the pool without a write under way would never let the score decay.
#[derive(Default)]
struct WriteBehind {
    score: AtomicU32,
    /// Records were written ahead since the last flush.
    unflushed: AtomicBool,
    /// Writes since the last flush.
    writes: AtomicU32,
}

impl WriteBehind {
    const MAX_SCORE: u32 = 8;
    const MIN_SCORE: u32 = 4;
    const MAX_UNFLUSHED_WRITES: u32 = 64;
}

/// Counts a write or trim in the log's invalidations in flight for its lifetime.
pub struct InvalidationGuard<'a>(&'a Log);

impl Drop for InvalidationGuard<'_> {
    fn drop(&mut self) {
        self.0.invalidations_in_flight.fetch_sub(1, SeqCst);
    }
}

impl Log {
    /// A log over `array`, continuing after the durable pool metadata `meta` (whose generation
    /// is this session's epoch).
    pub fn new(pool_id: u128, geo: Geometry, array: Box<dyn Array>, meta: PoolMeta, read_only: bool) -> Log {
        let capacity = Capacity::new(
            (0..geo.total_segments).map(|s| array.storage_type(s)).collect(),
            geo.grains_per_segment,
        );
        let epoch = meta.generation;
        let flush_alignment_grains = array.flush_alignment_grains(geo.grain_bytes);
        array.set_log_members(meta.log_members.as_deref());
        let row_grains = array.row_grains(geo.grain_bytes);
        assert!(
            geo.grains_per_segment.is_multiple_of(row_grains.max(1)) && row_grains.max(1).is_multiple_of(flush_alignment_grains.max(1)),
            "a segment holds whole rows, and a row whole flush alignments"
        );
        Log {
            flush_alignment_grains: AtomicU32::new(flush_alignment_grains),
            row_grains,
            parity_geometry: array.parity_geometry(),
            read_cache: OnceLock::new(),
            write_behind: WriteBehind::default(),
            gc_burst_grains: AtomicU32::new(0),
            pool_id,
            geo,
            array,
            capacity,
            tracker: Tracker::new(epoch << EPOCH_SHIFT | 1),
            crc_table: (0..geo.total_grains).map(|_| AtomicU32::new(0)).collect(),
            seq: AtomicU64::new(epoch << SEQ_EPOCH_SHIFT | 1),
            epoch_lock: Mutex::new(()),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            hole_fill_stopped: AtomicBool::new(false),
            read_only,
            counters: Counters::default(),
            meta: Mutex::new(meta),
            streams: RwLock::new(BTreeMap::new()),
            write_back: Default::default(),
            mapped_grains: AtomicU64::new(0),
            reserved_grains: AtomicU64::new(0),
            invalidations_in_flight: AtomicU64::new(0),
            buffers: Arc::new(crate::util::BufferPool::new(64 << 20)),
            payloads: payload::PayloadPool::new(PAYLOAD_BUDGET_BYTES, PAYLOAD_BUDGET_BYTES / 2),
            segment_source: OnceLock::new(),
            write_watchers: Default::default(),
        }
    }

    /// GC records are written in bursts of up to `bytes` (at most a segment, and at most
    /// [`GC_BURST_BYTES_MAX`]; 0: each as it is sealed). A GC stream holds its sealed records
    /// back (they need not be durable before a GC release, and reads find their pages in their
    /// buffers) until the burst is full, its segment is full, or a release, flush or close
    /// needs them, and then writes them one after the other.
    ///
    /// Why: a drive that programs what arrives in arrival order (an SSD's write frontier, a
    /// drive-managed SMR disk's media cache) puts the GC's cold survivors in the same erase
    /// blocks as the users' hot data when they arrive a record at a time between the users'
    /// records; those blocks never empty by SALSA's discards of freed segments, and the drive
    /// moves the cold data again (docs/BENCHMARKS.md).
    pub fn set_gc_burst_bytes(&self, bytes: u64) {
        let seg = u64::from(self.geo.grains_per_segment);
        let grains = (bytes.min(GC_BURST_BYTES_MAX) / u64::from(self.geo.grain_bytes)).min(seg);
        self.gc_burst_grains.store(grains as u32, SeqCst);
    }

    /// See [`Log::set_gc_burst_bytes`].
    pub fn gc_burst_grains(&self) -> u32 {
        self.gc_burst_grains.load(SeqCst)
    }

    /// Writes every GC record the streams hold back for their bursts, in each stream's order.
    fn write_held_gc_records(&self) -> Result<()> {
        let mut first_err = None;
        for s in self.streams_snapshot() {
            if let Err(e) = self.write_gc_burst(s.take_held(self)) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Writes records a GC stream held back, in order (all of them, also after an error: each
    /// must complete; the first error is returned).
    pub(crate) fn write_gc_burst(&self, burst: Vec<SealedRecord>) -> Result<()> {
        if burst.is_empty() {
            return Ok(());
        }
        self.counters.gc_bursts.fetch_add(1, SeqCst);
        self.counters.gc_burst_records.fetch_add(burst.len() as u64, SeqCst);
        let mut first_err = None;
        for r in burst {
            if let Err(e) = self.write_record(r) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Names the space manager streams ask for segments (once).
    pub fn set_segment_source(&self, source: Weak<dyn SegmentSource>) {
        let _ = self.segment_source.set(source);
    }

    pub fn pool_id(&self) -> u128 {
        self.pool_id
    }

    pub fn geo(&self) -> &Geometry {
        &self.geo
    }

    pub fn array(&self) -> &dyn Array {
        self.array.as_ref()
    }

    /// The capacity manager, for the space manager above (GC, checkpoint, recovery).
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// Widens the GC's band for a pool whose user writes are paced
    /// ([`capacity::Watermarks::widened_for_pacing`]), which keeps `spare_basis_points` of
    /// its segments spare (as its superblock records them), fitted to the surplus space from
    /// then on ([`capacity::Capacity::fit_paced_band`]).
    pub fn widen_watermarks_for_pacing(&self, spare_basis_points: u32) {
        let total = self.capacity.segments().len() as u64;
        let configured = (total * u64::from(spare_basis_points)).div_ceil(10_000);
        self.capacity.widen_for_pacing(configured.min(total) as u32);
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Buffers for device I/O, recycled.
    pub fn buffers(&self) -> &Arc<crate::util::BufferPool> {
        &self.buffers
    }

    pub fn payloads(&self) -> &Arc<payload::PayloadPool> {
        &self.payloads
    }

    pub fn write_back(&self) -> &write_back::WriteBack {
        &self.write_back
    }

    /// The durable pool metadata; hold the lock while rewriting it with
    /// [`Log::write_pool_meta`].
    pub fn meta(&self) -> &Mutex<PoolMeta> {
        &self.meta
    }

    /// The per-grain checksum table (recovery and checkpoint read and load it whole).
    pub fn crc_table(&self) -> &[AtomicU32] {
        &self.crc_table
    }

    /// Whether every record begun in `segment` so far is durable.
    pub fn segment_durable(&self, segment: u32) -> bool {
        let synced = self.tracker.synced_through();
        self.capacity
            .segment(segment)
            .unsynced_records
            .lock()
            .iter()
            .all(|&(_, id)| id <= synced)
    }

    /// Whether the data at `grain` is durable: the record that holds it is synced.
    pub fn grain_durable(&self, grain: u64) -> bool {
        let segment = self.geo.segment_of(grain);
        let offset = (grain - segment as u64 * self.geo.grains_per_segment as u64) as u32;
        let info = self.capacity.segment(segment);
        let unsynced = info.unsynced_records.lock();
        // The record holding it is the last one that starts at or before it; when that one was
        // pruned, the record is older than every entry left, and durable.
        match unsynced.iter().rev().find(|&&(start, _)| start <= offset) {
            Some(&(_, id)) => id <= self.tracker.synced_through(),
            None => true,
        }
    }

    /// The checksum of the page written at `grain`.
    pub fn set_crc(&self, grain: u64, crc: u32) {
        self.crc_table[grain as usize].store(crc, SeqCst);
    }

    /// What a record-chain walk needs to know about this pool.
    pub fn scan_geometry(&self) -> crate::log::chain::ScanGeometry {
        crate::log::chain::ScanGeometry {
            pool_id: self.pool_id,
            grain_bytes: self.geo.grain_bytes as usize,
            grains_per_segment: self.geo.grains_per_segment,
            rewrite_repairs: !self.read_only,
        }
    }

    /// Whether the array's layout keeps redundancy a damaged page can be rebuilt from (RAID-1,
    /// RAID-5); with members failed, the array finds what is left, or none.
    pub fn has_redundancy(&self) -> bool {
        self.array.kind().tolerated_failures(self.array.members().len() as u32) > 0
    }

    /// A data page of `len` bytes at `grain` that failed checksum `crc` as read: the copy the
    /// array's redundancy holds that passes (rewritten on the member that was wrong unless
    /// the pool is read-only), or `None` when there is none. Recovery and the GC call it, so
    /// that damage on one member is neither taken for a torn write nor moved into a new
    /// segment, where its parity would make it permanent.
    pub fn repair_page(&self, grain: u64, len: usize, crc: u32) -> Option<crate::util::AlignedBuf> {
        if !self.has_redundancy() {
            return None;
        }
        let mut buf = self.buffers.get(len);
        let verify = |b: &[u8]| crc32c::crc32c(b) == crc;
        match self.array.read_repair(grain, &mut buf, &verify, !self.read_only) {
            Ok(true) => Some(buf),
            _ => {
                self.buffers.put(buf);
                None
            }
        }
    }

    /// The bytes the GC moves for the data page at `grain`, read as `bytes`, whose record
    /// gives checksum `crc`: `bytes` when they pass (or the array has no redundancy to ask),
    /// else the copy the redundancy holds that passes. Damaged bytes moved as they are would
    /// get new parity that agrees with them, and the damage would become permanent. When no
    /// copy passes, `bytes` as they are: the page keeps its checksum and its reads still fail.
    pub fn page_to_move<'a>(&self, grain: u64, bytes: &'a [u8], crc: u32) -> std::borrow::Cow<'a, [u8]> {
        if !self.has_redundancy() || crc32c::crc32c(bytes) == crc {
            return std::borrow::Cow::Borrowed(bytes);
        }
        match self.repair_page(grain, bytes.len(), crc) {
            Some(good) => std::borrow::Cow::Owned(good.to_vec()),
            None => std::borrow::Cow::Borrowed(bytes),
        }
    }

    /// Walks the record chain of `segment` on the device (see [`crate::log::chain::walk_segment`]).
    pub fn walk_segment(&self, segment: u32, visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8])) -> Result<Option<SegmentHeader>> {
        crate::log::chain::walk_segment(self.array(), &self.buffers, &self.scan_geometry(), segment, false, visit)
    }

    /// [`Log::walk_segment`] of a GC victim: a sealed segment, known to hold records, read
    /// whole in one request rather than its first page first.
    pub fn walk_victim(&self, segment: u32, visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8])) -> Result<Option<SegmentHeader>> {
        let (header, bytes_read) =
            crate::log::chain::walk_victim_whole(self.array(), &self.buffers, &self.scan_geometry(), segment, visit)?;
        self.counters.gc_bytes_read.fetch_add(bytes_read, SeqCst);
        Ok(header)
    }

    /// A GC victim's walk that reads only the data pages `live(meta, slot, entry)` asks for
    /// when they are a small part of it (see [`crate::log::chain::walk_victim_live`]); `visit` is
    /// told which pages were read.
    pub fn walk_victim_live(
        &self,
        segment: u32,
        live: impl FnMut(&RecordMeta, usize, &crate::format::MetaEntry) -> bool,
        visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8], &crate::log::chain::HeldPages<'_>),
    ) -> Result<Option<SegmentHeader>> {
        let valid_grains = self.capacity.segment(segment).valid_grains.load(SeqCst);
        let (header, bytes_read) = crate::log::chain::walk_victim_live(
            self.array(),
            &self.buffers,
            &self.scan_geometry(),
            segment,
            valid_grains,
            live,
            visit,
        )?;
        self.counters.gc_bytes_read.fetch_add(bytes_read, SeqCst);
        Ok(header)
    }

    // ----- errors -----

    /// Makes the pool refuse writes until reopened, remembering why.
    pub fn poison(&self, e: &Error) {
        let mut p = self.poison.lock();
        if p.is_none() {
            tracing::error!("pool poisoned: {e}");
            // A poisoning error already says why in full: kept as it is, so that the errors
            // that follow do not wrap "read-only after an earlier I/O error" in itself.
            *p = Some(match e {
                Error::Poisoned(why) => why.clone(),
                e => e.to_string(),
            });
        }
        self.poisoned.store(true, SeqCst);
        self.capacity.changed.notify_all();
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(SeqCst)
    }

    pub fn check_not_poisoned(&self) -> Result<()> {
        if self.is_poisoned() {
            let why = self.poison.lock().clone().unwrap_or_default();
            return Err(Error::Poisoned(why));
        }
        Ok(())
    }

    pub fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly("the pool".into()));
        }
        self.check_not_poisoned()
    }

    // ----- sequence numbers -----

    /// Next data sequence number. Numbers are `epoch << 32 | counter`; near the end of an
    /// epoch a new one is made durable first, so numbers never repeat across sessions.
    pub fn next_seq(&self) -> u64 {
        let s = self.seq.fetch_add(1, SeqCst);
        let mask = (1u64 << SEQ_EPOCH_SHIFT) - 1;
        if s & mask >= mask - (1 << 24) {
            if let Err(e) = self.advance_epoch(s >> SEQ_EPOCH_SHIFT) {
                self.poison(&e);
            }
        }
        s
    }

    /// Current sequence number, for ages.
    pub fn now_seq(&self) -> u64 {
        self.seq.load(SeqCst)
    }

    fn advance_epoch(&self, old_epoch: u64) -> Result<()> {
        let _g = self.epoch_lock.lock();
        if self.seq.load(SeqCst) >> SEQ_EPOCH_SHIFT != old_epoch {
            return Ok(());
        }
        let mut meta = self.meta.lock();
        self.write_pool_meta(&mut meta)?;
        self.seq.fetch_max(meta.generation << SEQ_EPOCH_SHIFT | 1, SeqCst);
        Ok(())
    }

    /// Writes the pool metadata into the slot after the current one on every member that
    /// keeps a copy, and syncs it.
    pub fn write_pool_meta(&self, meta: &mut PoolMeta) -> Result<()> {
        // A member that fails the write is failed through the array while the array survives
        // it, and the others still get the metadata: a disk that dies as the metadata is
        // written is a failed member, not a reason to stop a redundant pool.
        write_meta_slot_or(&self.array.metadata_devices(), meta, &|dev, e| {
            self.array.metadata_write_failed(dev, e)
        })
    }

    /// [`Log::write_pool_meta`] for a change the log must not go on without (the members'
    /// failures, the log members, the parity buffer gone): a failure poisons the pool.
    fn write_pool_meta_or_poison(&self, meta: &mut PoolMeta) -> Result<()> {
        self.write_pool_meta(meta).inspect_err(|e| self.poison(e))
    }

    /// Before a stream writes `segment`: the members holding it join the pool metadata's log
    /// members, durably, unless they are there already. Only a member outside that list may be
    /// missing at open (see `check_missing_hold_no_log` in `pool/open.rs`), so it must be in it
    /// before any record can be durable on it. (A checkpoint does not count: one that cannot
    /// be read is replaced by a scan of the records.)
    pub fn note_log_segment(&self, segment: u32) -> Result<()> {
        let ids = self.array.segment_member_ids(segment);
        let mut meta = self.meta.lock();
        let Some(known) = &meta.log_members else {
            return Ok(());
        };
        if ids.iter().all(|id| known.contains(id)) {
            return Ok(());
        }
        let mut next = meta.clone();
        let list = next.log_members.get_or_insert_with(Vec::new);
        for id in ids {
            if !list.contains(&id) {
                list.push(id);
            }
        }
        self.write_pool_meta_or_poison(&mut next)?;
        self.array.set_log_members(next.log_members.as_deref());
        *meta = next;
        Ok(())
    }

    /// [`Capacity::try_allocate`] that never hands out a segment of a member that failed (the
    /// segments it finds there go offline instead).
    pub fn allocate_online(&self, types: &[StorageType], purpose: Purpose) -> Option<u32> {
        loop {
            let s = self.capacity.try_allocate(types, purpose)?;
            if !self.array.is_segment_offline(s) {
                return Some(s);
            }
            self.capacity.take_offline(s);
        }
    }

    /// The order a checkpoint takes segments in: [`CHECKPOINT_TYPES`], types of members that
    /// hold log data first, so that the checkpoint is there when the pool opens without a
    /// hybrid volume's fast device (which holds copies only; a checkpoint left there is
    /// replaced by a scan).
    pub fn checkpoint_types(&self) -> Vec<StorageType> {
        let meta = self.meta.lock();
        let Some(known) = &meta.log_members else {
            return CHECKPOINT_TYPES.to_vec();
        };
        let ids = self.array.member_ids();
        let logged: Vec<StorageType> = self
            .array
            .members()
            .iter()
            .enumerate()
            .filter(|(i, _)| ids.get(*i).is_some_and(|id| known.contains(id)))
            .map(|(_, m)| m.device.storage_type())
            .collect();
        let (mut first, rest): (Vec<StorageType>, Vec<StorageType>) = CHECKPOINT_TYPES.iter().partition(|t| logged.contains(t));
        first.extend(rest);
        first
    }

    // ----- streams -----

    /// Registers a volume's streams: flushes, GC releases and the usable-space limit count
    /// them from now on.
    pub fn add_streams(&self, volume_id: u32, streams: Arc<Streams>) {
        self.streams.write().insert(volume_id, streams);
    }

    /// Seals and writes every open record of a volume's streams, closes their segments and
    /// forgets them (volume deletion, or a change of its placement policy).
    pub fn remove_streams(&self, volume_id: u32) -> Result<()> {
        let Some(s) = self.streams.read().get(&volume_id).cloned() else {
            return Ok(());
        };
        for r in s.close(self) {
            self.write_record(r)?;
        }
        self.streams.write().remove(&volume_id);
        Ok(())
    }

    fn streams_snapshot(&self) -> Vec<Arc<Streams>> {
        self.streams.read().values().cloned().collect()
    }

    /// Seals and writes every open record and closes every open segment (clean shutdown: after
    /// this nothing moves).
    pub fn close_all_streams(&self) -> Result<()> {
        for s in self.streams_snapshot() {
            for r in s.close(self) {
                self.write_record(r)?;
            }
        }
        Ok(())
    }

    /// A segment for a stream, from the space manager above.
    fn allocate_segment(&self, purpose: Purpose, types: &'static [StorageType]) -> Result<u32> {
        match self.segment_source.get().and_then(Weak::upgrade) {
            Some(source) => source.allocate_segment(purpose, types),
            // Nothing is written before the engine attaches (opening only reads) or after it
            // is gone; a write then is a bug in the caller, refused rather than done without
            // throttling or GC.
            None => Err(Error::InvalidConfig(
                "internal: a segment was asked for with no space manager attached to the log".into(),
            )),
        }
    }

    /// Makes a freshly allocated segment writable from its start (resets its zone); a failure
    /// poisons the log.
    pub fn prepare_segment(&self, s: u32) -> Result<()> {
        self.array.prepare_segment(s).inspect_err(|e| self.poison(e))
    }

    // ----- records and flush -----

    /// Writes a sealed record to the device and marks it complete.
    pub fn write_record(&self, r: SealedRecord) -> Result<()> {
        let gb = self.geo.grain_bytes as usize;
        let len = (r.used_grains + r.pad_grains) as usize * gb;
        let res = {
            // One piece when the record holds no payload pages, else its pieces in order,
            // then the padding.
            // The parity its writers computed as they filled it, taken before the bytes are
            // read for the write (nothing adds to it once it is sealed).
            let parity = r.buf.bytes.write().parity.take();
            let bytes = r.buf.bytes.read();
            let mut slices = bytes.io_slices(r.used_grains, gb);
            let mut pad = r.pad_grains as usize * gb;
            let zeros = crate::util::shared_zeros();
            while pad > 0 {
                let n = pad.min(zeros.len());
                slices.push(std::io::IoSlice::new(&zeros[..n]));
                pad -= n;
            }
            self.array.write_vectored_with_parity(r.buf.first_grain, &slices, parity)
        };
        match res {
            Ok(()) => {
                self.capacity
                    .segment(r.buf.segment)
                    .records
                    .lock()
                    .retain(|x| !Arc::ptr_eq(x, &r.buf));
                self.counters.device_bytes_written.fetch_add(len as u64, SeqCst);
                self.tracker.complete(r.buf.record_id);
                Ok(())
            }
            Err(e) => {
                // The record stays registered so that reads keep returning the acknowledged
                // data until the pool is reopened.
                self.poison(&e);
                self.tracker.complete(r.buf.record_id);
                Err(e)
            }
        }
    }

    /// Makes every write that returned before this call durable, data and map.
    pub fn flush(&self) -> Result<()> {
        self.check_not_poisoned()?;
        self.counters.flushes.fetch_add(1, SeqCst);
        let target = self.tracker.last_id();
        self.write_held_gc_records()?;
        let user_records = self.seal_and_write(|_| true)?;
        self.note_flush(user_records > 0);
        self.sync_through(target)
    }

    /// Makes every write to volume `volume_id` that returned before this call durable, data
    /// and map, and leaves the open records nothing needs alone: other volumes' user records
    /// (their writers flush their own volumes) and the GC's moves, whose sources stay on the
    /// device until a release makes the moves durable first ([`Log::sync_for_release`]).
    ///
    /// Why: a flush that sealed every stream cut every open record of the pool short at each
    /// commit of any database on it, so each record carried a metadata page for a few data
    /// pages, the GC's relocations reached the device a few pages at a time between the users'
    /// records, and an SSD below mixed data that dies at different times in its erase blocks
    /// (`salsa bench-device --volumes 4 --flush-every 16K`, docs/BENCHMARKS.md).
    ///
    /// A record left open keeps its id, so `synced_through` (a prefix of ids) may stay behind
    /// this flush's records: this flush waits for the sealed records themselves and for a sync
    /// begun after them instead. What a stalled prefix costs is only caution, never loss: a
    /// segment is reused only past the prefix, and recovery takes a record past the prefix
    /// that is whole on the device (every page's checksum matches), as a flushed one is.
    ///
    /// A parity array that pads flushes to its rows flushes the whole pool (its row rule
    /// reasons about every stream at a flush).
    pub fn flush_volume(&self, volume_id: u32) -> Result<()> {
        if self.flush_alignment() > 1 {
            return self.flush();
        }
        self.check_not_poisoned()?;
        self.counters.flushes.fetch_add(1, SeqCst);
        let user_records = self.seal_and_write(|r| match r.meta.stream {
            StreamKind::User(_) => r.meta.volume_id == volume_id,
            StreamKind::Gc(_) => false,
            StreamKind::Checkpoint => true,
        })?;
        self.note_flush(user_records > 0);
        self.sync_sealed(None)?;
        self.release_synced();
        Ok(())
    }

    /// Waits for every record sealed so far to reach the device, then makes sure a sync that
    /// began after that covers them (sharing one begun meanwhile by another caller, counted in
    /// `shared`); `false` when the log was poisoned meanwhile.
    fn sync_sealed(&self, shared: Option<&AtomicU64>) -> Result<bool> {
        let in_flight = self.tracker.sealed_in_flight();
        if !self.tracker.wait_all_complete(&in_flight, || self.is_poisoned()) {
            return self.check_not_poisoned().map(|_| false);
        }
        self.check_not_poisoned()?;
        // Group commit: a sync that began after the records above were on the device covers
        // them (syncs run under the lock, so it has ended; had it failed, the log is poisoned).
        let begun_before = self.tracker.syncs_begun();
        {
            let _s = self.tracker.sync_lock.lock();
            if self.tracker.syncs_begun() == begun_before {
                self.sync_devices()?;
            } else if let Some(shared) = shared {
                shared.fetch_add(1, SeqCst);
            }
        }
        self.check_not_poisoned()?;
        Ok(true)
    }

    /// Seals the open record of every stream that `which` picks and writes them (without a
    /// sync); returns how many of them were user records.
    fn seal_and_write(&self, which: impl Fn(&record::OpenRecord) -> bool) -> Result<u64> {
        let mut user_records = 0;
        for s in self.streams_snapshot() {
            for r in s.seal_matching(self, &which) {
                user_records += u64::from(r.user);
                self.write_record(r)?;
            }
        }
        Ok(user_records)
    }

    // ----- write-behind -----

    /// Whether the writers have flushed after their writes lately, no write is under way, and
    /// a flush would not pad (an array that pads a flush to its stripe would pad every
    /// write): then the open user records are best written at once ([`Log::write_ahead`]).
    pub fn write_behind_due(&self) -> bool {
        self.writers_flush_every_write() && self.flush_alignment() <= 1 && !self.invalidations_in_flight()
    }

    /// Whether the writers have flushed after their writes lately (see [`WriteBehind`]).
    pub fn writers_flush_every_write(&self) -> bool {
        self.write_behind.score.load(SeqCst) >= WriteBehind::MIN_SCORE
    }

    /// Takes the turn of a write-ahead that [`Log::write_behind_due`] allowed: refused when a
    /// write-ahead since the last flush already went unflushed and halving the score for it
    /// takes it below the threshold (the writers do not flush after every write).
    pub fn claim_write_ahead(&self) -> bool {
        let wb = &self.write_behind;
        if wb.unflushed.swap(true, SeqCst) {
            let before = wb.score.fetch_update(SeqCst, SeqCst, |s| Some(s / 2)).unwrap_or(0);
            return before / 2 >= WriteBehind::MIN_SCORE;
        }
        true
    }

    /// Seals every open user record, as a flush would, and writes them; syncs nothing.
    pub fn write_ahead(&self) -> Result<()> {
        self.check_writable()?;
        let written = self.seal_and_write(|r| matches!(r.meta.stream, StreamKind::User(_)))?;
        self.counters.records_written_ahead.fetch_add(written, SeqCst);
        Ok(())
    }

    /// Counts a user write for [`WriteBehind`]: enough of them without a flush mean the
    /// writers do not flush after every write.
    pub fn note_user_write(&self) {
        let wb = &self.write_behind;
        if wb.writes.fetch_add(1, SeqCst) + 1 == WriteBehind::MAX_UNFLUSHED_WRITES {
            wb.score.store(0, SeqCst);
        }
    }

    /// A flush follows writes when it sealed user records or records were written ahead.
    fn note_flush(&self, sealed_user_records: bool) {
        self.write_behind.writes.store(0, SeqCst);
        let ahead = self.write_behind.unflushed.swap(false, SeqCst);
        if sealed_user_records || ahead {
            let _ = self
                .write_behind
                .score
                .fetch_update(SeqCst, SeqCst, |s| Some((s + 1).min(WriteBehind::MAX_SCORE)));
        }
    }

    /// Waits for records up to `target` and syncs the devices (shared by concurrent callers).
    fn sync_through(&self, target: u64) -> Result<()> {
        if !self.tracker.wait_complete_through(target, || self.is_poisoned()) {
            return self.check_not_poisoned();
        }
        self.check_not_poisoned()?;
        let guard = self.tracker.sync_lock.lock();
        if self.tracker.synced_through() < target {
            self.sync_devices()?;
        }
        drop(guard);
        self.release_synced();
        Ok(())
    }

    /// Syncs every device and publishes how far records are durable. The caller holds the
    /// sync lock, so syncs do not overlap and `synced_through` only covers records that were
    /// complete before this sync began. A failure poisons the pool.
    fn sync_devices(&self) -> Result<()> {
        self.tracker.sync_begins();
        let upto = self.tracker.complete_through();
        let t = std::time::Instant::now();
        let r = self.array.sync_all();
        self.counters.sync_micros.fetch_add(t.elapsed().as_micros() as u64, SeqCst);
        if let Err(e) = r {
            self.poison(&e);
            return Err(e);
        }
        self.counters.syncs.fetch_add(1, SeqCst);
        // A member that failed since the last sync is recorded as failed before the writes
        // that went around it count as durable: a reopened pool must not trust it again.
        self.record_failure_change()?;
        self.record_parity_buffer_failure()?;
        self.tracker.set_synced_through(upto);
        Ok(())
    }

    /// Writes the set of failed members to the pool metadata if a member failed since it was
    /// last written, and takes the free segments of a failed member offline. Every sync does
    /// it; a member failed on request does it at once, since a request on an idle pool may
    /// be followed by no sync at all before the pool closes.
    pub fn record_failure_change(&self) -> Result<()> {
        if let Some(failed) = self.array.take_failure_change() {
            let mut meta = self.meta.lock();
            let mut next = meta.clone();
            next.failed_members = failed;
            next.rebuild = next.rebuild.map(|r| crate::array::naming_outgoing(self.array.as_ref(), r));
            self.write_pool_meta_or_poison(&mut next)?;
            *meta = next;
            drop(meta);
            self.capacity.take_free_offline(|s| self.array.is_segment_offline(s));
        }
        Ok(())
    }

    /// Grains a record sealed for a flush ends on, from its segment's start (see
    /// [`Array::flush_alignment_grains`]).
    pub(super) fn flush_alignment(&self) -> u32 {
        self.flush_alignment_grains.load(SeqCst)
    }

    /// When the RAID-5 parity buffer went out of service: flushes pad to whole rows from now
    /// on, and the pool metadata records that the pool has no buffer, so that a restart does
    /// not wait for the failed device. (Rows a buffer kept until now are re-derived by
    /// recovery from the members after a crash, as for a pool that never had one.)
    pub(crate) fn record_parity_buffer_failure(&self) -> Result<()> {
        let Some(why) = self.array.take_parity_buffer_failure() else {
            return Ok(());
        };
        self.flush_alignment_grains
            .store(self.array.flush_alignment_grains(self.geo.grain_bytes), SeqCst);
        let mut meta = self.meta.lock();
        let mut next = meta.clone();
        next.parity_buffer_id = 0;
        self.write_pool_meta_or_poison(&mut next)?;
        *meta = next;
        tracing::warn!("the pool no longer uses its parity buffer ({why})");
        Ok(())
    }

    /// For a GC release: seals and writes every open record holding GC moves and every open
    /// record up to `kill_through` (they made entries of the released victims dead), waits for
    /// every sealed record still in flight, and syncs. User streams stay open otherwise (a full
    /// flush would cut their records short for nothing). `false` when the log was poisoned
    /// meanwhile.
    pub fn sync_for_release(&self, kill_through: u64) -> Result<bool> {
        // On a parity array without a parity buffer, a record that starts inside a row shares
        // it with records before it, which may hold moves or kills: the row is completed
        // (the record sealed and padded to the row's end) so that they are redundant once
        // durable. Otherwise a member lost after the crash would take the only copy of data
        // flushed long before, moved into a row that never got its parity.
        let align = self.flush_alignment();
        let mid_row = |r: &record::OpenRecord| align > 1 && !r.meta.start_grain.is_multiple_of(align);
        self.write_held_gc_records()?;
        self.seal_and_write(|r| r.gc_moves || r.buf.record_id <= kill_through || mid_row(r))?;
        self.sync_sealed(Some(&self.counters.releases_sharing_a_sync))
    }

    /// Frees the pending segments that the last sync covered (and any other released ones),
    /// discarding them on the devices first when discards are on.
    pub fn release_synced(&self) -> usize {
        let n = self.capacity.release_synced(self.tracker.synced_through());
        self.discard_released();
        n
    }

    /// Discards the released segments waiting for it and frees them. A device's error is
    /// counted and logged, and the segment freed all the same: a discard only helps the
    /// device, the data it covers is dead.
    ///
    /// Where a discard makes the next write of the segment allocate again (a hole punched in
    /// a regular file), the pool keeps one [`PLENTIFUL_FREE_DIVISOR`]th of its segments free
    /// without discarding them, and discards only the free segments beyond that: those below
    /// it are reused within moments, and the discard would buy nothing but that allocation
    /// (on this machine's ext4 it halved the throughput of sequential overwrites;
    /// docs/BENCHMARKS.md). A large release (a volume trimmed) still gives most of its
    /// space back.
    ///
    /// Segments kept are freed at once, the others a few at a time as their discards finish,
    /// so that writers waiting for space never wait for a whole batch of discards.
    fn discard_released(&self) {
        let segments = self.capacity.take_to_discard();
        if segments.is_empty() {
            return;
        }
        let keep_free = self.geo.total_segments.div_ceil(PLENTIFUL_FREE_DIVISOR);
        // Counted without the free segments over holes: those are what filling writes again
        // (`Log::fill_holes`, up to half this share), so a segment punched while holes made
        // free space look plentiful was filled again moments later.
        let mut to_keep = keep_free.saturating_sub(self.capacity.free_and_hole_counts().0);
        let (kept, to_discard): (Vec<u32>, Vec<u32>) = segments.iter().partition(|&&s| {
            let keep = to_keep > 0 && self.array.discard_reallocates(s);
            to_keep -= keep as u32;
            keep
        });
        self.counters.discards_skipped.fetch_add(kept.len() as u64, SeqCst);
        self.capacity.finish_discard(&kept);
        for chunk in to_discard.chunks(DISCARDS_PER_RELEASE) {
            for &s in chunk {
                match self.array.discard_segment(s) {
                    Ok(()) => {
                        if self.array.discard_reallocates(s) {
                            let info = self.capacity.segment(s);
                            info.hole.store(true, SeqCst);
                            info.punched.store(true, SeqCst);
                        }
                        self.counters.discarded_bytes.fetch_add(self.geo.segment_bytes, SeqCst);
                    }
                    Err(e) => {
                        if self.counters.discard_errors.fetch_add(1, SeqCst) == 0 {
                            tracing::warn!("discard of segment {s} failed (further failures are only counted): {e}");
                        }
                    }
                }
            }
            self.capacity.finish_discard(chunk);
        }
    }

    /// Marks the free segments that lie over holes of their pool file (after open), so that
    /// they are handed out last and [`Log::fill_holes`] fills them.
    pub fn mark_free_holes(&self) {
        let array = &self.array;
        self.capacity
            .mark_free_holes(|s| array.discard_reallocates(s) && array.segment_has_hole(s));
    }

    /// Fills one batch of free segments that lie over holes of their pool file with zeros,
    /// then syncs; whether it filled any.
    ///
    /// Why: a log writes each segment of a sparse (or punched) pool file into unallocated
    /// space, so the file system allocates at the write and commits its journal at the next
    /// flush; a writer that flushes every few pages (a database) pays that commit on every
    /// flush (1.4x the flush rate measured on this machine's ext4 once the space is written:
    /// docs/BENCHMARKS.md). Free segments with holes are handed out last, and this keeps a
    /// sixteenth of the pool ([`FILLED_FREE_DIVISOR`]) free and filled, so the allocation and
    /// its journal commit happen here, in the background, not under a writer's flush. It
    /// takes only segments beyond the release watermark, so writers are never short of space
    /// because of it; a segment being filled is off the free queues (counted as discarding),
    /// so nothing writes it meanwhile. Zeros are
    /// what a discarded free segment may read as: nothing a reader or recovery relies on
    /// changes. A write error stops filling for this session (and is logged); a failed
    /// sync poisons the pool as any failed sync does.
    pub fn fill_holes(&self) -> Result<bool> {
        if self.hole_fill_stopped.load(SeqCst) || self.is_poisoned() {
            return Ok(false);
        }
        let keep_filled = self.geo.total_segments.div_ceil(FILLED_FREE_DIVISOR);
        let batch = (HOLE_FILL_BATCH_BYTES / self.geo.segment_bytes).max(1) as u32;
        let segments = self.capacity.take_holes_to_fill(batch, keep_filled);
        if segments.is_empty() {
            return Ok(false);
        }
        let mut filled = 0;
        for &s in &segments {
            if let Err(e) = self.array.fill_segment(s) {
                tracing::warn!("filling the holes of free segment {s} failed; holes are no longer filled this session: {e}");
                self.hole_fill_stopped.store(true, SeqCst);
                break;
            }
            filled += 1;
        }
        // Synced so that the file system commits the allocation here rather than in a
        // writer's flush; without the log's sync lock, so that no flush waits behind the
        // zeros' write-back (this sync makes no record durable that a flush needs).
        let synced = if filled > 0 {
            self.array.sync_all().inspect_err(|e| self.poison(e))
        } else {
            Ok(())
        };
        if synced.is_ok() {
            for &s in &segments[..filled] {
                self.capacity.segment(s).hole.store(false, SeqCst);
            }
            self.counters
                .hole_fill_bytes
                .fetch_add(filled as u64 * self.geo.segment_bytes, SeqCst);
        }
        self.capacity.finish_discard(&segments);
        synced.map(|()| filled > 0)
    }

    /// The id of the last record begun (every record with a lower id came before it).
    pub fn last_record_id(&self) -> u64 {
        self.tracker.last_id()
    }

    /// Waits until the records still unwritten in `segment` (sealed, queued for write-back)
    /// are on the device; `false` when the log was poisoned meanwhile.
    pub fn wait_segment_written(&self, segment: u32) -> bool {
        let in_flight: Vec<u64> = self.capacity.segment(segment).records.lock().iter().map(|r| r.record_id).collect();
        // A record of a sealed segment that is not marked sealed is held for a GC burst (a
        // stream writes its held records when it closes their segment; this covers any path
        // that closes one without a record): write them rather than wait for the burst.
        if !self.tracker.all_sealed(&in_flight) && self.write_held_gc_records().is_err() {
            return false;
        }
        in_flight.is_empty() || self.tracker.wait_all_complete(&in_flight, || self.is_poisoned())
    }

    // ----- segments -----

    /// Holds segment `s` in use while a rebuild or a scrub copies it from member to member
    /// (see [`Capacity::hold`]): `None` when it is free, or was reused since `generation`.
    pub fn hold_segment(&self, s: u32, generation: Option<u64>) -> Option<SegmentHold<'_>> {
        self.capacity.hold(s, generation).then(|| SegmentHold { log: self, segment: s })
    }

    /// A stream is done with its open segment.
    pub fn seal_segment(&self, s: u32) {
        let info = self.capacity.segment(s);
        info.sealed_seq.store(self.now_seq(), SeqCst);
        let ok = info.cas_state(SegmentState::Staged, SegmentState::Allocated);
        assert!(ok, "sealing segment {s} that is not staged");
        if info.is_empty() {
            self.capacity.retire(s, SegmentState::Allocated, self.tracker.last_id(), false);
        }
    }

    /// Called when a segment's counts reached zero.
    fn segment_emptied(&self, s: u32) {
        if self.capacity.segment(s).state() == SegmentState::Allocated {
            self.capacity.retire(s, SegmentState::Allocated, self.tracker.last_id(), false);
        }
    }

    /// The placement policies' view of a segment.
    pub fn segment_view(&self, s: u32) -> SegmentView {
        let info = self.capacity.segment(s);
        SegmentView {
            segment: s,
            stream: info.stream_kind(),
            opened_seq: info.opened_seq.load(SeqCst),
            sealed_seq: info.sealed_seq.load(SeqCst),
        }
    }

    // ----- live-data accounting -----

    /// `grains` grains of live data in `segment` died; record `killer` (when given) made them
    /// dead, so a GC release of the segment waits for it. An emptied sealed segment is retired.
    pub fn drop_data(&self, segment: u32, grains: u32, killer: Option<u64>) {
        if let Some(k) = killer {
            self.note_killer(segment, k);
        }
        if self.capacity.sub_valid(segment, grains) {
            self.segment_emptied(segment);
        }
    }

    /// Record `killer` made an entry that maps into `segment` dead, though the data it named
    /// stays live for other owners (a page leaving a shared grain): the segment's release
    /// waits for the record, as for [`Log::drop_data`], or a crash that lost the record would
    /// leave the page's old entry naming a grain already rewritten.
    pub fn note_killer(&self, segment: u32, killer: u64) {
        self.capacity.segment(segment).last_kill_record.fetch_max(killer, SeqCst);
    }

    /// A tombstone in `segment` became live.
    pub fn add_tombstone(&self, segment: u32) {
        self.capacity.add_tombstone(segment);
    }

    /// A live tombstone in `segment` died, as [`Log::drop_data`].
    pub fn drop_tombstone(&self, segment: u32, killer: Option<u64>) {
        if let Some(k) = killer {
            self.note_killer(segment, k);
        }
        if self.capacity.sub_tombstone(segment) {
            self.segment_emptied(segment);
        }
    }

    /// Grains mapped across all volumes changed by `delta`.
    pub fn add_mapped_grains(&self, delta: i64) {
        if delta >= 0 {
            self.mapped_grains.fetch_add(delta as u64, SeqCst);
        } else {
            self.mapped_grains.fetch_sub(delta.unsigned_abs(), SeqCst);
        }
    }

    pub fn mapped_grains(&self) -> u64 {
        self.mapped_grains.load(SeqCst)
    }

    /// The write buffer took (`delta > 0`) or gave back room for pages it holds that no
    /// controller maps yet (see [`Log::check_room`]).
    pub fn add_reserved_grains(&self, delta: i64) {
        if delta >= 0 {
            self.reserved_grains.fetch_add(delta as u64, SeqCst);
        } else {
            let prev = self.reserved_grains.fetch_sub(delta.unsigned_abs(), SeqCst);
            assert!(prev >= delta.unsigned_abs(), "the write buffer gave back more room than it took");
        }
    }

    /// Grains the write buffer holds room for.
    pub fn reserved_grains(&self) -> u64 {
        self.reserved_grains.load(SeqCst)
    }

    /// Sets the mapped grains (recovery, after deriving them from the maps).
    pub fn set_mapped_grains(&self, grains: u64) {
        self.mapped_grains.store(grains, SeqCst);
    }

    /// Held by a write or trim from before it replaces map entries until it has accounted for
    /// the places they left.
    pub fn invalidation_guard(&self) -> InvalidationGuard<'_> {
        self.invalidations_in_flight.fetch_add(1, SeqCst);
        InvalidationGuard(self)
    }

    /// Whether writes or trims are between replacing a map entry and accounting for it.
    pub fn invalidations_in_flight(&self) -> bool {
        self.invalidations_in_flight.load(SeqCst) > 0
    }

    // ----- reads -----

    /// Keeps up to `capacity_bytes` of pages read from the devices in memory (0: none). Called
    /// once, at open.
    pub fn enable_read_cache(&self, capacity_bytes: u64) {
        if capacity_bytes > 0 {
            let _ = self
                .read_cache
                .set(read_cache::ReadCache::new(capacity_bytes, self.geo.grain_bytes as u64));
        }
    }

    /// Whether pages are cached (writers then offer theirs, see [`Log::cache_written`]).
    pub fn caches_reads(&self) -> bool {
        self.read_cache.get().is_some()
    }

    /// The generation of the segment holding `grain` now: taken when a page is placed there,
    /// it keys the page's copy in the read cache.
    pub fn generation_of(&self, grain: u64) -> u64 {
        self.capacity.segment(self.geo.segment_of(grain)).generation.load(SeqCst)
    }

    /// Offers the read cache a page just written at `grain` (in segment generation
    /// `generation`, taken when it was placed): data read back soon after it was written, as
    /// a file system or database does, then comes from memory.
    pub fn cache_written(&self, grain: u64, generation: u64, page: &[u8]) {
        if let Some(c) = self.read_cache.get() {
            c.insert(grain, generation, page);
        }
    }

    /// The page at `grain` is dead (overwritten or trimmed): its cached copy goes.
    pub fn cache_forget(&self, grain: u64) {
        if let Some(c) = self.read_cache.get() {
            c.forget(grain, self.generation_of(grain));
        }
    }

    /// The GC moved the page at `from` to `to` (placed in generation `to_generation`): a
    /// cached copy follows it.
    pub fn cache_moved(&self, from: u64, to: u64, to_generation: u64) {
        if let Some(c) = self.read_cache.get() {
            if let Some(page) = c.remove(from, self.generation_of(from)) {
                c.insert_shared(to, to_generation, page);
            }
        }
    }

    /// Counts read-cache hits of a memory-only read that was kept (see
    /// [`memory_reads::memory_only`]).
    pub fn count_cache_hits(&self, n: u64) {
        if let Some(c) = self.read_cache.get().filter(|_| n > 0) {
            c.count_hits(n);
        }
    }

    /// What the read cache did, if there is one.
    pub fn read_cache_stats(&self) -> Option<read_cache::ReadCacheStats> {
        self.read_cache.get().map(|c| c.stats())
    }

    /// Reads the page at physical grain `grain` into `out` (from an unwritten record's buffer,
    /// or the device) and checks it against its checksum. `still_mapped` is asked after the
    /// segment's generation is noted and before the bytes are read: whether the caller's map
    /// still points at `grain`.
    pub fn read_page(&self, grain: u64, out: &mut [u8], still_mapped: impl FnOnce() -> bool) -> Result<PageRead> {
        let gb = self.geo.grain_bytes as usize;
        let info = self.capacity.segment(self.geo.segment_of(grain));
        let generation = info.generation.load(SeqCst);
        if !still_mapped() {
            return Ok(PageRead::Moved);
        }
        let crc = self.crc_table[grain as usize].load(SeqCst);
        let cache = self.read_cache.get();
        if cache.is_some_and(|c| c.get(grain, generation, crc, out)) {
            return Ok(if info.generation.load(SeqCst) == generation {
                PageRead::Intact
            } else {
                PageRead::Moved
            });
        }
        let buffered = {
            let recs = info.records.lock();
            recs.iter().any(|r| r.read(grain, gb, out))
        };
        if !buffered {
            memory_reads::allow_device_read()?;
            let verify = |b: &[u8]| crc32c::crc32c(b) == crc;
            // A page that fails its checksum on one member is read from the array's
            // redundancy where it has some, and rewritten unless the pool is read-only. The
            // segment is held meanwhile: reused under the repair, its new owner's page would
            // get the old one written over it on one member.
            let read = |buf: &mut [u8]| -> Result<()> {
                self.array.read(grain, buf)?;
                if !verify(buf) {
                    if let Some(_hold) = self.hold_segment(self.geo.segment_of(grain), Some(generation)) {
                        self.array.read_repair(grain, buf, &verify, !self.read_only)?;
                    }
                }
                Ok(())
            };
            if self.array.needs_aligned_buffers() {
                let mut tmp = self.buffers.get(out.len());
                let r = read(&mut tmp);
                out.copy_from_slice(&tmp);
                self.buffers.put(tmp);
                r?;
            } else {
                read(out)?;
            }
        }
        if info.generation.load(SeqCst) != generation {
            return Ok(PageRead::Moved); // the segment was reused under us; the map has moved on
        }
        if crc32c::crc32c(out) != crc {
            return Ok(PageRead::Damaged);
        }
        if let Some(c) = cache.filter(|_| !buffered) {
            c.insert(grain, generation, out);
        }
        Ok(PageRead::Intact)
    }

    /// Reads pages stored at ascending physical grains `grains`, all in one segment and close
    /// together (a record's metadata page may sit between two), into `outs` (one buffer per
    /// page, as long as the page's stored bytes: a whole page, or a compressed page's grains)
    /// with one device read of the span, and checks each against its checksum: a file read
    /// sequentially costs a disk one seek, not one per page or record.
    /// `still_mapped(i)` tells, after the segment's generation is noted, whether the caller's
    /// map still points page `i` at `grains[i]`. Returns per page what it found; the caller
    /// reads a `Moved` or `Damaged` page again with [`Log::read_page`] (which repairs from
    /// redundancy). `None` when some of the span is still in records being written (the
    /// caller then reads page by page).
    pub fn read_run(&self, grains: &[u64], outs: &mut [&mut [u8]], still_mapped: impl Fn(usize) -> bool) -> Result<Option<Vec<PageRead>>> {
        let gb = self.geo.grain_bytes as u64;
        let (Some(&first), Some(&last)) = (grains.first(), grains.last()) else {
            return Ok(Some(Vec::new()));
        };
        let n = grains.len();
        // The pages do not overlap, so the last ends the span.
        let page_grains = (outs[n - 1].len() as u64).div_ceil(gb);
        let info = self.capacity.segment(self.geo.segment_of(first));
        assert_eq!(
            self.geo.segment_of(first),
            self.geo.segment_of(last + page_grains - 1),
            "a run stays in one segment"
        );
        // Records of the span not yet on the device are read page by page (from their buffers);
        // the segment's open record, further on, does not keep the span from one device read.
        if info.records.lock().iter().any(|r| r.overlaps(first, last + page_grains)) {
            return Ok(None);
        }
        let generation = info.generation.load(SeqCst);
        let mut found: Vec<PageRead> = (0..n)
            .map(|i| if still_mapped(i) { PageRead::Intact } else { PageRead::Moved })
            .collect();
        let crc_of = |i: usize| self.crc_table[grains[i] as usize].load(SeqCst);
        // Pages the DRAM cache has need no device read; when it has them all, none is done.
        let cache = self.read_cache.get();
        let mut from_cache = vec![false; n];
        if let Some(c) = cache {
            for i in 0..n {
                from_cache[i] = found[i] == PageRead::Intact && c.get(grains[i], generation, crc_of(i), outs[i]);
            }
        }
        if from_cache.iter().all(|c| *c) {
            return Ok(Some(found));
        }
        memory_reads::allow_device_read()?;
        let span_bytes = ((last + page_grains - first) * gb) as usize;
        let mut tmp = self.buffers.get(span_bytes);
        let read = self.array.read(first, &mut tmp);
        if let Err(e) = read {
            self.buffers.put(tmp);
            return Err(e);
        }
        let reused = info.generation.load(SeqCst) != generation;
        for i in 0..n {
            if from_cache[i] || found[i] != PageRead::Intact {
                continue;
            }
            let at = ((grains[i] - first) * gb) as usize;
            let bytes = &tmp[at..at + outs[i].len()];
            found[i] = if reused {
                PageRead::Moved
            } else if crc32c::crc32c(bytes) != crc_of(i) {
                PageRead::Damaged
            } else {
                outs[i].copy_from_slice(bytes);
                if let Some(c) = cache {
                    c.insert(grains[i], generation, bytes);
                }
                PageRead::Intact
            };
        }
        self.buffers.put(tmp);
        Ok(Some(found))
    }

    // ----- space -----

    /// Grains the pool can hold as mapped data while leaving the GC room to work: the data
    /// grains of every segment except those the watermarks, open streams and GC need.
    pub fn usable_grains(&self) -> u64 {
        let streams = self.streams.read().values().map(|s| s.count() as u64).sum();
        self.usable_grains_for_streams(streams)
    }

    /// Refuses, before anything is written, a request that would map `new_grains` more grains
    /// than the pool can hold, so an ENOSPC never leaves a request half applied. Concurrent
    /// requests may overshoot by a few pages, which the usable-space margin absorbs. Room the
    /// write buffer holds for pages it acknowledged counts as taken.
    pub fn check_room(&self, new_grains: u64) -> Result<()> {
        let usable = self.usable_grains();
        let mapped = self.mapped_grains() + self.reserved_grains();
        if new_grains > 0 && mapped + new_grains > usable {
            return Err(self.out_of_space(format!(
                "pool is full: {} of {} usable bytes hold data; trim or delete data (a pool does not grow: copy its volumes to a larger one)",
                mapped * self.geo.grain_bytes as u64,
                usable * self.geo.grain_bytes as u64
            )));
        }
        Ok(())
    }

    /// The error for a pool that found no room for `why`: when the array has lost more
    /// members than it survives, that loss (their segments are offline, so the pool only
    /// looks full), else [`Error::NoSpace`].
    pub fn out_of_space(&self, why: impl Into<String>) -> Error {
        match self.array.members_lost() {
            Some(lost) => Error::Poisoned(format!("{lost}: replace them with their contents, or restore the pool from a copy")),
            None => Error::NoSpace(why.into()),
        }
    }

    /// [`Log::usable_grains`] when the volumes have `streams` streams in all: each stream
    /// may hold a partly written segment whose rest no other stream can use.
    pub fn usable_grains_for_streams(&self, streams: u64) -> u64 {
        // The plain band, not a paced pool's wider one: that band is made of surplus space
        // and moves with it (`Capacity::fit_paced_band`), and a pool's capacity must not.
        let wm = capacity::Watermarks::for_segments(self.geo.total_segments);
        let data_per_segment = self.geo.data_grains_per_segment() as u64;
        let reserved = wm.high as u64 + streams + 2;
        let segs = (self.geo.total_segments as u64).saturating_sub(reserved);
        // Keep 3% of the remaining space free so the GC never degenerates into copying full
        // segments around.
        segs * data_per_segment * 97 / 100
    }
}

/// Bumps the generation of `meta` and writes it, on each of `devices`, into the slot the
/// generation selects (the two slots alternate, so a torn write leaves the previous copy
/// intact), then syncs. A slot in a sequential zone is reset first (the other slot still holds
/// the previous generation).
pub fn write_meta_slot(devices: &[(Arc<dyn crate::device::Device>, DeviceLayout)], meta: &mut PoolMeta) -> Result<()> {
    write_meta_slot_or(devices, meta, &|_, e| Err(e))
}

/// What [`write_meta_slot_or`] does when a device fails: `Ok` to go on with the others.
pub type MetaWriteFailed<'a> = dyn Fn(&Arc<dyn crate::device::Device>, Error) -> Result<()> + 'a;

/// [`write_meta_slot`], handing a device's error to `failed`, which may let the write go on
/// with the other devices.
pub fn write_meta_slot_or(
    devices: &[(Arc<dyn crate::device::Device>, DeviceLayout)],
    meta: &mut PoolMeta,
    failed: &MetaWriteFailed<'_>,
) -> Result<()> {
    // The generation numbers the epochs of ids and sequence numbers, which must fit the format.
    if meta.generation + 1 >= MAX_EPOCHS {
        return Err(Error::Exhausted(format!(
            "the pool has written its metadata {} times, the most the format numbers",
            meta.generation
        )));
    }
    meta.generation += 1;
    let bytes = meta.encode();
    let mut buf = crate::util::AlignedBuf::zeroed(bytes.len());
    buf.copy_from_slice(&bytes);
    // One generation, written member by member: after a crash part way, opening takes the
    // newest valid copy on any member, and the next write brings every member up to date.
    for (dev, layout) in devices {
        let offset = layout.meta_slot_offsets[(meta.generation % 2) as usize];
        let io = |op, source| Error::Io {
            device: dev.name().to_string(),
            op,
            offset,
            source,
        };
        let write = || -> Result<()> {
            if let Some(zone) = crate::layout::in_sequential_zone(dev.as_ref(), offset)? {
                let z = dev.zones().expect("a sequential zone is on a zoned device");
                z.reset_zone(zone).map_err(|e| io("reset zone", e))?;
            }
            dev.write_at(&buf, offset).map_err(|e| io("write pool metadata", e))?;
            dev.sync().map_err(|e| io("sync pool metadata", e))
        };
        if let Err(e) = write() {
            failed(dev, e)?;
        }
    }
    Ok(())
}

/// A discard that makes the next write allocate again is done only on free segments beyond
/// one in this many (see `Log::discard_released`).
pub const PLENTIFUL_FREE_DIVISOR: u32 = 8;

/// [`Log::fill_holes`] keeps this fraction of the pool's segments free and filled: half the
/// share discards leave unpunched ([`PLENTIFUL_FREE_DIVISOR`]), so that between the two neither
/// acts. With the same share, a burst of releases (sequential overwrites free many segments
/// at once) was punched beyond it and filled again as soon as writers took the filled ones:
/// 326 MB punched and as much filled in one `scripts/bench_nbd.py` run.
pub const FILLED_FREE_DIVISOR: u32 = 2 * PLENTIFUL_FREE_DIVISOR;

/// Bytes of free segments [`Log::fill_holes`] fills per sync (at least one segment).
/// Small, so that the write-back of one batch's zeros delays a writer's flush that comes
/// meanwhile by little.
pub const HOLE_FILL_BATCH_BYTES: u64 = 8 << 20;

/// Segments discarded before they are handed to the free queues together (a discard takes
/// a millisecond or more; writers short of space wait for at most this many).
const DISCARDS_PER_RELEASE: usize = 4;

/// A segment held in use ([`Log::hold_segment`]); letting go frees it if it was emptied
/// meanwhile and its release is due (a release runs only then: it may discard).
#[must_use = "the segment is held only while this lives"]
pub struct SegmentHold<'a> {
    log: &'a Log,
    segment: u32,
}

impl Drop for SegmentHold<'_> {
    fn drop(&mut self) {
        if self.log.capacity.let_go(self.segment) {
            self.log.release_synced();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, MemoryDevice};

    #[test]
    fn the_pool_metadata_generation_stops_where_sequence_numbers_would_outgrow_the_format() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem0", 16 << 20));
        let (layout, _) = DeviceLayout::plan(dev.as_ref(), 1 << 20).unwrap();
        let mut meta = PoolMeta {
            pool_id: 7,
            generation: MAX_EPOCHS - 2,
            session_id: 1,
            clean: true,
            next_volume_id: 1,
            volumes: Vec::new(),
            checkpoint: None,
            ..PoolMeta::default()
        };
        write_meta_slot(&[(dev.clone(), layout)], &mut meta).unwrap();
        assert_eq!(meta.generation, MAX_EPOCHS - 1);
        // The largest epoch's sequence numbers still fit the format.
        let last_seq_of_largest_epoch = meta.generation << SEQ_EPOCH_SHIFT | ((1 << SEQ_EPOCH_SHIFT) - 1);
        assert_eq!(last_seq_of_largest_epoch, crate::format::MAX_SEQ);
        let mut before = vec![0u8; 2 * 4096];
        dev.read_at(&mut before, layout.meta_slot_offsets[0]).unwrap();
        let err = write_meta_slot(&[(dev.clone(), layout)], &mut meta).unwrap_err();
        assert!(matches!(err, Error::Exhausted(_)), "{err}");
        assert_eq!(meta.generation, MAX_EPOCHS - 1, "a refused write leaves the generation alone");
        let mut after = vec![0u8; 2 * 4096];
        dev.read_at(&mut after, layout.meta_slot_offsets[0]).unwrap();
        assert_eq!(before, after, "nothing was written");
    }
}
