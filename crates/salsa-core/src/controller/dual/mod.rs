//! The dual-mapping controller (SALSA paper, section IV-A): a volume mapped by a dense map of
//! large pages (64 KiB by default) and a bounded sparse map of small, grain-sized pages (4 KiB),
//! so that writes smaller than a large page or not aligned to one (a file system's metadata)
//! are not read-modify-write of a whole large page, while the map costs what a large-page map
//! costs.
//!
//! Owns: the sparse map and its bound, and the rules that keep the two maps one volume:
//! - a read looks in the sparse map first: a small page there is newer than its large page;
//! - a write of whole large pages goes to the dense map (through the LSA controller, [`LsaVolume`])
//!   and drops the sparse entries inside them; a write of part of a large page goes to the
//!   sparse map, one small page at a time (a partial small page is read-modify-write of that
//!   small page only), while the sparse map has room;
//! - when it has none, the write merges: the large page is read with its sparse pages laid
//!   over it, the write applied, and the result written as one large page (which drops its
//!   sparse entries). A maintenance pass merges the coldest large pages whenever the map is
//!   more than seven eighths full, down to three quarters, so writers seldom have to;
//! - a trim covers whole large pages (and their sparse entries); partial pages are left as
//!   they are;
//! - a share remaps whole large pages through the dense map, after merging every large page
//!   of the batch that has small pages; a page that shares its data with others never has
//!   small pages (a write of part of it merges), because the GC gives each owner of a shared
//!   page it moves a new sequence number, which would outrank them at a recovery scan. A merge
//!   of a page whose mapping (a share or a trim) is not durable yet syncs first: its record
//!   would carry the batch's bytes for the page's other small pages and could survive a crash
//!   without the batch (crash seed 1269).
//!
//! Invariants: every write, trim and merge of a large page holds that page's stripe lock, so
//! a merge never loses a concurrent write to a neighbouring small page, and a sparse entry
//! present in the map is always newer than its large page's dense entry; the sparse map lock
//! is taken last (after a stream's lock), never the other way round. On disk, small pages are
//! records whose `page_grains` is 1 and large pages records of the volume's page size, so the
//! recovery scan tells them apart; a small page wins over its large page when its sequence
//! number is higher, and a large page's trim keeps its tombstone while a small page's record
//! could still bring older data back. Small pages go into the same streams as large ones (the
//! stream the placement gives their large page; relocated ones into the last GC stream), in
//! records of their own, so each stream's segment is still written in one sequence: on a disk,
//! a flush costs one seek per stream, not two.

use super::lsa::{LsaVolume, VictimWalk};
use super::map::{Entry, PageMap};
use super::{page_pieces, Controller, ControllerStats, Reference, ScannedRecord, VolumeIo};
use crate::error::{Error, Result};
use crate::format::{ControllerKind, MetaEntry, RecordMeta};
use crate::log::capacity::Purpose;
use crate::log::chain::HeldPages;
use crate::log::payload::WriteBuffer;
use crate::log::stream::{PageData, Streams};
use crate::log::{Log, PageRead};
use crate::policy::placement::Placement;
use crate::util::Decoder;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

/// Volume-table setting: most small pages the sparse map holds.
pub const SETTING_SPARSE_PAGES: u16 = 1;
/// Volume-table setting: the storage class written to ([`crate::log::StorageClass`]; absent:
/// any).
pub const SETTING_STORAGE: u16 = 2;
/// Fewest small pages a sparse map may be given.
pub const MIN_SPARSE_PAGES: u64 = 16;
/// Most small pages a sparse map may be given (about 2 GiB of map).
pub const MAX_SPARSE_PAGES: u64 = 1 << 26;
/// Estimated memory per sparse entry: 16 bytes of key and grain in a B-tree whose nodes are
/// between half and fully used.
pub const SPARSE_ENTRY_BYTES: u64 = 32;
/// Stripe locks of large pages.
const STRIPES: usize = 256;
/// Large pages a maintenance pass merges at most.
const MERGES_PER_PASS: usize = 64;

/// The default sparse capacity of a volume of `volume_bytes` with `grain_bytes` small pages:
/// one small page in 2048 (512 MiB of small pages per TiB, 4 MiB of map), and at least what a
/// 1 TiB volume gets, 131072 (4 MiB of map), but at most a sixteenth of the volume's small
/// pages. The XFS under the object-store benchmark touches some 100,000 small pages of
/// metadata between merges on an 8 GiB volume: with 16384 it merged 12,224 large pages in a
/// minute and did 3.1x the raw disk's operations per modelled second, with 131072 it merged
/// 64 and did 8.0x.
pub fn default_sparse_pages(volume_bytes: u64, grain_bytes: u32) -> u64 {
    let pages = volume_bytes / grain_bytes as u64;
    (pages / 2048).max(131072.min(pages / 16)).clamp(MIN_SPARSE_PAGES, MAX_SPARSE_PAGES)
}

