//! A device held in memory. Used by tests and benchmarks that must not touch a disk.
//! Every write is durable at once (there is no volatile cache to lose).

use super::{check_range, Device};
use parking_lot::RwLock;
use std::io;

/// Memory-backed device.
pub struct MemoryDevice {
    name: String,
    data: RwLock<Vec<u8>>,
}

impl MemoryDevice {
    pub fn new(name: impl Into<String>, size_bytes: u64) -> MemoryDevice {
        MemoryDevice {
            name: name.into(),
            data: RwLock::new(vec![0; size_bytes as usize]),
        }
    }
}

impl Device for MemoryDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.data.read().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let data = self.data.read();
        check_range(data.len() as u64, offset, buf.len())?;
        let start = offset as usize;
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut data = self.data.write();
        check_range(data.len() as u64, offset, buf.len())?;
        let start = offset as usize;
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}
