//! Reading a segment's record chain back from the device. Used by the GC (to find what a victim
//! holds, with the sequence numbers to carry over) and by crash recovery.
//!
//! A chain starts with the first record at grain 0, whose metadata page also names the
//! segment's incarnation, owner, stream and age; each record's metadata page says how many data
//! pages follow (and how many grains of padding after them), and the next record starts right
//! after them. The walk stops at the first page that is not a valid metadata page of this
//! segment's current incarnation: left-overs of an earlier use of the segment, or a torn write.

use crate::array::Array;
use crate::error::Result;
use crate::format::{RecordMeta, SegmentHeader};

use crate::util::{AlignedBuf, BufferPool};

/// Most bytes read from a segment at once.
const WINDOW_BYTES_MAX: usize = 16 << 20;

/// What a chain walk needs to know about the pool.
pub struct ScanGeometry {
    pub pool_id: u128,
    pub grain_bytes: usize,
    pub grains_per_segment: u32,
}

/// Walks the chain of `segment`, calling `visit(header, meta, data)` for every intact record;
/// `data` holds the record's data pages back to back. Returns the header, or `None` when the
/// segment holds no valid header (never used, or not SALSA's). `sealed`: the caller knows the
/// segment holds records (a GC victim), so the walk reads it whole at once instead of
/// probing its first page alone.
pub fn walk_segment(
    array: &dyn Array,
    buffers: &BufferPool,
    geo: &ScanGeometry,
    segment: u32,
    sealed: bool,
    mut visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8]),
) -> Result<Option<SegmentHeader>> {
    let gb = geo.grain_bytes;
    let gps = geo.grains_per_segment as usize;
    let base = segment as u64 * gps as u64;
    // Only what was written can be read (a sequential zone fails reads past its write pointer).
    let readable = (array.readable_grains(segment) as usize).min(gps);
    if readable == 0 {
        return Ok(None);
    }
    let gps = readable;
    let window_grains = (WINDOW_BYTES_MAX / gb).min(gps);
    let mut w = Window {
        // From the pool, like every buffer that goes back to it: a fresh window per walk would
        // fill the pool with windows and leave no room for the record buffers writes recycle.
        buf: buffers.get(window_grains * gb),
        start: 0,
        len: 0,
        grains: window_grains,
    };
    // The first metadata page alone first, unless the caller knows the segment holds records
    // (a GC victim): most segments of a young pool were never written. The window then
    // holds what it read and the walk goes on from it.
    let first_read = if sealed { window_grains } else { 1 };
    array.read(base, &mut w.buf[..first_read * gb])?;
    let header = match RecordMeta::decode(&w.buf[..gb]) {
        Ok(m) if m.pool_id == geo.pool_id && m.segment == segment && m.start_grain == 0 => m.segment_header(),
        _ => {
            buffers.put(w.buf);
            return Ok(None);
        }
    };
    w.start = 0;
    w.len = first_read;
    let mut pos = 0usize;
    let mut last_record = 0u64;
    while w.ensure(array, base, gps, gb, pos, 1)? {
        let off = (pos - w.start) * gb;
        let window = &w.buf;
        let Ok(meta) = RecordMeta::decode(&window[off..off + gb]) else {
            break;
        };
        if meta.pool_id != geo.pool_id
            || meta.segment != segment
            || meta.incarnation != header.incarnation
            || meta.start_grain as usize != pos
            || meta.record_id <= last_record
        {
            break;
        }
        let Some(span) = meta.span_grains() else { break };
        let data_grains = meta.data_pages() * meta.page_grains as usize;
        if !w.ensure(array, base, gps, gb, pos, 1 + data_grains)? {
            break;
        }
        let off = (pos - w.start) * gb;
        visit(&header, &meta, &w.buf[off + gb..off + gb + data_grains * gb]);
        last_record = meta.record_id;
        pos += span;
    }
    buffers.put(w.buf);
    Ok(Some(header))
}

/// A sliding read window over one segment.
struct Window {
    buf: AlignedBuf,
    /// First grain (in the segment) held.
    start: usize,
    /// Grains held.
    len: usize,
    /// Capacity in grains.
    grains: usize,
}

impl Window {
    /// Makes grains `[from, from + n)` of the segment available, re-reading from `from` when
    /// needed. False when the range leaves the segment or can never fit.
    fn ensure(&mut self, array: &dyn Array, base: u64, gps: usize, gb: usize, from: usize, n: usize) -> Result<bool> {
        if from + n > gps || n > self.grains {
            return Ok(false);
        }
        if from >= self.start && from + n <= self.start + self.len {
            return Ok(true);
        }
        let len = self.grains.min(gps - from);
        array.read(base + from as u64, &mut self.buf[..len * gb])?;
        self.start = from;
        self.len = len;
        Ok(true)
    }
}
