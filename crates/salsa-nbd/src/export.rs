//! What the server serves: an [`Export`] is anything with byte-addressed reads, writes, flush,
//! trim and write-zeroes: a SALSA volume, or, for baselines, a device served as it is
//! ([`RawExport`]: `salsa serve --raw`, so that a file system on a device model can be measured
//! without SALSA between them, through the same server and clients).
//!
//! Invariants: offsets and lengths reaching an export were checked against its size by the
//! protocol layer; an export's errors are `salsa_core` errors, mapped to NBD errors by the
//! server.

use parking_lot::Mutex;
use salsa_core::{AlignedBuf, Device, PagedPayload, Volume, WriteBuffer, WrittenNow};
use std::sync::Arc;

/// One NBD export's data path.
pub trait Export: Send + Sync {
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    /// The unit the export maps in (block status reports in it).
    fn page_bytes(&self) -> u32;
    /// The preferred block size it advertises: the smallest write without read-modify-write.
    fn preferred_block_bytes(&self) -> u32 {
        self.page_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> salsa_core::Result<()>;
    /// [`Export::read`] if it needs no device read: `Ok(true)` with `buf` filled, `Ok(false)`
    /// (nothing read or counted) when the data is not all in memory.
    fn read_from_memory(&self, _offset: u64, _buf: &mut [u8]) -> salsa_core::Result<bool> {
        Ok(false)
    }
    fn write(&self, offset: u64, data: &[u8]) -> salsa_core::Result<()>;
    /// A buffer to receive a write's payload into, for [`Export::write_payload`]; `None` when
    /// the export copies writes.
    fn payload_buffer(&self, _len: usize) -> Option<WriteBuffer> {
        None
    }
    fn write_payload(&self, offset: u64, payload: WriteBuffer) -> salsa_core::Result<()> {
        self.write(offset, &payload)
    }
    /// Write-buffer pages to receive a write's payload into, for [`Export::write_paged`];
    /// `None` when the export has no write buffer or the write is not whole pages it takes.
    fn paged_payload(&self, _offset: u64, _len: usize) -> Option<PagedPayload> {
        None
    }
    fn write_paged(&self, payload: PagedPayload) -> salsa_core::Result<()> {
        self.write(payload.offset(), &payload.to_vec())
    }
    /// [`Export::write_paged`] if it needs no wait (no device write, no wait for room):
    /// `Written` once written (with the instant before which it is not to be acknowledged,
    /// while the pool paces writes), `NotNow(payload)` with nothing written otherwise
    /// (`salsa_core::Volume::write_paged_now`).
    fn write_paged_now(&self, payload: PagedPayload) -> salsa_core::Result<WrittenNow> {
        Ok(WrittenNow::NotNow(payload))
    }
    fn flush(&self) -> salsa_core::Result<()>;
    /// Called after a write is answered when no other request of the client is under way:
    /// the export may start writing what the next flush would (see
    /// `salsa_core::Volume::write_behind`).
    fn write_behind(&self) -> salsa_core::Result<()> {
        Ok(())
    }
    /// Whether the writers have lately flushed after every write
    /// (`salsa_core::Volume::writers_flush_every_write`).
    fn writers_flush_every_write(&self) -> bool {
        false
    }
    fn trim(&self, offset: u64, len: u64) -> salsa_core::Result<()>;
    /// Makes the range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> salsa_core::Result<()>;
    /// Whether page `page` (of [`Export::page_bytes`]) holds data, for block status.
    fn page_mapped(&self, page: u64) -> bool;
    /// A one-line description for the export list.
    fn description(&self) -> String;
}

impl Export for Volume {
    fn name(&self) -> &str {
        Volume::name(self)
    }
    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }
    fn page_bytes(&self) -> u32 {
        Volume::page_bytes(self)
    }
    fn preferred_block_bytes(&self) -> u32 {
        Volume::preferred_write_bytes(self)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> salsa_core::Result<()> {
        Volume::read(self, offset, buf)
    }
    fn read_from_memory(&self, offset: u64, buf: &mut [u8]) -> salsa_core::Result<bool> {
        Volume::read_from_memory(self, offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> salsa_core::Result<()> {
        Volume::write(self, offset, data)
    }
    fn payload_buffer(&self, len: usize) -> Option<WriteBuffer> {
        Volume::payload_buffer(self, len)
    }
    fn write_payload(&self, offset: u64, payload: WriteBuffer) -> salsa_core::Result<()> {
        Volume::write_payload(self, offset, payload)
    }
    fn paged_payload(&self, offset: u64, len: usize) -> Option<PagedPayload> {
        Volume::paged_payload(self, offset, len)
    }
    fn write_paged(&self, payload: PagedPayload) -> salsa_core::Result<()> {
        Volume::write_paged(self, payload)
    }
    fn write_paged_now(&self, payload: PagedPayload) -> salsa_core::Result<WrittenNow> {
        Volume::write_paged_now(self, payload)
    }
    fn flush(&self) -> salsa_core::Result<()> {
        Volume::flush(self)
    }
    fn write_behind(&self) -> salsa_core::Result<()> {
        Volume::write_behind(self)
    }
    fn writers_flush_every_write(&self) -> bool {
        Volume::writers_flush_every_write(self)
    }
    fn trim(&self, offset: u64, len: u64) -> salsa_core::Result<()> {
        Volume::trim(self, offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> salsa_core::Result<()> {
        Volume::write_zeroes(self, offset, len)
    }
    fn page_mapped(&self, page: u64) -> bool {
        // Mapped in the log or written into the write buffer.
        self.is_mapped(page * Volume::page_bytes(self) as u64)
    }
    fn description(&self) -> String {
        format!("SALSA {} volume ({} KiB pages)", self.controller(), self.page_bytes() / 1024)
    }
}

/// Most bytes a raw export zeroes per device write.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

/// A device served as it is: reads and writes go to the same offsets on the device (through
/// aligned bounce buffers, partial blocks read-modify-write), flush syncs it, trim does
/// nothing, write-zeroes writes zeros.
pub struct RawExport {
    name: String,
    dev: Arc<dyn Device>,
    /// Serialises read-modify-writes of partial blocks.
    rmw: Mutex<()>,
}

impl RawExport {
    pub fn new(name: &str, dev: Arc<dyn Device>) -> RawExport {
        RawExport {
            name: name.to_string(),
            dev,
            rmw: Mutex::new(()),
        }
    }

    /// The device served.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    fn io_error(&self, op: &'static str, offset: u64, e: std::io::Error) -> salsa_core::Error {
        salsa_core::Error::device_io(self.dev.as_ref(), op, offset, e)
    }

    /// The aligned span covering `[offset, offset + len)`.
    fn span(&self, offset: u64, len: u64) -> (u64, usize) {
        let a = self.dev.alignment_bytes().max(1) as u64;
        let start = offset / a * a;
        let end = (offset + len).div_ceil(a) * a;
        (start, (end - start) as usize)
    }
}

impl Export for RawExport {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn page_bytes(&self) -> u32 {
        self.dev.alignment_bytes().max(512) as u32
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> salsa_core::Result<()> {
        let (start, n) = self.span(offset, buf.len() as u64);
        let mut tmp = AlignedBuf::zeroed(n);
        self.dev.read_at(&mut tmp, start).map_err(|e| self.io_error("read", start, e))?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&tmp[at..at + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> salsa_core::Result<()> {
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
    fn flush(&self) -> salsa_core::Result<()> {
        self.dev.sync().map_err(|e| self.io_error("sync", 0, e))
    }
    fn trim(&self, _offset: u64, _len: u64) -> salsa_core::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> salsa_core::Result<()> {
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
    fn description(&self) -> String {
        format!("{} served raw", self.dev.name())
    }
}
