//! The fast tier of a hybrid volume: copies of hot page groups in fast segments borrowed from
//! the pool (state [`SegmentState::Tier`], no records).
//!
//! Owns: which group has a copy where (one slot of `group_pages` pages; a fast segment holds
//! `segment_bytes / group_bytes` slots, filled from its start in order, so a zoned fast device
//! works too), which pages of a copy are still current (a bitmap the volume's writes and trims
//! clear), the promotion queue and its bandwidth budget, and giving segments back.
//!
//! Invariants: a copy is installed (`ready`) only after its bytes were written; every copy has
//! a generation that changes when its slot changes hands, so a reader that found a copy can
//! tell afterwards whether it was demoted meanwhile; only the maintenance pass
//! ([`Tier::maintain`], serialised by its own lock) takes, fills and gives back segments.

use super::temperature::Temperatures;
use super::{HybridSettings, FAST_TYPES, PROMOTE_AT};
use crate::controller::lsa::LsaVolume;
use crate::controller::map::Entry;
use crate::controller::VolumeIo;
use crate::error::Result;
use crate::log::capacity::{Purpose, SegmentState};
use crate::log::Log;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Groups waiting to be copied, at most.
const MAX_QUEUE: usize = 4096;
/// Copies made per maintenance pass, at most (the pass holds the volume's gate meanwhile).
const COPIES_PER_PASS: usize = 16;

/// Where a group's copy is, as a reader found it.
pub struct Located {
    group: u64,
    generation: u64,
    /// Its first page, and the grain holding it.
    first_page: u64,
    grain0: u64,
    page_grains: u64,
    valid: Vec<u64>,
}

impl Located {
    /// Whether the copy holds a current `page`.
    pub fn has(&self, page: u64) -> bool {
        let Some(i) = page.checked_sub(self.first_page) else { return false };
        self.valid.get((i / 64) as usize).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// The grain holding `page` in the copy.
    pub fn grain_of(&self, page: u64) -> u64 {
        self.grain0 + (page - self.first_page) * self.page_grains
    }
}

/// What the tier reports.
#[derive(Debug, Clone, Copy, Default)]
pub struct TierStats {
    /// Bytes of current pages in copies.
    pub copy_bytes: u64,
    pub segments: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub failed: bool,
    pub memory_bytes: u64,
}

struct Copy {
    segment: u32,
    slot: u32,
    grain0: u64,
    page_grains: u64,
    valid: Vec<u64>,
    ready: bool,
    generation: u64,
}

struct TierSegment {
    segment: u32,
    /// The group each slot holds (`None`: free or demoted).
    groups: Vec<Option<u64>>,
    /// Slots written so far (they are written in order).
    next_slot: u32,
}

struct State {
    copies: HashMap<u64, Copy>,
    segments: Vec<TierSegment>,
    queue: VecDeque<u64>,
    queued: HashSet<u64>,
    next_generation: u64,
    /// Promotion budget, bytes, and when it was last topped up.
    tokens: f64,
    refilled: Instant,
    cooled: Instant,
}

/// A hybrid volume's fast tier.
pub struct Tier {
    state: Mutex<State>,
    /// Serialises maintenance passes (the pool's thread, and callers of `Pool::maintain`).
    maintaining: Mutex<()>,
    group_pages: u64,
    page_bytes: u64,
    slots_per_segment: u32,
    /// Most segments the tier may hold (0: no limit of its own).
    max_segments: u64,
    promote_bytes_per_s: u64,
    cool_every: Duration,
    promotions: AtomicU64,
    demotions: AtomicU64,
    failed: AtomicBool,
    retired: AtomicBool,
}

impl Tier {
    pub fn new(settings: HybridSettings, page_bytes: u32, segment_bytes: u64) -> Tier {
        let group_bytes = settings.group_pages * page_bytes as u64;
        Tier {
            state: Mutex::new(State {
                copies: HashMap::new(),
                segments: Vec::new(),
                queue: VecDeque::new(),
                queued: HashSet::new(),
                next_generation: 1,
                tokens: 0.0,
                refilled: Instant::now(),
                cooled: Instant::now(),
            }),
            maintaining: Mutex::new(()),
            group_pages: settings.group_pages,
            page_bytes: page_bytes as u64,
            slots_per_segment: (segment_bytes / group_bytes) as u32,
            max_segments: settings.tier_bytes / segment_bytes,
            promote_bytes_per_s: settings.promote_bytes_per_s,
            cool_every: Duration::from_millis((settings.half_life_ms / 4).clamp(100, 10_000)),
            promotions: AtomicU64::new(0),
            demotions: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            retired: AtomicBool::new(false),
        }
    }

