//! The LSA controller: a volume whose logical pages are mapped one by one through a flat,
//! lock-free [`PageMap`], written into log-structured segments through allocation streams: the
//! user streams and GC streams the volume's [`Placement`] policy declares (SALSA's default:
//! user-hot, user-cold, GC). Each stream has its own open segment, so classes never share one.
//!
//! Invariants: a map entry changes only by swap under the page's stripe lock (writers, trims;
//! each takes its sequence number under that lock, so map order and sequence order agree) or by
//! compare-and-swap (the GC, which never overwrites a newer entry); every place a page leaves is
//! invalidated exactly once.

mod io;
mod share;

use share::{Leave, SharedPages};
pub use share::{PageRemap, MAX_SHARE_OWNERS, MAX_SHARE_RANGES};

use super::compression::{self, Compression};
use super::map::{Entry, PageMap};
use super::{Controller, ControllerStats, Reference, ScannedRecord};
use crate::device::StorageType;
use crate::error::{Error, Result};
use crate::format::{MetaEntry, RecordMeta, StreamKind, VolumeRecord};
use crate::log::capacity::Purpose;
use crate::log::chain::HeldPages;
use crate::log::payload::WriteBuffer;
use crate::log::stream::{PageData, Streams};
use crate::log::{Log, PageRead, StorageClass};
use crate::policy::placement::{Placement, Relocation, SegmentView, StreamLayout, UserWrite};
use crate::util::{AlignedBuf, Decoder};
use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

const STRIPES: usize = 256;
/// Volume-table setting: the storage class written to ([`crate::log::StorageClass`]; absent:
/// any).
pub const SETTING_STORAGE: u16 = 1;
/// Volume-table setting: how new writes are compressed ([`Compression::to_setting`]).
/// Present once a volume has compressed (even when turned off since): its pages may be
/// stored compressed, so its map keeps their sizes and its records carry them.
pub const SETTING_COMPRESSION: u16 = 2;
/// Pages one device read of a run covers at most (1 MiB of 4 KiB pages): the buffer it needs
/// is bounded.
const MAX_RUN_PAGES: usize = 256;
/// Grains a run reads over between two of its pages at most (a record's metadata page and
/// some): 32 KiB of 4 KiB grains.
const MAX_RUN_GAP_GRAINS: u64 = 8;

/// A volume served by the LSA controller.
pub struct LsaVolume {
    /// `Lsa`, or `Extent` over an extent map (inside a dual, hybrid or AMF volume: `Lsa`).
    kind: crate::format::ControllerKind,
    pub id: u32,
    pub name: String,
    pub page_bytes: u32,
    pub page_grains: u32,
    size_bytes: AtomicU64,
    map: RwLock<PageMap>,
    /// The placement policy and the streams it declared, replaced whole when the volume's
    /// policy changes (with no I/O in flight: see [`LsaVolume::set_placement`]).
    placing: ArcSwap<Placing>,
    /// The storage types its streams write (every placement's streams get them).
    storage: StorageClass,
    stripes: Box<[Mutex<()>]>,
    /// Pages currently mapped to data.
    pub mapped_pages: AtomicU64,
    /// Grains the mapped pages' data takes (less than their pages' when compressed).
    mapped_grains: AtomicU64,
    /// How new writes are compressed ([`Compression::to_setting`]); only a volume whose map
    /// keeps stored sizes compresses.
    compression: AtomicU64,
    /// Bytes of the volume's live data the GC moved (its share of the relocation traffic).
    pub relocated_bytes: AtomicU64,
    pub deleted: AtomicBool,
    /// Taken shared by every I/O and exclusively by deletion, so none is in flight then.
    pub gate: RwLock<()>,
    /// Serialise read-modify-writes of the same page.
    rmw: Box<[Mutex<()>]>,
    /// Scratch of a recovery scan in progress.
    replay: Mutex<Option<Replay>>,
    /// Pages with several owners (share batches).
    shared: SharedPages,
    /// Held exclusively by a share batch and shared by the GC walking a record of the volume
    /// (see `share.rs`).
    share_gate: RwLock<()>,
}

/// A placement policy and the allocation streams it declared (registered with the log, which
/// seals them on flush).
struct Placing {
    placement: Box<dyn Placement>,
    /// Its name, as stored in the volume table.
    name: String,
    streams: Arc<Streams>,
}

impl Placing {
    fn new(
        volume_id: u32,
        page_grains: u32,
        placement: Box<dyn Placement>,
        name: &str,
        types: &'static [StorageType],
        sized: bool,
    ) -> Placing {
        let layout = StreamLayout::of(placement.as_ref());
        Placing {
            streams: Arc::new(Streams::new(volume_id, page_grains, layout).on_types(types).sized(sized)),
            placement,
            name: name.to_string(),
        }
    }
}

/// A victim being cleaned: where its grains are, what the GC's placement is told about it, and
/// what the walk over its records gathered.
pub struct VictimWalk {
    victim: u32,
    /// Its first grain.
    base: u64,
    view: SegmentView,
    /// Whether the placement policy was told the victim is being reclaimed (once, at its first
    /// record of this volume's page size).
    reclaim_told: bool,
    /// Its trim entries `(page, count, seq)`.
    trims: Vec<(u64, u64, u64)>,
    /// Its share entries.
    shares: Vec<MetaEntry>,
    failure: Option<Error>,
}

impl VictimWalk {
    pub fn new(log: &Log, victim: u32) -> VictimWalk {
        VictimWalk {
            victim,
            base: victim as u64 * log.geo().grains_per_segment as u64,
            view: log.segment_view(victim),
            reclaim_told: false,
            trims: Vec::new(),
            shares: Vec::new(),
            failure: None,
        }
    }
}

/// Per page, during a recovery scan: the highest sequence number seen, and whether any data
/// record mentions the page.
struct Replay {
    best_seq: Vec<u64>,
    has_data: Vec<bool>,
    /// Pages whose winning entry so far is a share entry, with that entry's segment when it
    /// is not the grain's own (a GC move writes its owners' entries next to the data). Only
    /// the final winners' grains are shared: a grain a share entry named before a later entry
    /// of the page won may since hold another page's data alone (crash seed
    /// `regression_dual_share_batches_then_unclean_reopen`).
    share_winners: std::collections::HashMap<u64, Option<u32>>,
}

