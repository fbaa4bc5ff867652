//! The storage capacity manager: segments, their states and valid-grain counts, the free queues
//! (one per storage type), segments waiting for a sync before reuse, and allocation with the GC
//! reserve that makes writers wait instead of fail.
//!
//! Segment life cycle:
//! ```text
//!  Free --allocate--> Staged --seal--> Allocated --GC picks--> Victim
//!   ^                                     |                      |
//!   |                              counts reach 0         relocated
//!   |                                     v                      v
//!   +----- a sync covering its tag --- PendingFree <-------------+
//! ```
//! Free segments whose space a file system has not allocated yet (holes of a sparse or punched
//! pool file) wait in queues of their own and are handed out only when no other free segment
//! of the type is left: a segment's first write into a hole makes the next flush commit the
//! file system's journal as well (see `Log::fill_holes`, which fills them in the background).
//!
//! Invariants (asserted):
//! - valid grains never exceed the segment's grains and never go below zero;
//! - only Staged segments gain valid grains or tombstones; Allocated and Victim segments only
//!   lose them, so a segment that reached zero stays empty;
//! - a segment becomes Free only after a sync that covers every record created before it was
//!   retired (invariant 4 of the design: the metadata recording the moves or overwrites that
//!   emptied it is durable before it can be overwritten);
//! - a held segment ([`Capacity::hold`]: a rebuild or a scrub copying it between members)
//!   does not become Free until the hold is let go, so it cannot be reused, and written by a
//!   new owner, under the copy.

use crate::device::StorageType;
use crate::log::record::RecordBuf;
use arc_swap::ArcSwap;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;

/// Where a segment is in its life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SegmentState {
    Free = 0,
    Staged = 1,
    Allocated = 2,
    Victim = 3,
    PendingFree = 4,
    /// Holds a clean-shutdown checkpoint being written.
    Checkpoint = 5,
    /// Lent to a hybrid volume's fast tier: holds copies of data that lives in the log, no
    /// records (so a recovery scan finds nothing in it, and reopening frees it).
    Tier = 6,
    /// On a member missing at open (one that never held log data): never allocated, scanned
    /// or read until the pool is opened with the member again.
    Offline = 7,
}

impl SegmentState {
    fn from_u8(v: u8) -> SegmentState {
        match v {
            0 => SegmentState::Free,
            1 => SegmentState::Staged,
            2 => SegmentState::Allocated,
            3 => SegmentState::Victim,
            4 => SegmentState::PendingFree,
            5 => SegmentState::Checkpoint,
            6 => SegmentState::Tier,
            _ => SegmentState::Offline,
        }
    }
}

/// Per-segment bookkeeping, all atomics so the hot paths take no lock.
pub struct SegmentInfo {
    state: AtomicU8,
    pub valid_grains: AtomicU32,
    pub tombstones: AtomicU32,
    pub owner_volume: AtomicU32,
    pub stream: AtomicU8,
    /// Bumped every time the segment is allocated; readers use it to detect reuse.
    pub generation: AtomicU64,
    /// Data sequence number when the segment was sealed (its age, for cleaning policies).
    pub sealed_seq: AtomicU64,
    /// Data sequence number when a stream opened the segment.
    pub opened_seq: AtomicU64,
    /// Highest id of a record that made one of this segment's entries dead (an overwrite or a
    /// trim). The segment's old copies may vanish only once that record is durable; otherwise
    /// a crash could bring back an older value (see [`crate::engine::Engine::gc_release`]).
    pub last_kill_record: AtomicU64,
    pub storage_type: StorageType,
    /// The GC found live pages its metadata chain does not describe (damage); never a victim.
    pub unmovable: std::sync::atomic::AtomicBool,
    /// Some of the segment's space is a hole in its pool file (see the module docs). A hint for
    /// where a free segment waits: a wrong value costs speed, never data.
    pub hole: std::sync::atomic::AtomicBool,
    /// The hole was punched by this session's discard (`Log::discard_released`), so
    /// [`Capacity::take_holes_to_fill`] leaves it: filling it would write back the space the
    /// discard just gave away, two writes that buy nothing, and a segment punched and filled
    /// in turn is written again and again (159 MiB of zeros for a 127 MiB pool in
    /// `tests/device_models.rs`). Only the holes a session found at open are filled, so each
    /// segment is filled at most once a session.
    pub punched: std::sync::atomic::AtomicBool,
    /// Records of this segment not yet on the device; reads are served from them.
    pub records: Mutex<Vec<Arc<RecordBuf>>>,
    /// Records of the segment that may not be durable yet, as (first grain in the segment,
    /// record id), in order; pruned of durable ones as records begin. What a share of the
    /// segment's pages asks (see [`crate::log::Log::grain_durable`]).
    pub unsynced_records: Mutex<Vec<(u32, u64)>>,
}

impl SegmentInfo {
    pub fn state(&self) -> SegmentState {
        SegmentState::from_u8(self.state.load(SeqCst))
    }

    /// The stream that wrote the segment (user class 0 for a byte no stream encodes).
    pub fn stream_kind(&self) -> crate::format::StreamKind {
        crate::format::StreamKind::from_u8(self.stream.load(SeqCst)).unwrap_or(crate::format::StreamKind::User(0))
    }
    pub fn set_state(&self, s: SegmentState) {
        self.state.store(s as u8, SeqCst);
    }
    pub fn cas_state(&self, from: SegmentState, to: SegmentState) -> bool {
        self.state.compare_exchange(from as u8, to as u8, SeqCst, SeqCst).is_ok()
    }
    pub fn is_empty(&self) -> bool {
        self.valid_grains.load(SeqCst) == 0 && self.tombstones.load(SeqCst) == 0
    }
}

/// Who is asking for a segment: writers stop at the GC reserve, the GC may use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    User,
    /// A trim's tombstone record, in a user stream. It makes space rather than taking it, so
    /// it may take a segment from its class's own reserve (not the pool's GC reserve): a
    /// volume whose class is full of live data can still be trimmed.
    Trim,
    Gc,
    Checkpoint,
    /// A hybrid volume's fast tier (copies of data durable in the log).
    Tier,
}

/// A retired segment and what must be durable before it is reused.
#[derive(Debug, Clone, Copy)]
struct Pending {
    segment: u32,
    /// Every record up to this id: the overwrites that emptied it may sit in any stream.
    through_record: u64,
    /// Emptied by the GC: its moves sit in GC-stream records only, so a GC release (seal the
    /// GC streams, wait for them, sync) frees it without sealing the user streams.
    gc_moves: bool,
}

