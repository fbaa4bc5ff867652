//! Formatting and opening pools: superblocks are read and every member checked (pool id,
//! geometry, index, size) before anything is written; the pool metadata's newest valid slot is
//! taken; the state is loaded from the clean-shutdown checkpoint or rebuilt by a recovery scan;
//! then the GC and write-back threads start.

use super::volumes::validate_volume;
use super::{OpenOptions, OpenedFrom, Pool, PoolConfig};
use crate::array::{Array, ArrayKind, LinearArray, Member, RaidArray};
use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::DeviceLayout;
use crate::format::{
    meta_entries_per_page, FormatError, PoolMeta, Superblock, DEVICE_RESERVED_BYTES, FORMAT_VERSION, MAX_DEVICES, POOL_META_SLOT_BYTES,
    SUPERBLOCK_BYTES,
};
use crate::log::{Geometry, Log};
use crate::policy::VictimParams;
use crate::util::{human_bytes, AlignedBuf};
use parking_lot::Mutex;
use rand::Rng;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

fn default_segment_bytes(total_bytes: u64) -> u64 {
    let target = (total_bytes / 1024).max(1 << 20);
    let pow = 1u64 << (63 - target.leading_zeros());
    pow.clamp(1 << 20, 1 << 30)
}

/// Reads a block the pool may or may not have written; on a zoned device whatever lies beyond a
/// write pointer reads as zeros.
fn read_block(dev: &dyn Device, offset: u64, len: usize) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::zeroed(len);
    crate::device::zone::read_written(dev, &mut b, offset).map_err(|e| Error::device_io(dev, "read", offset, e))?;
    Ok(b)
}

/// Reads a device's superblock, classifying every failure.
pub fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
    if dev.size_bytes() < SUPERBLOCK_BYTES as u64 {
        return Err(Error::NotAPool {
            device: dev.name().into(),
            reason: "too small to hold a superblock".into(),
        });
    }
    let b = read_block(dev, 0, SUPERBLOCK_BYTES)?;
    Superblock::decode(&b).map_err(|e| match e {
        FormatError::BadMagic => Error::NotAPool {
            device: dev.name().into(),
            reason: "no SALSA superblock".into(),
        },
        FormatError::NewerVersion(v) => Error::NewerFormat {
            device: dev.name().into(),
            found: v,
            supported: FORMAT_VERSION,
        },
        other => Error::DamagedSuperblock {
            device: dev.name().into(),
            reason: other.to_string(),
        },
    })
}

/// Whether a device holds nothing at all: its first MiB reads as zeros.
pub fn device_is_blank(dev: &dyn Device) -> Result<bool> {
    let len = dev.size_bytes().min(1 << 20) as usize;
    let b = read_block(dev, 0, len.next_multiple_of(4096).min(dev.size_bytes() as usize))?;
    Ok(b.iter().all(|&x| x == 0))
}

