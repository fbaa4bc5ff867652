//! When the GC must run: free segments under the low watermark, segments one sync would
//! release while free segments run low, a restricted storage class short of its own types,
//! or garbage over the pool's garbage trigger (which also holds writers back).

use super::super::*;

impl Engine {
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
    pub(super) fn gc_focus(&self) -> Option<&'static [StorageType]> {
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
    pub(in crate::engine) fn wait_for_garbage_bound(&self) -> Result<()> {
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
    pub(super) fn garbage_above(&self, slack: f64) -> bool {
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
    pub(super) fn release_due(&self) -> bool {
        self.log.capacity().free_segments() <= self.log.capacity().watermarks().release
            && self.log.capacity().pending_counts().awaiting_sync > 0
    }
}
