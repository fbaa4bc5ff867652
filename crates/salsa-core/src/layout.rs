//! Where the pool's structures sit on each device: the superblock, the two pool-metadata slots
//! and the first segment. Chosen once at format time and stored in every superblock, so that
//! opening never depends on recomputing it.
//!
//! Owns the rules that keep the layout legal on every kind of device:
//! - flat devices: superblock at 0, the slots at fixed offsets inside the first MiB, segments
//!   from 1 MiB (or from the device's preferred alignment, when it declares a larger one, so a
//!   drive-managed SMR band or an erase block is never split between two segments);
//! - zoned devices: one segment per zone, segments start on a zone boundary. The superblock and
//!   the slots go to conventional zones where the device has at least 1 MiB of them at its
//!   start; otherwise the superblock has zone 0 to itself (written once, at format) and the two
//!   slots alternate between zones 1 and 2, each reset before it is rewritten.

use crate::device::{zone::report_zone, Device, ZoneKind};
use crate::error::{Error, Result};
use crate::format::{DeviceLayout, DEVICE_RESERVED_BYTES, POOL_META_SLOT_BYTES, POOL_META_SLOT_OFFSETS, SUPERBLOCK_BYTES};

impl DeviceLayout {
    /// Plans the layout of `dev` for segments of `segment_bytes`; also returns how many segments
    /// fit. On a zoned device `segment_bytes` must equal the zone size.
    pub fn plan(dev: &dyn Device, segment_bytes: u64) -> Result<(DeviceLayout, u64)> {
        let layout = match dev.zones() {
            None => {
                let align = dev.preferred_alignment_bytes().max(1);
                DeviceLayout {
                    segments_offset_bytes: DEVICE_RESERVED_BYTES.next_multiple_of(align),
                    meta_slot_offsets: POOL_META_SLOT_OFFSETS,
                }
            }
            Some(z) => {
                let zone_bytes = z.zone_bytes();
                if zone_bytes != segment_bytes {
                    return Err(Error::InvalidConfig(format!(
                        "{}: segments align to zones, so the segment size must be the zone size {zone_bytes} (not {segment_bytes})",
                        dev.name()
                    )));
                }
                let mut conventional = 0u64;
                for zone in z.report_zones(0, z.zone_count()).map_err(|e| io_err(dev, e))? {
                    if zone.kind != ZoneKind::Conventional {
                        break;
                    }
                    conventional += zone.len_bytes;
                }
                if conventional >= DEVICE_RESERVED_BYTES {
                    DeviceLayout {
                        segments_offset_bytes: DEVICE_RESERVED_BYTES.next_multiple_of(zone_bytes),
                        meta_slot_offsets: POOL_META_SLOT_OFFSETS,
                    }
                } else {
                    if zone_bytes < POOL_META_SLOT_BYTES as u64 {
                        return Err(Error::InvalidConfig(format!(
                            "{}: zones of {zone_bytes} bytes are too small for the pool metadata",
                            dev.name()
                        )));
                    }
                    DeviceLayout {
                        segments_offset_bytes: 3 * zone_bytes,
                        meta_slot_offsets: [zone_bytes, 2 * zone_bytes],
                    }
                }
            }
        };
        let count = dev.size_bytes().saturating_sub(layout.segments_offset_bytes) / segment_bytes;
        Ok((layout, count))
    }

    /// Checks a layout read from a superblock against the device it came from.
    pub fn validate(&self, device_size_bytes: u64, segment_bytes: u64, segment_count: u32) -> std::result::Result<(), String> {
        for slot in self.meta_slot_offsets {
            let end = slot.checked_add(POOL_META_SLOT_BYTES as u64);
            if slot < SUPERBLOCK_BYTES as u64 || end.is_none_or(|e| e > self.segments_offset_bytes) {
                return Err(format!("pool-metadata slot at {slot} overlaps the superblock or the segments"));
            }
        }
        let (a, b) = (self.meta_slot_offsets[0], self.meta_slot_offsets[1]);
        if a.abs_diff(b) < POOL_META_SLOT_BYTES as u64 {
            return Err("the two pool-metadata slots overlap".into());
        }
        let end = (segment_count as u64)
            .checked_mul(segment_bytes)
            .and_then(|n| n.checked_add(self.segments_offset_bytes));
        if end.is_none_or(|e| e > device_size_bytes) {
            return Err("segments exceed the device size".into());
        }
        Ok(())
    }
}

/// Whether `offset` of `dev` lies in a sequential-write-required zone.
pub fn in_sequential_zone(dev: &dyn Device, offset: u64) -> Result<Option<u32>> {
    let Some(z) = dev.zones() else { return Ok(None) };
    let zone = (offset / z.zone_bytes()) as u32;
    let info = report_zone(z, zone).map_err(|e| io_err(dev, e))?;
    Ok((info.kind == ZoneKind::SequentialRequired).then_some(zone))
}

fn io_err(dev: &dyn Device, source: std::io::Error) -> Error {
    Error::Io {
        device: dev.name().to_string(),
        op: "report zones",
        offset: 0,
        source,
    }
}
