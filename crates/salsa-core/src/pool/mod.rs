//! The public face of the engine: create or open a pool on a set of devices, manage its volumes,
//! do I/O on them, flush, read statistics, and close cleanly.
//!
//! - `open`: formatting a pool, opening one (every member checked before anything
//!   is written), recovery, starting the GC and write-back threads;
//! - `volumes`: the volume table (create, grow, delete) and the [`Volume`]
//!   handle's byte-addressed I/O;
//! - `stats`: the statistics snapshot;
//! - here: the pool's options and handle, flush, and the clean shutdown that writes a
//!   checkpoint.

mod open;
mod rebuild;
mod stats;
mod volumes;

pub use crate::controller::amf::default_segment_bytes as default_amf_segment_bytes;
pub use crate::controller::dual::default_sparse_pages;
pub use crate::util::human_bytes;
pub use open::{device_is_blank, first_non_blank, read_superblock};
pub use rebuild::{RebuildOptions, RebuildReport};
pub use stats::{RebuildProgress, Stats, VolumeStats};
pub use volumes::{ShareRange, Volume, VolumeSpec, WrittenNow, MAX_SHARE_OWNERS, MAX_SHARE_RANGES};

use crate::array::PageCheck;
use crate::device::Device;
use crate::engine::Engine;
use crate::error::{Error, Result};
pub use crate::format::{ArrayKind, ControllerKind};
use crate::format::{CheckpointRef, MAX_CHECKPOINT_SEGMENTS};
use crate::log::capacity::{Purpose, SegmentState};
use crate::log::Geometry;
use crate::policy::placement::StreamLayout;
use crate::policy::Registry;
use crate::util::AlignedBuf;
use parking_lot::Mutex;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::thread::JoinHandle;

pub use crate::format::MAX_VOLUME_PAGES;

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
    /// How the devices are combined.
    pub array: ArrayKind,
    /// Stripe unit of a RAID-0 or RAID-5 array; `None`: [`DEFAULT_RAID0_STRIPE_UNIT_BYTES`] or
    /// [`DEFAULT_RAID5_STRIPE_UNIT_BYTES`].
    pub stripe_unit_bytes: Option<u32>,
}

/// What [`Pool::scrub`] found.
pub type ScrubReport = crate::array::ScrubCounts;

/// Default stripe unit of RAID-0, as MD's chunk of old.
pub const DEFAULT_RAID0_STRIPE_UNIT_BYTES: u32 = 64 << 10;
/// Default stripe unit of RAID-5: small, because without a parity buffer a flush pads the log
/// to the end of its row (at most `data members x unit` less one grain).
pub const DEFAULT_RAID5_STRIPE_UNIT_BYTES: u32 = 16 << 10;
/// Bytes of a parity buffer for a RAID-5 pool of `members` devices formatted with `cfg`: room
/// for `crate::array::raid::parity_buffer::DEFAULT_ENTRIES_PER_BANK` rows being filled.
pub fn default_parity_buffer_bytes(cfg: &PoolConfig, members: u32) -> u64 {
    let unit = cfg.stripe_unit_bytes.unwrap_or(DEFAULT_RAID5_STRIPE_UNIT_BYTES);
    let row_grains = ArrayKind::Raid5.data_members(members.max(3)) * (unit / cfg.grain_bytes.max(1));
    crate::array::raid::parity_buffer::buffer_bytes_for(unit, row_grains, crate::array::raid::parity_buffer::DEFAULT_ENTRIES_PER_BANK)
}

/// Largest stripe unit.
pub const MAX_STRIPE_UNIT_BYTES: u32 = 1 << 20;

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
            array: ArrayKind::Linear,
            stripe_unit_bytes: None,
        }
    }
}

