//! Controllers map a volume's logical address space onto the capacity manager's segments. Each
//! volume is one controller instance with its own page size and allocation streams.
//!
//! Owns: the [`Controller`] trait, everything the layers below ask of a volume: the GC upcall
//! that moves a victim's live data (the one call up from the core), replay of scanned records
//! at recovery, the live references that the segment counts are derived from, and the
//! checkpoint image. A controller writes through the log ([`crate::log::Log`]) and its own
//! allocation streams ([`crate::log::stream::Streams`]), which the log registers, seals on
//! flush and closes; it keeps only its map. The engine, the GC, recovery and the checkpoint
//! hold volumes only as `Arc<dyn Controller>`, and the volume handle only as
//! [`VolumeIo`], its byte-addressed front-end. Five kinds are built: the LSA page map
//! ([`lsa::LsaVolume`], the default), the extent kind (the same controller over an
//! [`extent_map`] of runs), dual mapping ([`dual`]), hybrid tiering ([`hybrid`]) and
//! append-only AMF segments ([`amf`], also over an extent map). A new one implements
//! both traits and a case in [`build`]; the engine, the GC, recovery and the front-ends (which
//! take the names from `ControllerKind`) do not change, but its kind and name, and where it
//! differs from a page map the write buffer's list of kinds it buffers and the volume handle's
//! kind checks, do (`docs/DESIGN.md`, "Volume handle -> controller", lists the files).
//!
//! Invariants every controller keeps (the engine relies on them, and asserts what it can):
//! - it writes only through its [`Controller::streams`], registered with the log, one open
//!   segment per stream;
//! - after [`Controller::relocate`] returns `Ok`, it references nothing in the victim;
//! - [`Controller::account`] reports exactly the grains and tombstones it references, so that
//!   the segment counts derived from it at open match what the write path maintains.

pub mod amf;
pub mod compression;
pub mod dual;
pub mod extent_map;
pub mod hybrid;
pub mod lsa;
pub mod map;
mod map_entry;
mod spec;
pub use spec::VolumeSpec;

use crate::error::Result;
use crate::format::{ControllerKind, RecordMeta, VolumeRecord};
use crate::log::payload::WriteBuffer;
use crate::log::stream::Streams;
use crate::log::{Geometry, Log, StorageClass};
use crate::policy::placement::Placement;
use crate::policy::Registry;
use crate::util::Decoder;
use std::sync::Arc;

/// A record found by the recovery scan, handed to its volume's controller, oldest first.
pub struct ScannedRecord<'a> {
    pub segment: u32,
    pub meta: &'a RecordMeta,
    /// Per data page of the record: does its crc32c match its entry?
    pub intact: &'a [bool],
    /// The record was durable (its id is at most the largest synced-through seen): all its
    /// entries count, not only the intact ones.
    pub trusted: bool,
}

/// One live reference a controller holds into a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference {
    /// `grains` grains of live data in `segment`.
    Data { segment: u32, grains: u32 },
    /// A tombstone (a trim that must outlive older copies) kept in `segment`.
    Tombstone { segment: u32 },
}

impl Reference {
    /// The segment referenced.
    pub fn segment(self) -> u32 {
        match self {
            Reference::Data { segment, .. } | Reference::Tombstone { segment } => segment,
        }
    }
}

/// What a volume reports for the pool's statistics.
#[derive(Debug, Clone, Default)]
pub struct ControllerStats {
    pub name: String,
    /// The controller kind's name (`lsa`, ...).
    pub controller: String,
    pub size_bytes: u64,
    pub page_bytes: u32,
    pub mapped_bytes: u64,
    /// Bytes the mapped data takes on the devices (less than `mapped_bytes` when pages are
    /// stored compressed); filled in by the pool.
    pub stored_bytes: u64,
    /// How new writes are compressed (off unless the controller says otherwise).
    pub compression: compression::Compression,
    pub map_memory_bytes: u64,
    /// Bytes a checkpoint of the volume's map takes on the devices (its metadata capacity).
    pub checkpoint_image_bytes: u64,
    pub placement: String,
    /// The victim policy ranking its segments (the pool's when it has none of its own).
    pub victim: String,
    /// The storage class its data is written to (`any`, `fast`, `slow`; hybrid: `slow`).
    pub storage: String,
    /// Controller settings, by name (dual mapping: `sparse_pages`), for statistics.
    pub settings: Vec<(String, u64)>,
    /// Memory the placement policy holds (per-page history and the like).
    pub placement_memory_bytes: u64,
    /// Bytes of the volume's live data the GC moved since the pool was opened.
    pub gc_bytes_relocated: u64,
    /// Dual mapping: small pages in the sparse map, and the most it holds.
    pub sparse_pages: u64,
    pub sparse_capacity_pages: u64,
    /// Dual mapping: large pages merged (rewritten whole to free their sparse entries), and
    /// small pages written to the sparse map.
    pub merged_pages: u64,
    pub small_pages_written: u64,
    /// Hybrid: bytes of current copies on the fast tier, the fast segments holding them,
    /// groups copied there and dropped from there, bytes read from either tier, and whether
    /// the fast tier stopped after an I/O error.
    pub fast_tier_bytes: u64,
    pub fast_tier_segments: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub fast_read_bytes: u64,
    pub slow_read_bytes: u64,
    pub fast_tier_failed: bool,
    /// AMF: its segments, those written (open or full) and those full.
    pub amf_segments: u64,
    pub amf_segments_written: u64,
    pub amf_segments_full: u64,
    /// Runs in an extent map (AMF).
    pub map_runs: u64,
    /// Physical pages with more than one logical owner (share batches).
    pub shared_pages: u64,
}

