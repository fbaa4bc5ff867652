//! The public face of the engine: create or open a pool on a set of devices, manage its volumes,
//! do I/O on them, flush, read statistics, and close cleanly.

use crate::array::{Array, Member};
use crate::capacity::{Capacity, Purpose, SegmentState};
use crate::controller::lsa::LsaVolume;
use crate::controller::map::{Encoding, PageMap};
use crate::controller::Controller;
use crate::device::Device;
use crate::engine::{Engine, Geometry};
use crate::error::{Error, Result};
use crate::format::{
    meta_entries_per_page, CheckpointRef, FormatError, PoolMeta, Superblock, VolumeRecord, DEVICE_RESERVED_BYTES, FORMAT_VERSION,
    MAX_CHECKPOINT_SEGMENTS, MAX_VOLUMES, MAX_VOLUME_NAME_BYTES, POOL_META_SLOT_BYTES, SUPERBLOCK_BYTES,
};
use crate::layout::DeviceLayout;
use crate::payload::WriteBuffer;
use crate::policy::placement::StreamLayout;
use crate::policy::{Registry, VictimParams};
use crate::util::AlignedBuf;
use parking_lot::Mutex;
use rand::Rng;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Most pages a volume may have (its map must fit in memory).
pub const MAX_VOLUME_PAGES: u64 = 1 << 32;

/// How to format a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub grain_bytes: u32,
    /// `None`: scale with the pool (about 1024 segments, between 1 MiB and 1 GiB).
    pub segment_bytes: Option<u64>,
    /// A metadata page after at most this many data pages; `None`: as many as a page holds.
    pub meta_interval_pages: Option<u32>,
    /// Victim-selection policy, by name (see [`crate::policy::Registry`]).
    pub victim_policy: String,
    /// Placement policy of volumes created without naming one.
    pub default_placement: String,
    /// Aging factor of the aging-greedy policy.
    pub gc_aging: f64,
    /// Physical space kept spare, as a percentage; sizes the default volume.
    pub spare_percent: f64,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            grain_bytes: 4096,
            segment_bytes: None,
            meta_interval_pages: None,
            victim_policy: "aging-greedy".into(),
            default_placement: "salsa".into(),
            gc_aging: 0.1,
            spare_percent: 20.0,
        }
    }
}

/// How to open a pool.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Run the GC in a background thread (otherwise writers run it when they need space).
    pub background_gc: bool,
    pub read_only: bool,
    /// Rebuild the maps by scanning every segment even after a clean shutdown (used by
    /// `salsa check` to compare the checkpoint with the log).
    pub force_scan: bool,
    /// Background GC threads; each cleans its own victim, so the device sees their I/O in
    /// parallel.
    pub gc_workers: usize,
    /// Policies the pool's and volumes' policy names are looked up in.
    pub policies: Registry,
    /// Also clean while garbage is above this percentage of the sealed segments' data space,
    /// however much is free (SepBIT's "garbage proportion" trigger). `None`: clean only when
    /// free space runs low, which moves the least data.
    pub gc_garbage_percent: Option<f64>,
    /// Threads that write sealed user records while writers go on (see
    /// [`crate::write_back`]); at most 16. With 0 every writer writes the records it fills
    /// itself, which keeps the order of device writes deterministic (crash tests use that).
    pub write_back_threads: usize,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            background_gc: true,
            read_only: false,
            force_scan: false,
            gc_workers: 4,
            policies: Registry::builtin(),
            gc_garbage_percent: None,
            write_back_threads: 4,
        }
    }
}

/// How the state was rebuilt at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenedFrom {
    NewPool,
    Checkpoint,
    RecoveryScan,
}

/// A pool of devices serving volumes.
pub struct Pool {
    eng: Arc<Engine>,
    gc_threads: Mutex<Vec<JoinHandle<()>>>,
    opened_from: OpenedFrom,
    spare_basis_points: u32,
    victim_policy: String,
    default_placement: String,
    policies: Registry,
    closed: bool,
}

