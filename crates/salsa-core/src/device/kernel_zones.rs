//! The zones of a real Linux zoned block device (host-managed SMR, ZNS), driven through the
//! kernel's zone ioctls (`linux/blkzoned.h`): `BLKGETZONESZ` and `BLKGETNRZONES` to learn the
//! geometry, `BLKREPORTZONE` for zone reports, `BLKRESETZONE` and `BLKFINISHZONE` for zone
//! management. A [`super::FileDevice`] opened on a zoned block device carries a
//! [`KernelZones`], so the pool drives such a drive with the same code as the emulator.
//!
//! Owns: translating the kernel's zone reports (512-byte sectors) into the [`Zone`] model, and
//! refusing what the pool cannot drive with a message that says why: zones of unequal size
//! (other than a smaller last zone, which is left unused), a zone capacity below the zone
//! size (some ZNS drives), offline zones. Every field the kernel (that is, the drive) reports
//! is checked before use; nothing it says can make this code panic or index out of range.

use super::zone::{Zone, ZoneCondition, ZoneKind, Zoned};
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

const SECTOR_BYTES: u64 = 512;

// ioctl request numbers from linux/blkzoned.h (_IOWR/_IOW/_IOR of type 0x12), checked against
// the C header on this machine.
const BLKREPORTZONE: u64 = 0xC010_1282;
const BLKRESETZONE: u64 = 0x4010_1283;
const BLKGETZONESZ: u64 = 0x8004_1284;
const BLKGETNRZONES: u64 = 0x8004_1285;
const BLKFINISHZONE: u64 = 0x4010_1288;

/// Bytes of `struct blk_zone_report`'s header and of one `struct blk_zone`.
const REPORT_HEADER_BYTES: usize = 16;
const ZONE_ENTRY_BYTES: usize = 64;
/// `BLK_ZONE_REP_CAPACITY`: the entries' capacity field is valid.
const REPORT_FLAG_CAPACITY: u32 = 1;
/// Zones asked for per report ioctl (bounds the buffer at 16 KiB).
const ZONES_PER_REPORT: u32 = 256;

/// Zone management of a zoned block device, through its own descriptor.
pub struct KernelZones {
    name: String,
    file: File,
    zone_bytes: u64,
    zone_count: u32,
}

