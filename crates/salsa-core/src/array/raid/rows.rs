//! The parity of the rows being filled in a RAID-5 array, kept in memory so that no write
//! ever reads old data or old parity (no read-modify-write).
//!
//! A row is open from the first write of one of its data bytes until its parity is on the
//! device and every write that contributed to it has finished. While open it holds the XOR of
//! the data written into it so far and which grains that covers. The write that fills the
//! row's last grain takes the finished parity and writes it with its data.
//!
//! Invariants: a grain is contributed once (the log never overwrites inside a segment); a row
//! leaves the map only when it is complete and no contributing write is in flight, so a reader
//! that finds no open row may trust the parity on the device; a reader that finds one waits
//! for its writes and reconstructs from its in-memory parity and the grains it covers.

use super::stripe::{Piece, Stripe};
use crate::util::AlignedBuf;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// One open row.
struct Row {
    /// XOR of the data contributed so far, one stripe unit long.
    parity: Arc<AlignedBuf>,
    /// Per grain of the row's data (unit-major): contributed yet?
    contributed: Vec<bool>,
    filled_grains: usize,
    /// Writes that contributed and have not finished their device I/O.
    pending: u32,
}

/// What a reconstruction may use of an open row: its parity so far and the grains it covers.
pub struct RowSnapshot {
    pub parity: Vec<u8>,
    pub contributed: Vec<bool>,
}

/// The open rows of every segment.
pub struct OpenRows {
    stripe: Stripe,
    grain_bytes: u64,
    rows: Mutex<HashMap<(u32, u64), Row>>,
    settled: Condvar,
}

/// A finished row's parity, to be written at `member_offset` of the parity member.
pub struct DoneParity {
    pub row: u64,
    pub member: u32,
    pub parity: Arc<AlignedBuf>,
}

impl OpenRows {
    pub fn new(stripe: Stripe, grain_bytes: u64) -> OpenRows {
        OpenRows {
            stripe,
            grain_bytes,
            rows: Mutex::new(HashMap::new()),
            settled: Condvar::new(),
        }
    }

    fn grains_per_unit(&self) -> usize {
        (self.stripe.unit_bytes / self.grain_bytes) as usize
    }

    /// Adds the data of `pieces` (bytes read through `bytes_of`) to their rows' parity, marks
    /// each touched row as having one more write in flight, and returns the parity of every
    /// row this write completes.
    pub fn contribute(
        &self,
        segment: u32,
        pieces: &[Piece],
        mut bytes_of: impl FnMut(&Piece, &mut dyn FnMut(u64, &[u8])),
    ) -> Vec<DoneParity> {
        let gpu = self.grains_per_unit();
        let row_grains = gpu * self.stripe.data_members() as usize;
        let unit = self.stripe.unit_bytes;
        let mut rows = self.rows.lock();
        let mut touched: Vec<u64> = Vec::new();
        let mut done = Vec::new();
        for p in pieces {
            let row = rows.entry((segment, p.row)).or_insert_with(|| Row {
                parity: Arc::new(AlignedBuf::zeroed(unit as usize)),
                contributed: vec![false; row_grains],
                filled_grains: 0,
                pending: 0,
            });
            if touched.last() != Some(&p.row) {
                row.pending += 1;
                touched.push(p.row);
            }
            let in_unit = p.member_offset % unit;
            let parity = Arc::get_mut(&mut row.parity).expect("an open row's parity is not shared until it is complete");
            bytes_of(p, &mut |at, bytes| {
                let from = (in_unit + at) as usize;
                for (d, s) in parity[from..from + bytes.len()].iter_mut().zip(bytes) {
                    *d ^= *s;
                }
            });
            let first = p.unit as usize * gpu + (in_unit / self.grain_bytes) as usize;
            let n = (p.len / self.grain_bytes) as usize;
            for c in &mut row.contributed[first..first + n] {
                assert!(!*c, "grain of row {} of segment {segment} written twice", p.row);
                *c = true;
            }
            row.filled_grains += n;
            if row.filled_grains == row_grains {
                done.push(DoneParity {
                    row: p.row,
                    member: self.stripe.parity_member(p.row).expect("RAID-5 rows have parity"),
                    parity: row.parity.clone(),
                });
            }
        }
        done
    }

    /// The write that contributed to `rows` of `segment` has finished its device I/O: complete
    /// rows with no write in flight close.
    pub fn finished(&self, segment: u32, rows_touched: impl Iterator<Item = u64>) {
        let mut rows = self.rows.lock();
        let row_grains = self.grains_per_unit() * self.stripe.data_members() as usize;
        let mut last = None;
        for r in rows_touched {
            if last == Some(r) {
                continue;
            }
            last = Some(r);
            let key = (segment, r);
            let close = match rows.get_mut(&key) {
                Some(row) => {
                    row.pending -= 1;
                    row.pending == 0 && row.filled_grains == row_grains
                }
                None => false,
            };
            if close {
                rows.remove(&key);
            }
        }
        drop(rows);
        self.settled.notify_all();
    }

    /// For a reconstruction of row `row` of `segment`: `None` when the row is closed (the
    /// device holds its parity and all its data), else its parity so far and coverage, taken
    /// once no write to it is in flight (so the device holds every grain it covers).
    pub fn snapshot(&self, segment: u32, row: u64) -> Option<RowSnapshot> {
        let mut rows = self.rows.lock();
        loop {
            match rows.get(&(segment, row)) {
                None => return None,
                Some(r) if r.pending == 0 => {
                    return Some(RowSnapshot {
                        parity: r.parity.to_vec(),
                        contributed: r.contributed.clone(),
                    })
                }
                Some(_) => {
                    self.settled.wait_for(&mut rows, Duration::from_millis(50));
                }
            }
        }
    }

    /// Whether row `row` of `segment` is open (being filled, or its writes still in flight).
    pub fn is_open(&self, segment: u32, row: u64) -> bool {
        self.rows.lock().contains_key(&(segment, row))
    }

    /// Forgets the open rows of `segment` (it is being reused; nothing of it is in flight).
    pub fn forget_segment(&self, segment: u32) {
        self.rows.lock().retain(|(s, _), _| *s != segment);
    }
}
