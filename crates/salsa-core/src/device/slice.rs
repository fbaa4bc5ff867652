//! A device that is a byte range of another (a partition). Tests build several members on one
//! crash device this way, so that a single crash point cuts across all of them.

use super::{check_range, Device};
use std::io;
use std::sync::Arc;

/// Bytes `[offset, offset + size_bytes)` of `inner`.
pub struct SliceDevice {
    name: String,
    inner: Arc<dyn Device>,
    offset: u64,
    size_bytes: u64,
}

impl SliceDevice {
    /// Fails when the range does not lie inside `inner` or is not aligned for it.
    pub fn new(name: impl Into<String>, inner: Arc<dyn Device>, offset: u64, size_bytes: u64) -> io::Result<SliceDevice> {
        check_range(inner.size_bytes(), offset, size_bytes as usize)?;
        let align = inner.alignment_bytes() as u64;
        if !offset.is_multiple_of(align) || !size_bytes.is_multiple_of(align) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "slice not aligned to its device"));
        }
        if inner.zones().is_some() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a zoned device cannot be sliced"));
        }
        Ok(SliceDevice {
            name: name.into(),
            inner,
            offset,
            size_bytes,
        })
    }
}

impl Device for SliceDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn storage_type(&self) -> super::StorageType {
        self.inner.storage_type()
    }
    fn alignment_bytes(&self) -> usize {
        self.inner.alignment_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        self.inner.read_at(buf, self.offset + offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, buf.len())?;
        self.inner.write_at(buf, self.offset + offset)
    }
    fn write_vectored_at(&self, bufs: &[io::IoSlice<'_>], offset: u64) -> io::Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        check_range(self.size_bytes, offset, len)?;
        self.inner.write_vectored_at(bufs, self.offset + offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size_bytes, offset, usize::try_from(len).map_err(io::Error::other)?)?;
        self.inner.discard(self.offset + offset, len)
    }
    fn discard_reallocates(&self) -> bool {
        self.inner.discard_reallocates()
    }
    fn has_hole(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size_bytes) && self.inner.has_hole(self.offset + offset, len)
    }
}