/// How a write of part of a large page is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartPlan {
    /// Its small pages go to the sparse map.
    Sparse,
    /// The large page is read, the part applied and the page written whole.
    Merge,
}

/// A small page a write of part of a large page writes.
struct SmallPiece {
    small: u64,
    /// Where the write starts in it, and how much of it it covers.
    in_small: usize,
    len: usize,
    /// Where its bytes are in the write's data.
    at: usize,
    /// Whether the sparse map holds it already (so writing it maps no new grain).
    in_sparse: bool,
}

/// A small page's best entry during a recovery scan: (sequence number, grain, crc).
type ReplayedSmall = (u64, u64, u32);

/// A volume served by the dual-mapping controller.
pub struct DualVolume {
    /// The dense map of large pages, its placement policy and streams, its gate and counters.
    dense: LsaVolume,
    /// Small page (volume offset / grain) -> the grain holding it.
    sparse: RwLock<BTreeMap<u64, u64>>,
    sparse_len: AtomicU64,
    sparse_capacity: u64,
    /// Small pages per large page.
    subpages: u64,
    small_bytes: usize,
    /// Stripe locks of large pages: writes, trims and merges of one large page are serial.
    locks: Box<[Mutex<()>]>,
    /// Large pages merged (written whole to drop their sparse entries).
    merges: AtomicU64,
    /// Small pages written to the sparse map.
    small_writes: AtomicU64,
    /// During a recovery scan: per small page, the winning (seq, grain, crc) so far.
    replay: Mutex<Option<BTreeMap<u64, ReplayedSmall>>>,
}

impl DualVolume {
    /// A dual-mapping volume over `dense` (an LSA volume of large pages, with the volume's id,
    /// name and placement), whose sparse map holds at most `sparse_capacity` small pages of
    /// `grain_bytes`.
    pub fn new(dense: LsaVolume, grain_bytes: u32, sparse_capacity: u64) -> DualVolume {
        DualVolume {
            subpages: dense.page_grains as u64,
            small_bytes: grain_bytes as usize,
            sparse: RwLock::new(BTreeMap::new()),
            sparse_len: AtomicU64::new(0),
            sparse_capacity,
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            merges: AtomicU64::new(0),
            small_writes: AtomicU64::new(0),
            replay: Mutex::new(None),
            dense,
        }
    }

    fn large_bytes(&self) -> u64 {
        self.dense.page_bytes as u64
    }

    /// Small pages of large page `page`.
    fn small_range(&self, page: u64) -> std::ops::Range<u64> {
        page * self.subpages..(page + 1) * self.subpages
    }

