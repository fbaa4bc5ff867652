//! Write payloads received straight into pooled, aligned buffers, which the records their pages
//! go to hold on to instead of copying the pages (zero-copy writes; see
//! [`crate::log::record::RecordBytes`]).
//!
//! Owns the budget of such buffers: at most `max_outstanding_bytes` are out at
//! once (being filled by a connection, or held by records not yet written). Past it,
//! [`PayloadPool::get`] says no and the caller writes through a buffer of its own, which the
//! record then copies: slower, never refused. Freed buffers are kept for reuse in size
//! classes (powers of two from [`MIN_PAYLOAD_BYTES`]), up to a bound of their own.

use crate::util::{AlignedBuf, BufferPool};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

/// Smallest payload worth a buffer of its own: below it a copy costs less than holding it.
pub const MIN_PAYLOAD_BYTES: usize = 64 << 10;
/// Largest payload received into a pooled buffer (larger writes are copied), which bounds what
/// one record can keep alive besides its own pages.
pub const MAX_PAYLOAD_BYTES: usize = 4 << 20;

/// The pool and budget of payload buffers of one engine.
pub struct PayloadPool {
    buffers: BufferPool,
    outstanding_bytes: AtomicUsize,
    max_outstanding_bytes: usize,
}

impl PayloadPool {
    /// A pool that hands out at most `max_outstanding_bytes` at once and keeps at most
    /// `max_free_bytes` of freed buffers.
    pub fn new(max_outstanding_bytes: usize, max_free_bytes: usize) -> Arc<PayloadPool> {
        Arc::new(PayloadPool {
            buffers: BufferPool::new(max_free_bytes),
            outstanding_bytes: AtomicUsize::new(0),
            max_outstanding_bytes,
        })
    }

    /// A buffer for a payload of `len` bytes, or `None` when `len` is outside
    /// [`MIN_PAYLOAD_BYTES`]..=[`MAX_PAYLOAD_BYTES`] or the budget is spent. Its bytes are
    /// unspecified: the caller fills all of them.
    pub fn get(self: &Arc<Self>, len: usize) -> Option<WriteBuffer> {
        if !(MIN_PAYLOAD_BYTES..=MAX_PAYLOAD_BYTES).contains(&len) {
            return None;
        }
        let class = len.next_power_of_two();
        self.outstanding_bytes
            .fetch_update(SeqCst, SeqCst, |n| (n + class <= self.max_outstanding_bytes).then_some(n + class))
            .ok()?;
        Some(WriteBuffer {
            buf: self.buffers.get(class),
            len,
            pool: self.clone(),
        })
    }

    /// Bytes handed out and not yet given back.
    pub fn outstanding_bytes(&self) -> usize {
        self.outstanding_bytes.load(SeqCst)
    }
}

/// A payload buffer from a `PayloadPool`: `len` bytes at the start of a buffer aligned for
/// direct I/O. Goes back to its pool when dropped, which for a written payload is when the last
/// record holding its pages is on the device.
pub struct WriteBuffer {
    buf: AlignedBuf,
    len: usize,
    pool: Arc<PayloadPool>,
}

impl Deref for WriteBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl DerefMut for WriteBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }
}

impl Drop for WriteBuffer {
    fn drop(&mut self) {
        let buf = std::mem::replace(&mut self.buf, AlignedBuf::empty());
        let class = buf.len();
        self.pool.buffers.put(buf);
        let before = self.pool.outstanding_bytes.fetch_sub(class, SeqCst);
        assert!(before >= class, "payload budget released twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_what_is_out_and_comes_back_with_the_buffers() {
        let pool = PayloadPool::new(4 << 20, 4 << 20);
        assert!(pool.get(MIN_PAYLOAD_BYTES - 1).is_none(), "too small to hold");
        assert!(pool.get(MAX_PAYLOAD_BYTES + 1).is_none(), "too large to hold");
        let a = pool.get(1 << 20).unwrap();
        let b = pool.get(1536 << 10).unwrap(); // a 2 MiB class
        assert_eq!((a.len(), b.len()), (1 << 20, 1536 << 10));
        assert_eq!(pool.outstanding_bytes(), 3 << 20);
        assert!(pool.get(2 << 20).is_none(), "past the budget");
        let c = pool.get(1 << 20).unwrap();
        assert!(pool.get(MIN_PAYLOAD_BYTES).is_none());
        drop((a, c));
        assert_eq!(pool.outstanding_bytes(), 2 << 20);
        assert!(pool.get(2 << 20).is_some());
        drop(b);
        assert_eq!(pool.outstanding_bytes(), 0);
    }
}
