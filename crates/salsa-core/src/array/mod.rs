//! The array layer: combines the pool's member devices into one physical address space of
//! segments, and does the I/O for a physical grain address.
//!
//! Owns: the [`Array`] trait, what the log asks of any layout, the [`Member`] description and
//! the [`ArrayKind`] recorded in every superblock. The layouts: the linear concatenation
//! ([`linear::LinearArray`]) and RAID-0, -1 and -5 ([`raid::RaidArray`]); [`member_io`] runs a
//! request's parts on several members at once.
//!
//! Invariants every layout keeps: a physical grain address is
//! `segment * grains_per_segment + grain_in_segment`; every access stays inside one segment; a
//! segment is written from its start, in order where its device needs it, and
//! [`Array::prepare_segment`] makes it writable from its start again before it is reused; a
//! write that returned is visible to reads, durable only after [`Array::sync_all`].

pub mod linear;
pub mod member_io;
pub mod raid;

use crate::device::{Device, StorageType};
use crate::error::Result;
use crate::format::DeviceLayout;
use std::sync::Arc;

pub use crate::format::ArrayKind;

pub use linear::LinearArray;
pub use raid::parity_buffer::ParityBuffer;
pub use raid::write_parity::{ParityGeometry, WriteParity};
pub use raid::RaidArray;

/// Writes zeros over `len` bytes of `device` from `offset`, a megabyte at a time.
fn zero_range(device: &dyn Device, offset: u64, len: u64) -> std::io::Result<()> {
    let zeros = crate::util::shared_zeros();
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeros.len() as u64) as usize;
        device.write_at(&zeros[..n], offset + at)?;
        at += n as u64;
    }
    Ok(())
}

/// What a scrub of redundancy found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubCounts {
    /// Segments in use checked (the pool counts them; an array's count of one is 0).
    pub segments: u64,
    /// Rows (RAID-5) or mirrored ranges (RAID-1) compared.
    pub rows_checked: u64,
    /// Of those, whose parity or mirror copies disagreed with the data.
    pub rows_mismatched: u64,
    /// Of those, made to agree again: damaged data pages rewritten from redundancy, then the
    /// redundancy rewritten from the data.
    pub rows_repaired: u64,
    /// Pages (data and metadata) in the rows that disagreed which failed their checksum on a
    /// member.
    pub pages_damaged: u64,
    /// Of those, pages the redundancy holds a copy of that passes.
    pub pages_repairable: u64,
    /// Of those, rewritten on the member that was wrong.
    pub pages_repaired: u64,
}

impl std::ops::AddAssign for ScrubCounts {
    fn add_assign(&mut self, o: ScrubCounts) {
        self.segments += o.segments;
        self.rows_checked += o.rows_checked;
        self.rows_mismatched += o.rows_mismatched;
        self.rows_repaired += o.rows_repaired;
        self.pages_damaged += o.pages_damaged;
        self.pages_repairable += o.pages_repairable;
        self.pages_repaired += o.pages_repaired;
    }
}

/// A page a scrub can check: `bytes` at pool grain `grain`, a data page whose checksum is
/// `Some(crc)` (as its record's metadata says), or `None`: a record's metadata page, which
/// carries its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCheck {
    pub grain: u64,
    pub bytes: u32,
    pub crc: Option<u32>,
}

impl PageCheck {
    /// Whether `page` (its bytes as read) passes its checksum.
    pub fn passes(&self, page: &[u8]) -> bool {
        match self.crc {
            Some(crc) => crc32c::crc32c(page) == crc,
            None => crate::format::RecordMeta::decode(page).is_ok(),
        }
    }
}

/// The name of `device`'s storage type for [`MemberStatus`]: `unknown` for a stand-in of a
/// missing member (nothing records a member's type but its own superblock).
pub fn storage_type_name(device: &dyn Device) -> String {
    if device.is_stand_in() {
        "unknown".into()
    } else {
        device.storage_type().name().into()
    }
}

/// The error of a replacement asked of a layout without redundancy.
pub fn no_redundancy_to_rebuild(kind: ArrayKind) -> crate::error::Error {
    crate::error::Error::InvalidArgument(format!("a {} array has no redundancy to rebuild a member from", kind.name()))
}