    fn group_bytes(&self) -> u64 {
        self.group_pages * self.page_bytes
    }

    /// The ready copy of `group`, if there is one.
    pub fn locate(&self, group: u64) -> Option<Located> {
        let st = self.state.lock();
        let c = st.copies.get(&group).filter(|c| c.ready)?;
        Some(Located {
            group,
            generation: c.generation,
            first_page: group * self.group_pages,
            grain0: c.grain0,
            page_grains: c.page_grains,
            valid: c.valid.clone(),
        })
    }

    /// Whether the copy `located` describes is still in place.
    pub fn still_there(&self, located: &Located) -> bool {
        let st = self.state.lock();
        st.copies
            .get(&located.group)
            .is_some_and(|c| c.ready && c.generation == located.generation)
    }

    /// `group` is hot: queue it for a copy unless it has one (the copy is made only if it is
    /// still hot when its turn comes).
    pub fn request(&self, group: u64) {
        if self.failed.load(SeqCst) || self.retired.load(SeqCst) {
            return;
        }
        let mut st = self.state.lock();
        if st.copies.contains_key(&group) || st.queued.contains(&group) || st.queue.len() >= MAX_QUEUE {
            return;
        }
        st.queue.push_back(group);
        st.queued.insert(group);
    }

    /// Pages `[first, end)` changed: their copies are no longer current.
    pub fn invalidate(&self, first: u64, end: u64) {
        let mut st = self.state.lock();
        if st.copies.is_empty() {
            return;
        }
        let mut page = first;
        while page < end {
            let group = page / self.group_pages;
            let group_end = ((group + 1) * self.group_pages).min(end);
            if let Some(c) = st.copies.get_mut(&group) {
                for p in page..group_end {
                    let i = p - group * self.group_pages;
                    c.valid[(i / 64) as usize] &= !(1 << (i % 64));
                }
            }
            page = group_end;
        }
    }

    /// The fast tier failed (an I/O error): every copy goes, nothing more is copied, and its
    /// segments stay out of the pool's use until the pool is reopened (the device is suspect).
    pub fn fail(&self, why: &str) {
        if !self.failed.swap(true, SeqCst) {
            tracing::warn!("hybrid volume: fast tier stopped ({why}); reads go to the slow tier");
        }
        let mut st = self.state.lock();
        st.copies.clear();
        st.queue.clear();
        st.queued.clear();
    }

    /// The volume is being deleted: nothing more is copied or served.
    pub fn retire(&self) {
        self.retired.store(true, SeqCst);
        let mut st = self.state.lock();
        st.copies.clear();
        st.queue.clear();
        st.queued.clear();
    }

    /// Gives every segment back to the pool (the volume is gone), unless the tier failed.
    pub fn release(&self, log: &Log) {
        let _m = self.maintaining.lock();
        let mut st = self.state.lock();
        st.copies.clear();
        let segments = std::mem::take(&mut st.segments);
        if !self.failed.load(SeqCst) {
            for s in segments {
                give_back(log, s.segment);
            }
        }
    }

    pub fn stats(&self) -> TierStats {
        let st = self.state.lock();
        let pages: u64 = st
            .copies
            .values()
            .filter(|c| c.ready)
            .map(|c| c.valid.iter().map(|w| w.count_ones() as u64).sum::<u64>())
            .sum();
        TierStats {
            copy_bytes: pages * self.page_bytes,
            segments: st.segments.len() as u64,
            promotions: self.promotions.load(SeqCst),
            demotions: self.demotions.load(SeqCst),
            failed: self.failed.load(SeqCst),
            memory_bytes: st.copies.len() as u64 * (48 + self.group_pages / 8)
                + st.segments.len() as u64 * (32 + 8 * self.slots_per_segment as u64),
        }
    }

    /// One maintenance pass: gives a segment back when the pool is short, demotes copies that
    /// cooled down, and copies queued hot groups within the bandwidth budget. Returns whether
    /// it did something.
    pub fn maintain(&self, log: &Log, slow: &LsaVolume, temperatures: &Temperatures) -> Result<bool> {
        if self.failed.load(SeqCst) || self.retired.load(SeqCst) {
            return Ok(false);
        }
        let _m = self.maintaining.lock();
        let mut busy = false;
        let wm = log.capacity().watermarks();
        if log.capacity().free_segments() < wm.low {
            busy |= self.evict_coldest(log, temperatures, u64::MAX);
        }
        if self.state.lock().cooled.elapsed() >= self.cool_every {
            busy |= self.cool(log, temperatures);
        }
        busy |= self.promote(log, slow, temperatures)?;
        Ok(busy)
    }

