//! Redundant and striped arrays: RAID-0, RAID-1 and RAID-5 over flat members, written only in
//! whole segments of the log, so that no write ever reads old data or parity.
//!
//! Owns: the placement of a segment's bytes on the members ([`stripe`]), the parity of the rows
//! being filled ([`rows`]), member health (a member that fails a write, or too many reads, is
//! failed and no longer used; the log makes the failure durable in the pool metadata at its
//! next flush), degraded reads (RAID-1 from another mirror, RAID-5 from the row's other
//! members), repair of a page that fails its checksum on one member, and the resync of the
//! rows that were being written when the pool stopped, and the outgoing member of a slot whose
//! healthy device is being replaced (it keeps serving the slot until the rebuild ends).
//!
//! Invariants: every member holds a segment in the same place (`segments_offset + segment *
//! member_segment_bytes`); a RAID-5 row's parity is written only when the row is complete, by
//! the write that completes it, and reaches the device before the flush that makes the row's
//! data durable returns (the log pads flushes to whole rows); until recovery has resynced the
//! mirrors, a RAID-1 read uses the first healthy member, so what recovery read is what it
//! resyncs the others from (after, reads are balanced over the mirrors); I/O is never sent
//! to a failed member; while a slot has an outgoing member in service, every write, fill and
//! sync of the slot reaches both devices, and its reads come from the outgoing one.

pub mod parity_buffer;
pub mod rows;
pub mod stripe;
pub mod write_parity;

use super::member_io;
use super::{Array, ArrayKind, Member, MemberStatus, PageCheck, ScrubCounts};
use crate::device::{Device, StorageType};
use crate::error::{Error, Result};
use crate::format::DeviceLayout;
use parity_buffer::ParityBuffer;
use parking_lot::{Mutex, RwLock};
use rows::{LandedRow, OpenRows};
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use stripe::{Piece, Stripe};
use write_parity::{ParityGeometry, WriteParity};

/// One member's request of a striped read: (member, offset, bytes, the buffers to read into).
type MemberRead<'a> = (u32, u64, u64, Vec<std::io::IoSliceMut<'a>>);
/// A failed member read: its error, the device it was sent to (none: the read panicked), and
/// whether that was an outgoing member.
type ReadFailure = (std::io::Error, Option<Arc<dyn Device>>, bool);
/// What became of a [`MemberRead`]: (member, device offset, bytes, whether it went to an
/// outgoing member, or how it failed).
type MemberReadResult = (u32, u64, u64, std::result::Result<bool, ReadFailure>);

/// Below this many bytes per member, an array write goes to the members one after another;
/// above, to all of them at once.
const PARALLEL_IO_BYTES: u64 = 64 << 10;

/// Read errors after which a member is failed (each one is served from redundancy).
pub const READ_ERRORS_TO_FAIL: u64 = 8;

/// Health and counters of one member.
#[derive(Default)]
struct Health {
    failed: AtomicBool,
    /// A replacement being filled: it takes writes but is not read from.
    rebuilding: AtomicBool,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    parity_bytes_written: AtomicU64,
    read_errors: AtomicU64,
    write_errors: AtomicU64,
    repaired_bytes: AtomicU64,
    damaged_bytes: AtomicU64,
}

impl Health {
    /// Zeroes the counters for a new device in the slot; returns the bytes the old one had
    /// written.
    fn reset_counters(&self) -> u64 {
        for c in [
            &self.bytes_read,
            &self.parity_bytes_written,
            &self.read_errors,
            &self.write_errors,
            &self.repaired_bytes,
            &self.damaged_bytes,
        ] {
            c.store(0, SeqCst);
        }
        self.bytes_written.swap(0, SeqCst)
    }
}

/// The healthy device a replacement takes the place of, kept in service until the rebuild
/// ends, as MD's `--replace` and ZFS's `zpool replace` keep it: the slot's reads come from it
/// and its writes go to it as well as to the replacement, so the array keeps its redundancy
/// while the replacement is filled. It leaves at the first error (the replacement and the
/// redundancy take over; the leaving is recorded in the pool metadata at the next sync). The
/// pool metadata names it, so an open given it beside its replacement takes it back
/// ([`RaidArray::new`]); otherwise the rebuild resumes from the redundancy. It places segments
/// where its replacement does (kept only then), so an offset on the slot's device is the same
/// offset on it.
struct Outgoing {
    device: Arc<dyn Device>,
    layout: DeviceLayout,
    member_id: u64,
}

/// A RAID-0, RAID-1 or RAID-5 array.
pub struct RaidArray {
    /// As opened (for reporting the original layout); I/O goes through `slots`.
    members: Vec<Member>,
    /// The device and layout of every slot: a replacement swaps them.
    slots: Vec<RwLock<(Arc<dyn Device>, DeviceLayout)>>,
    ids: Mutex<Vec<u64>>,
    stripe: Stripe,
    grain_bytes: u64,
    grains_per_segment: u64,
    health: Vec<Health>,
    rows: OpenRows,
    /// A member failed since the pool metadata last recorded the failed set.
    failure_changed: AtomicBool,
    aligned_buffers: bool,
    /// RAID-5 with a persistent parity buffer: flushes need not end on a row.
    parity_buffer: Option<ParityBuffer>,
    /// Why the parity buffer went out of service, once it did: a failed bank write is not a
    /// reason to stop a redundant pool, which pads flushes instead (see
    /// [`Array::take_parity_buffer_failure`]).
    parity_buffer_failed: Mutex<Option<String>>,
    /// Set with `parity_buffer_failed`, until the log has taken it.
    parity_buffer_failure_unrecorded: AtomicBool,
    /// Held from taking the open rows' landed parity to persisting it, so that banks are
    /// written in the order their contents were taken.
    parity_sync: Mutex<()>,
    /// What members since replaced had written ([`Array::replaced_bytes_written`]).
    replaced_bytes_written: AtomicU64,
    /// Per slot, the outgoing member still in service while its replacement is rebuilt.
    outgoing: Vec<RwLock<Option<Arc<Outgoing>>>>,
    /// What became of a replacement that failed while it was rebuilt, until the rebuild
    /// takes it ([`Array::take_replacement_failure`]).
    replacement_failure: Mutex<Option<String>>,
    /// RAID-1 reads go to the mirror [`MirrorReads`] picks (after recovery), else the first.
    balance: AtomicBool,
    mirror_reads: MirrorReads,
}

/// Where RAID-1 reads go once they are balanced, as MD's `read_balance` chooses: the mirror
/// whose last read ended where this one starts (a sequential stream stays on one disk),
/// else the one with the fewest reads in flight, and of those the one whose last read ended
/// nearest (on a disk, the shortest seek), ties in turn.
struct MirrorReads {
    /// Per member: where its last read ended, from the start of its segment area.
    head: Vec<AtomicU64>,
    /// Per member: reads in flight.
    in_flight: Vec<AtomicU64>,
    turn: AtomicU64,
}

impl MirrorReads {
    fn new(members: usize) -> MirrorReads {
        MirrorReads {
            head: (0..members).map(|_| AtomicU64::new(0)).collect(),
            in_flight: (0..members).map(|_| AtomicU64::new(0)).collect(),
            turn: AtomicU64::new(0),
        }
    }

    /// The mirror of `members` that passes `healthy` (at least one does) to read offset `at`
    /// from.
    fn pick(&self, members: u32, healthy: impl Fn(u32) -> bool, at: u64) -> u32 {
        if let Some(m) = (0..members).find(|&m| healthy(m) && self.head[m as usize].load(SeqCst) == at) {
            return m;
        }
        let turn = self.turn.fetch_add(1, SeqCst) as u32 % members;
        // Starting at a different mirror each time, so that exact ties take turns.
        (0..members)
            .map(|i| (turn + i) % members)
            .filter(|&m| healthy(m))
            .min_by_key(|&m| {
                let i = m as usize;
                (self.in_flight[i].load(SeqCst), self.head[i].load(SeqCst).abs_diff(at))
            })
            .unwrap_or(0)
    }
}

