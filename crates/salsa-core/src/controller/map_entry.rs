//! A map entry and its encoding, shared by the flat page map ([`super::map`]) and the extent
//! map ([`super::extent_map`]), so that neither map reaches into the other for them.
//!
//! Entry encoding (`total_grains` = grains in the pool):
//! - `0`: never written; reads as zeros;
//! - `1 ..= total_grains`: mapped, the page starts at grain `value - 1`;
//! - `total_grains + 1 + s`: trimmed; the tombstone that records the trim lives in segment `s`
//!   (the GC must carry it forward while older copies may still exist on the device).

/// Decoded map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Unmapped,
    Mapped(u64),
    Trimmed(u32),
}

/// Encoding parameters shared by every map of a pool.
#[derive(Debug, Clone, Copy)]
pub struct Encoding {
    pub total_grains: u64,
    pub total_segments: u32,
}

impl Encoding {
    pub fn encode(&self, e: Entry) -> u64 {
        match e {
            Entry::Unmapped => 0,
            Entry::Mapped(g) => {
                debug_assert!(g < self.total_grains);
                g + 1
            }
            Entry::Trimmed(s) => self.total_grains + 1 + s as u64,
        }
    }
    pub fn decode(&self, v: u64) -> Entry {
        if v == 0 {
            Entry::Unmapped
        } else if v <= self.total_grains {
            Entry::Mapped(v - 1)
        } else {
            let s = v - self.total_grains - 1;
            assert!(s < self.total_segments as u64, "map entry {v} out of range");
            Entry::Trimmed(s as u32)
        }
    }
    /// Largest value an entry can hold.
    pub fn max_value(&self) -> u64 {
        self.total_grains + self.total_segments as u64
    }
    /// Whether 4-byte entries suffice.
    pub fn narrow(&self) -> bool {
        self.max_value() <= u32::MAX as u64
    }
}
