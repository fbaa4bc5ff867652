//! Records: the unit of every device write. A record is one metadata page followed by the data
//! pages it describes; the first record of a segment starts at its grain 0.
//! While a record is open its bytes live in a [`RecordBuf`] that readers can copy from; it is
//! written to the device in one sequential write when full or on flush.

use crate::format::{MetaEntry, RecordMeta};
use crate::util::{AlignedBuf, BufferPool};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;

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
    pub bytes: RwLock<AlignedBuf>,
    /// Where the buffer goes back when the last reference is dropped.
    pub recycle: Arc<BufferPool>,
}

impl Drop for RecordBuf {
    fn drop(&mut self) {
        let buf = std::mem::replace(self.bytes.get_mut(), AlignedBuf::empty());
        self.recycle.put(buf);
    }
}

impl RecordBuf {
    /// Copies `out.len()` bytes of physical grain `grain` from the buffer, if it holds them.
    pub fn read(&self, grain: u64, grain_bytes: usize, out: &mut [u8]) -> bool {
        let b = self.bytes.read();
        let n_grains = self.span_grains.load(SeqCst) as u64;
        debug_assert!(n_grains as usize * grain_bytes <= b.len());
        if grain < self.first_grain || grain >= self.first_grain + n_grains {
            return false;
        }
        let off = ((grain - self.first_grain) as usize) * grain_bytes;
        out.copy_from_slice(&b[off..off + out.len()]);
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
        assert!(self.entries_left > 0, "metadata page overflow");
        self.entries_left -= 1;
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
}