/// Snapshot of the statistics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub user_bytes_written: u64,
    pub user_bytes_read: u64,
    pub gc_bytes_relocated: u64,
    pub device_bytes_written: u64,
    pub metadata_bytes_written: u64,
    /// Device bytes written per user byte written (data, relocations and metadata).
    pub write_amplification: f64,
    /// (user + GC relocation bytes) per user byte: the classical host WA of cleaning.
    pub gc_write_amplification: f64,
    pub free_segments: u32,
    pub total_segments: u32,
    pub segment_bytes: u64,
    pub gc_segments_cleaned: u64,
    pub flushes: u64,
    pub syncs: u64,
    pub sync_micros: u64,
    pub gc_micros: u64,
    pub throttled_allocations: u64,
    /// Victims the GC waited a full second for, for writers to take replaced pages off their
    /// count (0 unless something is wrong).
    pub gc_wait_timeouts: u64,
    /// User bytes written that records held in the writers' payload buffers instead of
    /// copying them (zero-copy writes, [`Volume::write_payload`]).
    pub user_bytes_held: u64,
    /// Payload buffers out now: being received, or held by records not yet on the device
    /// (at most [`crate::engine::PAYLOAD_BUDGET_BYTES`]).
    pub payload_buffer_bytes: u64,
    /// Memory held by the page maps.
    pub map_memory_bytes: u64,
    /// Memory held by the per-grain checksum table.
    pub crc_table_memory_bytes: u64,
    /// Segments per state: free, staged (open), allocated, victim, pending-free, checkpoint.
    pub segments_by_state: [u32; 6],
    /// Segments the GC gave up on because their metadata did not account for every page the
    /// map places there (damage, or an accounting bug): their space is lost until reopen.
    pub unmovable_segments: u32,
    pub volumes: Vec<VolumeStats>,
    pub device_counters: Vec<(String, String, u64)>,
}

/// A volume's statistics, as its controller reports them.
pub type VolumeStats = crate::controller::ControllerStats;

fn default_segment_bytes(total_bytes: u64) -> u64 {
    let target = (total_bytes / 1024).max(1 << 20);
    let pow = 1u64 << (63 - target.leading_zeros());
    pow.clamp(1 << 20, 1 << 30)
}

fn io_err(dev: &dyn Device, op: &'static str, offset: u64, source: std::io::Error) -> Error {
    Error::Io {
        device: dev.name().to_string(),
        op,
        offset,
        source,
    }
}

/// Reads a block the pool may or may not have written; on a zoned device whatever lies beyond a
/// write pointer reads as zeros.
fn read_block(dev: &dyn Device, offset: u64, len: usize) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::zeroed(len);
    crate::device::zone::read_written(dev, &mut b, offset).map_err(|e| io_err(dev, "read", offset, e))?;
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

/// Formats the head of a device: the superblock, and zeros over the metadata slots so nothing
/// of an earlier pool survives in them. Sequential zones are reset first.
fn write_superblock(d: &dyn Device, sb: &Superblock) -> Result<()> {
    let head = sb.layout.meta_slot_offsets[0].min(sb.layout.meta_slot_offsets[1]);
    let mut buf = match crate::layout::in_sequential_zone(d, 0)? {
        Some(zone) => {
            let z = d.zones().expect("a sequential zone is on a zoned device");
            z.reset_zone(zone).map_err(|e| io_err(d, "reset zone", 0, e))?;
            AlignedBuf::zeroed(SUPERBLOCK_BYTES)
        }
        None => AlignedBuf::zeroed(
            (head + POOL_META_SLOT_BYTES as u64)
                .max(DEVICE_RESERVED_BYTES)
                .min(sb.layout.segments_offset_bytes) as usize,
        ),
    };
    buf[..SUPERBLOCK_BYTES].copy_from_slice(&sb.encode());
    d.write_at(&buf, 0).map_err(|e| io_err(d, "write superblock", 0, e))?;
    d.sync().map_err(|e| io_err(d, "sync", 0, e))
}

fn validate_volume(name: &str, page_bytes: u32, grain_bytes: u32, size_bytes: u64) -> Result<()> {
    if name.is_empty() || name.len() > MAX_VOLUME_NAME_BYTES || name.chars().any(|c| c.is_control() || c == '/') {
        return Err(Error::InvalidArgument(format!(
            "volume name {name:?} must be 1 to {MAX_VOLUME_NAME_BYTES} bytes without '/' or control characters"
        )));
    }
    if !(4096..=65536).contains(&page_bytes) || !page_bytes.is_multiple_of(grain_bytes) || !page_bytes.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "page size {page_bytes} must be a power of two from 4 KiB to 64 KiB and a multiple of the grain ({grain_bytes})"
        )));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(page_bytes as u64) {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} must be a non-zero multiple of the page size {page_bytes}"
        )));
    }
    if size_bytes / page_bytes as u64 > MAX_VOLUME_PAGES {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} exceeds {MAX_VOLUME_PAGES} pages"
        )));
    }
    Ok(())
}

