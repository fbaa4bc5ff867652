//! The linear array: the members' segments concatenated into one index space (member 0's
//! first, then member 1's, ...). A segment never crosses a device.
//!
//! Owns: the mapping from a global segment index to (device, byte offset), and the write order
//! of segments that sit in sequential zones. Invariants: every access stays inside one
//! segment; a segment in a sequential zone is written strictly at its write pointer even when
//! many threads write it at once (a write waits for the writes before it), is read only below
//! its write pointer, and is reset before it is reused. Segments of devices that prefer
//! sequential writes are also written strictly in order.

use super::{Array, ArrayKind, Member};
use crate::device::{zone::report_zone, Device, StorageType, ZoneKind};
use crate::error::{Error, Result};
use crate::format::DeviceLayout;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a write waits for the writes ahead of it in its zone before the array gives up
/// (they can only be missing if an earlier write failed, which poisons the pool anyway).
const ZONE_ORDER_TIMEOUT: Duration = Duration::from_secs(30);

/// Write order of the segments that sit in sequential zones.
struct ZoneOrder {
    /// Per segment: `Some(write pointer in bytes from the segment start, and the condition its
    /// waiting writers sleep on)` for a segment written strictly in order, `None` for one that
    /// takes writes in any order.
    write_pointer: Vec<Option<(Mutex<u64>, Condvar)>>,
    /// Per segment: it sits in a sequential zone (reads stop at the write pointer, reuse
    /// resets the zone). Segments of devices that only prefer sequential writes (a
    /// drive-managed SMR disk detects sequential streams) are ordered but not zoned.
    zoned: Vec<bool>,
    /// Set when a write to a sequential zone failed: the writes behind it can never happen.
    broken: AtomicBool,
}

/// Linear concatenation of the members.
pub struct LinearArray {
    members: Vec<Member>,
    segment_bytes: u64,
    grain_bytes: u64,
    grains_per_segment: u64,
    /// Member index of every segment, for O(1) lookup.
    owner: Vec<u16>,
    /// Storage type of every segment (a zoned device mixes conventional and sequential zones).
    types: Vec<StorageType>,
    zones: ZoneOrder,
    /// Some member uses `O_DIRECT`; fixed when the array is built (asked on every page read).
    aligned_buffers: bool,
    /// Member ids in slot order (empty for a version-5 pool).
    ids: Vec<u64>,
    /// Members missing at open (allowed only for members that never held log data) or failed
    /// since while holding none: their segments are offline, and nothing is written, synced
    /// or discarded on them.
    absent: Vec<AtomicBool>,
    /// Members that hold no log data (not among the pool metadata's log members): a write or
    /// sync error on one fails it and takes its segments offline instead of stopping the pool.
    expendable: Vec<AtomicBool>,
    /// Set when a member failed since the last [`Array::take_failure_change`].
    failure_changed: AtomicBool,
}

