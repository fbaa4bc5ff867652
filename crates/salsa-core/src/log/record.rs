//! Records: the unit of every device write. A record is one metadata page followed by the data
//! pages it describes; the first record of a segment starts at its grain 0.
//! While a record is open its bytes live in a [`RecordBuf`] that readers can copy from; it is
//! written to the device in one sequential write when full or on flush. Data pages are copied
//! into the record's own buffer, or held where a write's payload already has them
//! ([`RecordBytes`]); the device write then gathers the pieces.

use crate::array::WriteParity;
use crate::format::{MetaEntry, RecordMeta};
use crate::log::payload::WriteBuffer;
use crate::util::{AlignedBuf, BufferPool, IO_ALIGN_BYTES};
use parking_lot::RwLock;
use std::io::IoSlice;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;

/// Most runs of held pages one record keeps (later pages are copied). Sixteen lets a 1 MiB
/// record hold almost every page of the smallest payloads (64 KiB, 16 pages each); what all
/// records together keep alive is bounded by the payload budget in any case.
pub const MAX_HELD_RUNS: usize = 16;

/// The bytes of a record: its own buffer, which holds the metadata page (grain 0) and the data
/// pages copied in, and the runs of data grains it holds in write payloads instead.
///
/// Invariant: held runs are in grain order, do not overlap, lie after grain 0, and their grains
/// of `own` are never read.
pub struct RecordBytes {
    pub own: AlignedBuf,
    held: Vec<HeldRun>,
    /// On a RAID-5 array: the parity of every grain placed so far (and of the metadata page
    /// once sealed), added as each is placed ([`RecordBytes::add_parity`]).
    pub parity: Option<WriteParity>,
}

/// Grains `[grain, grain + grains)` of a record, which are bytes `[at, ..)` of `payload`.
struct HeldRun {
    grain: u32,
    grains: u32,
    payload: Arc<WriteBuffer>,
    at: usize,
}

impl RecordBytes {
    /// A record's bytes in `own`, with `parity` (started at the record's first grain) when
    /// its array has parity.
    pub fn new(own: AlignedBuf, parity: Option<WriteParity>) -> RecordBytes {
        RecordBytes {
            own,
            held: Vec::new(),
            parity,
        }
    }

    /// [`RecordBytes::add_parity`] of grains `[grain, grain + grains)` just copied from
    /// `data` into `own`: XORed from `data`, which the writer has in its cache (the copy's
    /// destination may not be: XORing it back cost about as much as the write-back thread's
    /// XOR of the whole record had), and from `own` past the end of `data`.
    pub fn add_parity_copied(&mut self, grain: u32, grains: u32, grain_bytes: usize, record_start_bytes: u64, data: &[u8]) {
        let Some(parity) = self.parity.as_mut() else { return };
        let at = record_start_bytes + grain as u64 * grain_bytes as u64;
        let len = grains as usize * grain_bytes;
        let from_data = data.len().min(len);
        parity.add(at, &data[..from_data]);
        if from_data < len {
            let first = grain as usize * grain_bytes;
            parity.add(at + from_data as u64, &self.own[first + from_data..first + len]);
        }
    }

    /// Adds grains `[grain, grain + grains)` of the record, as the device write will carry
    /// them (copied or held), to its parity; the record starts at byte `record_start_bytes` of
    /// its segment. Called once per grain, once the grain holds what will be written.
    pub fn add_parity(&mut self, grain: u32, grains: u32, grain_bytes: usize, record_start_bytes: u64) {
        let Some(parity) = self.parity.as_mut() else { return };
        let at = record_start_bytes + grain as u64 * grain_bytes as u64;
        parity.add(
            at,
            &bytes_from(&self.held, &self.own, grain, grain_bytes)[..grains as usize * grain_bytes],
        );
    }

    /// Holds `grains` grains from `grain` on in `payload` at byte `at` instead of copying them,
    /// if the pieces stay aligned for direct I/O and the record may hold one more run; `false`
    /// when the caller must copy.
    pub fn hold(&mut self, grain: u32, grains: u32, payload: &Arc<WriteBuffer>, at: usize, grain_bytes: usize) -> bool {
        assert!(grain > 0, "grain 0 is the metadata page");
        if !at.is_multiple_of(IO_ALIGN_BYTES) || at + grains as usize * grain_bytes > payload.len() {
            return false;
        }
        if let Some(last) = self.held.last_mut() {
            assert!(last.grain + last.grains <= grain, "held runs out of order");
            if last.grain + last.grains == grain
                && Arc::ptr_eq(&last.payload, payload)
                && last.at + last.grains as usize * grain_bytes == at
            {
                last.grains += grains;
                return true;
            }
        }
        if self.held.len() >= MAX_HELD_RUNS {
            return false;
        }
        self.held.push(HeldRun {
            grain,
            grains,
            payload: payload.clone(),
            at,
        });
        true
    }