/// The bytes `[at, at + len)` of the concatenation of `bufs`, as slices.
fn sub_slices<'b>(bufs: &'b [IoSlice<'_>], at: u64, len: u64) -> Vec<&'b [u8]> {
    let mut out = Vec::new();
    let (mut skip, mut left) = (at as usize, len as usize);
    for b in bufs {
        let b: &'b [u8] = b;
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let n = (b.len() - skip).min(left);
        out.push(&b[skip..skip + n]);
        left -= n;
        skip = 0;
        if left == 0 {
            break;
        }
    }
    out
}

impl RaidArray {
    /// An array of `kind` over `members` (all in slot order, a missing one given as a device
    /// that fails every I/O and listed in `failed`); `rebuilding`: the slot of a replacement
    /// whose rebuild is not finished, with the healthy member it replaces (and its id) when
    /// that one serves the slot until the rebuild ends; `parity_buffer`: a RAID-5 array's
    /// parity buffer and the rows it kept (see [`parity_buffer`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: ArrayKind,
        members: Vec<Member>,
        ids: Vec<u64>,
        failed: &[u64],
        rebuilding: Option<(u32, Option<(Member, u64)>)>,
        unit_bytes: u64,
        segment_bytes: u64,
        grain_bytes: u64,
        parity_buffer: Option<(ParityBuffer, Vec<LandedRow>)>,
    ) -> Result<RaidArray> {
        if parity_buffer.is_some() && kind != ArrayKind::Raid5 {
            return Err(Error::InvalidConfig(format!(
                "a parity buffer serves a raid5 array, not {}",
                kind.name()
            )));
        }
        let (parity_buffer, kept_rows) = match parity_buffer {
            Some((b, rows)) => (Some(b), rows),
            None => (None, Vec::new()),
        };
        let stripe = Stripe::new(kind, members.len() as u32, unit_bytes, segment_bytes);
        let n_members = members.len();
        let health: Vec<Health> = members.iter().map(|_| Health::default()).collect();
        let (rebuilding, outgoing) = match rebuilding {
            Some((slot, outgoing)) => (Some(slot), outgoing),
            None => (None, None),
        };
        for (i, id) in ids.iter().enumerate() {
            if failed.contains(id) {
                health[i].failed.store(true, SeqCst);
            } else if rebuilding == Some(i as u32) {
                health[i].rebuilding.store(true, SeqCst);
            }
        }
        let a = RaidArray {
            aligned_buffers: members.iter().any(|m| m.device.alignment_bytes() > 512),
            rows: OpenRows::new(stripe, grain_bytes, parity_buffer.is_some()),
            slots: members.iter().map(|m| RwLock::new((m.device.clone(), m.layout))).collect(),
            outgoing: members.iter().map(|_| RwLock::new(None)).collect(),
            replacement_failure: Mutex::new(None),
            members,
            ids: Mutex::new(ids),
            stripe,
            grain_bytes,
            grains_per_segment: segment_bytes / grain_bytes,
            health,
            failure_changed: AtomicBool::new(false),
            parity_buffer,
            parity_buffer_failed: Mutex::new(None),
            parity_buffer_failure_unrecorded: AtomicBool::new(false),
            parity_sync: Mutex::new(()),
            replaced_bytes_written: AtomicU64::new(0),
            balance: AtomicBool::new(false),
            mirror_reads: MirrorReads::new(n_members),
        };
        if let (Some(slot), Some((member, member_id))) = (rebuilding, outgoing) {
            a.attach_outgoing(slot, member, member_id);
        }
        let row_grains = (a.stripe.row_bytes() / grain_bytes) as usize;
        let grains = a.grains_per_segment;
        for r in kept_rows {
            let rows_per_segment = grains / row_grains as u64;
            if r.covered.len() != row_grains || r.row >= rows_per_segment || r.segment as u64 >= a.segments_held() {
                return Err(Error::Corrupt(format!(
                    "parity buffer entry for row {} of segment {} does not fit this array",
                    r.row, r.segment
                )));
            }
            a.rows.restore(r);
        }
        let failed = a.failed_count();
        let tolerated = kind.tolerated_failures(a.members.len() as u32);
        if failed > tolerated {
            return Err(Error::InvalidConfig(format!(
                "{failed} members of this {} array are failed or missing; it survives {tolerated}",
                kind.name()
            )));
        }
        Ok(a)
    }

    /// Puts `member`, the healthy member slot `slot`'s rebuild replaces, back in service beside
    /// its replacement (at open), when it places segments where the replacement does and the
    /// slot is still being rebuilt.
    fn attach_outgoing(&self, slot: u32, member: Member, member_id: u64) {
        let i = slot as usize;
        let place = self.slots[i].read();
        let same_place = place.1.segments_offset_bytes == member.layout.segments_offset_bytes;
        if !self.health[i].rebuilding.load(SeqCst) || !same_place {
            tracing::warn!(
                "{} is not taken beside {}: {}; the slot is rebuilt from the redundancy",
                member.device.name(),
                place.0.name(),
                if same_place {
                    "the slot is not being rebuilt"
                } else {
                    "they place segments differently"
                }
            );
            return;
        }
        *self.outgoing[i].write() = Some(Arc::new(Outgoing {
            device: member.device,
            layout: member.layout,
            member_id,
        }));
    }

    /// Members that do not hold their share of the redundancy: failed, or being rebuilt.
    fn failed_count(&self) -> u32 {
        (0..self.members.len() as u32).filter(|m| self.is_failed(*m)).count() as u32
    }

    /// Whether member `m` cannot be read from: failed, or being rebuilt without an outgoing
    /// member in service.
    fn is_failed(&self, m: u32) -> bool {
        let h = &self.health[m as usize];
        h.failed.load(SeqCst) || (h.rebuilding.load(SeqCst) && self.outgoing_of(m).is_none())
    }

    /// The outgoing member serving slot `m`, if it has one.
    fn outgoing_of(&self, m: u32) -> Option<Arc<Outgoing>> {
        self.outgoing[m as usize].read().clone()
    }

    /// Where slot `m` is read from: the outgoing member while one serves it (at the same
    /// offsets), else its device. The second item says which.
    fn reader(&self, m: u32) -> (Arc<dyn Device>, bool) {
        // Under the slot's lock, which a replacement holds while it sets the outgoing member
        // and puts the new device in: a read never sees the new device without it.
        let place = self.slots[m as usize].read();
        match self.outgoing_of(m) {
            Some(out) => (out.device.clone(), true),
            None => (place.0.clone(), false),
        }
    }

    /// Whether `device` is slot `m`'s device now (an error of one that left the slot is not
    /// the slot's).
    fn is_slot_device(&self, m: u32, device: &Arc<dyn Device>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.device(m)), Arc::as_ptr(device))
    }

    /// Takes slot `m`'s outgoing member out of service after `why`: the slot is then read
    /// from the redundancy until its rebuild ends. `Err` when that leaves the array without
    /// its data (another member failed meanwhile).
    fn drop_outgoing(&self, m: u32, why: &str) -> Result<()> {
        let Some(out) = self.outgoing[m as usize].write().take() else {
            return Ok(());
        };
        // Recorded at the next sync, before the writes that go around it count as durable.
        self.failure_changed.store(true, SeqCst);
        tracing::error!(
            "{}, being replaced in slot {m}, left the array before the rebuild ended: {why}",
            out.device.name()
        );
        self.still_has_its_data(&why)
    }

    /// `Ok` while no more members are out of service than the array survives; else the error
    /// that poisons the pool, naming `why` the last one left.
    fn still_has_its_data(&self, why: &dyn std::fmt::Display) -> Result<()> {
        match Array::members_lost(self) {
            Some(lost) => Err(Error::Poisoned(format!("{lost} ({why})"))),
            None => Ok(()),
        }
    }

    /// Applies `op` at `offset` to `out`, the outgoing member slot `m` had when the slot's
    /// own I/O began (taken before it, so that an I/O that reached the replacement reaches
    /// the outgoing member too, even if the replacement failed meanwhile and gave it the slot
    /// back). An error takes it out of service, or fails it if it has the slot back.
    fn on_outgoing(
        &self,
        m: u32,
        out: Option<Arc<Outgoing>>,
        offset: u64,
        what: &'static str,
        op: impl FnOnce(&dyn Device, u64) -> std::io::Result<()>,
    ) -> Result<()> {
        let Some(out) = out else {
            return Ok(());
        };
        let Err(e) = op(out.device.as_ref(), offset) else {
            return Ok(());
        };
        if self.is_slot_device(m, &out.device) {
            return self.write_failed(m, &out.device, Error::device_io(&*out.device, what, offset, e));
        }
        if self.outgoing_of(m).is_some_and(|now| Arc::ptr_eq(&now, &out)) {
            return self.drop_outgoing(m, &format!("{what} at byte {offset}: {e}"));
        }
        Ok(())
    }

    fn device(&self, m: u32) -> Arc<dyn Device> {
        self.slots[m as usize].read().0.clone()
    }

    /// Byte offset on member `m` of `member_offset` in `segment`'s area.
    fn offset(&self, m: u32, segment: u32, member_offset: u64) -> u64 {
        self.slots[m as usize].read().1.segments_offset_bytes + segment as u64 * self.stripe.member_segment_bytes() + member_offset
    }

    /// Applies `op` (named `what` in its error) to each member's whole share of `segment`,
    /// parity included, skipping failed members; stops at the first error.
    fn on_online_shares(&self, segment: u32, what: &'static str, op: impl Fn(&dyn Device, u64, u64) -> std::io::Result<()>) -> Result<()> {
        for m in 0..self.members.len() as u32 {
            if self.health[m as usize].failed.load(SeqCst) {
                continue;
            }
            let out = self.outgoing_of(m);
            let (device, offset) = (self.device(m), self.offset(m, segment, 0));
            op(device.as_ref(), offset, self.stripe.member_segment_bytes()).map_err(|e| self.io_error(m, what, offset, e))?;
            self.on_outgoing(m, out, offset, what, |d, at| op(d, at, self.stripe.member_segment_bytes()))?;
        }
        Ok(())
    }

    fn io_error(&self, m: u32, op: &'static str, offset: u64, source: std::io::Error) -> Error {
        Error::device_io(&*self.device(m), op, offset, source)
    }

    /// Counts a failed write (or sync) of member `m`'s `device`, and fails the member
    /// ([`RaidArray::fail`]).
    fn write_failed(&self, m: u32, device: &Arc<dyn Device>, err: Error) -> Result<()> {
        self.health[m as usize].write_errors.fetch_add(1, SeqCst);
        self.fail(m, device, err)
    }

    /// Fails member `m` after an I/O error of `device`, unless that device is no longer the
    /// slot's. `Ok` while the array still has its data; the error itself (which poisons the
    /// pool) once it does not.
    fn fail(&self, m: u32, device: &Arc<dyn Device>, err: Error) -> Result<()> {
        if !self.is_slot_device(m, device) {
            // The device already left the slot (a replacement that failed, whose slot went
            // back to the member it replaced): the error is not the slot's.
            return Ok(());
        }
        let h = &self.health[m as usize];
        if h.rebuilding.load(SeqCst) && self.restore_outgoing(m, &err) {
            return Ok(());
        }
        let newly_failed = if h.rebuilding.load(SeqCst) {
            // A replacement that fails while it is rebuilt leaves its slot failed, as the
            // member it replaced was; the rebuild ends and the pool serves degraded. Said
            // before the failure shows, so that the rebuild finds why when it sees it, and
            // said once: the lock makes "not yet failed, so say why" one step, so that a
            // second writer failing on the same device cannot say it again after the
            // rebuild took the first (a stale reason that ended the next replacement).
            let mut why = self.replacement_failure.lock();
            let newly_failed = !h.failed.load(SeqCst);
            if newly_failed {
                *why = Some(format!(
                    "{} ({err}); slot {m} is failed, as before: replace it again",
                    self.device(m).name()
                ));
                h.failed.store(true, SeqCst);
            }
            newly_failed
        } else {
            !h.failed.swap(true, SeqCst)
        };
        if newly_failed {
            tracing::error!("member {} failed: {err}", self.device(m).name());
            self.failure_changed.store(true, SeqCst);
        }
        h.rebuilding.store(false, SeqCst);
        self.still_has_its_data(&err)
    }

    /// A replacement in slot `m` failed while it was rebuilt (`err`): if the healthy member it
    /// replaces still serves the slot (it took every write), that member takes the slot back,
    /// as MD does when the replacement of `--replace` fails. Returns whether it did.
    fn restore_outgoing(&self, m: u32, err: &Error) -> bool {
        let mut place = self.slots[m as usize].write();
        let Some(out) = self.outgoing[m as usize].write().take() else {
            return false;
        };
        let msg = format!(
            "{} ({err}); {} serves slot {m} again, and the pool keeps its redundancy",
            place.0.name(),
            out.device.name()
        );
        tracing::error!("the replacement failed while it was rebuilt: {msg}");
        // Said before the slot changes, so that the rebuild finds why when it sees it.
        *self.replacement_failure.lock() = Some(msg);
        *place = (out.device.clone(), out.layout);
        drop(place);
        self.ids.lock()[m as usize] = out.member_id;
        let h = &self.health[m as usize];
        // The counters describe the device in the slot again (the array's total keeps what
        // the replacement wrote).
        self.replaced_bytes_written.fetch_add(h.reset_counters(), SeqCst);
        h.rebuilding.store(false, SeqCst);
        true
    }

    /// Reads from member `m`; counts the bytes, and errors towards failing it.
    fn read_member(&self, m: u32, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.is_failed(m) {
            return Err(Error::Io {
                device: self.device(m).name().to_string(),
                op: "read",
                offset,
                source: std::io::Error::other("the member has failed"),
            });
        }
        let (device, outgoing) = self.reader(m);
        match device.read_at(buf, offset) {
            // The slot's counters are its device's: an outgoing member's reads are not.
            Ok(()) if outgoing => Ok(()),
            Ok(()) => {
                self.health[m as usize].bytes_read.fetch_add(buf.len() as u64, SeqCst);
                Ok(())
            }
            Err(source) if outgoing => Err(self.outgoing_read_failed(m, &*device, offset, source)?),
            Err(source) => Err(self.read_failed(m, &device, offset, source)?),
        }
    }

    /// A read of slot `m`'s outgoing member `device` failed: it leaves (the slot is read from
    /// the redundancy from now on). Returns the error to report for this read, as
    /// [`RaidArray::read_failed`] does.
    fn outgoing_read_failed(&self, m: u32, device: &dyn Device, at: u64, source: std::io::Error) -> Result<Error> {
        let e = Error::device_io(device, "read", at, source);
        self.drop_outgoing(m, &e.to_string())?;
        Ok(e)
    }

    /// Counts a failed read of member `m` and fails the member at [`READ_ERRORS_TO_FAIL`];
    /// returns the error to report for this read (the caller may serve it from redundancy),
    /// or `Err` when failing the member leaves the array without its data.
    fn read_failed(&self, m: u32, device: &Arc<dyn Device>, offset: u64, source: std::io::Error) -> Result<Error> {
        let e = Error::device_io(&**device, "read", offset, source);
        if self.health[m as usize].read_errors.fetch_add(1, SeqCst) + 1 < READ_ERRORS_TO_FAIL {
            return Ok(e);
        }
        let msg = e.to_string();
        self.fail(m, device, e)?;
        Ok(Error::Io {
            device: device.name().to_string(),
            op: "read",
            offset,
            source: std::io::Error::other(msg),
        })
    }

    /// Writes to member `m` unless it has failed (a member being rebuilt takes writes), and
    /// to the outgoing member serving its slot if there is one; a failure fails the member.
    fn write_member(&self, m: u32, bufs: &[IoSlice<'_>], offset: u64, parity_bytes: u64) -> Result<()> {
        let out = self.outgoing_of(m);
        self.write_slot_device(m, bufs, offset, parity_bytes)?;
        self.on_outgoing(m, out, offset, "write", |d, at| d.write_vectored_at(bufs, at))
    }

    /// [`RaidArray::write_member`] to the slot's device alone (a rebuild's copy, which the
    /// outgoing member holds already).
    fn write_slot_device(&self, m: u32, bufs: &[IoSlice<'_>], offset: u64, parity_bytes: u64) -> Result<()> {
        if self.health[m as usize].failed.load(SeqCst) {
            return Ok(());
        }
        let h = &self.health[m as usize];
        let device = self.device(m);
        match device.write_vectored_at(bufs, offset) {
            Ok(()) => {
                let n: usize = bufs.iter().map(|b| b.len()).sum();
                h.bytes_written.fetch_add(n as u64, SeqCst);
                h.parity_bytes_written.fetch_add(parity_bytes, SeqCst);
                Ok(())
            }
            Err(source) => {
                self.write_failed(m, &device, Error::device_io(&*device, "write", offset, source))?;
                if !Arc::ptr_eq(&device, &self.device(m)) {
                    // The replacement failed and the member it replaced took the slot back:
                    // the write goes to it.
                    return self.write_slot_device(m, bufs, offset, parity_bytes);
                }
                Ok(())
            }
        }
    }

    /// A buffer for device I/O of `len` bytes.
    fn scratch(&self, len: usize) -> AlignedScratch {
        AlignedScratch(crate::util::AlignedBuf::zeroed(len))
    }

    /// Reads `buf.len()` bytes at `member_offset` of data unit `p` of `segment` without using
    /// the member that holds it: RAID-5 from the row's other members and its parity.
    fn reconstruct(&self, segment: u32, p: &Piece, buf: &mut [u8]) -> Result<()> {
        let unit = self.stripe.unit_bytes;
        let in_unit = (p.member_offset % unit) as usize;
        let gb = self.grain_bytes as usize;
        let gpu = (unit / self.grain_bytes) as usize;
        let parity_member = self
            .stripe
            .parity_member(p.row)
            .ok_or_else(|| Error::Corrupt("reconstruction without parity".into()))?;
        let snapshot = self.rows.snapshot(segment, p.row);
        match &snapshot {
            Some(s) => buf.copy_from_slice(&s.parity[in_unit..in_unit + buf.len()]),
            None => self.read_member(parity_member, buf, self.offset(parity_member, segment, p.member_offset))?,
        }
        let mut tmp = self.scratch(buf.len());
        for m in 0..self.members.len() as u32 {
            if m == p.member || m == parity_member {
                continue;
            }
            let u = self.stripe.unit_of(p.row, m).expect("a data member");
            self.read_member(m, &mut tmp.0, self.offset(m, segment, p.member_offset))?;
            for (g, (d, s)) in buf.chunks_mut(gb).zip(tmp.0.chunks(gb)).enumerate() {
                // Of an open row, only grains written so far are in its parity.
                let covered = snapshot.as_ref().is_none_or(|s| s.contributed[u as usize * gpu + in_unit / gb + g]);
                if covered {
                    for (x, y) in d.iter_mut().zip(s) {
                        *x ^= *y;
                    }
                }
            }
        }
        Ok(())
    }

    /// RAID-1: reads every healthy mirror's copy of `buf.len()` bytes at `offset` of
    /// `segment`, leaves in `buf` the first that passes `verify`, counts the copies that fail
    /// as damage and, with `rewrite`, overwrites them with it. Returns how many failed, or
    /// `None` when none passes.
    fn repair_mirrors(
        &self,
        segment: u32,
        offset: u64,
        buf: &mut [u8],
        verify: &dyn Fn(&[u8]) -> bool,
        rewrite: bool,
    ) -> Result<Option<usize>> {
        let mut good = None;
        let mut bad = Vec::new();
        for m in (0..self.members.len() as u32).filter(|m| !self.is_failed(*m)) {
            if good.is_some() {
                // Every later mirror is compared with the good copy, not just checked.
                let mut copy = self.scratch(buf.len());
                if self.read_member(m, &mut copy.0, self.offset(m, segment, offset)).is_err() || !verify(&copy.0) {
                    bad.push(m);
                }
            } else if self.read_member(m, buf, self.offset(m, segment, offset)).is_ok() && verify(buf) {
                good = Some(m);
            } else {
                bad.push(m);
            }
        }
        if good.is_none() {
            return Ok(None);
        }
        for &m in &bad {
            let h = &self.health[m as usize];
            h.damaged_bytes.fetch_add(buf.len() as u64, SeqCst);
            if rewrite && !self.is_failed(m) {
                self.write_member(m, &[IoSlice::new(buf)], self.offset(m, segment, offset), 0)?;
                h.repaired_bytes.fetch_add(buf.len() as u64, SeqCst);
            }
        }
        Ok(Some(bad.len()))
    }

    /// Checks the pages of `pages` that overlap segment bytes `[from, to)` against their
    /// checksums, rebuilding (and with `repair` rewriting) those that fail from the
    /// redundancy. Returns the counts, and whether every page now passes.
    fn scrub_pages(&self, segment: u32, from: u64, to: u64, pages: &[PageCheck], repair: bool) -> Result<(ScrubCounts, bool)> {
        let base = segment as u64 * self.grains_per_segment;
        let mut counts = ScrubCounts::default();
        let mut all_good = true;
        let first = pages.partition_point(|p| (p.grain - base) * self.grain_bytes + p.bytes as u64 <= from);
        for page in pages[first..].iter().take_while(|p| (p.grain - base) * self.grain_bytes < to) {
            let mut buf = self.scratch(page.bytes as usize);
            let verify = |b: &[u8]| page.passes(b);
            let intact = match self.stripe.kind {
                // A mirror read takes one copy; each copy is checked.
                ArrayKind::Raid1 => {
                    match self.repair_mirrors(segment, (page.grain - base) * self.grain_bytes, &mut buf.0, &verify, repair)? {
                        None => Some(false),
                        Some(0) => None,
                        Some(_) => Some(true),
                    }
                }
                _ => {
                    self.read(page.grain, &mut buf.0)?;
                    if verify(&buf.0) {
                        None
                    } else {
                        Some(self.read_repair(page.grain, &mut buf.0, &verify, repair)?)
                    }
                }
            };
            // None: intact; Some(found): damaged, and whether a good copy was found.
            if let Some(found) = intact {
                counts.pages_damaged += 1;
                counts.pages_repairable += found as u64;
                counts.pages_repaired += (found && repair) as u64;
                all_good &= found && repair;
            }
        }
        Ok((counts, all_good))
    }

    /// RAID-1: whether every healthy mirror holds the same `len` bytes at `at` of `segment`;
    /// with `rewrite`, every mirror that does not gets the first healthy one's bytes.
    fn mirrors_agree(&self, segment: u32, at: u64, len: usize, rewrite: bool) -> Result<bool> {
        let live: Vec<u32> = (0..self.members.len() as u32).filter(|m| !self.is_failed(*m)).collect();
        let mut first = self.scratch(len);
        let mut other = self.scratch(len);
        self.read_member(live[0], &mut first.0, self.offset(live[0], segment, at))?;
        let mut agree = true;
        for &m in &live[1..] {
            let off = self.offset(m, segment, at);
            self.read_member(m, &mut other.0, off)?;
            if other.0[..] != first.0[..] {
                agree = false;
                if !rewrite {
                    break;
                }
                self.write_member(m, &[IoSlice::new(&first.0)], off, 0)?;
            }
        }
        Ok(agree)
    }

    /// RAID-5: whether row `r` of `segment` holds the parity of its data; with `rewrite`, a
    /// parity that does not is rewritten from the data.
    fn parity_agrees(&self, segment: u32, r: u64, rewrite: bool) -> Result<bool> {
        let unit = self.stripe.unit_bytes;
        let (p, parity) = self.row_parity(segment, r)?;
        let mut on_disk = self.scratch(unit as usize);
        let off = self.offset(p, segment, r * unit);
        self.read_member(p, &mut on_disk.0, off)?;
        let agrees = on_disk.0[..] == parity.0[..];
        if !agrees && rewrite {
            self.write_member(p, &[IoSlice::new(&parity.0)], off, unit)?;
        }
        Ok(agrees)
    }

    /// Row `r` of `segment`'s parity member and the parity its data units on the devices
    /// give (what scrub compares and resync writes).
    fn row_parity(&self, segment: u32, r: u64) -> Result<(u32, AlignedScratch)> {
        let unit = self.stripe.unit_bytes;
        let p = self.stripe.parity_member(r).expect("RAID-5 rows have parity");
        let mut parity = self.scratch(unit as usize);
        let mut tmp = self.scratch(unit as usize);
        for m in (0..self.members.len() as u32).filter(|m| *m != p) {
            self.read_member(m, &mut tmp.0, self.offset(m, segment, r * unit))?;
            for (d, s) in parity.0.iter_mut().zip(tmp.0.iter()) {
                *d ^= *s;
            }
        }
        Ok((p, parity))
    }

    /// Reads the data pieces `pieces` of `segment` into `buf` (they cover it, in order): one
    /// vectored read per healthy member, straight into `buf`, the parity units between its
    /// pieces read into a scratch buffer so the run stays one request; what a failed member
    /// holds is reconstructed.
    fn read_pieces(&self, segment: u32, pieces: &[Piece], buf: &mut [u8]) -> Result<()> {
        let n = self.members.len();
        // `buf` cut into the pieces, to be handed to the members' reads.
        let mut slices: Vec<Option<&mut [u8]>> = Vec::with_capacity(pieces.len());
        let mut rest = &mut buf[..];
        for p in pieces {
            let (head, tail) = rest.split_at_mut(p.len as usize);
            slices.push(Some(head));
            rest = tail;
        }
        let mut by_member: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, p) in pieces.iter().enumerate() {
            by_member[p.member as usize].push(i);
        }
        let unit = self.stripe.unit_bytes;
        let mut lost: Vec<usize> = Vec::new();
        // Gaps between a member's pieces are whole parity units (RAID-5): they are read into
        // scratch so that each member gets one request.
        let gap_bytes = |list: &[usize]| -> u64 {
            list.windows(2)
                .map(|w| pieces[w[1]].member_offset - (pieces[w[0]].member_offset + pieces[w[0]].len))
                .sum()
        };
        let mut gap_bufs: Vec<AlignedScratch> = by_member
            .iter()
            .map(|l| self.scratch(gap_bytes(l).max(unit).min(unit * 64) as usize))
            .collect();
        // One job per healthy member: (member, member offset, bytes, the pieces to read into).
        let mut jobs: Vec<MemberRead<'_>> = Vec::new();
        for ((m, list), gap_buf) in by_member.iter().enumerate().zip(gap_bufs.iter_mut()) {
            let Some(&first) = list.first() else { continue };
            if self.is_failed(m as u32) {
                lost.extend(list);
                continue;
            }
            let start = pieces[first].member_offset;
            let mut iov: Vec<std::io::IoSliceMut<'_>> = Vec::with_capacity(2 * list.len());
            let mut gap_rest = &mut gap_buf.0[..];
            let mut at = start;
            let mut job_start = start;
            for &i in list {
                let p = &pieces[i];
                if p.member_offset > at {
                    let gap = (p.member_offset - at) as usize;
                    if gap > gap_rest.len() {
                        // Out of scratch (a very long read): this member's request ends here.
                        jobs.push((m as u32, job_start, at - job_start, std::mem::take(&mut iov)));
                        job_start = p.member_offset;
                    } else {
                        let (g, r) = std::mem::take(&mut gap_rest).split_at_mut(gap);
                        iov.push(std::io::IoSliceMut::new(g));
                        gap_rest = r;
                    }
                }
                let s = slices[i].take().expect("each piece is read once");
                at = p.member_offset + p.len;
                iov.push(std::io::IoSliceMut::new(s));
            }
            jobs.push((m as u32, job_start, at - job_start, iov));
        }
        // Each member's request at its device offset.
        let jobs: Vec<MemberRead<'_>> = jobs
            .into_iter()
            .map(|(m, start, len, iov)| (m, self.offset(m, segment, start), len, iov))
            .collect();
        let results = self.run_member_reads(jobs);
        self.count_member_reads(results, &by_member, &mut lost)?;
        self.rebuild_lost_pieces(segment, pieces, lost, buf)
    }

    /// Runs each member's request of [`RaidArray::read_pieces`], at once when two or more are
    /// large, and returns what became of each.
    fn run_member_reads(&self, jobs: Vec<MemberRead<'_>>) -> Vec<MemberReadResult> {
        let run = |(m, offset, len, mut iov): MemberRead<'_>| {
            let (device, outgoing) = self.reader(m);
            let r = device.read_vectored_at(&mut iov, offset);
            (m, offset, len, r.map(|()| outgoing).map_err(|e| (e, Some(device), outgoing)))
        };
        let parallel = jobs.len() >= 2 && jobs.iter().filter(|j| j.2 >= PARALLEL_IO_BYTES).count() >= 2;
        if !parallel {
            return jobs.into_iter().map(run).collect();
        }
        let what: Vec<(u32, u64, u64)> = jobs.iter().map(|j| (j.0, j.1, j.2)).collect();
        member_io::run_all(jobs.into_iter().map(|j| move || run(j)).collect())
            .into_iter()
            .zip(what)
            .map(|(r, (m, offset, len))| {
                r.unwrap_or_else(|| (m, offset, len, Err((std::io::Error::other("a member read panicked"), None, false))))
            })
            .collect()
    }

    /// Counts the bytes each member read; a member whose read failed has its pieces (of
    /// `by_member`) added to `lost`, to be rebuilt from the redundancy, and is failed or, when
    /// outgoing, leaves. `Err` when a RAID-0 member fails: no copy can serve it.
    fn count_member_reads(&self, results: Vec<MemberReadResult>, by_member: &[Vec<usize>], lost: &mut Vec<usize>) -> Result<()> {
        for (m, offset, len, r) in results {
            let h = &self.health[m as usize];
            match r {
                // The slot's counters are its device's: an outgoing member's reads are not.
                Ok(true) => {}
                Ok(false) => {
                    h.bytes_read.fetch_add(len, SeqCst);
                }
                Err((source, Some(device), true)) => {
                    // The outgoing member of a slot being replaced: it leaves, and what it was
                    // to give comes from the redundancy.
                    self.outgoing_read_failed(m, &*device, offset, source)?;
                    lost.extend(&by_member[m as usize]);
                }
                Err((source, device, _)) => {
                    // RAID-0 has no copy to serve it from: the error is the read's.
                    if self.stripe.kind != ArrayKind::Raid5 {
                        return Err(self.io_error(m, "read", offset, source));
                    }
                    let device = device.unwrap_or_else(|| self.device(m));
                    self.read_failed(m, &device, offset, source)?;
                    lost.extend(&by_member[m as usize]);
                }
            }
        }
        Ok(())
    }

    /// Rebuilds the pieces of `lost` (indices into `pieces`) in `buf` from the rest of their
    /// rows; a RAID-0 array has nothing to rebuild them from.
    fn rebuild_lost_pieces(&self, segment: u32, pieces: &[Piece], mut lost: Vec<usize>, buf: &mut [u8]) -> Result<()> {
        if lost.is_empty() {
            return Ok(());
        }
        if self.stripe.kind != ArrayKind::Raid5 {
            let m = pieces[lost[0]].member;
            return Err(Error::Io {
                device: self.device(m).name().to_string(),
                op: "read",
                offset: self.offset(m, segment, pieces[lost[0]].member_offset),
                source: std::io::Error::other("the member has failed and a RAID-0 array has no copy"),
            });
        }
        lost.sort_unstable();
        lost.dedup();
        for i in lost {
            let p = &pieces[i];
            self.reconstruct(segment, p, &mut buf[p.at as usize..(p.at + p.len) as usize])?;
        }
        Ok(())
    }

    /// RAID-1 read of a volume's data: from the mirror [`MirrorReads`] picks once reads are
    /// balanced, else (and when it fails) as [`RaidArray::read_mirror`].
    fn read_balanced(&self, segment: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        if !self.balance.load(SeqCst) {
            return self.read_mirror(segment, offset, buf, None).map(|_| ());
        }
        let members = self.members.len() as u32;
        if (0..members).filter(|&m| !self.is_failed(m)).nth(1).is_none() {
            return self.read_mirror(segment, offset, buf, None).map(|_| ());
        }
        // In the members' common coordinates (their segment areas may start apart).
        let at = segment as u64 * self.stripe.member_segment_bytes() + offset;
        let m = self.mirror_reads.pick(members, |m| !self.is_failed(m), at);
        let i = m as usize;
        self.mirror_reads.in_flight[i].fetch_add(1, SeqCst);
        let read = self.read_member(m, buf, self.offset(m, segment, offset));
        self.mirror_reads.in_flight[i].fetch_sub(1, SeqCst);
        self.mirror_reads.head[i].store(at + buf.len() as u64, SeqCst);
        match read {
            Ok(()) => Ok(()),
            // The others may still have it.
            Err(_) => self.read_mirror(segment, offset, buf, Some(m)).map(|_| ()),
        }
    }

    /// RAID-1 read: the first healthy member that answers.
    fn read_mirror(&self, segment: u32, offset: u64, buf: &mut [u8], skip: Option<u32>) -> Result<u32> {
        let mut last = None;
        for m in 0..self.members.len() as u32 {
            if self.is_failed(m) || skip == Some(m) {
                continue;
            }
            match self.read_member(m, buf, self.offset(m, segment, offset)) {
                Ok(()) => return Ok(m),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Poisoned("no healthy mirror left".into())))
    }

    /// Writes runs of (member offset, slices) per member, merging contiguous ones.
    /// Writes runs of (member offset, slices) per member, merging contiguous ones. Members
    /// are written at once when more than one has a large run (a record becomes one write per
    /// member, and the members work in parallel, as one device would on the whole record).
    fn write_runs(&self, segment: u32, mut per_member: Vec<Vec<Extent<'_>>>) -> Result<()> {
        let write_member_runs = |m: usize, list: &mut Vec<Extent<'_>>| -> Result<()> {
            list.sort_by_key(|(off, _, _)| *off);
            let mut i = 0;
            while i < list.len() {
                let start = list[i].0;
                let mut end = start;
                let mut slices: Vec<IoSlice<'_>> = Vec::new();
                let mut parity = 0;
                let mut j = i;
                while j < list.len() && list[j].0 == end {
                    let n: usize = list[j].1.iter().map(|s| s.len()).sum();
                    slices.extend(list[j].1.iter().map(|s| IoSlice::new(s)));
                    parity += list[j].2;
                    end += n as u64;
                    j += 1;
                }
                self.write_member(m as u32, &slices, self.offset(m as u32, segment, start), parity)?;
                i = j;
            }
            Ok(())
        };
        let bytes = |list: &Vec<Extent<'_>>| -> u64 { list.iter().map(|(_, s, _)| s.iter().map(|x| x.len() as u64).sum::<u64>()).sum() };
        let busy = per_member.iter().filter(|l| bytes(l) >= PARALLEL_IO_BYTES).count();
        if busy < 2 {
            for (m, list) in per_member.iter_mut().enumerate() {
                write_member_runs(m, list)?;
            }
            return Ok(());
        }
        let write_member_runs = &write_member_runs;
        member_io::run_all(
            per_member
                .iter_mut()
                .enumerate()
                .map(|(m, list)| move || write_member_runs(m, list))
                .collect(),
        )
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Poisoned("a member write panicked".into()))))
        .fold(Ok(()), Result::and)
    }

    /// Writes `bufs` at byte `offset` of `segment`, striped; on RAID-5 with the parity of
    /// full rows, from `parity` when the writer computed it (see [`WriteParity`]; RAID-0 has
    /// none to compute and drops it).
    fn write_striped(&self, segment: u32, offset: u64, bufs: &[IoSlice<'_>], mut parity: Option<WriteParity>) -> Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let pieces: Vec<Piece> = self.stripe.pieces(offset, len).collect();
        let mut per_member: Vec<Vec<Extent<'_>>> = vec![Vec::new(); self.members.len()];
        for p in &pieces {
            per_member[p.member as usize].push((p.member_offset, sub_slices(bufs, p.at, p.len), 0));
        }
        if self.stripe.kind != ArrayKind::Raid5 {
            return self.write_runs(segment, per_member);
        }
        // A piece's bytes, for its row's parity (and again, once written, for the landed parity).
        let piece_bytes = |p: &Piece, xor: &mut dyn FnMut(u64, &[u8])| {
            let mut at = 0;
            for s in sub_slices(bufs, p.at, p.len) {
                xor(at, s);
                at += s.len() as u64;
            }
        };
        if let Some(w) = &parity {
            assert_eq!(w.start_bytes(), offset, "a write's parity computed for another offset");
            #[cfg(debug_assertions)]
            self.check_write_parity(offset, len, w, &piece_bytes, &pieces);
        }
        let done = self.rows.contribute(segment, &pieces, parity.as_mut(), piece_bytes);
        let parity_slices: Vec<(u32, u64, &[u8])> = done
            .iter()
            .map(|d| (d.member, d.row * self.stripe.unit_bytes, &d.parity[..]))
            .collect();
        for (m, off, bytes) in &parity_slices {
            per_member[*m as usize].push((*off, vec![*bytes], bytes.len() as u64));
        }
        let r = self.write_runs(segment, per_member);
        // The rows' parity is on the device: only the rows hold it now, and a row that
        // closes gives its buffer back.
        drop(parity_slices);
        drop(done);
        self.rows.finished(segment, &pieces, r.is_ok(), parity.as_ref(), piece_bytes);
        r
    }

    /// Debug builds: `w` is the parity of the write's bytes, row by row (its invariant).
    #[cfg(debug_assertions)]
    fn check_write_parity(
        &self,
        offset: u64,
        len: u64,
        w: &WriteParity,
        piece_bytes: &impl Fn(&Piece, &mut dyn FnMut(u64, &[u8])),
        pieces: &[Piece],
    ) {
        let geometry = self.parity_geometry().expect("a RAID-5 array has a parity geometry");
        let mut again = WriteParity::new(geometry, offset);
        for p in pieces {
            piece_bytes(p, &mut |at, bytes| again.add(offset + p.at + at, bytes));
        }
        let row_bytes = self.stripe.row_bytes();
        let zeros = vec![0u8; self.stripe.unit_bytes as usize];
        for row in offset / row_bytes..(offset + len).div_ceil(row_bytes) {
            assert_eq!(
                w.row(row).unwrap_or(&zeros),
                again.row(row).unwrap_or(&zeros),
                "the parity computed for row {row} is not its bytes' parity"
            );
        }
    }

    /// Segments the array holds (as many on every member).
    fn segments_held(&self) -> u64 {
        self.members.iter().map(|m| m.segment_count as u64).min().unwrap_or(0)
    }

    /// Syncs every member that has not failed, all at once: a sync waits for the device's
    /// cache flush, and members that share a disk (or a controller) flush together rather than
    /// one after another.
    fn sync_members(&self) -> Result<()> {
        let live: Vec<u32> = (0..self.members.len() as u32)
            .filter(|m| !self.health[*m as usize].failed.load(SeqCst))
            .collect();
        // An outgoing member in service is synced with the others: the slot's reads come from
        // it, so what a flush makes durable must be on it too.
        let outgoing: Vec<(u32, Arc<Outgoing>)> = live.iter().filter_map(|&m| Some((m, self.outgoing_of(m)?))).collect();
        let mut syncs: Vec<Box<dyn FnOnce() -> std::io::Result<()> + Send>> = Vec::new();
        let devices: Vec<Arc<dyn Device>> = live.iter().map(|&m| self.device(m)).collect();
        for dev in &devices {
            let dev = dev.clone();
            syncs.push(Box::new(move || dev.sync()));
        }
        for (_, out) in &outgoing {
            let dev = out.device.clone();
            syncs.push(Box::new(move || dev.sync()));
        }
        let mut results = member_io::run_all(syncs).into_iter();
        for (&m, device) in live.iter().zip(&devices) {
            let r = results
                .next()
                .flatten()
                .unwrap_or_else(|| Err(std::io::Error::other("a member sync panicked")));
            if let Err(source) = r {
                self.write_failed(m, device, Error::device_io(&**device, "sync", 0, source))?;
            }
        }
        for (m, _) in &outgoing {
            let r = results
                .next()
                .flatten()
                .unwrap_or_else(|| Err(std::io::Error::other("a sync panicked")));
            if let Err(e) = r {
                self.drop_outgoing(*m, &format!("sync: {e}"))?;
            }
        }
        Ok(())
    }
}