    /// Locks the stripes of large pages `pages`, in stripe order (so two writers never wait
    /// for each other's stripes crosswise).
    fn lock_pages(&self, pages: std::ops::RangeInclusive<u64>) -> Vec<MutexGuard<'_, ()>> {
        self.lock_page_ranges(std::iter::once(*pages.start()..pages.end() + 1))
    }

    /// Locks the stripes of every large page in `ranges`, each stripe once, in stripe order.
    fn lock_page_ranges(&self, ranges: impl Iterator<Item = std::ops::Range<u64>>) -> Vec<MutexGuard<'_, ()>> {
        let mut wanted = [false; STRIPES];
        for r in ranges {
            let n = (r.end.saturating_sub(r.start)).min(STRIPES as u64);
            for i in 0..n {
                wanted[((r.start + i) % STRIPES as u64) as usize] = true;
            }
        }
        (0..STRIPES).filter(|&i| wanted[i]).map(|i| self.locks[i].lock()).collect()
    }

    /// The sparse entries of large page `page`, as (small page, grain).
    fn sparse_of(&self, page: u64) -> Vec<(u64, u64)> {
        if self.sparse_len.load(SeqCst) == 0 {
            return Vec::new();
        }
        self.sparse.read().range(self.small_range(page)).map(|(&p, &g)| (p, g)).collect()
    }

    /// Drops the sparse entries of small pages `range`, replaced by record `killer` (a large
    /// page written or trimmed over them). Called under the writer's stream lock.
    fn drop_sparse(&self, log: &Log, range: std::ops::Range<u64>, killer: u64) {
        if self.sparse_len.load(SeqCst) == 0 {
            return;
        }
        let mut sparse = self.sparse.write();
        let gone: Vec<(u64, u64)> = sparse.range(range).map(|(&p, &g)| (p, g)).collect();
        for (p, g) in gone {
            sparse.remove(&p);
            self.sparse_len.fetch_sub(1, SeqCst);
            log.add_mapped_grains(-1);
            log.cache_forget(g);
            log.drop_data(log.geo().segment_of(g), 1, Some(killer));
        }
    }

    /// Writes whole large pages from `first` on into the dense map, dropping their sparse
    /// entries (the caller holds their stripe locks).
    fn write_large(&self, log: &Log, map: &PageMap, first: u64, data: &[u8], payload: Option<(&Arc<WriteBuffer>, usize)>) -> Result<()> {
        let mut dropped = |page: u64, killer: u64| self.drop_sparse(log, self.small_range(page), killer);
        self.dense.write_pages_then(log, map, first, data, payload, &mut dropped)
    }

    /// Reads small page `small` (of large page `page`) from the sparse map into `out`; false
    /// when it is not there (or left it while being read).
    fn read_small(&self, log: &Log, small: u64, page: u64, out: &mut [u8]) -> Result<bool> {
        loop {
            let Some(g) = self.sparse.read().get(&small).copied() else {
                return Ok(false);
            };
            match log.read_page(g, out, || self.sparse.read().get(&small) == Some(&g))? {
                PageRead::Intact => return Ok(true),
                PageRead::Moved => continue,
                PageRead::Damaged => {
                    return Err(Error::ChecksumMismatch {
                        volume: self.dense.name.clone(),
                        page,
                    })
                }
            }
        }
    }

    /// The small pages `len` bytes at `in_page` of large page `page` touch.
    fn piece_smalls(&self, page: u64, in_page: usize, len: usize) -> std::ops::Range<u64> {
        let base = page * self.subpages;
        base + (in_page / self.small_bytes) as u64..base + (in_page + len).div_ceil(self.small_bytes) as u64
    }

    /// Reads all of large page `page` as it reads: its dense page with its sparse pages laid
    /// over it.
    fn read_large(&self, log: &Log, map: &PageMap, page: u64, out: &mut [u8]) -> Result<()> {
        self.read_piece(log, map, page, 0, out)
    }

    /// Reads `out.len()` bytes at `in_page` of large page `page`: the small pages of the piece
    /// that are in the sparse map, laid over the dense page when some of the piece is not
    /// (the dense page is read whole, its checksum covering all of it). Small pages outside
    /// the piece are not read: a 4 KiB read of a file system's metadata page is one device
    /// read, not one per small page its large page has (measured on XFS over the SMR model:
    /// 7 reads at as many places for each).
    fn read_piece(&self, log: &Log, map: &PageMap, page: u64, in_page: usize, out: &mut [u8]) -> Result<()> {
        let lb = self.large_bytes() as usize;
        let sb = self.small_bytes;
        let base = page * self.subpages;
        let smalls = self.piece_smalls(page, in_page, out.len());
        'again: loop {
            let sparse: Vec<u64> = if self.sparse_len.load(SeqCst) == 0 {
                Vec::new()
            } else {
                self.sparse.read().range(smalls.clone()).map(|(&p, _)| p).collect()
            };
            if sparse.is_empty() && out.len() == lb {
                return self.dense.read_page(log, map, page, out);
            }
            // The piece's small pages, at their places in a large page.
            let first_at = (smalls.start - base) as usize * sb;
            let mut tmp = vec![0u8; (smalls.end - smalls.start) as usize * sb];
            if sparse.len() as u64 != smalls.end - smalls.start {
                let mut whole = vec![0u8; lb];
                self.dense.read_page(log, map, page, &mut whole)?;
                let n = tmp.len();
                tmp.copy_from_slice(&whole[first_at..first_at + n]);
            }
            for small in sparse {
                let at = (small - smalls.start) as usize * sb;
                if !self.read_small(log, small, page, &mut tmp[at..at + sb])? {
                    // Merged or dropped since it was listed: the dense page read may be older
                    // than the merge; read the piece again.
                    continue 'again;
                }
            }
            let at = in_page - first_at;
            out.copy_from_slice(&tmp[at..at + out.len()]);
            return Ok(());
        }
    }

    /// The small pages a write of `data` at `in_page` of large page `page` (less than the
    /// whole page) must write to the sparse map. Small pages of zeros over a large page that
    /// reads as zeros (not in the dense map, not in the sparse map) are left out, so zeroing
    /// part of a page never needs new space.
    fn small_pieces(&self, map: &PageMap, page: u64, in_page: usize, data: &[u8]) -> Vec<SmallPiece> {
        let dense_mapped = matches!(map.load(page), Entry::Mapped(_));
        let present = self.sparse_of(page);
        let mut pieces = Vec::new();
        let mut at = 0;
        for (small, in_small, len) in page_pieces(
            page * self.large_bytes() + in_page as u64,
            data.len() as u64,
            self.small_bytes as u32,
        ) {
            let in_sparse = present.iter().any(|e| e.0 == small);
            if dense_mapped || in_sparse || data[at..at + len].iter().any(|&b| b != 0) {
                pieces.push(SmallPiece {
                    small,
                    in_small,
                    len,
                    at,
                    in_sparse,
                });
            }
            at += len;
        }
        pieces
    }

    /// How a write of `data` at `in_page` of large page `page` (less than the whole page) is
    /// done, and the grains it newly maps: into the sparse map while it has room (with
    /// `sparse_free` entries left, which the plan takes from) and `tight` is not asked, else
    /// merged.
    fn plan_part(&self, map: &PageMap, page: u64, in_page: usize, data: &[u8], sparse_free: &mut u64, tight: bool) -> (PartPlan, u64) {
        // A page other pages share merges: a small page over it would be older than the
        // sequence numbers the GC gives the owners it moves, and lost at the next scan. (It is
        // mapped, so the merge maps nothing new: space is counted per owner.)
        let shared = self.dense.page_is_shared(map, page);
        let new = self.small_pieces(map, page, in_page, data).iter().filter(|p| !p.in_sparse).count() as u64;
        if !shared && (new == 0 || (!tight && new <= *sparse_free)) {
            *sparse_free = sparse_free.saturating_sub(new);
            return (PartPlan::Sparse, new);
        }
        let whole = if matches!(map.load(page), Entry::Mapped(_)) {
            0
        } else {
            self.subpages.saturating_sub(self.sparse_of(page).len() as u64)
        };
        (PartPlan::Merge, whole)
    }

    /// Writes `data` at `in_page` of large page `page` as `plan` says (the caller holds the
    /// page's stripe lock).
    fn write_part(&self, log: &Log, map: &PageMap, page: u64, in_page: usize, data: &[u8], plan: PartPlan) -> Result<()> {
        if plan == PartPlan::Merge {
            return self.merge(log, map, page, Some((in_page, data)));
        }
        let sb = self.small_bytes;
        let pieces = self.small_pieces(map, page, in_page, data);
        if pieces.is_empty() {
            return Ok(());
        }
        // Whole small pages, partial ones completed from what they read now.
        let mut pages = vec![0u8; pieces.len() * sb];
        for (i, p) in pieces.iter().enumerate() {
            let out = &mut pages[i * sb..(i + 1) * sb];
            if p.len < sb {
                let from = ((p.small - page * self.subpages) as usize) * sb;
                self.read_piece(log, map, page, from, out)?;
            }
            out[p.in_small..p.in_small + p.len].copy_from_slice(&data[p.at..p.at + p.len]);
        }
        let crcs: Vec<u32> = pages.chunks_exact(sb).map(crc32c::crc32c).collect();
        let _inflight = log.invalidation_guard();
        // The stream the placement policy gives the large page, in records of small pages.
        let kind = self.dense.classify(log, map, page);
        self.dense.placement_streams().place_each_sized(
            log,
            kind,
            Purpose::User,
            1,
            pieces.len(),
            |i| Some(PageData::copied(&pages[i * sb..(i + 1) * sb])),
            |i, grain, rec| {
                let (small, crc) = (pieces[i].small, crcs[i]);
                log.set_crc(grain, crc);
                let mut sparse = self.sparse.write();
                rec.push(MetaEntry::Data {
                    page: small,
                    seq: log.next_seq(),
                    crc,
                });
                match sparse.insert(small, grain) {
                    Some(old) => {
                        log.cache_forget(old);
                        log.drop_data(log.geo().segment_of(old), 1, Some(rec.buf.record_id));
                    }
                    None => {
                        self.sparse_len.fetch_add(1, SeqCst);
                        log.add_mapped_grains(1);
                    }
                }
            },
        )?;
        self.small_writes.fetch_add(pieces.len() as u64, SeqCst);
        Ok(())
    }

    /// Merges large page `page` (the caller holds its stripe lock): reads it with its sparse
    /// pages laid over it, applies `write` (offset in the page, bytes) if given, and writes it
    /// whole to the dense map, which drops its sparse entries.
    fn merge(&self, log: &Log, map: &PageMap, page: u64, write: Option<(usize, &[u8])>) -> Result<()> {
        if self.dense.mapping_pending(log, map, page) {
            log.flush()?;
        }
        let mut tmp = vec![0u8; self.large_bytes() as usize];
        self.read_large(log, map, page, &mut tmp)?;
        if let Some((at, data)) = write {
            tmp[at..at + data.len()].copy_from_slice(data);
        }
        self.write_large(log, map, page, &tmp, None)?;
        self.merges.fetch_add(1, SeqCst);
        Ok(())
    }

    /// The plans of a write's parts of large pages, and the grains the write newly maps.
    fn plan(&self, map: &PageMap, offset: u64, data: &[u8], tight: bool) -> (Vec<PartPlan>, u64) {
        let lb = self.large_bytes();
        let mut sparse_free = self.sparse_capacity.saturating_sub(self.sparse_len.load(SeqCst));
        let (mut plans, mut new, mut done) = (Vec::new(), 0, 0);
        for (page, in_page, n) in page_pieces(offset, data.len() as u64, lb as u32) {
            if n as u64 == lb {
                new += if matches!(map.load(page), Entry::Mapped(_)) {
                    0
                } else {
                    self.subpages
                };
            } else {
                let (plan, grains) = self.plan_part(map, page, in_page, &data[done..done + n], &mut sparse_free, tight);
                plans.push(plan);
                new += grains;
            }
            done += n;
        }
        (plans, new)
    }

    /// Moves the live small pages of one record of a victim into the last GC stream.
    fn relocate_small(&self, log: &Log, victim: u32, meta: &RecordMeta, data: &[u8]) -> Result<()> {
        let base = victim as u64 * log.geo().grains_per_segment as u64 + meta.start_grain as u64 + 1;
        let sb = self.small_bytes;
        let streams = self.dense.placement_streams();
        let mut slot = 0usize;
        for e in &meta.entries {
            let MetaEntry::Data { page: small, seq, crc } = *e else { continue };
            let grain = base + slot as u64;
            let bytes = &data[slot * sb..(slot + 1) * sb];
            slot += 1;
            if self.sparse.read().get(&small) != Some(&grain) {
                continue;
            }
            let bytes = &*log.page_to_move(grain, bytes, crc);
            let (new, moved) = streams.place_sized(log, streams.layout().last_gc(), Purpose::Gc, 1, Some(bytes), |new, rec| {
                log.set_crc(new, crc);
                rec.push(MetaEntry::Data { page: small, seq, crc });
                let mut sparse = self.sparse.write();
                let moved = sparse.get(&small) == Some(&grain);
                if moved {
                    sparse.insert(small, new);
                }
                (new, moved)
            })?;
            if moved {
                log.cache_moved(grain, new, log.generation_of(new));
                log.drop_data(victim, 1, None);
                log.counters().gc_bytes_relocated.fetch_add(sb as u64, SeqCst);
                self.dense.relocated_bytes.fetch_add(sb as u64, SeqCst);
            } else {
                // Overwritten or merged meanwhile: the copy is garbage at once.
                log.drop_data(log.geo().segment_of(new), 1, None);
            }
        }
        Ok(())
    }

    /// Sparse entries now, and the most the map may hold.
    pub fn sparse_use(&self) -> (u64, u64) {
        (self.sparse_len.load(SeqCst), self.sparse_capacity)
    }
}

