//! SHARE's remap on a page-mapped volume: a batch of `(dst, src, pages)` ranges after which
//! every destination page reads what its source page read, without copying data. A physical
//! page then has several logical owners.
//!
//! Owns: the shared-page index ([`SharedPages`]: which grains are shared, by which pages), the
//! share batch ([`LsaVolume::share_pages`]), the GC's move of a shared page
//! ([`LsaVolume::relocate_shared`]) and the carrying forward of share entries.
//!
//! Invariants:
//! - A grain absent from the index has at most one owner: the page its record's data entry
//!   names (so the GC's usual test `map[page] == grain` finds every live page). Once a grain is
//!   shared it stays in the index while any page owns it.
//! - A grain in the index is owned by exactly the pages it lists, plus pages leaving it (their
//!   map entry has changed and they remove themselves in `invalidate`); its data counts once in
//!   its segment, and whoever removes its last owner drops it.
//! - A grain has at most [`max_share_owners`] owners, so the GC re-points all of them in the
//!   record that carries the moved page.
//! - Grains join the index only under the volume's share gate held exclusively (a share
//!   batch); the GC holds it shared while it walks a record, so a page it found unshared stays
//!   unshared until its move is done.
//! - A share entry names data that is durable: the batch syncs first when a source page is
//!   not, so a batch can never outlive its data at a crash. A batch is one record, so after a
//!   crash all of it or none of it is visible.

use super::{LsaVolume, STRIPES};
use crate::controller::map::{Entry, PageMap};
use crate::error::{Error, Result};
use crate::format::MetaEntry;
use crate::log::capacity::Purpose;
use crate::log::record::OpenRecord;
use crate::log::Log;
use crate::policy::placement::Relocation;
use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Most owners one physical page may have: a share that would give a page more is refused.
pub const MAX_SHARE_OWNERS: u32 = 64;
/// Most ranges in one share batch.
pub const MAX_SHARE_RANGES: usize = 256;
/// How often a batch retries when its sources keep changing under it (each retry syncs).
const SHARE_ATTEMPTS: usize = 64;

/// The most owners a page may have in a pool whose metadata pages hold `meta_slots` slots:
/// the GC's move of a shared page writes its data entry and one share entry (two slots) per
/// owner in one record.
pub fn max_share_owners(meta_slots: u32) -> u32 {
    (meta_slots.saturating_sub(1) / 2).min(MAX_SHARE_OWNERS)
}

/// One range of a share batch, in pages: afterwards page `dst + i` reads what page `src + i`
/// read before the batch, for `i < pages`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRemap {
    pub dst: u64,
    pub src: u64,
    pub pages: u64,
}

/// What a page leaving a grain found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// The grain is not shared: the page was its only owner.
    NotShared,
    /// Other pages still own it.
    OthersRemain,
    /// The page was its last owner.
    Last,
}

/// One owner of a shared grain: a page, and where the entry that maps it there lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub page: u64,
    /// The segment of the share entry that maps the page to the grain, which it keeps alive
    /// like a tombstone (counted in the segment's tombstones); `None` when the entry is in the
    /// grain's own segment (the page's data entry, or a GC move's share entry), which the data
    /// keeps alive.
    pub entry: Option<u32>,
}

/// The shared-page index of one volume.
#[derive(Default)]
pub struct SharedPages {
    owners: Mutex<HashMap<u64, Vec<Owner>>>,
    /// Grains in the index, readable without the lock (0: nothing of the volume is shared,
    /// the common case, which costs writers nothing).
    count: AtomicU64,
}

impl SharedPages {
    pub fn is_empty(&self) -> bool {
        self.count.load(SeqCst) == 0
    }

    /// Shared grains (pages of data with more than one owner, or with an owner other than the
    /// page that wrote them).
    pub fn len(&self) -> u64 {
        self.count.load(SeqCst)
    }