    /// Demotes copies whose temperature fell to nothing, and gives back full segments left
    /// without copies.
    fn cool(&self, log: &Log, temperatures: &Temperatures) -> bool {
        let mut st = self.state.lock();
        st.cooled = Instant::now();
        let cold: Vec<u64> = st
            .copies
            .iter()
            .filter(|(g, c)| c.ready && (temperatures.get(**g) == 0 || c.valid.iter().all(|w| *w == 0)))
            .map(|(g, _)| *g)
            .collect();
        for g in &cold {
            let Some(c) = st.copies.remove(g) else { continue };
            self.demotions.fetch_add(1, SeqCst);
            if let Some(seg) = st.segments.iter_mut().find(|s| s.segment == c.segment) {
                seg.groups[c.slot as usize] = None;
            }
        }
        let slots = self.slots_per_segment;
        let (empty, kept): (Vec<TierSegment>, Vec<TierSegment>) = std::mem::take(&mut st.segments)
            .into_iter()
            .partition(|s| s.next_slot == slots && s.groups.iter().all(Option::is_none));
        st.segments = kept;
        drop(st);
        for s in &empty {
            give_back(log, s.segment);
        }
        !cold.is_empty() || !empty.is_empty()
    }

    /// Gives back the segment whose hottest copy is coldest, if that is colder than
    /// `hotter_than`. Returns whether it did.
    fn evict_coldest(&self, log: &Log, temperatures: &Temperatures, hotter_than: u64) -> bool {
        let mut st = self.state.lock();
        let coldest = st
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let t = s.groups.iter().flatten().map(|g| temperatures.get(*g)).max().unwrap_or(0);
                (t, i)
            })
            .min();
        let Some((_, i)) = coldest.filter(|(t, _)| *t < hotter_than) else {
            return false;
        };
        let seg = st.segments.swap_remove(i);
        for g in seg.groups.iter().flatten() {
            st.copies.remove(g);
            self.demotions.fetch_add(1, SeqCst);
        }
        // Copies in the making there are dropped too.
        st.copies.retain(|_, c| c.segment != seg.segment);
        drop(st);
        give_back(log, seg.segment);
        true
    }

    /// A free slot for a copy of a group at `temperature`: in the segment being filled, else in
    /// a new one (making room by evicting a colder segment when the tier is at its bound or
    /// the pool has no fast segment to lend). Returns (segment, slot).
    fn slot_for(&self, log: &Log, temperatures: &Temperatures, temperature: u64) -> Result<Option<(u32, u32)>> {
        {
            let mut st = self.state.lock();
            if let Some(s) = st.segments.iter_mut().find(|s| s.next_slot < self.slots_per_segment) {
                let slot = s.next_slot;
                s.next_slot += 1;
                return Ok(Some((s.segment, slot)));
            }
        }
        for attempt in 0..2 {
            let at_bound = self.max_segments > 0 && self.state.lock().segments.len() as u64 >= self.max_segments;
            let taken = if at_bound {
                None
            } else {
                log.allocate_online(&FAST_TYPES, Purpose::Tier)
            };
            if let Some(s) = taken {
                if self.retired.load(SeqCst) {
                    log.capacity().unallocate(s);
                    return Ok(None);
                }
                if let Err(e) = log.prepare_segment(s) {
                    self.fail(&format!("preparing fast segment {s}: {e}"));
                    return Ok(None);
                }
                let mut st = self.state.lock();
                st.segments.push(TierSegment {
                    segment: s,
                    groups: vec![None; self.slots_per_segment as usize],
                    next_slot: 1,
                });
                return Ok(Some((s, 0)));
            }
            if attempt == 1 || !self.evict_coldest(log, temperatures, temperature) {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Copies queued groups while the bandwidth budget lasts.
    fn promote(&self, log: &Log, slow: &LsaVolume, temperatures: &Temperatures) -> Result<bool> {
        let group_bytes = self.group_bytes();
        {
            let mut st = self.state.lock();
            let now = Instant::now();
            let rate = self.promote_bytes_per_s as f64;
            // At most a second's worth saved up, and always room for one copy.
            st.tokens = (st.tokens + now.duration_since(st.refilled).as_secs_f64() * rate).min(rate.max(group_bytes as f64));
            st.refilled = now;
        }
        let mut copied = 0;
        while copied < COPIES_PER_PASS {
            let next = {
                let mut st = self.state.lock();
                if st.tokens < group_bytes as f64 {
                    None
                } else {
                    let g = st.queue.pop_front();
                    if let Some(g) = g {
                        st.queued.remove(&g);
                    }
                    g
                }
            };
            let Some(group) = next else { break };
            let temperature = temperatures.get(group);
            if temperature < PROMOTE_AT || self.state.lock().copies.contains_key(&group) {
                continue;
            }
            let Some((segment, slot)) = self.slot_for(log, temperatures, temperature)? else {
                break;
            };
            if !self.copy(log, slow, group, segment, slot)? {
                break;
            }
            copied += 1;
            self.state.lock().tokens -= group_bytes as f64;
        }
        Ok(copied > 0)
    }

    /// Copies `group` into `slot` of fast segment `segment`. Returns whether the tier can go on.
    fn copy(&self, log: &Log, slow: &LsaVolume, group: u64, segment: u32, slot: u32) -> Result<bool> {
        let geo = log.geo();
        let page_grains = self.page_bytes / geo.grain_bytes as u64;
        let grain0 = segment as u64 * geo.grains_per_segment as u64 + slot as u64 * self.group_pages * page_grains;
        let first_page = group * self.group_pages;
        let generation = {
            let mut st = self.state.lock();
            let generation = st.next_generation;
            st.next_generation += 1;
            // In the map (not ready) before a page is read, so that writes from now on clear
            // their pages' bits in it.
            st.copies.insert(
                group,
                Copy {
                    segment,
                    slot,
                    grain0,
                    page_grains,
                    valid: all_pages(self.group_pages),
                    ready: false,
                    generation,
                },
            );
            generation
        };
        let mut buf = log.buffers().get(self.group_bytes() as usize);
        buf.fill(0);
        let mut absent = Vec::new();
        let read = (|| -> Result<()> {
            let _gate = slow.enter()?;
            let map = slow.map();
            let pb = self.page_bytes as usize;
            for i in 0..self.group_pages {
                let page = first_page + i;
                if page >= map.pages() || !matches!(map.load(page), Entry::Mapped(_)) {
                    absent.push(i);
                }
            }
            // The group's pages that exist, in runs (a group written in order is one read).
            let pages = (map.pages().saturating_sub(first_page)).min(self.group_pages) as usize;
            slow.read_pages(log, &map, first_page, &mut buf[..pages * pb])
        })();
        // The slot is written whatever happened, so the segment stays written in order.
        let written = log.array().write(grain0, &buf);
        log.buffers().put(buf);
        let mut st = self.state.lock();
        if let Err(e) = written {
            drop(st);
            self.fail(&format!("writing a copy: {e}"));
            return Ok(false);
        }
        if let Some(seg) = st.segments.iter_mut().find(|s| s.segment == segment) {
            seg.groups[slot as usize] = Some(group);
        }
        let keep = read.is_ok() && !self.retired.load(SeqCst);
        match st.copies.get_mut(&group) {
            Some(c) if c.generation == generation && keep => {
                for i in absent {
                    c.valid[(i / 64) as usize] &= !(1 << (i % 64));
                }
                c.ready = true;
                self.promotions.fetch_add(1, SeqCst);
            }
            Some(c) if c.generation == generation => {
                st.copies.remove(&group);
            }
            _ => {}
        }
        drop(st);
        if let Err(e) = read {
            if slow.is_retired() {
                return Ok(false);
            }
            // A page that fails its checksum is the slow tier's to report, to its reader.
            tracing::debug!("hybrid volume: copy of group {group} abandoned: {e}");
        }
        Ok(true)
    }
}

/// A bitmap with the first `pages` bits set.
fn all_pages(pages: u64) -> Vec<u64> {
    (0..pages.div_ceil(64))
        .map(|w| {
            let bits = (pages - w * 64).min(64);
            if bits == 64 {
                u64::MAX
            } else {
                (1 << bits) - 1
            }
        })
        .collect()
}

/// Returns a fast segment to the pool's free queue.
fn give_back(log: &Log, segment: u32) {
    let info = log.capacity().segment(segment);
    debug_assert_eq!(info.state(), SegmentState::Tier);
    log.capacity().unallocate(segment);
}
