//! The engine: the space manager that sits on the log. It holds the volumes (as controllers),
//! hands segments to the log's streams with throttling ([`crate::log::SegmentSource`]), and
//! runs garbage collection ([`gc`]: victim choice by the pool's policy, admission of victims
//! while space is short, relocation through the owning controller, and release of cleaned
//! segments once the metadata that emptied them is durable).
//!
//! It calls down into the log and calls up only through [`Controller::relocate`], the GC's one
//! question to a volume. Flush, records and durability are the log's ([`crate::log`]).
//!
//! Invariants: GC never loses live data (a move updates the map only if the page still maps to
//! the victim, and a victim is retired only when its counts are zero); a cleaned segment is
//! reused only after the records that emptied it are durable; writers are throttled, not
//! failed, while the GC can still free space.

pub(crate) mod gc;

use gc::GcBudget;

use crate::controller::Controller;
use crate::device::StorageType;
use crate::error::{Error, Result};
use crate::log::capacity::{PendingCounts, Purpose, SegmentState};
use crate::log::{Log, SegmentSource, ANY_TYPE};
use crate::policy::victim::{Candidate, PoolShape, VictimPolicy};
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// The space manager and GC over a log (see the module documentation).
pub struct Engine {
    /// The log the volumes write and the GC cleans.
    pub log: Arc<Log>,
    /// Every volume, by id, as the core sees it: a controller.
    pub volumes: RwLock<BTreeMap<u32, Arc<dyn Controller>>>,
    policy: Arc<dyn VictimPolicy>,
    /// The victim policies of volumes that chose their own, by volume id; every other
    /// volume's segments are ranked by `policy`.
    volume_policies: RwLock<BTreeMap<u32, Arc<dyn VictimPolicy>>>,
    /// Held shared while a victim is cleaned (several GC workers may clean at once, each its
    /// own victim, claimed by compare-and-swap) and exclusively by volume deletion.
    pub gc_lock: RwLock<()>,
    background_gc: bool,
    /// When set, the GC also runs while garbage exceeds this share of the data space of the
    /// sealed segments (SepBIT's trigger; see [`Engine::garbage_due`]).
    gc_garbage_ratio: Option<f64>,
    /// Set by [`crate::Pool::close`] (and a dropped pool): the GC and maintenance workers end,
    /// and a writer that would wait for them gets [`Error::ShuttingDown`] instead.
    pub shutting_down: AtomicBool,
    /// Set by [`crate::Pool::begin_shutdown`]: long background jobs (a rebuild) stop at their
    /// next step. The GC keeps running, because the pool still serves, and its close still
    /// writes the write buffer down, until the close itself stops the GC.
    pub stopping_long_jobs: AtomicBool,
    /// The running rebuild's rate limit (bytes a second; 0: none), read before each of its
    /// segments so that [`crate::Pool::set_rebuild_rate`] takes effect at once. The pool
    /// metadata keeps it with the rebuild's progress.
    pub rebuild_rate_bytes_per_sec: AtomicU64,
    /// Set when the GC found nothing to clean while writers wait: the pool is really full.
    pub gc_stuck: AtomicBool,
    gc_wake: (Mutex<bool>, Condvar),
    /// Victims being cleaned and the free segments promised to them (see [`Engine::gc_admit`]).
    gc_budget: Mutex<GcBudget>,
    gc_budget_changed: Condvar,
    /// The write buffer above the volumes' controllers (off unless the pool enables it).
    pub dirty: crate::dirty::DirtyPages,
    /// Spreads the wait for the GC over user writes when `pace_user_writes` (asked for at
    /// open, with a background GC only).
    pub pacer: crate::pacing::WritePacer,
    pace_user_writes: bool,
}