    pub fn holds(&self, grain: u64) -> bool {
        !self.is_empty() && self.owners.lock().contains_key(&grain)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<Owner>>> {
        self.owners.lock()
    }

    /// `page`'s map entry no longer points at `grain`; returns whether others still own it and
    /// the segment of the share entry that mapped the page (its tombstone to drop).
    pub fn leave(&self, grain: u64, page: u64) -> (Leave, Option<u32>) {
        if self.is_empty() {
            return (Leave::NotShared, None);
        }
        let mut m = self.lock();
        let Some(list) = m.get_mut(&grain) else {
            return (Leave::NotShared, None);
        };
        let at = list.iter().position(|o| o.page == page);
        assert!(at.is_some(), "page {page} left shared grain {grain} without owning it");
        let gone = list.swap_remove(at.unwrap_or_default());
        if list.is_empty() {
            m.remove(&grain);
            self.count.fetch_sub(1, SeqCst);
            (Leave::Last, gone.entry)
        } else {
            (Leave::OthersRemain, gone.entry)
        }
    }

    /// Every shared grain with its owners, sorted (for the checkpoint and the accounting).
    pub fn snapshot(&self) -> Vec<(u64, Vec<Owner>)> {
        let mut all: Vec<(u64, Vec<Owner>)> = self.lock().iter().map(|(g, o)| (*g, o.clone())).collect();
        all.sort_unstable_by_key(|e| e.0);
        all
    }

    pub fn memory_bytes(&self) -> u64 {
        let m = self.lock();
        m.values().map(|v| 16 * v.capacity() as u64 + 48).sum()
    }

    /// Rebuilds the index from the map for `grains`, the grains of the pages whose winning
    /// entry is a share entry (after a scan) or the grains the checkpoint listed: each gets the
    /// pages that map to it, with the segment of their share entry from `entries` (pages absent
    /// from it are mapped by an entry in the grain's own segment).
    pub fn rebuild(&self, grains: &HashSet<u64>, entries: &HashMap<u64, u32>, map: &PageMap) {
        let mut m = self.lock();
        m.clear();
        if !grains.is_empty() {
            map.for_each_mapped(|page, raw| {
                if let Entry::Mapped(g) = map.encoding.decode(raw) {
                    if grains.contains(&g) {
                        m.entry(g).or_default().push(Owner {
                            page,
                            entry: entries.get(&page).copied(),
                        });
                    }
                }
            });
        }
        self.count.store(m.len() as u64, SeqCst);
    }
}

/// Each destination page of `remaps` with its source and the grain the source maps to now.
fn resolve_targets(remaps: &[PageRemap], map: &PageMap) -> Vec<Target> {
    remaps
        .iter()
        .flat_map(|r| (0..r.pages).map(move |i| (r.dst + i, r.src + i)))
        .map(|(dst, src)| Target {
            dst,
            src,
            grain: match map.load(src) {
                Entry::Mapped(g) => Some(g),
                _ => None,
            },
            size_code: map.stored_grains(src),
        })
        .collect()
}

/// What a share batch resolved each destination page to, before changing anything.
#[derive(Debug, Clone, Copy)]
struct Target {
    dst: u64,
    /// The source's map entry: a grain, or `None` when the source reads as zeros.
    grain: Option<u64>,
    /// The source page (the grain's only owner when it is not yet shared).
    src: u64,
    /// The source's stored-size code (0: a whole page; a compressing volume's compressed
    /// page otherwise), which the destination takes with the grain.
    size_code: u8,
}

/// One entry a batch writes: `count` destination pages from `dst` on, mapped to consecutive
/// stored pages from `grain` on, each of size code `size_code` (a share entry), or trimmed
/// (`grain` is `None`).
#[derive(Debug, Clone, Copy)]
struct Run {
    dst: u64,
    count: u64,
    grain: Option<u64>,
    size_code: u8,
}

/// Entries a batch's targets need: runs of consecutive destination pages whose sources are
/// consecutive stored pages of one size become one share entry, runs of zero sources one trim
/// entry (a page reading zeros whose destination reads zeros already needs none). `stride`
/// gives the grains a size code stands for.
fn plan_entries(targets: &[Target], map: &PageMap, stride: impl Fn(u8) -> u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for t in targets {
        // A page that already reads what its source reads needs no entry: an entry the index
        // did not track would outlive the data it names (the GC moves the page under its own
        // data entry).
        let now = map.load(t.dst);
        if (t.grain.is_none() && now == Entry::Unmapped) || t.grain.is_some_and(|g| now == Entry::Mapped(g)) {
            continue;
        }
        if let Some(last) = runs.last_mut() {
            let follows = last.dst + last.count == t.dst
                && match (last.grain, t.grain) {
                    (Some(g), Some(h)) => last.size_code == t.size_code && g + last.count * stride(last.size_code) == h,
                    (None, None) => true,
                    _ => false,
                };
            if follows {
                last.count += 1;
                continue;
            }
        }
        runs.push(Run {
            dst: t.dst,
            count: 1,
            grain: t.grain,
            size_code: if t.grain.is_some() { t.size_code } else { 0 },
        });
    }
    runs
}

fn slots_of(runs: &[Run]) -> u32 {
    runs.iter().map(|r| if r.grain.is_some() { 2 } else { 1 }).sum()
}

/// How one attempt of a batch ended.
enum Attempt {
    Done,
    /// A source page is not durable yet: sync and try again.
    NotDurable,
    /// The batch needs more slots than were reserved (sources changed meanwhile).
    Replan(u32),
    /// The GC is walking a record of the volume: wait for it without holding the stream.
    Busy,
    Refused(Error),
}

impl LsaVolume {
    /// Locks every stripe, in order (share batches and the GC's move of a shared page: no
    /// writer or trim changes a map entry meanwhile).
    fn lock_all_stripes(&self) -> Vec<MutexGuard<'_, ()>> {
        (0..STRIPES).map(|i| self.stripes[i].lock()).collect()
    }

