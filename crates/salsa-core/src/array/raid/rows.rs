//! The parity of the rows being filled in a RAID-5 array, kept in memory so that no write
//! ever reads old data or old parity (no read-modify-write).
//!
//! A row is open from the first write of one of its data bytes until its parity is on the
//! device and every write that contributed to it has finished. While open it holds the XOR of
//! the data written into it so far and which grains that covers. The write that fills the
//! row's last grain takes the finished parity and writes it with its data.
//!
//! With a parity buffer, a row also keeps the part of its parity whose writes have landed on
//! the devices (`landed`): what a sync may make durable in the buffer, as those grains are
//! durable on the members once their sync returns, while grains still in flight are not.
//!
//! A write whose writer computed its parity row by row ([`WriteParity`], the log's records)
//! adds one stripe unit per row, or hands a row new to it its part as the parity; other writes
//! are XORed from their bytes. Closed rows give their buffers back to the pool writers draw
//! their parts from.
//!
//! The rows are kept in [`ROW_SHARDS`] maps by segment, each under its own lock: a record's
//! write adds its parity to its rows' under the lock, and one lock for every
//! segment made each record writer, GC writer and segment allocation (which forgets the
//! reused segment's rows) wait for the others' XORs (up to a millisecond per allocation on
//! RAID-5 random writes, docs/BENCHMARKS.md).
//!
//! Invariants: a grain is contributed once (the log never overwrites inside a segment); a row
//! leaves the map only when it is complete and no contributing write is in flight, so a reader
//! that finds no open row may trust the parity on the device; a reader that finds one waits
//! for its writes and reconstructs from its in-memory parity and the grains it covers.

use super::stripe::{Piece, Stripe};
use super::write_parity::{xor_into, ParityGeometry, WriteParity};
use crate::util::{AlignedBuf, BufferPool};
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
    /// With a parity buffer: the XOR of the grains whose writes finished, and which those are.
    landed: Option<(Vec<u8>, Vec<bool>)>,
}

/// The durable part of an open row's parity, as a parity buffer keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LandedRow {
    pub segment: u32,
    pub row: u64,
    /// Per data grain of the row (unit-major): in `parity`?
    pub covered: Vec<bool>,
    pub parity: Vec<u8>,
}

/// What a reconstruction may use of an open row: its parity so far and the grains it covers.
pub struct RowSnapshot {
    pub parity: Vec<u8>,
    pub contributed: Vec<bool>,
}

/// Maps the open rows are kept in (by segment).
pub const ROW_SHARDS: usize = 64;

/// Most bytes of free unit buffers kept for reuse (rows' parity and writers' parts of it).
const PARITY_BUFFERS_MAX_BYTES: usize = 8 << 20;

/// The open rows of the segments whose number is this shard's modulo [`ROW_SHARDS`].
#[derive(Default)]
struct Shard {
    rows: Mutex<HashMap<(u32, u64), Row>>,
    /// Signalled when a write to one of its rows finishes.
    settled: Condvar,
}

/// The open rows of every segment.
pub struct OpenRows {
    stripe: Stripe,
    /// The stripe's parity geometry and the unit buffers rows and writers' parity share.
    geometry: ParityGeometry,
    grain_bytes: u64,
    shards: Box<[Shard]>,
    /// Keep each row's landed parity (a parity buffer is in use).
    track_landed: bool,
    /// Bumped whenever some row's landed parity changes or a row goes: a sync with the same
    /// value as the last one has nothing new for the parity buffer.
    landed_version: std::sync::atomic::AtomicU64,
}

/// A finished row's parity, to be written at `member_offset` of the parity member.
pub struct DoneParity {
    pub row: u64,
    pub member: u32,
    pub parity: Arc<AlignedBuf>,
}