/// The first of `devices` that is not blank (holds a pool or other data), if any: what the
/// embedding APIs, which format only blank devices, refuse.
pub fn first_non_blank(devices: &[Arc<dyn Device>]) -> Result<Option<&Arc<dyn Device>>> {
    for d in devices {
        if !device_is_blank(d.as_ref())? {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

/// Formats the head of a device: the superblock, and zeros over the metadata slots so nothing
/// of an earlier pool survives in them. Sequential zones are reset first.
pub(super) fn write_superblock(d: &dyn Device, sb: &Superblock) -> Result<()> {
    let head = sb.layout.meta_slot_offsets[0].min(sb.layout.meta_slot_offsets[1]);
    let mut buf = match crate::layout::in_sequential_zone(d, 0)? {
        Some(zone) => {
            let z = d.zones().expect("a sequential zone is on a zoned device");
            z.reset_zone(zone).map_err(|e| Error::device_io(d, "reset zone", 0, e))?;
            AlignedBuf::zeroed(SUPERBLOCK_BYTES)
        }
        None => AlignedBuf::zeroed(
            (head + POOL_META_SLOT_BYTES as u64)
                .max(DEVICE_RESERVED_BYTES)
                .min(sb.layout.segments_offset_bytes) as usize,
        ),
    };
    buf[..SUPERBLOCK_BYTES].copy_from_slice(&sb.encode());
    d.write_at(&buf, 0).map_err(|e| Error::device_io(d, "write superblock", 0, e))?;
    d.sync().map_err(|e| Error::device_io(d, "sync", 0, e))
}

/// Refuses a pool configuration out of range: the grain size, the spare, the aging factor,
/// and policies the registry does not know.
fn check_pool_config(cfg: &PoolConfig, opts: &OpenOptions) -> Result<()> {
    if !cfg.grain_bytes.is_power_of_two() || !(4096..=65536).contains(&cfg.grain_bytes) {
        return Err(Error::InvalidConfig(format!(
            "grain size {} must be a power of two from 4 KiB to 64 KiB",
            cfg.grain_bytes
        )));
    }
    if !(0.0..=90.0).contains(&cfg.spare_percent) {
        return Err(Error::InvalidConfig(format!(
            "spare {}% must be between 0 and 90",
            cfg.spare_percent
        )));
    }
    if !(0.0..=1.0).contains(&cfg.gc_aging) {
        return Err(Error::InvalidConfig(format!(
            "aging factor {} must be between 0 and 1",
            cfg.gc_aging
        )));
    }
    opts.policies.check_victim(&cfg.victim_policy).map_err(Error::InvalidConfig)?;
    opts.policies
        .check_placement(&cfg.default_placement)
        .map_err(Error::InvalidConfig)?;
    Ok(())
}

impl Pool {
    /// Formats `devices` as a new pool (overwriting whatever they hold) and opens it.
    pub fn create(devices: Vec<Arc<dyn Device>>, cfg: &PoolConfig, opts: &OpenOptions) -> Result<Pool> {
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(Error::InvalidConfig(format!("a pool needs between 1 and {MAX_DEVICES} devices")));
        }
        check_open_options(opts)?;
        check_pool_config(cfg, opts)?;
        let plan = plan_members(&devices, cfg)?;
        if opts.parity_buffer.is_some() && cfg.array != ArrayKind::Raid5 {
            return Err(Error::InvalidConfig(format!(
                "a parity buffer keeps RAID-5 parity; this pool is {}",
                cfg.array.name()
            )));
        }
        let segment_bytes = plan.segment_bytes;
        let max_entries = meta_entries_per_page(cfg.grain_bytes as usize) as u32;
        // By default a full record is a power-of-two number of grains (255 data pages and their
        // metadata page: 1 MiB with 4 KiB grains), so records tile segments exactly and a 1 MiB
        // segment spends one grain on metadata. The room left over takes a record's trims.
        let meta_interval = cfg.meta_interval_pages.unwrap_or_else(|| {
            let limit = max_entries.saturating_sub(4).max(1);
            (1u32 << (limit + 1).ilog2()) - 1
        });
        if meta_interval == 0 || meta_interval > max_entries {
            return Err(Error::InvalidConfig(format!("metadata interval must be 1 to {max_entries} pages")));
        }
        let pool_id: u128 = rand::thread_rng().gen::<u128>() | 1;
        let member_ids = new_member_ids(devices.len());
        // The parity buffer first: one too small is refused before a member is written.
        let mut parity_buffer_id = 0;
        if let Some(buffer) = &opts.parity_buffer {
            parity_buffer_id = rand::thread_rng().gen::<u64>() | 1;
            let unit = plan.stripe_unit_bytes;
            let row_grains = cfg.array.data_members(devices.len() as u32) * (unit / cfg.grain_bytes);
            crate::array::ParityBuffer::format(buffer.clone(), pool_id, parity_buffer_id, unit, row_grains)?;
        }
        let first = plan.total_segments;
        let mut layouts = Vec::new();
        for (i, (start, count, layout)) in plan.members.into_iter().enumerate() {
            let d = &devices[i];
            let sb = Superblock {
                format_version: FORMAT_VERSION,
                pool_id,
                device_index: i as u32,
                device_count: devices.len() as u32,
                device_size_bytes: d.size_bytes(),
                storage_type: d.storage_type(),
                grain_bytes: cfg.grain_bytes,
                segment_bytes,
                first_segment: start,
                segment_count: count,
                total_segments: first,
                meta_interval_pages: meta_interval,
                victim_policy: cfg.victim_policy.clone(),
                default_placement: cfg.default_placement.clone(),
                gc_aging_milli: (cfg.gc_aging * 1000.0).round() as u32,
                spare_basis_points: (cfg.spare_percent * 100.0).round() as u32,
                layout,
                array: cfg.array,
                stripe_unit_bytes: plan.stripe_unit_bytes,
                member_id: member_ids[i],
                member_ids: member_ids.clone(),
            };
            write_superblock(d.as_ref(), &sb)?;
            layouts.push(layout);
        }
        let mut meta = PoolMeta {
            pool_id,
            generation: 0,
            session_id: 0,
            clean: false,
            next_volume_id: 1,
            volumes: vec![],
            checkpoint: None,
            failed_members: vec![],
            member_ids: member_ids.clone(),
            rebuild: None,
            parity_buffer_id,
            // Nothing written yet: every member joins the list when a stream first takes one
            // of its segments.
            log_members: Some(vec![]),
        };
        let copies: Vec<(Arc<dyn Device>, DeviceLayout)> = devices.iter().cloned().zip(layouts).collect();
        crate::log::write_meta_slot(&copies, &mut meta)?;
        let mut pool = Pool::open(devices, opts)?;
        pool.opened_from = OpenedFrom::NewPool;
        Ok(pool)
    }

    /// Opens an existing pool: checks every member, then loads the clean-shutdown checkpoint or
    /// recovers by scanning.
    pub fn open(devices: Vec<Arc<dyn Device>>, opts: &OpenOptions) -> Result<Pool> {
        Self::open_with_progress(devices, opts, &|_, _| {})
    }

    /// As [`Pool::open`], reporting recovery-scan progress as (segments done, total).
    ///
    /// The steps: check every member's superblock against the others (`read_members`); take
    /// the newest valid pool metadata of any member (`read_pool_meta`); mark the pool in use;
    /// build the log, the engine and a controller per volume; load the checkpoint or scan
    /// (`load_state`); start the write-back and GC threads.
    pub fn open_with_progress(devices: Vec<Arc<dyn Device>>, opts: &OpenOptions, progress: &dyn Fn(u64, u64)) -> Result<Pool> {
        if devices.is_empty() {
            return Err(Error::InvalidConfig("no devices given".into()));
        }
        check_open_options(opts)?;
        let FoundMembers {
            first,
            mut members,
            missing,
            mut present_ids,
            second,
        } = read_members(&devices)?;
        let old_meta = read_pool_meta(&members, first.pool_id)?;
        let outgoing = take_outgoing(&old_meta, &mut members, &mut present_ids, second)?;
        // The pool metadata names each slot's current member; a superblock from a member that
        // was replaced since is stale.
        let ids = if old_meta.member_ids.is_empty() {
            first.member_ids.clone()
        } else {
            old_meta.member_ids.clone()
        };
        check_not_replaced(&ids, &present_ids, &members)?;
        let rebuilding = old_meta
            .rebuild
            .filter(|r| present_ids.get(r.slot as usize) == Some(&r.member_id))
            .map(|r| r.slot);
        for v in &old_meta.volumes {
            validate_volume(&v.name, v.page_bytes, first.grain_bytes, v.size_bytes)
                .map_err(|e| Error::Corrupt(format!("volume table entry {:?}: {e}", v.name)))?;
        }
        let geo = geometry(&first);
        let array = open_array(
            &first,
            &old_meta,
            OpenedMembers {
                members,
                ids,
                missing_slots: missing,
                rebuilding,
                outgoing,
                given: devices.len(),
            },
            opts,
        )?;
        let (policy, volumes) = build_policies(&first, &old_meta, &geo, opts)?;
        let meta = begin_session(&old_meta, array.as_ref(), opts)?;
        // Pacing measures what the background GC sustains; writers that clean for themselves
        // are not paced.
        let pace_user_writes = opts.pace_user_writes && opts.background_gc;
        let log = Log::new(first.pool_id, geo, array, meta, opts.read_only);
        if pace_user_writes {
            log.widen_watermarks_for_pacing(first.spare_basis_points);
        }
        let log = Arc::new(log);
        log.enable_read_cache(opts.read_cache_bytes);
        log.set_gc_burst_bytes(opts.gc_burst_bytes.unwrap_or(gc_burst_for(&devices)));
        log.capacity().set_discard(opts.discard_freed_segments && !opts.read_only);
        let eng = Engine::new(
            log,
            policy,
            opts.background_gc,
            opts.gc_garbage_percent.map(|p| p / 100.0),
            pace_user_writes,
        );
        for c in volumes {
            eng.add_volume(c);
        }
        let opened_from = load_state(&eng, &old_meta, opts, progress)?;
        if !opts.read_only {
            eng.dirty.enable(opts.write_buffer_bytes, opts.write_buffer_expire);
        }
        let eng = Arc::new(eng);
        Engine::attach(&eng);
        let pool = Pool {
            eng: eng.clone(),
            gc_threads: Mutex::new(Vec::new()),
            opened_from,
            spare_basis_points: first.spare_basis_points,
            victim_policy: first.victim_policy.clone(),
            gc_aging: first.gc_aging_milli as f64 / 1000.0,
            default_placement: first.default_placement.clone(),
            policies: opts.policies.clone(),
            closed: false,
        };
        for v in &old_meta.volumes {
            let policy = pool
                .volume_victim_policy(&v.victim)
                .map_err(|e| Error::InvalidConfig(format!("volume {:?}: {e} (register it in OpenOptions::policies)", v.name)))?;
            eng.set_volume_victim_policy(v.id, policy);
        }
        pool.start_threads(opts)?;
        Ok(pool)
    }
}

/// The pool's victim policy and each volume's controller, as the superblock and the volume
/// table name them; a name the registry does not know is refused.
#[allow(clippy::type_complexity)]
fn build_policies(
    first: &Superblock,
    meta: &PoolMeta,
    geo: &Geometry,
    opts: &OpenOptions,
) -> Result<(
    Box<dyn crate::policy::victim::VictimPolicy>,
    Vec<Arc<dyn crate::controller::Controller>>,
)> {
    let policy = opts
        .policies
        .victim(
            &first.victim_policy,
            &VictimParams {
                aging: first.gc_aging_milli as f64 / 1000.0,
            },
        )
        .map_err(|e| Error::InvalidConfig(format!("{e} (register it in OpenOptions::policies)")))?;
    let mut volumes = Vec::new();
    for v in &meta.volumes {
        let c = crate::controller::build(v, geo, &opts.policies)
            .map_err(|e| Error::InvalidConfig(format!("volume {:?}: {e} (register it in OpenOptions::policies)", v.name)))?;
        volumes.push(c);
    }
    Ok((policy, volumes))
}

/// The members found at open, as [`open_array`] puts them together.
struct OpenedMembers {
    members: Vec<Member>,
    /// Per slot, the member id the pool metadata (or the superblock) names.
    ids: Vec<u64>,
    /// Slots whose member was not given.
    missing_slots: Vec<u32>,
    /// The slot whose rebuild is not finished, when its replacement was given.
    rebuilding: Option<u32>,
    /// The healthy member that rebuild replaces, when it was given too.
    outgoing: Option<(Member, u64)>,
    /// Devices given to the open.
    given: usize,
}

/// Refuses a member whose superblock names it for a slot the pool metadata gives to another
/// (it was replaced since, and is stale).
fn check_not_replaced(ids: &[u64], present_ids: &[u64], members: &[Member]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    for (slot, (&claimed, m)) in present_ids.iter().zip(members).enumerate() {
        if claimed != 0 && ids.get(slot) != Some(&claimed) {
            return Err(Error::ReplacedMember {
                device: m.device.name().into(),
                slot: slot as u32,
            });
        }
    }
    Ok(())
}

/// The array the superblock `first` describes, over the members found: a linear array (which
/// opens without a member that never held log data), or a RAID array with the missing and
/// failed members marked, its rebuild state and its parity buffer.
fn open_array(first: &Superblock, old_meta: &PoolMeta, found: OpenedMembers, opts: &OpenOptions) -> Result<Box<dyn Array>> {
    let OpenedMembers {
        members,
        ids,
        missing_slots,
        rebuilding,
        outgoing,
        given,
    } = found;
    let missing: Vec<u64> = missing_slots
        .iter()
        .map(|&slot| ids.get(slot as usize).copied().unwrap_or(0))
        .collect();
    let grain = first.grain_bytes as u64;
    Ok(match first.array {
        ArrayKind::Linear => {
            check_missing_hold_no_log(first, old_meta, &missing_slots, &missing, given)?;
            Box::new(LinearArray::new(members, ids, &missing_slots, first.segment_bytes, grain)?)
        }
        kind => {
            let mut failed = old_meta.failed_members.clone();
            failed.extend(&missing);
            failed.sort_unstable();
            failed.dedup();
            let buffer = open_parity_buffer(
                first,
                old_meta,
                members.len() as u32,
                failed.len() + rebuilding.iter().count(),
                opts,
            )?;
            Box::new(RaidArray::new(
                kind,
                members,
                ids,
                &failed,
                rebuilding.map(|slot| (slot, outgoing)),
                first.stripe_unit_bytes as u64,
                first.segment_bytes,
                grain,
                buffer,
            )?)
        }
    })
}

/// This session's pool metadata, written at once unless read-only: the pool marked in use
/// before anything else is written, with a new session id and generation (this session's
/// epoch, so every id and sequence number of this session is larger than any of an earlier
/// one; a version-5 pool's metadata becomes version 6 here), the members as the array has
/// them now.
fn begin_session(old_meta: &PoolMeta, array: &dyn Array, opts: &OpenOptions) -> Result<PoolMeta> {
    let mut meta = old_meta.clone();
    meta.clean = false;
    meta.checkpoint = None;
    meta.session_id = rand::thread_rng().gen();
    // A member missing now is recorded as failed: if it comes back, it is stale.
    meta.failed_members = array.failed_ids();
    meta.member_ids = array.member_ids();
    // The member a rebuild replaces serves again only if it was given and taken: else
    // this session's writes go around it, and it must not be trusted at the next open.
    meta.rebuild = meta.rebuild.map(|r| crate::array::naming_outgoing(array, r));
    if opts.parity_buffer_lost && opts.parity_buffer.is_none() {
        // Recorded at once: the rows it kept are re-derived below, and nothing later
        // may wait for the lost device.
        meta.parity_buffer_id = 0;
    }
    if !opts.read_only {
        crate::log::write_meta_slot(&array.metadata_devices(), &mut meta)?;
    }
    Ok(meta)
}

impl Pool {
    /// Starts what a writable pool runs beside its callers: the write-back threads, a rebuild
    /// left unfinished, and with background GC the destager, the GC workers and the
    /// maintenance thread.
    fn start_threads(&self, opts: &OpenOptions) -> Result<()> {
        if opts.read_only {
            return Ok(());
        }
        let eng = &self.eng;
        crate::log::write_back::WriteBack::start(&eng.log, opts.write_back_threads)?;
        self.resume_rebuild()?;
        if !opts.background_gc {
            return Ok(());
        }
        crate::dirty::DirtyPages::start_destager(eng)?;
        for i in 0..opts.gc_workers.clamp(1, 16) {
            let e = eng.clone();
            let h = std::thread::Builder::new()
                .name(format!("salsa-gc-{i}"))
                .spawn(move || crate::engine::gc::gc_worker(e))
                .map_err(|e| Error::InvalidConfig(format!("cannot start a GC thread: {e}")))?;
            self.gc_threads.lock().push(h);
        }
        let e = eng.clone();
        let h = std::thread::Builder::new()
            .name("salsa-maint".into())
            .spawn(move || maintenance_worker(e))
            .map_err(|e| Error::InvalidConfig(format!("cannot start the maintenance thread: {e}")))?;
        self.gc_threads.lock().push(h);
        Ok(())
    }
}

/// The pool's RAID-5 parity buffer and the rows it kept, when the pool uses one; refuses a
/// pool that uses one opened without it, and a buffer given to a pool that does not.
fn open_parity_buffer(
    first: &Superblock,
    meta: &PoolMeta,
    members: u32,
    degraded_members: usize,
    opts: &OpenOptions,
) -> Result<Option<(crate::array::ParityBuffer, Vec<crate::array::raid::rows::LandedRow>)>> {
    match (meta.parity_buffer_id, &opts.parity_buffer) {
        (0, None) => Ok(None),
        (id, None) if opts.parity_buffer_lost => {
            if degraded_members > 0 {
                return Err(Error::InvalidConfig(format!(
                    "parity buffer {id:016x} cannot be done without while {degraded_members} member(s) of this pool are failed, missing or being rebuilt: it may hold the only redundancy of their last rows; give it (--parity-buffer PATH), or give the missing members"
                )));
            }
            tracing::warn!("opening without parity buffer {id:016x}: the parity of the rows it kept is re-derived from the members");
            Ok(None)
        }
        // A buffer this pool stopped using (it went out of service, or was dropped), named
        // again by a start that always names it: the pool goes on without it.
        (0, Some(d)) if crate::array::ParityBuffer::belongs_to(d.as_ref(), first.pool_id) != Some(false) => {
            tracing::warn!(
                "{} is not in use by this pool (its parity buffer went out of service or was dropped); going on without one: flushes pad to whole rows; `salsa device parity-buffer` gives the pool one",
                d.name()
            );
            Ok(None)
        }
        (0, Some(d)) => Err(Error::InvalidConfig(format!(
            "this pool has no parity buffer, and {} was never one of its own; flushes pad its rows instead; `salsa device parity-buffer` gives it one",
            d.name()
        ))),
        (id, None) => Err(Error::InvalidConfig(format!(
            "this RAID-5 pool keeps the parity of the rows being filled in parity buffer {id:016x}; give that device too (--parity-buffer PATH), or, if it is lost, go on without it or with a new one (`salsa device parity-buffer`)"
        ))),
        (id, Some(d)) => {
            let unit = first.stripe_unit_bytes;
            let row_grains = first.array.data_members(members) * (unit / first.grain_bytes);
            crate::array::ParityBuffer::open(d.clone(), first.pool_id, id, unit, row_grains).map(Some)
        }
    }
}

/// Random, distinct, non-zero ids for the members of a new pool.
fn new_member_ids(count: usize) -> Vec<u64> {
    let mut rng = rand::thread_rng();
    let mut ids: Vec<u64> = Vec::with_capacity(count);
    while ids.len() < count {
        let id = rng.gen::<u64>();
        if id != 0 && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// Reads every device's superblock and checks it against the first: same pool, same geometry
/// and array, the same member list, a slot of its own that its member id matches, segment
/// ranges that line up. Nothing is written. Returns the first superblock, the members in slot
/// order (a missing one, where the layout survives it, as a stand-in that fails all I/O), the
/// missing slots, and the member id each slot's superblock claims (0 when missing).
fn read_members(devices: &[Arc<dyn Device>]) -> Result<FoundMembers> {
    // A device without a superblock among members of a pool is judged once the members
    // tell which slots are missing (a member that lost its superblock, or a wrong device).
    let (mut given, mut strangers, mut not_a_pool) = (Vec::new(), Vec::new(), None);
    let mut second = Vec::new();
    for d in devices {
        match read_superblock(d.as_ref()) {
            Ok(sb) => given.push((d, sb)),
            Err(e @ Error::NotAPool { .. }) => {
                strangers.push(d.name().to_string());
                not_a_pool.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    let Some(first) = given.first().map(|(_, sb)| sb.clone()) else {
        return Err(not_a_pool.unwrap_or_else(|| Error::InvalidConfig("no devices given".into())));
    };
    let mut ordered: Vec<Option<(Arc<dyn Device>, Superblock)>> = vec![None; first.device_count as usize];
    for (d, sb) in given {
        check_like_first(d.as_ref(), &sb, &first)?;
        // The type recorded at format is the member's type (a file cannot say it is a disk).
        let d = if d.zones().is_none() {
            crate::device::Declared::wrap(d.clone(), sb.storage_type)
        } else {
            d.clone()
        };
        let slot = &mut ordered[sb.device_index as usize];
        if let Some((other, _)) = slot {
            // A second device of one slot: a member and its replacement, which the pool
            // metadata may name as a rebuild's outgoing member (judged by the caller); any
            // more is refused here.
            if second
                .iter()
                .any(|(_, s): &(Arc<dyn Device>, Superblock)| s.device_index == sb.device_index)
            {
                return Err(same_member(other.name(), d.name(), sb.device_index));
            }
            second.push((d, sb));
            continue;
        }
        *slot = Some((d, sb));
    }
    // A linear pool may miss members that never held log data (a hybrid volume's fast
    // device); whether they did is in the pool metadata, checked by the caller.
    let tolerated = if first.array == ArrayKind::Linear {
        first.device_count - 1
    } else {
        first.array.tolerated_failures(first.device_count)
    };
    let missing: Vec<u32> = (0..first.device_count).filter(|i| ordered[*i as usize].is_none()).collect();
    check_missing(&first, &missing, &strangers, tolerated, devices.len())?;
    let present_ids: Vec<u64> = ordered.iter().map(|m| m.as_ref().map_or(0, |(_, sb)| sb.member_id)).collect();
    let members = members_in_slot_order(ordered, &first, devices)?;
    Ok(FoundMembers {
        first,
        members,
        missing,
        present_ids,
        second,
    })
}

/// Refuses a superblock `sb` read from `d` that is not of `first`'s pool or geometry, or
/// that was formatted on a larger device.
fn check_like_first(d: &dyn Device, sb: &Superblock, first: &Superblock) -> Result<()> {
    if sb.pool_id != first.pool_id {
        return Err(Error::ForeignDevice {
            device: d.name().into(),
            expected: first.pool_id,
            found: sb.pool_id,
        });
    }
    let same_geometry = sb.device_count == first.device_count
        && sb.grain_bytes == first.grain_bytes
        && sb.segment_bytes == first.segment_bytes
        && sb.total_segments == first.total_segments
        && sb.meta_interval_pages == first.meta_interval_pages
        && sb.array == first.array
        && sb.stripe_unit_bytes == first.stripe_unit_bytes;
    if !same_geometry {
        return Err(Error::DamagedSuperblock {
            device: d.name().into(),
            reason: "geometry differs from the other members".into(),
        });
    }
    if sb.device_size_bytes > d.size_bytes() {
        return Err(Error::DamagedSuperblock {
            device: d.name().into(),
            reason: format!("device is {} bytes but was formatted with {}", d.size_bytes(), sb.device_size_bytes),
        });
    }
    Ok(())
}

/// Refuses devices given that hold no superblock (`strangers`), and more `missing` slots than
/// the layout does without (`tolerated`); warns of a RAID pool opening degraded.
fn check_missing(first: &Superblock, missing: &[u32], strangers: &[String], tolerated: u32, given: usize) -> Result<()> {
    if !strangers.is_empty() {
        return Err(not_a_member(strangers.join(", "), first, missing, tolerated));
    }
    if let Some(&slot) = missing.first() {
        if missing.len() as u32 > tolerated {
            let slots: Vec<String> = missing.iter().map(|s| s.to_string()).collect();
            return Err(Error::MissingMember {
                pool: first.pool_id,
                expected: first.device_count,
                given: given as u32,
                missing: slot,
                why: format!(
                    "{} missing (slots {}) and a {} array of {} can do without at most {tolerated}",
                    missing.len(),
                    slots.join(", "),
                    first.array.name(),
                    first.device_count
                ),
            });
        }
        // (A linear pool's missing members are judged against the pool metadata later.)
        if first.array != ArrayKind::Linear {
            tracing::warn!(
                "{} of {} members of this {} pool are missing; it opens degraded",
                missing.len(),
                first.device_count,
                first.array.name()
            );
        }
    }
    Ok(())
}

/// The members in slot order (a missing one as a stand-in that fails all I/O, placed where the
/// rest of a linear pool says its segments start), checked to cover every segment once.
fn members_in_slot_order(
    ordered: Vec<Option<(Arc<dyn Device>, Superblock)>>,
    first: &Superblock,
    devices: &[Arc<dyn Device>],
) -> Result<Vec<Member>> {
    // Where each missing linear member's segments start: the rest of the pool tells.
    let starts: Vec<Option<u32>> = ordered.iter().map(|m| m.as_ref().map(|(_, sb)| sb.first_segment)).collect();
    let mut members = Vec::new();
    let mut next_segment = 0u32;
    for (i, m) in ordered.into_iter().enumerate() {
        let (device, sb) = match m {
            Some(found) => found,
            None => {
                let id = first.member_ids.get(i).copied().unwrap_or(0);
                let stand_in: Arc<dyn Device> = Arc::new(crate::array::raid::MissingDevice::new(i as u32, id, first.device_size_bytes));
                let mut sb = first.clone();
                if first.array == ArrayKind::Linear {
                    let end = starts[i + 1..].iter().flatten().next().copied().unwrap_or(first.total_segments);
                    sb.first_segment = next_segment;
                    sb.segment_count = end.saturating_sub(next_segment);
                }
                (stand_in, sb)
            }
        };
        let expected_first = if first.array == ArrayKind::Linear { next_segment } else { 0 };
        if sb.first_segment != expected_first {
            return Err(Error::DamagedSuperblock {
                device: device.name().into(),
                reason: "segment ranges of the members do not line up".into(),
            });
        }
        next_segment = if first.array == ArrayKind::Linear {
            next_segment + sb.segment_count
        } else {
            sb.segment_count
        };
        members.push(Member {
            device,
            first_segment: sb.first_segment,
            segment_count: sb.segment_count,
            layout: sb.layout,
        });
    }
    if next_segment != first.total_segments {
        return Err(Error::DamagedSuperblock {
            device: devices[0].name().into(),
            reason: "segment counts do not add up".into(),
        });
    }
    Ok(members)
}

/// Of the second devices given for a slot (`second`), the healthy member a rebuild in
/// progress replaces, as the pool metadata names it (with its layout and id); the slot's
/// member, its replacement, is put in `members` and `present_ids` if it came second. Any
/// other second device is refused, as a member given twice.
fn take_outgoing(
    meta: &PoolMeta,
    members: &mut [Member],
    present_ids: &mut [u64],
    second: Vec<(Arc<dyn Device>, Superblock)>,
) -> Result<Option<(Member, u64)>> {
    let mut taken = None;
    for (device, sb) in second {
        let slot = sb.device_index;
        let i = slot as usize;
        let Some(r) = meta.rebuild.filter(|r| r.slot == slot && r.outgoing_member_id != 0) else {
            return Err(same_member(members[i].device.name(), device.name(), slot));
        };
        let other = Member {
            device,
            first_segment: sb.first_segment,
            segment_count: sb.segment_count,
            layout: sb.layout,
        };
        let outgoing = if present_ids[i] == r.outgoing_member_id && sb.member_id == r.member_id {
            present_ids[i] = sb.member_id;
            std::mem::replace(&mut members[i], other)
        } else if present_ids[i] == r.member_id && sb.member_id == r.outgoing_member_id {
            other
        } else {
            return Err(same_member(members[i].device.name(), other.device.name(), slot));
        };
        tracing::info!(
            "{} serves slot {slot} beside its replacement {} until the rebuild ends",
            outgoing.device.name(),
            members[i].device.name()
        );
        taken = Some((outgoing, r.outgoing_member_id));
    }
    Ok(taken)
}

/// The error for two devices given for one slot that are not a rebuild's member and the
/// healthy member it replaces.
fn same_member(a: &str, b: &str, slot: u32) -> Error {
    Error::InvalidConfig(format!(
        "{a} and {b} are the same member (slot {slot}) of the pool: a device given twice, a copy of one, or a member and its replacement (the member a rebuild replaces is taken beside it only while that rebuild lasts)"
    ))
}

/// A linear pool opens without a member only if the pool metadata shows that no record was
/// ever written to it (so it held at most a hybrid volume's copies of data that lives on the
/// other members, or a checkpoint, which the scan replaces); otherwise the pool is refused as
/// before, nothing written.
fn check_missing_hold_no_log(first: &Superblock, meta: &PoolMeta, slots: &[u32], ids: &[u64], given: usize) -> Result<()> {
    for (&slot, &id) in slots.iter().zip(ids) {
        let never_logged = id != 0 && meta.log_members.as_ref().is_some_and(|log| !log.contains(&id));
        if !never_logged {
            return Err(Error::MissingMember {
                pool: first.pool_id,
                expected: first.device_count,
                given: given as u32,
                missing: slot,
                why: "it holds log data, and a linear pool needs every member its log was written to".into(),
            });
        }
        tracing::warn!(
            "member {slot} (id {id:016x}) of this pool is missing; it never held log data (only copies of a hybrid volume's hot data), so the pool opens without it"
        );
    }
    Ok(())
}

/// What [`read_members`] found.
/// The error for `device` (one or more names), which holds no superblock, given with members of the pool `first`
/// describes, of which slots `missing` were not given (`tolerated`: how many its layout can do
/// without).
fn not_a_member(device: String, first: &Superblock, missing: &[u32], tolerated: u32) -> Error {
    let pool = format!("{} pool {:032x}", first.array.name(), first.pool_id);
    if missing.is_empty() {
        return Error::NotAMember {
            device,
            why: format!("the other devices are every member of {pool}; leave it out"),
        };
    }
    let slots: Vec<String> = missing.iter().map(|s| s.to_string()).collect();
    let next = if first.array == ArrayKind::Linear {
        "A linear pool opens without a member only when that member never held data; otherwise give the device that was it".to_string()
    } else if missing.len() as u32 <= tolerated {
        format!(
            "Leave it out and the pool opens degraded; then rebuild slot {} onto it or onto a new device with `salsa device replace`",
            slots[0]
        )
    } else {
        format!(
            "The pool cannot open without those slots: a {} array of {} can do without at most {tolerated} members; give the devices that were slots {}",
            first.array.name(),
            first.device_count,
            slots.join(", ")
        )
    };
    Error::NotAMember {
        device,
        why: format!(
            "the other devices are members of {pool}, which misses slot(s) {}: a member that lost its superblock is not trusted for anything it holds. {next}",
            slots.join(", ")
        ),
    }
}

struct FoundMembers {
    first: Superblock,
    members: Vec<Member>,
    missing: Vec<u32>,
    present_ids: Vec<u64>,
    /// Second devices of a slot (at most one each), with their superblocks, in the order given.
    second: Vec<(Arc<dyn Device>, Superblock)>,
}

/// The newest valid copy of the pool metadata on any member (every member keeps one since
/// format version 6; a version-5 pool has it on member 0 only).
fn read_pool_meta(members: &[Member], pool_id: u128) -> Result<PoolMeta> {
    let mut best: Option<PoolMeta> = None;
    let mut read_error = None;
    for m in members {
        for off in m.layout.meta_slot_offsets {
            // A member that cannot be read (missing, failing) leaves the copies of the others.
            let b = match read_block(m.device.as_ref(), off, POOL_META_SLOT_BYTES) {
                Ok(b) => b,
                Err(e) => {
                    read_error.get_or_insert(e);
                    continue;
                }
            };
            if let Ok(meta) = PoolMeta::decode(&b) {
                if meta.pool_id == pool_id && best.as_ref().is_none_or(|b| meta.generation > b.generation) {
                    best = Some(meta);
                }
            }
        }
    }
    if let (None, Some(e)) = (&best, read_error) {
        return Err(e);
    }
    best.ok_or_else(|| {
        let names: Vec<&str> = members.iter().map(|m| m.device.name()).collect();
        Error::Corrupt(format!("no valid pool metadata on {} (every copy damaged)", names.join(", ")))
    })
}

/// The pool's geometry as its superblock records it.
fn geometry(sb: &Superblock) -> Geometry {
    let grain = sb.grain_bytes;
    let gps = (sb.segment_bytes / grain as u64) as u32;
    Geometry {
        grain_bytes: grain,
        segment_bytes: sb.segment_bytes,
        grains_per_segment: gps,
        total_segments: sb.total_segments,
        total_grains: sb.total_segments as u64 * gps as u64,
        meta_entries: meta_entries_per_page(grain as usize) as u32,
        sized_meta_entries: crate::format::sized_meta_entries_per_page(grain as usize) as u32,
        meta_interval_pages: sb.meta_interval_pages.min(meta_entries_per_page(grain as usize) as u32),
    }
}

/// Rebuilds the volumes' maps: from the clean-shutdown checkpoint when there is a usable one,
/// otherwise by scanning every segment; then makes what was read durable.
fn load_state(eng: &Engine, old_meta: &PoolMeta, opts: &OpenOptions, progress: &dyn Fn(u64, u64)) -> Result<OpenedFrom> {
    let mut opened_from = OpenedFrom::RecoveryScan;
    match (old_meta.clean && !opts.force_scan, &old_meta.checkpoint) {
        (true, Some(cp)) => match crate::recovery::load_checkpoint(eng, cp, old_meta.session_id) {
            Ok(()) => opened_from = OpenedFrom::Checkpoint,
            Err(e) => {
                tracing::warn!("checkpoint unusable ({e}); recovering by scanning every segment");
                crate::recovery::clear_maps(eng);
                crate::recovery::scan(eng, progress)?;
            }
        },
        _ => {
            tracing::info!("pool was not shut down cleanly; scanning {} segments", eng.log.geo().total_segments);
            crate::recovery::scan(eng, progress)?;
        }
    }
    if !opts.read_only {
        // What recovery read is now the state; make it durable before anything new lands.
        eng.log.array().sync_all()?;
        // The mirrors agree wherever the maps point: reads may go to any of them.
        eng.log.array().balance_reads();
    }
    Ok(opened_from)
}

/// Where a new pool's segments go: their size, and per member its first segment, segment count
/// and layout.
struct MemberPlan {
    segment_bytes: u64,
    stripe_unit_bytes: u32,
    total_segments: u32,
    members: Vec<(u32, u32, DeviceLayout)>,
}

/// The GC's write burst a pool on `devices` gets by default ([`OpenOptions::gc_burst_bytes`]):
/// what the devices prefer to be written in order (an SSD's stripe of erase blocks, a
/// drive-managed SMR band), on each member; 0 (none) on devices that declare nothing.
fn gc_burst_for(devices: &[Arc<dyn Device>]) -> u64 {
    preferred_alignment_bytes(devices).saturating_mul(devices.len() as u64)
}

/// The largest write size any of `devices` prefers in order (0: none declares one).
fn preferred_alignment_bytes(devices: &[Arc<dyn Device>]) -> u64 {
    devices.iter().map(|d| d.preferred_alignment_bytes()).max().unwrap_or(0)
}

/// Plans the members of a new pool. A linear pool concatenates the members' segments; a RAID
/// pool puts `segment_bytes / data members` of every segment on each member (RAID-1: all of
/// it), so every member holds as many segments as the smallest can, and the rest of a larger
/// member is left unused (and reported).
fn plan_members(devices: &[Arc<dyn Device>], cfg: &PoolConfig) -> Result<MemberPlan> {
    if cfg.array == ArrayKind::Linear {
        plan_linear(devices, cfg)
    } else {
        plan_array(devices, cfg)
    }
}

/// Refuses a segment size outside 1 MiB to 1 GiB or not a multiple of the grain.
fn check_segment_bytes(segment_bytes: u64, grain_bytes: u32) -> Result<()> {
    if !((1 << 20)..=(1 << 30)).contains(&segment_bytes) || !segment_bytes.is_multiple_of(grain_bytes as u64) {
        return Err(Error::InvalidConfig(format!(
            "segment size {} must be 1 MiB to 1 GiB and a multiple of the grain",
            human_bytes(segment_bytes)
        )));
    }
    Ok(())
}

/// [`plan_members`] for a linear pool: each member's segments follow the previous member's;
/// a zoned drive's segments are its zones.
fn plan_linear(devices: &[Arc<dyn Device>], cfg: &PoolConfig) -> Result<MemberPlan> {
    if cfg.stripe_unit_bytes.is_some() {
        return Err(Error::InvalidConfig("a linear array has no stripe unit".into()));
    }
    let zone_bytes = devices.iter().find_map(|d| d.zones().map(|z| z.zone_bytes()));
    let preferred = preferred_alignment_bytes(devices);
    let total: u64 = devices.iter().map(|d| d.size_bytes().saturating_sub(DEVICE_RESERVED_BYTES)).sum();
    let segment_bytes = match (cfg.segment_bytes, zone_bytes) {
        (Some(b), _) => b,
        // Segments align to zones: one segment per zone.
        (None, Some(z)) => z,
        // At least a device's preferred write size (an SSD's block stripe, an SMR band).
        (None, None) => default_segment_bytes(total).max(preferred.next_power_of_two().min(1 << 30)),
    };
    check_segment_bytes(segment_bytes, cfg.grain_bytes)?;
    let mut first = 0u32;
    let mut members = Vec::new();
    for d in devices {
        let (layout, count) = DeviceLayout::plan(d.as_ref(), segment_bytes)?;
        if count == 0 {
            return Err(Error::InvalidConfig(format!(
                "device {} ({}) is too small for one {} segment after its {} header",
                d.name(),
                human_bytes(d.size_bytes()),
                human_bytes(segment_bytes),
                human_bytes(layout.segments_offset_bytes)
            )));
        }
        let count = u32::try_from(count).map_err(|_| Error::InvalidConfig("too many segments".into()))?;
        members.push((first, count, layout));
        first = first
            .checked_add(count)
            .ok_or_else(|| Error::InvalidConfig("too many segments".into()))?;
    }
    Ok(MemberPlan {
        segment_bytes,
        stripe_unit_bytes: 0,
        total_segments: first,
        members,
    })
}

/// [`plan_members`] for a RAID pool: every member holds its share of each segment, as many
/// segments as the smallest member can.
fn plan_array(devices: &[Arc<dyn Device>], cfg: &PoolConfig) -> Result<MemberPlan> {
    let n = devices.len() as u32;
    let kind = cfg.array;
    if n < kind.min_members() {
        return Err(Error::InvalidConfig(format!(
            "{} needs at least {} devices; {n} given",
            kind.name(),
            kind.min_members()
        )));
    }
    if let Some(d) = devices.iter().find(|d| d.zones().is_some()) {
        return Err(Error::InvalidConfig(format!(
            "{}: a zoned drive cannot join a {} array (its members are written in place by rows); use a linear pool",
            d.name(),
            kind.name()
        )));
    }
    let unit = stripe_unit_bytes(kind, cfg)?;
    let data_members = match kind {
        ArrayKind::Raid0 => n,
        ArrayKind::Raid5 => n - 1,
        _ => 1,
    } as u64;
    let segment_bytes = array_segment_bytes(devices, cfg, unit, data_members)?;
    check_segment_bytes(segment_bytes, cfg.grain_bytes)?;
    let member_segment_bytes = segment_bytes / data_members;
    let (count, layouts) = plan_member_layouts(devices, kind, member_segment_bytes)?;
    Ok(MemberPlan {
        segment_bytes,
        stripe_unit_bytes: unit,
        total_segments: count,
        members: layouts.into_iter().map(|layout| (0, count, layout)).collect(),
    })
}

/// A RAID layout's stripe unit: the one configured, checked, or the layout's default (none for
/// RAID-1).
fn stripe_unit_bytes(kind: ArrayKind, cfg: &PoolConfig) -> Result<u32> {
    let unit = match (kind, cfg.stripe_unit_bytes) {
        (ArrayKind::Raid1, Some(_)) => return Err(Error::InvalidConfig("a raid1 array has no stripe unit".into())),
        (ArrayKind::Raid1, None) => 0,
        (ArrayKind::Raid0, u) => u.unwrap_or(super::DEFAULT_RAID0_STRIPE_UNIT_BYTES),
        (_, u) => u.unwrap_or(super::DEFAULT_RAID5_STRIPE_UNIT_BYTES),
    };
    if kind.is_striped() && (!unit.is_power_of_two() || unit < cfg.grain_bytes || unit > super::MAX_STRIPE_UNIT_BYTES) {
        return Err(Error::InvalidConfig(format!(
            "stripe unit {} must be a power of two from the grain ({}) to {}",
            human_bytes(unit as u64),
            human_bytes(cfg.grain_bytes as u64),
            human_bytes(super::MAX_STRIPE_UNIT_BYTES as u64)
        )));
    }
    Ok(unit)
}

/// A RAID pool's segment size: the one configured, which must be whole rows, or by default
/// a power-of-two share per data member, at least a stripe unit and a device's preferred
/// write size, and at least 1 MiB in all.
fn array_segment_bytes(devices: &[Arc<dyn Device>], cfg: &PoolConfig, unit: u32, data_members: u64) -> Result<u64> {
    let kind = cfg.array;
    let preferred = preferred_alignment_bytes(devices);
    let row = (unit as u64 * data_members).max(cfg.grain_bytes as u64);
    let smallest = devices.iter().map(|d| d.size_bytes()).min().unwrap_or(0);
    Ok(match cfg.segment_bytes {
        Some(b) => {
            if kind.is_striped() && !b.is_multiple_of(row) {
                // Exact sizes (a rounded "1.0 MiB" would read as the size just refused), at
                // least 1 MiB.
                let exact = |n: u64| format!("{}K", n / 1024);
                let above = b.div_ceil(row) * row;
                let below = b / row * row;
                let suggestion = if below >= 1 << 20 {
                    format!("{} or {}", exact(below), exact(above.max(1 << 20)))
                } else {
                    exact(above.max((1u64 << 20).div_ceil(row) * row))
                };
                return Err(Error::InvalidConfig(format!(
                    "segment size {} is not a whole number of {} rows ({} data members x {} stripe unit); try --segment-size {suggestion}",
                    human_bytes(b),
                    human_bytes(row),
                    data_members,
                    human_bytes(unit as u64)
                )));
            }
            b
        }
        None => {
            // Each member's share is a power of two, at least a stripe unit and a device's
            // preferred write size; the segment is at least 1 MiB.
            let data = smallest.saturating_sub(DEVICE_RESERVED_BYTES) * data_members;
            let mut share = (default_segment_bytes(data) / data_members)
                .next_power_of_two()
                .max(unit as u64)
                .max(preferred.next_power_of_two());
            while share * data_members < 1 << 20 {
                share *= 2;
            }
            share * data_members
        }
    })
}

/// Each member's layout for shares of `member_segment_bytes`, and the segments the array
/// holds (as many as its smallest member; what a larger one has beyond is reported unused).
fn plan_member_layouts(devices: &[Arc<dyn Device>], kind: ArrayKind, member_segment_bytes: u64) -> Result<(u32, Vec<DeviceLayout>)> {
    let mut plans = Vec::new();
    for d in devices {
        plans.push(DeviceLayout::plan(d.as_ref(), member_segment_bytes)?);
    }
    let count = plans.iter().map(|(_, c)| *c).min().unwrap_or(0);
    let count = u32::try_from(count).map_err(|_| Error::InvalidConfig("too many segments".into()))?;
    for (d, (layout, c)) in devices.iter().zip(&plans) {
        if *c > count as u64 {
            let why = if kind == ArrayKind::Raid1 {
                "every mirror holds as much as the smallest"
            } else {
                "the array stripes over the smallest member"
            };
            tracing::warn!(
                "{}: {} of it is left unused ({why})",
                d.name(),
                human_bytes((*c - count as u64) * member_segment_bytes)
            );
        }
        if count == 0 {
            return Err(Error::InvalidConfig(format!(
                "device {} ({}) is too small for one {} share of a segment after its {} header",
                d.name(),
                human_bytes(d.size_bytes()),
                human_bytes(member_segment_bytes),
                human_bytes(layout.segments_offset_bytes)
            )));
        }
    }
    Ok((count, plans.into_iter().map(|(layout, _)| layout).collect()))
}

/// Refuses options no pool can run with, before anything is written.
fn check_open_options(opts: &OpenOptions) -> Result<()> {
    match opts.gc_garbage_percent {
        Some(p) if !(1.0..=90.0).contains(&p) => Err(Error::InvalidConfig(format!(
            "GC garbage trigger {p}% is outside 1% to 90% of the written space"
        ))),
        _ => Ok(()),
    }
}

/// Runs the controllers' background work (the dual-mapping controller's merges) until the
/// pool shuts down: again at once while some volume did something, else every 50 ms.
fn maintenance_worker(eng: Arc<Engine>) {
    while !eng.shutting_down.load(SeqCst) {
        let busy = if eng.log.is_poisoned() {
            false
        } else {
            match eng.maintain() {
                Ok(busy) => busy,
                Err(e) => {
                    if !eng.log.is_poisoned() {
                        tracing::warn!("background maintenance failed: {e}");
                    }
                    false
                }
            }
        };
        if !busy {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