impl VolumeIo for DualVolume {
    fn kind(&self) -> ControllerKind {
        ControllerKind::Dual
    }

    fn size_bytes(&self) -> u64 {
        self.dense.size_bytes()
    }

    fn page_bytes(&self) -> u32 {
        self.dense.page_bytes
    }

    fn mapped_bytes(&self) -> u64 {
        self.mapped_grains() * self.small_bytes as u64
    }

    /// Small pages go to the sparse map without reading their large page.
    fn preferred_write_bytes(&self) -> u32 {
        self.small_bytes as u32
    }

    fn read(&self, log: &Log, offset: u64, buf: &mut [u8]) -> Result<()> {
        let _gate = self.dense.enter()?;
        let map = self.dense.map();
        let lb = self.large_bytes() as usize;
        let (first_page, last_page) = (offset / lb as u64, (offset + buf.len() as u64 - 1) / lb as u64);
        if first_page == last_page {
            return self.read_piece(log, &map, first_page, (offset % lb as u64) as usize, buf);
        }
        // Several large pages: the dense pages they cover, their ends included, in runs of one
        // device read each (`LsaVolume::read_pages`), then the range's small pages over them.
        // A client reading a file in requests not aligned to the large pages (128 KiB from
        // 96 KiB) would otherwise read each end page on its own, and a file written by
        // concurrent requests page by page: measured on XFS over the SMR model in real time,
        // 37 seeks per 1 MiB file read that way.
        //
        // The small pages are listed before the dense pages are read, as `read_piece` does: a
        // merge after the listing makes a listed small page's read fail, and that piece is read
        // again on its own; a merge before it is in the dense page read after it.
        let listed: Vec<(u64, usize, usize, Vec<u64>)> = if self.sparse_len.load(SeqCst) == 0 {
            Vec::new()
        } else {
            let sparse = self.sparse.read();
            page_pieces(offset, buf.len() as u64, self.dense.page_bytes)
                .filter_map(|(page, in_page, n)| {
                    let smalls = self.piece_smalls(page, in_page, n);
                    let present: Vec<u64> = sparse.range(smalls).map(|(&p, _)| p).collect();
                    (!present.is_empty()).then_some((page, in_page, n, present))
                })
                .collect()
        };
        let at = (offset - first_page * lb as u64) as usize;
        let mut whole = vec![0u8; (last_page - first_page + 1) as usize * lb];
        self.dense.read_pages(log, &map, first_page, &mut whole)?;
        let sb = self.small_bytes;
        for (page, in_page, n, smalls) in listed {
            let slot = &mut whole[(page - first_page) as usize * lb..][..lb];
            for small in smalls {
                let small_at = (small - page * self.subpages) as usize * sb;
                if !self.read_small(log, small, page, &mut slot[small_at..small_at + sb])? {
                    self.read_piece(log, &map, page, in_page, &mut slot[in_page..in_page + n])?;
                    break;
                }
            }
        }
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }

    fn write(&self, log: &Log, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        let _gate = self.dense.enter()?;
        if data.is_empty() {
            return Ok(());
        }
        let map = self.dense.map();
        let lb = self.large_bytes();
        let _locks = self.lock_pages(offset / lb..=(offset + data.len() as u64 - 1) / lb);
        // A pool too full for new small pages may still take the write merged into large
        // pages that are mapped already (as write-zeroes of part of a page needs).
        let (plans, new) = self.plan(&map, offset, data, false);
        let plans = match log.check_room(new) {
            Ok(()) => plans,
            Err(e) => {
                let (plans, new) = self.plan(&map, offset, data, true);
                log.check_room(new).map_err(|_| e)?;
                plans
            }
        };
        let mut plans = plans.into_iter();
        let mut done = 0;
        // Whole large pages go down in runs; parts of one go to the sparse map.
        let mut run: Option<(u64, usize)> = None; // (first page, offset in `data`)
        for (page, in_page, n) in page_pieces(offset, data.len() as u64, lb as u32) {
            if n as u64 == lb {
                run.get_or_insert((page, done));
            } else {
                if let Some((first, at)) = run.take() {
                    self.write_large(log, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
                }
                let plan = plans.next().unwrap_or(PartPlan::Merge);
                self.write_part(log, &map, page, in_page, &data[done..done + n], plan)?;
            }
            done += n;
        }
        if let Some((first, at)) = run {
            self.write_large(log, &map, first, &data[at..done], payload.map(|p| (p, at)))?;
        }
        Ok(())
    }

    fn trim(&self, log: &Log, offset: u64, len: u64) -> Result<()> {
        let _gate = self.dense.enter()?;
        let lb = self.large_bytes();
        let (first, end) = (offset.div_ceil(lb), (offset + len) / lb);
        if end <= first {
            return Ok(());
        }
        let map = self.dense.map();
        let _locks = self.lock_pages(first..=end - 1);
        // A large page never written in the dense map still needs a tombstone when it has
        // small pages: the trim must outlive their records (else a crash scan brings them back
        // once the segment holding the trim is reused).
        let with_small: std::collections::BTreeSet<u64> = if self.sparse_len.load(SeqCst) == 0 {
            Default::default()
        } else {
            let sparse = self.sparse.read();
            sparse
                .range(first * self.subpages..end * self.subpages)
                .map(|(&s, _)| s / self.subpages)
                .collect()
        };
        let has_small = |page: u64| with_small.contains(&page);
        if let Some(killer) = self.dense.trim_pages(log, &map, first, end - first, &has_small)? {
            let _inflight = log.invalidation_guard();
            self.drop_sparse(log, first * self.subpages..end * self.subpages, killer);
        }
        Ok(())
    }

    /// Shares whole large pages: every large page of the batch (destination or source) with
    /// small pages is merged first, under the stripe locks of all of them, so the batch is the
    /// dense map's (one record, see [`LsaVolume::share_pages`]) and a shared page never has
    /// small pages (a write of part of it merges). A destination merged and then not shared
    /// (a crash between) reads what it read before the batch.
    fn share(&self, log: &Log, remaps: &[super::lsa::PageRemap]) -> Result<()> {
        let _gate = self.dense.enter()?;
        let map = self.dense.map();
        self.dense.check_batch(remaps, map.pages())?;
        let ranges = || remaps.iter().flat_map(|r| [r.dst..r.dst + r.pages, r.src..r.src + r.pages]);
        let _locks = self.lock_page_ranges(ranges());
        if self.sparse_len.load(SeqCst) > 0 {
            let with_small: std::collections::BTreeSet<u64> = {
                let sparse = self.sparse.read();
                ranges()
                    .flat_map(|r| {
                        sparse
                            .range(r.start * self.subpages..r.end * self.subpages)
                            .map(|(&s, _)| s / self.subpages)
                    })
                    .collect()
            };
            for page in with_small {
                self.merge(log, &map, page, None)?;
            }
        }
        self.dense.share_pages(log, remaps)
    }

    fn page_location(&self, page: u64) -> Option<u64> {
        self.dense.page_location(page).or_else(|| self.sparse_of(page).first().map(|e| e.1))
    }

    fn grow(&self, new_size_bytes: u64) -> Result<()> {
        self.dense.grow(new_size_bytes);
        Ok(())
    }

    fn retire(&self) {
        VolumeIo::retire(&self.dense)
    }

    fn is_retired(&self) -> bool {
        self.dense.is_retired()
    }

    fn mapped_grains(&self) -> u64 {
        self.dense.mapped_grains() + self.sparse_len.load(SeqCst)
    }
}

impl Controller for DualVolume {
    fn id(&self) -> u32 {
        self.dense.id
    }

