//! Data placement: which stream a user write, a trim or a GC relocation goes to. The
//! [`Placement`] trait, what a policy is told ([`UserWrite`], [`Relocation`], [`SegmentView`]),
//! the per-page clock some policies keep ([`PageClock`]), and the simple built-ins.
//!
//! A volume owns one placement instance, built from its policy's name when the volume is created
//! or opened. The policy declares how many user streams and GC streams it uses (each stream has
//! its own open segment, so data of different classes never shares a segment); the engine asks
//! it for a stream on every user write and every relocation, from many threads at once.
//!
//! Invariants the engine keeps for a policy: `now` never decreases; every stream a policy returns
//! is clamped to the streams it declared; placement state is never persisted (after a restart a
//! policy starts with no history, which costs only placement quality, never correctness).

use crate::format::{StreamKind, MAX_STREAMS_PER_KIND};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// A segment as placement and victim policies see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentView {
    pub segment: u32,
    /// The stream that wrote it.
    pub stream: StreamKind,
    /// Pool write clock when the segment was opened.
    pub opened_seq: u64,
    /// Pool write clock when it was sealed; 0 while it is still open.
    pub sealed_seq: u64,
}

impl SegmentView {
    /// The age of the segment's data as SALSA's placement judges it: the ticks since it was
    /// sealed (0 while it is open).
    pub fn age(&self, now: u64) -> u64 {
        if self.sealed_seq == 0 {
            0
        } else {
            now.saturating_sub(self.sealed_seq)
        }
    }
}

/// SALSA's heat rule: data `age` ticks old is hot while younger than half the volume's mapped
/// pages in ticks.
pub fn is_hot(age: u64, mapped_pages: u64) -> bool {
    age < (mapped_pages / 2).max(1)
}

/// A user write about to be placed.
#[derive(Debug, Clone, Copy)]
pub struct UserWrite {
    /// Logical page of the volume.
    pub page: u64,
    /// The pool's write clock: one tick per user page written or trim, in any volume.
    pub now: u64,
    /// Where the page's current version lives (`None` if unmapped or trimmed).
    pub previous: Option<SegmentView>,
    /// Pages of the volume that hold data, and the volume's size in pages.
    pub mapped_pages: u64,
    pub volume_pages: u64,
}

/// A live page the GC is about to move.
#[derive(Debug, Clone, Copy)]
pub struct Relocation {
    pub page: u64,
    pub now: u64,
    /// The segment being cleaned.
    pub victim: SegmentView,
    pub mapped_pages: u64,
    pub volume_pages: u64,
}

/// Chooses streams for one volume's writes. Called concurrently from writers and GC workers:
/// keep state in atomics or behind short locks, and keep it bounded (report it in
/// [`Placement::state_bytes`]).
pub trait Placement: Send + Sync {
    /// User streams used, `1..=16`. `StreamKind::User(k)` for `k` below this.
    fn user_streams(&self) -> u8;
    /// GC streams used, `1..=16`. Relocations never share a stream with user writes: the GC
    /// allocates from a reserve that user writes must not consume.
    fn gc_streams(&self) -> u8;
    /// The stream for a user write.
    fn place_user(&self, w: &UserWrite) -> StreamKind;
    /// The GC stream for a relocated page.
    fn place_gc(&self, r: &Relocation) -> StreamKind;
    /// The user stream that carries trim records (tombstones). Default: the last one. (The GC
    /// moves tombstones to the last GC stream.)
    fn place_trim(&self) -> StreamKind {
        StreamKind::User(self.user_streams().saturating_sub(1))
    }
    /// Pages `[first, first + count)` were trimmed.
    fn trimmed(&self, _first: u64, _count: u64) {}
    /// The GC chose `victim`, a segment of this volume, at pool clock `now`.
    fn segment_reclaimed(&self, _victim: &SegmentView, _now: u64) {}
    /// The volume now has `pages` pages.
    fn resize(&self, _pages: u64) {}
    /// Memory held for placement, in bytes.
    fn state_bytes(&self) -> u64 {
        0
    }
}