struct Queues {
    free: Vec<VecDeque<u32>>,
    /// Free segments with a hole (per type), handed out after every one of `free`.
    holes: Vec<VecDeque<u32>>,
    /// Retired segments waiting for a sync before reuse.
    pending: Vec<Pending>,
    /// Released segments waiting for their discard before they join the free queues (only
    /// while discards are on). Still PendingFree: nothing may write them until the discard is
    /// done, or it would destroy what was written.
    to_discard: Vec<u32>,
    /// Released segments not yet free because of their discard: in `to_discard` or being
    /// discarded (they count as pending: a sync or a short wait frees them).
    discarding: usize,
    /// The storage classes some volume's streams are restricted to (a hybrid volume's slow
    /// tier, `--storage fast|slow`), each with the segments its GC may open beyond the pool's
    /// reserve (one per GC stream of its volumes): other writers leave each that reserve.
    protected: Vec<(&'static [StorageType], u32)>,
    /// Segments held by [`Capacity::hold`] (one entry per hold): not freed while here.
    held: Vec<u32>,
}

/// Watermarks in segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// Writers wait (and never allocate) when free segments are at or below this.
    pub gc_reserve: u32,
    /// GC starts below this.
    pub low: u32,
    /// GC stops at or above this.
    pub high: u32,
    /// Segments emptied by overwrites (pending: they wait only for a sync) are released by one
    /// sync once free segments fall to this. It sits well above `low` so that the sync finishes
    /// before writers run short: releasing costs a sync, not spare space.
    pub release: u32,
}

impl Watermarks {
    pub fn for_segments(total: u32) -> Watermarks {
        let gc_reserve = 3;
        // Free segments are space the log cannot use: keep the band between the watermarks
        // narrow (a few per mille of the pool) so that spare space works for the GC.
        let step = (total / 1024).max(1);
        let high = gc_reserve + 2 * step + 2;
        Watermarks {
            gc_reserve,
            low: gc_reserve + step + 1,
            high,
            // At most 256, never below `high` (a clamp would panic for pools of 129,024
            // segments or more, where `high` passes 256).
            release: (total / 32).min(256).max(high),
        }
    }

    /// The watermarks of a pool whose user writes are paced (`crate::pacing`), of `total`
    /// segments of which `surplus` are needed neither by the live data nor as the pool's
    /// configured spare (a volume smaller than the pool, or not yet written): the GC starts
    /// and stops a few segments higher, so that the free segments between its start and the
    /// writers' reserve absorb the GC's bursts (a victim's relocation, a release sync) and
    /// swings while the pacer holds writers to the rate it sustains. The band is widened by 1
    /// in 64 of the pool (at most 16), or by an eighth of the surplus segments (at most 64)
    /// where that is more.
    ///
    /// With the narrow band, free segments touched the reserve at every burst and the pacer
    /// took the rate down each time: 353 against 505 MB/s on RAID-5 random writes of 1022
    /// segments. Once the GC read victims' live pages only, 1 in 128 (at most 8) was too
    /// little at its higher pace: 21 to 42 stalls per 10 s, 757 MB/s with a p99 of 723 us,
    /// against 3 to 11 stalls, 954 MB/s and 498 us with 1 in 64 (a whole volume writes 1 to
    /// 4% more per user byte for the segments held free; an eighth of all the spare, the
    /// configured spare included, took a whole volume's from 3.51-3.56 to 3.67-3.79). Where
    /// the data leaves most of the pool spare (a volume of 42% of it), 1 in 64 still let
    /// writers stall on the reserve in 17 of 22 rounds of 10 s (a median of 18 times); the
    /// surplus band held them off in all 22 and took the p99.9 from a median of 856 to 725
    /// us, for 1.45 against 1.44 bytes written per user byte (the p99 moved within the
    /// spread). A pool of fewer than 128 segments keeps its band: there each segment held
    /// free is a share of the spare the data lacks (96 segments, 2 more each side: GC write
    /// amplification 5.3 and 6.3 against 3.7; docs/BENCHMARKS.md).
    pub fn widened_for_pacing(self, total: u32, surplus: u32) -> Watermarks {
        let extra = if total < 128 {
            0
        } else {
            (total / 64).min(16).max((surplus / 8).min(64))
        };
        Watermarks {
            low: self.low + extra,
            high: self.high + 2 * extra,
            release: self.release.max(self.high + 2 * extra),
            ..self
        }
    }

    /// How many cleaned segments the GC lets wait for one shared sync in a pool of `total`
    /// segments: 1 in 512 of the pool, or half the band between the writers' reserve and the
    /// GC's start where a paced pool widened it ([`Watermarks::widened_for_pacing`]), 2 to 16.
    /// Each release is a cache flush of every member: on a paced RAID-5 of 1022 segments (band
    /// 17) a batch of 8 against 2 took paced 4 KiB random writes over the whole volume from a
    /// median of 155 to 195 MB/s, and at 42% of it from 678 to 720 MB/s (docs/BENCHMARKS.md).
    pub fn gc_release_batch(self, total: u32) -> u32 {
        let band_half = self.low.saturating_sub(self.gc_reserve) / 2;
        (total / 512).max(band_half).clamp(GC_RELEASE_BATCH_MIN, 16)
    }

    /// Free segments at which the GC releases its cleaned victims without waiting for a full
    /// `batch`. With the smallest batch that is when the GC itself runs dry (1 free): one
    /// victim waiting costs one segment. A larger batch holds up to `batch - 1` segments, so it
    /// is released while that many free segments are still above the writers' reserve (`low -
    /// batch`) where the band is that wide (a paced pool's), else one above the reserve (a
    /// large pool's narrow band), or the writers would stall behind it. (Releasing early in
    /// small pools too cut the victims the crash tests' workloads clean below the crash points
    /// they need.)
    pub fn gc_early_release_at(self, batch: u32) -> u32 {
        if batch <= GC_RELEASE_BATCH_MIN {
            1
        } else {
            self.low.saturating_sub(batch).max(self.gc_reserve + 1)
        }
    }
}