/// The place of a member that was not given at open: every I/O fails (the array never sends
/// it any, as the member is failed).
pub struct MissingDevice {
    name: String,
    size_bytes: u64,
}

impl MissingDevice {
    pub fn new(slot: u32, member_id: u64, size_bytes: u64) -> MissingDevice {
        MissingDevice {
            name: format!("missing member {slot} (id {member_id:016x})"),
            size_bytes,
        }
    }
}

impl Device for MissingDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> std::io::Result<()> {
        Err(std::io::Error::new(std::io::ErrorKind::NotFound, "the member is missing"))
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> std::io::Result<()> {
        Err(std::io::Error::new(std::io::ErrorKind::NotFound, "the member is missing"))
    }
    fn sync(&self) -> std::io::Result<()> {
        Err(std::io::Error::new(std::io::ErrorKind::NotFound, "the member is missing"))
    }
    fn is_stand_in(&self) -> bool {
        true
    }
}

/// Bytes to write at a member offset: (offset, pieces, of which parity bytes).
type Extent<'a> = (u64, Vec<&'a [u8]>, u64);

/// An aligned scratch buffer (device I/O may need `O_DIRECT` alignment).
struct AlignedScratch(crate::util::AlignedBuf);

impl Array for RaidArray {
    fn kind(&self) -> ArrayKind {
        self.stripe.kind
    }

