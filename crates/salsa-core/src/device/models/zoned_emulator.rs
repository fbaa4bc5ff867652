//! A host-managed zoned device (SMR or ZNS semantics) emulated over any other device: a file
//! for a drive that persists across restarts, memory for benchmarks, a crash-simulating device
//! for crash tests.
//!
//! Owns: zone state (write pointers, finished zones) and its persistence, and the enforcement of
//! the zone rules of [`crate::device::zone`]: every illegal operation fails with an error that names the
//! zone, as a real drive fails it.
//!
//! Layout of the backing device: the zones back to back from offset 0, then two state slots at
//! the end. A state slot holds the geometry and every zone's write pointer with a generation and
//! a crc32c; the two slots alternate, so a torn state write leaves the previous one intact.
//! Write pointers are persisted at every sync (after the data is synced) and at every reset or
//! finish, so after a crash each write pointer is where the last sync left it or later: data the
//! engine saw synced is always readable, data that was not may be gone, as on a drive that lost
//! its volatile cache.

use crate::device::zone::{Zone, ZoneCondition, ZoneKind, Zoned};
use crate::device::{check_range, Device, StorageType};
use crate::util::{AlignedBuf, Decoder, Encoder};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

const STATE_MAGIC: &[u8; 8] = b"SALSAZE1";
const STATE_VERSION: u32 = 1;
const STATE_ALIGN_BYTES: u64 = 4096;
/// Bytes of a state slot before the per-zone entries.
const STATE_HEADER_BYTES: u64 = 64;
/// Bytes per zone in a state slot: write pointer and end of written data (relative).
const STATE_ZONE_BYTES: u64 = 16;

/// Geometry of an emulated zoned device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZonedGeometry {
    pub zone_bytes: u64,
    /// Conventional zones at the start of the device.
    pub conventional_zones: u32,
    /// What the sequential zones are: `SmrSequential` for host-managed SMR, `Flash` for ZNS.
    pub storage_type: StorageType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ZoneState {
    /// Write pointer, relative to the zone start.
    wp: u64,
    /// Finished with `finish_zone`: full, the unwritten tail reads as zeros.
    finished: bool,
}

struct Persist {
    generation: u64,
    /// Write pointers as last persisted.
    durable: Vec<ZoneState>,
}

/// The emulated zoned device.
pub struct ZonedEmulator {
    name: String,
    backing: Arc<dyn Device>,
    geo: ZonedGeometry,
    zone_count: u32,
    slot_bytes: u64,
    zones: Vec<Mutex<ZoneState>>,
    persist: Mutex<Persist>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn slot_bytes_for(zone_count: u64) -> u64 {
    (STATE_HEADER_BYTES + zone_count * STATE_ZONE_BYTES + 4).div_ceil(STATE_ALIGN_BYTES) * STATE_ALIGN_BYTES
}

impl ZonedEmulator {
    /// Number of zones a backing device of `backing_bytes` holds (after the two state slots).
    pub fn zones_for(backing_bytes: u64, zone_bytes: u64) -> u64 {
        if zone_bytes == 0 {
            return 0;
        }
        let mut n = backing_bytes / zone_bytes;
        while n > 0 && n * zone_bytes + 2 * slot_bytes_for(n) > backing_bytes {
            n -= 1;
        }
        n
    }