/// How to open a pool.
#[derive(Clone)]
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
    /// Pace user writes while the background GC is behind (see `pacing.rs`): the wait for the
    /// GC spread over every write instead of falling whole on a few. Off by default: it cuts
    /// the tail of write latency under sustained overwrites (RAID-5 random writes: p99.9 from
    /// about 150 ms to 5 to 7 ms) but raises write amplification a little, more on small
    /// pools (docs/BENCHMARKS.md).
    pub pace_user_writes: bool,
    /// Policies the pool's and volumes' policy names are looked up in.
    pub policies: Registry,
    /// Also clean while garbage is above this percentage of the sealed segments' data space,
    /// however much is free (SepBIT's "garbage proportion" trigger). `None`: clean only when
    /// free space runs low, which moves the least data.
    pub gc_garbage_percent: Option<f64>,
    /// Threads that write sealed user records while writers go on (see
    /// `crate::log::write_back`); at most 16. With 0 every writer writes the records it fills
    /// itself, which keeps the order of device writes deterministic (crash tests use that).
    pub write_back_threads: usize,
    /// A RAID-5 pool's parity buffer (see `crate::array::ParityBuffer`): formatted by
    /// [`Pool::create`], required by [`Pool::open`] of a pool created with one.
    pub parity_buffer: Option<Arc<dyn crate::device::Device>>,
    /// The pool's parity buffer is lost (a dead NVM): open a RAID-5 pool that has one
    /// without it. Nothing is lost when every member is present: recovery re-derives the
    /// parity of the rows the buffer kept from the members' data (a clean close leaves none).
    /// Refused when a member is failed or missing, whose rows had their redundancy only
    /// there. The pool records at once that it has no buffer and pads flushes from then on
    /// ([`Pool::change_parity_buffer`] gives it a new one).
    pub parity_buffer_lost: bool,
    /// Bytes of DRAM for copies of pages read from the devices (see
    /// `crate::log::read_cache`); 0: every read goes to the devices.
    pub read_cache_bytes: u64,
    /// Discard segments on the devices when they become free ([`crate::device::Device::discard`]:
    /// TRIM on an SSD, a hole punched in a file), so that an SSD's own garbage collection
    /// stops moving data the pool has freed.
    pub discard_freed_segments: bool,
    /// Bytes of DRAM for pages written and not yet flushed (see `crate::dirty`): overwrites
    /// before a flush never reach the log, and a destage writes pages in logical order. 0:
    /// every write goes to the log at once. Writes are durable after a flush either way.
    pub write_buffer_bytes: u64,
    /// With a background GC, buffered pages are written down once the oldest is this old.
    pub write_buffer_expire: std::time::Duration,
    /// The GC writes its records in bursts of this many bytes (capped at a segment and at
    /// `crate::log::GC_BURST_BYTES_MAX`; see `crate::log::Log::set_gc_burst_bytes`), so
    /// that a drive which programs in arrival order keeps the GC's cold data out of the
    /// erase blocks of the users' hot data. `None`: what the devices prefer to be written in
    /// order (an SSD's stripe, an SMR band; nothing on plain files); `Some(0)`: off.
    pub gc_burst_bytes: Option<u64>,
}

/// A write buffer for a server on this machine: as [`default_server_read_cache_bytes`], an
/// eighth of its memory between 64 MiB and 4 GiB (the kernel lets a fifth of it be dirty).
pub fn default_server_write_buffer_bytes() -> u64 {
    default_server_read_cache_bytes()
}

pub use crate::dirty::{WriteBufferStats, DEFAULT_EXPIRE as DEFAULT_WRITE_BUFFER_EXPIRE};

/// Read cache of [`OpenOptions::default`].
pub const DEFAULT_READ_CACHE_BYTES: u64 = 64 << 20;

/// A read cache for a server on this machine: an eighth of its memory, between 64 MiB and
/// 4 GiB, leaving the rest to the system and the applications.
pub fn default_server_read_cache_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0);
    (total / 8).clamp(DEFAULT_READ_CACHE_BYTES, 4 << 30)
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            background_gc: true,
            read_only: false,
            force_scan: false,
            gc_workers: 4,
            pace_user_writes: false,
            policies: Registry::builtin(),
            gc_garbage_percent: None,
            write_back_threads: 4,
            parity_buffer: None,
            parity_buffer_lost: false,
            read_cache_bytes: DEFAULT_READ_CACHE_BYTES,
            discard_freed_segments: true,
            write_buffer_bytes: 0,
            write_buffer_expire: DEFAULT_WRITE_BUFFER_EXPIRE,
            gc_burst_bytes: None,
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
    /// The aging factor of the pool's victim policies (also given to volumes' own).
    gc_aging: f64,
    default_placement: String,
    policies: Registry,
    closed: bool,
}

