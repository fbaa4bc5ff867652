//! Temperatures of page groups: one 64-bit word per group, raised by reads, halving every
//! half-life. Approximate by design (concurrent raises may be lost to a decay step, and they do
//! not survive a restart): they only decide what is worth a fast copy.
//!
//! A word holds the decayed read count in its low 48 bits and, in its high 16, the half-life
//! epoch it was last brought up to date in; a reader decays the count by the epochs since.

use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Instant;

const COUNT_BITS: u32 = 48;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The temperatures of a volume's groups.
pub struct Temperatures {
    words: RwLock<Vec<AtomicU64>>,
    half_life_ms: u64,
    born: Instant,
}

impl Temperatures {
    pub fn new(groups: u64, half_life_ms: u64) -> Temperatures {
        Temperatures {
            words: RwLock::new((0..groups).map(|_| AtomicU64::new(0)).collect()),
            half_life_ms: half_life_ms.max(1),
            born: Instant::now(),
        }
    }

    fn epoch(&self) -> u64 {
        (self.born.elapsed().as_millis() as u64 / self.half_life_ms) & 0xffff
    }

    /// The count in `word`, decayed to epoch `now`.
    fn decayed(word: u64, now: u64) -> u64 {
        let then = word >> COUNT_BITS;
        let halvings = now.wrapping_sub(then) & 0xffff;
        if halvings >= COUNT_BITS as u64 {
            0
        } else {
            (word & COUNT_MASK) >> halvings
        }
    }

    /// One more read of `group`; returns its temperature after it.
    pub fn raise(&self, group: u64) -> u64 {
        let words = self.words.read();
        let Some(w) = words.get(group as usize) else { return 0 };
        let now = self.epoch();
        let mut next = 0;
        let _ = w.fetch_update(SeqCst, SeqCst, |word| {
            next = (Self::decayed(word, now) + 1).min(COUNT_MASK);
            Some(now << COUNT_BITS | next)
        });
        next
    }

    /// The temperature of `group` now.
    pub fn get(&self, group: u64) -> u64 {
        let words = self.words.read();
        words.get(group as usize).map_or(0, |w| Self::decayed(w.load(SeqCst), self.epoch()))
    }

    /// Room for `groups` groups (the volume grew).
    pub fn grow(&self, groups: u64) {
        let mut words = self.words.write();
        while (words.len() as u64) < groups {
            words.push(AtomicU64::new(0));
        }
    }

    pub fn memory_bytes(&self) -> u64 {
        self.words.read().len() as u64 * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_raise_a_temperature_and_time_halves_it() {
        let t = Temperatures::new(4, 20);
        for _ in 0..8 {
            t.raise(1);
        }
        assert!(t.get(1) >= 4, "{}", t.get(1));
        assert_eq!(t.get(2), 0);
        assert_eq!(t.raise(99), 0, "a group past the end is ignored");
        std::thread::sleep(std::time::Duration::from_millis(90));
        assert!(t.get(1) <= 1, "four half-lives later: {}", t.get(1));
        assert_eq!(Temperatures::decayed(5 | (3 << COUNT_BITS), 3 + 60), 0);
        assert_eq!(Temperatures::decayed(8 | (0xffff << COUNT_BITS), 1), 2, "the epoch wraps");
    }
}