    /// The entries a batch's targets need (see [`plan_entries`]).
    fn plan_entries(&self, targets: &[Target], map: &PageMap) -> Vec<Run> {
        plan_entries(targets, map, |code| self.grains_of_size_code(code) as u64)
    }

    /// Whether `page` maps to a grain other pages own too (a dual-mapping volume merges
    /// instead of laying small pages over such a page, see its module documentation).
    pub fn page_is_shared(&self, map: &PageMap, page: u64) -> bool {
        matches!(map.load(page), Entry::Mapped(g) if self.shared.holds(g))
    }

    /// Whether the entry that maps `page` now may not be durable yet: a share entry or a trim
    /// not yet synced. (A dual-mapping volume syncs before it merges such a page: the merge
    /// would carry the batch's effect on the large page's other pages into a record of its
    /// own, which could survive a crash without the rest of the batch.)
    pub fn mapping_pending(&self, log: &Log, map: &PageMap, page: u64) -> bool {
        match map.load(page) {
            Entry::Trimmed(segment) => !log.segment_durable(segment),
            Entry::Mapped(g) if !self.shared.is_empty() => self
                .shared
                .lock()
                .get(&g)
                .and_then(|owners| owners.iter().find(|o| o.page == page))
                .and_then(|o| o.entry)
                .is_some_and(|segment| !log.segment_durable(segment)),
            _ => false,
        }
    }