/// How far (as a share of the written space) garbage may run above the garbage trigger before
/// writers wait for the GC: enough that they do not stop at every segment, small enough that
/// the bound is what the user asked for.
const GARBAGE_SLACK: f64 = 0.01;
impl Engine {
    /// The engine over `log`, cleaning with `policy`. Call [`Engine::attach`] once it is in an
    /// `Arc`, so that the log's streams get their segments from it.
    /// `pace_user_writes`: pace user writes (see [`crate::pacing`]); only with a background
    /// GC, whose pace the pacer measures (the pool decides, and widens the log's watermarks
    /// to match).
    pub fn new(
        log: Arc<Log>,
        policy: Box<dyn VictimPolicy>,
        background_gc: bool,
        gc_garbage_ratio: Option<f64>,
        pace_user_writes: bool,
    ) -> Engine {
        let policy: Arc<dyn VictimPolicy> = Arc::from(policy);
        let pacer = crate::pacing::WritePacer::new(Self::user_bytes_per_segment(&log));
        if policy.watch_writes(&Self::pool_shape(&log)) {
            log.write_watchers.set_pool(Some(policy.clone()));
        }
        Engine {
            log,
            volumes: RwLock::new(BTreeMap::new()),
            policy,
            volume_policies: RwLock::new(BTreeMap::new()),
            gc_lock: RwLock::new(()),
            background_gc,
            gc_garbage_ratio,
            shutting_down: AtomicBool::new(false),
            stopping_long_jobs: AtomicBool::new(false),
            rebuild_rate_bytes_per_sec: AtomicU64::new(0),
            gc_stuck: AtomicBool::new(false),
            gc_wake: (Mutex::new(false), Condvar::new()),
            gc_budget: Mutex::new(GcBudget::default()),
            gc_budget_changed: Condvar::new(),
            dirty: crate::dirty::DirtyPages::default(),
            pacer,
            pace_user_writes,
        }
    }

    /// Paces one user write of `bytes` (see [`crate::pacing`]).
    pub fn pace_user_write(&self, bytes: u64) {
        if self.pace_user_writes {
            self.pacer.pace(
                bytes,
                || self.free_for_pacing(),
                || self.log.capacity().watermarks(),
                self.log.write_back().backlog(),
            );
        }
    }

    /// Admits one user write of `bytes` without waiting: the instant its turn comes while
    /// writes are paced, before which it is not to be acknowledged (see
    /// [`crate::pool::Volume::write_with_ack_time`]).
    pub fn admit_user_write(&self, bytes: u64) -> Option<std::time::Instant> {
        if self.pace_user_writes {
            self.pacer.admit(
                bytes,
                || self.free_for_pacing(),
                || self.log.capacity().watermarks(),
                self.log.write_back().backlog(),
            )
        } else {
            None
        }
    }

    /// Free segments as the pacer counts them: victims cleaned and waiting for their release
    /// sync are as good as free.
    fn free_for_pacing(&self) -> u32 {
        let capacity = self.log.capacity();
        capacity.free_segments() + capacity.pending_counts().gc
    }

    /// A writer waits for the GC: counted (a throttled allocation), and the pacer told that
    /// its rate was too high.
    fn writer_stalled(&self) {
        self.log.counters().throttled_allocations.fetch_add(1, SeqCst);
        if self.pace_user_writes {
            self.pacer.stalled();
        }
    }

    /// Makes `eng` the log's segment source.
    pub fn attach(eng: &Arc<Engine>) {
        let weak: std::sync::Weak<Engine> = Arc::downgrade(eng);
        eng.log.set_segment_source(weak);
    }

    /// Adds a volume: the GC can clean its segments, and the log seals and counts its streams.
    pub fn add_volume(&self, vol: Arc<dyn Controller>) {
        self.log.add_streams(vol.id(), vol.streams());
        self.volumes.write().insert(vol.id(), vol);
        self.protect_restricted_classes();
    }

