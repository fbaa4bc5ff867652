//! A device served as it is, through the same front-ends as a volume (`salsa serve --raw`): the
//! baseline a file system or database on a device model is measured against without SALSA
//! between them.
//!
//! Reads and writes go to the same offsets on the device, through aligned bounce buffers; a
//! write of part of a device block reads, modifies and writes the block (serialised, so that
//! two partial writes of one block do not undo each other); flush syncs the device; trim does
//! nothing; write-zeroes writes zeros.

use super::BlockVolume;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::util::AlignedBuf;
use parking_lot::Mutex;
use std::sync::Arc;

/// Most bytes a raw volume zeroes per device write.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

/// A device served as it is.
pub struct RawVolume {
    name: String,
    dev: Arc<dyn Device>,
    /// Serialises read-modify-writes of partial blocks.
    rmw: Mutex<()>,
}

impl RawVolume {
    pub fn new(name: &str, dev: Arc<dyn Device>) -> RawVolume {
        RawVolume {
            name: name.to_string(),
            dev,
            rmw: Mutex::new(()),
        }
    }

    /// The device served.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    fn io_error(&self, op: &'static str, offset: u64, e: std::io::Error) -> Error {
        Error::device_io(self.dev.as_ref(), op, offset, e)
    }

    /// Refuses a range that does not lie inside the device.
    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.dev.size_bytes() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at {offset} lie beyond the end of {} ({} bytes)",
                self.name,
                self.dev.size_bytes()
            ))),
        }
    }

    /// The aligned span covering `[offset, offset + len)`.
    fn span(&self, offset: u64, len: u64) -> (u64, usize) {
        let a = self.dev.alignment_bytes().max(1) as u64;
        let start = offset / a * a;
        let end = (offset + len).div_ceil(a) * a;
        (start, (end - start) as usize)
    }
}

impl BlockVolume for RawVolume {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn page_bytes(&self) -> u32 {
        self.dev.alignment_bytes().max(512) as u32
    }
    fn description(&self) -> String {
        format!("{} served raw", self.dev.name())
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let (start, n) = self.span(offset, buf.len() as u64);
        let mut tmp = AlignedBuf::zeroed(n);
        self.dev.read_at(&mut tmp, start).map_err(|e| self.io_error("read", start, e))?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&tmp[at..at + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        let (start, n) = self.span(offset, data.len() as u64);
        let mut tmp = AlignedBuf::zeroed(n);
        let partial = start != offset || n != data.len();
        let _rmw = partial.then(|| self.rmw.lock());
        if partial {
            self.dev.read_at(&mut tmp, start).map_err(|e| self.io_error("read", start, e))?;
        }
        let at = (offset - start) as usize;
        tmp[at..at + data.len()].copy_from_slice(data);
        self.dev.write_at(&tmp, start).map_err(|e| self.io_error("write", start, e))
    }
    fn flush(&self) -> Result<()> {
        self.dev.sync().map_err(|e| self.io_error("sync", 0, e))
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        let mut at = offset;
        let end = offset + len;
        let zeros = vec![0u8; ZERO_CHUNK_BYTES.min(len) as usize];
        while at < end {
            let n = ZERO_CHUNK_BYTES.min(end - at);
            self.write(at, &zeros[..n as usize])?;
            at += n;
        }
        Ok(())
    }
    fn page_mapped(&self, _page: u64) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;

    /// Partial blocks keep their neighbours' bytes, zeroes zero, and a range past the end is
    /// refused with nothing written.
    #[test]
    fn a_raw_volume_reads_back_partial_writes_and_refuses_ranges_past_its_end() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 1 << 20));
        let v = RawVolume::new("raw", dev);
        v.write(0, &[7u8; 8192]).unwrap();
        v.write(100, b"hello").unwrap();
        let mut back = vec![0u8; 8192];
        v.read(0, &mut back).unwrap();
        assert_eq!(&back[100..105], b"hello");
        assert!(back[..100].iter().chain(&back[105..]).all(|b| *b == 7));
        v.write_zeroes(4096, 4096).unwrap();
        v.read(0, &mut back).unwrap();
        assert!(back[4096..].iter().all(|b| *b == 0));
        let end = v.size_bytes();
        assert!(matches!(v.write(end - 2, b"abc"), Err(Error::InvalidArgument(_))));
        assert!(matches!(v.read(u64::MAX - 1, &mut back), Err(Error::InvalidArgument(_))));
        assert!(matches!(v.write_zeroes(end, 1), Err(Error::InvalidArgument(_))));
        v.read(end - 8192, &mut back).unwrap();
        assert!(back.iter().all(|b| *b == 0), "nothing was written past the refusal");
    }
}