    /// Copies grains from `grain` on into `out` (a whole number of grains, or less than one).
    fn copy_out(&self, grain: u32, out: &mut [u8], grain_bytes: usize) {
        for (i, piece) in out.chunks_mut(grain_bytes).enumerate() {
            let src = bytes_from(&self.held, &self.own, grain + i as u32, grain_bytes);
            piece.copy_from_slice(&src[..piece.len()]);
        }
    }

    /// The record's first `grains` grains as pieces for one vectored write, in order.
    pub fn io_slices(&self, grains: u32, grain_bytes: usize) -> Vec<IoSlice<'_>> {
        let mut out = Vec::with_capacity(2 * self.held.len() + 1);
        let mut next = 0u32;
        for r in self.held.iter().take_while(|r| r.grain < grains) {
            if r.grain > next {
                out.push(IoSlice::new(&self.own[next as usize * grain_bytes..r.grain as usize * grain_bytes]));
            }
            let n = r.grains.min(grains - r.grain);
            out.push(IoSlice::new(&r.payload[r.at..r.at + n as usize * grain_bytes]));
            next = r.grain + n;
        }
        if next < grains {
            out.push(IoSlice::new(&self.own[next as usize * grain_bytes..grains as usize * grain_bytes]));
        }
        out
    }
}

/// The bytes a record holds from grain `grain` on, where they are: in the payload of the held
/// run that has the grain (up to that payload's end), else in `own`.
fn bytes_from<'a>(held: &'a [HeldRun], own: &'a [u8], grain: u32, grain_bytes: usize) -> &'a [u8] {
    match held.iter().find(|r| (r.grain..r.grain + r.grains).contains(&grain)) {
        Some(r) => &r.payload[r.at + (grain - r.grain) as usize * grain_bytes..],
        None => &own[grain as usize * grain_bytes..],
    }
}

/// The shared bytes of an open or in-flight record.
pub struct RecordBuf {
    pub record_id: u64,
    pub segment: u32,
    /// Physical grain address of the first byte of `bytes`.
    pub first_grain: u64,
    /// Grains of the buffer that belong to this record: its capacity while open, the grains it
    /// used once sealed. The next record of the segment starts right after them, so a reader
    /// must not take later grains from this buffer.
    pub span_grains: AtomicU32,
    pub bytes: RwLock<RecordBytes>,
    /// Where the buffer goes back when the last reference is dropped.
    pub recycle: Arc<BufferPool>,
}

impl Drop for RecordBuf {
    fn drop(&mut self) {
        let buf = std::mem::replace(&mut self.bytes.get_mut().own, AlignedBuf::empty());
        self.recycle.put(buf);
    }
}

impl RecordBuf {
    /// Whether the buffer may hold any grain of `[first_grain, end_grain)`.
    pub fn overlaps(&self, first_grain: u64, end_grain: u64) -> bool {
        first_grain < self.first_grain + self.span_grains.load(SeqCst) as u64 && self.first_grain < end_grain
    }

    /// Copies `out.len()` bytes of physical grain `grain` from the buffer, if it holds them.
    pub fn read(&self, grain: u64, grain_bytes: usize, out: &mut [u8]) -> bool {
        let b = self.bytes.read();
        let n_grains = self.span_grains.load(SeqCst) as u64;
        debug_assert!(n_grains as usize * grain_bytes <= b.own.len());
        // The whole page must lie in the record: a reader that raced a rewrite may ask for
        // more grains than the page at `grain` has (a compressed page's size read beside an
        // older map entry); it then reads the device and fails the checksum.
        let grains = out.len().div_ceil(grain_bytes) as u64;
        if grain < self.first_grain || grain + grains > self.first_grain + n_grains {
            return false;
        }
        b.copy_out((grain - self.first_grain) as u32, out, grain_bytes);
        true
    }
}

/// A record being filled by a stream (owned by the stream under its lock).
pub struct OpenRecord {
    pub buf: Arc<RecordBuf>,
    /// Its metadata page, grain 0 of the buffer.
    pub meta: RecordMeta,
    /// Data grains placed so far.
    pub data_grains: u32,
    /// Data pages this record may still take.
    pub pages_left: u32,
    pub entries_left: u32,
    /// Holds GC moves: a GC release must seal and persist it.
    pub gc_moves: bool,
}