impl LsaVolume {
    /// A volume as recorded in the volume table, with an empty map and its placement policy,
    /// writing only segments of its storage class (a hybrid volume's: slow).
    pub fn new(rec: &VolumeRecord, map: PageMap, grain_bytes: u32, placement: Box<dyn Placement>, storage: StorageClass) -> LsaVolume {
        LsaVolume::new_compressing(rec, map, grain_bytes, placement, storage, None)
    }

    /// [`LsaVolume::new`] of a volume that compresses (`Some`, even when now off: its pages
    /// may be stored compressed): its map keeps stored sizes and its streams write sized
    /// records.
    pub fn new_compressing(
        rec: &VolumeRecord,
        map: PageMap,
        grain_bytes: u32,
        placement: Box<dyn Placement>,
        storage: StorageClass,
        compression: Option<Compression>,
    ) -> LsaVolume {
        let page_grains = rec.page_bytes / grain_bytes;
        let sized = compression.is_some();
        assert!(
            !sized || (page_grains > 1 && page_grains <= crate::format::MAX_SIZED_PAGE_GRAINS),
            "a compressing volume's pages are 2 to {} grains",
            crate::format::MAX_SIZED_PAGE_GRAINS
        );
        let map = if sized { map.with_stored_sizes() } else { map };
        LsaVolume {
            kind: if rec.controller == crate::format::ControllerKind::Extent {
                crate::format::ControllerKind::Extent
            } else {
                crate::format::ControllerKind::Lsa
            },
            id: rec.id,
            name: rec.name.clone(),
            page_bytes: rec.page_bytes,
            page_grains,
            size_bytes: AtomicU64::new(rec.size_bytes),
            map: RwLock::new(map),
            placing: ArcSwap::from_pointee(Placing::new(rec.id, page_grains, placement, &rec.placement, storage.types(), sized)),
            storage,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            mapped_pages: AtomicU64::new(0),
            mapped_grains: AtomicU64::new(0),
            compression: AtomicU64::new(compression.unwrap_or_default().to_setting()),
            relocated_bytes: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            gate: RwLock::new(()),
            rmw: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            replay: Mutex::new(None),
            shared: SharedPages::default(),
            share_gate: RwLock::new(()),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(SeqCst)
    }

    pub fn map(&self) -> RwLockReadGuard<'_, PageMap> {
        self.map.read()
    }

    /// The map's memory and the shared-page index's.
    pub fn map_memory_bytes(&self) -> u64 {
        self.map.read().memory_bytes() + self.shared.memory_bytes()
    }

    /// Grows the volume (shrinking is refused: pages past the end could not be forgotten
    /// durably).
    pub fn grow(&self, new_size_bytes: u64) {
        let mut m = self.map.write();
        let pages = new_size_bytes / self.page_bytes as u64;
        *m = m.grown(pages);
        self.placing.load().placement.resize(pages);
        self.size_bytes.store(new_size_bytes, SeqCst);
    }

    /// Replaces the placement policy (the caller holds the gate and the GC lock, so no I/O is
    /// in flight): the old streams' records are written and their segments closed, and the
    /// new policy's streams registered with the log. New writes follow the new policy; data
    /// already written stays where it is until the GC moves it.
    pub fn replace_placement(&self, log: &Log, placement: Box<dyn Placement>, name: &str) -> Result<()> {
        log.remove_streams(self.id)?;
        placement.resize(self.map.read().pages());
        let sized = self.map.read().has_stored_sizes();
        let placing = Placing::new(self.id, self.page_grains, placement, name, self.storage.types(), sized);
        let streams = placing.streams.clone();
        self.placing.store(Arc::new(placing));
        log.add_streams(self.id, streams);
        Ok(())
    }

    /// The placement policy's streams.
    pub fn placement_streams(&self) -> Arc<Streams> {
        self.placing.load().streams.clone()
    }

    /// During a recovery scan: the highest sequence number replayed for `page` so far (0 when
    /// none).
    pub fn replayed_seq(&self, page: u64) -> u64 {
        let guard = self.replay.lock();
        guard.as_ref().and_then(|rs| rs.best_seq.get(page as usize).copied()).unwrap_or(0)
    }

    /// During a recovery scan: notes that a record of another kind (a dual-mapping volume's
    /// small pages) holds data of `page`, so a winning trim of it keeps its tombstone.
    pub fn replay_saw_data(&self, page: u64) {
        if let Some(rs) = self.replay.lock().as_mut() {
            if let Some(seen) = rs.has_data.get_mut(page as usize) {
                *seen = true;
            }
        }
    }

    /// Memory held by the placement policy.
    pub fn placement_memory_bytes(&self) -> u64 {
        self.placing.load().placement.state_bytes()
    }

    /// Lock held across a partial-page read-modify-write.
    pub fn rmw_lock(&self, page: u64) -> &Mutex<()> {
        &self.rmw[(page % STRIPES as u64) as usize]
    }

    fn stripe(&self, page: u64) -> &Mutex<()> {
        &self.stripes[(page % STRIPES as u64) as usize]
    }

    /// How new writes are compressed.
    pub fn compression(&self) -> Compression {
        // Only values `to_setting` made are stored.
        Compression::from_setting(self.compression.load(SeqCst)).unwrap_or_default()
    }

    /// Grains the data of `page`, mapped, takes as stored (its stored size; a whole page
    /// unless compressed).
    fn stored_grains(&self, map: &PageMap, page: u64) -> u32 {
        self.grains_of_size_code(map.stored_grains(page))
    }

    /// Grains a map's stored-size code stands for (0 = a whole page, kept for pages stored
    /// as they are so that an uncompressed map needs no size byte at all).
    fn grains_of_size_code(&self, code: u8) -> u32 {
        match code {
            0 => self.page_grains,
            g => g as u32,
        }
    }

    /// The map's stored-size code for data of `grains` grains (the inverse of
    /// `grains_of_size_code`; a page's data never takes more than 15 grains here: a
    /// compressing volume's pages are at most 16 grains and keep at least one saved).
    fn size_code_of_grains(&self, grains: u32) -> u8 {
        if grains == self.page_grains {
            0
        } else {
            debug_assert!(grains < self.page_grains);
            grains as u8
        }
    }