/// The streams a volume has: what its policy declared, clamped to `1..=16` of each kind. Taken
/// once when the volume is built; every answer of the policy is clamped to it, so a policy bug
/// cannot reach past the engine's stream table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLayout {
    pub users: u8,
    pub gcs: u8,
}

impl StreamLayout {
    pub fn of(p: &dyn Placement) -> StreamLayout {
        StreamLayout {
            users: p.user_streams().clamp(1, MAX_STREAMS_PER_KIND),
            gcs: p.gc_streams().clamp(1, MAX_STREAMS_PER_KIND),
        }
    }

    /// How many streams, of both kinds.
    pub fn count(self) -> u32 {
        self.users as u32 + self.gcs as u32
    }

    /// Every stream, user streams first.
    pub fn kinds(self) -> impl Iterator<Item = StreamKind> {
        (0..self.users).map(StreamKind::User).chain((0..self.gcs).map(StreamKind::Gc))
    }

    /// Index of a policy's answer, clamped to the declared streams, in [`StreamLayout::kinds`].
    pub fn index(self, s: StreamKind) -> usize {
        match s {
            StreamKind::User(k) => k.min(self.users - 1) as usize,
            StreamKind::Gc(k) => self.users as usize + k.min(self.gcs - 1) as usize,
            StreamKind::Checkpoint => self.users as usize - 1,
        }
    }

    /// The last GC stream (relocated tombstones go there).
    pub fn last_gc(self) -> StreamKind {
        StreamKind::Gc(self.gcs - 1)
    }
}

/// The last user-write time of every page, 4 bytes per page (0: never written since the
/// volume was opened). Times wrap at 2^32 clock ticks (16 TiB of 4 KiB writes); a wrapped age
/// only misplaces a page. A coarse clock ([`PageClock::coarse`]) keeps one time for each run of
/// `2^shift` neighbouring pages, the latest write's.
pub struct PageClock {
    times: RwLock<Box<[AtomicU32]>>,
    /// Pages per slot, as a power of two.
    shift: u32,
}

impl PageClock {
    pub fn new(pages: u64) -> PageClock {
        PageClock::coarse(pages, u64::MAX)
    }

    /// A clock of at most `max_slots` slots (at least one page each) for `pages` pages.
    pub fn coarse(pages: u64, max_slots: u64) -> PageClock {
        let max_slots = max_slots.max(1);
        let mut shift = 0;
        while shift < 63 && pages.div_ceil(1 << shift) > max_slots {
            shift += 1;
        }
        PageClock {
            times: RwLock::new((0..pages.div_ceil(1 << shift)).map(|_| AtomicU32::new(0)).collect()),
            shift,
        }
    }

    /// Records a write of `page` at `now` and returns the age of the version it replaces, if
    /// the page was written before.
    pub fn stamp(&self, page: u64, now: u64) -> Option<u64> {
        let t = self.times.read();
        let slot = t.get((page >> self.shift) as usize)?;
        let old = slot.swap((now as u32).max(1), Relaxed);
        (old != 0).then(|| (now as u32).wrapping_sub(old) as u64)
    }

    /// Age of the page's last user write, if known.
    pub fn age(&self, page: u64, now: u64) -> Option<u64> {
        let t = self.times.read();
        let old = t.get((page >> self.shift) as usize)?.load(Relaxed);
        (old != 0).then(|| (now as u32).wrapping_sub(old) as u64)
    }

    /// Forgets pages `[first, first + count)` (on a coarse clock, the slots the range covers
    /// whole).
    pub fn forget(&self, first: u64, count: u64) {
        let t = self.times.read();
        let unit = 1u64 << self.shift;
        let (from, to) = (first.div_ceil(unit), first.saturating_add(count) / unit);
        for slot in &t[page_range(t.len(), from, to.saturating_sub(from))] {
            slot.store(0, Relaxed);
        }
    }

    pub fn resize(&self, pages: u64) {
        grow_slots(
            &mut self.times.write(),
            pages.div_ceil(1 << self.shift),
            |a| AtomicU32::new(a.load(Relaxed)),
            || AtomicU32::new(0),
        );
    }