    fn members(&self) -> &[Member] {
        &self.members
    }

    fn needs_aligned_buffers(&self) -> bool {
        self.aligned_buffers
    }

    fn storage_type(&self, _segment: u32) -> StorageType {
        self.members[0].device.storage_type()
    }

    fn readable_grains(&self, _segment: u32) -> u64 {
        self.grains_per_segment
    }

    fn prepare_segment(&self, segment: u32) -> Result<()> {
        self.rows.forget_segment(segment);
        Ok(())
    }

    fn discard_reallocates(&self, _segment: u32) -> bool {
        (0..self.members.len() as u32).any(|m| self.device(m).discard_reallocates())
    }

    fn segment_has_hole(&self, segment: u32) -> bool {
        let len = self.stripe.member_segment_bytes();
        (0..self.members.len() as u32).any(|m| self.device(m).has_hole(self.offset(m, segment, 0), len))
    }

    /// Every online member's share of the segment, parity included.
    fn fill_segment(&self, segment: u32) -> Result<()> {
        self.on_online_shares(segment, "fill", |dev, offset, len| crate::array::zero_range(dev, offset, len))
    }

    /// Every member's share of the segment, parity included, except failed members'.
    fn discard_segment(&self, segment: u32) -> Result<()> {
        self.on_online_shares(segment, "discard", |dev, offset, len| dev.discard(offset, len))
    }