impl Pool {
    /// Formats `devices` as a new pool (overwriting whatever they hold) and opens it.
    pub fn create(devices: Vec<Arc<dyn Device>>, cfg: &PoolConfig, opts: &OpenOptions) -> Result<Pool> {
        if devices.is_empty() || devices.len() > u16::MAX as usize {
            return Err(Error::InvalidConfig("a pool needs between 1 and 65535 devices".into()));
        }
        check_open_options(opts)?;
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
        let zone_bytes = devices.iter().find_map(|d| d.zones().map(|z| z.zone_bytes()));
        let total: u64 = devices.iter().map(|d| d.size_bytes().saturating_sub(DEVICE_RESERVED_BYTES)).sum();
        let segment_bytes = match (cfg.segment_bytes, zone_bytes) {
            (Some(b), _) => b,
            // Segments align to zones: one segment per zone.
            (None, Some(z)) => z,
            // At least a device's preferred write size (an SSD's block stripe, an SMR band).
            (None, None) => {
                let preferred = devices.iter().map(|d| d.preferred_alignment_bytes()).max().unwrap_or(0);
                default_segment_bytes(total).max(preferred.next_power_of_two().min(1 << 30))
            }
        };
        if !((1 << 20)..=(1 << 30)).contains(&segment_bytes) || !segment_bytes.is_multiple_of(cfg.grain_bytes as u64) {
            return Err(Error::InvalidConfig(format!(
                "segment size {segment_bytes} must be 1 MiB to 1 GiB and a multiple of the grain"
            )));
        }
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
        let mut first = 0u32;
        let mut sbs = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let (layout, count) = DeviceLayout::plan(d.as_ref(), segment_bytes)?;
            if count == 0 {
                return Err(Error::InvalidConfig(format!(
                    "device {} ({} bytes) is too small for one {segment_bytes}-byte segment after its {}-byte header",
                    d.name(),
                    d.size_bytes(),
                    layout.segments_offset_bytes
                )));
            }
            let count = u32::try_from(count).map_err(|_| Error::InvalidConfig("too many segments".into()))?;
            sbs.push((count, first, i, layout));
            first = first
                .checked_add(count)
                .ok_or_else(|| Error::InvalidConfig("too many segments".into()))?;
        }
        if first < 16 {
            return Err(Error::InvalidConfig(format!(
                "the pool needs at least 16 segments; it has {first}: use smaller segments or bigger devices"
            )));
        }
        for (count, start, i, layout) in sbs {
            let d = &devices[i];
            let sb = Superblock {
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
            };
            write_superblock(d.as_ref(), &sb)?;
        }
        let mut meta = PoolMeta {
            pool_id,
            generation: 0,
            session_id: 0,
            clean: false,
            next_volume_id: 1,
            volumes: vec![],
            checkpoint: None,
        };
        crate::engine::write_meta_slot(
            devices[0].as_ref(),
            &DeviceLayout::plan(devices[0].as_ref(), segment_bytes)?.0,
            &mut meta,
        )?;
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
    pub fn open_with_progress(devices: Vec<Arc<dyn Device>>, opts: &OpenOptions, progress: &dyn Fn(u64, u64)) -> Result<Pool> {
        if devices.is_empty() {
            return Err(Error::InvalidConfig("no devices given".into()));
        }
        check_open_options(opts)?;
        let mut sbs = Vec::new();
        for d in &devices {
            sbs.push(read_superblock(d.as_ref())?);
        }
        let first = sbs[0].clone();
        let mut ordered: Vec<Option<(Arc<dyn Device>, Superblock)>> = vec![None; first.device_count as usize];
        for (d, sb) in devices.iter().zip(sbs) {
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
                && sb.meta_interval_pages == first.meta_interval_pages;
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
            let slot = &mut ordered[sb.device_index as usize];
            if slot.is_some() {
                return Err(Error::InvalidConfig(format!(
                    "device index {} given twice ({})",
                    sb.device_index,
                    d.name()
                )));
            }
            *slot = Some((d.clone(), sb));
        }
        let mut members = Vec::new();
        let mut next_segment = 0u32;
        for (i, m) in ordered.into_iter().enumerate() {
            let Some((device, sb)) = m else {
                return Err(Error::MissingMember {
                    pool: first.pool_id,
                    expected: first.device_count,
                    given: devices.len() as u32,
                    missing: i as u32,
                });
            };
            if sb.first_segment != next_segment {
                return Err(Error::DamagedSuperblock {
                    device: device.name().into(),
                    reason: "segment ranges of the members do not line up".into(),
                });
            }
            next_segment += sb.segment_count;
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
        let dev0 = members[0].device.clone();
        let layout0 = members[0].layout;
        let mut best: Option<PoolMeta> = None;
        for off in layout0.meta_slot_offsets {
            let b = read_block(dev0.as_ref(), off, POOL_META_SLOT_BYTES)?;
            if let Ok(m) = PoolMeta::decode(&b) {
                if m.pool_id == first.pool_id && best.as_ref().is_none_or(|b| m.generation > b.generation) {
                    best = Some(m);
                }
            }
        }
        let Some(old_meta) = best else {
            return Err(Error::Corrupt(format!(
                "no valid pool metadata on {} (both copies damaged)",
                dev0.name()
            )));
        };
        let grain = first.grain_bytes;
        for v in &old_meta.volumes {
            validate_volume(&v.name, v.page_bytes, grain, v.size_bytes)
                .map_err(|e| Error::Corrupt(format!("volume table entry {:?}: {e}", v.name)))?;
        }
        let gps = (first.segment_bytes / grain as u64) as u32;
        let geo = Geometry {
            grain_bytes: grain,
            segment_bytes: first.segment_bytes,
            grains_per_segment: gps,
            total_segments: first.total_segments,
            total_grains: first.total_segments as u64 * gps as u64,
            meta_entries: meta_entries_per_page(grain as usize) as u32,
            meta_interval_pages: first.meta_interval_pages.min(meta_entries_per_page(grain as usize) as u32),
        };
        let array = Array::new(members, first.segment_bytes, grain as u64)?;
        let capacity = Capacity::new((0..first.total_segments).map(|s| array.storage_type(s)).collect(), gps);
        // Mark the pool in use before anything else is written; its new generation is this
        // session's epoch, so every id and sequence number of this session is larger than any
        // of an earlier one.
        let mut meta = old_meta.clone();
        meta.clean = false;
        meta.checkpoint = None;
        meta.session_id = rand::thread_rng().gen();
        if !opts.read_only {
            crate::engine::write_meta_slot(dev0.as_ref(), &layout0, &mut meta)?;
        }
        let policy = opts
            .policies
            .victim(
                &first.victim_policy,
                &VictimParams {
                    aging: first.gc_aging_milli as f64 / 1000.0,
                },
            )
            .map_err(|e| Error::InvalidConfig(format!("{e} (register it in OpenOptions::policies)")))?;
        let mut placements = Vec::new();
        for v in &old_meta.volumes {
            let p = opts
                .policies
                .placement(&v.placement, v.size_bytes / v.page_bytes as u64)
                .map_err(|e| Error::InvalidConfig(format!("volume {:?}: {e} (register it in OpenOptions::policies)", v.name)))?;
            placements.push(p);
        }
        let eng = Engine::new(
            first.pool_id,
            geo,
            array,
            capacity,
            meta,
            policy,
            opts.background_gc,
            opts.gc_garbage_percent.map(|p| p / 100.0),
            opts.read_only,
        );
        let encoding = Encoding {
            total_grains: geo.total_grains,
            total_segments: geo.total_segments,
        };
        {
            let mut vols = eng.volumes.write();
            for (v, placement) in old_meta.volumes.iter().zip(placements) {
                let map = PageMap::new(v.size_bytes / v.page_bytes as u64, encoding);
                vols.insert(v.id, Arc::new(LsaVolume::new(v, map, grain, placement)));
            }
        }
        let mut opened_from = OpenedFrom::RecoveryScan;
        match (old_meta.clean && !opts.force_scan, &old_meta.checkpoint) {
            (true, Some(cp)) => match crate::recovery::load_checkpoint(&eng, cp, old_meta.session_id) {
                Ok(()) => opened_from = OpenedFrom::Checkpoint,
                Err(e) => {
                    tracing::warn!("checkpoint unusable ({e}); recovering by scanning every segment");
                    crate::recovery::clear_maps(&eng);
                    crate::recovery::scan(&eng, progress)?;
                }
            },
            _ => {
                tracing::info!("pool was not shut down cleanly; scanning {} segments", geo.total_segments);
                crate::recovery::scan(&eng, progress)?;
            }
        }
        if !opts.read_only {
            // What recovery read is now the state; make it durable before anything new lands.
            eng.array.sync_all()?;
        }
        let eng = Arc::new(eng);
        let pool = Pool {
            eng: eng.clone(),
            gc_threads: Mutex::new(Vec::new()),
            opened_from,
            spare_basis_points: first.spare_basis_points,
            victim_policy: first.victim_policy.clone(),
            default_placement: first.default_placement.clone(),
            policies: opts.policies.clone(),
            closed: false,
        };
        if !opts.read_only {
            crate::write_back::WriteBack::start(&eng, opts.write_back_threads)?;
        }
        if opts.background_gc && !opts.read_only {
            for i in 0..opts.gc_workers.clamp(1, 16) {
                let e = eng.clone();
                let h = std::thread::Builder::new()
                    .name(format!("salsa-gc-{i}"))
                    .spawn(move || gc_worker(e))
                    .map_err(|e| Error::InvalidConfig(format!("cannot start a GC thread: {e}")))?;
                pool.gc_threads.lock().push(h);
            }
        }
        Ok(pool)
    }

    pub fn opened_from(&self) -> OpenedFrom {
        self.opened_from
    }

    /// The member devices, in pool order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.eng.array.members().iter().map(|m| m.device.clone()).collect()
    }