impl LinearArray {
    /// Builds the array; on zoned members it reads every segment's zone (kind, write pointer).
    /// `ids` are the members' ids in slot order; `absent` the slots whose device is missing (a
    /// stand-in that fails all I/O).
    pub fn new(members: Vec<Member>, ids: Vec<u64>, absent: &[u32], segment_bytes: u64, grain_bytes: u64) -> Result<LinearArray> {
        let absent: Vec<AtomicBool> = (0..members.len() as u32).map(|i| AtomicBool::new(absent.contains(&i))).collect();
        let expendable = (0..members.len()).map(|_| AtomicBool::new(false)).collect();
        let mut owner = Vec::new();
        let mut types = Vec::new();
        let mut write_pointer = Vec::new();
        let mut zoned = Vec::new();
        for (i, m) in members.iter().enumerate() {
            // A device that declares a preferred write size rewards in-order segments.
            let ordered = m.device.preferred_alignment_bytes() > 0;
            assert_eq!(m.first_segment as usize, owner.len(), "members must be contiguous");
            owner.extend(std::iter::repeat_n(i as u16, m.segment_count as usize));
            for k in 0..m.segment_count as u64 {
                let offset = m.layout.segments_offset_bytes + k * segment_bytes;
                match m.device.zones() {
                    None => {
                        types.push(m.device.storage_type());
                        // Written in order from the start once allocated (reads are not
                        // limited: data of earlier sessions stays readable).
                        write_pointer.push(ordered.then(|| (Mutex::new(0), Condvar::new())));
                        zoned.push(false);
                    }
                    Some(z) => {
                        let zone = report_zone(z, (offset / z.zone_bytes()) as u32).map_err(|source| Error::Io {
                            device: m.device.name().to_string(),
                            op: "report zones",
                            offset,
                            source,
                        })?;
                        if zone.start_bytes != offset || zone.len_bytes != segment_bytes {
                            return Err(Error::Corrupt(format!(
                                "{}: segment at {offset} does not match its zone ({} bytes at {})",
                                m.device.name(),
                                zone.len_bytes,
                                zone.start_bytes
                            )));
                        }
                        if zone.kind == ZoneKind::Conventional {
                            types.push(StorageType::SmrConventional);
                            write_pointer.push(None);
                            zoned.push(false);
                        } else {
                            types.push(m.device.storage_type());
                            write_pointer.push(Some((Mutex::new(zone.readable_bytes()), Condvar::new())));
                            zoned.push(true);
                        }
                    }
                }
            }
        }
        let aligned_buffers = members.iter().any(|m| m.device.alignment_bytes() > 512);
        Ok(LinearArray {
            ids,
            absent,
            expendable,
            failure_changed: AtomicBool::new(false),
            members,
            segment_bytes,
            grain_bytes,
            grains_per_segment: segment_bytes / grain_bytes,
            owner,
            types,
            zones: ZoneOrder {
                write_pointer,
                zoned,
                broken: AtomicBool::new(false),
            },
            aligned_buffers,
        })
    }

    fn member(&self, segment: u32) -> &Member {
        &self.members[self.owner[segment as usize] as usize]
    }

    /// Applies `op` (named `what` in its error) to the whole of `segment` on the member that
    /// holds it, unless that member is zoned (its zones are reset, never filled or discarded)
    /// or offline.
    fn on_segment_share(
        &self,
        segment: u32,
        what: &'static str,
        op: impl FnOnce(&dyn Device, u64, u64) -> std::io::Result<()>,
    ) -> Result<()> {
        let (m, offset) = self.segment_offset(segment);
        if m.device.zones().is_some() || self.is_segment_offline(segment) {
            return Ok(());
        }
        op(m.device.as_ref(), offset, self.segment_bytes).map_err(|source| Error::Io {
            device: m.device.name().to_string(),
            op: what,
            offset,
            source,
        })
    }

    /// Byte offset of `segment` on its device.
    fn segment_offset(&self, segment: u32) -> (&Member, u64) {
        let m = self.member(segment);
        (
            m,
            m.layout.segments_offset_bytes + (segment - m.first_segment) as u64 * self.segment_bytes,
        )
    }

    fn is_absent(&self, slot: usize) -> bool {
        self.absent[slot].load(SeqCst)
    }

    /// After an I/O error on member `slot`: a member that holds no log data fails (its
    /// segments go offline, the pool goes on without it); returns whether it did.
    fn fail_if_expendable(&self, slot: usize, error: &std::io::Error) -> bool {
        if !self.expendable[slot].load(SeqCst) {
            return false;
        }
        if !self.absent[slot].swap(true, SeqCst) {
            self.failure_changed.store(true, SeqCst);
            tracing::error!(
                "member {slot} ({}) failed ({error}); it held no log data (only copies of a hybrid volume's hot data), so the pool goes on without it",
                self.members[slot].device.name()
            );
        }
        true
    }