    /// Opens the emulated drive kept on `backing`, or creates an empty one (every sequential
    /// zone empty) when `backing` holds no zone state at all. A backing device with state of
    /// another geometry, or with damaged state, or with other data, is refused.
    pub fn open_or_create(backing: Arc<dyn Device>, geo: ZonedGeometry) -> io::Result<ZonedEmulator> {
        let name = format!("zoned:{}", backing.name());
        if geo.zone_bytes == 0 || !geo.zone_bytes.is_multiple_of(STATE_ALIGN_BYTES) {
            return Err(invalid(format!(
                "{name}: zone size {} must be a positive multiple of 4 KiB",
                geo.zone_bytes
            )));
        }
        let zone_count = Self::zones_for(backing.size_bytes(), geo.zone_bytes);
        if zone_count == 0 || zone_count > u32::MAX as u64 || geo.conventional_zones as u64 > zone_count {
            return Err(invalid(format!(
                "{name}: {} bytes hold {zone_count} zones of {} bytes, fewer than needed (conventional zones: {})",
                backing.size_bytes(),
                geo.zone_bytes,
                geo.conventional_zones
            )));
        }
        let slot_bytes = slot_bytes_for(zone_count);
        let mut emu = ZonedEmulator {
            name,
            backing,
            geo,
            zone_count: zone_count as u32,
            slot_bytes,
            zones: Vec::new(),
            persist: Mutex::new(Persist {
                generation: 0,
                durable: Vec::new(),
            }),
        };
        let (states, generation) = match emu.load_state()? {
            Some(loaded) => loaded,
            None => {
                if !emu.state_area_blank()? {
                    return Err(invalid(format!(
                        "{}: holds data but no zone state; it is not an emulated zoned drive",
                        emu.name
                    )));
                }
                (vec![ZoneState { wp: 0, finished: false }; zone_count as usize], 0)
            }
        };
        emu.zones = states.iter().map(|s| Mutex::new(*s)).collect();
        *emu.persist.get_mut() = Persist {
            generation,
            durable: states,
        };
        if generation == 0 {
            let mut p = emu.persist.lock();
            let durable = p.durable.clone();
            emu.store_state(&mut p, &durable)?;
        }
        Ok(emu)
    }

    fn slot_offset(&self, slot: u64) -> u64 {
        self.zone_count as u64 * self.geo.zone_bytes + slot * self.slot_bytes
    }

    fn state_area_blank(&self) -> io::Result<bool> {
        let mut buf = AlignedBuf::zeroed((2 * self.slot_bytes) as usize);
        self.backing.read_at(&mut buf, self.slot_offset(0))?;
        Ok(buf.iter().all(|&b| b == 0))
    }

    fn encode_state(&self, generation: u64, states: &[ZoneState]) -> AlignedBuf {
        let mut e = Encoder::default();
        e.raw(STATE_MAGIC)
            .u32(STATE_VERSION)
            .u8(self.geo.storage_type as u8)
            .u64(self.geo.zone_bytes)
            .u32(self.zone_count)
            .u32(self.geo.conventional_zones)
            .u64(generation);
        let mut bytes = std::mem::take(&mut e.bytes);
        bytes.resize(STATE_HEADER_BYTES as usize, 0);
        for s in states {
            bytes.extend_from_slice(&s.wp.to_le_bytes());
            bytes.extend_from_slice(&(s.finished as u64).to_le_bytes());
        }
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let mut buf = AlignedBuf::zeroed(self.slot_bytes as usize);
        buf[..bytes.len()].copy_from_slice(&bytes);
        buf
    }

    /// Decodes one slot; `None` when it is not a valid state of this geometry.
    fn decode_state(&self, slot: &[u8]) -> io::Result<Option<(Vec<ZoneState>, u64)>> {
        let body_len = (STATE_HEADER_BYTES + self.zone_count as u64 * STATE_ZONE_BYTES) as usize;
        if slot.len() < body_len + 4 || &slot[..8] != STATE_MAGIC {
            return Ok(None);
        }
        let stored = u32::from_le_bytes([slot[body_len], slot[body_len + 1], slot[body_len + 2], slot[body_len + 3]]);
        if crc32c::crc32c(&slot[..body_len]) != stored {
            return Ok(None);
        }
        let mut d = Decoder::new(&slot[8..body_len]);
        let parsed = (|| {
            let version = d.u32("version")?;
            let storage = d.u8("storage type")?;
            let zone_bytes = d.u64("zone size")?;
            let zones = d.u32("zone count")?;
            let conventional = d.u32("conventional zones")?;
            let generation = d.u64("generation")?;
            Ok::<_, crate::util::Truncated>((version, storage, zone_bytes, zones, conventional, generation))
        })();
        let Ok((version, storage, zone_bytes, zones, conventional, generation)) = parsed else {
            return Ok(None);
        };
        if version != STATE_VERSION
            || zone_bytes != self.geo.zone_bytes
            || zones != self.zone_count
            || conventional != self.geo.conventional_zones
            || storage != self.geo.storage_type as u8
        {
            return Err(invalid(format!(
                "{}: holds a zoned drive of another geometry ({zones} zones of {zone_bytes} bytes, {conventional} conventional, type {storage}); \
                 give the same parameters or a new file",
                self.name
            )));
        }
        let mut states = Vec::with_capacity(self.zone_count as usize);
        for z in 0..self.zone_count as usize {
            let at = STATE_HEADER_BYTES as usize + z * STATE_ZONE_BYTES as usize;
            let wp = u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
            let finished = u64::from_le_bytes(slot[at + 8..at + 16].try_into().expect("8 bytes")) != 0;
            if wp > self.geo.zone_bytes || !wp.is_multiple_of(512) {
                return Ok(None);
            }
            states.push(ZoneState { wp, finished });
        }
        Ok(Some((states, generation)))
    }

