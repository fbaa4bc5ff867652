//! Victim choice: every sealed segment ranked by the victim policy of the volume that owns it
//! (or the pool's), the ranking with the most garbage cleaned from; and what a policy that
//! watches writes is told of the pool.

use super::super::*;

/// One victim policy's view of its segments during a victim choice.
struct Ranking {
    /// Its best candidate: (score, segment, valid grains).
    best: (f64, u32, u32),
    /// Garbage grains in all its candidates.
    garbage_grains: u64,
}

impl Engine {
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
    pub(in crate::engine) fn user_bytes_per_segment(log: &Log) -> u64 {
        log.geo().data_grains_per_segment() as u64 * log.geo().grain_bytes as u64
    }

    /// What a write-watching victim policy is told of the pool.
    pub(in crate::engine) fn pool_shape(log: &Log) -> PoolShape {
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
    pub(super) fn choose_victim(&self, only: Option<&[StorageType]>) -> Option<u32> {
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
}