    /// Grains the mapped pages' data takes.
    pub fn data_grains(&self) -> u64 {
        self.mapped_grains.load(SeqCst)
    }

    /// Accounts for `page`'s map entry `old` (its data `old_grains` grains), which record
    /// `killer` replaced by data of `new_grains` grains. A shared page's data dies with its
    /// last owner.
    fn invalidate(&self, log: &Log, page: u64, old: Entry, old_grains: u32, new_grains: u32, killer: u64) {
        match old {
            Entry::Unmapped => self.count_mapped(log, 1, new_grains as i64),
            Entry::Mapped(g) => {
                self.count_mapped(log, 0, new_grains as i64 - old_grains as i64);
                let (leave, entry) = self.shared.leave(g, page);
                if let Some(s) = entry {
                    log.drop_tombstone(s, Some(killer));
                }
                if leave == Leave::OthersRemain {
                    // The page's entry naming `g` (a share entry elsewhere, or one in g's own
                    // segment) stays on the device until `killer` is durable: g's segment must
                    // not be rewritten before then, though g itself is moved for its other
                    // owners (found by the write-buffer crash sweep, seed 45594).
                    log.note_killer(log.geo().segment_of(g), killer);
                } else {
                    log.cache_forget(g);
                    log.drop_data(log.geo().segment_of(g), old_grains, Some(killer))
                }
            }
            Entry::Trimmed(s) => {
                self.count_mapped(log, 1, new_grains as i64);
                log.drop_tombstone(s, Some(killer));
            }
        }
    }

    /// Counts `pages` more mapped pages whose data takes `grains` more grains (either may be
    /// negative).
    fn count_mapped(&self, log: &Log, pages: i64, grains: i64) {
        if pages >= 0 {
            self.mapped_pages.fetch_add(pages as u64, SeqCst);
        } else {
            self.mapped_pages.fetch_sub(pages.unsigned_abs(), SeqCst);
        }
        if grains >= 0 {
            self.mapped_grains.fetch_add(grains as u64, SeqCst);
        } else {
            self.mapped_grains.fetch_sub(grains.unsigned_abs(), SeqCst);
        }
        log.add_mapped_grains(grains);
    }

    /// Asks the placement policy for a user write's stream.
    pub(crate) fn classify(&self, log: &Log, map: &PageMap, page: u64) -> StreamKind {
        let previous = match map.load(page) {
            Entry::Mapped(g) => Some(log.segment_view(log.geo().segment_of(g))),
            _ => None,
        };
        log.write_watchers.page_written(self.id, page);
        self.placing.load().placement.place_user(&UserWrite {
            page,
            now: log.now_seq(),
            previous,
            mapped_pages: self.mapped_pages.load(SeqCst),
            volume_pages: map.pages(),
        })
    }

    // ----- I/O -----

    /// Refuses, before anything is written, a request that would map more new pages than the
    /// pool can hold; so an ENOSPC never leaves a request half applied.
    pub fn check_space(&self, log: &Log, map: &PageMap, pages: std::ops::Range<u64>) -> Result<()> {
        let new = pages.filter(|&p| !matches!(map.load(p), Entry::Mapped(_))).count() as u64 * self.page_grains as u64;
        log.check_room(new)
    }

    /// Writes whole pages from `first` on (`data` holds a whole number of pages). The caller
    /// checked space for the whole request ([`LsaVolume::check_space`]); concurrent requests may
    /// overshoot the limit by a few pages, which the usable-space margin absorbs.
    ///
    /// With `payload`, `data` is bytes `[at, ..)` of that payload, which the records may hold
    /// instead of copying the pages.
    pub fn write_pages(
        &self,
        log: &Log,
        map: &PageMap,
        first: u64,
        data: &[u8],
        payload: Option<(&Arc<WriteBuffer>, usize)>,
    ) -> Result<()> {
        self.write_pages_then(log, map, first, data, payload, &mut |_, _| {})
    }

    /// [`LsaVolume::write_pages`], calling `mapped(page, record_id)` once each page is mapped
    /// to its new place (under the stream's lock), with the id of the record that holds it.
    pub fn write_pages_then(
        &self,
        log: &Log,
        map: &PageMap,
        first: u64,
        data: &[u8],
        payload: Option<(&Arc<WriteBuffer>, usize)>,
        mapped: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let pb = self.page_bytes as usize;
        let gb = log.geo().grain_bytes as usize;
        debug_assert_eq!(data.len() % pb, 0);
        let count = data.len() / pb;
        let _inflight = log.invalidation_guard();
        // Pages the placement sends to the same stream go down in runs of at most one record,
        // which take the stream's lock once rather than once per page.
        let kinds: Vec<StreamKind> = (0..count).map(|i| self.classify(log, map, first + i as u64)).collect();
        // A compressing volume's pages as stored, compressed before any lock is taken: each
        // page's stored bytes (`None`: the page as it is) and their grains.
        let compression = if map.has_stored_sizes() {
            self.compression()
        } else {
            Compression::Off
        };
        let compressed: Vec<Option<Vec<u8>>> = if compression.is_on() {
            (0..count)
                .map(|i| {
                    let mut out = Vec::new();
                    compression.compress(&data[i * pb..(i + 1) * pb], gb, &mut out).map(|_| out)
                })
                .collect()
        } else {
            Vec::new()
        };
        let stored = |i: usize| -> &[u8] {
            match compressed.get(i) {
                Some(Some(bytes)) => bytes,
                _ => &data[i * pb..(i + 1) * pb],
            }
        };
        if compression.is_on() {
            let stored_bytes: usize = (0..count).map(|i| stored(i).len()).sum();
            log.counters()
                .compressed_bytes_saved
                .fetch_add((data.len() - stored_bytes) as u64, SeqCst);
        }
        let run_limit = log.geo().meta_interval_pages as usize;
        let mut crcs = Vec::with_capacity(count.min(run_limit));
        // Where each page went, for the read cache (see `Log::cache_written`).
        let caching = log.caches_reads();
        let mut placed: Vec<(usize, u64, u64)> = Vec::new();
        let mut start = 0;
        while start < count {
            let cap = (start + run_limit).min(count);
            let end = (start + 1..cap).find(|&i| kinds[i] != kinds[start]).unwrap_or(cap);
            // Checksums before taking the stream's lock: writers contend for it, so it guards
            // only the copy into the record and the map update.
            crcs.clear();
            crcs.extend((start..end).map(|i| crc32c::crc32c(stored(i))));
            self.placing.load().streams.place_each(
                log,
                kinds[start],
                Purpose::User,
                end - start,
                |i| {
                    let bytes = stored(start + i);
                    Some(PageData {
                        bytes,
                        // Only a page stored as it is can stay in the client's buffer.
                        held_in: payload.filter(|_| bytes.len() == pb).map(|(p, at)| (p, at + (start + i) * pb)),
                    })
                },
                |i, grain, rec| {
                    let (page, crc) = (first + (start + i) as u64, crcs[i]);
                    let grains = (stored(start + i).len() / gb) as u32;
                    log.set_crc(grain, crc);
                    if caching {
                        placed.push((start + i, grain, log.generation_of(grain)));
                    }
                    let (old, old_grains) = {
                        let _stripe = self.stripe(page).lock();
                        let seq = log.next_seq();
                        rec.push(MetaEntry::Data { page, seq, crc });
                        let old = map.swap(page, Entry::Mapped(grain));
                        let old_size = map.swap_stored_grains(page, self.size_code_of_grains(grains));
                        (old, self.grains_of_size_code(old_size))
                    };
                    // At once, not after the run: the GC cleaning the old version's segment
                    // waits for its count to reach zero, and the rest of the run may wait for
                    // the GC (a throttled allocation).
                    self.invalidate(log, page, old, old_grains, grains, rec.buf.record_id);
                    mapped(page, rec.buf.record_id);
                },
            )?;
            for (i, grain, generation) in placed.drain(..) {
                log.cache_written(grain, generation, stored(i));
            }
            start = end;
        }
        Ok(())
    }

