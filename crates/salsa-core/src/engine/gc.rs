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

use super::*;

/// One victim policy's view of its segments during a victim choice.
struct Ranking {
    /// Its best candidate: (score, segment, valid grains).
    best: (f64, u32, u32),
    /// Garbage grains in all its candidates.
    garbage_grains: u64,
}

/// What the GC workers cleaning at this moment may still need.
#[derive(Default)]
pub(super) struct GcBudget {
    pub(super) cleaning: u32,
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

impl Engine {
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

    /// Ranks volume `volume`'s segments with `policy` from now on (`None`: with the pool's).
    pub fn set_volume_victim_policy(&self, volume: u32, policy: Option<Arc<dyn VictimPolicy>>) {
        let mut p = self.volume_policies.write();
        let watcher = policy
            .as_ref()
            .map(|own| own.watch_writes(&Self::pool_shape(&self.log)).then(|| own.clone()));
        self.log.write_watchers.set_volume(volume, watcher);
        match policy {
            Some(policy) => p.insert(volume, policy),
            None => p.remove(&volume),
        };
    }

    /// What the pool's victim policy reports of its own state ([`VictimPolicy::state`]).
    pub fn victim_policy_state(&self) -> Vec<(String, f64)> {
        self.policy.state()
    }

    /// User bytes one segment holds: its data grains (the pacer counts the space the GC makes
    /// in them).
    pub(super) fn user_bytes_per_segment(log: &Log) -> u64 {
        log.geo().data_grains_per_segment() as u64 * log.geo().grain_bytes as u64
    }

    /// What a write-watching victim policy is told of the pool.
    pub(super) fn pool_shape(log: &Log) -> PoolShape {
        PoolShape {
            usable_grains: log.usable_grains_for_streams(2),
            segment_data_grains: log.geo().data_grains_per_segment(),
        }
    }

    /// Picks the best victim and marks it. `None` when no segment would yield space.
    ///
    /// Each volume with a victim policy of its own ranks its own segments; the pool's policy
    /// ranks everything else. Scores of different policies do not compare, so the ranking
    /// whose candidates hold the most garbage is cleaned from, with its own best segment: a
    /// volume is cleaned as much as it makes garbage, each by its own choice. (Taking the
    /// best with the fewest valid grains instead starved a FIFO volume, whose oldest segment
    /// is rarely the emptiest.)
    ///
    /// With `only`, segments of other storage types are left alone (a restricted class of
    /// streams is short of segments: see [`Engine::short_types`]).
    fn choose_victim(&self, only: Option<&[StorageType]>) -> Option<u32> {
        let gps = self.log.geo().grains_per_segment;
        // Moving v grains costs v plus their metadata pages; a victim must free more than that.
        let worth = |valid: u32| {
            (valid as u64) * (self.log.geo().meta_interval_pages as u64 + 1) / self.log.geo().meta_interval_pages as u64 + 4 < gps as u64
        };
        let now = self.log.now_seq();
        loop {
            let mut oldest = u64::MAX;
            let mut cands = Vec::new();
            for (i, s) in self.log.capacity().segments().iter().enumerate() {
                if s.state() != SegmentState::Allocated || s.unmovable.load(SeqCst) {
                    continue;
                }
                if only.is_some_and(|t| !t.contains(&s.storage_type)) {
                    continue;
                }
                let valid = s.valid_grains.load(SeqCst);
                if !worth(valid) {
                    continue;
                }
                let sealed = s.sealed_seq.load(SeqCst);
                oldest = oldest.min(sealed);
                cands.push((i as u32, valid, sealed, s.stream_kind(), s.owner_volume.load(SeqCst)));
            }
            // Candidates grouped by the policy that ranks them, each group scored in one call
            // (a policy written in Python pays its call overhead once per choice, not per
            // segment).
            let policies = self.volume_policies.read();
            let policy_of = |ranking: &Option<u32>| match ranking {
                Some(owner) => policies[owner].as_ref(),
                None => self.policy.as_ref(),
            };
            let mut rankings: Vec<Ranking> = Vec::new();
            let mut groups: Vec<(Option<u32>, Vec<Candidate>)> = Vec::new();
            for &(segment, valid_grains, sealed_seq, stream, owner) in &cands {
                let c = Candidate {
                    segment,
                    valid_grains,
                    capacity_grains: gps,
                    sealed_seq,
                    now_seq: now,
                    oldest_sealed_seq: oldest,
                    stream,
                    live_bands: 0,
                };
                let ranking = policies.contains_key(&owner).then_some(owner);
                match groups.iter_mut().find(|g| g.0 == ranking) {
                    Some(g) => g.1.push(c),
                    None => groups.push((ranking, vec![c])),
                }
            }
            // The map walk only when a policy that ranks candidates of this choice asks for it,
            // and only its candidates get the counts.
            if groups.iter().any(|(ranking, _)| policy_of(ranking).counts_live_bands()) {
                let census = self.live_band_census();
                for (ranking, group) in &mut groups {
                    if policy_of(ranking).counts_live_bands() {
                        for c in group.iter_mut() {
                            c.live_bands = census[c.segment as usize];
                        }
                    }
                }
            }
            let mut scores = Vec::new();
            for (ranking, group) in &groups {
                let policy = policy_of(ranking);
                scores.clear();
                policy.score_batch(group, &mut scores);
                assert_eq!(scores.len(), group.len(), "a victim policy must score every candidate");
                let mut r = Ranking {
                    best: (f64::INFINITY, u32::MAX, u32::MAX),
                    garbage_grains: 0,
                };
                for (c, &score) in group.iter().zip(&scores) {
                    r.garbage_grains += gps.saturating_sub(c.valid_grains) as u64;
                    // A NaN (a policy's bug) ranks last rather than first.
                    let score = if score.is_nan() { f64::INFINITY } else { score };
                    if r.best.1 == u32::MAX || score.total_cmp(&r.best.0).is_lt() {
                        r.best = (score, c.segment, c.valid_grains);
                    }
                }
                rankings.push(r);
            }
            drop(policies);
            let best = rankings
                .iter()
                .max_by(|a, b| a.garbage_grains.cmp(&b.garbage_grains).then(b.best.2.cmp(&a.best.2)))?
                .best;
            if self
                .log
                .capacity()
                .segment(best.1)
                .cas_state(SegmentState::Allocated, SegmentState::Victim)
            {
                return Some(best.1);
            }
        }
    }

