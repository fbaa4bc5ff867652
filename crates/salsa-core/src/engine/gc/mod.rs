//! The garbage collector: victim choice (each segment ranked by the victim policy of the
//! volume that owns it, or the pool's), admission of victims while space is short (a budget of
//! the segments the workers cleaning at once may still need), relocation through the owning
//! controller, release of cleaned segments once the records that emptied them are durable,
//! and the background workers' loop.
//!
//! Invariants: a segment is cleaned only after one worker took it from `Allocated` to
//! `Victim` (a compare-and-swap, so two workers never clean the same segment); a move updates
//! the map only if the page still maps to the victim (the controller's compare-and-swap); a
//! cleaned segment is retired only when its live counts are zero and reused only after the
//! records that emptied it are durable.
//!
//! Where each part lives: [`victim`] ranks segments and picks one; [`admission`] decides
//! whether one more worker may clean now; [`triggers`] says when the GC must run (free
//! segments, a restricted class short of its types, a garbage bound) and holds writers back;
//! [`worker`] is the background loop; this module cleans one victim ([`Engine::gc_step`]) and
//! releases cleaned segments ([`Engine::gc_release`]). Moving a victim's live pages is each
//! controller's [`crate::controller::Controller::relocate`], the GC's one call up.

mod admission;
mod triggers;
mod victim;
mod worker;

pub(in crate::engine) use admission::GcBudget;
pub(crate) use worker::gc_worker;

use super::*;

impl Engine {
    /// Cleans one victim (or releases segments waiting for a sync). Returns whether space was
    /// or will be freed.
    pub fn gc_step(&self) -> Result<bool> {
        let _g = self.gc_lock.read();
        self.log.check_writable()?;
        // Victims wait for one sync to become free; syncing per victim would cost a device
        // cache flush each. Release them in batches, or at once when free segments run low
        // ([`crate::log::capacity::Watermarks::gc_early_release_at`]).
        let pending = self.log.capacity().pending_counts();
        let free = self.log.capacity().free_segments();
        let wm = self.log.capacity().watermarks();
        let batch = wm.gc_release_batch(self.log.geo().total_segments);
        if pending.gc > 0 && (pending.gc >= batch || free <= wm.gc_early_release_at(batch)) {
            self.gc_release()?;
            return Ok(true);
        }
        if free <= self.log.capacity().watermarks().low {
            if pending.awaiting_sync > 0 {
                self.log.flush()?;
                return Ok(true);
            }
            if pending.discarding > 0 {
                // Released segments are on their way through another thread's discard,
                // which frees them a few at a time: cheaper to wait than to clean a victim.
                self.wait_for_discards(free);
                return Ok(true);
            }
        }
        let Some(victim) = self.choose_victim(self.gc_focus()) else {
            return self.free_without_a_victim(&pending, free);
        };
        let info = self.log.capacity().segment(victim);
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
        if !self.log.wait_segment_written(victim) {
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            return self.log.check_not_poisoned().map(|_| false);
        }
        let owner = info.owner_volume.load(SeqCst);
        let vol = self.volumes.read().get(&owner).cloned();
        let t = std::time::Instant::now();
        let result = match vol {
            Some(v) => v.relocate(&self.log, victim).inspect(|_| {
                self.log.counters().gc_micros.fetch_add(t.elapsed().as_micros() as u64, SeqCst);
            }),
            None => Err(Error::Corrupt(format!("segment {victim} is owned by unknown volume {owner}"))),
        };
        if let Err(e) = result {
            info.cas_state(SegmentState::Victim, SegmentState::Allocated);
            return Err(e);
        }
        self.wait_for_invalidations(info);
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
        self.log
            .capacity()
            .retire(victim, SegmentState::Victim, self.log.last_record_id(), true);
        self.log.counters().gc_segments_cleaned.fetch_add(1, SeqCst);
        Ok(true)
    }

    /// When no segment can be a victim: frees space another way if there is one (a flush
    /// that releases segments, discards under way, other workers' victims); whether space was
    /// or will be freed.
    pub(super) fn free_without_a_victim(&self, pending: &crate::log::capacity::PendingCounts, free: u32) -> Result<bool> {
        if pending.freed_by_flush() {
            self.log.flush()?;
            return Ok(true);
        }
        if pending.discarding > 0 {
            self.wait_for_discards(free);
            return Ok(true);
        }
        if self.gc_budget.lock().cleaning > 0 {
            // Every candidate is another worker's victim, whose space comes free when it
            // is done: not a pool full of live data. (A writer that cleaned for itself
            // while four slowed-down workers held a small tier's victims reported the
            // pool full; tests/hybrid.rs under load.)
            self.gc_wait_for_budget();
            return Ok(true);
        }
        Ok(false)
    }

    /// A writer may have replaced a victim page's map entry (so the walk skipped it) without
    /// having taken the page off the victim's count yet; waits (up to a second) for such
    /// writers to finish.
    pub(super) fn wait_for_invalidations(&self, info: &crate::log::capacity::SegmentInfo) {
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while !info.is_empty() && self.log.invalidations_in_flight() {
            if std::time::Instant::now() >= deadline {
                // Writers take a replaced page off its old segment's count right after the map
                // update, so this means damage or an accounting bug, never a normal wait.
                self.log.counters().gc_wait_timeouts.fetch_add(1, SeqCst);
                break;
            }
            std::thread::yield_now();
        }
    }

    /// Frees the segments the GC has emptied so far: seals the GC streams' open records (and
    /// those the victims' last kills are in), waits for every sealed record still on its way to
    /// the device, syncs ([`Log::sync_for_release`]). The user streams stay
    /// open (a full flush would cut their records short for nothing).
    pub fn gc_release(&self) -> Result<usize> {
        let victims = self.log.capacity().gc_pending();
        if victims.is_empty() {
            return Ok(0);
        }
        // A victim also holds dead copies the GC did not move: older values of pages whose
        // newer value (or trim) is in a later record. Those records must be durable before the
        // victim is reused, or a crash could lose the newer value and the older copy both,
        // and bring back a value older still.
        let kill_through = victims
            .iter()
            .map(|&s| self.log.capacity().segment(s).last_kill_record.load(SeqCst))
            .max()
            .unwrap_or(0);
        if !self.log.sync_for_release(kill_through)? {
            return Ok(0);
        }
        let n = self.log.capacity().release_segments(&victims);
        self.log.release_synced();
        Ok(n)
    }

    /// Waits a bounded time for segments another thread is discarding to come free (more than
    /// `free`). A flush would free none of them, only cut every stream's open record short.
    pub(super) fn wait_for_discards(&self, free: u32) {
        self.log.capacity().wait_for_free(&StorageType::ALL, free, Duration::from_millis(5));
    }
}