/// What the volume handle asks of a controller: byte-addressed I/O on ranges that the handle
/// has checked to lie inside the volume. Never-written and trimmed bytes read as zeros; a
/// checksum mismatch is an error, never wrong data; a write is durable after the next flush.
/// Once [`VolumeIo::retire`] has returned, every call fails with `VolumeNotFound`.
pub trait VolumeIo: Send + Sync {
    fn kind(&self) -> ControllerKind;
    fn size_bytes(&self) -> u64;
    /// The unit of mapping: writes of less are read-modify-write.
    fn page_bytes(&self) -> u32;
    /// The smallest write that costs no read-modify-write (what a client should prefer).
    fn preferred_write_bytes(&self) -> u32 {
        self.page_bytes()
    }
    /// Bytes mapped to data (written and not trimmed).
    fn mapped_bytes(&self) -> u64;
    fn read(&self, log: &Log, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes `data` at `offset`. When `payload` is given, `data` is all of it, and records
    /// may hold the payload instead of copying whole pages out of it.
    fn write(&self, log: &Log, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()>;
    /// Discards the whole pages inside the range; partial pages are left as they are.
    fn trim(&self, log: &Log, offset: u64, len: u64) -> Result<()>;
    /// Physical grain holding `page`, `None` when it reads as zeros.
    fn page_location(&self, page: u64) -> Option<u64>;
    /// Grows the volume to `new_size_bytes` (already recorded in the volume table).
    fn grow(&self, new_size_bytes: u64) -> Result<()>;
    /// Waits for the I/O in flight to finish and refuses all I/O from then on (deletion).
    fn retire(&self);
    fn is_retired(&self) -> bool;
    /// Grains of live data the volume holds (what its deletion frees).
    fn mapped_grains(&self) -> u64;
    /// An append-only volume's segment size (`None` for any other).
    fn segment_bytes(&self) -> Option<u64> {
        None
    }
    /// An append-only volume: bytes written into `segment` from its start.
    fn write_point(&self, _segment: u64) -> Result<u64> {
        Err(crate::error::Error::InvalidArgument(format!(
            "volume {:?} is not append-only",
            self.kind().name()
        )))
    }
    /// An append-only volume: writes `data` at `segment`'s write point, whatever it is, and
    /// returns the volume offset it went to.
    fn append(&self, _log: &Log, _segment: u64, _data: &[u8]) -> Result<u64> {
        Err(crate::error::Error::InvalidArgument(format!(
            "volume {:?} is not append-only",
            self.kind().name()
        )))
    }
    /// Remaps a batch of page ranges atomically without copying (SHARE); see
    /// [`lsa::PageRemap`], in pages of the volume. Page-mapped volumes (`lsa`, `extent`, `dual`)
    /// share; the others refuse.
    fn share(&self, _log: &Log, _remaps: &[lsa::PageRemap]) -> Result<()> {
        Err(crate::error::Error::InvalidArgument(format!(
            "a {} volume cannot share pages; share needs a page-mapped volume (controller lsa, extent or dual)",
            self.kind().name()
        )))
    }
}

/// Splits `[offset, offset + len)` into (page, offset in page, length) pieces of pages of
/// `page_bytes`.
pub fn page_pieces(offset: u64, len: u64, page_bytes: u32) -> impl Iterator<Item = (u64, usize, usize)> {
    let pb = page_bytes as u64;
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

/// Builds the controller a volume-table entry names, with an empty map (recovery or the
/// checkpoint fills it). Fails when its placement policy is not registered or it carries a
/// setting its controller does not know.
pub fn build(rec: &VolumeRecord, geo: &Geometry, policies: &Registry) -> std::result::Result<Arc<dyn Controller>, String> {
    let pages = rec.size_bytes / rec.page_bytes as u64;
    // An AMF volume's placement is its own (see its arm below).
    let placement = || policies.placement(&rec.placement, pages);
    let encoding = map::Encoding {
        total_grains: geo.total_grains,
        total_segments: geo.total_segments,
    };
    let page_map = || map::PageMap::new(pages, encoding);
    let unknown = |key: u16| {
        format!(
            "the {} controller has no setting {key} (written by a newer SALSA?)",
            rec.controller.name()
        )
    };
    match rec.controller {
        ControllerKind::Lsa | ControllerKind::Extent => {
            let mut storage = StorageClass::Any;
            let mut compression = None;
            for &(key, value) in &rec.settings {
                match key {
                    lsa::SETTING_STORAGE => storage = storage_class(value)?,
                    lsa::SETTING_COMPRESSION if rec.controller == ControllerKind::Lsa => {
                        check_compression(rec.page_bytes, geo.grain_bytes)?;
                        compression = Some(compression::Compression::from_setting(value)?);
                    }
                    _ => return Err(unknown(key)),
                }
            }
            let map = match rec.controller {
                ControllerKind::Extent => map::PageMap::extents(pages, encoding, rec.page_bytes / geo.grain_bytes),
                _ => page_map(),
            };
            Ok(Arc::new(lsa::LsaVolume::new_compressing(
                rec,
                map,
                geo.grain_bytes,
                placement()?,
                storage,
                compression,
            )))
        }
        ControllerKind::Dual => {
            let mut sparse = None;
            let mut storage = StorageClass::Any;
            for &(key, value) in &rec.settings {
                match key {
                    dual::SETTING_SPARSE_PAGES => sparse = Some(value),
                    dual::SETTING_STORAGE => storage = storage_class(value)?,
                    _ => return Err(unknown(key)),
                }
            }
            let sparse = sparse.unwrap_or_else(|| dual::default_sparse_pages(rec.size_bytes, geo.grain_bytes));
            check_dual(rec.page_bytes, geo.grain_bytes, sparse)?;
            let dense = lsa::LsaVolume::new(rec, page_map(), geo.grain_bytes, placement()?, storage);
            Ok(Arc::new(dual::DualVolume::new(dense, geo.grain_bytes, sparse)))
        }
        ControllerKind::Amf => {
            let mut segment_bytes = None;
            let mut streams = 1;
            for &(key, value) in &rec.settings {
                match key {
                    amf::SETTING_SEGMENT_BYTES => segment_bytes = Some(value),
                    amf::SETTING_STREAMS if (1..=amf::MAX_SEGMENT_STREAMS as u64).contains(&value) => streams = value as u8,
                    amf::SETTING_STREAMS => {
                        return Err(format!("an AMF volume has 1 to {} streams, not {value}", amf::MAX_SEGMENT_STREAMS))
                    }
                    _ => return Err(unknown(key)),
                }
            }
            let segment_bytes = segment_bytes.ok_or("an AMF volume's entry has no segment size")?;
            amf::check_segment(segment_bytes, rec.page_bytes, rec.size_bytes)?;
            if rec.placement != amf::PLACEMENT {
                return Err(format!("an AMF volume's placement is {}, not {:?}", amf::PLACEMENT, rec.placement));
            }
            let streams = Arc::new(amf::SegmentStreams::new(segment_bytes / rec.page_bytes as u64, streams));
            let map = map::PageMap::extents(pages, encoding, rec.page_bytes / geo.grain_bytes);
            let inner = lsa::LsaVolume::new(rec, map, geo.grain_bytes, Box::new(streams.clone()), StorageClass::Any);
            Ok(Arc::new(amf::AmfVolume::new(inner, segment_bytes, streams)))
        }
        ControllerKind::Hybrid => {
            let settings = hybrid::HybridSettings::from_record(&rec.settings, rec.page_bytes, geo.segment_bytes)?;
            let slow = lsa::LsaVolume::new(rec, page_map(), geo.grain_bytes, placement()?, StorageClass::Slow);
            Ok(Arc::new(hybrid::HybridVolume::new(slow, settings, geo.segment_bytes)))
        }
    }
}

fn storage_class(value: u64) -> std::result::Result<StorageClass, String> {
    StorageClass::from_u64(value).ok_or_else(|| format!("storage class {value} is unknown (written by a newer SALSA?)"))
}

fn check_dual(page_bytes: u32, grain_bytes: u32, sparse_pages: u64) -> std::result::Result<(), String> {
    if page_bytes <= grain_bytes {
        return Err(format!(
            "a dual-mapping volume's pages ({page_bytes} bytes) must be larger than the grain ({grain_bytes} bytes), which its sparse map uses; try --page-size 64K"
        ));
    }
    if !(dual::MIN_SPARSE_PAGES..=dual::MAX_SPARSE_PAGES).contains(&sparse_pages) {
        return Err(format!(
            "the sparse map holds {} to {} small pages, not {sparse_pages}",
            dual::MIN_SPARSE_PAGES,
            dual::MAX_SPARSE_PAGES
        ));
    }
    Ok(())
}

/// Whether pages of `page_bytes` may be stored compressed in grains of `grain_bytes`: a page
/// must be at least two grains (a compressed page saves whole grains) and at most
/// [`crate::format::MAX_SIZED_PAGE_GRAINS`].
fn check_compression(page_bytes: u32, grain_bytes: u32) -> std::result::Result<(), String> {
    let grains = page_bytes / grain_bytes;
    if grains < 2 {
        return Err(format!(
            "compression stores a page in fewer grains than it has, so pages must be larger than the grain ({grain_bytes} bytes), not {page_bytes}; try --page-size 16K"
        ));
    }
    if grains > crate::format::MAX_SIZED_PAGE_GRAINS {
        return Err(format!(
            "a compressing volume's pages are at most {} grains; {page_bytes}-byte pages are {grains}",
            crate::format::MAX_SIZED_PAGE_GRAINS
        ));
    }
    Ok(())
}

/// The controller settings a new volume of `size_bytes` described by `spec` records.
pub fn settings_for(spec: &VolumeSpec, size_bytes: u64, geo: &Geometry) -> std::result::Result<Vec<(u16, u64)>, String> {
    if spec.compression.is_on() && spec.controller != ControllerKind::Lsa {
        return Err(format!(
            "compression applies to LSA volumes (--controller lsa), not to {} volumes",
            spec.controller.name()
        ));
    }
    if spec.controller != ControllerKind::Amf && (spec.segment_bytes.is_some() || spec.segment_streams.is_some()) {
        return Err("a segment size and segment streams apply to AMF volumes only (--controller amf)".into());
    }
    if spec.controller != ControllerKind::Hybrid && spec.hybrid != hybrid::HybridSpec::default() {
        return Err("group size, tier size, promotion rate and half-life apply to hybrid volumes only (--controller hybrid)".into());
    }
    // A class other than any is recorded; any is the default and records nothing.
    let storage = |key: u16| match spec.storage {
        StorageClass::Any => Vec::new(),
        class => vec![(key, class as u64)],
    };
    match spec.controller {
        ControllerKind::Lsa | ControllerKind::Extent => match spec.sparse_pages {
            Some(_) => Err("a sparse map size applies to dual-mapping volumes only (--controller dual)".into()),
            None => {
                let mut settings = storage(lsa::SETTING_STORAGE);
                if spec.compression.is_on() {
                    check_compression(spec.page_bytes, geo.grain_bytes)?;
                    settings.push((lsa::SETTING_COMPRESSION, spec.compression.to_setting()));
                }
                Ok(settings)
            }
        },
        ControllerKind::Hybrid if spec.storage != StorageClass::Any => {
            Err("a hybrid volume's data is on the slow devices and its copies on the fast ones; it takes no storage class".into())
        }
        ControllerKind::Hybrid => match spec.sparse_pages {
            Some(_) => Err("a sparse map size applies to dual-mapping volumes only (--controller dual)".into()),
            None => Ok(hybrid::HybridSettings::resolve(&spec.hybrid, spec.page_bytes, geo.segment_bytes)?.record()),
        },
        ControllerKind::Amf => {
            if spec.sparse_pages.is_some() {
                return Err("a sparse map size applies to dual-mapping volumes only (--controller dual)".into());
            }
            if spec.storage != StorageClass::Any {
                return Err("an AMF volume writes to any storage type; it takes no storage class".into());
            }
            if spec.placement.is_some() {
                return Err(format!(
                    "an AMF volume gives each segment its own stream ({}); it takes no placement policy",
                    amf::PLACEMENT
                ));
            }
            let segment_bytes = spec.segment_bytes.unwrap_or_else(|| amf::default_segment_bytes(geo.segment_bytes));
            amf::check_segment(segment_bytes, spec.page_bytes, size_bytes)?;
            let mut settings = vec![(amf::SETTING_SEGMENT_BYTES, segment_bytes)];
            match spec.segment_streams {
                None | Some(1) => {}
                Some(n) if (2..=amf::MAX_SEGMENT_STREAMS).contains(&n) => settings.push((amf::SETTING_STREAMS, n as u64)),
                Some(n) => return Err(format!("an AMF volume has 1 to {} streams, not {n}", amf::MAX_SEGMENT_STREAMS)),
            }
            Ok(settings)
        }
        ControllerKind::Dual => {
            let sparse = spec
                .sparse_pages
                .unwrap_or_else(|| dual::default_sparse_pages(size_bytes, geo.grain_bytes));
            check_dual(spec.page_bytes, geo.grain_bytes, sparse)?;
            let mut settings = vec![(dual::SETTING_SPARSE_PAGES, sparse)];
            settings.extend(storage(dual::SETTING_STORAGE));
            Ok(settings)
        }
    }
}

/// A shared grain and its owners: each a page, and the segment of the share entry that maps it
/// when that is not the grain's own segment.
pub type SharedGrain = (u64, Vec<(u64, Option<u32>)>);

/// What the engine core asks of a volume (see the module documentation).
pub trait Controller: VolumeIo + Send + Sync + 'static {
    /// The volume's id in the volume table.
    fn id(&self) -> u32;
    fn name(&self) -> &str;
    /// Its allocation streams (the log seals them on flush and counts them for the usable
    /// space: each may hold a partly written segment). A controller with pages of two sizes
    /// writes both into them ([`Streams::place_each_sized`]).
    fn streams(&self) -> Arc<Streams>;
    fn stats(&self) -> ControllerStats;
    /// Replaces the placement policy; new writes follow it. Called with the GC lock held.
    fn set_placement(&self, log: &Log, placement: Box<dyn Placement>, name: &str) -> Result<()>;
    /// Changes how new writes are compressed. A volume that never compressed starts keeping
    /// stored sizes, with new streams under `placement` (named `name`, its current policy
    /// afresh). Called with the GC lock held; kinds that do not compress refuse.
    fn set_compression(
        &self,
        _log: &Log,
        _compression: compression::Compression,
        _placement: Box<dyn Placement>,
        _name: &str,
    ) -> Result<()> {
        Err(crate::error::Error::InvalidArgument(format!(
            "volume {:?} is not an LSA volume: only LSA volumes compress",
            self.name()
        )))
    }
    /// Background work of the controller (merging, promotion), run by the pool's maintenance
    /// thread; returns whether it did something (and should be called again soon).
    fn maintain(&self, _log: &Log) -> Result<bool> {
        Ok(false)
    }
    /// The volume was deleted and no I/O is in flight: gives back what it holds outside the
    /// log (a hybrid volume's fast tier).
    fn release(&self, _log: &Log) {}

    // ----- GC -----

    /// Moves everything live out of `victim`, a segment this volume owns.
    fn relocate(&self, log: &Log, victim: u32) -> Result<()>;

    // ----- recovery and checkpoint -----

    /// Forgets every mapping (before a scan replaces a checkpoint that could not be used).
    fn clear(&self);
    /// A recovery scan is about to replay records.
    fn begin_replay(&self);
    /// Applies one scanned record of this volume; records come oldest first.
    fn replay(&self, log: &Log, record: &ScannedRecord<'_>);
    /// The scan is over.
    fn end_replay(&self, log: &Log);
    /// Calls `visit` for every live reference and returns the grains of live data, from which
    /// the engine derives segment counts, owners and states at open.
    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64>;
    /// Bytes [`Controller::encode_image`] appends.
    fn image_bytes(&self) -> u64;
    /// Appends the checkpoint image of the volume's mapping.
    fn encode_image(&self, out: &mut Vec<u8>);
    /// Loads an image written by [`Controller::encode_image`]; an error leaves the volume to a
    /// recovery scan.
    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()>;
    /// Grains with several owners (share batches), each with its owners: the page, and the
    /// segment of the share entry that maps it when that is not the grain's own. For the
    /// checkpoint.
    fn shared_pages(&self) -> Vec<SharedGrain> {
        Vec::new()
    }
    /// After [`Controller::load_image`]: the shared grains, and the pages mapped by a share
    /// entry in another segment, with that segment, as [`Controller::shared_pages`] listed.
    fn load_shared_pages(&self, _grains: &[u64], _entries: &[(u64, u32)]) {}
}
