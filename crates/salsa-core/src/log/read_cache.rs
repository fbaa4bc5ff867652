//! A bounded DRAM cache of pages read from the devices, so that a pool re-reads hot data from
//! memory as a server on the kernel's page cache would, without giving up `O_DIRECT`.
//!
//! Owns: the cached copies and the hit counters. Entries are keyed by physical place (the
//! page's first grain) and the generation of its segment. A log-structured pool never writes
//! a place twice within a generation, so the cache needs no invalidation: a write, a trim, a
//! GC move or a remap points the map at another place (whose reads miss), and a segment that
//! is reused gets a new generation (so its old entries never match again and age out). To
//! keep room for live pages, the copy of a place that is overwritten or trimmed is dropped,
//! and a GC move carries the copy to the page's new place.
//!
//! Invariants: only pages that passed their checksum are inserted; a hit is checked against
//! the place's checksum again before it is served (a copy damaged in memory is dropped and
//! read from the device); the cached bytes never exceed the capacity (weights are the page
//! bytes plus a fixed overhead per entry).
//!
//! Copies of pages dropped because their place died are kept (a few, [`MAX_RECYCLED_PAGES`])
//! and filled again by the next insert: a client rewriting a region makes the cache drop and
//! insert a page per page written, and a fresh allocation each time costs more than the copy
//! (glibc grows and trims its heaps, and the kernel faults and zeroes the pages again).
//!
//! The policy is `quick_cache`'s S3-FIFO: a scan (a backup, a sequential read of a whole
//! volume) passes through the small probationary queue and does not push out pages read
//! repeatedly; the cache is sharded, takes no lock across a device read, and has no
//! background thread, which suits the engine's many reader threads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes counted per entry on top of its page (key, map slot, allocation header).
const ENTRY_OVERHEAD_BYTES: u64 = 64;
/// Most dropped copies kept for the next inserts: enough for the pages of a few records
/// (what one write replaces before it inserts its own), little beside the capacity.
pub const MAX_RECYCLED_PAGES: usize = 1024;

#[derive(Clone)]
struct PageWeighter;