/// What the pool reports about one member: the device now in its slot. The counters run
/// from when the pool was opened, or from the device's replacement of an earlier one.
#[derive(Debug, Clone, Default)]
pub struct MemberStatus {
    pub name: String,
    /// Its storage type's name (`flash`, `hdd`, ...), as recorded at format; `unknown` for a
    /// member missing at open.
    pub storage_type: String,
    pub failed: bool,
    /// A replacement being rebuilt (takes writes, not yet read from).
    pub rebuilding: bool,
    /// The device a rebuilding replacement takes the place of, while it still serves the
    /// slot (it was healthy: the slot keeps its redundancy until the rebuild ends).
    pub outgoing: Option<String>,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Of the bytes written, parity.
    pub parity_bytes_written: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    /// Bytes rewritten from redundancy after they failed their checksum on this member.
    pub repaired_bytes: u64,
    /// Bytes found failing their checksum on this member, whether rewritten or not (a pool
    /// opened read-only reads the good copy but writes nothing).
    pub damaged_bytes: u64,
}

impl MemberStatus {
    /// Its state in one word, as `salsa info` and `salsa stats` show it: `failed`,
    /// `rebuilding` or `ok`.
    pub fn state(&self) -> &'static str {
        if self.failed {
            "failed"
        } else if self.rebuilding {
            "rebuilding"
        } else {
            "ok"
        }
    }
}

/// What the pool reports about a RAID-5 parity buffer.
#[derive(Debug, Clone, Default)]
pub struct ParityBufferStatus {
    pub name: String,
    pub size_bytes: u64,
    /// Rows each of its two banks holds.
    pub rows_per_bank: u64,
    pub banks_written: u64,
    pub bytes_written: u64,
    /// Syncs that had nothing new for it.
    pub banks_skipped: u64,
    /// Why it went out of service (a write or sync failed, or more rows were open than it
    /// holds): the pool pads flushes instead since.
    pub failed: Option<String>,
}

/// One member device and the segments it holds.
pub struct Member {
    pub device: Arc<dyn Device>,
    pub first_segment: u32,
    pub segment_count: u32,
    pub layout: DeviceLayout,
}

/// `r` naming the outgoing member its slot has in `array` now (0: none; see
/// [`Array::outgoing_member_id`]): what the pool metadata records with a rebuild's progress.
pub fn naming_outgoing(array: &dyn Array, r: crate::format::RebuildState) -> crate::format::RebuildState {
    crate::format::RebuildState {
        outgoing_member_id: array.outgoing_member_id(r.slot).unwrap_or(0),
        ..r
    }
}