    pub fn pool_id(&self) -> u128 {
        self.eng.pool_id
    }

    pub fn geometry(&self) -> Geometry {
        self.eng.geo
    }

    /// Logical bytes the pool offers at its configured spare: what a default volume gets.
    pub fn logical_capacity_bytes(&self) -> u64 {
        let physical = self.eng.geo.total_grains * self.eng.geo.grain_bytes as u64;
        let bytes = physical / 10_000 * (10_000 - self.spare_basis_points as u64);
        let usable = self.usable_bytes_for(&[self.default_placement.as_str()]).unwrap_or(0);
        bytes.min(usable) / 65536 * 65536
    }

    /// Bytes of data the pool can hold when its volumes have the given placement policies (one
    /// entry per volume): each stream of each volume may keep a segment open, which the GC
    /// needs on top of its reserve. Errs on an unknown placement.
    pub fn usable_bytes_for(&self, placements: &[&str]) -> Result<u64> {
        let mut streams = 0u64;
        for name in placements {
            let p = self.policies.placement(name, 1).map_err(Error::InvalidArgument)?;
            streams += StreamLayout::of(p.as_ref()).count() as u64;
        }
        Ok(self.eng.usable_grains_for_streams(streams) * self.eng.geo.grain_bytes as u64)
    }

