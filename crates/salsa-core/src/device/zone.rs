//! The zoned-storage model: what a host-managed SMR drive or a ZNS SSD exposes beyond a flat
//! array of bytes. A device that has zones returns a [`Zoned`] from [`super::Device::zones`].
//!
//! Owns: the zone vocabulary (kinds, conditions, the report) and the contract every zoned
//! implementation keeps, the same one Linux's zoned block layer documents:
//! - zones are equal-sized and cover the device from offset 0;
//! - conventional zones take random writes;
//! - a sequential-write-required zone takes a write only at its write pointer, never across its
//!   end; the write pointer advances by the bytes written; a full zone takes no writes;
//! - reading at or beyond a sequential zone's write pointer fails (as on drives that do not
//!   return a fill pattern), except in a finished zone, where the unwritten tail reads as zeros;
//! - reset empties a zone (write pointer to its start); finish makes it full.
//!
//! Zone management (reset, finish) is durable when it returns; how far a write pointer is
//! durable follows the data: after a crash it is at least where it was at the last sync.

use std::io;

/// Kind of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneKind {
    /// Takes writes anywhere (no write pointer).
    Conventional,
    /// Writes only at the write pointer.
    SequentialRequired,
}

/// Condition of a zone, as a zone report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneCondition {
    /// A conventional zone (no write pointer).
    NotWritePointer,
    Empty,
    /// Written in part.
    Open,
    Full,
}

/// One entry of a zone report. Offsets are bytes from the start of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    pub start_bytes: u64,
    pub len_bytes: u64,
    /// Absolute byte offset of the write pointer (`start_bytes` for conventional zones).
    pub write_pointer_bytes: u64,
    pub kind: ZoneKind,
    pub condition: ZoneCondition,
}

impl Zone {
    /// Bytes that can be read from the zone's start: all of a conventional or full zone, up to
    /// the write pointer otherwise.
    pub fn readable_bytes(&self) -> u64 {
        match self.condition {
            ZoneCondition::NotWritePointer | ZoneCondition::Full => self.len_bytes,
            _ => self.write_pointer_bytes - self.start_bytes,
        }
    }
}

/// Zone management of a zoned device.
pub trait Zoned: Send + Sync {
    /// Size of every zone in bytes.
    fn zone_bytes(&self) -> u64;
    /// Number of zones.
    fn zone_count(&self) -> u32;
    /// Reports `count` zones starting at zone `first` (fewer at the end of the device).
    fn report_zones(&self, first: u32, count: u32) -> io::Result<Vec<Zone>>;
    /// Moves a sequential zone's write pointer back to its start; its data is gone.
    fn reset_zone(&self, zone: u32) -> io::Result<()>;
    /// Makes a sequential zone full; it takes no more writes until reset.
    fn finish_zone(&self, zone: u32) -> io::Result<()>;
}

/// Reports one zone.
pub fn report_zone(z: &dyn Zoned, zone: u32) -> io::Result<Zone> {
    z.report_zones(zone, 1)?
        .into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("zone {zone} does not exist")))
}

/// Reads `buf.len()` bytes at `offset`, returning zeros for whatever lies at or beyond a
/// sequential zone's write pointer instead of failing. For structures the pool reads without
/// knowing how much was written (superblock, pool metadata); plain devices read normally.
pub fn read_written(dev: &dyn super::Device, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let Some(z) = dev.zones() else {
        return dev.read_at(buf, offset);
    };
    let zb = z.zone_bytes();
    let end = offset
        .checked_add(buf.len() as u64)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "read range overflows"))?;
    let mut at = offset;
    while at < end {
        let zone = report_zone(z, (at / zb) as u32)?;
        let zone_end = (zone.start_bytes + zone.len_bytes).min(end);
        let readable_end = (zone.start_bytes + zone.readable_bytes()).min(zone_end);
        let (lo, hi) = ((at - offset) as usize, (zone_end - offset) as usize);
        if readable_end > at {
            let mid = (readable_end - offset) as usize;
            dev.read_at(&mut buf[lo..mid], at)?;
            buf[mid..hi].fill(0);
        } else {
            buf[lo..hi].fill(0);
        }
        at = zone_end;
    }
    Ok(())
}