/// How often a paced pool's band is fitted to the surplus space ([`Capacity::fit_paced_band`]).
pub const PACED_BAND_REFIT: std::time::Duration = std::time::Duration::from_millis(250);

/// The smallest number of cleaned victims released by one sync
/// ([`Watermarks::gc_release_batch`]).
const GC_RELEASE_BATCH_MIN: u32 = 2;

/// The extra reserve of `types` when it is a protected class.
fn extra_of(q: &Queues, types: &[StorageType]) -> u32 {
    q.protected.iter().find(|(class, _)| *class == types).map_or(0, |(_, extra)| *extra)
}

/// Free segments of `types` in the queues.
fn free_of(q: &Queues, types: &[StorageType]) -> u32 {
    types
        .iter()
        .map(|t| (q.free[*t as usize].len() + q.holes[*t as usize].len()) as u32)
        .sum()
}

impl Queues {
    /// Free segments without and with a hole, across all types.
    fn free_and_hole_counts(&self) -> (u32, u32) {
        let count = |queues: &[VecDeque<u32>]| queues.iter().map(|f| f.len() as u32).sum::<u32>();
        (count(&self.free), count(&self.holes))
    }

    /// The free queue a segment waits in: with or without a hole.
    fn queue_of(&mut self, info: &SegmentInfo) -> &mut VecDeque<u32> {
        let queues = if info.hole.load(SeqCst) { &mut self.holes } else { &mut self.free };
        &mut queues[info.storage_type as usize]
    }
}

/// Segments retired but not yet free, by what frees them ([`Capacity::pending_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingCounts {
    /// Emptied by the GC: free after a GC release (a sync covering their moves).
    pub gc: u32,
    /// Emptied by overwrites or trims: free after any sync covering their last record.
    pub awaiting_sync: u32,
    /// Released, and being discarded by another thread: free once that is done; a flush
    /// does nothing for them.
    pub discarding: u32,
}

impl PendingCounts {
    /// Whether a flush (its sync) can free any of them: not the ones being discarded.
    pub fn freed_by_flush(&self) -> bool {
        self.gc + self.awaiting_sync > 0
    }
}

/// The capacity manager.
pub struct Capacity {
    segments: Box<[SegmentInfo]>,
    queues: Mutex<Queues>,
    /// Signalled whenever segments become free (writers waiting) or scarce (GC waiting).
    pub changed: Condvar,
    /// The GC's watermarks now ([`Capacity::watermarks`]): a paced pool's band follows the
    /// surplus space ([`Capacity::fit_paced_band`]).
    watermarks: ArcSwap<Watermarks>,
    /// Whether the band is a paced pool's ([`Watermarks::widened_for_pacing`]).
    paced: AtomicBool,
    /// Segments the pool keeps spare by its configuration (its spare percent), which the
    /// paced band's surplus leaves to the GC.
    configured_spare_segments: AtomicU32,
    /// When the paced band was last fitted (milliseconds since `created`).
    band_fitted_ms: AtomicU64,
    created: std::time::Instant,
    grains_per_segment: u32,
    free_count: AtomicU32,
    /// Whether released segments pass through `to_discard` (see [`Capacity::set_discard`]).
    discard: std::sync::atomic::AtomicBool,
}