impl Pool {
    pub fn opened_from(&self) -> OpenedFrom {
        self.opened_from
    }

    /// The member devices, in pool order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.eng.log.array().members().iter().map(|m| m.device.clone()).collect()
    }

    /// How the pool's devices are combined (`linear`, `raid0`, `raid1`, `raid5`).
    pub fn array_layout(&self) -> &'static str {
        self.eng.log.array().kind().name()
    }

    /// The array for people: layout, members, stripe unit, how redundancy is kept, whether
    /// it is degraded.
    pub fn array_description(&self) -> String {
        self.eng.log.array().describe()
    }

    /// Whether the array keeps redundancy (RAID-1 copies, RAID-5 parity) that a scrub compares
    /// with the data and a damaged page is rebuilt from.
    pub fn has_redundancy(&self) -> bool {
        self.eng.log.has_redundancy()
    }

    pub fn pool_id(&self) -> u128 {
        self.eng.log.pool_id()
    }

    pub fn geometry(&self) -> Geometry {
        *self.eng.log.geo()
    }

    /// Logical bytes the pool offers at its configured spare: what a default volume gets.
    pub fn logical_capacity_bytes(&self) -> u64 {
        let physical = self.eng.log.geo().total_grains * self.eng.log.geo().grain_bytes as u64;
        let bytes = physical / 10_000 * (10_000 - self.spare_basis_points as u64);
        let usable = self.usable_bytes_for(&[self.default_placement.as_str()]).unwrap_or(0);
        bytes.min(usable) / 65536 * 65536
    }

    /// The share of [`Pool::logical_capacity_bytes`] on the slow devices, what a hybrid volume
    /// (whose data lives there) can hold.
    pub fn slow_capacity_bytes(&self) -> u64 {
        let capacity = self.eng.log.capacity();
        let slow = capacity.segments_of(&crate::log::SLOW_TYPES) as u64;
        let total = (capacity.segments().len() as u64).max(1);
        (self.logical_capacity_bytes() as u128 * slow as u128 / total as u128) as u64 / 65536 * 65536
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
        Ok(self.eng.log.usable_grains_for_streams(streams) * self.eng.log.geo().grain_bytes as u64)
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

    /// Compares the array's redundancy (RAID-5 parity, RAID-1 mirror copies) with the data
    /// of every segment in use, up to the end of its record chain. Where they disagree, the
    /// pages there are checked against their checksums (a data page's in its record, a
    /// metadata page's its own): a page that fails on one member is rebuilt from the
    /// redundancy, never the redundancy from a damaged page. With `repair`, damaged pages
    /// are rewritten, then the redundancy of rows whose pages all pass; a row with a page no
    /// copy of which passes is left as it is and reported. (In a writable pool the chain walk
    /// itself rewrites a damaged metadata page it rebuilds, as every read does.) The GC waits
    /// while a segment is checked.
    ///
    /// Only sealed segments are compared; a writable pool first closes its open segments, so
    /// that everything written before the scrub began is checked. A segment still open may
    /// hold past its current use's records (or, taken and not yet written, instead of them)
    /// an earlier use's, which a member rebuilt since never got, and its records still being
    /// written differ between members until they land: compared, it would report damage that
    /// is none, and a repair would write old bytes under the new writes.
    pub fn scrub(&self, repair: bool) -> Result<ScrubReport> {
        if repair {
            self.eng.log.check_writable()?;
        }
        if !self.eng.log.is_read_only() {
            self.eng.log.close_all_streams()?;
            self.eng.flush()?;
        }
        let mut report = ScrubReport::default();
        let geo = self.eng.log.geo();
        let gb = geo.grain_bytes as u64;
        for s in 0..geo.total_segments {
            let _gc = self.eng.gc_lock.write();
            // Not freed and reused while its copies are compared and rewritten.
            let Some(_hold) = self.eng.log.hold_segment(s, None) else {
                continue;
            };
            if !matches!(
                self.eng.log.capacity().segment(s).state(),
                SegmentState::Allocated | SegmentState::Victim
            ) {
                continue;
            }
            let base = s as u64 * geo.grains_per_segment as u64;
            let mut end = 0u64;
            let mut pages = Vec::new();
            let header = self.eng.log.walk_segment(s, |_, meta, _| {
                end = end.max(meta.start_grain as u64 + meta.span_grains().unwrap_or(1) as u64);
                pages.push(PageCheck {
                    grain: base + meta.start_grain as u64,
                    bytes: gb as u32,
                    crc: None,
                });
                for (crc, (offset, grains)) in meta.data_crcs().zip(meta.data_layout()) {
                    pages.push(PageCheck {
                        grain: base + meta.start_grain as u64 + 1 + offset as u64,
                        bytes: (grains as u64 * gb) as u32,
                        crc: Some(crc),
                    });
                }
            })?;
            if header.is_none() {
                continue;
            }
            pages.sort_unstable_by_key(|p| p.grain);
            let c = self.eng.log.array().scrub(s, end, repair, &pages)?;
            report += c;
            report.segments += 1;
        }
        if repair && (report.rows_repaired > 0 || report.pages_repaired > 0) {
            self.eng.log.array().sync_all()?;
        }
        Ok(report)
    }

    /// The storage type of the segment holding physical grain `grain` (`None` past the end).
    pub fn storage_type_at(&self, grain: u64) -> Option<crate::StorageType> {
        let s = grain / self.eng.log.geo().grains_per_segment as u64;
        (s < self.eng.log.geo().total_segments as u64).then(|| self.eng.log.capacity().segment(s as u32).storage_type)
    }

    /// Runs one pass of the volumes' background work (merging full sparse maps of
    /// dual-mapping volumes, copying hot groups of hybrid volumes to their fast tier), which a
    /// pool opened with a background GC also runs by itself; returns whether there was work.
    pub fn maintain(&self) -> Result<bool> {
        self.eng.log.check_writable()?;
        self.eng.maintain()
    }

    /// Makes every write that returned before this call durable.
    pub fn flush(&self) -> Result<()> {
        self.eng.flush()
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
        // The write buffer goes down first, while the GC can still make room for it.
        self.eng.dirty.stop_destager();
        let destaged = if self.eng.log.is_read_only() {
            Ok(())
        } else {
            self.eng.dirty.destage_all(&self.eng.log)
        };
        self.stop_gc();
        destaged?;
        if self.eng.log.is_read_only() {
            return Ok(());
        }
        self.eng.log.check_not_poisoned()?;
        let sb = self.eng.log.geo().segment_bytes as usize;
        let needed = crate::recovery::checkpoint_bytes(&self.eng).div_ceil(sb);
        // First clean until the checkpoint fits above the GC reserve (bounded: each step frees
        // or schedules a segment). This must come before the image is taken: the GC moves
        // data, and the image must point where the data finally is.
        if needed <= MAX_CHECKPOINT_SEGMENTS {
            let reserve = self.eng.log.capacity().watermarks().gc_reserve as usize;
            for _ in 0..self.eng.log.geo().total_segments {
                if self.eng.log.capacity().free_segments() as usize > reserve + needed || !self.eng.gc_step()? {
                    break;
                }
            }
        }
        // Then close every stream (the GC's too), so nothing moves any more, and flush.
        self.eng.log.close_all_streams()?;
        self.eng.flush()?;
        // Nothing is left to write back; what follows writes synchronously.
        self.eng.log.write_back().stop();
        let session_id = self.eng.log.meta().lock().session_id;
        let blob = crate::recovery::encode_checkpoint(&self.eng, session_id);
        debug_assert_eq!(blob.len(), crate::recovery::checkpoint_bytes(&self.eng));
        let mut segs = Vec::new();
        let types = self.eng.log.checkpoint_types();
        if needed <= MAX_CHECKPOINT_SEGMENTS {
            while segs.len() < needed {
                match self.eng.log.allocate_online(&types, Purpose::Checkpoint) {
                    Some(s) => {
                        segs.push(s);
                        self.eng.log.array().prepare_segment(s)?;
                    }
                    None => break,
                }
            }
        }
        if segs.len() < needed {
            tracing::warn!("no room for a {}-byte checkpoint; the next open will scan", blob.len());
            return Ok(());
        }
        let gps = self.eng.log.geo().grains_per_segment as u64;
        // Whole rows on a parity array, so that every row of the checkpoint has its parity.
        let gb = self.eng.log.geo().grain_bytes;
        let unit = self.eng.log.array().row_grains(gb) as usize * gb as usize;
        for (i, &s) in segs.iter().enumerate() {
            let chunk = &blob[i * sb..((i + 1) * sb).min(blob.len())];
            let mut buf = AlignedBuf::zeroed(chunk.len().next_multiple_of(unit));
            buf[..chunk.len()].copy_from_slice(chunk);
            self.eng.log.array().write(s as u64 * gps, &buf)?;
        }
        self.eng.log.array().sync_all()?;
        // A parity buffer that failed in this last sync is recorded as gone before the pool
        // is marked clean, like one that failed in any other.
        self.eng.log.record_parity_buffer_failure()?;
        let mut meta = self.eng.log.meta().lock();
        let mut next = meta.clone();
        next.clean = true;
        next.checkpoint = Some(CheckpointRef {
            segments: segs.clone(),
            bytes: blob.len() as u64,
            crc: crc32c::crc32c(&blob),
        });
        self.eng.log.write_pool_meta(&mut next)?;
        *meta = next;
        for s in segs {
            debug_assert_eq!(self.eng.log.capacity().segment(s).state(), SegmentState::Checkpoint);
        }
        Ok(())
    }
}