    /// Device and byte offset of grain `grain_in_segment` of `segment`.
    fn locate(&self, segment: u32, grain_in_segment: u64, len: usize) -> (&dyn Device, u64) {
        assert!(
            grain_in_segment * self.grain_bytes + len as u64 <= self.segment_bytes,
            "access crosses the end of segment {segment}"
        );
        let (m, base) = self.segment_offset(segment);
        (m.device.as_ref(), base + grain_in_segment * self.grain_bytes)
    }
}

impl Array for LinearArray {
    fn kind(&self) -> ArrayKind {
        ArrayKind::Linear
    }

    fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether buffers handed to the devices must be aligned (some member uses `O_DIRECT`).
    fn needs_aligned_buffers(&self) -> bool {
        self.aligned_buffers
    }

    fn storage_type(&self, segment: u32) -> StorageType {
        self.types[segment as usize]
    }

    /// Grains of `segment` that can be read: all of them, or those below the write pointer of
    /// a sequential zone.
    fn readable_grains(&self, segment: u32) -> u64 {
        match &self.zones.write_pointer[segment as usize] {
            Some((wp, _)) if self.zones.zoned[segment as usize] => *wp.lock() / self.grain_bytes,
            _ => self.grains_per_segment,
        }
    }

    /// Makes a segment ready to be written from its start: a sequential zone that holds
    /// anything is reset. Called when a free segment is handed out, which is only after the
    /// metadata that emptied it is durable.
    fn prepare_segment(&self, segment: u32) -> Result<()> {
        let Some((wp, _)) = &self.zones.write_pointer[segment as usize] else {
            return Ok(());
        };
        let mut wp = wp.lock();
        if *wp == 0 {
            return Ok(());
        }
        if !self.zones.zoned[segment as usize] {
            *wp = 0;
            return Ok(());
        }
        let (m, offset) = self.segment_offset(segment);
        let z = m.device.zones().expect("a segment with a write pointer is on a zoned device");
        let zone = (offset / z.zone_bytes()) as u32;
        z.reset_zone(zone).map_err(|source| Error::Io {
            device: m.device.name().to_string(),
            op: "reset zone",
            offset,
            source,
        })?;
        *wp = 0;
        Ok(())
    }

    fn discard_reallocates(&self, segment: u32) -> bool {
        self.segment_offset(segment).0.device.discard_reallocates()
    }

    fn segment_has_hole(&self, segment: u32) -> bool {
        let (m, offset) = self.segment_offset(segment);
        m.device.has_hole(offset, self.segment_bytes)
    }

    fn fill_segment(&self, segment: u32) -> Result<()> {
        self.on_segment_share(segment, "fill", |dev, offset, len| super::zero_range(dev, offset, len))
    }

    fn discard_segment(&self, segment: u32) -> Result<()> {
        self.on_segment_share(segment, "discard", |dev, offset, len| dev.discard(offset, len))
    }

    /// Reads whole grains starting at a physical grain address.
    fn read(&self, grain: u64, buf: &mut [u8]) -> Result<()> {
        let segment = (grain / self.grains_per_segment) as u32;
        let (dev, offset) = self.locate(segment, grain % self.grains_per_segment, buf.len());
        dev.read_at(buf, offset).map_err(|source| Error::Io {
            device: dev.name().to_string(),
            op: "read",
            offset,
            source,
        })
    }

