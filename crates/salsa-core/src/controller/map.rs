//! The logical-to-physical page map of an LSA volume: a flat array with one atomic entry per
//! logical page, 4 bytes wide while every encoded value fits in 32 bits and 8 bytes beyond.
//! Updated lock-free: writers swap, the GC compare-and-swaps, so a relocation never overwrites a
//! newer write.
//!
//! Entry encoding (`total_grains` = grains in the pool):
//! - `0`: never written; reads as zeros;
//! - `1 ..= total_grains`: mapped, the page starts at grain `value - 1`;
//! - `total_grains + 1 + s`: trimmed; the tombstone that records the trim lives in segment `s`
//!   (the GC must carry it forward while older copies may still exist on the device).

use super::extent_map::ExtentMap;
pub use super::map_entry::{Encoding, Entry};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::SeqCst};

enum Slots {
    Narrow(Box<[AtomicU32]>),
    Wide(Box<[AtomicU64]>),
    /// Runs of entries (an append-only volume's map).
    Extents(ExtentMap),
}

/// The page map: flat (one atomic entry per page), or an extent map for volumes written in
/// long runs; the two answer every call the same way.
pub struct PageMap {
    slots: Slots,
    pub encoding: Encoding,
    /// A compressing volume's: the grains each mapped page's data takes, 0 for a whole page
    /// (see [`PageMap::with_stored_sizes`]). Changed together with the page's entry, under
    /// the writer's page lock.
    stored: Option<Box<[AtomicU8]>>,
}

impl PageMap {
    pub fn new(pages: u64, encoding: Encoding) -> PageMap {
        let slots = if encoding.narrow() {
            Slots::Narrow((0..pages).map(|_| AtomicU32::new(0)).collect())
        } else {
            Slots::Wide((0..pages).map(|_| AtomicU64::new(0)).collect())
        };
        PageMap {
            slots,
            encoding,
            stored: None,
        }
    }

    /// The same map keeping each page's stored size beside its entry (a byte a page).
    pub fn with_stored_sizes(mut self) -> PageMap {
        self.stored = Some((0..self.pages()).map(|_| AtomicU8::new(0)).collect());
        self
    }

    pub fn has_stored_sizes(&self) -> bool {
        self.stored.is_some()
    }

    /// Grains `page`'s data takes as stored, 0 for a whole page (always 0 without sizes).
    pub fn stored_grains(&self, page: u64) -> u8 {
        self.stored.as_ref().map_or(0, |s| s[page as usize].load(SeqCst))
    }

    /// Sets `page`'s stored size (0: a whole page), returning the old one.
    pub fn swap_stored_grains(&self, page: u64, grains: u8) -> u8 {
        self.stored.as_ref().map_or(0, |s| s[page as usize].swap(grains, SeqCst))
    }

    /// An extent map of `pages` pages of `page_grains` grains.
    pub fn extents(pages: u64, encoding: Encoding, page_grains: u32) -> PageMap {
        PageMap {
            slots: Slots::Extents(ExtentMap::new(pages, encoding, page_grains)),
            encoding,
            stored: None,
        }
    }

    pub fn pages(&self) -> u64 {
        match &self.slots {
            Slots::Narrow(s) => s.len() as u64,
            Slots::Wide(s) => s.len() as u64,
            Slots::Extents(m) => m.pages(),
        }
    }

    /// Bytes per entry of a flat map (0 for an extent map).
    fn entry_bytes(&self) -> u64 {
        match &self.slots {
            Slots::Narrow(_) => 4,
            Slots::Wide(_) => 8,
            Slots::Extents(_) => 0,
        }
    }

    pub fn memory_bytes(&self) -> u64 {
        let sizes = self.stored.as_ref().map_or(0, |s| s.len() as u64);
        sizes
            + match &self.slots {
                Slots::Extents(m) => m.memory_bytes(),
                _ => self.pages() * self.entry_bytes(),
            }
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        match &self.slots {
            Slots::Extents(m) => m.clear(),
            _ => (0..self.pages()).for_each(|p| self.store(p, Entry::Unmapped)),
        }
    }

