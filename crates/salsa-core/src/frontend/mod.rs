//! The front-end-neutral volume interface: what every front-end serves a volume through. The
//! NBD server, the C API (`libsalsa`), the Python package and any later front-end (ublk, a
//! RocksDB file-system plugin) each keep only their protocol and reach a volume through
//! [`BlockVolume`]: reads, writes with their durability class (durable at the next flush, or
//! before returning: FUA), flush, trim, zeroes, block status, share batches and appends.
//!
//! Owns: the interface, its implementation for a pool's [`Volume`], and [`RawVolume`], a device
//! served as it is (the baseline front-ends measure SALSA against, through the same code).
//!
//! Invariants: offsets and lengths are the caller's; every implementation checks them against
//! its size and refuses what does not fit with `InvalidArgument`, never panics. A write that
//! returned is read back by every later read; it is durable after the next [`BlockVolume::flush`]
//! that returns, or when it returns if written with a `_fua` method.

mod raw;

pub use raw::RawVolume;

use crate::dirty::PagedPayload;
use crate::error::{Error, Result};
use crate::log::payload::WriteBuffer;
use crate::pool::{ShareRange, Volume, WrittenNow};

/// One volume as a front-end serves it.
pub trait BlockVolume: Send + Sync {
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    /// The unit the volume maps in (block status reports in it).
    fn page_bytes(&self) -> u32;
    /// The smallest write without read-modify-write, which a front-end advertises as its
    /// preferred block size.
    fn preferred_block_bytes(&self) -> u32 {
        self.page_bytes()
    }
    /// A one-line description for export lists.
    fn description(&self) -> String;

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// [`BlockVolume::read`] if it needs no device read: `Ok(true)` with `buf` filled,
    /// `Ok(false)` (nothing read or counted) when the data is not all in memory.
    fn read_from_memory(&self, _offset: u64, _buf: &mut [u8]) -> Result<bool> {
        Ok(false)
    }

    /// Writes `data` at `offset`, durable at the next flush.
    fn write(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Writes `data` at `offset`, durable when it returns (FUA).
    fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }
    /// A buffer to receive a write's payload into, for [`BlockVolume::write_payload`] (a
    /// front-end that reads payloads off a socket spares a copy); `None` when the volume
    /// copies writes.
    fn payload_buffer(&self, _len: usize) -> Option<WriteBuffer> {
        None
    }
    fn write_payload(&self, offset: u64, payload: WriteBuffer) -> Result<()> {
        self.write(offset, &payload)
    }
    /// Write-buffer pages to receive a write's payload into, for [`BlockVolume::write_paged`];
    /// `None` when the volume has no write buffer or the write is not whole pages it takes.
    fn paged_payload(&self, _offset: u64, _len: usize) -> Option<PagedPayload> {
        None
    }
    fn write_paged(&self, payload: PagedPayload) -> Result<()> {
        self.write(payload.offset(), &payload.to_vec())
    }
    /// [`BlockVolume::write_paged`] if it needs no wait (no device write, no wait for room):
    /// `Written` once written (with the instant before which it is not to be acknowledged,
    /// while the pool paces writes), `NotNow(payload)` with nothing written otherwise.
    fn write_paged_now(&self, payload: PagedPayload) -> Result<WrittenNow> {
        Ok(WrittenNow::NotNow(payload))
    }

    /// Makes every write that returned before it durable.
    fn flush(&self) -> Result<()>;
    /// A hint that the client is idle after a write: the volume may start writing what the
    /// next flush would.
    fn write_behind(&self) -> Result<()> {
        Ok(())
    }
    /// Whether the writers have lately flushed after every write.
    fn writers_flush_every_write(&self) -> bool {
        false
    }

    /// Discards whole pages of the range (advisory; they may read as zeros after).
    fn trim(&self, offset: u64, len: u64) -> Result<()>;
    /// Makes the range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()>;
    /// Whether page `page` (of [`BlockVolume::page_bytes`]) holds data, for block status.
    fn page_mapped(&self, page: u64) -> bool;

    /// Remaps a batch of ranges without copying (SHARE), atomically across crashes, durable
    /// at the next flush; see [`Volume::share`]. Refused by volumes that do not remap.
    fn share(&self, _ranges: &[ShareRange]) -> Result<()> {
        Err(Error::InvalidArgument(format!("volume {:?} does not share ranges", self.name())))
    }
    /// [`BlockVolume::share`], durable when it returns.
    fn share_fua(&self, ranges: &[ShareRange]) -> Result<()> {
        self.share(ranges)?;
        self.flush()
    }

    /// An append-only volume's segment size; `None` for any other.
    fn segment_bytes(&self) -> Option<u64> {
        None
    }
    /// An append-only volume: bytes written into `segment` from its start.
    fn write_point(&self, _segment: u64) -> Result<u64> {
        Err(Error::InvalidArgument(format!("volume {:?} is not append-only", self.name())))
    }
    /// An append-only volume: writes `data` at `segment`'s write point and returns the
    /// volume offset it went to.
    fn append(&self, _segment: u64, _data: &[u8]) -> Result<u64> {
        Err(Error::InvalidArgument(format!("volume {:?} is not append-only", self.name())))
    }
}