impl Capacity {
    pub fn new(types: Vec<StorageType>, grains_per_segment: u32) -> Capacity {
        let segments: Box<[SegmentInfo]> = types
            .iter()
            .map(|&t| SegmentInfo {
                state: AtomicU8::new(SegmentState::Free as u8),
                valid_grains: AtomicU32::new(0),
                tombstones: AtomicU32::new(0),
                owner_volume: AtomicU32::new(u32::MAX),
                stream: AtomicU8::new(0),
                generation: AtomicU64::new(0),
                sealed_seq: AtomicU64::new(0),
                opened_seq: AtomicU64::new(0),
                last_kill_record: AtomicU64::new(0),
                storage_type: t,
                unmovable: std::sync::atomic::AtomicBool::new(false),
                hole: std::sync::atomic::AtomicBool::new(false),
                punched: std::sync::atomic::AtomicBool::new(false),
                records: Mutex::new(Vec::new()),
                unsynced_records: Mutex::new(Vec::new()),
            })
            .collect();
        let watermarks = Watermarks::for_segments(segments.len() as u32);
        Capacity {
            segments,
            queues: Mutex::new(Queues {
                free: vec![VecDeque::new(); StorageType::ALL.len()],
                holes: vec![VecDeque::new(); StorageType::ALL.len()],
                pending: Vec::new(),
                to_discard: Vec::new(),
                discarding: 0,
                protected: Vec::new(),
                held: Vec::new(),
            }),
            changed: Condvar::new(),
            watermarks: ArcSwap::from_pointee(watermarks),
            paced: AtomicBool::new(false),
            configured_spare_segments: AtomicU32::new(0),
            band_fitted_ms: AtomicU64::new(0),
            created: std::time::Instant::now(),
            grains_per_segment,
            free_count: AtomicU32::new(0),
            discard: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The GC's watermarks now.
    pub fn watermarks(&self) -> Watermarks {
        **self.watermarks.load()
    }

    /// Makes the band a paced pool's ([`Watermarks::widened_for_pacing`]), for a pool that
    /// keeps `configured_spare_segments` spare by its configuration, fitted to the surplus
    /// space now and from then on by [`Capacity::fit_paced_band`].
    pub fn widen_for_pacing(&self, configured_spare_segments: u32) {
        self.configured_spare_segments.store(configured_spare_segments, SeqCst);
        self.paced.store(true, SeqCst);
        self.fit_band_now();
    }

    /// Fits a paced pool's band to the segments needed neither by the live data nor as the
    /// configured spare, at most every [`PACED_BAND_REFIT`] (the maintenance thread calls it;
    /// the sum walks every segment). The band narrows as the data grows into the surplus,
    /// and widens as it is trimmed.
    pub fn fit_paced_band(&self) {
        if !self.paced.load(SeqCst) {
            return;
        }
        let now_ms = self.created.elapsed().as_millis() as u64;
        let last = self.band_fitted_ms.load(SeqCst);
        if now_ms.saturating_sub(last) < PACED_BAND_REFIT.as_millis() as u64
            || self.band_fitted_ms.compare_exchange(last, now_ms, SeqCst, SeqCst).is_err()
        {
            return;
        }
        self.fit_band_now();
    }

    fn fit_band_now(&self) {
        self.band_fitted_ms.store(self.created.elapsed().as_millis() as u64, SeqCst);
        let total = self.segments.len() as u32;
        let surplus = self.spare_segments().saturating_sub(self.configured_spare_segments.load(SeqCst));
        let wm = Watermarks::for_segments(total).widened_for_pacing(total, surplus);
        if wm != self.watermarks() {
            self.watermarks.store(Arc::new(wm));
            self.changed.notify_all();
        }
    }

    /// Segments the live data does not need: all but its valid grains in whole segments.
    pub fn spare_segments(&self) -> u32 {
        let live: u64 = self.segments.iter().map(|s| u64::from(s.valid_grains.load(Relaxed))).sum();
        let needed = live.div_ceil(u64::from(self.grains_per_segment.max(1)));
        (self.segments.len() as u64).saturating_sub(needed) as u32
    }

    /// With `on`, a released segment waits in a list until [`Capacity::take_to_discard`] hands
    /// it to the log, which discards it on the device and gives it back with
    /// [`Capacity::finish_discard`]; only then is it free.
    pub fn set_discard(&self, on: bool) {
        self.discard.store(on, SeqCst);
    }

    /// The released segments to discard (each handed out once).
    pub fn take_to_discard(&self) -> Vec<u32> {
        std::mem::take(&mut self.queues.lock().to_discard)
    }

    /// Frees segments taken by [`Capacity::take_to_discard`] (all of them or some: the rest
    /// stay counted as discarding until they are given back in turn), whether or not their discard
    /// succeeded (it is advisory).
    pub fn finish_discard(&self, segments: &[u32]) {
        if segments.is_empty() {
            return;
        }
        let mut q = self.queues.lock();
        for &s in segments {
            assert_eq!(
                self.segment(s).state(),
                SegmentState::PendingFree,
                "discarded segment {s} changed state"
            );
            if !self.defer_while_held(&mut q, s) {
                self.queue_free(&mut q, s);
            }
        }
        q.discarding -= segments.len();
        self.changed.notify_all();
    }

    /// Marks the free segments for which `is_hole` holds as holes (after open: which of its
    /// free segments the pool file has no space under), moving them to the hole queues.
    /// One pass over each free queue (a segment there has no hole yet, by `Queues::queue_of`).
    pub fn mark_free_holes(&self, is_hole: impl Fn(u32) -> bool) {
        let mut q = self.queues.lock();
        let Queues { free, holes, .. } = &mut *q;
        for (free, holes) in free.iter_mut().zip(holes.iter_mut()) {
            free.retain(|&s| {
                if !is_hole(s) {
                    return true;
                }
                self.segment(s).hole.store(true, SeqCst);
                holes.push_back(s);
                false
            });
        }
    }

    /// Free segments without and with a hole.
    pub fn free_and_hole_counts(&self) -> (u32, u32) {
        self.queues.lock().free_and_hole_counts()
    }

    /// Takes up to `max` free segments with a hole off the queues to be filled, while fewer
    /// than `keep_filled` free segments are without one and more free segments than the
    /// release watermark would remain (filling never takes space a writer is short of). They
    /// count as being discarded until [`Capacity::finish_discard`] gives them back (with
    /// `hole` cleared once they are filled).
    ///
    /// Never a segment this session's discard punched ([`SegmentInfo::punched`]). The holes
    /// found at open are queued before anything is punched and punched ones join at the back,
    /// so taking from the front up to the first punched one finds every fillable hole; were
    /// that order ever broken, fewer would be filled, never one twice.
    pub fn take_holes_to_fill(&self, max: u32, keep_filled: u32) -> Vec<u32> {
        let mut q = self.queues.lock();
        let (filled, holes) = q.free_and_hole_counts();
        let room = (filled + holes).saturating_sub(self.watermarks().release);
        let n = max.min(keep_filled.saturating_sub(filled)).min(holes).min(room);
        let mut taken = Vec::with_capacity(n as usize);
        for queue in q.holes.iter_mut() {
            while (taken.len() as u32) < n {
                match queue.front() {
                    Some(&s) if !self.segment(s).punched.load(SeqCst) => {
                        queue.pop_front();
                        taken.push(s);
                    }
                    _ => break,
                }
            }
        }
        for &s in &taken {
            let info = self.segment(s);
            assert_eq!(info.state(), SegmentState::Free, "segment {s} on a hole queue is not free");
            assert!(info.is_empty(), "free segment {s} still counts valid data");
            info.set_state(SegmentState::PendingFree);
        }
        self.free_count.fetch_sub(taken.len() as u32, SeqCst);
        q.discarding += taken.len();
        taken
    }

    pub fn segment(&self, s: u32) -> &SegmentInfo {
        &self.segments[s as usize]
    }

    pub fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// Free segments across all types.
    pub fn free_segments(&self) -> u32 {
        self.free_count.load(SeqCst)
    }

    /// Free segments of the given types (a stream that writes only some types, such as a
    /// hybrid volume's slow tier, is short when these are, whatever the others hold).
    pub fn free_segments_of(&self, types: &[StorageType]) -> u32 {
        let q = self.queues.lock();
        free_of(&q, types)
    }

    /// Segments of the given types, in any state (whether the pool has such devices, and how
    /// much of it they are).
    pub fn segments_of(&self, types: &[StorageType]) -> u32 {
        self.segments.iter().filter(|s| types.contains(&s.storage_type)).count() as u32
    }

    /// Segments retired but not yet free: waiting for a sync, or for their discard.
    pub fn pending_segments(&self) -> usize {
        let q = self.queues.lock();
        q.pending.len() + q.discarding
    }

    /// Segments retired but not yet free, by what frees them.
    pub fn pending_counts(&self) -> PendingCounts {
        let q = self.queues.lock();
        let gc = q.pending.iter().filter(|p| p.gc_moves).count() as u32;
        PendingCounts {
            gc,
            awaiting_sync: q.pending.len() as u32 - gc,
            discarding: q.discarding as u32,
        }
    }

    /// The pending segments emptied by the GC, as of now.
    pub fn gc_pending(&self) -> Vec<u32> {
        self.queues
            .lock()
            .pending
            .iter()
            .filter(|p| p.gc_moves)
            .map(|p| p.segment)
            .collect()
    }

    /// Frees the given pending segments (the caller made their moves durable).
    pub fn release_segments(&self, segments: &[u32]) -> usize {
        let mut q = self.queues.lock();
        let before = q.pending.len();
        let mut freed = Vec::new();
        let Queues { pending, held, .. } = &mut *q;
        pending.retain(|p| {
            let take = segments.contains(&p.segment) && !held.contains(&p.segment);
            if take {
                freed.push(p.segment);
            }
            !take
        });
        for s in &freed {
            self.make_free(&mut q, *s);
        }
        if !freed.is_empty() {
            self.changed.notify_all();
        }
        before - q.pending.len()
    }

    /// A released segment: free, or first discarded (see [`Capacity::set_discard`]).
    fn make_free(&self, q: &mut Queues, s: u32) {
        let info = self.segment(s);
        assert!(info.is_empty(), "pending segment {s} regained data");
        info.owner_volume.store(u32::MAX, SeqCst);
        info.unmovable.store(false, SeqCst);
        if self.discard.load(SeqCst) {
            q.to_discard.push(s);
            q.discarding += 1;
        } else {
            self.queue_free(q, s);
        }
    }

    fn queue_free(&self, q: &mut Queues, s: u32) {
        let info = self.segment(s);
        info.set_state(SegmentState::Free);
        q.queue_of(info).push_back(s);
        self.free_count.fetch_add(1, SeqCst);
    }

    /// Rebuilds the queues from segment states after open: every Free segment is queued.
    pub fn rebuild_queues(&self) {
        let mut q = self.queues.lock();
        let Queues { free, holes, .. } = &mut *q;
        for f in free.iter_mut().chain(holes.iter_mut()) {
            f.clear();
        }
        q.pending.clear();
        q.to_discard.clear();
        q.discarding = 0;
        let mut n = 0;
        for (i, s) in self.segments.iter().enumerate() {
            if s.state() == SegmentState::Free {
                q.queue_of(s).push_back(i as u32);
                n += 1;
            }
        }
        self.free_count.store(n, SeqCst);
    }

    /// Sets the storage classes some volume is restricted to, each with the extra segments
    /// its GC streams may hold open (see [`Capacity::try_allocate`]).
    pub fn set_protected_classes(&self, classes: Vec<(&'static [StorageType], u32)>) {
        self.queues.lock().protected = classes;
    }

    /// The extra reserve of a protected class (0 for any other type list): its watermarks sit
    /// this much above the pool's.
    pub fn class_extra_reserve(&self, types: &[StorageType]) -> u32 {
        extra_of(&self.queues.lock(), types)
    }

    /// Takes a free segment of one of `types` (in preference order). Returns `None` when the
    /// purpose may not dip that low; the caller then waits for or runs GC.
    ///
    /// Every protected class keeps its own GC reserve, the pool's plus one segment per GC
    /// stream of its volumes (a victim's pages may go to every GC stream, and each may need a
    /// new segment before the victim is free): its own writers stop above it, and writers and
    /// checkpoints of other classes take a segment of one of its types only while it keeps
    /// more than that free. Without it, writers that may use any type took the last disk
    /// segments while flash was full, and a hybrid volume's GC, which relocates only to the
    /// disk, found nothing to relocate into.
    ///
    /// A user writer's reserve shrinks by the victims the GC has emptied that wait only for
    /// their release sync, down to one segment: the GC needs no segment to free those, and the
    /// reserve exists so that it can relocate. Without this, writers stalled at the reserve
    /// while the GC's next release sync was on its way (free segments 3, victims waiting for
    /// the sync 3 to 5, no victim being cleaned, at every one of about 200 stalls in 10 s of
    /// paced RAID-5 random writes, docs/BENCHMARKS.md).
    pub fn try_allocate(&self, types: &[StorageType], purpose: Purpose) -> Option<u32> {
        let mut q = self.queues.lock();
        let floor = match purpose {
            Purpose::User | Purpose::Trim => {
                let releasing = q
                    .pending
                    .iter()
                    .filter(|p| p.gc_moves && types.contains(&self.segment(p.segment).storage_type))
                    .count() as u32;
                let reserve = self.watermarks().gc_reserve;
                reserve - releasing.min(reserve.saturating_sub(1))
            }
            Purpose::Gc => 0,
            // A checkpoint must leave the GC reserve intact so the next session can start GC.
            Purpose::Checkpoint => self.watermarks().gc_reserve,
            // Copies are a luxury: they leave the pool's data room to clean in.
            Purpose::Tier => self.watermarks().high,
        };
        let guarded = matches!(purpose, Purpose::User | Purpose::Trim | Purpose::Checkpoint);
        let own_extra = if matches!(purpose, Purpose::User | Purpose::Checkpoint) {
            extra_of(&q, types)
        } else {
            0
        };
        if free_of(&q, types) <= floor + own_extra {
            return None;
        }
        for t in types {
            if guarded
                && q.protected
                    .iter()
                    .any(|(class, extra)| *class != types && class.contains(t) && free_of(&q, class) <= floor + extra)
            {
                continue;
            }
            if let Some(s) = q.free[*t as usize].pop_front().or_else(|| q.holes[*t as usize].pop_front()) {
                self.free_count.fetch_sub(1, SeqCst);
                let info = self.segment(s);
                assert_eq!(info.state(), SegmentState::Free, "segment {s} on the free queue is not free");
                assert!(info.is_empty(), "free segment {s} still counts valid data");
                info.generation.fetch_add(1, SeqCst);
                info.last_kill_record.store(0, SeqCst);
                // It is written from its start now: when it is free again, its space is there.
                info.hole.store(false, SeqCst);
                info.punched.store(false, SeqCst);
                info.set_state(match purpose {
                    Purpose::Checkpoint => SegmentState::Checkpoint,
                    Purpose::Tier => SegmentState::Tier,
                    Purpose::User | Purpose::Trim | Purpose::Gc => SegmentState::Staged,
                });
                return Some(s);
            }
        }
        None
    }

    /// Blocks until more than `floor` segments of `types` are free, something else changed, or
    /// `timeout` passed. Every path that frees segments notifies under the queue lock, so no
    /// wake-up is lost between a failed allocation and this wait.
    pub fn wait_for_free(&self, types: &[StorageType], floor: u32, timeout: std::time::Duration) {
        let mut q = self.queues.lock();
        if free_of(&q, types) <= floor {
            self.changed.wait_for(&mut q, timeout);
        }
    }

    /// A segment taken by `try_allocate` lies on a member that failed: it goes offline
    /// instead of into use.
    pub fn take_offline(&self, s: u32) {
        let info = self.segment(s);
        assert!(info.is_empty(), "taking segment {s} offline with data");
        info.set_state(SegmentState::Offline);
    }

    /// Takes every free segment for which `offline` holds off the free queues (their member
    /// failed).
    pub fn take_free_offline(&self, offline: impl Fn(u32) -> bool) {
        let mut q = self.queues.lock();
        let Queues { free, holes, .. } = &mut *q;
        for queue in free.iter_mut().chain(holes.iter_mut()) {
            queue.retain(|&s| {
                if !offline(s) {
                    return true;
                }
                self.free_count.fetch_sub(1, SeqCst);
                self.segment(s).set_state(SegmentState::Offline);
                false
            });
        }
        self.changed.notify_all();
    }

    /// Puts a segment taken by `try_allocate` back unused.
    pub fn unallocate(&self, s: u32) {
        let info = self.segment(s);
        assert!(info.is_empty(), "returning segment {s} with data");
        let mut q = self.queues.lock();
        if self.defer_while_held(&mut q, s) {
            return;
        }
        info.set_state(SegmentState::Free);
        q.queue_of(info).push_front(s);
        self.free_count.fetch_add(1, SeqCst);
        self.changed.notify_all();
    }

    /// A held segment about to be freed waits as pending instead, for the first release after
    /// the hold is let go; returns whether it was held.
    fn defer_while_held(&self, q: &mut Queues, s: u32) -> bool {
        if !q.held.contains(&s) {
            return false;
        }
        self.segment(s).set_state(SegmentState::PendingFree);
        q.pending.push(Pending {
            segment: s,
            through_record: 0,
            gc_moves: false,
        });
        true
    }

    /// Holds segment `s` while it is in use (not Free) and, given `generation`, still in that
    /// generation of use; false otherwise. Until the hold is let go
    /// ([`Capacity::let_go`]) the segment is not freed: a rebuild or a scrub that reads it
    /// from one member and writes it to another must not write over what a new owner of the
    /// segment wrote meanwhile.
    pub fn hold(&self, s: u32, generation: Option<u64>) -> bool {
        let info = self.segment(s);
        // Under the queue lock, where every path to Free passes: once held, it stays in use.
        let mut q = self.queues.lock();
        if info.state() == SegmentState::Free || generation.is_some_and(|g| info.generation.load(SeqCst) != g) {
            return false;
        }
        q.held.push(s);
        true
    }

    /// Ends one hold of `s` taken by [`Capacity::hold`]; returns whether `s` waits for a
    /// release (emptied meanwhile), which frees it if it is due.
    pub fn let_go(&self, s: u32) -> bool {
        let mut q = self.queues.lock();
        let i = q.held.iter().position(|h| *h == s);
        let i = i.unwrap_or_else(|| panic!("letting go of segment {s}, which is not held"));
        q.held.swap_remove(i);
        q.pending.iter().any(|p| p.segment == s)
    }

    /// Marks an empty segment as waiting for a sync that covers record `tag` (or, with
    /// `gc_moves`, for a GC release).
    pub fn retire(&self, s: u32, from: SegmentState, tag: u64, gc_moves: bool) -> bool {
        let info = self.segment(s);
        if !info.cas_state(from, SegmentState::PendingFree) {
            return false;
        }
        assert!(info.is_empty(), "retiring segment {s} that still holds data");
        self.queues.lock().pending.push(Pending {
            segment: s,
            through_record: tag,
            gc_moves,
        });
        self.changed.notify_all();
        true
    }

    /// Frees every pending segment whose tag is covered by a sync through `synced_through`.
    /// Returns how many became free.
    pub fn release_synced(&self, synced_through: u64) -> usize {
        let mut q = self.queues.lock();
        let mut released = 0;
        let mut i = 0;
        while i < q.pending.len() {
            let p = q.pending[i];
            if p.through_record <= synced_through && !q.held.contains(&p.segment) {
                q.pending.swap_remove(i);
                self.make_free(&mut q, p.segment);
                released += 1;
            } else {
                i += 1;
            }
        }
        if released > 0 {
            self.changed.notify_all();
        }
        released
    }

    /// Frees a segment at once (its contents are already unreachable durably, e.g. a deleted
    /// volume's segment after the volume table was synced, or a consumed checkpoint).
    pub fn free_now(&self, s: u32) {
        let info = self.segment(s);
        info.valid_grains.store(0, SeqCst);
        info.tombstones.store(0, SeqCst);
        info.owner_volume.store(u32::MAX, SeqCst);
        info.unmovable.store(false, SeqCst);
        let mut q = self.queues.lock();
        if self.defer_while_held(&mut q, s) {
            return;
        }
        info.set_state(SegmentState::Free);
        q.queue_of(info).push_back(s);
        self.free_count.fetch_add(1, SeqCst);
        self.changed.notify_all();
    }

    /// Frees every segment owned by a deleted volume (its deletion is already durable, and no
    /// record of it is in flight).
    pub fn free_owned_by(&self, volume: u32) {
        {
            let mut q = self.queues.lock();
            let segs = &self.segments;
            q.pending.retain(|p| segs[p.segment as usize].owner_volume.load(SeqCst) != volume);
        }
        for (i, s) in self.segments.iter().enumerate() {
            if s.owner_volume.load(SeqCst) == volume && s.state() != SegmentState::Free {
                self.free_now(i as u32);
            }
        }
    }

    /// Adds valid grains to a Staged segment (a page placed in it).
    pub fn add_valid(&self, s: u32, grains: u32) {
        let info = self.segment(s);
        let before = info.valid_grains.fetch_add(grains, SeqCst);
        assert!(before + grains <= self.grains_per_segment, "segment {s} over-full");
    }

    /// Removes valid grains (a page overwritten, trimmed or moved). Returns true when the
    /// segment became empty.
    pub fn sub_valid(&self, s: u32, grains: u32) -> bool {
        let info = self.segment(s);
        let before = info.valid_grains.fetch_sub(grains, SeqCst);
        assert!(before >= grains, "segment {s} valid-grain count underflow ({before} - {grains})");
        before == grains && info.tombstones.load(SeqCst) == 0
    }

    pub fn add_tombstone(&self, s: u32) {
        self.segment(s).tombstones.fetch_add(1, SeqCst);
    }

    /// Returns true when the segment became empty.
    pub fn sub_tombstone(&self, s: u32) -> bool {
        let info = self.segment(s);
        let before = info.tombstones.fetch_sub(1, SeqCst);
        assert!(before >= 1, "segment {s} tombstone count underflow");
        before == 1 && info.valid_grains.load(SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 flash segments, all free; `holes` of them marked as over holes.
    fn capacity_with_holes(holes: impl Fn(u32) -> bool) -> Capacity {
        let c = Capacity::new(vec![StorageType::Flash; 200], 256);
        c.rebuild_queues();
        c.mark_free_holes(holes);
        c
    }

    #[test]
    fn a_paced_pool_releases_cleaned_victims_in_larger_batches_before_writers_run_short() {
        let plain = Watermarks::for_segments(1022);
        assert_eq!((plain.gc_release_batch(1022), plain.gc_early_release_at(2)), (2, 1));
        // A whole volume's pool: little spare, the band widened by 1 in 64.
        let paced = plain.widened_for_pacing(1022, 0);
        let batch = paced.gc_release_batch(1022);
        assert_eq!(batch, (paced.low - paced.gc_reserve) / 2);
        let early = paced.gc_early_release_at(batch);
        // Released while the batch still fits above the writers' reserve.
        assert!(early > paced.gc_reserve && early + batch <= paced.low, "{early} {batch} {paced:?}");
        // A small pool keeps its band, so its batch and threshold too.
        let small = Watermarks::for_segments(96).widened_for_pacing(96, 96);
        assert_eq!((small.gc_release_batch(96), small.gc_early_release_at(2)), (2, 1));
        // A large pool batches by its size, up to 16.
        let large = Watermarks::for_segments(1 << 20);
        assert_eq!(large.gc_release_batch(1 << 20), 16);
        assert!(large.gc_early_release_at(16) > large.gc_reserve);
        assert!(large.release >= large.high);
    }

    #[test]
    fn a_paced_pools_band_follows_the_surplus_its_data_leaves() {
        let c = Capacity::new(vec![StorageType::Flash; 1024], 256);
        c.rebuild_queues();
        let plain = c.watermarks();
        c.fit_paced_band();
        assert_eq!(c.watermarks(), plain, "an unpaced pool keeps its band");
        // A pool that keeps 1 in 8 spare by its configuration.
        c.widen_for_pacing(128);
        let widened_by = |c: &Capacity| {
            let wm = c.watermarks();
            assert_eq!((wm.gc_reserve, wm.high - plain.high), (plain.gc_reserve, 2 * (wm.low - plain.low)));
            wm.low - plain.low
        };
        assert_eq!(widened_by(&c), 64, "empty: an eighth of the surplus, at most 64");
        let fill = |segments: u32| {
            for s in 0..1024 {
                c.segment(s).valid_grains.store(if s < segments { 256 } else { 0 }, SeqCst);
            }
            c.fit_band_now();
        };
        fill(696);
        assert_eq!((c.spare_segments(), widened_by(&c)), (328, 25));
        fill(896);
        assert_eq!(widened_by(&c), 16, "no surplus: 1 in 64 of the pool, at most 16");
        // Trimmed data gives the band back.
        fill(300);
        assert_eq!(widened_by(&c), 64);
        // The maintenance thread's calls refit it at most every PACED_BAND_REFIT.
        for s in 0..1024 {
            c.segment(s).valid_grains.store(256, SeqCst);
        }
        c.fit_paced_band();
        assert_eq!(widened_by(&c), 64, "refitted {:?} after the last", PACED_BAND_REFIT);
        std::thread::sleep(PACED_BAND_REFIT);
        c.fit_paced_band();
        assert_eq!(widened_by(&c), 16);
    }

    #[test]
    fn segments_over_holes_are_handed_out_last() {
        let c = capacity_with_holes(|s| s % 2 == 0);
        assert_eq!(c.free_and_hole_counts(), (100, 100));
        assert_eq!(c.free_segments(), 200, "holes are free space all the same");
        let mut order = Vec::new();
        while let Some(s) = c.try_allocate(&[StorageType::Flash], Purpose::Gc) {
            order.push(s);
        }
        assert_eq!(order.len(), 200);
        assert!(order[..100].iter().all(|s| s % 2 == 1), "every segment without a hole first");
        assert!(order[100..].iter().all(|s| s % 2 == 0));
        // A segment handed out is written from its start: free again, it has no hole.
        c.unallocate(order[0]);
        c.unallocate(order[150]);
        assert_eq!(c.free_and_hole_counts(), (2, 0));
    }

    #[test]
    fn filling_takes_the_holes_found_at_open_but_never_one_this_session_punched() {
        let flash = [StorageType::Flash];
        let c = capacity_with_holes(|s| s >= 190);
        c.set_discard(true);
        // Writers take the 190 segments without a hole and half the ten holes found at open.
        let taken: Vec<u32> = (0..195).map(|_| c.try_allocate(&flash, Purpose::Gc).unwrap()).collect();
        assert!(taken[..190].iter().all(|&s| s < 190) && taken[190..].iter().all(|&s| s >= 190));
        // Emptied and synced, they are discarded; the discard punches them (as a pool file's).
        for &s in &taken {
            assert!(c.retire(s, SegmentState::Staged, 1, false));
        }
        assert_eq!(c.release_synced(1), 195);
        let to_discard = c.take_to_discard();
        assert_eq!(to_discard.len(), 195);
        for &s in &to_discard {
            c.segment(s).hole.store(true, SeqCst);
            c.segment(s).punched.store(true, SeqCst);
        }
        c.finish_discard(&to_discard);
        assert_eq!(c.free_and_hole_counts(), (0, 200), "every free segment over a hole");
        // Filling takes the five holes left from open, however many it may fill, and none of
        // the 195 punched: those would be filled a second time.
        let fill = c.take_holes_to_fill(100, 100);
        let mut fill_sorted = fill.clone();
        fill_sorted.sort_unstable();
        assert_eq!(fill_sorted, (195..200).collect::<Vec<u32>>());
        for &s in &fill {
            c.segment(s).hole.store(false, SeqCst);
        }
        c.finish_discard(&fill);
        assert!(c.take_holes_to_fill(100, 100).is_empty(), "nothing else is fillable");
        // A punched segment a writer takes is written: free again, it has no hole, and if a
        // discard punches it again it is again left unfilled.
        while c.free_and_hole_counts().0 > 0 {
            c.try_allocate(&flash, Purpose::Gc).unwrap();
        }
        let s = c.try_allocate(&flash, Purpose::Gc).unwrap();
        assert!(to_discard.contains(&s));
        assert!(!c.segment(s).hole.load(SeqCst) && !c.segment(s).punched.load(SeqCst));
    }

    #[test]
    fn a_user_writer_may_take_the_reserve_victims_waiting_for_their_release_leave_but_one() {
        let flash = [StorageType::Flash];
        let c = Capacity::new(vec![StorageType::Flash; 200], 256);
        c.rebuild_queues();
        let reserve = c.watermarks().gc_reserve;
        assert!(reserve >= 2, "the test needs a reserve to share");
        let mut taken = Vec::new();
        while c.free_segments() > reserve {
            taken.push(c.try_allocate(&flash, Purpose::Gc).unwrap());
        }
        assert_eq!(c.try_allocate(&flash, Purpose::User), None, "at the reserve a writer waits");
        // A segment emptied by overwrites waits for any sync: no relief.
        assert!(c.retire(taken[0], SegmentState::Staged, 1, false));
        assert_eq!(c.try_allocate(&flash, Purpose::User), None);
        // Victims the GC emptied wait only for its release sync: it needs no segment for them,
        // and a writer may take as many reserve segments, down to the last one.
        for &s in &taken[1..=reserve as usize] {
            assert!(c.retire(s, SegmentState::Staged, 1, true));
        }
        for _ in 1..reserve {
            assert!(c.try_allocate(&flash, Purpose::User).is_some());
        }
        assert_eq!(c.free_segments(), 1);
        assert_eq!(c.try_allocate(&flash, Purpose::User), None, "the last segment stays the GC's");
        assert_eq!(c.try_allocate(&flash, Purpose::Checkpoint), None, "a checkpoint gets no relief");
        assert!(c.try_allocate(&flash, Purpose::Gc).is_some());
        // Released, they are free segments like any other, and the reserve is whole again.
        assert_eq!(c.release_segments(&c.gc_pending()), reserve as usize);
        assert_eq!(c.free_segments(), reserve);
        assert_eq!(c.try_allocate(&flash, Purpose::User), None);
    }

    #[test]
    fn a_held_segment_is_freed_by_no_path_until_it_is_let_go() {
        let flash = [StorageType::Flash];
        let c = Capacity::new(vec![StorageType::Flash; 50], 256);
        c.rebuild_queues();
        let free = c.free_segments();
        let s = c.try_allocate(&flash, Purpose::Gc).unwrap();
        let generation = c.segment(s).generation.load(SeqCst);
        assert!(!c.hold(s, Some(generation + 1)), "held in a generation it is not in");
        assert!(c.hold(s, Some(generation)));
        assert!(c.hold(s, None));
        assert!(!c.let_go(s), "in use, it waits for no release");
        // Emptied and retired: neither a sync nor a GC release frees it.
        assert!(c.retire(s, SegmentState::Staged, 1, true));
        assert_eq!(c.release_synced(u64::MAX), 0);
        assert_eq!(c.release_segments(&[s]), 0);
        assert_eq!(c.segment(s).state(), SegmentState::PendingFree);
        assert!(c.let_go(s), "it waits for a release");
        assert_eq!(c.release_synced(1), 1);
        assert_eq!(c.segment(s).state(), SegmentState::Free);
        assert!(!c.hold(s, None), "a free segment is not held");
        // A deleted volume's segment and an allocation given back wait as well.
        let t = c.try_allocate(&flash, Purpose::Gc).unwrap();
        let u = c.try_allocate(&flash, Purpose::Gc).unwrap();
        assert!(c.hold(t, None) && c.hold(u, None));
        c.free_now(t);
        c.unallocate(u);
        assert_eq!(c.free_segments(), free - 2);
        assert!(c.let_go(t) && c.let_go(u));
        assert_eq!(c.release_synced(0), 2);
        assert_eq!(c.free_segments(), free);
        // So does one whose discard ends while it is held.
        c.set_discard(true);
        let v = c.try_allocate(&flash, Purpose::Gc).unwrap();
        assert!(c.retire(v, SegmentState::Staged, 1, false));
        assert_eq!(c.release_synced(1), 1);
        assert_eq!(c.take_to_discard(), vec![v]);
        assert!(c.hold(v, None), "being discarded is still in use");
        c.finish_discard(&[v]);
        assert_eq!(c.segment(v).state(), SegmentState::PendingFree);
        c.set_discard(false);
        assert!(c.let_go(v));
        assert_eq!(c.release_synced(0), 1);
        assert_eq!(c.free_segments(), free);
    }

    #[test]
    fn filling_takes_holes_only_up_to_its_target_and_above_the_release_watermark() {
        let c = capacity_with_holes(|s| s >= 10);
        let release = c.watermarks().release;
        assert_eq!(c.free_and_hole_counts(), (10, 190));
        let taken = c.take_holes_to_fill(8, 25);
        assert_eq!(taken.len(), 8, "a batch at most");
        assert!(taken.iter().all(|&s| s >= 10 && c.segment(s).state() == SegmentState::PendingFree));
        assert_eq!(c.free_segments(), 192);
        assert_eq!(c.pending_counts().discarding, 8, "being filled counts as being discarded");
        for &s in &taken {
            c.segment(s).hole.store(false, SeqCst);
        }
        c.finish_discard(&taken);
        assert_eq!(c.free_and_hole_counts(), (18, 182));
        let rest = c.take_holes_to_fill(100, 25);
        assert_eq!(rest.len(), 7, "no more than the target of 25 filled");
        c.finish_discard(&rest);
        assert_eq!(c.free_and_hole_counts(), (18, 182), "still holes: they were not filled");
        // Nearly full: nothing is taken that would leave fewer free than the release watermark.
        while c.free_segments() > release + 2 {
            c.try_allocate(&[StorageType::Flash], Purpose::Gc).unwrap();
        }
        let few = c.take_holes_to_fill(100, 1000);
        assert_eq!(few.len(), 2, "only what lies above the release watermark ({release})");
        c.finish_discard(&few);
    }
}