    /// Checks a batch against the volume and the limits; refuses it whole.
    pub(crate) fn check_batch(&self, remaps: &[PageRemap], pages: u64) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("share on volume {:?}: {why}", self.name)));
        if remaps.is_empty() {
            return bad("empty batch".into());
        }
        if remaps.len() > MAX_SHARE_RANGES {
            return bad(format!("{} ranges in one batch; at most {MAX_SHARE_RANGES}", remaps.len()));
        }
        let mut dsts: Vec<(u64, u64)> = Vec::with_capacity(remaps.len());
        for r in remaps {
            let fits = |at: u64| at.checked_add(r.pages).is_some_and(|end| end <= pages);
            if r.pages == 0 || !fits(r.dst) || !fits(r.src) {
                return bad(format!(
                    "range of {} pages from page {} to page {} is empty or past the end ({pages} pages)",
                    r.pages, r.src, r.dst
                ));
            }
            dsts.push((r.dst, r.dst + r.pages));
        }
        dsts.sort_unstable();
        if dsts.windows(2).any(|w| w[1].0 < w[0].1) {
            return bad("two ranges of the batch have overlapping destinations".into());
        }
        Ok(())
    }

    /// Remaps the batch atomically (see the module documentation). Every range is checked
    /// before anything changes; a batch whose entries do not fit one record (too many ranges,
    /// or sources scattered over too many places) is refused with nothing changed.
    pub fn share_pages(&self, log: &Log, remaps: &[PageRemap]) -> Result<()> {
        let map = self.map();
        self.check_batch(remaps, map.pages())?;
        let max_slots = log.geo().meta_entries;
        let targets = resolve_targets(remaps, &map);
        let new_grains: u64 = targets
            .iter()
            .filter(|t| t.grain.is_some() && !matches!(map.load(t.dst), Entry::Mapped(_)))
            .map(|t| self.grains_of_size_code(t.size_code) as u64)
            .sum();
        log.check_room(new_grains)?;
        let mut slots = slots_of(&self.plan_entries(&targets, &map)).max(1);
        let mut attempts = 0;
        while attempts < SHARE_ATTEMPTS {
            if slots > max_slots {
                return Err(Error::InvalidArgument(format!(
                    "share on volume {:?}: the batch needs {slots} metadata slots and one record holds {max_slots}; \
                     its sources are scattered over too many places: split it into smaller batches",
                    self.name
                )));
            }
            // Share entries are metadata only, like trims: they go where the placement puts
            // trims.
            let placing = self.placing.load();
            let attempt = placing
                .streams
                .place_group(log, placing.placement.place_trim(), Purpose::User, slots, None, |seg, rec| {
                    self.share_in_record(log, &map, remaps, slots, seg as u32, rec)
                })?;
            match attempt {
                Attempt::Done => return Ok(()),
                Attempt::Refused(e) => return Err(e),
                Attempt::Replan(n) => {
                    slots = n;
                    attempts += 1;
                }
                // Waits for the GC's walk (not an attempt: the sources did not change).
                Attempt::Busy => drop(self.share_gate.write()),
                // The sources' records must be durable before an entry may name them.
                Attempt::NotDurable => {
                    log.flush()?;
                    attempts += 1;
                }
            }
        }
        Err(Error::InvalidArgument(format!(
            "share on volume {:?}: its source pages kept changing during {SHARE_ATTEMPTS} attempts; retry",
            self.name
        )))
    }

    /// One attempt of [`LsaVolume::share_pages`] in the open record `rec` of segment `seg`,
    /// which has room for `slots` metadata slots: the batch resolved again under the share
    /// gate and every stripe lock, and, when it still fits, is durable in its sources and
    /// keeps every page under its owner limit, its entries pushed under one sequence number
    /// and the map changed.
    fn share_in_record(&self, log: &Log, map: &PageMap, remaps: &[PageRemap], slots: u32, seg: u32, rec: &mut OpenRecord) -> Attempt {
        // Never wait for the gate while holding the stream: the GC, holding the gate shared,
        // may flush, which needs this stream.
        let Some(_gate) = self.share_gate.try_write() else {
            return Attempt::Busy;
        };
        let _inflight = log.invalidation_guard();
        let _stripes = self.lock_all_stripes();
        let targets = resolve_targets(remaps, map);
        let runs = self.plan_entries(&targets, map);
        let need = slots_of(&runs);
        if need > slots {
            return Attempt::Replan(need);
        }
        if targets.iter().any(|t| t.grain.is_some_and(|g| !log.grain_durable(g))) {
            return Attempt::NotDurable;
        }
        let mut shared = self.shared.lock();
        if let Some(e) = self.owners_over_limit(&shared, &targets, map, max_share_owners(log.geo().meta_entries)) {
            return Attempt::Refused(e);
        }
        // Every entry of the batch, under one sequence number, in this one record.
        let seq = log.next_seq();
        for run in &runs {
            rec.push(match run.grain {
                Some(grain) => MetaEntry::Share {
                    page: run.dst,
                    count: run.count,
                    grain,
                    seq,
                    stored_grains: run.size_code,
                },
                None => MetaEntry::Trim {
                    page: run.dst,
                    count: run.count,
                    seq,
                },
            });
        }
        // New owners join before any old one leaves, so that a grain two ranges swap is never
        // dropped in between. Each keeps the share record's segment alive.
        for t in &targets {
            if let Some(g) = t.grain {
                if map.load(t.dst) != Entry::Mapped(g) {
                    let list = shared.entry(g).or_insert_with(|| {
                        self.shared.count.fetch_add(1, SeqCst);
                        vec![Owner { page: t.src, entry: None }]
                    });
                    debug_assert!(list.iter().all(|o| o.page != t.dst));
                    list.push(Owner {
                        page: t.dst,
                        entry: Some(seg),
                    });
                    log.add_tombstone(seg);
                }
            }
        }
        drop(shared);
        self.remap_targets(log, map, &targets, seg, rec.buf.record_id);
        log.counters()
            .pages_shared
            .fetch_add(targets.iter().filter(|t| t.grain.is_some()).count() as u64, SeqCst);
        log.counters().share_batches.fetch_add(1, SeqCst);
        Attempt::Done
    }

    /// The refusal for a batch that would give a grain more than `limit` owners, if it would.
    fn owners_over_limit(&self, shared: &HashMap<u64, Vec<Owner>>, targets: &[Target], map: &PageMap, limit: u32) -> Option<Error> {
        let mut adding: HashMap<u64, u32> = HashMap::new();
        for t in targets {
            if let Some(g) = t.grain {
                if map.load(t.dst) != Entry::Mapped(g) {
                    *adding.entry(g).or_default() += 1;
                }
            }
        }
        adding.iter().find_map(|(g, &n)| {
            let now = shared.get(g).map_or(1, |v| v.len() as u32);
            (now + n > limit).then(|| {
                Error::InvalidArgument(format!(
                    "share on volume {:?}: a page would have {} owners; at most {limit}",
                    self.name,
                    now + n
                ))
            })
        })
    }

    /// Points every target's destination at its source's grain (or trims it, in segment
    /// `seg`), then lets go of what each held before (`killer`: the share record's id).
    fn remap_targets(&self, log: &Log, map: &PageMap, targets: &[Target], seg: u32, killer: u64) {
        let mut olds = Vec::new();
        for t in targets {
            let old = map.load(t.dst);
            // (Every stripe is locked: a reader that sees the new entry with the old size
            // re-checks both under its stripe's lock before it calls the page damaged.)
            match t.grain {
                Some(g) if old != Entry::Mapped(g) => {
                    map.store(t.dst, Entry::Mapped(g));
                    let old_code = map.swap_stored_grains(t.dst, t.size_code);
                    olds.push((t.dst, old, self.grains_of_size_code(old_code), Some(t.size_code)));
                }
                None if old != Entry::Unmapped && old != Entry::Trimmed(seg) => {
                    log.add_tombstone(seg);
                    map.store(t.dst, Entry::Trimmed(seg));
                    olds.push((t.dst, old, self.stored_grains(map, t.dst), None));
                }
                _ => {}
            }
        }
        for (page, old, old_grains, now) in olds {
            match now {
                Some(code) => self.invalidate(log, page, old, old_grains, self.grains_of_size_code(code), killer),
                None => self.invalidate_trimmed(log, page, old, old_grains, killer),
            }
        }
    }

    /// The GC moves a shared page: its data (`bytes`, as stored: `grains` grains) is written
    /// once, with the data entry of the victim (which describes the slot) and a share entry,
    /// under a new sequence number, for every owner, all in one record; every owner's map entry
    /// moves to the copy. Owners leaving meanwhile stay with the old grain and drop it when the
    /// last one has gone.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn relocate_shared(
        &self,
        log: &Log,
        map: &PageMap,
        victim: u32,
        victim_view: crate::policy::placement::SegmentView,
        grain: u64,
        entry: MetaEntry,
        bytes: &[u8],
        grains: u32,
    ) -> Result<()> {
        let MetaEntry::Data { page, seq, crc } = entry else {
            return Ok(());
        };
        // The copy re-points every owner in a record of its own; an owner whose share entry is
        // not durable yet must not become durable through that record alone (its batch would
        // be half there after a crash), so the batches go down first.
        let pending = self
            .shared
            .lock()
            .get(&grain)
            .is_some_and(|owners| owners.iter().any(|o| o.entry.is_some_and(|s| !log.segment_durable(s))));
        if pending {
            log.flush()?;
        }
        let placing = self.placing.load();
        let to = placing.placement.place_gc(&Relocation {
            page,
            now: log.now_seq(),
            victim: victim_view,
            mapped_pages: self.mapped_pages.load(SeqCst),
            volume_pages: map.pages(),
        });
        let slots = 1 + 2 * max_share_owners(log.geo().meta_entries);
        let size_code = self.size_code_of_grains(grains);
        let (new, generation, moved, last) = placing.streams.place_group(log, to, Purpose::Gc, slots, Some(bytes), |new, rec| {
            log.set_crc(new, crc);
            rec.push(MetaEntry::Data { page, seq, crc });
            let _stripes = self.lock_all_stripes();
            let mut shared = self.shared.lock();
            let owners = shared.get(&grain).cloned().unwrap_or_default();
            let mut moved = Vec::new();
            for o in owners {
                if map.load(o.page) == Entry::Mapped(grain) {
                    map.store(o.page, Entry::Mapped(new));
                    rec.push(MetaEntry::Share {
                        page: o.page,
                        count: 1,
                        grain: new,
                        seq: log.next_seq(),
                        stored_grains: size_code,
                    });
                    // The entry that mapped it is dead once this record is durable.
                    if let Some(s) = o.entry {
                        log.drop_tombstone(s, Some(rec.buf.record_id));
                    }
                    moved.push(Owner { page: o.page, entry: None });
                }
            }
            let mut last = false;
            if let Some(list) = shared.get_mut(&grain) {
                list.retain(|o| !moved.iter().any(|m| m.page == o.page));
                if list.is_empty() {
                    shared.remove(&grain);
                    self.shared.count.fetch_sub(1, SeqCst);
                    last = true;
                }
            }
            let count = moved.len();
            if count > 0 {
                shared.insert(new, moved);
                self.shared.count.fetch_add(1, SeqCst);
            }
            (new, log.generation_of(new), count, last)
        })?;
        if moved == 0 {
            // Every owner left meanwhile: the copy is garbage at once.
            log.drop_data(log.geo().segment_of(new), grains, None);
        } else {
            log.cache_moved(grain, new, generation);
            let stored_bytes = bytes.len() as u64;
            log.counters().gc_bytes_relocated.fetch_add(stored_bytes, SeqCst);
            self.relocated_bytes.fetch_add(stored_bytes, SeqCst);
        }
        if last {
            log.drop_data(victim, grains, None);
        }
        Ok(())
    }

    /// Carries forward the share entries of a victim whose pages are still mapped by them (a
    /// share entry is the only record of its pages' mapping, as a tombstone is of a trim): each
    /// moves, with its sequence number and stored size, into the last GC stream, and its
    /// page's tombstone with it.
    pub(super) fn carry_shares(&self, log: &Log, map: &PageMap, victim: u32, shares: &[MetaEntry]) -> Result<()> {
        let last_gc = self.placing.load().streams.layout().last_gc();
        // A carried entry must not be durable before the batch it came from (see
        // `relocate_shared`).
        if !shares.is_empty() && !log.segment_durable(victim) {
            log.flush()?;
        }
        for &entry in shares {
            let MetaEntry::Share {
                page,
                count,
                grain,
                seq,
                stored_grains,
            } = entry
            else {
                continue;
            };
            let stride = self.grains_of_size_code(stored_grains) as u64;
            let end = page.saturating_add(count).min(map.pages());
            for p in page..end {
                let g = grain + (p - page) * stride;
                let lives_here = |shared: &HashMap<u64, Vec<Owner>>| {
                    shared
                        .get(&g)
                        .is_some_and(|list| list.iter().any(|o| o.page == p && o.entry == Some(victim)))
                };
                if !lives_here(&self.shared.lock()) {
                    continue;
                }
                self.placing
                    .load()
                    .streams
                    .place_group(log, last_gc, Purpose::Gc, 2, None, |seg, rec| {
                        let seg = seg as u32;
                        let mut shared = self.shared.lock();
                        if !lives_here(&shared) {
                            return; // the page left meanwhile
                        }
                        rec.push(MetaEntry::Share {
                            page: p,
                            count: 1,
                            grain: g,
                            seq,
                            stored_grains,
                        });
                        if let Some(o) = shared.get_mut(&g).and_then(|l| l.iter_mut().find(|o| o.page == p)) {
                            o.entry = Some(seg);
                        }
                        log.add_tombstone(seg);
                        log.drop_tombstone(victim, None);
                    })?;
            }
        }
        Ok(())
    }
}