    /// Spare space the pool was formatted with, in percent.
    pub fn spare_percent(&self) -> f64 {
        self.spare_basis_points as f64 / 100.0
    }

    /// The pool's victim-selection policy.
    pub fn victim_policy(&self) -> &str {
        &self.victim_policy
    }

    /// The placement policy of volumes created without naming one.
    pub fn default_placement(&self) -> &str {
        &self.default_placement
    }

    // ----- volumes -----

    /// Creates a volume with the pool's default placement policy. Its size may exceed the
    /// free space (thin provisioning).
    pub fn create_volume(&self, name: &str, size_bytes: u64, page_bytes: u32) -> Result<Volume> {
        let placement = self.default_placement.clone();
        self.create_volume_with(name, size_bytes, page_bytes, &placement)
    }

    /// Creates a volume with the named placement policy.
    pub fn create_volume_with(&self, name: &str, size_bytes: u64, page_bytes: u32, placement: &str) -> Result<Volume> {
        self.eng.check_writable()?;
        validate_volume(name, page_bytes, self.eng.geo.grain_bytes, size_bytes)?;
        let policy = self
            .policies
            .placement(placement, size_bytes / page_bytes as u64)
            .map_err(Error::InvalidArgument)?;
        let mut meta = self.eng.meta.lock();
        if meta.volumes.iter().any(|v| v.name == name) {
            return Err(Error::VolumeExists(name.into()));
        }
        if meta.volumes.len() >= MAX_VOLUMES {
            return Err(Error::InvalidArgument(format!("a pool holds at most {MAX_VOLUMES} volumes")));
        }
        let id = meta.next_volume_id;
        let mut next = meta.clone();
        next.next_volume_id += 1;
        let rec = VolumeRecord {
            id,
            name: name.into(),
            size_bytes,
            page_bytes,
            placement: placement.into(),
        };
        next.volumes.push(rec.clone());
        self.eng.write_pool_meta(&mut next)?;
        *meta = next;
        let encoding = Encoding {
            total_grains: self.eng.geo.total_grains,
            total_segments: self.eng.geo.total_segments,
        };
        let map = PageMap::new(size_bytes / page_bytes as u64, encoding);
        let vol = Arc::new(LsaVolume::new(&rec, map, self.eng.geo.grain_bytes, policy));
        self.eng.volumes.write().insert(id, vol.clone());
        Ok(Volume {
            eng: self.eng.clone(),
            vol,
        })
    }

    /// A handle on a volume.
    pub fn volume(&self, name: &str) -> Result<Volume> {
        let found = self.eng.volumes.read().values().find(|v| v.name() == name).cloned();
        let vol = found
            .ok_or_else(|| Error::VolumeNotFound(name.into()))?
            .into_any()
            .downcast::<LsaVolume>()
            .map_err(|_| Error::InvalidArgument(format!("volume {name:?} is not a page-mapped (LSA) volume")))?;
        Ok(Volume {
            eng: self.eng.clone(),
            vol,
        })
    }

    /// Names of all volumes.
    pub fn volume_names(&self) -> Vec<String> {
        self.eng.volumes.read().values().map(|v| v.name().to_string()).collect()
    }

    /// Grows a volume.
    pub fn grow_volume(&self, name: &str, new_size_bytes: u64) -> Result<()> {
        self.eng.check_writable()?;
        let vol = self.volume(name)?.vol;
        validate_volume(name, vol.page_bytes, self.eng.geo.grain_bytes, new_size_bytes)?;
        if new_size_bytes < vol.size_bytes() {
            return Err(Error::InvalidArgument(format!(
                "volume {name:?} is {} bytes; shrinking is not supported (create a smaller volume and copy)",
                vol.size_bytes()
            )));
        }
        let mut meta = self.eng.meta.lock();
        let mut next = meta.clone();
        for v in next.volumes.iter_mut().filter(|v| v.id == vol.id) {
            v.size_bytes = new_size_bytes;
        }
        self.eng.write_pool_meta(&mut next)?;
        *meta = next;
        vol.grow(new_size_bytes);
        Ok(())
    }

