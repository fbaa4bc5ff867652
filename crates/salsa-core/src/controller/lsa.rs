//! The LSA controller: a volume whose logical pages are mapped one by one through a flat,
//! lock-free [`PageMap`], written into log-structured segments through allocation streams: the
//! user streams and GC streams the volume's [`Placement`] policy declares (SALSA's default:
//! user-hot, user-cold, GC). Each stream has its own open segment, so classes never share one.
//!
//! Invariants: a map entry changes only by swap under the page's stripe lock (writers, trims;
//! each takes its sequence number under that lock, so map order and sequence order agree) or by
//! compare-and-swap (the GC, which never overwrites a newer entry); every place a page leaves is
//! invalidated exactly once.

use super::map::{Entry, PageMap};
use super::record::{OpenRecord, RecordBuf, RecordBytes, SealedRecord};
use super::{Controller, ControllerStats, Reference, ScannedRecord};
use crate::capacity::Purpose;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::{MetaEntry, RecordMeta, StreamKind, VolumeRecord};
use crate::payload::WriteBuffer;
use crate::policy::placement::{Placement, Relocation, SegmentView, StreamLayout, UserWrite};
use crate::scan::walk_segment;
use crate::util::Decoder;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar as StdCondvar, Mutex as StdMutex, MutexGuard as StdMutexGuard, PoisonError};

/// Locks a stream. A panic while holding it is not a reason to stop every later writer (the
/// same as parking_lot, which does not poison), so a poisoned lock is taken as it is.
fn lock_stream(stream: &StdMutex<Stream>) -> StdMutexGuard<'_, Stream> {
    stream.lock().unwrap_or_else(PoisonError::into_inner)
}

const STRIPES: usize = 256;

struct OpenSegment {
    segment: u32,
    incarnation: u64,
    /// Data sequence number when the segment was opened; every record of it repeats it.
    opened_seq: u64,
    /// Next grain to be used in the segment.
    next_grain: u32,
}

/// One allocation stream: an open segment and the record being filled in it.
struct Stream {
    kind: StreamKind,
    /// A writer is allocating the next segment; others wait for it instead of allocating too.
    allocating: bool,
    seg: Option<OpenSegment>,
    rec: Option<OpenRecord>,
}

/// A data page to place, and the payload that holds it (and where) when a record may keep it
/// there instead of copying it.
#[derive(Clone, Copy)]
struct PageData<'d> {
    bytes: &'d [u8],
    held_in: Option<(&'d Arc<WriteBuffer>, usize)>,
}

impl<'d> PageData<'d> {
    fn copied(bytes: &'d [u8]) -> PageData<'d> {
        PageData { bytes, held_in: None }
    }
}

enum Prep {
    Ready,
    Write(SealedRecord),
    NeedSegment,
}

/// Counts a write or trim in [`Engine::invalidations_in_flight`] for its lifetime.
struct InvalidationGuard<'a>(&'a Engine);

impl<'a> InvalidationGuard<'a> {
    fn new(eng: &'a Engine) -> Self {
        eng.invalidations_in_flight.fetch_add(1, SeqCst);
        InvalidationGuard(eng)
    }
}

impl Drop for InvalidationGuard<'_> {
    fn drop(&mut self) {
        self.0.invalidations_in_flight.fetch_sub(1, SeqCst);
    }
}

/// A volume served by the LSA controller.
pub struct LsaVolume {
    pub id: u32,
    pub name: String,
    pub page_bytes: u32,
    pub page_grains: u32,
    size_bytes: AtomicU64,
    map: RwLock<PageMap>,
    /// User streams first, then GC streams.
    /// std's mutex, not parking_lot's: writers contend for a stream's lock, and parking_lot
    /// spins by yielding the CPU, which on few cores hands it to another contender.
    streams: Box<[StdMutex<Stream>]>,
    /// Signalled when a stream's pending segment allocation finishes.
    stream_ready: Box<[StdCondvar]>,
    layout: StreamLayout,
    placement: Box<dyn Placement>,
    /// Name of the placement policy, as stored in the volume table.
    pub placement_name: String,
    stripes: Box<[Mutex<()>]>,
    /// Pages currently mapped to data.
    pub mapped_pages: AtomicU64,
    pub deleted: AtomicBool,
    /// Taken shared by every I/O and exclusively by deletion, so none is in flight then.
    pub gate: RwLock<()>,
    /// Serialise read-modify-writes of the same page.
    rmw: Box<[Mutex<()>]>,
    /// Scratch of a recovery scan in progress.
    replay: Mutex<Option<Replay>>,
}