    /// Per segment, the distinct logical bands its live pages belong to (see
    /// [`Candidate::live_bands`]), from a walk of every volume's map. Pages are visited in
    /// address order, so a segment meets each band in one run: remembering the last band
    /// counted per segment is enough to count distinct ones. Writers may move pages during
    /// the walk; a policy gets a count that was true during the walk, not at its end.
    pub fn live_band_census(&self) -> Vec<u32> {
        let geo = self.log.geo();
        let segments = self.log.capacity().segments().len();
        let segment_bytes = geo.grains_per_segment as u64 * geo.grain_bytes as u64;
        let mut bands = vec![0u32; segments];
        let mut last: Vec<(u32, u64)> = vec![(u32::MAX, u64::MAX); segments];
        for (&volume, controller) in self.volumes.read().iter() {
            let page_bytes = controller.page_bytes() as u64;
            let band_pages = (segment_bytes / page_bytes).max(1);
            for page in 0..controller.size_bytes() / page_bytes {
                let Some(grain) = controller.page_location(page) else { continue };
                let s = geo.segment_of(grain) as usize;
                let key = (volume, page / band_pages);
                if s < segments && last[s] != key {
                    last[s] = key;
                    bands[s] += 1;
                }
            }
        }
        bands
    }

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
    fn free_without_a_victim(&self, pending: &crate::log::capacity::PendingCounts, free: u32) -> Result<bool> {
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
    fn wait_for_invalidations(&self, info: &crate::log::capacity::SegmentInfo) {
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

    /// Free segments relocating `valid_grains` may take: the data and its metadata pages, plus
    /// one for the GC stream's open segment filling up on the way.
    fn segments_to_clean(&self, valid_grains: u32) -> u32 {
        valid_grains.div_ceil(self.log.geo().data_grains_per_segment()) + 1
    }

    /// Admits a victim needing `segments` free segments when the segments free or about to be
    /// freed cover it and every promise to victims being cleaned. A lone worker is always
    /// admitted (it can always finish: writers stop at the GC reserve), so the GC never
    /// deadlocks; several workers clean in parallel only while space allows.
    fn gc_admit(&self, segments: u32) -> Option<GcAdmission<'_>> {
        let mut b = self.gc_budget.lock();
        let available = self.log.capacity().free_segments() + self.log.capacity().pending_segments() as u32;
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
    fn wait_for_discards(&self, free: u32) {
        self.log.capacity().wait_for_free(&StorageType::ALL, free, Duration::from_millis(5));
    }

    /// Whether the background worker has work: free segments below the low watermark, or
    /// pending segments that one sync would release while free segments run low.
    pub fn needs_gc_round(&self) -> bool {
        let wm = self.log.capacity().watermarks();
        self.log.capacity().free_segments() < wm.low || self.release_due() || self.garbage_due() || self.short_types(wm.low).is_some()
    }

    /// The storage types some volume's streams are restricted to (its storage class; a hybrid
    /// volume's slow tier), when fewer than `below` (plus the class's extra reserve, see
    /// [`crate::log::capacity::Capacity::try_allocate`]) of their segments are free: the pool may have free
    /// segments of other types that those streams cannot use, so the GC must clean segments of
    /// these types in particular.
    pub fn short_types(&self, below: u32) -> Option<&'static [StorageType]> {
        let volumes = self.volumes.read();
        volumes
            .values()
            .map(|v| v.streams().types())
            .filter(|t| t.len() < ANY_TYPE.len())
            .find(|t| self.log.capacity().free_segments_of(t) < below + self.log.capacity().class_extra_reserve(t))
    }

    /// The types the GC should clean now: any (`None`) while the pool as a whole is short,
    /// else those of a restricted class that is ([`Engine::short_types`]).
    fn gc_focus(&self) -> Option<&'static [StorageType]> {
        let wm = self.log.capacity().watermarks();
        if self.log.capacity().free_segments() < wm.high {
            return None;
        }
        self.short_types(wm.high)
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
    pub(super) fn wait_for_garbage_bound(&self) -> Result<()> {
        let mut throttled = false;
        while self.garbage_above(GARBAGE_SLACK) && !self.gc_stuck.load(SeqCst) {
            self.log.check_writable()?;
            if self.shutting_down.load(SeqCst) {
                return Err(Error::ShuttingDown);
            }
            if !throttled {
                throttled = true;
                self.writer_stalled();
            }
            self.wake_gc();
            self.log.capacity().wait_for_free(&ANY_TYPE, u32::MAX, Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether garbage is above the garbage trigger plus `slack` (a share of the space).
    fn garbage_above(&self, slack: f64) -> bool {
        let Some(ratio) = self.gc_garbage_ratio else {
            return false;
        };
        let data_per_segment = self.log.geo().data_grains_per_segment() as u64;
        let (mut space, mut valid) = (0u64, 0u64);
        for s in self.log.capacity().segments() {
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
        self.log.capacity().free_segments() <= self.log.capacity().watermarks().release
            && self.log.capacity().pending_counts().awaiting_sync > 0
    }

    /// One round of the background worker: release what a sync releases, then clean until the
    /// high watermark (and, with a garbage trigger, until garbage is back under it).
    pub fn gc_round(&self) -> Result<()> {
        let wm = self.log.capacity().watermarks();
        if self.release_due() {
            self.log.flush()?;
        }
        while (self.log.capacity().free_segments() < wm.high || self.garbage_due() || self.short_types(wm.high).is_some())
            && !self.shutting_down.load(SeqCst)
        {
            if !self.gc_step()? {
                self.gc_stuck.store(true, SeqCst);
                self.log.capacity().changed.notify_all();
                return Ok(());
            }
            self.gc_stuck.store(false, SeqCst);
        }
        Ok(())
    }
}

/// GC workers run at the writers' CPU priority. They ran at nice 10 while a victim was read
/// whole (so that a paced writer woken for its turn did not wait behind the GC's copies: p99
/// 889 against 699 us then). Once the GC read only victims' live pages, it was CPU that
/// bounded its pace, and nice 10 cost paced RAID-5 random writes to half the array 776
/// against 954 MB/s, with a p99 of 540 against 498 us (docs/BENCHMARKS.md, "GC reads of live
/// pages only").
pub(crate) fn gc_worker(eng: Arc<Engine>) {
    while !eng.shutting_down.load(SeqCst) {
        if eng.needs_gc_round() && !eng.log.is_poisoned() {
            if let Err(e) = eng.gc_round() {
                if !eng.log.is_poisoned() {
                    tracing::error!("garbage collection failed: {e}");
                    eng.gc_stuck.store(true, SeqCst);
                    eng.log.capacity().changed.notify_all();
                }
            }
        }
        eng.gc_wait(Duration::from_millis(50));
    }
}