    /// Reads one whole page, verifying its checksum (and decompressing it when it is stored
    /// compressed).
    pub fn read_page(&self, log: &Log, map: &PageMap, page: u64, out: &mut [u8]) -> Result<()> {
        let gb = log.geo().grain_bytes as usize;
        let mut stored = Vec::new();
        loop {
            let raw = map.load_raw(page);
            let Entry::Mapped(g) = map.encoding.decode(raw) else {
                out.fill(0);
                return Ok(());
            };
            let size = map.stored_grains(page);
            let read = if size == 0 {
                log.read_page(g, out, || map.load_raw(page) == raw)?
            } else {
                stored.resize(size as usize * gb, 0);
                match log.read_page(g, &mut stored, || map.load_raw(page) == raw && map.stored_grains(page) == size)? {
                    PageRead::Intact => match compression::decompress(&stored, out) {
                        Ok(()) => PageRead::Intact,
                        Err(_) => PageRead::Damaged,
                    },
                    other => other,
                }
            };
            match read {
                PageRead::Intact => return Ok(()),
                PageRead::Moved => continue,
                PageRead::Damaged => {
                    // A writer changes a page's entry and its stored size together under the
                    // page's lock, and a reader reads them without it: the pair read may
                    // straddle a rewrite. Under the lock it is consistent; only when it still
                    // names what was read is the page damaged.
                    if size != 0 {
                        let _stripe = self.stripe(page).lock();
                        if map.load_raw(page) != raw || map.stored_grains(page) != size {
                            continue;
                        }
                    }
                    return Err(Error::ChecksumMismatch {
                        volume: self.name.clone(),
                        page,
                    });
                }
            }
        }
    }

    /// Reads whole pages `[first, first + out.len() / page_bytes)`. The mapped pages of each
    /// window of [`MAX_RUN_PAGES`] are read in clusters, each one device read
    /// ([`Log::read_run`]): pages that lie close together in one segment, in whatever order
    /// (the pages of one file written by concurrent requests land in records in the order the
    /// requests got to the stream).
    pub fn read_pages(&self, log: &Log, map: &PageMap, first: u64, out: &mut [u8]) -> Result<()> {
        let pb = self.page_bytes as usize;
        let gb = log.geo().grain_bytes as usize;
        let gps = log.geo().grains_per_segment as u64;
        for (w, window) in out.chunks_mut(MAX_RUN_PAGES * pb).enumerate() {
            let base = first + (w * MAX_RUN_PAGES) as u64;
            // (grain, map entry as read, page, its buffer, stored grains: 0 for a whole page)
            let mut mapped: Vec<(u64, u64, u64, &mut [u8], u8)> = Vec::new();
            for (k, chunk) in window.chunks_mut(pb).enumerate() {
                let page = base + k as u64;
                let raw = map.load_raw(page);
                match map.encoding.decode(raw) {
                    Entry::Mapped(g) => mapped.push((g, raw, page, chunk, map.stored_grains(page))),
                    _ => self.read_page(log, map, page, chunk)?,
                }
            }
            mapped.sort_unstable_by_key(|m| m.0);
            let grains_of = |code: u8| self.grains_of_size_code(code) as u64;
            let mut start = 0;
            while start < mapped.len() {
                let segment = mapped[start].0 / gps;
                let mut end = start + 1;
                // Reading over a small gap (a record's metadata page) costs less than a
                // second request.
                while end < mapped.len()
                    && mapped[end].0 <= mapped[end - 1].0 + grains_of(mapped[end - 1].4) + MAX_RUN_GAP_GRAINS
                    && (mapped[end].0 + grains_of(mapped[end].4) - 1) / gps == segment
                {
                    end += 1;
                }
                let cluster = &mut mapped[start..end];
                let found = if cluster.len() > 1 {
                    let grains: Vec<u64> = cluster.iter().map(|c| c.0).collect();
                    let raws: Vec<(u64, u64, u8)> = cluster.iter().map(|c| (c.2, c.1, c.4)).collect();
                    // A compressed page is read into its stored size, and decompressed after.
                    let mut stored: Vec<Vec<u8>> = cluster
                        .iter()
                        .map(|c| if c.4 == 0 { Vec::new() } else { vec![0u8; c.4 as usize * gb] })
                        .collect();
                    let mut outs: Vec<&mut [u8]> = cluster
                        .iter_mut()
                        .zip(stored.iter_mut())
                        .map(|(c, s)| if c.4 == 0 { &mut *c.3 } else { &mut s[..] })
                        .collect();
                    let found = log.read_run(&grains, &mut outs, |k| {
                        map.load_raw(raws[k].0) == raws[k].1 && map.stored_grains(raws[k].0) == raws[k].2
                    })?;
                    drop(outs);
                    found.map(|mut found| {
                        for (k, c) in cluster.iter_mut().enumerate() {
                            if c.4 != 0 && found[k] == PageRead::Intact && compression::decompress(&stored[k], c.3).is_err() {
                                found[k] = PageRead::Damaged;
                            }
                        }
                        found
                    })
                } else {
                    None
                };
                // Anything not read whole here is read alone (which re-checks a page that
                // looked damaged, and repairs from redundancy).
                for (k, c) in cluster.iter_mut().enumerate() {
                    if found.as_ref().is_none_or(|f| f[k] != PageRead::Intact) {
                        self.read_page(log, map, c.2, c.3)?;
                    }
                }
                start = end;
            }
        }
        Ok(())
    }