impl Pool {
    /// The stripe unit and the grains of a row of a RAID-5 pool (what its parity buffer's
    /// entries are made of); `None` for other layouts.
    fn parity_row_shape(&self) -> Option<(u32, u32)> {
        let g = self.eng.log.parity_geometry.as_ref()?;
        Some((g.unit_bytes as u32, (g.row_bytes / self.eng.log.geo().grain_bytes as u64) as u32))
    }

    /// Bytes of a parity buffer for this RAID-5 pool at the default number of rows per bank
    /// (what `salsa format` creates); `None` for other layouts.
    pub fn default_parity_buffer_bytes(&self) -> Option<u64> {
        let (unit, row_grains) = self.parity_row_shape()?;
        Some(crate::array::raid::parity_buffer::buffer_bytes_for(
            unit,
            row_grains,
            crate::array::raid::parity_buffer::DEFAULT_ENTRIES_PER_BANK,
        ))
    }

    /// Closes the pool cleanly and gives it `new` as its RAID-5 parity buffer (formatted
    /// here), or none (`None`: flushes pad to whole rows from the next open). A clean close
    /// pads every row and writes its parity to the members, so the old buffer keeps nothing
    /// the pool needs; it is forgotten (open the pool with
    /// [`OpenOptions::parity_buffer_lost`] when it is gone). Returns the new buffer's id.
    pub fn change_parity_buffer(self, new: Option<Arc<dyn crate::device::Device>>) -> Result<Option<u64>> {
        let Some((unit_bytes, row_grains)) = self.parity_row_shape() else {
            return Err(Error::InvalidConfig(format!(
                "a parity buffer keeps RAID-5 parity; this pool is {}",
                self.eng.log.array().kind().name()
            )));
        };
        if self.eng.log.is_read_only() {
            return Err(Error::ReadOnly("the pool is open read-only".into()));
        }
        let eng = self.eng.clone();
        self.close()?;
        let id = match new {
            Some(device) => {
                let id = rand::Rng::gen::<u64>(&mut rand::thread_rng()) | 1;
                crate::array::ParityBuffer::format(device, eng.log.pool_id(), id, unit_bytes, row_grains)?;
                Some(id)
            }
            None => None,
        };
        let mut meta = eng.log.meta().lock();
        let mut next = meta.clone();
        next.parity_buffer_id = id.unwrap_or(0);
        eng.log.write_pool_meta(&mut next)?;
        *meta = next;
        Ok(id)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.closed {
            // Not a clean shutdown (no checkpoint): make what was written durable if the
            // devices still answer, and leave the rest to recovery.
            self.eng.dirty.stop_destager();
            if !self.eng.log.is_read_only() && !self.eng.log.is_poisoned() {
                let _ = self.eng.dirty.destage_all(&self.eng.log);
            }
            self.stop_gc();
            if !self.eng.log.is_read_only() && !self.eng.log.is_poisoned() {
                let _ = self.eng.flush();
            }
        }
        // Writes what is still queued (or fails it on a poisoned pool) and joins the threads,
        // which hold the engine.
        self.eng.log.write_back().stop();
    }
}
