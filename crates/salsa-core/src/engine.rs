//! The engine: state shared by the controllers, the GC and the front-ends, and the pool-wide
//! paths that tie the layers together: sequence numbers, record writes, flush (group commit),
//! segment allocation with throttling, and garbage collection.
//!
//! Write path, in order (see `docs/DESIGN.md` for the whole story):
//! 1. the controller reserves the next slot of its stream's open record (allocating a segment
//!    if needed; writers wait for the GC below the reserve, never fail);
//! 2. it copies the page into the record buffer and records its crc32c;
//! 3. under the page's stripe lock it takes a sequence number, appends the metadata entry and
//!    swaps the map entry; the old location is invalidated;
//! 4. a full record is written to the device in one sequential write.
//!
//! Flush path: (1) note the last record id; (2) seal and write every stream's open record;
//! (3) wait until every record up to the noted id is on the device; (4) sync every device, once
//! for all concurrent flushes; (5) publish `synced_through` and release the segments that were
//! waiting for it.

use crate::array::Array;
use crate::capacity::{Capacity, Purpose, SegmentState};
use crate::controller::record::SealedRecord;
use crate::controller::Controller;
use crate::device::StorageType;
use crate::durability::{Tracker, EPOCH_SHIFT, MAX_EPOCHS, SEQ_EPOCH_SHIFT};
use crate::error::{Error, Result};
use crate::format::PoolMeta;
use crate::layout::DeviceLayout;
use crate::policy::victim::{Candidate, VictimPolicy};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

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
    /// A metadata page follows at most this many data pages.
    pub meta_interval_pages: u32,
}

/// Counters, readable at any time.
#[derive(Default)]
pub struct Counters {
    pub user_bytes_written: AtomicU64,
    pub user_bytes_read: AtomicU64,
    pub gc_bytes_relocated: AtomicU64,
    pub device_bytes_written: AtomicU64,
    pub meta_bytes_written: AtomicU64,
    pub gc_segments_cleaned: AtomicU64,
    pub flushes: AtomicU64,
    pub syncs: AtomicU64,
    /// Time spent in device syncs.
    pub sync_micros: AtomicU64,
    /// Time the GC spent reading victims and relocating (excluding syncs).
    pub gc_micros: AtomicU64,
    pub throttled_allocations: AtomicU64,
    /// Victims whose count the GC waited a full second for writers to settle.
    pub gc_wait_timeouts: AtomicU64,
    /// User bytes that records held in the writers' payloads instead of copying.
    pub user_bytes_held: AtomicU64,
}

/// Shared engine state.
pub struct Engine {
    pub pool_id: u128,
    pub geo: Geometry,
    pub array: Array,
    pub capacity: Capacity,
    pub tracker: Tracker,
    /// crc32c of the page that starts at each grain (the in-memory half of the back-pointers).
    pub crc_table: Box<[AtomicU32]>,
    /// Every volume, by id, as the core sees it: a controller.
    pub volumes: RwLock<BTreeMap<u32, Arc<dyn Controller>>>,
    seq: AtomicU64,
    epoch_lock: Mutex<()>,
    poison: Mutex<Option<String>>,
    poisoned: AtomicBool,
    pub counters: Counters,
    pub policy: Box<dyn VictimPolicy>,
    /// Held shared while a victim is cleaned (several GC workers may clean at once, each its
    /// own victim, claimed by compare-and-swap) and exclusively by volume deletion.
    pub gc_lock: RwLock<()>,
    /// The durable pool metadata (volume table); held while it is rewritten.
    pub meta: Mutex<PoolMeta>,
    pub background_gc: bool,
    /// When set, the GC also runs while garbage exceeds this share of the data space of the
    /// sealed segments (SepBIT's trigger; see [`Engine::garbage_due`]).
    gc_garbage_ratio: Option<f64>,
    pub shutting_down: AtomicBool,
    /// Sealed user records on their way to the device (see [`crate::write_back`]).
    pub write_back: crate::write_back::WriteBack,
    /// Set when the GC found nothing to clean while writers wait: the pool is really full.
    pub gc_stuck: AtomicBool,
    gc_wake: (Mutex<bool>, Condvar),
    /// Grains held by mapped pages across all volumes (for the thin-provisioning limit).
    pub mapped_grains: AtomicU64,
    /// Writes and trims between replacing a map entry and accounting for the place it left;
    /// the GC waits for them before it judges a cleaned victim (see [`Engine::gc_step`]).
    pub invalidations_in_flight: AtomicU64,
    pub read_only: bool,
    /// Recycled record and read buffers.
    pub buffers: Arc<crate::util::BufferPool>,
    /// Buffers that write payloads are received into and records hold (zero-copy writes).
    pub payloads: Arc<crate::payload::PayloadPool>,
    /// Victims being cleaned and the free segments promised to them (see [`Engine::gc_admit`]).
    gc_budget: Mutex<GcBudget>,
    gc_budget_changed: Condvar,
}