    /// Trims whole pages `[first, first + count)`: they read as zeros, durably after a flush.
    /// Returns the id of the record that holds the trim (`None` when `count` is 0). A page
    /// never written needs no tombstone unless `needs_tombstone` says it does (a dual-mapping
    /// volume's large page whose small pages the trim drops: their records must stay dead).
    pub fn trim_pages(
        &self,
        log: &Log,
        map: &PageMap,
        first: u64,
        count: u64,
        needs_tombstone: &dyn Fn(u64) -> bool,
    ) -> Result<Option<u64>> {
        if count == 0 {
            return Ok(None);
        }
        let _inflight = log.invalidation_guard();
        self.placing.load().placement.trimmed(first, count);
        log.write_watchers.pages_trimmed(self.id, first, count);
        let olds =
            self.placing
                .load()
                .streams
                .place(log, self.placing.load().placement.place_trim(), Purpose::Trim, None, |seg, rec| {
                    let seg = seg as u32;
                    // Lock every stripe the range touches, in order, so the trim's sequence number is
                    // ordered with concurrent writes to the same pages.
                    let n = (count as usize).min(STRIPES);
                    let mut idx: Vec<usize> = (0..n).map(|i| ((first + i as u64) % STRIPES as u64) as usize).collect();
                    idx.sort_unstable();
                    let _guards: Vec<_> = idx.iter().map(|&i| self.stripes[i].lock()).collect();
                    let seq = log.next_seq();
                    rec.push(MetaEntry::Trim { page: first, count, seq });
                    let mut olds = Vec::new();
                    for p in first..first + count {
                        loop {
                            let cur = map.load(p);
                            if (cur == Entry::Unmapped && !needs_tombstone(p)) || cur == Entry::Trimmed(seg) {
                                break;
                            }
                            log.add_tombstone(seg);
                            if map.compare_exchange(p, cur, Entry::Trimmed(seg)) {
                                olds.push((p, cur, self.stored_grains(map, p)));
                                break;
                            }
                            log.drop_tombstone(seg, None);
                        }
                    }
                    (olds, rec.buf.record_id)
                })?;
        let (olds, killer) = olds;
        for (page, old, old_grains) in olds {
            self.invalidate_trimmed(log, page, old, old_grains, killer);
        }
        Ok(Some(killer))
    }

    /// Accounts for `page`'s map entry `old`, which a trim (or a share of zeros) in record
    /// `killer` replaced with a tombstone.
    fn invalidate_trimmed(&self, log: &Log, page: u64, old: Entry, old_grains: u32, killer: u64) {
        match old {
            Entry::Mapped(_) => {
                self.count_mapped(log, -1, 0);
                self.invalidate(log, page, old, old_grains, 0, killer);
            }
            Entry::Trimmed(s) => log.drop_tombstone(s, Some(killer)),
            Entry::Unmapped => {}
        }
    }

    // ----- GC upcall -----

    /// Moves what is live in one record of a victim (a record of this volume's page size; the
    /// caller skips others) into the GC streams; trims are gathered for
    /// [`LsaVolume::finish_relocation`]. After a failure, later records are skipped.
    pub fn relocate_record(&self, log: &Log, map: &PageMap, walk: &mut VictimWalk, meta: &RecordMeta, data: &[u8], held: &HeldPages<'_>) {
        if walk.failure.is_some() || meta.page_grains != self.page_grains {
            return;
        }
        // No page of the volume becomes shared while this record is walked (see `share.rs`).
        let _share_gate = self.share_gate.read();
        let placing = self.placing.load();
        if !walk.reclaim_told {
            walk.reclaim_told = true;
            placing.placement.segment_reclaimed(&walk.view, log.now_seq());
        }
        let victim = walk.victim;
        let gb = log.geo().grain_bytes as usize;
        let first_data = walk.base + meta.start_grain as u64 + 1;
        let mut slot = 0usize;
        let mut layout = meta.data_layout();
        for e in &meta.entries {
            match *e {
                MetaEntry::Data { page, seq, crc } => {
                    // (A data entry per layout item: `data_layout` counts the data entries.)
                    let (offset, grains) = layout.next().unwrap_or((0, self.page_grains));
                    let grain = first_data + offset as u64;
                    let this_slot = slot;
                    slot += 1;
                    let is_shared = self.shared.holds(grain);
                    if !is_shared && !mapped_at(map, page, grain) {
                        continue;
                    }
                    // The page's bytes as the walk read them; or, for a page the walk was told
                    // was dead and that is live (no path makes one today), read now, so that
                    // bytes not read can never be moved.
                    let read_now;
                    let stored_bytes = grains as usize * gb;
                    let bytes: &[u8] = if held.holds(this_slot) {
                        &data[offset * gb..offset * gb + stored_bytes]
                    } else {
                        let mut buf = AlignedBuf::zeroed(stored_bytes);
                        if let Err(err) = log.array().read(grain, &mut buf) {
                            walk.failure = Some(err);
                            return;
                        }
                        read_now = buf;
                        &read_now
                    };
                    let bytes = &*log.page_to_move(grain, bytes, crc);
                    if is_shared {
                        if let Err(err) = self.relocate_shared(log, map, victim, walk.view, grain, *e, bytes, grains) {
                            walk.failure = Some(err);
                            return;
                        }
                        continue;
                    }
                    let to = placing.placement.place_gc(&Relocation {
                        page,
                        now: log.now_seq(),
                        victim: walk.view,
                        mapped_pages: self.mapped_pages.load(SeqCst),
                        volume_pages: map.pages(),
                    });
                    let r = placing.streams.place(log, to, Purpose::Gc, Some(bytes), |new, rec| {
                        log.set_crc(new, crc);
                        rec.push(MetaEntry::Data { page, seq, crc });
                        let generation = log.generation_of(new);
                        (
                            new,
                            generation,
                            map.compare_exchange(page, Entry::Mapped(grain), Entry::Mapped(new)),
                        )
                    });
                    // A compressed page moves as it is stored, and keeps its stored size.
                    match r {
                        Ok((new, generation, true)) => {
                            log.cache_moved(grain, new, generation);
                            log.drop_data(victim, grains, None);
                            log.counters().gc_bytes_relocated.fetch_add(stored_bytes as u64, SeqCst);
                            self.relocated_bytes.fetch_add(stored_bytes as u64, SeqCst);
                        }
                        // Overwritten meanwhile: the copy is garbage at once.
                        Ok((new, _, false)) => log.drop_data(log.geo().segment_of(new), grains, None),
                        Err(err) => {
                            walk.failure = Some(err);
                            return;
                        }
                    }
                }
                MetaEntry::Trim { page, count, seq } => walk.trims.push((page, count, seq)),
                MetaEntry::Share { .. } => walk.shares.push(*e),
            }
        }
    }