    pub fn bytes(&self) -> u64 {
        self.times.read().len() as u64 * 4
    }
}

/// The slots of pages `[first, first + count)` that exist in a table of `len` pages.
pub fn page_range(len: usize, first: u64, count: u64) -> std::ops::Range<usize> {
    let end = first.saturating_add(count).min(len as u64);
    first.min(end) as usize..end as usize
}

/// Grows a per-page table to `pages` slots (never shrinks it), copying the existing slots.
pub fn grow_slots<T>(slots: &mut Box<[T]>, pages: u64, copy: impl Fn(&T) -> T, fresh: impl Fn() -> T) {
    if pages as usize > slots.len() {
        let grown: Box<[T]> = slots.iter().map(copy).chain((slots.len() as u64..pages).map(|_| fresh())).collect();
        *slots = grown;
    }
}

/// SALSA's placement (the paper's heat separation): two user streams and one GC stream. A
/// write is hot when the version it replaces is younger than half the volume's mapped pages in
/// clock ticks (judged by the age of the segment holding it, so no per-page state); first
/// writes are cold. Relocations never mix with user writes.
pub struct SalsaHeat;

impl Placement for SalsaHeat {
    fn user_streams(&self) -> u8 {
        2
    }
    fn gc_streams(&self) -> u8 {
        1
    }
    fn place_user(&self, w: &UserWrite) -> StreamKind {
        match w.previous {
            Some(prev) if is_hot(prev.age(w.now), w.mapped_pages) => StreamKind::User(0),
            _ => StreamKind::User(1),
        }
    }
    fn place_gc(&self, _r: &Relocation) -> StreamKind {
        StreamKind::Gc(0)
    }
}

/// One user stream and one GC stream: user/GC separation only.
pub struct UserGc;

impl Placement for UserGc {
    fn user_streams(&self) -> u8 {
        1
    }
    fn gc_streams(&self) -> u8 {
        1
    }
    fn place_user(&self, _w: &UserWrite) -> StreamKind {
        StreamKind::User(0)
    }
    fn place_gc(&self, _r: &Relocation) -> StreamKind {
        StreamKind::Gc(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_clock_reports_ages_and_forgets() {
        let c = PageClock::new(4);
        assert_eq!(c.stamp(1, 10), None);
        assert_eq!(c.stamp(1, 25), Some(15));
        assert_eq!(c.age(1, 30), Some(5));
        c.forget(0, 2);
        assert_eq!(c.age(1, 30), None);
        assert_eq!(c.stamp(9, 30), None, "past the end is ignored");
        c.resize(10);
        assert_eq!(c.stamp(9, 30), None);
        assert_eq!(c.stamp(9, 31), Some(1));
        assert_eq!(c.bytes(), 40);
        assert_eq!(page_range(4, 9, 3), 4..4);
        // A coarse clock: 10 pages in 3 slots of 4.
        let c = PageClock::coarse(10, 3);
        assert_eq!(c.bytes(), 12);
        c.stamp(5, 7);
        assert_eq!(c.age(4, 9), Some(2), "page 4 shares page 5's slot");
        c.forget(5, 3);
        assert_eq!(c.age(4, 9), Some(2), "a range that covers a slot in part keeps it");
        c.forget(3, 6);
        assert_eq!(c.age(4, 9), None);
        c.resize(13);
        assert_eq!(c.bytes(), 16);
        assert_eq!(page_range(4, 2, u64::MAX), 2..4);
    }

    #[test]
    fn answers_are_clamped_to_declared_streams() {
        let l = StreamLayout::of(&UserGc);
        assert_eq!(l.kinds().collect::<Vec<_>>(), [StreamKind::User(0), StreamKind::Gc(0)]);
        assert_eq!(l.index(StreamKind::User(5)), 0);
        assert_eq!(l.index(StreamKind::Gc(3)), 1);
        assert_eq!(l.last_gc(), StreamKind::Gc(0));
    }
}