    /// Deletes a volume; its space returns to the pool.
    pub fn delete_volume(&self, name: &str) -> Result<()> {
        self.eng.check_writable()?;
        let vol = self.volume(name)?.vol;
        // No GC victim of this volume may be in progress.
        let _gc = self.eng.gc_lock.write();
        let _gate = vol.gate.write();
        vol.deleted.store(true, SeqCst);
        {
            let mut meta = self.eng.meta.lock();
            let mut next = meta.clone();
            next.volumes.retain(|v| v.id != vol.id);
            self.eng.write_pool_meta(&mut next)?;
            *meta = next;
        }
        // The deletion is durable: the volume's records are now garbage. Let in-flight records
        // land before their segments can be reused.
        for r in vol.close_streams(&self.eng) {
            self.eng.write_record(r)?;
        }
        self.eng.volumes.write().remove(&vol.id);
        self.eng.flush()?;
        self.eng
            .mapped_grains
            .fetch_sub(vol.mapped_pages.load(SeqCst) * vol.page_grains as u64, SeqCst);
        self.eng.capacity.free_owned_by(vol.id);
        Ok(())
    }

    // ----- pool-wide -----

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        self.eng.flush()
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let c = &self.eng.counters;
        let user = c.user_bytes_written.load(SeqCst);
        let gc = c.gc_bytes_relocated.load(SeqCst);
        let dev = c.device_bytes_written.load(SeqCst);
        let ratio = |a: u64| if user == 0 { 0.0 } else { a as f64 / user as f64 };
        let vols: Vec<VolumeStats> = self.eng.volumes.read().values().map(|v| v.stats()).collect();
        let mut device_counters = Vec::new();
        for m in self.eng.array.members() {
            for (k, v) in m.device.counters() {
                device_counters.push((m.device.name().to_string(), k, v));
            }
        }
        Stats {
            user_bytes_written: user,
            user_bytes_read: c.user_bytes_read.load(SeqCst),
            gc_bytes_relocated: gc,
            device_bytes_written: dev,
            metadata_bytes_written: c.meta_bytes_written.load(SeqCst),
            write_amplification: ratio(dev),
            gc_write_amplification: ratio(user + gc),
            free_segments: self.eng.capacity.free_segments(),
            total_segments: self.eng.geo.total_segments,
            segment_bytes: self.eng.geo.segment_bytes,
            gc_segments_cleaned: c.gc_segments_cleaned.load(SeqCst),
            flushes: c.flushes.load(SeqCst),
            syncs: c.syncs.load(SeqCst),
            sync_micros: c.sync_micros.load(SeqCst),
            gc_micros: c.gc_micros.load(SeqCst),
            throttled_allocations: c.throttled_allocations.load(SeqCst),
            gc_wait_timeouts: c.gc_wait_timeouts.load(SeqCst),
            user_bytes_held: c.user_bytes_held.load(SeqCst),
            payload_buffer_bytes: self.eng.payloads.outstanding_bytes() as u64,
            map_memory_bytes: vols.iter().map(|v| v.map_memory_bytes).sum(),
            crc_table_memory_bytes: self.eng.crc_table.len() as u64 * 4,
            segments_by_state: {
                let mut by = [0u32; 6];
                for s in self.eng.capacity.segments() {
                    by[s.state() as usize] += 1;
                }
                by
            },
            unmovable_segments: self.eng.capacity.segments().iter().filter(|s| s.unmovable.load(SeqCst)).count() as u32,
            volumes: vols,
            device_counters,
        }
    }

    fn stop_gc(&self) {
        self.eng.shutting_down.store(true, SeqCst);
        self.eng.wake_gc();
        for h in self.gc_threads.lock().drain(..) {
            let _ = h.join();
        }
    }

    /// Clean shutdown: stops the GC, writes every open record, syncs, and writes a checkpoint
    /// of every map so that the next open needs no scan.
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        self.stop_gc();
        if self.eng.read_only {
            return Ok(());
        }
        self.eng.check_not_poisoned()?;
        let sb = self.eng.geo.segment_bytes as usize;
        let needed = crate::recovery::checkpoint_bytes(&self.eng).div_ceil(sb);
        // First clean until the checkpoint fits above the GC reserve (bounded: each step frees
        // or schedules a segment). This must come before the image is taken: the GC moves
        // data, and the image must point where the data finally is.
        if needed <= MAX_CHECKPOINT_SEGMENTS {
            let reserve = self.eng.capacity.watermarks.gc_reserve as usize;
            for _ in 0..self.eng.geo.total_segments {
                if self.eng.capacity.free_segments() as usize > reserve + needed || !self.eng.gc_step()? {
                    break;
                }
            }
        }
        // Then close every stream (the GC's too), so nothing moves any more, and flush.
        for v in self.eng.volumes.read().values().cloned().collect::<Vec<_>>() {
            for r in v.close_streams(&self.eng) {
                self.eng.write_record(r)?;
            }
        }
        self.eng.flush()?;
        // Nothing is left to write back; what follows writes synchronously.
        self.eng.write_back.stop();
        let session_id = self.eng.meta.lock().session_id;
        let blob = crate::recovery::encode_checkpoint(&self.eng, session_id);
        debug_assert_eq!(blob.len(), crate::recovery::checkpoint_bytes(&self.eng));
        let mut segs = Vec::new();
        if needed <= MAX_CHECKPOINT_SEGMENTS {
            while segs.len() < needed {
                match self
                    .eng
                    .capacity
                    .try_allocate(&crate::engine::CHECKPOINT_TYPES, Purpose::Checkpoint)
                {
                    Some(s) => {
                        segs.push(s);
                        self.eng.array.prepare_segment(s)?;
                    }
                    None => break,
                }
            }
        }
        if segs.len() < needed {
            tracing::warn!("no room for a {}-byte checkpoint; the next open will scan", blob.len());
            return Ok(());
        }
        let gps = self.eng.geo.grains_per_segment as u64;
        for (i, &s) in segs.iter().enumerate() {
            let chunk = &blob[i * sb..((i + 1) * sb).min(blob.len())];
            let mut buf = AlignedBuf::zeroed(chunk.len().next_multiple_of(self.eng.geo.grain_bytes as usize));
            buf[..chunk.len()].copy_from_slice(chunk);
            self.eng.array.write(s as u64 * gps, &buf)?;
        }
        self.eng.array.sync_all()?;
        let mut meta = self.eng.meta.lock();
        let mut next = meta.clone();
        next.clean = true;
        next.checkpoint = Some(CheckpointRef {
            segments: segs.clone(),
            bytes: blob.len() as u64,
            crc: crc32c::crc32c(&blob),
        });
        self.eng.write_pool_meta(&mut next)?;
        *meta = next;
        for s in segs {
            debug_assert_eq!(self.eng.capacity.segment(s).state(), SegmentState::Checkpoint);
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.closed {
            // Not a clean shutdown (no checkpoint): make what was written durable if the
            // devices still answer, and leave the rest to recovery.
            self.stop_gc();
            if !self.eng.read_only && !self.eng.is_poisoned() {
                let _ = self.eng.flush();
            }
        }
        // Writes what is still queued (or fails it on a poisoned pool) and joins the threads,
        // which hold the engine.
        self.eng.write_back.stop();
    }
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