/// What the log asks of an array (see the module documentation for the invariants).
pub trait Array: Send + Sync {
    fn kind(&self) -> ArrayKind;
    /// The member devices, in pool order.
    fn members(&self) -> &[Member];
    /// Whether buffers handed to the devices must be aligned (some member uses `O_DIRECT`).
    fn needs_aligned_buffers(&self) -> bool;
    /// The storage type `segment` lives on (allocation queues are kept per type).
    fn storage_type(&self, segment: u32) -> StorageType;
    /// Grains of `segment` that can be read: all of them, or those below the write pointer of
    /// a sequential zone.
    fn readable_grains(&self, segment: u32) -> u64;
    /// Makes a segment ready to be written from its start (a sequential zone that holds
    /// anything is reset). Called when a free segment is handed out, which is only after the
    /// metadata that emptied it is durable.
    fn prepare_segment(&self, segment: u32) -> Result<()>;
    /// Tells the devices that nothing needs `segment`'s bytes any more (see
    /// [`Device::discard`]); called when a segment becomes free, so that an SSD's own garbage
    /// collection stops moving them. Advisory: an error costs the device's efficiency, never
    /// data. Zoned members are skipped (a zone is emptied by its reset when it is reused).
    fn discard_segment(&self, segment: u32) -> Result<()>;
    /// Whether discarding `segment` costs work when it is written next on any of its members
    /// ([`Device::discard_reallocates`]).
    fn discard_reallocates(&self, segment: u32) -> bool;
    /// Whether any member's share of `segment` has a hole ([`Device::has_hole`]): its next
    /// write would make a file system allocate.
    fn segment_has_hole(&self, segment: u32) -> bool;
    /// Writes zeros over every online member's share of a free `segment`, so that the file
    /// system allocates its space now, not under a writer's flush (see `Log::fill_holes`).
    /// Zeros are what a discarded segment may read as, so this changes nothing a reader can
    /// rely on; parity of zeros is zero.
    fn fill_segment(&self, segment: u32) -> Result<()>;
    /// Reads whole grains starting at a physical grain address.
    fn read(&self, grain: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes the concatenation of `bufs` (whole grains in all) at a physical grain address, as
    /// one device write. Where a segment must be written in order, the write waits until every
    /// write before it in the segment is done.
    fn write_vectored(&self, grain: u64, bufs: &[std::io::IoSlice<'_>]) -> Result<()>;
    /// [`Array::write_vectored`], with the parity the writer computed of the bytes as it
    /// filled them (`None`: none). An array with parity takes it instead of reading the bytes
    /// again; it trusts [`WriteParity`]'s invariant. Others ignore it.
    fn write_vectored_with_parity(&self, grain: u64, bufs: &[std::io::IoSlice<'_>], parity: Option<WriteParity>) -> Result<()> {
        let _ = parity;
        self.write_vectored(grain, bufs)
    }
    /// Where a write's parity goes, for a writer that computes it as it fills the write
    /// ([`Array::write_vectored_with_parity`]); `None` for an array without parity.
    fn parity_geometry(&self) -> Option<ParityGeometry> {
        None
    }
    /// Writes whole grains starting at a physical grain address.
    fn write(&self, grain: u64, buf: &[u8]) -> Result<()> {
        self.write_vectored(grain, &[std::io::IoSlice::new(buf)])
    }
    /// Syncs every member.
    fn sync_all(&self) -> Result<()>;
    /// Grains of a RAID-5 row (1 for every other layout): a segment that closes, and a
    /// checkpoint, are padded to whole rows, so that no row is left without its parity.
    fn row_grains(&self, _grain_bytes: u32) -> u32 {
        1
    }
    /// Grains a flush must end on, counted from the segment start: a parity array without a
    /// parity buffer wants whole rows, so that no partial row is durable without its parity.
    /// 1 for every other layout, and for RAID-5 with a parity buffer.
    fn flush_alignment_grains(&self, _grain_bytes: u32) -> u32 {
        1
    }
    /// The parity buffer, when the array keeps one: its device, size and what it wrote.
    fn parity_buffer_status(&self) -> Option<ParityBufferStatus> {
        None
    }
    /// Whether the parity buffer went out of service (a write or sync of it failed) since the
    /// last call: the array then syncs the members alone, and the log pads flushes to whole
    /// rows from then on and records in the pool metadata that the pool has no buffer.
    fn take_parity_buffer_failure(&self) -> Option<String> {
        None
    }
    /// The ids of the failed members, when the set changed since the last call (the log then
    /// records it in the pool metadata).
    fn take_failure_change(&self) -> Option<Vec<u64>> {
        None
    }
    /// When more members are out of service than the layout survives, which and how many (as
    /// the error that poisons the pool says it); `None` while the array holds all its data.
    fn members_lost(&self) -> Option<String> {
        None
    }
    /// The ids of the failed members.
    fn failed_ids(&self) -> Vec<u64> {
        Vec::new()
    }
    /// The id of the healthy member that slot `slot`'s rebuild replaces, while it serves the
    /// slot beside its replacement. Its leaving counts as a failure change
    /// ([`Array::take_failure_change`]): the log records it before any write that went around
    /// it counts as durable.
    fn outgoing_member_id(&self, _slot: u32) -> Option<u64> {
        None
    }
    /// One line for people: the layout, its members and how it keeps redundancy.
    fn describe(&self) -> String {
        format!("{} ({} devices)", self.kind().name(), self.members().len())
    }
    /// Health and counters of every member, in slot order.
    fn member_status(&self) -> Vec<MemberStatus> {
        self.members()
            .iter()
            .map(|m| MemberStatus {
                name: m.device.name().to_string(),
                storage_type: storage_type_name(m.device.as_ref()),
                ..MemberStatus::default()
            })
            .collect()
    }
    /// After `buf` (read at `grain`) failed `verify`: tries the array's redundancy for a copy
    /// that passes, leaves the good bytes in `buf` and, with `rewrite`, rewrites the member
    /// that was wrong (a read-only pool passes false: it writes nothing). `Ok(false)` when
    /// there is no redundancy or no copy passes.
    fn read_repair(&self, _grain: u64, _buf: &mut [u8], _verify: &dyn Fn(&[u8]) -> bool, _rewrite: bool) -> Result<bool> {
        Ok(false)
    }
    /// Makes the redundancy of grains `[from_grain, to_grain)` of `segment` (rounded out to
    /// whole rows) agree with the data again: RAID-5 parity is re-derived, RAID-1 mirrors copy
    /// the first healthy member. Recovery calls it for what was being written at a crash.
    fn resync(&self, _segment: u32, _from_grain: u64, _to_grain: u64) -> Result<()> {
        Ok(())
    }
    /// Bytes written to members that have since been replaced: the counters of
    /// [`Array::member_status`] describe the device now in each slot, and the array's
    /// write amplification counts these too.
    fn replaced_bytes_written(&self) -> u64 {
        0
    }
    /// Puts `device` (id `member_id`, laid out as `layout`) in slot `slot` as a replacement
    /// being rebuilt: from now on it takes every write and is not read from, until
    /// [`Array::finish_rebuild`]; the slot's counters start again from zero for it (see
    /// [`Array::replaced_bytes_written`]). Fails on a layout without redundancy, or when the
    /// other members cannot rebuild it.
    fn replace_member(&self, _slot: u32, _device: Arc<dyn Device>, _member_id: u64, _layout: DeviceLayout) -> Result<()> {
        Err(no_redundancy_to_rebuild(self.kind()))
    }
    /// Fails member `slot` on request (an administrator taking a disk out): it is no longer
    /// read or written. Refused when the array would lose data.
    fn fail_member(&self, _slot: u32) -> Result<()> {
        Err(crate::error::Error::InvalidArgument(format!(
            "a {} array has no redundancy: failing a member would lose data",
            self.kind().name()
        )))
    }
    /// Writes the share of slot `slot` of grains `[0, to_grain)` of `segment`, rebuilt from the
    /// other members; returns the bytes written.
    fn rebuild_segment(&self, _slot: u32, _segment: u32, _to_grain: u64) -> Result<u64> {
        Err(crate::error::Error::InvalidArgument("nothing to rebuild".into()))
    }
    /// The slot's rebuild is complete: it is read from again.
    fn finish_rebuild(&self, _slot: u32) {}
    /// What became of a replacement that failed while it was rebuilt, once: its slot is failed
    /// again, or the healthy member it replaced took the slot back. The rebuild ends then.
    fn take_replacement_failure(&self) -> Option<String> {
        None
    }
    /// The current member id of every slot (empty for a version-5 pool).
    fn member_ids(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Ids of the members that hold a share of `segment` (all of them, unless the layout is
    /// linear).
    fn segment_member_ids(&self, _segment: u32) -> Vec<u64> {
        self.member_ids()
    }
    /// The members that hold log data (`None`: every member may). A linear array lets a
    /// member outside the list fail at run time without stopping the pool.
    fn set_log_members(&self, _log_members: Option<&[u64]>) {}
    /// Recovery has made the redundancy agree with what it read: from now on a RAID-1 array
    /// may serve each read from any healthy mirror (until then every read comes from the
    /// first, so that recovery reads what it resyncs the others from).
    fn balance_reads(&self) {}
    /// Whether `segment` lies on a member missing at open (a linear pool opens without a
    /// member that never held log data) or failed since while holding none: it is never
    /// allocated, scanned or read.
    fn is_segment_offline(&self, _segment: u32) -> bool {
        false
    }
    /// Compares the redundancy of grains `[0, to_grain)` of `segment` (whole rows; rows still
    /// being filled are skipped) with the data. Where they disagree, the data pages `pages`
    /// (the segment's, sorted by grain) in that range are checked against their checksums
    /// first: a damaged one is rebuilt from the redundancy, never the redundancy from it. With
    /// `repair`, damaged pages are rewritten and then the redundancy of the rows whose pages
    /// all pass; a row with a page no copy of which passes is left as it is.
    fn scrub(&self, _segment: u32, _to_grain: u64, _repair: bool, _pages: &[PageCheck]) -> Result<ScrubCounts> {
        Ok(ScrubCounts::default())
    }
    /// The devices (and their layouts) that hold a copy of the pool metadata: every member
    /// that can be written.
    fn metadata_devices(&self) -> Vec<(Arc<dyn Device>, DeviceLayout)>;
    /// `device`, one of [`Array::metadata_devices`], failed a write of the pool metadata
    /// (`err`): `Ok` when the array failed it as a member and survives that (the metadata
    /// write goes on with the others), else the error.
    fn metadata_write_failed(&self, _device: &Arc<dyn Device>, err: crate::error::Error) -> crate::error::Result<()> {
        Err(err)
    }
}