    fn load_state(&self) -> io::Result<Option<(Vec<ZoneState>, u64)>> {
        let mut best: Option<(Vec<ZoneState>, u64)> = None;
        let mut buf = AlignedBuf::zeroed(self.slot_bytes as usize);
        for slot in 0..2 {
            self.backing.read_at(&mut buf, self.slot_offset(slot))?;
            if let Some((s, g)) = self.decode_state(&buf)? {
                if best.as_ref().is_none_or(|(_, bg)| g > *bg) {
                    best = Some((s, g));
                }
            }
        }
        Ok(best)
    }

    /// Writes `states` as the next generation into the other slot and syncs the backing. The
    /// caller holds the persist lock, which orders state writes with syncs and zone management.
    fn store_state(&self, p: &mut Persist, states: &[ZoneState]) -> io::Result<()> {
        let generation = p.generation + 1;
        let buf = self.encode_state(generation, states);
        self.backing.write_at(&buf, self.slot_offset(generation % 2))?;
        self.backing.sync()?;
        p.generation = generation;
        p.durable = states.to_vec();
        Ok(())
    }

    fn zone_of(&self, offset: u64) -> u32 {
        (offset / self.geo.zone_bytes) as u32
    }

    fn is_conventional(&self, zone: u32) -> bool {
        zone < self.geo.conventional_zones
    }

    fn check_zone(&self, zone: u32) -> io::Result<()> {
        if zone >= self.zone_count {
            return Err(invalid(format!(
                "{}: zone {zone} does not exist ({} zones)",
                self.name, self.zone_count
            )));
        }
        if self.is_conventional(zone) {
            return Err(invalid(format!(
                "{}: zone {zone} is conventional; it has no write pointer to reset or finish",
                self.name
            )));
        }
        Ok(())
    }

    fn zone_report(&self, zone: u32) -> Zone {
        let start = zone as u64 * self.geo.zone_bytes;
        if self.is_conventional(zone) {
            return Zone {
                start_bytes: start,
                len_bytes: self.geo.zone_bytes,
                write_pointer_bytes: start,
                kind: ZoneKind::Conventional,
                condition: ZoneCondition::NotWritePointer,
            };
        }
        let s = *self.zones[zone as usize].lock();
        let condition = if s.finished || s.wp == self.geo.zone_bytes {
            ZoneCondition::Full
        } else if s.wp == 0 {
            ZoneCondition::Empty
        } else {
            ZoneCondition::Open
        };
        Zone {
            start_bytes: start,
            len_bytes: self.geo.zone_bytes,
            write_pointer_bytes: start + s.wp,
            kind: ZoneKind::SequentialRequired,
            condition,
        }
    }

