//! The parity one write adds to the RAID-5 rows it touches, computed by whoever fills the
//! write's buffer, page by page while each page is still in its cache.
//!
//! The log fills a record (1 MiB by default) over a millisecond or two and a write-back thread
//! sends it. XORing the record into its rows' parity there read the whole record back from
//! memory: 87% of the write-back threads' time, about 220 us a record (4.5 GB/s, against 32
//! GB/s for data in cache), in bursts that took the core from the thread acknowledging writes
//! (docs/BENCHMARKS.md). Added as each page is copied, a page costs a fraction of a
//! microsecond, and the array takes each row's part as it is, or XORs one stripe unit per
//! row instead of the row's data.
//!
//! Owns: one stripe-unit buffer per row the write touches, holding the XOR of the write's
//! bytes in that row, each at its offset within its unit (where its parity goes).
//!
//! Invariant (the array trusts it, see [`crate::array::Array::write_vectored_with_parity`]):
//! the buffers hold exactly the XOR of the bytes the write carries that were added, and every
//! byte of the write not added is zero (padding). A row with no buffer had only zeros added.

use crate::util::{AlignedBuf, BufferPool};
use std::sync::Arc;

/// Where parity goes in a RAID-5 segment (the stripe unit and the data bytes of one row), and
/// the array's recycled unit buffers: a fresh one per row cost its allocation and page faults
/// on every writer (as `free` was 17% of the GC workers' time when the array allocated them).
#[derive(Clone)]
pub struct ParityGeometry {
    pub unit_bytes: u64,
    pub row_bytes: u64,
    pub buffers: Arc<BufferPool>,
}

impl ParityGeometry {
    /// A unit buffer of zeros, recycled when one is free.
    pub fn zeroed_unit(&self) -> AlignedBuf {
        let mut b = self.buffers.get(self.unit_bytes as usize);
        b.fill(0);
        b
    }
}

/// The parity a write starting at segment byte `start` adds to each row it touches.
pub struct WriteParity {
    geometry: ParityGeometry,
    start: u64,
    first_row: u64,
    /// Per row from `first_row` on: the XOR of the bytes added to it (`None`: nothing yet).
    parts: Vec<Option<AlignedBuf>>,
}

impl WriteParity {
    /// Nothing added yet, for a write that starts at byte `start_bytes` of its segment.
    pub fn new(geometry: ParityGeometry, start_bytes: u64) -> WriteParity {
        assert!(
            geometry.unit_bytes > 0 && geometry.row_bytes.is_multiple_of(geometry.unit_bytes),
            "a row is a whole number of stripe units"
        );
        WriteParity {
            first_row: start_bytes / geometry.row_bytes,
            geometry,
            start: start_bytes,
            parts: Vec::new(),
        }
    }

    /// The segment byte the write starts at.
    pub fn start_bytes(&self) -> u64 {
        self.start
    }

    /// Adds `bytes`, which the write carries at segment byte `at_bytes`, to their rows' parity.
    pub fn add(&mut self, at_bytes: u64, bytes: &[u8]) {
        assert!(at_bytes >= self.start, "bytes before the write's start");
        let unit = self.geometry.unit_bytes;
        let mut at = at_bytes;
        let mut rest = bytes;
        while !rest.is_empty() {
            let index = (at / self.geometry.row_bytes - self.first_row) as usize;
            let in_unit = (at % unit) as usize;
            let n = (unit as usize - in_unit).min(rest.len());
            if self.parts.len() <= index {
                self.parts.resize_with(index + 1, || None);
            }
            let geometry = &self.geometry;
            let part = self.parts[index].get_or_insert_with(|| geometry.zeroed_unit());
            xor_into(&mut part[in_unit..in_unit + n], &rest[..n]);
            at += n as u64;
            rest = &rest[n..];
        }
    }

    fn index(&self, row: u64) -> Option<usize> {
        row.checked_sub(self.first_row)
            .map(|i| i as usize)
            .filter(|&i| i < self.parts.len())
    }

    /// What the write adds to row `row`'s parity (`None`: nothing, its bytes there are zeros).
    pub fn row(&self, row: u64) -> Option<&[u8]> {
        self.index(row).and_then(|i| self.parts[i].as_deref())
    }

    /// Takes row `row`'s part, for a row whose parity it becomes.
    pub fn take_row(&mut self, row: u64) -> Option<AlignedBuf> {
        self.index(row).and_then(|i| self.parts[i].take())
    }
}

impl Drop for WriteParity {
    fn drop(&mut self) {
        for part in self.parts.drain(..).flatten() {
            self.geometry.buffers.put(part);
        }
    }
}

/// `dst ^= src`, byte by byte (the compiler vectorizes it).
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "XOR of slices of different lengths");
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geo() -> ParityGeometry {
        ParityGeometry {
            unit_bytes: 16,
            row_bytes: 48,
            buffers: Arc::new(BufferPool::new(1 << 20)),
        }
    }
    const UNIT: u64 = 16;
    const ROW: u64 = 48;

    proptest! {
        /// Whatever the pieces, each row's part is the XOR of the bytes added in that row,
        /// folded onto the unit (as the array folds a row's data onto its parity unit).
        #[test]
        fn each_row_holds_the_xor_of_its_bytes_at_their_unit_offsets(
            start in 0u64..200,
            pieces in prop::collection::vec((0u64..60, prop::collection::vec(any::<u8>(), 1..70)), 1..6),
        ) {
            let mut wp = WriteParity::new(geo(), start);
            let mut expected: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
            let mut at = start;
            for (gap, bytes) in &pieces {
                at += gap;
                wp.add(at, bytes);
                for (i, b) in bytes.iter().enumerate() {
                    let x = at + i as u64;
                    let row = expected.entry(x / ROW).or_insert_with(|| vec![0; UNIT as usize]);
                    row[(x % UNIT) as usize] ^= b;
                }
                at += bytes.len() as u64;
            }
            for row in start / ROW..at / ROW + 2 {
                let zeros = vec![0u8; UNIT as usize];
                let want = expected.get(&row).unwrap_or(&zeros);
                let got = wp.row(row).map(|p| p.to_vec()).unwrap_or_else(|| zeros.clone());
                prop_assert_eq!(&got, want, "row {}", row);
            }
        }
    }

    #[test]
    fn a_taken_row_is_gone_and_rows_outside_the_write_have_nothing() {
        let mut wp = WriteParity::new(geo(), 50);
        wp.add(50, &[1; 60]);
        assert!(wp.row(0).is_none(), "row before the write");
        assert!(wp.row(1).is_some() && wp.row(2).is_some());
        assert!(wp.row(3).is_none(), "row after the write");
        assert!(wp.take_row(1).is_some());
        assert!(wp.row(1).is_none() && wp.take_row(1).is_none());
    }
}