/// What the GC workers cleaning at this moment may still need.
#[derive(Default)]
struct GcBudget {
    cleaning: u32,
    promised_segments: u32,
}

/// A GC worker's permission to clean one victim; gives its promise back when dropped.
struct GcAdmission<'a> {
    eng: &'a Engine,
    segments: u32,
}

impl Drop for GcAdmission<'_> {
    fn drop(&mut self) {
        let mut b = self.eng.gc_budget.lock();
        b.cleaning -= 1;
        b.promised_segments -= self.segments;
        self.eng.gc_budget_changed.notify_all();
    }
}

/// How far (as a share of the written space) garbage may run above the garbage trigger before
/// writers wait for the GC: enough that they do not stop at every segment, small enough that
/// the bound is what the user asked for.
const GARBAGE_SLACK: f64 = 0.01;
/// Write payload buffers out at once (being received, or held by records not yet written);
/// past it writes are copied into records instead (see [`crate::payload`]).
pub const PAYLOAD_BUDGET_BYTES: usize = 64 << 20;

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

/// Allocation preference of checkpoints: conventional zones first, where a zoned drive has them.
pub const CHECKPOINT_TYPES: [StorageType; 5] = [
    StorageType::SmrConventional,
    StorageType::Nvm,
    StorageType::Flash,
    StorageType::Hdd,
    StorageType::SmrSequential,
];

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pool_id: u128,
        geo: Geometry,
        array: Array,
        capacity: Capacity,
        meta: PoolMeta,
        policy: Box<dyn VictimPolicy>,
        background_gc: bool,
        gc_garbage_ratio: Option<f64>,
        read_only: bool,
    ) -> Engine {
        let epoch = meta.generation;
        Engine {
            pool_id,
            geo,
            array,
            capacity,
            tracker: Tracker::new(epoch << EPOCH_SHIFT | 1),
            crc_table: (0..geo.total_grains).map(|_| AtomicU32::new(0)).collect(),
            volumes: RwLock::new(BTreeMap::new()),
            seq: AtomicU64::new(epoch << SEQ_EPOCH_SHIFT | 1),
            epoch_lock: Mutex::new(()),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            counters: Counters::default(),
            policy,
            gc_lock: RwLock::new(()),
            meta: Mutex::new(meta),
            background_gc,
            gc_garbage_ratio,
            shutting_down: AtomicBool::new(false),
            write_back: Default::default(),
            gc_stuck: AtomicBool::new(false),
            gc_wake: (Mutex::new(false), Condvar::new()),
            mapped_grains: AtomicU64::new(0),
            invalidations_in_flight: AtomicU64::new(0),
            read_only,
            buffers: Arc::new(crate::util::BufferPool::new(64 << 20)),
            payloads: crate::payload::PayloadPool::new(PAYLOAD_BUDGET_BYTES, PAYLOAD_BUDGET_BYTES / 2),
            gc_budget: Mutex::new(GcBudget::default()),
            gc_budget_changed: Condvar::new(),
        }
    }

    /// What a record-chain walk needs to know about this pool.
    pub fn scan_geometry(&self) -> crate::scan::ScanGeometry {
        crate::scan::ScanGeometry {
            pool_id: self.pool_id,
            grain_bytes: self.geo.grain_bytes as usize,
            grains_per_segment: self.geo.grains_per_segment,
        }
    }

    // ----- errors -----

    /// Makes the pool refuse writes until reopened, remembering why.
    pub fn poison(&self, e: &Error) {
        let mut p = self.poison.lock();
        if p.is_none() {
            tracing::error!("pool poisoned: {e}");
            *p = Some(e.to_string());
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

    /// Writes the pool metadata into the slot after the current one and syncs it.
    pub fn write_pool_meta(&self, meta: &mut PoolMeta) -> Result<()> {
        let m = &self.array.members()[0];
        write_meta_slot(m.device.as_ref(), &m.layout, meta)
    }

    // ----- records and flush -----

    /// Writes a sealed record to the device and marks it complete.
    pub fn write_record(&self, r: SealedRecord) -> Result<()> {
        let gb = self.geo.grain_bytes as usize;
        let len = r.used_grains as usize * gb;
        let res = {
            // One piece when the record holds no payload pages, else its pieces in order.
            let bytes = r.buf.bytes.read();
            self.array.write_vectored(r.buf.first_grain, &bytes.io_slices(r.used_grains, gb))
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

    fn volumes_snapshot(&self) -> Vec<Arc<dyn Controller>> {
        self.volumes.read().values().cloned().collect()
    }

    /// Makes every write that returned before this call durable, data and map.
    pub fn flush(&self) -> Result<()> {
        self.check_not_poisoned()?;
        self.counters.flushes.fetch_add(1, SeqCst);
        let target = self.tracker.last_id();
        for v in self.volumes_snapshot() {
            for r in v.seal_open_records(self) {
                self.write_record(r)?;
            }
        }
        self.sync_through(target)
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
        self.capacity.release_synced(self.tracker.synced_through());
        Ok(())
    }

    /// Syncs every device and publishes how far records are durable. The caller holds the
    /// sync lock, so syncs do not overlap and `synced_through` only covers records that were
    /// complete before this sync began. A failure poisons the pool.
    fn sync_devices(&self) -> Result<()> {
        let upto = self.tracker.complete_through();
        let t = std::time::Instant::now();
        let r = self.array.sync_all();
        self.counters.sync_micros.fetch_add(t.elapsed().as_micros() as u64, SeqCst);
        if let Err(e) = r {
            self.poison(&e);
            return Err(e);
        }
        self.counters.syncs.fetch_add(1, SeqCst);
        self.tracker.set_synced_through(upto);
        Ok(())
    }

    // ----- segments -----

    /// Allocates a segment for a stream. User writers wait for the GC (or run it, without a
    /// background worker) while free segments are at the reserve; they fail only when the GC
    /// can free nothing.
    pub fn allocate_segment(&self, purpose: Purpose) -> Result<u32> {
        let mut gc_waits = 0;
        loop {
            self.check_writable()?;
            if let Some(s) = self.capacity.try_allocate(&ANY_TYPE, purpose) {
                if let Err(e) = self.array.prepare_segment(s) {
                    self.poison(&e);
                    return Err(e);
                }
                // Garbage over its bound implies a round is needed, so the pass over the segment
                // table that measures garbage runs again only when it might be over.
                if self.needs_gc_round() {
                    if self.background_gc {
                        self.wake_gc();
                        if purpose == Purpose::User {
                            self.wait_for_garbage_bound()?;
                        }
                    } else if purpose == Purpose::User {
                        // Without a worker, the writer that takes a segment cleans what the
                        // garbage trigger asks for (free space is not short: it got one).
                        while self.garbage_due() && self.gc_step()? {}
                    }
                }
                return Ok(s);
            }
            match purpose {
                Purpose::Gc => {
                    if self.capacity.pending_segments() > 0 {
                        self.flush()?;
                        continue;
                    }
                    // Another worker's victim may be about to become free (its promise was
                    // smaller than what it took); wait for it a bounded time.
                    if gc_waits < 100 && self.gc_budget.lock().cleaning > 1 {
                        gc_waits += 1;
                        self.capacity.wait_for_free(0, Duration::from_millis(20));
                        continue;
                    }
                    return Err(Error::NoSpace("garbage collection ran out of free segments".into()));
                }
                Purpose::Checkpoint => return Err(Error::NoSpace("no free segment for the checkpoint".into())),
                Purpose::User => {
                    self.counters.throttled_allocations.fetch_add(1, SeqCst);
                    if self.background_gc {
                        // The worker found nothing to clean: confirm with an attempt of our own
                        // before reporting that the pool is full.
                        if self.gc_stuck.load(SeqCst) && !self.gc_step()? {
                            return Err(Error::NoSpace("every segment is full of live data".into()));
                        }
                        if self.shutting_down.load(SeqCst) {
                            return Err(Error::ShuttingDown);
                        }
                        self.wake_gc();
                        self.capacity
                            .wait_for_free(self.capacity.watermarks.gc_reserve, Duration::from_millis(50));
                    } else if !self.gc_step()? {
                        return Err(Error::NoSpace("every segment is full of live data".into()));
                    }
                }
            }
        }
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
    pub fn segment_emptied(&self, s: u32) {
        if self.capacity.segment(s).state() == SegmentState::Allocated {
            self.capacity.retire(s, SegmentState::Allocated, self.tracker.last_id(), false);
        }
    }

    // ----- garbage collection -----

    pub fn wake_gc(&self) {
        let (m, cv) = &self.gc_wake;
        *m.lock() = true;
        cv.notify_all();
    }

    /// Sleeps the GC worker until woken or the timeout passes.
    pub fn gc_wait(&self, timeout: Duration) {
        let (m, cv) = &self.gc_wake;
        let mut woken = m.lock();
        if !*woken {
            cv.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }

    /// Picks the best victim by the pool's policy and marks it. `None` when no segment would
    /// yield space.
    fn choose_victim(&self) -> Option<u32> {
        let gps = self.geo.grains_per_segment;
        // Moving v grains costs v plus their metadata pages; a victim must free more than that.
        let worth =
            |valid: u32| (valid as u64) * (self.geo.meta_interval_pages as u64 + 1) / self.geo.meta_interval_pages as u64 + 4 < gps as u64;
        let now = self.now_seq();
        loop {
            let mut oldest = u64::MAX;
            let mut cands = Vec::new();
            for (i, s) in self.capacity.segments().iter().enumerate() {
                if s.state() != SegmentState::Allocated || s.unmovable.load(SeqCst) {
                    continue;
                }
                let valid = s.valid_grains.load(SeqCst);
                if !worth(valid) {
                    continue;
                }
                let sealed = s.sealed_seq.load(SeqCst);
                oldest = oldest.min(sealed);
                cands.push((i as u32, valid, sealed, s.stream_kind()));
            }
            let best = cands
                .iter()
                .map(|&(segment, valid_grains, sealed_seq, stream)| {
                    let c = Candidate {
                        segment,
                        valid_grains,
                        capacity_grains: gps,
                        sealed_seq,
                        now_seq: now,
                        oldest_sealed_seq: oldest,
                        stream,
                    };
                    (self.policy.score(&c), segment)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))?;
            if self
                .capacity
                .segment(best.1)
                .cas_state(SegmentState::Allocated, SegmentState::Victim)
            {
                return Some(best.1);
            }
        }
    }

    /// Cleans one victim (or releases segments waiting for a sync). Returns whether space was
    /// or will be freed.
    pub fn gc_step(&self) -> Result<bool> {
        let _g = self.gc_lock.read();
        self.check_writable()?;
        // Victims wait for one sync to become free; syncing per victim would cost a device
        // cache flush each. Release them in batches, or at once when the GC itself runs dry.
        let (gc_pending, other_pending) = self.capacity.pending_counts();
        let free = self.capacity.free_segments();
        if gc_pending > 0 && (gc_pending >= self.gc_release_batch() || free <= 1) {
            self.gc_release()?;
            return Ok(true);
        }
        if other_pending > 0 && free <= self.capacity.watermarks.low {
            self.flush()?;
            return Ok(true);
        }
        let pending = gc_pending + other_pending;
        let Some(victim) = self.choose_victim() else {
            if pending > 0 {
                self.flush()?;
                return Ok(true);
            }
            return Ok(false);
        };
        let info = self.capacity.segment(victim);
        let Some(_admission) = self.gc_admit(self.segments_to_clean(info.valid_grains.load(SeqCst))) else {
            // The space left is promised to victims other workers are cleaning: let them
            // finish (and free theirs) rather than start one that could strand both halfway.
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            self.gc_wait_for_budget();
            return Ok(true);
        };
        // Its last records may still be on their way to the device (queued for write-back);
        // the GC reads the device. A victim is sealed, so are its records: wait for them
        // rather than flush, which would cut every stream's open record short.
        let in_flight: Vec<u64> = info.records.lock().iter().map(|r| r.record_id).collect();
        if !in_flight.is_empty() && !self.tracker.wait_all_complete(&in_flight, || self.is_poisoned()) {
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            return self.check_not_poisoned().map(|_| false);
        }
        let owner = info.owner_volume.load(SeqCst);
        let vol = self.volumes.read().get(&owner).cloned();
        let t = std::time::Instant::now();
        let result = match vol {
            Some(v) => v.relocate(self, victim).inspect(|_| {
                self.counters.gc_micros.fetch_add(t.elapsed().as_micros() as u64, SeqCst);
            }),
            None => Err(Error::Corrupt(format!("segment {victim} is owned by unknown volume {owner}"))),
        };
        if let Err(e) = result {
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            return Err(e);
        }
        // A writer may have replaced a victim page's map entry (so the walk skipped it) without
        // having taken the page off the victim's count yet; wait for such writers to finish.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while !info.is_empty() && self.invalidations_in_flight.load(SeqCst) > 0 {
            if std::time::Instant::now() >= deadline {
                // Writers take a replaced page off its old segment's count right after the map
                // update, so this means damage or an accounting bug, never a normal wait.
                self.counters.gc_wait_timeouts.fetch_add(1, SeqCst);
                break;
            }
            std::thread::yield_now();
        }
        if !info.is_empty() {
            // The on-disk chain no longer describes everything the map points at (damaged
            // metadata). The live pages stay readable where they are; never pick it again.
            tracing::error!(
                "segment {victim}: {} valid grains not found in its metadata; leaving it in place",
                info.valid_grains.load(SeqCst)
            );
            info.unmovable.store(true, SeqCst);
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            return Ok(false);
        }
        self.capacity.retire(victim, SegmentState::Victim, self.tracker.last_id(), true);
        self.counters.gc_segments_cleaned.fetch_add(1, SeqCst);
        Ok(true)
    }

    /// Free segments relocating `valid_grains` may take: the data and its metadata pages, plus
    /// one for the GC stream's open segment filling up on the way.
    fn segments_to_clean(&self, valid_grains: u32) -> u32 {
        valid_grains.div_ceil(self.data_grains_per_segment()) + 1
    }

    /// Admits a victim needing `segments` free segments when the segments free or about to be
    /// freed cover it and every promise to victims being cleaned. A lone worker is always
    /// admitted (it can always finish: writers stop at the GC reserve), so the GC never
    /// deadlocks; several workers clean in parallel only while space allows.
    fn gc_admit(&self, segments: u32) -> Option<GcAdmission<'_>> {
        let mut b = self.gc_budget.lock();
        let available = self.capacity.free_segments() + self.capacity.pending_segments() as u32;
        if b.cleaning > 0 && b.promised_segments + segments > available {
            return None;
        }
        b.cleaning += 1;
        b.promised_segments += segments;
        Some(GcAdmission { eng: self, segments })
    }

    /// Waits a little for a cleaning worker to finish (its victim then becomes free).
    fn gc_wait_for_budget(&self) {
        let mut b = self.gc_budget.lock();
        if b.cleaning > 0 {
            self.gc_budget_changed.wait_for(&mut b, Duration::from_millis(50));
        }
    }

    /// Frees the segments the GC has emptied so far: seals the GC streams' open records, waits
    /// for every sealed record still on its way to the device, syncs. The user streams stay
    /// open (a full flush would cut their records short for nothing).
    pub fn gc_release(&self) -> Result<usize> {
        let victims = self.capacity.gc_pending();
        if victims.is_empty() {
            return Ok(0);
        }
        // A victim also holds dead copies the GC did not move: older values of pages whose
        // newer value (or trim) is in a later record. Those records must be durable before the
        // victim is reused, or a crash could lose the newer value and the older copy both,
        // and bring back a value older still.
        let kill_through = victims
            .iter()
            .map(|&s| self.capacity.segment(s).last_kill_record.load(SeqCst))
            .max()
            .unwrap_or(0);
        for v in self.volumes_snapshot() {
            for r in v.seal_records_for_release(self, kill_through) {
                self.write_record(r)?;
            }
        }
        let in_flight = self.tracker.sealed_in_flight();
        if !self.tracker.wait_all_complete(&in_flight, || self.is_poisoned()) {
            return self.check_not_poisoned().map(|_| 0);
        }
        self.check_not_poisoned()?;
        {
            let _s = self.tracker.sync_lock.lock();
            self.sync_devices()?;
        }
        let n = self.capacity.release_segments(&victims);
        self.capacity.release_synced(self.tracker.synced_through());
        Ok(n)
    }

    /// Grains of a segment that hold data: all but the metadata pages.
    pub fn data_grains_per_segment(&self) -> u32 {
        let gps = self.geo.grains_per_segment;
        gps - gps.div_ceil(self.geo.meta_interval_pages + 1)
    }

    /// How many cleaned segments the GC lets wait for one shared sync.
    fn gc_release_batch(&self) -> u32 {
        (self.geo.total_segments / 512).clamp(2, 16)
    }

    /// Whether the background worker has work: free segments below the low watermark, or
    /// pending segments that one sync would release while free segments run low.
    pub fn needs_gc_round(&self) -> bool {
        self.capacity.free_segments() < self.capacity.watermarks.low || self.release_due() || self.garbage_due()
    }

    /// Whether the pool runs with a garbage trigger and the sealed segments (victims being
    /// cleaned and segments waiting for release left out) hold more garbage than it allows.
    /// Cleaning at a fixed share of garbage bounds space amplification whatever the free space:
    /// it is how SepBIT and cloud log stores run, and what their write-amplification figures
    /// assume.
    pub fn garbage_due(&self) -> bool {
        self.garbage_above(0.0)
    }

    /// Holds a writer while garbage is more than [`GARBAGE_SLACK`] above the garbage trigger, so
    /// that the bound holds however fast users write: like free space, the share of garbage is
    /// a promise the GC keeps by slowing writers down when it falls behind.
    fn wait_for_garbage_bound(&self) -> Result<()> {
        let mut throttled = false;
        while self.garbage_above(GARBAGE_SLACK) && !self.gc_stuck.load(SeqCst) {
            self.check_writable()?;
            if self.shutting_down.load(SeqCst) {
                return Err(Error::ShuttingDown);
            }
            if !throttled {
                throttled = true;
                self.counters.throttled_allocations.fetch_add(1, SeqCst);
            }
            self.wake_gc();
            self.capacity.wait_for_free(u32::MAX, Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether garbage is above the garbage trigger plus `slack` (a share of the space).
    fn garbage_above(&self, slack: f64) -> bool {
        let Some(ratio) = self.gc_garbage_ratio else {
            return false;
        };
        let data_per_segment = self.data_grains_per_segment() as u64;
        let (mut space, mut valid) = (0u64, 0u64);
        for s in self.capacity.segments() {
            if s.state() == SegmentState::Allocated && !s.unmovable.load(SeqCst) {
                space += data_per_segment;
                valid += (s.valid_grains.load(SeqCst) as u64).min(data_per_segment);
            }
        }
        (space - valid) as f64 > (ratio + slack) * space as f64
    }

    /// Whether free segments are down to the release watermark while segments emptied by
    /// overwrites wait for a sync.
    fn release_due(&self) -> bool {
        self.capacity.free_segments() <= self.capacity.watermarks.release && self.capacity.pending_counts().1 > 0
    }

    /// One round of the background worker: release what a sync releases, then clean until the
    /// high watermark (and, with a garbage trigger, until garbage is back under it).
    pub fn gc_round(&self) -> Result<()> {
        let wm = self.capacity.watermarks;
        if self.release_due() {
            self.flush()?;
        }
        while (self.capacity.free_segments() < wm.high || self.garbage_due()) && !self.shutting_down.load(SeqCst) {
            if !self.gc_step()? {
                self.gc_stuck.store(true, SeqCst);
                self.capacity.changed.notify_all();
                return Ok(());
            }
            self.gc_stuck.store(false, SeqCst);
        }
        Ok(())
    }

    /// Grains the pool can hold as mapped data while leaving the GC room to work: the data
    /// grains of every segment except those the watermarks, open streams and GC need.
    pub fn usable_grains(&self) -> u64 {
        let streams = self.volumes.read().values().map(|v| v.stream_count() as u64).sum();
        self.usable_grains_for_streams(streams)
    }

    /// [`Engine::usable_grains`] when the volumes have `streams` streams in all: each stream
    /// may hold a partly written segment whose rest no other stream can use.
    pub fn usable_grains_for_streams(&self, streams: u64) -> u64 {
        let wm = self.capacity.watermarks;
        let data_per_segment = self.data_grains_per_segment() as u64;
        let reserved = wm.high as u64 + streams + 2;
        let segs = (self.geo.total_segments as u64).saturating_sub(reserved);
        // Keep 3% of the remaining space free so the GC never degenerates into copying full
        // segments around.
        segs * data_per_segment * 97 / 100
    }
}

/// Bumps the generation of `meta` and writes it into the slot the generation selects (the two
/// slots alternate, so a torn write leaves the previous copy intact), then syncs. A slot in a
/// sequential zone is reset first (the other slot still holds the previous generation).
pub fn write_meta_slot(dev: &dyn crate::device::Device, layout: &DeviceLayout, meta: &mut PoolMeta) -> Result<()> {
    // The generation numbers the epochs of ids and sequence numbers, which must fit the format.
    if meta.generation + 1 >= MAX_EPOCHS {
        return Err(Error::Exhausted(format!(
            "device {} has written its pool metadata {} times, the most the format numbers",
            dev.name(),
            meta.generation
        )));
    }
    meta.generation += 1;
    let bytes = meta.encode();
    let mut buf = crate::util::AlignedBuf::zeroed(bytes.len());
    buf.copy_from_slice(&bytes);
    let offset = layout.meta_slot_offsets[(meta.generation % 2) as usize];
    let io = |op, source| Error::Io {
        device: dev.name().to_string(),
        op,
        offset,
        source,
    };
    if let Some(zone) = crate::layout::in_sequential_zone(dev, offset)? {
        let z = dev.zones().expect("a sequential zone is on a zoned device");
        z.reset_zone(zone).map_err(|e| io("reset zone", e))?;
    }
    dev.write_at(&buf, offset).map_err(|e| io("write pool metadata", e))?;
    dev.sync().map_err(|e| io("sync pool metadata", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, MemoryDevice};

    #[test]
    fn the_pool_metadata_generation_stops_where_sequence_numbers_would_outgrow_the_format() {
        let dev = MemoryDevice::new("mem0", 16 << 20);
        let (layout, _) = DeviceLayout::plan(&dev, 1 << 20).unwrap();
        let mut meta = PoolMeta {
            pool_id: 7,
            generation: MAX_EPOCHS - 2,
            session_id: 1,
            clean: true,
            next_volume_id: 1,
            volumes: Vec::new(),
            checkpoint: None,
        };
        write_meta_slot(&dev, &layout, &mut meta).unwrap();
        assert_eq!(meta.generation, MAX_EPOCHS - 1);
        // The largest epoch's sequence numbers still fit the format.
        let last_seq_of_largest_epoch = meta.generation << SEQ_EPOCH_SHIFT | ((1 << SEQ_EPOCH_SHIFT) - 1);
        assert_eq!(last_seq_of_largest_epoch, crate::format::MAX_SEQ);
        let mut before = vec![0u8; 2 * 4096];
        dev.read_at(&mut before, layout.meta_slot_offsets[0]).unwrap();
        let err = write_meta_slot(&dev, &layout, &mut meta).unwrap_err();
        assert!(matches!(err, Error::Exhausted(_)), "{err}");
        assert_eq!(meta.generation, MAX_EPOCHS - 1, "a refused write leaves the generation alone");
        let mut after = vec![0u8; 2 * 4096];
        dev.read_at(&mut after, layout.meta_slot_offsets[0]).unwrap();
        assert_eq!(before, after, "nothing was written");
    }
}
