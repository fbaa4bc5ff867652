//! A device with a storage type declared for it: a regular file or block device cannot tell
//! the pool whether it is a disk or an SSD, so the user says so at format time (and the
//! superblock records it, so that every later open sees the same type).
//!
//! Owns: nothing but the declared type; everything else is the inner device's. A zoned
//! device's zones keep their own types (conventional zones are always the conventional type).

use super::{Device, StorageType};
use std::io;
use std::sync::Arc;

/// `inner`, reporting `storage_type` as its type.
pub struct Declared {
    inner: Arc<dyn Device>,
    storage_type: StorageType,
}

impl Declared {
    /// `inner` as a device of `storage_type` (`inner` itself when it already is one).
    pub fn wrap(inner: Arc<dyn Device>, storage_type: StorageType) -> Arc<dyn Device> {
        if inner.storage_type() == storage_type {
            return inner;
        }
        Arc::new(Declared { inner, storage_type })
    }
}

impl Device for Declared {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn storage_type(&self) -> StorageType {
        self.storage_type
    }
    fn alignment_bytes(&self) -> usize {
        self.inner.alignment_bytes()
    }
    fn preferred_alignment_bytes(&self) -> u64 {
        self.inner.preferred_alignment_bytes()
    }
    fn zones(&self) -> Option<&dyn super::Zoned> {
        self.inner.zones()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn write_vectored_at(&self, bufs: &[io::IoSlice<'_>], offset: u64) -> io::Result<()> {
        self.inner.write_vectored_at(bufs, offset)
    }
    fn read_vectored_at(&self, bufs: &mut [io::IoSliceMut<'_>], offset: u64) -> io::Result<()> {
        self.inner.read_vectored_at(bufs, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn discard_reallocates(&self) -> bool {
        self.inner.discard_reallocates()
    }
    fn has_hole(&self, offset: u64, len: u64) -> bool {
        self.inner.has_hole(offset, len)
    }
    fn counters(&self) -> Vec<(String, u64)> {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    #[test]
    fn a_declared_type_replaces_the_devices_own_and_nothing_else() {
        let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 1 << 20));
        assert_eq!(mem.storage_type(), StorageType::Flash);
        let same = Declared::wrap(mem.clone(), StorageType::Flash);
        assert!(Arc::ptr_eq(&same, &mem), "no wrapper when the type is already right");
        let disk = Declared::wrap(mem.clone(), StorageType::Hdd);
        assert_eq!(disk.storage_type(), StorageType::Hdd);
        assert_eq!(disk.size_bytes(), 1 << 20);
        disk.write_at(&[7u8; 512], 4096).unwrap();
        let mut b = [0u8; 512];
        mem.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [7u8; 512]);
    }
}