    /// The extent map's runs, when it is one.
    pub fn run_count(&self) -> Option<u64> {
        match &self.slots {
            Slots::Extents(m) => Some(m.run_count()),
            _ => None,
        }
    }

    pub fn load_raw(&self, page: u64) -> u64 {
        match &self.slots {
            Slots::Narrow(s) => s[page as usize].load(SeqCst) as u64,
            Slots::Wide(s) => s[page as usize].load(SeqCst),
            Slots::Extents(m) => m.load_raw(page),
        }
    }

    pub fn load(&self, page: u64) -> Entry {
        self.encoding.decode(self.load_raw(page))
    }

    pub fn store(&self, page: u64, e: Entry) {
        let v = self.encoding.encode(e);
        match &self.slots {
            Slots::Narrow(s) => s[page as usize].store(v as u32, SeqCst),
            Slots::Wide(s) => s[page as usize].store(v, SeqCst),
            Slots::Extents(m) => {
                m.swap_raw(page, v);
            }
        }
    }

    /// Replaces the entry, returning the old one.
    pub fn swap(&self, page: u64, e: Entry) -> Entry {
        let v = self.encoding.encode(e);
        let old = match &self.slots {
            Slots::Narrow(s) => s[page as usize].swap(v as u32, SeqCst) as u64,
            Slots::Wide(s) => s[page as usize].swap(v, SeqCst),
            Slots::Extents(m) => m.swap_raw(page, v),
        };
        self.encoding.decode(old)
    }

    /// Replaces `old` by `new` only if the entry still is `old`.
    pub fn compare_exchange(&self, page: u64, old: Entry, new: Entry) -> bool {
        let (o, n) = (self.encoding.encode(old), self.encoding.encode(new));
        match &self.slots {
            Slots::Narrow(s) => s[page as usize].compare_exchange(o as u32, n as u32, SeqCst, SeqCst).is_ok(),
            Slots::Wide(s) => s[page as usize].compare_exchange(o, n, SeqCst, SeqCst).is_ok(),
            Slots::Extents(m) => m.compare_exchange_raw(page, o, n),
        }
    }

    /// A copy of the map with `pages` entries (growing a volume); entries past the old end are
    /// unmapped.
    pub fn grown(&self, pages: u64) -> PageMap {
        let mut m = match &self.slots {
            Slots::Extents(e) => PageMap::extents(pages, self.encoding, e.page_grains()),
            _ => PageMap::new(pages, self.encoding),
        };
        if self.has_stored_sizes() {
            m = m.with_stored_sizes();
        }
        self.for_each_mapped(|p, v| {
            if p < pages {
                m.store(p, self.encoding.decode(v));
                m.swap_stored_grains(p, self.stored_grains(p));
            }
        });
        m
    }

    /// Calls `visit(page, encoded entry)` for every page that is not unmapped, in page order.
    pub fn for_each_mapped(&self, mut visit: impl FnMut(u64, u64)) {
        match &self.slots {
            Slots::Extents(m) => {
                let step = m.page_grains() as u64;
                m.for_each_run(|first, len, value| {
                    let mapped = matches!(self.encoding.decode(value), Entry::Mapped(_));
                    for k in 0..len {
                        visit(first + k, if mapped { value + k * step } else { value });
                    }
                })
            }
            _ => {
                for p in 0..self.pages() {
                    let v = self.load_raw(p);
                    if v != 0 {
                        visit(p, v);
                    }
                }
            }
        }
    }

    /// Bytes [`PageMap::encode_image`] appends, and [`PageMap::encode_stored_sizes`] after it.
    pub fn image_bytes(&self) -> u64 {
        8 + 1
            + self.stored.as_ref().map_or(0, |s| s.len() as u64)
            + match &self.slots {
                Slots::Extents(m) => m.image_bytes(),
                _ => self.pages() * self.entry_bytes(),
            }
    }