/// Per page, during a recovery scan: the highest sequence number seen, and whether any data
/// record mentions the page.
struct Replay {
    best_seq: Vec<u64>,
    has_data: Vec<bool>,
}

impl LsaVolume {
    /// A volume as recorded in the volume table, with an empty map and its placement policy.
    pub fn new(rec: &VolumeRecord, map: PageMap, grain_bytes: u32, placement: Box<dyn Placement>) -> LsaVolume {
        let layout = StreamLayout::of(placement.as_ref());
        LsaVolume {
            id: rec.id,
            name: rec.name.clone(),
            page_bytes: rec.page_bytes,
            page_grains: rec.page_bytes / grain_bytes,
            size_bytes: AtomicU64::new(rec.size_bytes),
            map: RwLock::new(map),
            streams: layout
                .kinds()
                .map(|kind| {
                    StdMutex::new(Stream {
                        kind,
                        allocating: false,
                        seg: None,
                        rec: None,
                    })
                })
                .collect(),
            stream_ready: layout.kinds().map(|_| StdCondvar::new()).collect(),
            layout,
            placement,
            placement_name: rec.placement.clone(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            mapped_pages: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            gate: RwLock::new(()),
            rmw: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            replay: Mutex::new(None),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(SeqCst)
    }

    pub fn pages(&self) -> u64 {
        self.size_bytes() / self.page_bytes as u64
    }

    pub fn map(&self) -> RwLockReadGuard<'_, PageMap> {
        self.map.read()
    }

    pub fn map_memory_bytes(&self) -> u64 {
        self.map.read().memory_bytes()
    }

    /// Grows the volume (shrinking is refused: pages past the end could not be forgotten
    /// durably).
    pub fn grow(&self, new_size_bytes: u64) {
        let mut m = self.map.write();
        let pages = new_size_bytes / self.page_bytes as u64;
        *m = m.grown(pages);
        self.placement.resize(pages);
        self.size_bytes.store(new_size_bytes, SeqCst);
    }

    /// Memory held by the placement policy.
    pub fn placement_memory_bytes(&self) -> u64 {
        self.placement.state_bytes()
    }

    /// The placement policy's view of a segment.
    fn segment_view(&self, eng: &Engine, s: u32) -> SegmentView {
        let info = eng.capacity.segment(s);
        SegmentView {
            segment: s,
            stream: info.stream_kind(),
            opened_seq: info.opened_seq.load(SeqCst),
            sealed_seq: info.sealed_seq.load(SeqCst),
        }
    }

    /// Lock held across a partial-page read-modify-write.
    pub fn rmw_lock(&self, page: u64) -> &Mutex<()> {
        &self.rmw[(page % STRIPES as u64) as usize]
    }

    fn stripe(&self, page: u64) -> &Mutex<()> {
        &self.stripes[(page % STRIPES as u64) as usize]
    }

    // ----- streams -----

    /// Under the stream lock: makes sure an open record can take one more entry (and a data
    /// page if `need_page`).
    fn prepare(&self, eng: &Engine, st: &mut Stream, need_page: bool) -> Prep {
        if let Some(r) = &st.rec {
            if r.entries_left > 0 && (!need_page || r.pages_left > 0) {
                return Prep::Ready;
            }
            return match self.seal_record(eng, st) {
                Some(s) => Prep::Write(s),
                None => Prep::Ready, // an empty record was dropped; loop again
            };
        }
        let Some(os) = st.seg.as_mut() else { return Prep::NeedSegment };
        let gps = eng.geo.grains_per_segment;
        let data_grains = gps.saturating_sub(os.next_grain + 1);
        let pages = (data_grains / self.page_grains).min(eng.geo.meta_interval_pages);
        if pages == 0 {
            let s = os.segment;
            st.seg = None;
            eng.seal_segment(s);
            return Prep::NeedSegment;
        }
        let record_id = eng.tracker.begin();
        if os.incarnation == 0 {
            os.incarnation = record_id;
        }
        let total_grains = 1 + pages * self.page_grains;
        let first_grain = os.segment as u64 * gps as u64 + os.next_grain as u64;
        let buf = Arc::new(RecordBuf {
            record_id,
            segment: os.segment,
            first_grain,
            span_grains: std::sync::atomic::AtomicU32::new(total_grains),
            // Every record buffer of a volume has the largest record's size, so recycled
            // buffers always fit (the tail records of segments would otherwise each want
            // their own size).
            bytes: RwLock::new(RecordBytes::new(
                eng.buffers
                    .get(((1 + eng.geo.meta_interval_pages * self.page_grains) * eng.geo.grain_bytes) as usize),
            )),
            recycle: eng.buffers.clone(),
        });
        eng.capacity.segment(os.segment).records.lock().push(buf.clone());
        st.rec = Some(OpenRecord {
            buf,
            meta: RecordMeta {
                pool_id: eng.pool_id,
                segment: os.segment,
                incarnation: os.incarnation,
                volume_id: self.id,
                stream: st.kind,
                opened_seq: os.opened_seq,
                record_id,
                synced_through: 0,
                start_grain: os.next_grain,
                page_grains: self.page_grains,
                entries: Vec::new(),
            },
            data_grains: 0,
            pages_left: pages,
            entries_left: eng.geo.meta_entries,
            gc_moves: false,
        });
        Prep::Ready
    }

    /// Under the stream lock: closes the open record. An empty one is dropped; otherwise its
    /// metadata page is encoded into its first grain and it is returned for writing.
    fn seal_record(&self, eng: &Engine, st: &mut Stream) -> Option<SealedRecord> {
        let mut rec = st.rec.take()?;
        let seg_info = eng.capacity.segment(rec.buf.segment);
        if rec.is_empty() {
            seg_info.records.lock().retain(|x| !Arc::ptr_eq(x, &rec.buf));
            eng.tracker.complete(rec.buf.record_id);
            return None;
        }
        let gb = eng.geo.grain_bytes as usize;
        rec.meta.synced_through = eng.tracker.synced_through();
        {
            let mut b = rec.buf.bytes.write();
            rec.meta.encode_into(&mut b.own[..gb]);
        }
        let used = rec.used_grains();
        rec.buf.span_grains.store(used, SeqCst);
        eng.tracker.mark_sealed(rec.buf.record_id);
        eng.counters.meta_bytes_written.fetch_add(gb as u64, SeqCst);
        let gps = eng.geo.grains_per_segment;
        let os = st.seg.as_mut().expect("open record without open segment");
        os.next_grain += used;
        assert!(os.next_grain <= gps, "record ran past the end of segment {}", os.segment);
        if os.next_grain + 2 + self.page_grains > gps {
            let s = os.segment;
            st.seg = None;
            eng.seal_segment(s);
        }
        Some(SealedRecord {
            buf: rec.buf,
            used_grains: used,
        })
    }

    /// Seals the open record of every stream whose record `which` picks, and with `close`
    /// closes every stream's segment too; returns the records to write.
    fn seal_streams(&self, eng: &Engine, which: impl Fn(&OpenRecord) -> bool, close: bool) -> Vec<SealedRecord> {
        let mut out = Vec::new();
        for s in self.streams.iter() {
            let mut st = lock_stream(s);
            if st.rec.as_ref().is_some_and(&which) {
                out.extend(self.seal_record(eng, &mut st));
            }
            if close {
                if let Some(os) = st.seg.take() {
                    eng.seal_segment(os.segment);
                }
            }
        }
        out
    }

    /// Runs `commit` with an open record that has room for one entry (and one data page when
    /// `page` is given, copied into the record's next slot first). `commit` gets the physical
    /// grain of the page (or the record's segment) and pushes the entry.
    fn place<R>(
        &self,
        eng: &Engine,
        kind: StreamKind,
        purpose: Purpose,
        page: Option<&[u8]>,
        commit: impl FnOnce(u64, &mut OpenRecord) -> R,
    ) -> Result<R> {
        let mut commit = Some(commit);
        let mut out = None;
        self.place_each(
            eng,
            kind,
            purpose,
            1,
            |_| page.map(PageData::copied),
            |_, at, rec| {
                if let Some(c) = commit.take() {
                    out = Some(c(at, rec));
                }
            },
        )?;
        // place_each returns Ok only after committing every item, here exactly one.
        Ok(out.expect("place_each committed the item"))
    }

    /// Places `count` items in one stream, in order, each like [`LsaVolume::place`]: item `i`
    /// is a data page `page(i)` or, for `None`, an entry only; `commit(i, at, record)` pushes
    /// its entry. A page whose payload is given is held there by the record rather than copied
    /// when the record can (see [`RecordBytes::hold`]). Consecutive items share one
    /// acquisition of the stream's lock for as long as the open record has room, so a
    /// many-page write does not contend for the lock per page. On an error the items before it
    /// stay committed.
    fn place_each<'d>(
        &self,
        eng: &Engine,
        kind: StreamKind,
        purpose: Purpose,
        count: usize,
        page: impl Fn(usize) -> Option<PageData<'d>>,
        mut commit: impl FnMut(usize, u64, &mut OpenRecord),
    ) -> Result<()> {
        let index = self.layout.index(kind);
        let (stream, ready) = (&self.streams[index], &self.stream_ready[index]);
        let mut next = 0;
        while next < count {
            let mut st = lock_stream(stream);
            match self.prepare(eng, &mut st, page(next).is_some()) {
                Prep::Ready => {
                    let Some(rec) = st.rec.as_mut() else { continue };
                    let mut full = false;
                    // One hold of the buffer for the whole run: releasing it after every page
                    // copy made each release wait for the copy's stores to drain.
                    let buf = rec.buf.clone();
                    let mut bytes = buf.bytes.write();
                    let mut held_bytes = 0u64;
                    while next < count && !full {
                        let at = match page(next) {
                            // A record is sealed when its last page slot is taken, so an open
                            // one always has a slot (and `OpenRecord::push` asserts it).
                            Some(PageData { bytes: data, held_in }) => {
                                let gb = eng.geo.grain_bytes as usize;
                                let slot = 1 + rec.data_grains as usize;
                                let kept = held_in.is_some_and(|(payload, at)| bytes.hold(slot as u32, self.page_grains, payload, at, gb));
                                if kept {
                                    held_bytes += data.len() as u64;
                                } else {
                                    bytes.own[slot * gb..slot * gb + data.len()].copy_from_slice(data);
                                }
                                rec.data_grains += self.page_grains;
                                let grain = rec.buf.first_grain + slot as u64;
                                eng.capacity.add_valid(rec.buf.segment, self.page_grains);
                                grain
                            }
                            None => rec.buf.segment as u64,
                        };
                        commit(next, at, rec);
                        rec.gc_moves |= purpose == Purpose::Gc;
                        next += 1;
                        full = rec.entries_left == 0 || rec.pages_left == 0;
                    }
                    drop(bytes);
                    if held_bytes > 0 {
                        eng.counters.user_bytes_held.fetch_add(held_bytes, SeqCst);
                    }
                    let sealed = if full { self.seal_record(eng, &mut st) } else { None };
                    if let Some(r) = sealed {
                        self.write_sealed(eng, purpose, st, r)?;
                    }
                }
                Prep::Write(r) => self.write_sealed(eng, purpose, st, r)?,
                Prep::NeedSegment => {
                    if st.allocating {
                        drop(ready.wait_timeout(st, std::time::Duration::from_millis(50)));
                        continue;
                    }
                    st.allocating = true;
                    drop(st);
                    let r = eng.allocate_segment(purpose);
                    let mut st = lock_stream(stream);
                    st.allocating = false;
                    ready.notify_all();
                    let s = r?;
                    if st.seg.is_none() {
                        let info = eng.capacity.segment(s);
                        info.owner_volume.store(self.id, SeqCst);
                        info.stream.store(st.kind.to_u8(), SeqCst);
                        let opened_seq = eng.now_seq();
                        info.opened_seq.store(opened_seq, SeqCst);
                        st.seg = Some(OpenSegment {
                            segment: s,
                            incarnation: 0,
                            opened_seq,
                            next_grain: 0,
                        });
                    } else {
                        drop(st);
                        eng.capacity.unallocate(s);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends a record sealed under `st` to the device. A user record goes to write-back and
    /// the writer returns (queued while the stream is still locked, so that the stream's
    /// records stay in order); the GC writes its own, which paces it and lets a release
    /// count on them.
    fn write_sealed(&self, eng: &Engine, purpose: Purpose, st: StdMutexGuard<'_, Stream>, r: SealedRecord) -> Result<()> {
        let own = if purpose == Purpose::User {
            eng.write_back.submit(r)
        } else {
            Some(r)
        };
        drop(st);
        match own {
            Some(r) => eng.write_record(r),
            None => Ok(()),
        }
    }

    /// Accounts for a map entry that record `killer` replaced.
    fn invalidate(&self, eng: &Engine, old: Entry, killer: u64) {
        match old {
            Entry::Unmapped => self.count_mapped(eng, true),
            Entry::Mapped(g) => {
                let s = (g / eng.geo.grains_per_segment as u64) as u32;
                eng.capacity.segment(s).last_kill_record.fetch_max(killer, SeqCst);
                if eng.capacity.sub_valid(s, self.page_grains) {
                    eng.segment_emptied(s);
                }
            }
            Entry::Trimmed(s) => {
                self.count_mapped(eng, true);
                eng.capacity.segment(s).last_kill_record.fetch_max(killer, SeqCst);
                if eng.capacity.sub_tombstone(s) {
                    eng.segment_emptied(s);
                }
            }
        }
    }

    fn count_mapped(&self, eng: &Engine, up: bool) {
        if up {
            self.mapped_pages.fetch_add(1, SeqCst);
            eng.mapped_grains.fetch_add(self.page_grains as u64, SeqCst);
        } else {
            self.mapped_pages.fetch_sub(1, SeqCst);
            eng.mapped_grains.fetch_sub(self.page_grains as u64, SeqCst);
        }
    }

    /// Asks the placement policy for a user write's stream.
    fn classify(&self, eng: &Engine, map: &PageMap, page: u64) -> StreamKind {
        let previous = match map.load(page) {
            Entry::Mapped(g) => Some(self.segment_view(eng, (g / eng.geo.grains_per_segment as u64) as u32)),
            _ => None,
        };
        self.placement.place_user(&UserWrite {
            page,
            now: eng.now_seq(),
            previous,
            mapped_pages: self.mapped_pages.load(SeqCst),
            volume_pages: map.pages(),
        })
    }

    // ----- I/O -----

    /// Refuses, before anything is written, a request that would map more new pages than the
    /// pool can hold; so an ENOSPC never leaves a request half applied.
    pub fn check_space(&self, eng: &Engine, map: &PageMap, pages: std::ops::Range<u64>) -> Result<()> {
        let new = pages.filter(|&p| !matches!(map.load(p), Entry::Mapped(_))).count() as u64 * self.page_grains as u64;
        let usable = eng.usable_grains();
        let mapped = eng.mapped_grains.load(SeqCst);
        if new > 0 && mapped + new > usable {
            return Err(Error::NoSpace(format!(
                "pool is full: {} of {} usable bytes hold data; trim or delete data, or add a device",
                mapped * eng.geo.grain_bytes as u64,
                usable * eng.geo.grain_bytes as u64
            )));
        }
        Ok(())
    }

    /// Writes whole pages from `first` on (`data` holds a whole number of pages). The caller
    /// checked space for the whole request ([`LsaVolume::check_space`]); concurrent requests may
    /// overshoot the limit by a few pages, which the usable-space margin absorbs.
    ///
    /// With `payload`, `data` is bytes `[at, ..)` of that payload, which the records may hold
    /// instead of copying the pages.
    pub fn write_pages(
        &self,
        eng: &Engine,
        map: &PageMap,
        first: u64,
        data: &[u8],
        payload: Option<(&Arc<WriteBuffer>, usize)>,
    ) -> Result<()> {
        let pb = self.page_bytes as usize;
        debug_assert_eq!(data.len() % pb, 0);
        let count = data.len() / pb;
        let _inflight = InvalidationGuard::new(eng);
        // Pages the placement sends to the same stream go down in runs of at most one record,
        // which take the stream's lock once rather than once per page.
        let kinds: Vec<StreamKind> = (0..count).map(|i| self.classify(eng, map, first + i as u64)).collect();
        let run_limit = eng.geo.meta_interval_pages as usize;
        let mut crcs = Vec::with_capacity(count.min(run_limit));
        let mut start = 0;
        while start < count {
            let cap = (start + run_limit).min(count);
            let end = (start + 1..cap).find(|&i| kinds[i] != kinds[start]).unwrap_or(cap);
            let page_data = |i: usize| &data[(start + i) * pb..(start + i + 1) * pb];
            // Checksums before taking the stream's lock: writers contend for it, so it guards
            // only the copy into the record and the map update.
            crcs.clear();
            crcs.extend((0..end - start).map(|i| crc32c::crc32c(page_data(i))));
            self.place_each(
                eng,
                kinds[start],
                Purpose::User,
                end - start,
                |i| {
                    Some(PageData {
                        bytes: page_data(i),
                        held_in: payload.map(|(p, at)| (p, at + (start + i) * pb)),
                    })
                },
                |i, grain, rec| {
                    let (page, crc) = (first + (start + i) as u64, crcs[i]);
                    eng.crc_table[grain as usize].store(crc, SeqCst);
                    let old = {
                        let _stripe = self.stripe(page).lock();
                        let seq = eng.next_seq();
                        rec.push(MetaEntry::Data { page, seq, crc });
                        map.swap(page, Entry::Mapped(grain))
                    };
                    // At once, not after the run: the GC cleaning the old version's segment
                    // waits for its count to reach zero, and the rest of the run may wait for
                    // the GC (a throttled allocation).
                    self.invalidate(eng, old, rec.buf.record_id);
                },
            )?;
            start = end;
        }
        Ok(())
    }

    /// Reads one whole page, verifying its checksum.
    pub fn read_page(&self, eng: &Engine, map: &PageMap, page: u64, out: &mut [u8]) -> Result<()> {
        let gb = eng.geo.grain_bytes as usize;
        let gps = eng.geo.grains_per_segment as u64;
        loop {
            let raw = map.load_raw(page);
            let Entry::Mapped(g) = map.encoding.decode(raw) else {
                out.fill(0);
                return Ok(());
            };
            let info = eng.capacity.segment((g / gps) as u32);
            let generation = info.generation.load(SeqCst);
            if map.load_raw(page) != raw {
                continue;
            }
            let crc = eng.crc_table[g as usize].load(SeqCst);
            let buffered = {
                let recs = info.records.lock();
                recs.iter().any(|r| r.read(g, gb, out))
            };
            if !buffered {
                if eng.array.needs_aligned_buffers() {
                    let mut tmp = eng.buffers.get(out.len());
                    let r = eng.array.read(g, &mut tmp);
                    out.copy_from_slice(&tmp);
                    eng.buffers.put(tmp);
                    r?;
                } else {
                    eng.array.read(g, out)?;
                }
            }
            if info.generation.load(SeqCst) != generation {
                continue; // the segment was reused under us; the map has moved on
            }
            if crc32c::crc32c(out) != crc {
                return Err(Error::ChecksumMismatch {
                    volume: self.name.clone(),
                    page,
                });
            }
            return Ok(());
        }
    }

    /// Trims whole pages `[first, first + count)`: they read as zeros, durably after a flush.
    pub fn trim_pages(&self, eng: &Engine, map: &PageMap, first: u64, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let _inflight = InvalidationGuard::new(eng);
        self.placement.trimmed(first, count);
        let olds = self.place(eng, self.placement.place_trim(), Purpose::User, None, |seg, rec| {
            let seg = seg as u32;
            // Lock every stripe the range touches, in order, so the trim's sequence number is
            // ordered with concurrent writes to the same pages.
            let n = (count as usize).min(STRIPES);
            let mut idx: Vec<usize> = (0..n).map(|i| ((first + i as u64) % STRIPES as u64) as usize).collect();
            idx.sort_unstable();
            let _guards: Vec<_> = idx.iter().map(|&i| self.stripes[i].lock()).collect();
            let seq = eng.next_seq();
            rec.push(MetaEntry::Trim { page: first, count, seq });
            let mut olds = Vec::new();
            for p in first..first + count {
                loop {
                    let cur = map.load(p);
                    if cur == Entry::Unmapped || cur == Entry::Trimmed(seg) {
                        break;
                    }
                    eng.capacity.add_tombstone(seg);
                    if map.compare_exchange(p, cur, Entry::Trimmed(seg)) {
                        olds.push(cur);
                        break;
                    }
                    eng.capacity.sub_tombstone(seg);
                }
            }
            (olds, rec.buf.record_id)
        })?;
        let (olds, killer) = olds;
        for old in olds {
            match old {
                Entry::Mapped(_) => {
                    self.count_mapped(eng, false);
                    self.invalidate(eng, old, killer);
                }
                Entry::Trimmed(s) => {
                    eng.capacity.segment(s).last_kill_record.fetch_max(killer, SeqCst);
                    if eng.capacity.sub_tombstone(s) {
                        eng.segment_emptied(s);
                    }
                }
                Entry::Unmapped => {}
            }
        }
        Ok(())
    }

    // ----- GC upcall -----

    /// Moves the live tombstones of `victim` (pages whose map entry is `Trimmed(victim)`) into
    /// the last GC stream, given the victim's trim entries `(page, count, seq)`. A page may be
    /// covered by several of them (trimmed, written elsewhere, trimmed again into the same
    /// segment) and the map does not say which one is current: the latest is, so each page's
    /// tombstone keeps the highest sequence number among them. (Carrying an older trim's number
    /// instead let a crash scan rank the dead copy written between the two trims above the
    /// tombstone and bring it back: crash seed 37762.) The trims are taken latest first, each
    /// for the part of its range no later one covers, so memory stays proportional to the
    /// number of trim entries, however many pages they cover.
    fn relocate_tombstones(&self, eng: &Engine, map: &PageMap, victim: u32, trims: &mut [(u64, u64, u64)]) -> Result<()> {
        for (pages, seq) in latest_trim_parts(trims, map.pages()) {
            self.relocate_trim_range(eng, map, victim, pages, seq)?;
        }
        Ok(())
    }

    /// Moves the tombstones of the pages in `pages` that are `Trimmed(victim)`, in runs of
    /// consecutive pages, each as one trim entry with sequence number `seq`.
    fn relocate_trim_range(&self, eng: &Engine, map: &PageMap, victim: u32, pages: std::ops::Range<u64>, seq: u64) -> Result<()> {
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
            self.place(eng, self.layout.last_gc(), Purpose::Gc, None, |seg, rec| {
                let seg = seg as u32;
                rec.push(MetaEntry::Trim {
                    page: run_start,
                    count: run,
                    seq,
                });
                for q in run_start..run_start + run {
                    eng.capacity.add_tombstone(seg);
                    if map.compare_exchange(q, Entry::Trimmed(victim), Entry::Trimmed(seg)) {
                        eng.capacity.sub_tombstone(victim);
                    } else {
                        eng.capacity.sub_tombstone(seg);
                    }
                }
            })?;
        }
        Ok(())
    }
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

    /// Streams this volume writes (user and GC), each with at most one open segment.
    fn stream_count(&self) -> u32 {
        self.layout.count()
    }

    fn stats(&self) -> ControllerStats {
        ControllerStats {
            name: self.name.clone(),
            size_bytes: self.size_bytes(),
            page_bytes: self.page_bytes,
            mapped_bytes: self.mapped_pages.load(SeqCst) * self.page_bytes as u64,
            map_memory_bytes: self.map_memory_bytes(),
            placement: self.placement_name.clone(),
            placement_memory_bytes: self.placement_memory_bytes(),
        }
    }

    /// Seals every stream's open record (for a flush); returns the records to write.
    fn seal_open_records(&self, eng: &Engine) -> Vec<SealedRecord> {
        self.seal_streams(eng, |_| true, false)
    }

    /// Seals every open record that a GC release needs durable: those holding GC moves, and
    /// those up to record `kill_through`, which made entries of the released victims dead.
    fn seal_records_for_release(&self, eng: &Engine, kill_through: u64) -> Vec<SealedRecord> {
        self.seal_streams(eng, |r| r.gc_moves || r.buf.record_id <= kill_through, false)
    }

    /// Closes every stream's segment (clean shutdown, volume deletion).
    fn close_streams(&self, eng: &Engine) -> Vec<SealedRecord> {
        self.seal_streams(eng, |_| true, true)
    }

    /// Moves every live page and live tombstone out of `victim` into the GC stream, keeping
    /// their sequence numbers. A page moves only if the map still points at the victim.
    fn relocate(&self, eng: &Engine, victim: u32) -> Result<()> {
        let map = self.map.read();
        let gps = eng.geo.grains_per_segment as u64;
        let base = victim as u64 * gps;
        let geo = eng.scan_geometry();
        let mut failure = None;
        let pb = self.page_bytes as usize;
        let victim_view = self.segment_view(eng, victim);
        self.placement.segment_reclaimed(&victim_view, eng.now_seq());
        let mut trims: Vec<(u64, u64, u64)> = Vec::new();
        walk_segment(&eng.array, &eng.buffers, &geo, victim, |_, meta, data| {
            if failure.is_some() || meta.page_grains != self.page_grains {
                return;
            }
            let mut slot = 0usize;
            for e in &meta.entries {
                match *e {
                    MetaEntry::Data { page, seq, crc } => {
                        let grain = base + meta.start_grain as u64 + 1 + (slot as u64) * self.page_grains as u64;
                        let bytes = &data[slot * pb..(slot + 1) * pb];
                        slot += 1;
                        if page >= map.pages() || map.load(page) != Entry::Mapped(grain) {
                            continue;
                        }
                        let to = self.placement.place_gc(&Relocation {
                            page,
                            now: eng.now_seq(),
                            victim: victim_view,
                            mapped_pages: self.mapped_pages.load(SeqCst),
                            volume_pages: map.pages(),
                        });
                        let r = self.place(eng, to, Purpose::Gc, Some(bytes), |new, rec| {
                            eng.crc_table[new as usize].store(crc, SeqCst);
                            rec.push(MetaEntry::Data { page, seq, crc });
                            (new, map.compare_exchange(page, Entry::Mapped(grain), Entry::Mapped(new)))
                        });
                        match r {
                            Ok((_, true)) => {
                                eng.capacity.sub_valid(victim, self.page_grains);
                                eng.counters.gc_bytes_relocated.fetch_add(pb as u64, SeqCst);
                            }
                            Ok((new, false)) => {
                                // Overwritten meanwhile: the copy is garbage at once.
                                let s = (new / gps) as u32;
                                if eng.capacity.sub_valid(s, self.page_grains) {
                                    eng.segment_emptied(s);
                                }
                            }
                            Err(err) => failure = Some(err),
                        }
                    }
                    MetaEntry::Trim { page, count, seq } => trims.push((page, count, seq)),
                }
            }
        })?;
        if failure.is_none() {
            failure = self.relocate_tombstones(eng, &map, victim, &mut trims).err();
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn clear(&self) {
        let map = self.map.read();
        for p in 0..map.pages() {
            map.store(p, Entry::Unmapped);
        }
    }

    fn begin_replay(&self) {
        let pages = self.map.read().pages() as usize;
        *self.replay.lock() = Some(Replay {
            best_seq: vec![0; pages],
            has_data: vec![false; pages],
        });
    }

    /// For each page the entry with the highest sequence number wins, data or trim; of equal
    /// numbers the later record (a GC move over its source) wins. Data pages of a record that
    /// was not durable count only when their crc matches.
    fn replay(&self, eng: &Engine, r: &ScannedRecord<'_>) {
        if r.meta.page_grains != self.page_grains {
            return;
        }
        let mut guard = self.replay.lock();
        let Some(rs) = guard.as_mut() else { return };
        let map = self.map.read();
        let gps = eng.geo.grains_per_segment as u64;
        let mut slot = 0usize;
        for e in &r.meta.entries {
            match *e {
                MetaEntry::Data { page, seq, crc } => {
                    let grain = r.segment as u64 * gps + r.meta.start_grain as u64 + 1 + slot as u64 * self.page_grains as u64;
                    let ok = r.trusted || r.intact.get(slot).copied().unwrap_or(false);
                    slot += 1;
                    if page < map.pages() {
                        rs.has_data[page as usize] = true;
                    }
                    if ok && page < map.pages() && seq >= rs.best_seq[page as usize] {
                        rs.best_seq[page as usize] = seq;
                        map.store(page, Entry::Mapped(grain));
                        eng.crc_table[grain as usize].store(crc, SeqCst);
                    }
                }
                MetaEntry::Trim { page, count, seq } => {
                    let end = page.saturating_add(count).min(map.pages());
                    for p in page..end {
                        if seq >= rs.best_seq[p as usize] {
                            rs.best_seq[p as usize] = seq;
                            map.store(p, Entry::Trimmed(r.segment));
                        }
                    }
                }
            }
        }
    }

    /// A winning trim of a page no data record mentions needs no tombstone (nothing could
    /// resurrect it), and keeping one would pin its segment.
    fn end_replay(&self) {
        let Some(rs) = self.replay.lock().take() else { return };
        let map = self.map.read();
        for (p, seen) in rs.has_data.iter().enumerate() {
            if !seen && matches!(map.load(p as u64), Entry::Trimmed(_)) {
                map.store(p as u64, Entry::Unmapped);
            }
        }
    }

    fn account(&self, eng: &Engine, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64> {
        let map = self.map.read();
        let gps = eng.geo.grains_per_segment as u64;
        let mut mapped = 0u64;
        for p in 0..map.pages() {
            match map.load(p) {
                Entry::Unmapped => {}
                Entry::Mapped(g) => {
                    visit(Reference::Data {
                        segment: (g / gps) as u32,
                        grains: self.page_grains,
                    })?;
                    mapped += 1;
                }
                Entry::Trimmed(segment) => visit(Reference::Tombstone { segment })?,
            }
        }
        self.mapped_pages.store(mapped, SeqCst);
        Ok(mapped * self.page_grains as u64)
    }

    fn image_bytes(&self) -> u64 {
        8 + 1 + self.map.read().memory_bytes()
    }

    fn encode_image(&self, out: &mut Vec<u8>) {
        let map = self.map.read();
        out.extend_from_slice(&map.pages().to_le_bytes());
        out.push(map.entry_bytes() as u8);
        map.encode_into(out);
    }

    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()> {
        let bad = |what: &str| Error::Corrupt(format!("checkpoint of volume {}: {what}", self.name));
        let pages = d.u64("pages").map_err(|_| bad("truncated"))?;
        let width = d.u8("width").map_err(|_| bad("truncated"))? as u64;
        let map = self.map.read();
        if pages != map.pages() || width != map.entry_bytes() {
            return Err(bad("map size differs from the volume table"));
        }
        let raw = d.take((pages * width) as usize, "map").map_err(|_| bad("truncated map"))?;
        let max = map.encoding.max_value();
        for (p, chunk) in raw.chunks_exact(width as usize).enumerate() {
            let mut v = [0u8; 8];
            v[..width as usize].copy_from_slice(chunk);
            let v = u64::from_le_bytes(v);
            if v > max {
                return Err(bad("map entry out of range"));
            }
            map.store(p as u64, map.encoding.decode(v));
        }
        Ok(())
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
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