fn gc_worker(eng: Arc<Engine>) {
    while !eng.shutting_down.load(SeqCst) {
        if eng.needs_gc_round() && !eng.is_poisoned() {
            if let Err(e) = eng.gc_round() {
                if !eng.is_poisoned() {
                    tracing::error!("garbage collection failed: {e}");
                    eng.gc_stuck.store(true, SeqCst);
                    eng.capacity.changed.notify_all();
                }
            }
        }
        eng.gc_wait(Duration::from_millis(50));
    }
}

/// A volume handle: byte-addressed I/O.
#[derive(Clone)]
pub struct Volume {
    eng: Arc<Engine>,
    vol: Arc<LsaVolume>,
}

impl Volume {
    pub fn name(&self) -> &str {
        &self.vol.name
    }
    pub fn size_bytes(&self) -> u64 {
        self.vol.size_bytes()
    }
    pub fn page_bytes(&self) -> u32 {
        self.vol.page_bytes
    }
    /// Mapped (written and not trimmed) bytes.
    pub fn mapped_bytes(&self) -> u64 {
        self.vol.mapped_pages.load(SeqCst) * self.vol.page_bytes as u64
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.vol.deleted.load(SeqCst) {
            return Err(Error::VolumeNotFound(self.vol.name.clone()));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.vol.size_bytes() => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "range of {len} bytes at {offset} is past the end of volume {:?} ({} bytes)",
                self.vol.name,
                self.vol.size_bytes()
            ))),
        }
    }

    /// Splits `[offset, offset + len)` into (page, offset in page, length) pieces.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
        let pb = self.vol.page_bytes as u64;
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let page = at / pb;
            let in_page = at % pb;
            let n = (pb - in_page).min(end - at);
            at += n;
            Some((page, in_page as usize, n as usize))
        })
    }

    /// Reads `buf.len()` bytes at `offset`. Never-written and trimmed bytes read as zeros; a
    /// checksum mismatch is an error, never wrong data.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let _gate = self.vol.gate.read();
        let map = self.vol.map();
        let pb = self.vol.page_bytes as usize;
        let mut tmp = Vec::new();
        let mut done = 0;
        for (page, in_page, n) in self.pieces(offset, buf.len() as u64) {
            if n == pb {
                self.vol.read_page(&self.eng, &map, page, &mut buf[done..done + n])?;
            } else {
                tmp.resize(pb, 0);
                self.vol.read_page(&self.eng, &map, page, &mut tmp)?;
                buf[done..done + n].copy_from_slice(&tmp[in_page..in_page + n]);
            }
            done += n;
        }
        self.eng.counters.user_bytes_read.fetch_add(buf.len() as u64, SeqCst);
        Ok(())
    }

    /// Writes `data` at `offset`; durable after the next flush. Partial pages are
    /// read-modify-write.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_from(offset, data, None)
    }

    /// A buffer to receive a write's payload of `len` bytes into, for
    /// [`Volume::write_payload`]; `None` when `len` is outside the sizes worth it or the pool's
    /// budget of such buffers is spent (then write through [`Volume::write`]).
    pub fn payload_buffer(&self, len: usize) -> Option<WriteBuffer> {
        self.eng.payloads.get(len)
    }

    /// Writes `payload` at `offset`, like [`Volume::write`], except that the records its whole
    /// pages go to hold them in the payload rather than copying them (zero-copy). The buffer
    /// goes back to its pool once no record holds it.
    pub fn write_payload(&self, offset: u64, payload: WriteBuffer) -> Result<()> {
        let payload = Arc::new(payload);
        self.write_from(offset, &payload, Some(&payload))
    }

    /// [`Volume::write`] of `data`, which is all of `payload` when one is given.
    fn write_from(&self, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        self.eng.check_writable()?;
        let _gate = self.vol.gate.read();
        let map = self.vol.map();
        let pb = self.vol.page_bytes as usize;
        if !data.is_empty() {
            let first = offset / pb as u64;
            let last = (offset + data.len() as u64 - 1) / pb as u64;
            self.vol.check_space(&self.eng, &map, first..last + 1)?;
        }
        let mut done = 0;
        // Whole pages go down in runs (one call for all the whole pages of the request); only
        // the partial pages at either end are read-modify-write.
        let mut run: Option<(u64, usize)> = None; // (first page, offset in `data`)
        for (page, in_page, n) in self.pieces(offset, data.len() as u64) {
            if n == pb {
                run.get_or_insert((page, done));
            } else {
                if let Some((first, at)) = run.take() {
                    self.vol
                        .write_pages(&self.eng, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
                }
                let _rmw = self.vol.rmw_lock(page).lock();
                let mut tmp = vec![0u8; pb];
                self.vol.read_page(&self.eng, &map, page, &mut tmp)?;
                tmp[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
                self.vol.write_pages(&self.eng, &map, page, &tmp, None)?;
            }
            done += n;
        }
        if let Some((first, at)) = run {
            self.vol
                .write_pages(&self.eng, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
        }
        self.eng.counters.user_bytes_written.fetch_add(data.len() as u64, SeqCst);
        Ok(())
    }

    /// Writes and makes the write durable before returning (FUA).
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.eng.flush()
    }

    /// Discards whole pages inside the range (they read as zeros); partial pages at the edges
    /// are left as they are, as TRIM is advisory.
    pub fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.eng.check_writable()?;
        let _gate = self.vol.gate.read();
        let pb = self.vol.page_bytes as u64;
        let first = offset.div_ceil(pb);
        let end = (offset + len) / pb;
        if end > first {
            let map = self.vol.map();
            self.vol.trim_pages(&self.eng, &map, first, end - first)?;
        }
        Ok(())
    }

    /// Makes the range read as zeros: whole pages are trimmed, partial pages are rewritten
    /// (unless they hold no data, which already reads as zeros). Needs no new space.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        self.eng.check_writable()?;
        let pb = self.vol.page_bytes as u64;
        let (first_full, end_full) = (offset.div_ceil(pb) * pb, (offset + len) / pb * pb);
        let zero_part = |from: u64, to: u64| -> Result<()> {
            if to > from && self.is_mapped(from) {
                self.write(from, &vec![0u8; (to - from) as usize])?;
            }
            Ok(())
        };
        if end_full <= first_full {
            // Inside one page, or straddling two without covering either.
            let mid = (offset / pb + 1) * pb;
            zero_part(offset, mid.min(offset + len))?;
            return zero_part(mid, offset + len);
        }
        zero_part(offset, first_full)?;
        self.trim(first_full, end_full - first_full)?;
        zero_part(end_full, offset + len)
    }

    /// Pool-wide flush.
    pub fn flush(&self) -> Result<()> {
        self.eng.flush()
    }

    /// Physical grain holding page `page`, `None` when it reads as zeros (never written or
    /// trimmed).
    pub fn page_location(&self, page: u64) -> Option<u64> {
        let map = self.vol.map();
        match (page < map.pages()).then(|| map.load(page)) {
            Some(crate::controller::map::Entry::Mapped(g)) => Some(g),
            _ => None,
        }
    }

    /// Pages in the volume.
    pub fn pages(&self) -> u64 {
        self.vol.pages()
    }

    /// Whether the page holding `offset` is mapped to data (for block-status queries).
    pub fn is_mapped(&self, offset: u64) -> bool {
        self.page_location(offset / self.vol.page_bytes as u64).is_some()
    }
}