    fn name(&self) -> &str {
        &self.dense.name
    }

    fn streams(&self) -> Arc<Streams> {
        self.dense.placement_streams()
    }

    fn set_placement(&self, log: &Log, placement: Box<dyn Placement>, name: &str) -> Result<()> {
        let _gate = self.dense.gate.write();
        self.dense.replace_placement(log, placement, name)
    }

    fn stats(&self) -> ControllerStats {
        let dense = self.dense.stats();
        let (used, capacity) = self.sparse_use();
        ControllerStats {
            controller: ControllerKind::Dual.name().to_string(),
            mapped_bytes: self.mapped_bytes(),
            map_memory_bytes: dense.map_memory_bytes + used * SPARSE_ENTRY_BYTES,
            checkpoint_image_bytes: self.image_bytes(),
            settings: vec![("sparse_pages".into(), capacity)],
            sparse_pages: used,
            sparse_capacity_pages: capacity,
            merged_pages: self.merges.load(SeqCst),
            small_pages_written: self.small_writes.load(SeqCst),
            ..dense
        }
    }

    /// Moves the live large pages and tombstones (as the LSA controller does) and the live
    /// small pages of `victim`, in one walk over its records.
    fn relocate(&self, log: &Log, victim: u32) -> Result<()> {
        let map = self.dense.map();
        let mut walk = VictimWalk::new(log, victim);
        let mut failure = None;
        log.walk_victim(victim, |_, meta, data| {
            if meta.page_grains == 1 {
                if failure.is_none() {
                    failure = self.relocate_small(log, victim, meta, data).err();
                }
            } else {
                self.dense.relocate_record(log, &map, &mut walk, meta, data, &HeldPages::ALL);
            }
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.dense.finish_relocation(log, &map, walk)
    }

    fn maintain(&self, log: &Log) -> Result<bool> {
        let (used, capacity) = self.sparse_use();
        if used * 8 <= capacity * 7 || self.is_retired() {
            return Ok(false);
        }
        // The coldest large pages first: those whose newest small page sits in the segment
        // opened longest ago (a page written long ago is the least likely to be written
        // again soon; merging the hottest, such as a file system's log, only made them come
        // back), and of equally cold ones those with the most small pages.
        let mut pages_by: BTreeMap<u64, (u64, u32)> = BTreeMap::new(); // page -> (newest, count)
        for (&small, &grain) in self.sparse.read().iter() {
            let opened = log.segment_view(log.geo().segment_of(grain)).opened_seq;
            let e = pages_by.entry(small / self.subpages).or_default();
            e.0 = e.0.max(opened);
            e.1 += 1;
        }
        let mut pages: Vec<(u64, std::cmp::Reverse<u32>, u64)> = pages_by
            .into_iter()
            .map(|(p, (newest, n))| (newest, std::cmp::Reverse(n), p))
            .collect();
        pages.sort_unstable();
        let _gate = self.dense.enter()?;
        let map = self.dense.map();
        for &(_, _, page) in pages.iter().take(MERGES_PER_PASS) {
            let _lock = self.lock_pages(page..=page);
            if !self.sparse_of(page).is_empty() {
                self.merge(log, &map, page, None)?;
            }
            if self.sparse_len.load(SeqCst) * 4 <= capacity * 3 {
                break;
            }
        }
        Ok(true)
    }

    fn clear(&self) {
        self.dense.clear();
        self.sparse.write().clear();
        self.sparse_len.store(0, SeqCst);
    }

    fn begin_replay(&self) {
        self.dense.begin_replay();
        *self.replay.lock() = Some(BTreeMap::new());
    }

    /// Large pages replay as in the LSA controller; of each small page the entry with the
    /// highest sequence number is kept, to be weighed against its large page at the end.
    fn replay(&self, log: &Log, r: &ScannedRecord<'_>) {
        if r.meta.page_grains != 1 {
            return self.dense.replay(log, r);
        }
        let small_pages = self.dense.size_bytes() / self.small_bytes as u64;
        let base = r.segment as u64 * log.geo().grains_per_segment as u64 + r.meta.start_grain as u64 + 1;
        let mut guard = self.replay.lock();
        let Some(best) = guard.as_mut() else { return };
        let mut slot = 0usize;
        for e in &r.meta.entries {
            let MetaEntry::Data { page: small, seq, crc } = *e else { continue };
            let ok = r.trusted || r.intact.get(slot).copied().unwrap_or(false);
            let grain = base + slot as u64;
            slot += 1;
            if small >= small_pages {
                continue;
            }
            self.dense.replay_saw_data(small / self.subpages);
            if ok && best.get(&small).is_none_or(|b| seq >= b.0) {
                best.insert(small, (seq, grain, crc));
            }
        }
    }

    /// A small page is kept when it is newer than everything replayed for its large page.
    fn end_replay(&self, log: &Log) {
        let best = self.replay.lock().take().unwrap_or_default();
        {
            let mut sparse = self.sparse.write();
            sparse.clear();
            for (small, (seq, grain, crc)) in best {
                if seq > self.dense.replayed_seq(small / self.subpages) {
                    sparse.insert(small, grain);
                    log.set_crc(grain, crc);
                }
            }
            self.sparse_len.store(sparse.len() as u64, SeqCst);
        }
        self.dense.end_replay(log);
    }

    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64> {
        let dense = self.dense.account(log, visit)?;
        let gps = log.geo().grains_per_segment as u64;
        let sparse = self.sparse.read();
        for &g in sparse.values() {
            visit(Reference::Data {
                segment: (g / gps) as u32,
                grains: 1,
            })?;
        }
        self.sparse_len.store(sparse.len() as u64, SeqCst);
        Ok(dense + sparse.len() as u64)
    }

    fn image_bytes(&self) -> u64 {
        self.dense.image_bytes() + 8 + 16 * self.sparse.read().len() as u64
    }

    fn encode_image(&self, out: &mut Vec<u8>) {
        self.dense.encode_image(out);
        let sparse = self.sparse.read();
        out.extend_from_slice(&(sparse.len() as u64).to_le_bytes());
        for (&small, &grain) in sparse.iter() {
            out.extend_from_slice(&small.to_le_bytes());
            out.extend_from_slice(&grain.to_le_bytes());
        }
    }

    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()> {
        self.dense.load_image(d)?;
        let bad = |what: &str| Error::Corrupt(format!("checkpoint of volume {}: {what}", self.dense.name));
        let n = d.u64("sparse entries").map_err(|_| bad("truncated"))?;
        let small_pages = self.dense.size_bytes() / self.small_bytes as u64;
        if n > small_pages {
            return Err(bad("more sparse entries than small pages"));
        }
        let total_grains = self.dense.map().encoding.total_grains;
        let mut sparse = BTreeMap::new();
        for _ in 0..n {
            let small = d.u64("sparse page").map_err(|_| bad("truncated sparse map"))?;
            let grain = d.u64("sparse grain").map_err(|_| bad("truncated sparse map"))?;
            if small >= small_pages || grain >= total_grains {
                return Err(bad("sparse entry out of range"));
            }
            sparse.insert(small, grain);
        }
        self.sparse_len.store(sparse.len() as u64, SeqCst);
        *self.sparse.write() = sparse;
        Ok(())
    }

    fn shared_pages(&self) -> Vec<super::SharedGrain> {
        self.dense.shared_pages()
    }

    fn load_shared_pages(&self, grains: &[u64], entries: &[(u64, u32)]) {
        self.dense.load_shared_pages(grains, entries)
    }
}