impl BlockVolume for Volume {
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
    fn description(&self) -> String {
        format!("SALSA {} volume ({} KiB pages)", self.controller(), self.page_bytes() / 1024)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        Volume::read(self, offset, buf)
    }
    fn read_from_memory(&self, offset: u64, buf: &mut [u8]) -> Result<bool> {
        Volume::read_from_memory(self, offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        Volume::write(self, offset, data)
    }
    fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        Volume::write_fua(self, offset, data)
    }
    fn payload_buffer(&self, len: usize) -> Option<WriteBuffer> {
        Volume::payload_buffer(self, len)
    }
    fn write_payload(&self, offset: u64, payload: WriteBuffer) -> Result<()> {
        Volume::write_payload(self, offset, payload)
    }
    fn paged_payload(&self, offset: u64, len: usize) -> Option<PagedPayload> {
        Volume::paged_payload(self, offset, len)
    }
    fn write_paged(&self, payload: PagedPayload) -> Result<()> {
        Volume::write_paged(self, payload)
    }
    fn write_paged_now(&self, payload: PagedPayload) -> Result<WrittenNow> {
        Volume::write_paged_now(self, payload)
    }
    fn flush(&self) -> Result<()> {
        Volume::flush(self)
    }
    fn write_behind(&self) -> Result<()> {
        Volume::write_behind(self)
    }
    fn writers_flush_every_write(&self) -> bool {
        Volume::writers_flush_every_write(self)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        Volume::trim(self, offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        Volume::write_zeroes(self, offset, len)
    }
    fn page_mapped(&self, page: u64) -> bool {
        // Mapped in the log or written into the write buffer.
        self.is_mapped(page.saturating_mul(Volume::page_bytes(self) as u64))
    }
    fn share(&self, ranges: &[ShareRange]) -> Result<()> {
        Volume::share(self, ranges)
    }
    fn share_fua(&self, ranges: &[ShareRange]) -> Result<()> {
        Volume::share_fua(self, ranges)
    }
    fn segment_bytes(&self) -> Option<u64> {
        Volume::segment_bytes(self)
    }
    fn write_point(&self, segment: u64) -> Result<u64> {
        Volume::write_point(self, segment)
    }
    fn append(&self, segment: u64, data: &[u8]) -> Result<u64> {
        Volume::append(self, segment, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device, MemoryDevice};
    use crate::pool::{OpenOptions, Pool, PoolConfig};
    use std::sync::Arc;

    /// A volume served through the interface alone: writes (FUA or not) read back, block
    /// status follows them, a share batch remaps, zeroes zero, and what the volume does not
    /// do is refused with a reason, never a panic.
    #[test]
    fn a_pool_volume_serves_every_operation_through_the_interface() {
        let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("m", 64 << 20));
        let cfg = PoolConfig {
            segment_bytes: Some(1 << 20),
            ..PoolConfig::default()
        };
        let pool = Pool::create(vec![dev.clone()], &cfg, &OpenOptions::default()).unwrap();
        let vol: Box<dyn BlockVolume> = Box::new(pool.create_volume("v", 8 << 20, 4096).unwrap());
        assert_eq!((vol.name(), vol.size_bytes(), vol.page_bytes()), ("v", 8 << 20, 4096));
        assert!(!vol.page_mapped(3));
        vol.write(3 * 4096, &[3u8; 4096]).unwrap();
        vol.write_fua(5 * 4096, &[5u8; 4096]).unwrap();
        assert!(vol.page_mapped(3) && vol.page_mapped(5) && !vol.page_mapped(4));
        vol.share(&[ShareRange {
            src_offset: 3 * 4096,
            dst_offset: 9 * 4096,
            len_bytes: 4096,
        }])
        .unwrap();
        let mut page = vec![0u8; 4096];
        vol.read(9 * 4096, &mut page).unwrap();
        assert!(page.iter().all(|b| *b == 3));
        vol.write_zeroes(3 * 4096, 4096).unwrap();
        vol.read(3 * 4096, &mut page).unwrap();
        assert!(page.iter().all(|b| *b == 0));
        assert_eq!(vol.segment_bytes(), None);
        assert!(matches!(vol.append(0, &[0u8; 4096]), Err(Error::InvalidArgument(_))));
        assert!(matches!(vol.write_point(0), Err(Error::InvalidArgument(_))));
        assert!(vol.write(8 << 20, &[0u8; 4096]).is_err(), "a write past the end");
        vol.flush().unwrap();
        drop(vol);
        pool.close().unwrap();
        // A device served raw shares nothing.
        let raw: Box<dyn BlockVolume> = Box::new(RawVolume::new("raw", dev));
        let refused = raw.share(&[ShareRange {
            src_offset: 0,
            dst_offset: 4096,
            len_bytes: 4096,
        }]);
        assert!(matches!(refused, Err(Error::InvalidArgument(_))), "{refused:?}");
    }
}