impl OpenRows {
    pub fn new(stripe: Stripe, grain_bytes: u64, track_landed: bool) -> OpenRows {
        OpenRows {
            geometry: ParityGeometry {
                unit_bytes: stripe.unit_bytes,
                row_bytes: stripe.row_bytes(),
                buffers: Arc::new(BufferPool::new(PARITY_BUFFERS_MAX_BYTES)),
            },
            stripe,
            grain_bytes,
            shards: (0..ROW_SHARDS).map(|_| Shard::default()).collect(),
            track_landed,
            landed_version: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The parity geometry and unit buffers, for writers that compute their parity.
    pub fn geometry(&self) -> &ParityGeometry {
        &self.geometry
    }

    fn shard(&self, segment: u32) -> &Shard {
        &self.shards[segment as usize % ROW_SHARDS]
    }

    fn row_grains(&self) -> usize {
        self.grains_per_unit() * self.stripe.data_members() as usize
    }

    /// The grain of the row's data (unit-major) a piece starts at, and how many it covers.
    fn grains_of(&self, p: &Piece) -> (usize, usize) {
        let in_unit = p.member_offset % self.stripe.unit_bytes;
        let first = p.unit as usize * self.grains_per_unit() + (in_unit / self.grain_bytes) as usize;
        (first, (p.len / self.grain_bytes) as usize)
    }

    /// XORs the bytes of piece `p` (given by `bytes_of`) into `parity`, one stripe unit long.
    fn xor_piece(&self, parity: &mut [u8], p: &Piece, bytes_of: &mut impl FnMut(&Piece, &mut dyn FnMut(u64, &[u8]))) {
        let in_unit = p.member_offset % self.stripe.unit_bytes;
        bytes_of(p, &mut |at, bytes| {
            let from = (in_unit + at) as usize;
            xor_into(&mut parity[from..from + bytes.len()], bytes);
        });
    }

    /// XORs piece `p` of a write into `parity` (one stripe unit): from the write's computed
    /// parity when it has one, once per row (its part holds every piece of the write in the
    /// row, so it goes in with the row's first piece), else from the piece's bytes.
    fn add_piece(
        &self,
        parity: &mut [u8],
        p: &Piece,
        first_piece_of_row: bool,
        parity_of_write: Option<&WriteParity>,
        bytes_of: &mut impl FnMut(&Piece, &mut dyn FnMut(u64, &[u8])),
    ) {
        match parity_of_write {
            Some(w) => {
                if let Some(part) = w.row(p.row).filter(|_| first_piece_of_row) {
                    xor_into(parity, part);
                }
            }
            None => self.xor_piece(parity, p, bytes_of),
        }
    }

    fn bump(&self) {
        self.landed_version.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// See `landed_version`.
    pub fn landed_version(&self) -> u64 {
        self.landed_version.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn grains_per_unit(&self) -> usize {
        (self.stripe.unit_bytes / self.grain_bytes) as usize
    }

    /// Adds the data of `pieces` to their rows' parity, marks each touched row as having one
    /// more write in flight, and returns the parity of every row this write completes. The
    /// data's parity comes from `parity` when the writer computed it (a row new to this write
    /// takes its part as it is), else from the bytes read through `bytes_of`.
    pub fn contribute(
        &self,
        segment: u32,
        pieces: &[Piece],
        mut parity_of_write: Option<&mut WriteParity>,
        mut bytes_of: impl FnMut(&Piece, &mut dyn FnMut(u64, &[u8])),
    ) -> Vec<DoneParity> {
        let row_grains = self.row_grains();
        let unit = self.stripe.unit_bytes;
        let mut rows = self.shard(segment).rows.lock();
        let mut touched: Vec<u64> = Vec::new();
        let mut done = Vec::new();
        for p in pieces {
            let first_piece_of_row = touched.last() != Some(&p.row);
            let row = rows.entry((segment, p.row)).or_insert_with(|| {
                // A new row's parity is what this write adds to it; with a parity buffer the
                // part is still needed once the write lands, so it is copied, not taken.
                let parity = match parity_of_write.as_deref_mut() {
                    Some(w) if !self.track_landed => w.take_row(p.row),
                    _ => None,
                };
                Row {
                    parity: Arc::new(parity.unwrap_or_else(|| self.geometry.zeroed_unit())),
                    contributed: vec![false; row_grains],
                    filled_grains: 0,
                    pending: 0,
                    landed: self.track_landed.then(|| (vec![0u8; unit as usize], vec![false; row_grains])),
                }
            });
            if first_piece_of_row {
                row.pending += 1;
                touched.push(p.row);
            }
            let parity = Arc::get_mut(&mut row.parity).expect("an open row's parity is not shared until it is complete");
            // (A part taken above left `None` here: its row's parity already holds it.)
            self.add_piece(parity, p, first_piece_of_row, parity_of_write.as_deref(), &mut bytes_of);
            let (first, n) = self.grains_of(p);
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

    /// The write of `pieces` of `segment` has finished its device I/O (`landed`: it succeeded,
    /// and `bytes_of` gives its data again, for the landed parity): complete rows with no write
    /// in flight close.
    pub fn finished(
        &self,
        segment: u32,
        pieces: &[Piece],
        landed: bool,
        parity_of_write: Option<&WriteParity>,
        mut bytes_of: impl FnMut(&Piece, &mut dyn FnMut(u64, &[u8])),
    ) {
        let shard = self.shard(segment);
        let mut rows = shard.rows.lock();
        let row_grains = self.row_grains();
        if landed && self.track_landed {
            let mut last_row = None;
            for p in pieces {
                let (first, n) = self.grains_of(p);
                let first_piece_of_row = last_row != Some(p.row);
                last_row = Some(p.row);
                let Some(row) = rows.get_mut(&(segment, p.row)) else { continue };
                let Some((parity, covered)) = row.landed.as_mut() else { continue };
                self.add_piece(parity, p, first_piece_of_row, parity_of_write, &mut bytes_of);
                for c in &mut covered[first..first + n] {
                    *c = true;
                }
            }
            self.bump();
        }
        let mut last = None;
        for r in pieces.iter().map(|p| p.row) {
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
                if let Some(row) = rows.remove(&key) {
                    // Its parity is on the device: the buffer serves the next row.
                    if let Ok(parity) = Arc::try_unwrap(row.parity) {
                        self.geometry.buffers.put(parity);
                    }
                }
                self.bump();
            }
        }
        drop(rows);
        shard.settled.notify_all();
    }

    /// The landed parity of every open row that has some (what a sync puts in the parity
    /// buffer), ordered by segment and row, and the landed version it reflects: the version is
    /// read before the shards, so a change the rows miss bumps it past what is returned.
    pub fn landed_rows(&self) -> (u64, Vec<LandedRow>) {
        let version = self.landed_version();
        let mut out: Vec<LandedRow> = Vec::new();
        for shard in self.shards.iter() {
            let rows = shard.rows.lock();
            out.extend(rows.iter().filter_map(|(&(segment, row), r)| {
                let (parity, covered) = r.landed.as_ref()?;
                covered.iter().any(|c| *c).then(|| LandedRow {
                    segment,
                    row,
                    covered: covered.clone(),
                    parity: parity.clone(),
                })
            }));
        }
        out.sort_unstable_by_key(|r| (r.segment, r.row));
        (version, out)
    }

    /// Puts back a row whose parity a parity buffer kept across a restart: its covered grains
    /// are on the members, nothing more will be written to it, and reconstruction uses this
    /// parity until the row's segment is reused or its parity is re-derived on the members.
    pub fn restore(&self, r: LandedRow) {
        let row_grains = self.row_grains();
        assert_eq!(r.covered.len(), row_grains, "restored row of another geometry");
        assert_eq!(
            r.parity.len() as u64,
            self.stripe.unit_bytes,
            "restored parity of another stripe unit"
        );
        let filled = r.covered.iter().filter(|c| **c).count();
        let mut parity = AlignedBuf::zeroed(r.parity.len());
        parity.copy_from_slice(&r.parity);
        self.shard(r.segment).rows.lock().insert(
            (r.segment, r.row),
            Row {
                parity: Arc::new(parity),
                contributed: r.covered.clone(),
                filled_grains: filled,
                pending: 0,
                landed: Some((r.parity, r.covered)),
            },
        );
        self.bump();
    }

    /// Forgets row `row` of `segment`, whose parity was just re-derived on the members.
    pub fn forget_row(&self, segment: u32, row: u64) {
        if self.shard(segment).rows.lock().remove(&(segment, row)).is_some() {
            self.bump();
        }
    }

    /// For a reconstruction of row `row` of `segment`: `None` when the row is closed (the
    /// device holds its parity and all its data), else its parity so far and coverage, taken
    /// once no write to it is in flight (so the device holds every grain it covers).
    pub fn snapshot(&self, segment: u32, row: u64) -> Option<RowSnapshot> {
        let shard = self.shard(segment);
        let mut rows = shard.rows.lock();
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
                    shard.settled.wait_for(&mut rows, Duration::from_millis(50));
                }
            }
        }
    }

    /// Whether row `row` of `segment` is open (being filled, or its writes still in flight).
    pub fn is_open(&self, segment: u32, row: u64) -> bool {
        self.shard(segment).rows.lock().contains_key(&(segment, row))
    }

    /// Forgets the open rows of `segment` (it is being reused; nothing of it is in flight).
    pub fn forget_segment(&self, segment: u32) {
        self.shard(segment).rows.lock().retain(|(s, _), _| *s != segment);
        self.bump();
    }
}