    /// Ends a victim's relocation: moves its live tombstones, or reports the first failure.
    pub fn finish_relocation(&self, log: &Log, map: &PageMap, mut walk: VictimWalk) -> Result<()> {
        if let Some(e) = walk.failure {
            return Err(e);
        }
        self.carry_shares(log, map, walk.victim, &walk.shares)?;
        self.relocate_tombstones(log, map, walk.victim, &mut walk.trims)
    }

    /// Moves the live tombstones of `victim` (pages whose map entry is `Trimmed(victim)`) into
    /// the last GC stream, given the victim's trim entries `(page, count, seq)`. A page may be
    /// covered by several of them (trimmed, written elsewhere, trimmed again into the same
    /// segment) and the map does not say which one is current: the latest is, so each page's
    /// tombstone keeps the highest sequence number among them. (Carrying an older trim's number
    /// instead let a crash scan rank the dead copy written between the two trims above the
    /// tombstone and bring it back: crash seed 37762.) The trims are taken latest first, each
    /// for the part of its range no later one covers, so memory stays proportional to the
    /// number of trim entries, however many pages they cover.
    fn relocate_tombstones(&self, log: &Log, map: &PageMap, victim: u32, trims: &mut [(u64, u64, u64)]) -> Result<()> {
        for (pages, seq) in latest_trim_parts(trims, map.pages()) {
            self.relocate_trim_range(log, map, victim, pages, seq)?;
        }
        Ok(())
    }

    /// Moves the tombstones of the pages in `pages` that are `Trimmed(victim)`, in runs of
    /// consecutive pages, each as one trim entry with sequence number `seq`.
    fn relocate_trim_range(&self, log: &Log, map: &PageMap, victim: u32, pages: std::ops::Range<u64>, seq: u64) -> Result<()> {
        let mut p = pages.start;
        while p < pages.end {
            if map.load(p) != Entry::Trimmed(victim) {
                p += 1;
                continue;
            }
            let run_start = p;
            while p < pages.end && map.load(p) == Entry::Trimmed(victim) {
                p += 1;
            }
            let run = p - run_start;
            let last_gc = self.placing.load().streams.layout().last_gc();
            self.placing.load().streams.place(log, last_gc, Purpose::Gc, None, |seg, rec| {
                let seg = seg as u32;
                rec.push(MetaEntry::Trim {
                    page: run_start,
                    count: run,
                    seq,
                });
                for q in run_start..run_start + run {
                    log.add_tombstone(seg);
                    if map.compare_exchange(q, Entry::Trimmed(victim), Entry::Trimmed(seg)) {
                        log.drop_tombstone(victim, None);
                    } else {
                        log.drop_tombstone(seg, None);
                    }
                }
            })?;
        }
        Ok(())
    }
}

/// Whether the map still points `page` at `grain` (a page of a victim's record that no write,
/// trim or GC move has replaced since).
fn mapped_at(map: &PageMap, page: u64, grain: u64) -> bool {
    page < map.pages() && map.load(page) == Entry::Mapped(grain)
}

/// For trim entries `(page, count, seq)` of one segment, clipped to `pages` pages: the page
/// ranges on which each entry is the latest (highest `seq`) of those covering them, with its
/// `seq`. Sorts `trims` latest first. At most twice as many parts as entries, whatever the
/// ranges' sizes.
fn latest_trim_parts(trims: &mut [(u64, u64, u64)], pages: u64) -> Vec<(std::ops::Range<u64>, u64)> {
    trims.sort_unstable_by_key(|t| std::cmp::Reverse(t.2));
    let mut parts = Vec::new();
    // Ranges of later trims, sorted and disjoint.
    let mut covered: Vec<(u64, u64)> = Vec::new();
    for &(page, count, seq) in trims.iter() {
        let end = page.saturating_add(count).min(pages);
        if page >= end {
            continue;
        }
        let mut at = page;
        for &(s, e) in covered.iter().filter(|&&(s, e)| e > page && s < end) {
            if s > at {
                parts.push((at..s, seq));
            }
            at = at.max(e);
        }
        if at < end {
            parts.push((at..end, seq));
        }
        covered.push((page, end));
        covered.sort_unstable();
        // `later` follows `earlier` in the sorted list: merge them when they touch.
        covered.dedup_by(|later, earlier| {
            if later.0 <= earlier.1 {
                earlier.1 = earlier.1.max(later.1);
                true
            } else {
                false
            }
        });
    }
    parts
}