impl quick_cache::Weighter<(u64, u64), Arc<[u8]>> for PageWeighter {
    fn weight(&self, _key: &(u64, u64), page: &Arc<[u8]>) -> u64 {
        page.len() as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// What the read cache did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadCacheStats {
    pub capacity_bytes: u64,
    /// Bytes held now (pages and per-entry overhead).
    pub used_bytes: u64,
    pub pages: u64,
    pub hits: u64,
    pub misses: u64,
    /// Hits whose copy failed its checksum (dropped, read from the device instead).
    pub damaged_hits: u64,
}

/// The cache.
pub struct ReadCache {
    pages: quick_cache::sync::Cache<(u64, u64), Arc<[u8]>, PageWeighter>,
    capacity_bytes: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    damaged_hits: AtomicU64,
    /// Copies dropped from the cache that nothing else holds, for [`ReadCache::insert`] to
    /// fill again; at most [`MAX_RECYCLED_PAGES`], outside the capacity.
    recycled: parking_lot::Mutex<Vec<Arc<[u8]>>>,
}

impl ReadCache {
    /// A cache of at most `capacity_bytes` (pages of about `page_bytes` each, for sizing).
    pub fn new(capacity_bytes: u64, page_bytes: u64) -> ReadCache {
        let items = (capacity_bytes / (page_bytes.max(512) + ENTRY_OVERHEAD_BYTES)).clamp(16, 1 << 26) as usize;
        ReadCache {
            pages: quick_cache::sync::Cache::with_weighter(items, capacity_bytes, PageWeighter),
            capacity_bytes,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            damaged_hits: AtomicU64::new(0),
            recycled: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Copies the page at `grain` of segment generation `generation` into `out` if it is
    /// cached and matches `crc`.
    pub fn get(&self, grain: u64, generation: u64, crc: u32, out: &mut [u8]) -> bool {
        match self.pages.get(&(grain, generation)) {
            Some(page) if page.len() == out.len() && crc32c::crc32c(&page) == crc => {
                out.copy_from_slice(&page);
                if !super::memory_reads::defer_hit() {
                    self.hits.fetch_add(1, Relaxed);
                }
                true
            }
            Some(_) => {
                self.damaged_hits.fetch_add(1, Relaxed);
                self.pages.remove(&(grain, generation));
                self.count_miss();
                false
            }
            None => {
                self.count_miss();
                false
            }
        }
    }

    /// A read that may not wait for a device is refused at a miss and read again by a thread
    /// that may: that read counts the miss, this one does not.
    fn count_miss(&self) {
        if !super::memory_reads::active() {
            self.misses.fetch_add(1, Relaxed);
        }
    }

    /// Counts `n` hits deferred by reads that may not wait (see
    /// [`super::memory_reads::memory_only`]).
    pub fn count_hits(&self, n: u64) {
        self.hits.fetch_add(n, Relaxed);
    }

    /// Keeps a copy of a page that passed its checksum.
    pub fn insert(&self, grain: u64, generation: u64, page: &[u8]) {
        if page.len() as u64 + ENTRY_OVERHEAD_BYTES > self.capacity_bytes {
            return;
        }
        let reused = {
            let mut recycled = self.recycled.lock();
            // Pages of one length mostly (a pool's volumes share a page size): the last fits.
            let at = recycled.iter().rposition(|p| p.len() == page.len());
            at.map(|at| recycled.swap_remove(at))
        };
        // (Recycled copies are held by nothing else, so `get_mut` finds them unique.)
        let copy = match reused {
            Some(mut copy) => match Arc::get_mut(&mut copy) {
                Some(bytes) => {
                    bytes.copy_from_slice(page);
                    copy
                }
                None => Arc::from(page),
            },
            None => Arc::from(page),
        };
        self.pages.insert((grain, generation), copy);
    }

    /// Takes out the copy of a page whose place no longer holds live data (moved, or
    /// remapped), for the caller to keep under its new place.
    pub fn remove(&self, grain: u64, generation: u64) -> Option<Arc<[u8]>> {
        self.pages.remove(&(grain, generation)).map(|(_, page)| page)
    }

    /// Drops the copy of a page whose place no longer holds live data (overwritten or
    /// trimmed), so it does not take room until it ages out; its buffer is kept for the next
    /// insert when nothing else holds it (a hit being served may).
    pub fn forget(&self, grain: u64, generation: u64) {
        if let Some((_, mut page)) = self.pages.remove(&(grain, generation)) {
            if Arc::get_mut(&mut page).is_some() {
                let mut recycled = self.recycled.lock();
                if recycled.len() < MAX_RECYCLED_PAGES {
                    recycled.push(page);
                    return;
                }
            }
            drop(page); // freed outside the lock
        }
    }

    /// Keeps `page` (a copy taken from another key) under a new place.
    pub fn insert_shared(&self, grain: u64, generation: u64, page: Arc<[u8]>) {
        self.pages.insert((grain, generation), page);
    }

    pub fn stats(&self) -> ReadCacheStats {
        ReadCacheStats {
            capacity_bytes: self.capacity_bytes,
            used_bytes: self.pages.weight(),
            pages: self.pages.len() as u64,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            damaged_hits: self.damaged_hits.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_served_only_for_its_generation_and_checksum() {
        let c = ReadCache::new(1 << 20, 4096);
        let page = vec![7u8; 4096];
        let crc = crc32c::crc32c(&page);
        c.insert(10, 1, &page);
        let mut out = vec![0u8; 4096];
        assert!(c.get(10, 1, crc, &mut out));
        assert_eq!(out, page);
        // The segment was reused: the old copy does not match.
        assert!(!c.get(10, 2, crc, &mut out));
        // A checksum that disagrees (the place holds other data) is not served, and the copy
        // is dropped.
        assert!(!c.get(10, 1, crc ^ 1, &mut out));
        assert!(!c.get(10, 1, crc, &mut out));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.damaged_hits), (1, 3, 1));
    }

    #[test]
    fn a_forgotten_copy_is_filled_again_by_the_next_insert() {
        let c = ReadCache::new(1 << 20, 4096);
        let (a, b) = (vec![1u8; 4096], vec![2u8; 4096]);
        c.insert(10, 1, &a);
        let first = Arc::as_ptr(&c.pages.get(&(10, 1)).unwrap());
        c.forget(10, 1);
        assert_eq!(c.stats().pages, 0, "a forgotten page leaves the cache");
        assert_eq!(c.recycled.lock().len(), 1);
        c.insert(11, 1, &b);
        assert_eq!(c.recycled.lock().len(), 0);
        assert_eq!(Arc::as_ptr(&c.pages.get(&(11, 1)).unwrap()), first, "the buffer was reused");
        let mut out = vec![0u8; 4096];
        assert!(c.get(11, 1, crc32c::crc32c(&b), &mut out));
        assert_eq!(out, b);
        assert!(!c.get(10, 1, crc32c::crc32c(&a), &mut out));
        // A copy someone still holds is not reused.
        let held = c.pages.get(&(11, 1)).unwrap();
        c.forget(11, 1);
        assert_eq!(c.recycled.lock().len(), 0);
        assert_eq!(&held[..], &b[..]);
        // The kept copies are bounded.
        for g in 0..MAX_RECYCLED_PAGES as u64 + 100 {
            c.insert(1000 + g, 1, &a);
        }
        for g in 0..MAX_RECYCLED_PAGES as u64 + 100 {
            c.forget(1000 + g, 1);
        }
        assert!(c.recycled.lock().len() <= MAX_RECYCLED_PAGES);
    }

    #[test]
    fn the_cache_stays_within_its_capacity() {
        let c = ReadCache::new(256 << 10, 4096);
        for g in 0..1000u64 {
            c.insert(g, 0, &vec![g as u8; 4096]);
        }
        let s = c.stats();
        assert!(s.used_bytes <= 256 << 10, "{s:?}");
        assert!(s.pages > 10, "{s:?}");
    }
}
