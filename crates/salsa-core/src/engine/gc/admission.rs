//! Admission of GC workers: several clean at once only while the free segments cover what
//! every victim being cleaned may still need; a lone worker is always admitted, so the GC
//! never deadlocks.

use super::super::*;

/// What the GC workers cleaning at this moment may still need.
#[derive(Default)]
pub(in crate::engine) struct GcBudget {
    pub(in crate::engine) cleaning: u32,
    promised_segments: u32,
}

/// A GC worker's permission to clean one victim; gives its promise back when dropped.
pub(super) struct GcAdmission<'a> {
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
    /// Free segments relocating `valid_grains` may take: the data and its metadata pages, plus
    /// one for the GC stream's open segment filling up on the way.
    pub(super) fn segments_to_clean(&self, valid_grains: u32) -> u32 {
        valid_grains.div_ceil(self.log.geo().data_grains_per_segment()) + 1
    }

    /// Admits a victim needing `segments` free segments when the segments free or about to be
    /// freed cover it and every promise to victims being cleaned. A lone worker is always
    /// admitted (it can always finish: writers stop at the GC reserve), so the GC never
    /// deadlocks; several workers clean in parallel only while space allows.
    pub(super) fn gc_admit(&self, segments: u32) -> Option<GcAdmission<'_>> {
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
    pub(super) fn gc_wait_for_budget(&self) {
        let mut b = self.gc_budget.lock();
        if b.cleaning > 0 {
            self.gc_budget_changed.wait_for(&mut b, Duration::from_millis(50));
        }
    }
}