/// The device has no zones (not a block device, or a conventional one).
fn not_zoned(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn ioctl_u32(file: &File, request: u64) -> io::Result<u32> {
    let mut v: u32 = 0;
    // SAFETY: the request is one of the `_IOR(.., __u32)` ioctls, which write exactly one u32
    // through the pointer; `v` lives across the call and the descriptor is open.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request as _, &mut v as *mut u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

impl KernelZones {
    /// Learns whether `file` (opened on `name`, `size_bytes` long) is a zoned block device.
    /// `Ok(None)` for regular files and conventional block devices; an error for a zoned
    /// device the pool cannot drive, saying why.
    pub fn probe(file: &File, name: &str, size_bytes: u64) -> io::Result<Option<KernelZones>> {
        let zone_sectors = match ioctl_u32(file, BLKGETZONESZ) {
            Ok(0) => return Ok(None),
            Ok(s) => s as u64,
            Err(e) if not_zoned(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let reported = ioctl_u32(file, BLKGETNRZONES)?;
        let zone_bytes = zone_sectors * SECTOR_BYTES;
        // A smaller last zone (the kernel allows one) is left out: the model has equal zones.
        let whole = u32::try_from(size_bytes / zone_bytes).unwrap_or(u32::MAX);
        let zone_count = reported.min(whole);
        if zone_count == 0 {
            return Err(invalid(format!(
                "{name}: zoned device of {size_bytes} bytes has no whole zone of {zone_bytes} bytes"
            )));
        }
        let zones = KernelZones {
            name: name.to_string(),
            file: file.try_clone()?,
            zone_bytes,
            zone_count,
        };
        // Read every zone once: refuses a geometry or state the pool cannot use, up front.
        let mut first = 0;
        while first < zone_count {
            let n = (zone_count - first).min(ZONES_PER_REPORT);
            first += zones.report_zones(first, n)?.len() as u32;
        }
        Ok(Some(zones))
    }

    fn zone_range_ioctl(&self, request: u64, zone: u32, what: &str) -> io::Result<()> {
        if zone >= self.zone_count {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: {what} zone {zone}: the device has {} zones", self.name, self.zone_count),
            ));
        }
        let sectors = self.zone_bytes / SECTOR_BYTES;
        let range: [u64; 2] = [zone as u64 * sectors, sectors];
        // SAFETY: `struct blk_zone_range` is two u64s (sector, nr_sectors), which `range` is;
        // the kernel only reads it, and it lives across the call.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, range.as_ptr()) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{}: {what} zone {zone}: {e}", self.name)));
        }
        Ok(())
    }
}

/// Decodes one `struct blk_zone` (little-endian, as on every Linux host SALSA runs on) that
/// should describe zone `index` of `zone_bytes`.
pub fn parse_zone_entry(raw: &[u8], index: u32, zone_bytes: u64, capacity_valid: bool) -> io::Result<Zone> {
    if raw.len() < ZONE_ENTRY_BYTES {
        return Err(invalid(format!("zone {index}: report entry of {} bytes", raw.len())));
    }
    let u64_at = |at: usize| u64::from_le_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
    let to_bytes = |sectors: u64, what: &str| {
        sectors
            .checked_mul(SECTOR_BYTES)
            .ok_or_else(|| invalid(format!("zone {index}: {what} {sectors} sectors overflows")))
    };
    let start = to_bytes(u64_at(0), "start")?;
    let len = to_bytes(u64_at(8), "length")?;
    let wp = to_bytes(u64_at(16), "write pointer")?;
    let (zone_type, cond) = (raw[24], raw[25]);
    let capacity = to_bytes(u64_at(32), "capacity")?;
    let expected_start = index as u64 * zone_bytes;
    if start != expected_start || len != zone_bytes {
        return Err(invalid(format!(
            "zone {index}: reported at byte {start}, {len} bytes long; expected {expected_start}, {zone_bytes} bytes (zones of unequal size are not supported)"
        )));
    }
    if capacity_valid && capacity != len {
        return Err(invalid(format!(
            "zone {index}: capacity {capacity} bytes is below its size {len} bytes; SALSA needs zone capacity equal to zone size"
        )));
    }
    let kind = match zone_type {
        1 => ZoneKind::Conventional,
        // Sequential-write-preferred zones (host-aware drives) are driven as required ones:
        // writing them in order is what they prefer.
        2 | 3 => ZoneKind::SequentialRequired,
        t => return Err(invalid(format!("zone {index}: unknown zone type {t:#x}"))),
    };
    let condition = match (kind, cond) {
        (ZoneKind::Conventional, _) => ZoneCondition::NotWritePointer,
        (_, 0x1) => ZoneCondition::Empty,
        (_, 0x2..=0x4) => ZoneCondition::Open,
        // A read-only zone takes no writes and can be read whole, as a full one.
        (_, 0xD | 0xE) => ZoneCondition::Full,
        (_, 0xF) => return Err(invalid(format!("zone {index} is offline; the drive has lost it"))),
        (_, c) => return Err(invalid(format!("zone {index}: unknown zone condition {c:#x}"))),
    };
    let write_pointer_bytes = match condition {
        ZoneCondition::NotWritePointer => start,
        ZoneCondition::Empty => start,
        ZoneCondition::Full => start + len,
        ZoneCondition::Open => {
            if wp < start || wp > start + len {
                return Err(invalid(format!(
                    "zone {index}: write pointer at byte {wp} lies outside the zone [{start}, {})",
                    start + len
                )));
            }
            wp
        }
    };
    Ok(Zone {
        start_bytes: start,
        len_bytes: len,
        write_pointer_bytes,
        kind,
        condition,
    })
}

/// Decodes a whole report buffer (header and entries) for zones from `first` on; at most the
/// entries the header claims and the buffer holds.
pub fn parse_report(buf: &[u8], first: u32, zone_bytes: u64) -> io::Result<Vec<Zone>> {
    if buf.len() < REPORT_HEADER_BYTES {
        return Err(invalid("zone report shorter than its header".into()));
    }
    let nr_zones = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    let flags = u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes"));
    let room = (buf.len() - REPORT_HEADER_BYTES) / ZONE_ENTRY_BYTES;
    if nr_zones as usize > room {
        return Err(invalid(format!("zone report claims {nr_zones} zones in room for {room}")));
    }
    (0..nr_zones)
        .map(|i| {
            let at = REPORT_HEADER_BYTES + i as usize * ZONE_ENTRY_BYTES;
            let index = first.checked_add(i).ok_or_else(|| invalid("zone index overflows".into()))?;
            parse_zone_entry(
                &buf[at..at + ZONE_ENTRY_BYTES],
                index,
                zone_bytes,
                flags & REPORT_FLAG_CAPACITY != 0,
            )
        })
        .collect()
}

impl Zoned for KernelZones {
    fn zone_bytes(&self) -> u64 {
        self.zone_bytes
    }

    fn zone_count(&self) -> u32 {
        self.zone_count
    }

    fn report_zones(&self, first: u32, count: u32) -> io::Result<Vec<Zone>> {
        let mut out = Vec::new();
        let end = first.saturating_add(count).min(self.zone_count);
        let mut at = first;
        while at < end {
            let n = (end - at).min(ZONES_PER_REPORT);
            // u64 words keep the buffer aligned for the kernel's u64 fields.
            let words = (REPORT_HEADER_BYTES + n as usize * ZONE_ENTRY_BYTES) / 8;
            let mut buf = vec![0u64; words];
            buf[0] = at as u64 * (self.zone_bytes / SECTOR_BYTES);
            buf[1] = n as u64; // nr_zones (low half), flags 0 (high half), little-endian
                               // SAFETY: `buf` is a `struct blk_zone_report` header followed by room for `n`
                               // entries, as `nr_zones` tells the kernel; it lives across the call.
            let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKREPORTZONE as _, buf.as_mut_ptr()) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(e.kind(), format!("{}: report zones from {at}: {e}", self.name)));
            }
            let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_le_bytes()).collect();
            let zones = parse_report(&bytes, at, self.zone_bytes).map_err(|e| invalid(format!("{}: {e}", self.name)))?;
            if zones.is_empty() {
                return Err(invalid(format!("{}: the drive reported no zone at zone {at}", self.name)));
            }
            at += zones.len() as u32;
            out.extend(zones);
        }
        out.truncate((end - first.min(end)) as usize);
        Ok(out)
    }

    fn reset_zone(&self, zone: u32) -> io::Result<()> {
        self.zone_range_ioctl(BLKRESETZONE, zone, "reset")
    }

    fn finish_zone(&self, zone: u32) -> io::Result<()> {
        self.zone_range_ioctl(BLKFINISHZONE, zone, "finish")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONE: u64 = 256 << 20;
    const ZS: u64 = ZONE / SECTOR_BYTES;

    fn entry(start: u64, len: u64, wp: u64, zone_type: u8, cond: u8, capacity: u64) -> Vec<u8> {
        let mut e = vec![0u8; ZONE_ENTRY_BYTES];
        e[0..8].copy_from_slice(&start.to_le_bytes());
        e[8..16].copy_from_slice(&len.to_le_bytes());
        e[16..24].copy_from_slice(&wp.to_le_bytes());
        e[24] = zone_type;
        e[25] = cond;
        e[32..40].copy_from_slice(&capacity.to_le_bytes());
        e
    }

    fn report(entries: &[Vec<u8>], claimed: u32, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; REPORT_HEADER_BYTES];
        b[8..12].copy_from_slice(&claimed.to_le_bytes());
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        for e in entries {
            b.extend_from_slice(e);
        }
        b
    }

    #[test]
    fn decodes_conventional_empty_open_and_full_zones() {
        let r = report(
            &[
                entry(0, ZS, 0, 1, 0, ZS),
                entry(ZS, ZS, ZS, 2, 1, ZS),
                entry(2 * ZS, ZS, 2 * ZS + 8, 2, 2, ZS),
                entry(3 * ZS, ZS, 3 * ZS + 16, 3, 4, ZS),
                entry(4 * ZS, ZS, u64::MAX / 1024, 2, 0xE, ZS),
            ],
            5,
            REPORT_FLAG_CAPACITY,
        );
        let z = parse_report(&r, 0, ZONE).unwrap();
        assert_eq!(z.len(), 5);
        assert_eq!(
            (z[0].kind, z[0].condition),
            (ZoneKind::Conventional, ZoneCondition::NotWritePointer)
        );
        assert_eq!((z[1].condition, z[1].write_pointer_bytes), (ZoneCondition::Empty, ZONE));
        assert_eq!((z[2].condition, z[2].write_pointer_bytes), (ZoneCondition::Open, 2 * ZONE + 4096));
        assert_eq!(z[2].readable_bytes(), 4096);
        assert_eq!((z[3].kind, z[3].condition), (ZoneKind::SequentialRequired, ZoneCondition::Open));
        // A full zone's write pointer is meaningless in the report; it is the zone's end.
        assert_eq!((z[4].condition, z[4].write_pointer_bytes), (ZoneCondition::Full, 5 * ZONE));
    }

    #[test]
    fn refuses_what_the_pool_cannot_drive() {
        let bad = [
            (entry(ZS, ZS, ZS, 2, 1, ZS), "expected 0"),         // out of place
            (entry(0, ZS / 2, 0, 2, 1, ZS / 2), "unequal size"), // other size
            (entry(0, ZS, 0, 2, 1, ZS - 8), "capacity"),         // ZNS capacity below size
            (entry(0, ZS, 0, 7, 1, ZS), "unknown zone type"),    //
            (entry(0, ZS, 0, 2, 0x9, ZS), "unknown zone condition"),
            (entry(0, ZS, 0, 2, 0xF, ZS), "offline"),             //
            (entry(0, ZS, ZS + 1, 2, 2, ZS), "outside the zone"), // write pointer past the end
            (entry(u64::MAX, ZS, 0, 2, 1, ZS), "overflows"),      //
        ];
        for (e, want) in bad {
            let err = parse_report(&report(&[e], 1, REPORT_FLAG_CAPACITY), 0, ZONE).unwrap_err();
            assert!(err.to_string().contains(want), "{err} should mention {want}");
        }
        // Capacity is ignored when the kernel does not report it.
        assert!(parse_report(&report(&[entry(0, ZS, 0, 2, 1, 0)], 1, 0), 0, ZONE).is_ok());
    }

    #[test]
    fn refuses_reports_that_claim_more_than_they_hold() {
        let err = parse_report(&report(&[entry(0, ZS, 0, 2, 1, ZS)], 2, 0), 0, ZONE).unwrap_err();
        assert!(err.to_string().contains("claims 2 zones"), "{err}");
        assert!(parse_report(&[0u8; 8], 0, ZONE).is_err());
        assert!(parse_report(&report(&[], 0, 0), 0, ZONE).unwrap().is_empty());
    }

    #[test]
    fn a_regular_file_has_no_zones() {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("plain.img");
        let f = File::create(&path).unwrap();
        f.set_len(1 << 20).unwrap();
        assert!(KernelZones::probe(&f, "plain", 1 << 20).unwrap().is_none());
    }
}