impl OpenRecord {
    pub fn is_empty(&self) -> bool {
        self.meta.entries.is_empty()
    }
    pub fn push(&mut self, e: MetaEntry) {
        assert!(self.entries_left >= e.slots(), "metadata page overflow");
        self.entries_left -= e.slots();
        if matches!(e, MetaEntry::Data { .. }) {
            assert!(self.pages_left > 0, "record data overflow");
            self.pages_left -= 1;
        }
        self.meta.entries.push(e);
    }
    /// Grains the record occupies on the device (metadata page and data).
    pub fn used_grains(&self) -> u32 {
        1 + self.data_grains
    }
}

/// A record closed for writing, ready to go to the device.
pub struct SealedRecord {
    pub buf: Arc<RecordBuf>,
    pub used_grains: u32,
    /// Grains of zeros written after it (see `RecordMeta::pad_grains`).
    pub pad_grains: u32,
    /// Of a user stream (clients' writes, not GC moves or checkpoints).
    pub user: bool,
    /// A GC record sealed when full, to be held for a burst (`Log::set_gc_burst_bytes`): not
    /// marked sealed for the tracker until it leaves the stream's held list.
    pub for_burst: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::payload::PayloadPool;

    const GB: usize = 4096;

    fn payload(pool: &Arc<PayloadPool>, grains: usize, tag: u8) -> Arc<WriteBuffer> {
        let mut b = pool.get(grains * GB).expect("within the budget");
        for (i, g) in b.chunks_mut(GB).enumerate() {
            g.fill(tag.wrapping_add(i as u8));
        }
        Arc::new(b)
    }

    /// What `io_slices` would write, gathered; and the same read grain by grain.
    fn gathered(r: &RecordBytes, grains: u32) -> (Vec<u8>, Vec<u8>) {
        let written: Vec<u8> = r.io_slices(grains, GB).iter().flat_map(|s| s.iter().copied()).collect();
        let mut read = vec![0u8; grains as usize * GB];
        r.copy_out(0, &mut read, GB);
        (written, read)
    }

    #[test]
    fn held_runs_extend_interleave_with_copies_and_read_back_in_place() {
        let pool = PayloadPool::new(64 << 20, 0);
        let mut r = RecordBytes::new(AlignedBuf::zeroed(32 * GB), None);
        r.own[..GB].fill(0xEE); // the metadata page
        let a = payload(&pool, 16, 10);
        let b = payload(&pool, 16, 100);
        // Grains 1-4 held from a, 5 copied, 6-7 from b (as one run of two), 8 from a again.
        for g in 1..=4 {
            assert!(r.hold(g, 1, &a, (g as usize - 1) * GB, GB));
        }
        r.own[5 * GB..6 * GB].fill(0x55);
        assert!(r.hold(6, 1, &b, 0, GB));
        assert!(r.hold(7, 1, &b, GB, GB));
        assert!(r.hold(8, 1, &a, 9 * GB, GB));
        assert_eq!(r.held.len(), 3, "contiguous pieces of one payload extend one run");
        let (written, read) = gathered(&r, 9);
        assert_eq!(written, read);
        let expect = |g: usize| -> u8 {
            match g {
                0 => 0xEE,
                1..=4 => 10 + (g as u8 - 1),
                5 => 0x55,
                6 | 7 => 100 + (g as u8 - 6),
                _ => 10 + 9,
            }
        };
        for g in 0..9 {
            assert!(written[g * GB..(g + 1) * GB].iter().all(|&x| x == expect(g)), "grain {g}");
        }
        // A record cut short before its last held grain writes only what it uses.
        let (written, read) = gathered(&r, 7);
        assert_eq!((written.len(), &written), (7 * GB, &read));
    }

    #[test]
    fn misaligned_pieces_and_runs_past_the_limit_are_refused_for_copying() {
        let pool = PayloadPool::new(64 << 20, 0);
        let mut r = RecordBytes::new(AlignedBuf::zeroed(32 * GB), None);
        let a = payload(&pool, 16, 1);
        assert!(!r.hold(1, 1, &a, 512, GB), "not aligned for direct I/O");
        assert!(!r.hold(1, 1, &a, 16 * GB, GB), "past the payload's end");
        let many: Vec<_> = (0..MAX_HELD_RUNS + 1).map(|i| payload(&pool, 16, i as u8)).collect();
        for (i, p) in many.iter().enumerate() {
            let kept = r.hold(1 + i as u32, 1, p, 0, GB);
            assert_eq!(kept, i < MAX_HELD_RUNS, "run {i}");
        }
        drop(r);
        drop((a, many));
        assert_eq!(pool.outstanding_bytes(), 0, "a dropped record lets go of its payloads");
    }
}