    /// Tells the capacity manager which storage classes volumes are restricted to, so that
    /// other writers leave each its GC reserve (see [`crate::log::capacity::Capacity::try_allocate`]).
    /// Called whenever the set of volumes changes.
    pub fn protect_restricted_classes(&self) {
        let mut classes: Vec<(&'static [StorageType], u32)> = Vec::new();
        for v in self.volumes.read().values() {
            let t = v.streams().types();
            if t.len() == ANY_TYPE.len() {
                continue;
            }
            let gc_streams = v
                .streams()
                .layout()
                .kinds()
                .filter(|k| matches!(k, crate::format::StreamKind::Gc(_)))
                .count() as u32;
            match classes.iter_mut().find(|(c, _)| *c == t) {
                Some((_, extra)) => *extra += gc_streams,
                None => classes.push((t, gc_streams)),
            }
        }
        self.log.capacity().set_protected_classes(classes);
    }

    /// One pass of every volume's background work, and a paced pool's GC band fitted to its
    /// surplus space ([`crate::log::capacity::Capacity::fit_paced_band`]); whether any volume
    /// did something.
    pub fn maintain(&self) -> Result<bool> {
        let vols: Vec<Arc<dyn Controller>> = self.volumes.read().values().cloned().collect();
        let mut busy = false;
        for v in vols {
            busy |= v.maintain(&self.log)?;
        }
        busy |= self.log.fill_holes()?;
        self.log.capacity().fit_paced_band();
        Ok(busy)
    }

    /// Makes every write that returned before this call durable: the write buffer's pages go
    /// down to their controllers, then the log flushes.
    pub fn flush(&self) -> Result<()> {
        self.dirty.destage_all(&self.log)?;
        self.log.flush()
    }

    /// Write-behind, asked for by a front-end that answered a write and has no other request
    /// of its client under way: when the writers flush after every write
    /// ([`Log::write_behind_due`]), what the next flush would write (the write buffer's pages,
    /// the open user records) is written now, while the reply travels, and the flush is left
    /// only the sync. Otherwise nothing.
    pub fn write_behind(&self) -> Result<()> {
        if !self.log.write_behind_due() || !self.log.claim_write_ahead() {
            return Ok(());
        }
        self.dirty.destage_all(&self.log)?;
        self.log.write_ahead()
    }

    // ----- segments -----

    /// Allocates a segment for a stream. User writers wait for the GC (or run it, without a
    /// background worker) while free segments are at the reserve; they fail only when the GC
    /// can free nothing.
    pub fn allocate_segment(&self, purpose: Purpose, types: &'static [StorageType]) -> Result<u32> {
        let mut gc_waits = 0;
        loop {
            self.log.check_writable()?;
            if let Some(s) = self.log.allocate_online(types, purpose) {
                if let Err(e) = self.log.note_log_segment(s) {
                    self.log.capacity().unallocate(s);
                    return Err(e);
                }
                self.log.prepare_segment(s)?;
                // Garbage over its bound implies a round is needed, so the pass over the segment
                // table that measures garbage runs again only when it might be over.
                if self.needs_gc_round() {
                    if self.background_gc {
                        self.wake_gc();
                        if matches!(purpose, Purpose::User | Purpose::Trim) {
                            self.wait_for_garbage_bound()?;
                        }
                    } else if matches!(purpose, Purpose::User | Purpose::Trim) {
                        // Without a worker, the writer that takes a segment cleans what the
                        // garbage trigger asks for (free space is not short: it got one).
                        while self.garbage_due() && self.gc_step()? {}
                    }
                }
                return Ok(s);
            }
            match purpose {
                Purpose::Gc => {
                    let pending = self.log.capacity().pending_counts();
                    if pending.freed_by_flush() {
                        self.log.flush()?;
                    }
                    if pending != PendingCounts::default() {
                        // Released segments may be on their way through another thread's
                        // discard: wait for them rather than spin.
                        self.log.capacity().wait_for_free(types, 0, Duration::from_millis(5));
                        continue;
                    }
                    // Another worker's victim may be about to become free (its promise was
                    // smaller than what it took); wait for it a bounded time.
                    if gc_waits < 100 && self.gc_budget.lock().cleaning > 1 {
                        gc_waits += 1;
                        self.log.capacity().wait_for_free(types, 0, Duration::from_millis(20));
                        continue;
                    }
                    return Err(self.log.out_of_space("garbage collection ran out of free segments"));
                }
                Purpose::Checkpoint => return Err(self.log.out_of_space("no free segment for the checkpoint")),
                // The fast tier borrows segments from the capacity manager directly, never here.
                Purpose::Tier => return Err(self.log.out_of_space("no free segment for the fast tier")),
                Purpose::User | Purpose::Trim => {
                    self.writer_stalled();
                    if self.background_gc {
                        // The worker found nothing to clean: confirm with an attempt of our own
                        // before reporting that the pool is full.
                        if self.gc_stuck.load(SeqCst) && !self.gc_step()? {
                            return Err(self.log.out_of_space("every segment is full of live data"));
                        }
                        if self.shutting_down.load(SeqCst) {
                            return Err(Error::ShuttingDown);
                        }
                        self.wake_gc();
                        self.log
                            .capacity()
                            .wait_for_free(types, self.log.capacity().watermarks().gc_reserve, Duration::from_millis(50));
                    } else if !self.gc_step()? {
                        return Err(self.log.out_of_space("every segment is full of live data"));
                    }
                }
            }
        }
    }

    // ----- garbage collection -----
}

impl SegmentSource for Engine {
    fn allocate_segment(&self, purpose: Purpose, types: &'static [StorageType]) -> Result<u32> {
        Engine::allocate_segment(self, purpose, types)
    }
}

impl crate::dirty::BufferOwner for Engine {
    fn write_buffer(&self) -> &crate::dirty::DirtyPages {
        &self.dirty
    }
    fn log(&self) -> &Log {
        &self.log
    }
}