    /// Applies `change` to a zone and persists the durable write pointers with that zone
    /// replaced (the other zones keep their durable state: their data may not be synced).
    fn manage_zone(&self, zone: u32, change: impl FnOnce(&mut ZoneState)) -> io::Result<()> {
        self.check_zone(zone)?;
        let mut p = self.persist.lock();
        let state = {
            let mut z = self.zones[zone as usize].lock();
            change(&mut z);
            *z
        };
        let mut states = p.durable.clone();
        states[zone as usize] = state;
        self.store_state(&mut p, &states)
    }
}

impl Zoned for ZonedEmulator {
    fn zone_bytes(&self) -> u64 {
        self.geo.zone_bytes
    }
    fn zone_count(&self) -> u32 {
        self.zone_count
    }
    fn report_zones(&self, first: u32, count: u32) -> io::Result<Vec<Zone>> {
        if first >= self.zone_count {
            return Err(invalid(format!(
                "{}: zone {first} does not exist ({} zones)",
                self.name, self.zone_count
            )));
        }
        let end = first.saturating_add(count).min(self.zone_count);
        Ok((first..end).map(|z| self.zone_report(z)).collect())
    }
    fn reset_zone(&self, zone: u32) -> io::Result<()> {
        self.manage_zone(zone, |z| *z = ZoneState { wp: 0, finished: false })
    }
    fn finish_zone(&self, zone: u32) -> io::Result<()> {
        self.manage_zone(zone, |z| z.finished = true)
    }
}

impl Device for ZonedEmulator {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.zone_count as u64 * self.geo.zone_bytes
    }
    fn storage_type(&self) -> StorageType {
        self.geo.storage_type
    }
    fn alignment_bytes(&self) -> usize {
        self.backing.alignment_bytes()
    }
    fn zones(&self) -> Option<&dyn Zoned> {
        Some(self)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len())?;
        let zb = self.geo.zone_bytes;
        let end = offset + buf.len() as u64;
        let mut at = offset;
        while at < end {
            let zone = self.zone_of(at);
            let zone_start = zone as u64 * zb;
            let piece_end = (zone_start + zb).min(end);
            let (lo, hi) = ((at - offset) as usize, (piece_end - offset) as usize);
            if self.is_conventional(zone) {
                self.backing.read_at(&mut buf[lo..hi], at)?;
            } else {
                let s = *self.zones[zone as usize].lock();
                let wp = zone_start + s.wp;
                if piece_end > wp && !s.finished {
                    return Err(invalid(format!(
                        "{}: read of [{at}, {piece_end}) in zone {zone} goes past its write pointer at {wp}",
                        self.name
                    )));
                }
                let data_end = wp.clamp(at, piece_end);
                let mid = (data_end - offset) as usize;
                self.backing.read_at(&mut buf[lo..mid], at)?;
                buf[mid..hi].fill(0);
            }
            at = piece_end;
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size_bytes(), offset, buf.len())?;
        let zb = self.geo.zone_bytes;
        let end = offset + buf.len() as u64;
        let first = self.zone_of(offset);
        let last = self.zone_of(end.saturating_sub(1).max(offset));
        if (first..=last).all(|z| self.is_conventional(z)) {
            return self.backing.write_at(buf, offset);
        }
        if first != last {
            return Err(invalid(format!(
                "{}: write of [{offset}, {end}) crosses the boundary of sequential zone {}",
                self.name,
                if self.is_conventional(first) { last } else { first }
            )));
        }
        let zone_start = first as u64 * zb;
        let mut s = self.zones[first as usize].lock();
        if s.finished || s.wp == zb {
            return Err(invalid(format!("{}: write at {offset} to zone {first}, which is full", self.name)));
        }
        if offset != zone_start + s.wp {
            return Err(invalid(format!(
                "{}: unaligned write at {offset} in zone {first}: its write pointer is at {}",
                self.name,
                zone_start + s.wp
            )));
        }
        // The zone lock is held across the write so that the write pointer only ever covers
        // bytes that were written (a failed write leaves it where it was).
        self.backing.write_at(buf, offset)?;
        s.wp += buf.len() as u64;
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        // The write pointers are taken before the data sync, so they only cover writes that
        // sync makes durable.
        let mut p = self.persist.lock();
        let current: Vec<ZoneState> = self.zones.iter().map(|z| *z.lock()).collect();
        self.backing.sync()?;
        if current != p.durable {
            self.store_state(&mut p, &current)?;
        }
        Ok(())
    }
    fn counters(&self) -> Vec<(String, u64)> {
        let mut full = 0;
        let mut open = 0;
        for z in self.geo.conventional_zones..self.zone_count {
            match self.zone_report(z).condition {
                ZoneCondition::Full => full += 1,
                ZoneCondition::Open => open += 1,
                _ => {}
            }
        }
        vec![
            ("zones".into(), self.zone_count as u64),
            ("zones_open".into(), open),
            ("zones_full".into(), full),
        ]
    }
}