    /// Appends the stored sizes, a byte a page (a compressing volume's checkpoint adds them
    /// after the map's image; format 14).
    pub fn encode_stored_sizes(&self, out: &mut Vec<u8>) {
        if let Some(s) = &self.stored {
            out.extend(s.iter().map(|g| g.load(SeqCst)));
        }
    }

    /// Loads sizes written by [`PageMap::encode_stored_sizes`]; each at most `page_grains`.
    pub fn load_stored_sizes(&self, d: &mut crate::util::Decoder<'_>, page_grains: u32) -> std::result::Result<(), String> {
        let Some(s) = &self.stored else { return Ok(()) };
        let raw = d.take(s.len(), "stored sizes").map_err(|e| e.to_string())?;
        for (slot, &g) in s.iter().zip(raw) {
            if g as u32 > page_grains {
                return Err(format!("a stored size of {g} grains in pages of {page_grains}"));
            }
            slot.store(g, SeqCst);
        }
        Ok(())
    }

    /// Checkpoint image: the page count, the entry width (0: runs follow), then the raw
    /// little-endian entries or the runs.
    pub fn encode_image(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pages().to_le_bytes());
        out.push(self.entry_bytes() as u8);
        match &self.slots {
            Slots::Extents(m) => m.encode_into(out),
            _ => {
                let wide = self.entry_bytes() == 8;
                for p in 0..self.pages() {
                    let v = self.load_raw(p);
                    if wide {
                        out.extend_from_slice(&v.to_le_bytes());
                    } else {
                        out.extend_from_slice(&(v as u32).to_le_bytes());
                    }
                }
            }
        }
    }

    /// Loads an image written by [`PageMap::encode_image`] into this (empty) map of the same
    /// kind and size; every entry is checked.
    pub fn load_image(&self, d: &mut crate::util::Decoder<'_>) -> std::result::Result<(), String> {
        let pages = d.u64("pages").map_err(|e| e.to_string())?;
        let width = d.u8("width").map_err(|e| e.to_string())? as u64;
        if pages != self.pages() || width != self.entry_bytes() {
            return Err("map size differs from the volume table".into());
        }
        if let Slots::Extents(m) = &self.slots {
            return m.load_image(d);
        }
        let raw = d.take((pages * width) as usize, "map").map_err(|e| e.to_string())?;
        let max = self.encoding.max_value();
        for (p, chunk) in raw.chunks_exact(width as usize).enumerate() {
            let mut v = [0u8; 8];
            v[..width as usize].copy_from_slice(chunk);
            let v = u64::from_le_bytes(v);
            if v > max {
                return Err("map entry out of range".into());
            }
            self.store(p as u64, self.encoding.decode(v));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_round_trips_and_width_switches_at_32_bits() {
        let enc = Encoding {
            total_grains: 1000,
            total_segments: 10,
        };
        for e in [
            Entry::Unmapped,
            Entry::Mapped(0),
            Entry::Mapped(999),
            Entry::Trimmed(0),
            Entry::Trimmed(9),
        ] {
            assert_eq!(enc.decode(enc.encode(e)), e);
        }
        assert!(enc.narrow());
        assert!(!Encoding {
            total_grains: u32::MAX as u64,
            total_segments: 4
        }
        .narrow());
        let m = PageMap::new(8, enc);
        assert_eq!(m.entry_bytes(), 4);
        assert_eq!(m.swap(3, Entry::Mapped(5)), Entry::Unmapped);
        assert!(!m.compare_exchange(3, Entry::Mapped(4), Entry::Mapped(6)));
        assert!(m.compare_exchange(3, Entry::Mapped(5), Entry::Mapped(6)));
        assert_eq!(m.load(3), Entry::Mapped(6));
    }
}
