//! `salsa-age`: SALSA's two heat classes, judged by each page's own age, for user writes and
//! relocations alike. Two user streams and two GC streams.
//!
//! A write is hot when the version it replaces was written less than half the volume's mapped
//! pages ago (in pool clock ticks), as SALSA's placement judges it; a relocated page is hot by
//! the same rule, applied to the time since its last user write. So hot survivors of the GC go
//! back among hot data and cold data moved out of a mixed segment goes among cold data, each
//! class in its own GC segment.
//!
//! Why per page and not by segment (what `salsa` does): a relocated page's segment says only
//! when the GC last moved it. Judged by its segment, cold data that the GC moved once keeps
//! being moved with the hot data (its GC segment is young every time it is cleaned), and hot
//! data moved among cold data strands the cold segment's space when it is overwritten. On the
//! Table IIa proxy (bench-device, one volume, 16 KiB writes to a hot 15%, 16 MiB segments, six
//! volumes' worth of writes) the GC moved 2.50 bytes per user byte with `salsa` and
//! `aging-greedy`, 0.94 with this placement and `cost-benefit` (`docs/BENCHMARKS.md`, "Page
//! ages"). Not the default: each long-lived stream it adds interleaves in a commodity SSD's
//! write frontier, and the drive's own write amplification rises with it.
//!
//! State: the last user-write time of every page, 4 bytes per page, at most
//! [`MAX_CLOCK_SLOTS`] slots per volume: a larger volume shares a slot among neighbouring pages
//! (a run of pages takes its latest write's time), which misplaces only a cold page whose
//! neighbour is hot. Not persisted: after a restart, until a page is written again, its age is
//! judged by its segment as `salsa` does.

use super::placement::{is_hot, PageClock, Placement, Relocation, UserWrite};
use crate::format::StreamKind;

/// Clock slots per volume (256 MiB of clock, a 256 GiB volume of 4 KiB pages page by page).
pub const MAX_CLOCK_SLOTS: u64 = 1 << 26;

pub struct PageAgeHeat {
    clock: PageClock,
}

impl PageAgeHeat {
    pub fn new(pages: u64) -> PageAgeHeat {
        PageAgeHeat::with_clock_slots(pages, MAX_CLOCK_SLOTS)
    }

    /// With at most `max_slots` clock slots.
    pub fn with_clock_slots(pages: u64, max_slots: u64) -> PageAgeHeat {
        PageAgeHeat {
            clock: PageClock::coarse(pages, max_slots),
        }
    }
}

impl Placement for PageAgeHeat {
    fn user_streams(&self) -> u8 {
        2
    }
    fn gc_streams(&self) -> u8 {
        2
    }
    fn place_user(&self, w: &UserWrite) -> StreamKind {
        // Not written since the volume was opened: its segment tells.
        let age = self.clock.stamp(w.page, w.now).or_else(|| w.previous.map(|prev| prev.age(w.now)));
        match age {
            Some(age) if is_hot(age, w.mapped_pages) => StreamKind::User(0),
            _ => StreamKind::User(1),
        }
    }
    fn place_gc(&self, r: &Relocation) -> StreamKind {
        let age = self.clock.age(r.page, r.now).unwrap_or_else(|| match r.victim.stream {
            // Unknown since a restart: a hot user segment's data is as young as the segment; a
            // GC segment's data is older than the segment says, so it counts as cold.
            StreamKind::User(0) => r.victim.age(r.now),
            _ => u64::MAX,
        });
        if is_hot(age, r.mapped_pages) {
            StreamKind::Gc(0)
        } else {
            StreamKind::Gc(1)
        }
    }
    fn trimmed(&self, first: u64, count: u64) {
        self.clock.forget(first, count);
    }
    fn resize(&self, pages: u64) {
        self.clock.resize(pages);
    }
    fn state_bytes(&self) -> u64 {
        self.clock.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::placement::SegmentView;

    fn user(p: &PageAgeHeat, page: u64, now: u64, previous: Option<SegmentView>) -> StreamKind {
        p.place_user(&UserWrite {
            page,
            now,
            previous,
            mapped_pages: 1000,
            volume_pages: 1000,
        })
    }

    fn gc(p: &PageAgeHeat, page: u64, now: u64, victim: SegmentView) -> StreamKind {
        p.place_gc(&Relocation {
            page,
            now,
            victim,
            mapped_pages: 1000,
            volume_pages: 1000,
        })
    }

    fn segment(stream: StreamKind, sealed_seq: u64) -> SegmentView {
        SegmentView {
            segment: 1,
            stream,
            opened_seq: sealed_seq.saturating_sub(10),
            sealed_seq,
        }
    }

    #[test]
    fn a_page_is_hot_by_its_own_age_for_writes_and_relocations() {
        let p = PageAgeHeat::new(1000);
        assert_eq!(user(&p, 1, 10, None), StreamKind::User(1), "a first write is cold");
        assert_eq!(user(&p, 1, 100, None), StreamKind::User(0), "rewritten 90 ticks later: hot");
        assert_eq!(user(&p, 2, 100, None), StreamKind::User(1));
        // Relocated from an old GC segment: each page by its own age, not the segment's.
        let old_gc = segment(StreamKind::Gc(1), 5);
        assert_eq!(gc(&p, 1, 300, old_gc), StreamKind::Gc(0), "written 200 ticks ago");
        assert_eq!(gc(&p, 2, 900, old_gc), StreamKind::Gc(1), "written 800 ticks ago");
        // A young GC segment does not make an old page hot.
        let young_gc = segment(StreamKind::Gc(0), 880);
        assert_eq!(gc(&p, 2, 900, young_gc), StreamKind::Gc(1));
    }

    #[test]
    fn without_a_clock_entry_the_segment_judges() {
        let p = PageAgeHeat::new(1000);
        // After a restart: a page rewritten whose version sits in a segment sealed lately.
        assert_eq!(user(&p, 3, 1200, Some(segment(StreamKind::User(1), 1000))), StreamKind::User(0));
        assert_eq!(user(&p, 4, 1200, Some(segment(StreamKind::User(1), 100))), StreamKind::User(1));
        // Relocations: a hot user segment's pages are as young as it; a GC segment's are old.
        assert_eq!(gc(&p, 5, 1200, segment(StreamKind::User(0), 1100)), StreamKind::Gc(0));
        assert_eq!(gc(&p, 5, 1200, segment(StreamKind::Gc(0), 1100)), StreamKind::Gc(1));
        // A trimmed page is forgotten.
        user(&p, 6, 10, None);
        p.trimmed(6, 1);
        assert_eq!(gc(&p, 6, 20, segment(StreamKind::Gc(1), 5)), StreamKind::Gc(1));
    }

    #[test]
    fn a_large_volume_shares_clock_slots_among_neighbours() {
        let p = PageAgeHeat::with_clock_slots(4000, 1000);
        assert_eq!(p.state_bytes(), 4000, "4 pages a slot, 4 bytes a slot");
        user(&p, 8, 10, None);
        // Page 9 shares page 8's slot and takes its time.
        assert_eq!(user(&p, 9, 100, None), StreamKind::User(0));
        assert_eq!(user(&p, 12, 100, None), StreamKind::User(1), "the next slot");
    }
}