impl Controller for LsaVolume {
    fn id(&self) -> u32 {
        self.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn streams(&self) -> Arc<Streams> {
        self.placing.load().streams.clone()
    }

    fn set_placement(&self, log: &Log, placement: Box<dyn Placement>, name: &str) -> Result<()> {
        let _gate = self.gate.write();
        self.replace_placement(log, placement, name)
    }

    fn set_compression(&self, log: &Log, c: Compression, placement: Box<dyn Placement>, name: &str) -> Result<()> {
        if self.kind != crate::format::ControllerKind::Lsa {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is not an LSA volume: only LSA volumes compress",
                self.name
            )));
        }
        // No I/O in flight while the map and the streams change.
        let _gate = self.gate.write();
        if c.is_on() && !self.map.read().has_stored_sizes() {
            {
                let mut map = self.map.write();
                let with_sizes = map.grown(map.pages()).with_stored_sizes();
                *map = with_sizes;
            }
            // Streams that write sized records (`replace_placement` asks the map).
            self.replace_placement(log, placement, name)?;
        }
        self.compression.store(c.to_setting(), SeqCst);
        Ok(())
    }

    fn stats(&self) -> ControllerStats {
        ControllerStats {
            name: self.name.clone(),
            controller: self.kind.name().to_string(),
            map_runs: self.map.read().run_count().unwrap_or(0),
            size_bytes: self.size_bytes(),
            page_bytes: self.page_bytes,
            mapped_bytes: self.mapped_pages.load(SeqCst) * self.page_bytes as u64,
            compression: self.compression(),
            map_memory_bytes: self.map_memory_bytes(),
            placement: self.placing.load().name.clone(),
            placement_memory_bytes: self.placement_memory_bytes(),
            gc_bytes_relocated: self.relocated_bytes.load(SeqCst),
            checkpoint_image_bytes: self.image_bytes(),
            storage: self.storage.name().to_string(),
            shared_pages: self.shared.len(),
            ..ControllerStats::default()
        }
    }

    /// Moves every live page and live tombstone out of `victim` into the GC stream, keeping
    /// their sequence numbers. A page moves only if the map still points at the victim.
    fn relocate(&self, log: &Log, victim: u32) -> Result<()> {
        let map = self.map.read();
        let mut walk = VictimWalk::new(log, victim);
        // Only the pages live now are read (when few are): one dead now stays dead, since
        // nothing maps a page to a grain of a sealed segment except the GC moving it away.
        // The same test `relocate_record` makes before it moves a page.
        let base = walk.base;
        let live = |meta: &RecordMeta, slot: usize, e: &MetaEntry| match *e {
            MetaEntry::Data { page, .. } if meta.page_grains == self.page_grains => {
                let grain = meta.data_grain(base, slot);
                self.shared.holds(grain) || mapped_at(&map, page, grain)
            }
            _ => false,
        };
        log.walk_victim_live(victim, live, |_, meta, data, held| {
            self.relocate_record(log, &map, &mut walk, meta, data, held)
        })?;
        self.finish_relocation(log, &map, walk)
    }

    fn clear(&self) {
        let map = self.map.read();
        map.clear();
        self.shared.rebuild(&Default::default(), &Default::default(), &map);
    }

    fn begin_replay(&self) {
        let pages = self.map.read().pages() as usize;
        *self.replay.lock() = Some(Replay {
            best_seq: vec![0; pages],
            has_data: vec![false; pages],
            share_winners: Default::default(),
        });
    }

    /// For each page the entry with the highest sequence number wins, data or trim; of equal
    /// numbers the later record (a GC move over its source) wins. Data pages of a record that
    /// was not durable count only when their crc matches.
    fn replay(&self, log: &Log, r: &ScannedRecord<'_>) {
        if r.meta.page_grains != self.page_grains {
            return;
        }
        let mut guard = self.replay.lock();
        let Some(rs) = guard.as_mut() else { return };
        let map = self.map.read();
        let gps = log.geo().grains_per_segment as u64;
        if r.meta.data_sizes.is_some() && !map.has_stored_sizes() {
            tracing::warn!(
                volume = %self.name,
                segment = r.segment,
                "a record of compressed pages for a volume that never compressed: skipped"
            );
            return;
        }
        let first_data = r.segment as u64 * gps + r.meta.start_grain as u64 + 1;
        let data_end = first_data + r.meta.data_grains().unwrap_or(0) as u64;
        let mut slot = 0usize;
        let mut layout = r.meta.data_layout();
        for e in &r.meta.entries {
            match *e {
                MetaEntry::Data { page, seq, crc } => {
                    let (offset, grains) = layout.next().unwrap_or((0, self.page_grains));
                    let grain = first_data + offset as u64;
                    let ok = r.trusted || r.intact.get(slot).copied().unwrap_or(false);
                    slot += 1;
                    if page < map.pages() {
                        rs.has_data[page as usize] = true;
                    }
                    // Every intact page's checksum, winner or not: a share entry may name it.
                    if ok {
                        log.set_crc(grain, crc);
                    }
                    if ok && page < map.pages() && seq >= rs.best_seq[page as usize] {
                        rs.best_seq[page as usize] = seq;
                        map.store(page, Entry::Mapped(grain));
                        map.swap_stored_grains(page, self.size_code_of_grains(grains));
                        // (Most pools share nothing: no hashing per entry then.)
                        if !rs.share_winners.is_empty() {
                            rs.share_winners.remove(&page);
                        }
                    }
                }
                MetaEntry::Share {
                    page,
                    count,
                    grain,
                    seq,
                    stored_grains,
                } => {
                    if stored_grains != 0 && !map.has_stored_sizes() {
                        tracing::warn!(volume = %self.name, segment = r.segment, "a share of compressed pages for a volume that never compressed: skipped");
                        continue;
                    }
                    let stride = self.grains_of_size_code(stored_grains) as u64;
                    let end = page.saturating_add(count).min(map.pages());
                    for p in page..end {
                        let g = grain + (p - page) * stride;
                        // Data in this record (the GC moved a shared page) counts when it is
                        // intact; data elsewhere was durable before the entry was written.
                        let here = (first_data..data_end).contains(&g);
                        let ok = if here {
                            r.trusted
                                || r.meta
                                    .data_layout()
                                    .position(|(offset, _)| first_data + offset as u64 == g)
                                    .and_then(|slot| r.intact.get(slot).copied())
                                    .unwrap_or(false)
                        } else {
                            g + stride <= log.geo().total_grains
                        };
                        rs.has_data[p as usize] = true;
                        if ok && seq >= rs.best_seq[p as usize] {
                            rs.best_seq[p as usize] = seq;
                            map.store(p, Entry::Mapped(g));
                            map.swap_stored_grains(p, stored_grains);
                            rs.share_winners.insert(p, (!here).then_some(r.segment));
                        }
                    }
                }
                MetaEntry::Trim { page, count, seq } => {
                    let end = page.saturating_add(count).min(map.pages());
                    for p in page..end {
                        if seq >= rs.best_seq[p as usize] {
                            rs.best_seq[p as usize] = seq;
                            map.store(p, Entry::Trimmed(r.segment));
                            if !rs.share_winners.is_empty() {
                                rs.share_winners.remove(&p);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A winning trim of a page no data record mentions needs no tombstone (nothing could
    /// resurrect it), and keeping one would pin its segment.
    fn end_replay(&self, _log: &Log) {
        let Some(rs) = self.replay.lock().take() else { return };
        let map = self.map.read();
        for (p, seen) in rs.has_data.iter().enumerate() {
            if !seen && matches!(map.load(p as u64), Entry::Trimmed(_)) {
                map.store(p as u64, Entry::Unmapped);
            }
        }
        let grains = rs
            .share_winners
            .keys()
            .filter_map(|&p| match map.load(p) {
                Entry::Mapped(g) => Some(g),
                _ => None,
            })
            .collect();
        let entries = rs.share_winners.iter().filter_map(|(&p, e)| e.map(|s| (p, s))).collect();
        self.shared.rebuild(&grains, &entries, &map);
    }

    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64> {
        let map = self.map.read();
        let gps = log.geo().grains_per_segment as u64;
        let mut mapped = 0u64;
        let mut result = Ok(());
        // A shared page's data counts once, whatever its owners; each owner mapped by a share
        // entry elsewhere keeps that entry's segment, as a tombstone.
        let snapshot = self.shared.snapshot();
        for o in snapshot.iter().flat_map(|(_, owners)| owners) {
            if let Some(segment) = o.entry {
                visit(Reference::Tombstone { segment })?;
            }
        }
        let shared: std::collections::HashSet<u64> = snapshot.iter().map(|(g, _)| *g).collect();
        let mut seen: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut data_grains = 0u64;
        map.for_each_mapped(|page, v| {
            if result.is_err() {
                return;
            }
            result = match map.encoding.decode(v) {
                Entry::Unmapped => Ok(()),
                Entry::Mapped(g) if !shared.is_empty() && shared.contains(&g) && !seen.insert(g) => {
                    mapped += 1;
                    data_grains += self.stored_grains(&map, page) as u64;
                    Ok(())
                }
                Entry::Mapped(g) => {
                    let grains = self.stored_grains(&map, page);
                    mapped += 1;
                    data_grains += grains as u64;
                    visit(Reference::Data {
                        segment: (g / gps) as u32,
                        grains,
                    })
                }
                Entry::Trimmed(segment) => visit(Reference::Tombstone { segment }),
            };
        });
        result?;
        self.mapped_pages.store(mapped, SeqCst);
        self.mapped_grains.store(data_grains, SeqCst);
        Ok(data_grains)
    }

    fn image_bytes(&self) -> u64 {
        self.map.read().image_bytes()
    }

    fn encode_image(&self, out: &mut Vec<u8>) {
        let map = self.map.read();
        map.encode_image(out);
        map.encode_stored_sizes(out);
    }

    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()> {
        let map = self.map.read();
        map.load_image(d)
            .and_then(|()| map.load_stored_sizes(d, self.page_grains))
            .map_err(|what| Error::Corrupt(format!("checkpoint of volume {}: {what}", self.name)))
    }

    fn shared_pages(&self) -> Vec<super::SharedGrain> {
        self.shared
            .snapshot()
            .into_iter()
            .map(|(g, owners)| (g, owners.iter().map(|o| (o.page, o.entry)).collect()))
            .collect()
    }

    fn load_shared_pages(&self, grains: &[u64], entries: &[(u64, u32)]) {
        self.shared.rebuild(
            &grains.iter().copied().collect(),
            &entries.iter().copied().collect(),
            &self.map.read(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::latest_trim_parts;

    /// The seq each page gets from the parts, and the highest seq covering it, page by page.
    fn by_parts_and_by_brute_force(trims: &[(u64, u64, u64)], pages: u64) -> (Vec<Option<u64>>, Vec<Option<u64>>) {
        let mut from_parts = vec![None; pages as usize];
        for (range, seq) in latest_trim_parts(&mut trims.to_vec(), pages) {
            for p in range {
                assert!(from_parts[p as usize].is_none(), "page {p} in two parts");
                from_parts[p as usize] = Some(seq);
            }
        }
        let brute = (0..pages)
            .map(|p| trims.iter().filter(|t| t.0 <= p && p < t.0.saturating_add(t.1)).map(|t| t.2).max())
            .collect();
        (from_parts, brute)
    }

    #[test]
    fn each_page_gets_the_latest_trim_that_covers_it() {
        let parts = latest_trim_parts(&mut [(90, 10, 1), (95, 2, 2)], 1000);
        assert_eq!(parts, vec![(95..97, 2), (90..95, 1), (97..100, 1)]);
        let parts = latest_trim_parts(&mut [(8, 10, 1), (0, 10, 3), (5, 10, 2)], 100);
        assert_eq!(parts, vec![(0..10, 3), (10..15, 2), (15..18, 1)]);
        assert_eq!(latest_trim_parts(&mut [(0, u64::MAX, 1)], 50), vec![(0..50, 1)]);
        // Random overlapping trims against the page-by-page answer.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..500 {
            let trims: Vec<(u64, u64, u64)> = (0..next(12) + 1).map(|i| (next(60), next(30) + 1, i * 7 + next(5))).collect();
            let (parts, brute) = by_parts_and_by_brute_force(&trims, 64);
            assert_eq!(parts, brute, "{trims:?}");
            assert!(latest_trim_parts(&mut trims.clone(), 64).len() <= 2 * trims.len());
        }
    }
}