    fn read(&self, grain: u64, buf: &mut [u8]) -> Result<()> {
        let segment = (grain / self.grains_per_segment) as u32;
        let offset = (grain % self.grains_per_segment) * self.grain_bytes;
        assert!(
            offset + buf.len() as u64 <= self.stripe.segment_bytes,
            "access crosses the end of segment {segment}"
        );
        if self.stripe.kind == ArrayKind::Raid1 {
            return self.read_balanced(segment, offset, buf);
        }
        let pieces: Vec<Piece> = self.stripe.pieces(offset, buf.len() as u64).collect();
        self.read_pieces(segment, &pieces, buf)
    }

    fn write_vectored(&self, grain: u64, bufs: &[IoSlice<'_>]) -> Result<()> {
        self.write_vectored_with_parity(grain, bufs, None)
    }

    fn balance_reads(&self) {
        self.balance.store(true, SeqCst);
    }

    fn write_vectored_with_parity(&self, grain: u64, bufs: &[IoSlice<'_>], parity: Option<WriteParity>) -> Result<()> {
        let segment = (grain / self.grains_per_segment) as u32;
        let offset = (grain % self.grains_per_segment) * self.grain_bytes;
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        assert!(
            offset + len <= self.stripe.segment_bytes,
            "access crosses the end of segment {segment}"
        );
        if self.stripe.kind == ArrayKind::Raid1 {
            for m in 0..self.members.len() as u32 {
                self.write_member(m, bufs, self.offset(m, segment, offset), 0)?;
            }
            return Ok(());
        }
        self.write_striped(segment, offset, bufs, parity)
    }

    fn parity_geometry(&self) -> Option<ParityGeometry> {
        (self.stripe.kind == ArrayKind::Raid5).then(|| self.rows.geometry().clone())
    }

    fn sync_all(&self) -> Result<()> {
        let Some(buffer) = &self.parity_buffer else {
            return self.sync_members();
        };
        // What has landed now is durable once the members' sync returns; only then may the
        // buffer say so (see `parity_buffer`).
        let _order = self.parity_sync.lock();
        if self.parity_buffer_failed.lock().is_some() {
            return self.sync_members();
        }
        let (version, rows) = self.rows.landed_rows();
        self.sync_members()?;
        // The members hold every grain durably now; only the partial rows' parity did not
        // reach the buffer. Recovery re-derives it from the members, so the data is as safe
        // as before unless a member fails too before those rows complete (padded at the next
        // flush): the pool goes on without the buffer rather than stopping.
        if let Err(e) = buffer.persist(&rows, version) {
            let why = format!("{}: {e}", buffer.device().name());
            tracing::error!(
                "parity buffer out of service ({why}); flushes pad the log to whole rows from now on; give the pool a new one with `salsa device parity-buffer` when it is stopped"
            );
            *self.parity_buffer_failed.lock() = Some(why);
            self.parity_buffer_failure_unrecorded.store(true, SeqCst);
        }
        Ok(())
    }

    fn take_parity_buffer_failure(&self) -> Option<String> {
        if self.parity_buffer_failure_unrecorded.swap(false, SeqCst) {
            self.parity_buffer_failed.lock().clone()
        } else {
            None
        }
    }

    fn metadata_devices(&self) -> Vec<(Arc<dyn Device>, DeviceLayout)> {
        (0..self.members.len())
            .filter(|m| !self.health[*m].failed.load(SeqCst))
            .map(|m| self.slots[m].read().clone())
            .collect()
    }

    fn metadata_write_failed(&self, device: &Arc<dyn Device>, err: Error) -> Result<()> {
        let slot = (0..self.members.len() as u32).find(|&m| self.is_slot_device(m, device));
        match slot {
            Some(m) => self.write_failed(m, device, err),
            // No longer a member's device (a replacement that failed meanwhile).
            None => Ok(()),
        }
    }

    fn row_grains(&self, grain_bytes: u32) -> u32 {
        match self.stripe.kind {
            ArrayKind::Raid5 => (self.stripe.row_bytes() / grain_bytes as u64) as u32,
            _ => 1,
        }
    }

    fn flush_alignment_grains(&self, grain_bytes: u32) -> u32 {
        match self.parity_buffer {
            Some(_) if self.parity_buffer_failed.lock().is_none() => 1,
            _ => self.row_grains(grain_bytes),
        }
    }

    fn describe(&self) -> String {
        let n = self.members.len();
        let unit = crate::util::human_bytes(self.stripe.unit_bytes);
        // A member being rebuilt is not read from either, but it is no longer missing; one
        // that failed while being rebuilt counts as failed (as `MemberStatus::state` says).
        let failed = self.health.iter().filter(|h| h.failed.load(SeqCst)).count();
        let rebuilding = self
            .health
            .iter()
            .filter(|h| h.rebuilding.load(SeqCst) && !h.failed.load(SeqCst))
            .count();
        let failed = match (failed, rebuilding) {
            (0, 0) => String::new(),
            (0, r) => format!(", DEGRADED: {r} being rebuilt"),
            (f, 0) => format!(", DEGRADED: {f} failed"),
            (f, r) => format!(", DEGRADED: {f} failed, {r} being rebuilt"),
        };
        match self.stripe.kind {
            ArrayKind::Raid0 => format!("raid0 ({n} devices, stripe unit {unit}, no redundancy{failed})"),
            ArrayKind::Raid1 => format!("raid1 ({n} mirrors{failed})"),
            _ => {
                let row = crate::util::human_bytes(self.stripe.row_bytes());
                let failed_buffer = self.parity_buffer_failed.lock().clone();
                let mode = match (&self.parity_buffer, failed_buffer) {
                    (Some(_), Some(why)) => format!("parity buffer OUT OF SERVICE ({why}): a flush pads the log to a whole {row} row"),
                    (Some(b), None) => format!(
                        "parity buffer {} ({} rows per bank): a flush keeps a partial row's parity there",
                        b.device().name(),
                        b.header().entries_per_bank()
                    ),
                    (None, _) => format!("no parity buffer: a flush pads the log to a whole {row} row"),
                };
                format!(
                    "raid5 ({n} devices: {} data + rotating parity, stripe unit {unit}; {mode}{failed})",
                    n - 1
                )
            }
        }
    }

    fn take_failure_change(&self) -> Option<Vec<u64>> {
        self.failure_changed.swap(false, SeqCst).then(|| self.failed_ids())
    }

    fn members_lost(&self) -> Option<String> {
        let (failed, members) = (self.failed_count(), self.members.len() as u32);
        (failed > self.stripe.kind.tolerated_failures(members)).then(|| {
            format!(
                "{failed} of {members} members of the {} array are out of service, more than it survives",
                self.stripe.kind.name()
            )
        })
    }

    fn failed_ids(&self) -> Vec<u64> {
        let ids = self.ids.lock();
        (0..self.members.len())
            .filter(|m| self.health[*m].failed.load(SeqCst))
            .map(|m| ids[m])
            .collect()
    }

    fn parity_buffer_status(&self) -> Option<super::ParityBufferStatus> {
        let b = self.parity_buffer.as_ref()?;
        let c = b.counters();
        Some(super::ParityBufferStatus {
            name: b.device().name().to_string(),
            size_bytes: b.device().size_bytes(),
            rows_per_bank: b.header().entries_per_bank(),
            banks_written: c.banks_written,
            bytes_written: c.bytes_written,
            banks_skipped: c.banks_skipped,
            failed: self.parity_buffer_failed.lock().clone(),
        })
    }

    fn member_status(&self) -> Vec<MemberStatus> {
        self.slots
            .iter()
            .zip(&self.health)
            .zip(&self.outgoing)
            .map(|((slot, h), outgoing)| MemberStatus {
                name: slot.read().0.name().to_string(),
                // A replacement's is what its superblock records (see `Pool::replace_member`).
                storage_type: super::storage_type_name(slot.read().0.as_ref()),
                failed: h.failed.load(SeqCst),
                rebuilding: h.rebuilding.load(SeqCst),
                outgoing: outgoing.read().as_ref().map(|o| o.device.name().to_string()),
                bytes_read: h.bytes_read.load(SeqCst),
                bytes_written: h.bytes_written.load(SeqCst),
                parity_bytes_written: h.parity_bytes_written.load(SeqCst),
                read_errors: h.read_errors.load(SeqCst),
                write_errors: h.write_errors.load(SeqCst),
                repaired_bytes: h.repaired_bytes.load(SeqCst),
                damaged_bytes: h.damaged_bytes.load(SeqCst),
            })
            .collect()
    }

    fn read_repair(&self, grain: u64, buf: &mut [u8], verify: &dyn Fn(&[u8]) -> bool, rewrite: bool) -> Result<bool> {
        let segment = (grain / self.grains_per_segment) as u32;
        let offset = (grain % self.grains_per_segment) * self.grain_bytes;
        match self.stripe.kind {
            ArrayKind::Raid1 => Ok(self.repair_mirrors(segment, offset, buf, verify, rewrite)?.is_some()),
            ArrayKind::Raid5 => {
                let pieces: Vec<Piece> = self.stripe.pieces(offset, buf.len() as u64).collect();
                let mut members: Vec<u32> = pieces.iter().map(|p| p.member).collect();
                members.sort_unstable();
                members.dedup();
                if self.failed_count() > 0 {
                    return Ok(false); // no redundancy left to tell which member is wrong
                }
                // Suppose each member in turn is the one that returned bad bytes.
                for suspect in members {
                    self.read_pieces(segment, &pieces, buf)?;
                    for p in pieces.iter().filter(|p| p.member == suspect) {
                        self.reconstruct(segment, p, &mut buf[p.at as usize..(p.at + p.len) as usize])?;
                    }
                    if verify(buf) {
                        let h = &self.health[suspect as usize];
                        for p in pieces.iter().filter(|p| p.member == suspect) {
                            h.damaged_bytes.fetch_add(p.len, SeqCst);
                            if rewrite {
                                let bytes = &buf[p.at as usize..(p.at + p.len) as usize];
                                self.write_member(suspect, &[IoSlice::new(bytes)], self.offset(suspect, segment, p.member_offset), 0)?;
                                h.repaired_bytes.fetch_add(p.len, SeqCst);
                            }
                        }
                        return Ok(true);
                    }
                }
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    fn replace_member(&self, slot: u32, device: Arc<dyn Device>, member_id: u64, layout: DeviceLayout) -> Result<()> {
        let others_failed = (0..self.members.len() as u32).filter(|m| *m != slot && self.is_failed(*m)).count();
        if self.stripe.kind == ArrayKind::Raid0
            || (self.stripe.kind == ArrayKind::Raid5 && others_failed > 0)
            || others_failed + 1 >= self.members.len()
        {
            return Err(Error::InvalidArgument(format!(
                "the {} array cannot rebuild slot {slot}: {others_failed} other member(s) failed too",
                self.stripe.kind.name()
            )));
        }
        let h = &self.health[slot as usize];
        {
            let mut place = self.slots[slot as usize].write();
            // A healthy device stays in service until its replacement is rebuilt (the slot
            // keeps its redundancy meanwhile); a failed or missing one, or one being rebuilt
            // itself, has nothing to give.
            let healthy = !h.failed.load(SeqCst) && !h.rebuilding.load(SeqCst) && !place.0.is_stand_in();
            let same_place = place.1.segments_offset_bytes == layout.segments_offset_bytes;
            if healthy && !same_place {
                tracing::warn!(
                    "{} places segments at byte {} and {} at byte {}: the outgoing member leaves at once, and the slot is read from the redundancy until the rebuild ends",
                    place.0.name(),
                    place.1.segments_offset_bytes,
                    device.name(),
                    layout.segments_offset_bytes
                );
            }
            let old_id = self.ids.lock()[slot as usize];
            *self.outgoing[slot as usize].write() = (healthy && same_place).then(|| {
                Arc::new(Outgoing {
                    device: place.0.clone(),
                    layout: place.1,
                    member_id: old_id,
                })
            });
            *place = (device, layout);
        }
        self.ids.lock()[slot as usize] = member_id;
        // The counters describe the device in the slot: a new disk has read, written,
        // failed and been repaired nothing (the array's total keeps the old one's writes).
        self.replaced_bytes_written.fetch_add(h.reset_counters(), SeqCst);
        // A reason left from an earlier replacement is not this one's.
        self.replacement_failure.lock().take();
        h.rebuilding.store(true, SeqCst);
        h.failed.store(false, SeqCst);
        Ok(())
    }

    fn replaced_bytes_written(&self) -> u64 {
        self.replaced_bytes_written.load(SeqCst)
    }

    fn rebuild_segment(&self, slot: u32, segment: u32, to_grain: u64) -> Result<u64> {
        let row = if self.stripe.kind == ArrayKind::Raid1 {
            self.grain_bytes
        } else {
            self.stripe.row_bytes()
        };
        let rows = ((to_grain * self.grain_bytes).div_ceil(row)).min(self.stripe.segment_bytes / row);
        let share = match self.stripe.kind {
            ArrayKind::Raid1 => rows * row,
            _ => rows * self.stripe.unit_bytes,
        };
        if share == 0 {
            return Ok(0);
        }
        let mut out = self.scratch(share as usize);
        // With the outgoing member in service, the share is a copy of its bytes (one read,
        // and it needs no other member: one may fail meanwhile); if it fails, the share comes
        // from the redundancy as for a failed member.
        let copied = self.outgoing_of(slot).is_some() && {
            let r = self.read_member(slot, &mut out.0, self.offset(slot, segment, 0));
            match r {
                Ok(()) => true,
                Err(_) if self.outgoing_of(slot).is_none() => false,
                Err(e) => return Err(e),
            }
        };
        match self.stripe.kind {
            _ if copied => {}
            ArrayKind::Raid1 => {
                let m = (0..self.members.len() as u32).find(|m| *m != slot && !self.is_failed(*m));
                let m = m.ok_or_else(|| Error::Poisoned("no healthy mirror to rebuild from".into()))?;
                self.read_member(m, &mut out.0, self.offset(m, segment, 0))?;
            }
            _ => {
                // A closed row's missing unit, data or parity, is the XOR of the row's other
                // units: one sequential read per member gives every row at once.
                // The members are read at once.
                let others: Vec<u32> = (0..self.members.len() as u32).filter(|m| *m != slot).collect();
                let shares = member_io::run_all(
                    others
                        .iter()
                        .map(|&m| {
                            move || {
                                let mut tmp = self.scratch(share as usize);
                                self.read_member(m, &mut tmp.0, self.offset(m, segment, 0)).map(|()| tmp)
                            }
                        })
                        .collect(),
                );
                for tmp in shares {
                    let tmp = tmp.unwrap_or_else(|| Err(Error::Poisoned("a rebuild read panicked".into())))?;
                    for (d, s) in out.0.iter_mut().zip(tmp.0.iter()) {
                        *d ^= *s;
                    }
                }
            }
        }
        if self.stripe.kind == ArrayKind::Raid5 {
            // A row still being filled: its data units come from its parity so far; its
            // parity unit is written when the row completes.
            let unit = self.stripe.unit_bytes;
            for r in 0..rows {
                if !self.rows.is_open(segment, r) {
                    continue;
                }
                let at = (r * unit) as usize;
                match self.stripe.unit_of(r, slot) {
                    None => out.0[at..at + unit as usize].fill(0),
                    Some(u) => {
                        let p = Piece {
                            row: r,
                            unit: u,
                            member: slot,
                            member_offset: r * unit,
                            at: 0,
                            len: unit,
                        };
                        self.reconstruct(segment, &p, &mut out.0[at..at + unit as usize])?;
                    }
                }
            }
        }
        // Of the share, the rows whose parity unit this slot holds (RAID-5).
        let parity_bytes = match self.stripe.kind {
            ArrayKind::Raid5 => (0..rows).filter(|&r| self.stripe.unit_of(r, slot).is_none()).count() as u64 * self.stripe.unit_bytes,
            _ => 0,
        };
        self.write_slot_device(slot, &[IoSlice::new(&out.0)], self.offset(slot, segment, 0), parity_bytes)?;
        if self.health[slot as usize].failed.load(SeqCst) || !self.health[slot as usize].rebuilding.load(SeqCst) {
            return Err(Error::Io {
                device: self.device(slot).name().to_string(),
                op: "rebuild",
                offset: self.offset(slot, segment, 0),
                source: std::io::Error::other("the replacement failed while it was rebuilt"),
            });
        }
        Ok(share)
    }

    fn fail_member(&self, slot: u32) -> Result<()> {
        let tolerated = self.stripe.kind.tolerated_failures(self.members.len() as u32);
        let others = (0..self.members.len() as u32).filter(|m| *m != slot && self.is_failed(*m)).count() as u32;
        if others + 1 > tolerated {
            return Err(Error::InvalidArgument(format!(
                "failing slot {slot} would leave the {} array without its data ({others} other member(s) failed or rebuilding)",
                self.stripe.kind.name()
            )));
        }
        let device = self.device(slot);
        let name = device.name().to_string();
        self.fail(
            slot,
            &device,
            Error::Io {
                device: name,
                op: "fail",
                offset: 0,
                source: std::io::Error::other("failed on request"),
            },
        )?;
        self.health[slot as usize].rebuilding.store(false, SeqCst);
        // The slot's device is failed; an outgoing member does not come back in its place.
        self.outgoing[slot as usize].write().take();
        Ok(())
    }

    fn take_replacement_failure(&self) -> Option<String> {
        self.replacement_failure.lock().take()
    }

    fn finish_rebuild(&self, slot: u32) {
        self.health[slot as usize].rebuilding.store(false, SeqCst);
        // The replacement holds the slot's share now: the outgoing member leaves.
        if let Some(out) = self.outgoing[slot as usize].write().take() {
            tracing::info!("{} left slot {slot}: its replacement is rebuilt", out.device.name());
        }
    }

    fn member_ids(&self) -> Vec<u64> {
        self.ids.lock().clone()
    }

    fn outgoing_member_id(&self, slot: u32) -> Option<u64> {
        self.outgoing.get(slot as usize)?.read().as_ref().map(|o| o.member_id)
    }

    fn scrub(&self, segment: u32, to_grain: u64, repair: bool, pages: &[PageCheck]) -> Result<ScrubCounts> {
        let mut counts = ScrubCounts::default();
        if self.failed_count() > 0 || self.stripe.kind == ArrayKind::Raid0 {
            return Ok(counts); // nothing to compare against
        }
        // RAID-1 compares exactly what the chain covers, in pieces of at most 1 MiB; RAID-5
        // whole rows.
        let row = if self.stripe.kind == ArrayKind::Raid1 {
            1 << 20
        } else {
            self.stripe.row_bytes()
        };
        let to = match self.stripe.kind {
            ArrayKind::Raid1 => to_grain * self.grain_bytes,
            _ => (to_grain * self.grain_bytes).div_ceil(row) * row,
        };
        let to = to.min(self.stripe.segment_bytes);
        let mut at = 0;
        while at < to {
            match self.stripe.kind {
                ArrayKind::Raid1 => {
                    let len = row.min(to - at) as usize;
                    if !self.mirrors_agree(segment, at, len, false)? {
                        counts.rows_mismatched += 1;
                        // The damaged pages first, from a copy that passes; what differs
                        // beyond them (metadata, padding) then follows the first mirror.
                        let (c, all_good) = self.scrub_pages(segment, at, at + len as u64, pages, repair)?;
                        counts += c;
                        if repair && all_good {
                            self.mirrors_agree(segment, at, len, true)?;
                            counts.rows_repaired += 1;
                        }
                    }
                    counts.rows_checked += 1;
                    at += len as u64;
                }
                _ => {
                    let r = at / self.stripe.row_bytes();
                    let row_from = at;
                    at += self.stripe.row_bytes();
                    if self.rows.is_open(segment, r) {
                        continue; // still being filled: its parity is in memory
                    }
                    counts.rows_checked += 1;
                    if self.parity_agrees(segment, r, false)? {
                        continue;
                    }
                    counts.rows_mismatched += 1;
                    // A data page that fails its checksum is rebuilt from the parity; only when
                    // every page passes is the parity rebuilt from the data.
                    let (c, all_good) = self.scrub_pages(segment, row_from, at, pages, repair)?;
                    counts += c;
                    if repair && all_good {
                        self.parity_agrees(segment, r, true)?;
                        counts.rows_repaired += 1;
                    }
                }
            }
        }
        Ok(counts)
    }

    fn resync(&self, segment: u32, from_grain: u64, to_grain: u64) -> Result<()> {
        let gb = self.grain_bytes;
        // Mirrors copy exactly the grains asked for; parity is per whole row.
        let row = if self.stripe.kind == ArrayKind::Raid1 {
            gb
        } else {
            self.stripe.row_bytes()
        };
        let from = (from_grain * gb) / row * row;
        let to = (to_grain * gb).div_ceil(row) * row;
        let to = to.min(self.stripe.segment_bytes);
        if from >= to {
            return Ok(());
        }
        match self.stripe.kind {
            ArrayKind::Raid1 => {
                let mut buf = self.scratch((to - from) as usize);
                let source = self.read_mirror(segment, from, &mut buf.0, None)?;
                for m in 0..self.members.len() as u32 {
                    if m != source {
                        self.write_member(m, &[IoSlice::new(&buf.0)], self.offset(m, segment, from), 0)?;
                    }
                }
                Ok(())
            }
            ArrayKind::Raid5 => {
                if self.failed_count() > 0 {
                    return Ok(()); // the rows cannot be re-derived without every data member
                }
                let unit = self.stripe.unit_bytes;
                for r in from / row..to / row {
                    let (p, parity) = self.row_parity(segment, r)?;
                    self.write_member(p, &[IoSlice::new(&parity.0)], self.offset(p, segment, r * unit), unit)?;
                    // A row a parity buffer kept: its parity is on the members now.
                    self.rows.forget_row(segment, r);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