    /// Writes the concatenation of `bufs` (whole grains in all) like [`Array::write`],
    /// as one device write.
    fn write_vectored(&self, grain: u64, bufs: &[std::io::IoSlice<'_>]) -> Result<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let segment = (grain / self.grains_per_segment) as u32;
        let in_segment = grain % self.grains_per_segment;
        let (dev, offset) = self.locate(segment, in_segment, len);
        let slot = self.owner[segment as usize] as usize;
        let io = |op, source: std::io::Error| {
            self.fail_if_expendable(slot, &source);
            Error::Io {
                device: dev.name().to_string(),
                op,
                offset,
                source,
            }
        };
        if self.is_absent(slot) {
            return Err(io("write", std::io::Error::other("the member failed or is missing")));
        }
        let Some((wp, turn)) = &self.zones.write_pointer[segment as usize] else {
            return dev.write_vectored_at(bufs, offset).map_err(|e| io("write", e));
        };
        let at = in_segment * self.grain_bytes;
        let deadline = Instant::now() + ZONE_ORDER_TIMEOUT;
        let mut wp = wp.lock();
        while *wp != at {
            let stuck = if *wp > at {
                Some("write below the zone's write pointer")
            } else if self.zones.broken.load(SeqCst) {
                Some("an earlier write to a sequential zone failed")
            } else if Instant::now() >= deadline {
                Some("the writes ahead of this one in its zone never came")
            } else {
                None
            };
            if let Some(why) = stuck {
                self.zones.broken.store(true, SeqCst);
                turn.notify_all();
                return Err(io(
                    "write",
                    std::io::Error::other(format!("{why} (segment {segment}, write pointer at {} bytes, write at {at})", *wp)),
                ));
            }
            turn.wait_for(&mut wp, Duration::from_millis(20));
        }
        // The zone lock is held across the write: the writes behind this one wait anyway.
        let r = dev.write_vectored_at(bufs, offset);
        match r {
            Ok(()) => *wp += len as u64,
            Err(_) => self.zones.broken.store(true, SeqCst),
        }
        drop(wp);
        turn.notify_all();
        r.map_err(|e| io("write", e))
    }

    /// Syncs every member that is there; one that holds no log data and fails is left out.
    fn sync_all(&self) -> Result<()> {
        for (slot, m) in self.members.iter().enumerate() {
            if self.is_absent(slot) {
                continue;
            }
            if let Err(source) = m.device.sync() {
                if !self.fail_if_expendable(slot, &source) {
                    return Err(Error::Io {
                        device: m.device.name().to_string(),
                        op: "sync",
                        offset: 0,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    fn metadata_devices(&self) -> Vec<(Arc<dyn Device>, DeviceLayout)> {
        (0..self.members.len())
            .filter(|&slot| !self.is_absent(slot))
            .map(|slot| (self.members[slot].device.clone(), self.members[slot].layout))
            .collect()
    }

    fn set_log_members(&self, log_members: Option<&[u64]>) {
        for (slot, flag) in self.expendable.iter().enumerate() {
            let id = self.ids.get(slot).copied().unwrap_or(0);
            let never_logged = id != 0 && log_members.is_some_and(|log| !log.contains(&id));
            flag.store(never_logged, SeqCst);
        }
    }

    fn take_failure_change(&self) -> Option<Vec<u64>> {
        self.failure_changed.swap(false, SeqCst).then(|| self.failed_ids())
    }

    fn failed_ids(&self) -> Vec<u64> {
        (0..self.members.len())
            .filter(|&slot| self.is_absent(slot))
            .filter_map(|slot| self.ids.get(slot).copied())
            .collect()
    }

    fn member_ids(&self) -> Vec<u64> {
        self.ids.clone()
    }

    fn segment_member_ids(&self, segment: u32) -> Vec<u64> {
        self.ids.get(self.owner[segment as usize] as usize).copied().into_iter().collect()
    }

    fn is_segment_offline(&self, segment: u32) -> bool {
        self.is_absent(self.owner[segment as usize] as usize)
    }

    fn member_status(&self) -> Vec<crate::array::MemberStatus> {
        self.members
            .iter()
            .enumerate()
            .map(|(slot, m)| crate::array::MemberStatus {
                name: m.device.name().to_string(),
                storage_type: crate::array::storage_type_name(m.device.as_ref()),
                failed: self.is_absent(slot),
                ..Default::default()
            })
            .collect()
    }
}
