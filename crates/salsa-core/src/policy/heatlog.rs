//! Heat logs: SALSA's own lifetime-inference placement.
//!
//! Every page carries its last write time and a smoothed estimate of its update interval (an
//! exponentially weighted mean of the log2 of its intervals, in 1/8 steps). A write goes to one of
//! [`CLASSES`] user streams by that estimate relative to the volume's live pages (the interval
//! a page would have under uniform writes), at one class per two doublings; a relocated page goes
//! to the GC stream of the same class, so survivors never mix with fresh writes and hot
//! survivors never mix with cold ones. Pages never written (or trimmed) since the volume was
//! opened count as the coldest class. State: 5 bytes per page.
//!
//! Why smoothing: one interval of a page written at a steady rate is exponentially distributed,
//! so a single sample puts a page anywhere across four or five doublings; a mean of the log over
//! the last several narrows that to well under one, which is what a class is wide. A new sample
//! weighs `SAMPLE_WEIGHT`: lighter weights place static skew better (Zipf 1.0 at 20% spare:
//! WA 1.70 at 1/2, 1.65 at 1/4, 1.64 at 0.15), heavier ones follow a moving hot set sooner.
//!
//! Why six classes of two doublings from 2^-10: under Zipf-like skew the intervals of live
//! pages span some eighteen doublings; eight classes of one doubling from 2^-4 lumped the
//! hottest 1% of pages (two thirds of the writes) into one class (Zipf 1.0: WA 1.90; twelve of
//! one doubling from 2^-10: 1.71). Two doublings per class place skew as well as one, and under
//! uniform writes, where estimates scatter by about half a doubling around one value, they
//! split the pages over fewer classes, each with a segment open (uniform: 2.87 with twelve
//! classes, 2.82 with six).

use super::placement::{grow_slots, page_range, PageClock, Placement, Relocation, UserWrite};
use crate::format::StreamKind;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// User classes, and as many GC classes.
pub const CLASSES: u8 = 6;
/// Doublings of the interval estimate per class.
const CLASS_DOUBLINGS: f64 = 2.0;
/// Sub-steps per doubling of the interval estimate (intervals up to 2^31 fit a byte; longer
/// ones saturate, which only keeps them in the coldest class).
const STEPS: i32 = 8;
/// Weight of a new interval sample in the estimate.
const SAMPLE_WEIGHT: f64 = 0.15;
/// Class 0 holds intervals below `2^(FIRST_EXP + CLASS_DOUBLINGS)` live pages' worth of writes.
const FIRST_EXP: i32 = -10;
/// Estimate of a page with no history (0 in the byte means "none").
const NONE: u8 = 0;

pub struct HeatLog {
    clock: PageClock,
    /// Smoothed log2 interval: `1 + log2(interval) * STEPS`, 0 = no estimate.
    estimate: RwLock<Box<[AtomicU8]>>,
}

impl HeatLog {
    pub fn new(pages: u64) -> HeatLog {
        HeatLog {
            clock: PageClock::new(pages),
            estimate: RwLock::new((0..pages).map(|_| AtomicU8::new(NONE)).collect()),
        }
    }

    fn encode(log2_interval: f64) -> u8 {
        (1.0 + log2_interval.max(0.0) * STEPS as f64).round().clamp(1.0, 255.0) as u8
    }

    fn decode(e: u8) -> f64 {
        (e as f64 - 1.0) / STEPS as f64
    }

    /// The class of an estimate, relative to `unit` (live pages).
    fn class_of(est: u8, unit: u64) -> u8 {
        if est == NONE {
            return CLASSES - 1;
        }
        let log2_interval = Self::decode(est);
        let rel = log2_interval - (unit.max(1) as f64).log2();
        ((rel - FIRST_EXP as f64) / CLASS_DOUBLINGS)
            .floor()
            .clamp(0.0, (CLASSES - 1) as f64) as u8
    }
}

impl Placement for HeatLog {
    fn user_streams(&self) -> u8 {
        CLASSES
    }
    fn gc_streams(&self) -> u8 {
        CLASSES
    }
    fn place_user(&self, w: &UserWrite) -> StreamKind {
        let est = self.estimate.read();
        let Some(slot) = est.get(w.page as usize) else {
            return StreamKind::User(CLASSES - 1);
        };
        let e = match self.clock.stamp(w.page, w.now) {
            Some(interval) => {
                let sample = (interval.max(1) as f64).log2();
                let old = slot.load(Relaxed);
                let new = if old == NONE {
                    Self::encode(sample)
                } else {
                    // Exponentially weighted: the last seven or so intervals count.
                    Self::encode(Self::decode(old) * (1.0 - SAMPLE_WEIGHT) + sample * SAMPLE_WEIGHT)
                };
                slot.store(new, Relaxed);
                new
            }
            None => NONE,
        };
        StreamKind::User(Self::class_of(e, w.mapped_pages))
    }
    fn place_gc(&self, r: &Relocation) -> StreamKind {
        let est = self.estimate.read();
        let e = est.get(r.page as usize).map_or(NONE, |s| s.load(Relaxed));
        // A page that survived this long without a write is at least as cold as its age says.
        let e = match self.clock.age(r.page, r.now) {
            Some(age) if e != NONE => e.max(Self::encode((age.max(1) as f64).log2() - 1.0)),
            _ => e,
        };
        StreamKind::Gc(Self::class_of(e, r.mapped_pages))
    }
    fn trimmed(&self, first: u64, count: u64) {
        self.clock.forget(first, count);
        let est = self.estimate.read();
        for slot in &est[page_range(est.len(), first, count)] {
            slot.store(NONE, Relaxed);
        }
    }
    fn resize(&self, pages: u64) {
        self.clock.resize(pages);
        grow_slots(
            &mut self.estimate.write(),
            pages,
            |a| AtomicU8::new(a.load(Relaxed)),
            || AtomicU8::new(NONE),
        );
    }
    fn state_bytes(&self) -> u64 {
        self.clock.bytes() + self.estimate.read().len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(h: &HeatLog, page: u64, now: u64) -> u8 {
        match h.place_user(&UserWrite {
            page,
            now,
            previous: None,
            mapped_pages: 1024,
            volume_pages: 1024,
        }) {
            StreamKind::User(k) => k,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn estimates_round_trip_over_the_whole_range() {
        for l in [0.0, 1.0, 13.25, 22.5, 31.5] {
            assert!((HeatLog::decode(HeatLog::encode(l)) - l).abs() <= 0.0625, "{l}");
        }
        assert_eq!(HeatLog::encode(40.0), 255, "longer intervals saturate");
    }

    #[test]
    fn frequent_pages_go_hot_and_rare_pages_cold() {
        let h = HeatLog::new(1024);
        assert_eq!(write(&h, 1, 1), CLASSES - 1, "no history: coldest");
        let mut now = 1;
        let mut hot = 0;
        for _ in 0..10 {
            now += 1; // every write with 1024 live pages: 2^-10 of a round
            hot = write(&h, 1, now);
        }
        assert_eq!(hot, 0);
        // Every 64 writes: 2^-4 of a round, six doublings above the start of the first class.
        let mut warm = 0;
        for _ in 0..10 {
            now += 64;
            warm = write(&h, 3, now);
        }
        assert_eq!(warm, 3);
        write(&h, 2, now);
        let cold = write(&h, 2, now + 8 * 1024);
        assert_eq!(cold, CLASSES - 1, "{cold}");
        assert_eq!(h.state_bytes(), 1024 * 5);
    }
}
