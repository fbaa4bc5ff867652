//! SepBIT (Wang et al., FAST'22): placement by inferred block invalidation time.
//!
//! Six classes. User writes: class 1 when the version being replaced lived less than `ℓ`, the
//! average lifespan of the last 16 reclaimed class-1 segments, else class 2 (first writes go to
//! class 2; until a class-1 segment was reclaimed `ℓ` is infinite). Relocations: pages from
//! class 1 go to class 3; others by age since their last user write: below `4ℓ` class 4, below
//! `16ℓ` class 5, else class 6. State: the last write time of every page (4 bytes per page) and
//! 16 lifespans.

use super::placement::{PageClock, Placement, Relocation, SegmentView, UserWrite};
use crate::format::StreamKind;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const LIFESPAN_WINDOW: usize = 16;

pub struct SepBit {
    clock: PageClock,
    lifespans: Mutex<VecDeque<u64>>,
    /// `ℓ`, cached; `u64::MAX` until the first class-1 segment is reclaimed.
    ell: AtomicU64,
}

impl SepBit {
    pub fn new(pages: u64) -> SepBit {
        SepBit {
            clock: PageClock::new(pages),
            lifespans: Mutex::new(VecDeque::with_capacity(LIFESPAN_WINDOW)),
            ell: AtomicU64::new(u64::MAX),
        }
    }
}

impl Placement for SepBit {
    fn user_streams(&self) -> u8 {
        2
    }
    fn gc_streams(&self) -> u8 {
        4
    }
    fn place_user(&self, w: &UserWrite) -> StreamKind {
        match self.clock.stamp(w.page, w.now) {
            Some(lifetime) if lifetime < self.ell.load(Relaxed) => StreamKind::User(0),
            _ => StreamKind::User(1),
        }
    }
    fn place_gc(&self, r: &Relocation) -> StreamKind {
        if r.victim.stream == StreamKind::User(0) {
            return StreamKind::Gc(0);
        }
        let ell = self.ell.load(Relaxed);
        match self.clock.age(r.page, r.now) {
            Some(age) if age < ell.saturating_mul(4) => StreamKind::Gc(1),
            Some(age) if age < ell.saturating_mul(16) => StreamKind::Gc(2),
            _ => StreamKind::Gc(3),
        }
    }
    fn trimmed(&self, first: u64, count: u64) {
        self.clock.forget(first, count);
    }
    fn segment_reclaimed(&self, victim: &SegmentView, now: u64) {
        if victim.stream != StreamKind::User(0) {
            return;
        }
        let mut l = self.lifespans.lock();
        if l.len() == LIFESPAN_WINDOW {
            l.pop_front();
        }
        l.push_back(now.saturating_sub(victim.opened_seq));
        self.ell.store(l.iter().sum::<u64>() / l.len() as u64, Relaxed);
    }
    fn resize(&self, pages: u64) {
        self.clock.resize(pages);
    }
    fn state_bytes(&self) -> u64 {
        self.clock.bytes() + (LIFESPAN_WINDOW * 8) as u64
    }
}
