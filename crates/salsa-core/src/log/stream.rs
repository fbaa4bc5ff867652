//! Allocation streams: each holds one open segment and the record being filled in it. A volume
//! owns one [`Streams`] set (the user and GC streams its placement policy declares), so classes
//! of data, and volumes, never share a segment.
//!
//! Owns: opening segments (asking the [`super::SegmentSource`]), opening, sealing and writing
//! records, copying or holding data pages in them, and closing segments. A controller places
//! items with [`Streams::place_each`] and does its own map update in the `commit` callback,
//! under the stream's lock, with the record's slot known.
//!
//! Invariants: records of one stream are sealed, and handed to write-back, in order under its
//! lock (sequential zones need them in order); a record is sealed when its last page slot or
//! entry is taken, so an open record always has room; a segment is sealed when the next record
//! could not hold one page; every record begun is completed (written, or dropped when empty).

use super::capacity::Purpose;
use super::payload::WriteBuffer;
use super::record::{OpenRecord, RecordBuf, RecordBytes, SealedRecord};
use super::Log;
use crate::array::WriteParity;
use crate::device::StorageType;
use crate::error::Result;
use crate::format::{RecordMeta, StreamKind};
use crate::policy::placement::StreamLayout;
use parking_lot::RwLock;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Condvar as StdCondvar, Mutex as StdMutex, MutexGuard as StdMutexGuard, PoisonError};

/// Locks a stream. A panic while holding it is not a reason to stop every later writer (the
/// same as parking_lot, which does not poison), so a poisoned lock is taken as it is.
fn lock_stream(stream: &StdMutex<Stream>) -> StdMutexGuard<'_, Stream> {
    stream.lock().unwrap_or_else(PoisonError::into_inner)
}

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
    /// A GC stream's sealed records held back for a burst ([`Log::set_gc_burst_bytes`]), in
    /// order: in flight for the tracker but not marked sealed (a flush waits for sealed
    /// records only), in their segment's record list (reads find their pages).
    held: Vec<SealedRecord>,
    held_grains: u32,
}

/// A data page to place, and the payload that holds it (and where) when a record may keep it
/// there instead of copying it.
#[derive(Clone, Copy)]
pub struct PageData<'d> {
    pub bytes: &'d [u8],
    pub held_in: Option<(&'d Arc<WriteBuffer>, usize)>,
}

impl<'d> PageData<'d> {
    pub fn copied(bytes: &'d [u8]) -> PageData<'d> {
        PageData { bytes, held_in: None }
    }
}

enum Prep {
    Ready,
    Write(SealedRecord),
    NeedSegment,
}

/// The allocation streams of one volume.
pub struct Streams {
    volume_id: u32,
    /// Grains of the volume's (largest) data page: the size records are sized for, and what
    /// [`Streams::place_each`] places. A record holds pages of one size; a stream may hold
    /// records of smaller pages too ([`Streams::place_each_sized`]: the dual-mapping
    /// controller's small pages), each telling its size in its metadata.
    page_grains: u32,
    /// Pages placed may be smaller than `page_grains` (a compressed volume's): records carry
    /// each data page's size ([`RecordMeta::data_sizes`]).
    sized: bool,
    layout: StreamLayout,
    /// User streams first, then GC streams, as [`StreamLayout::kinds`].
    /// std's mutex, not parking_lot's: writers contend for a stream's lock, and parking_lot
    /// spins by yielding the CPU, which on few cores hands it to another contender.
    streams: Box<[StdMutex<Stream>]>,
    /// Signalled when a stream's pending segment allocation finishes.
    ready: Box<[StdCondvar]>,
    /// Storage types the streams' segments may be of, in preference order.
    types: &'static [StorageType],
}

impl Streams {
    /// The streams of volume `volume_id`, whose pages are `page_grains` grains, one per kind of
    /// `layout`.
    pub fn new(volume_id: u32, page_grains: u32, layout: StreamLayout) -> Streams {
        Streams {
            volume_id,
            page_grains,
            sized: false,
            layout,
            streams: layout
                .kinds()
                .map(|kind| {
                    StdMutex::new(Stream {
                        kind,
                        allocating: false,
                        seg: None,
                        rec: None,
                        held: Vec::new(),
                        held_grains: 0,
                    })
                })
                .collect(),
            ready: layout.kinds().map(|_| StdCondvar::new()).collect(),
            types: &super::ANY_TYPE,
        }
    }

    /// The same streams, writing only segments of `types` (in preference order).
    pub fn on_types(mut self, types: &'static [StorageType]) -> Streams {
        self.types = types;
        self
    }

    /// The same streams, placing pages of any size up to the volume's page, each record
    /// telling its pages' sizes.
    pub fn sized(mut self, sized: bool) -> Streams {
        self.sized = sized;
        self
    }

    /// Metadata slots a record of these streams holds.
    fn meta_entries(&self, log: &Log) -> u32 {
        if self.sized {
            log.geo.sized_meta_entries
        } else {
            log.geo.meta_entries
        }
    }

    /// The storage types the streams write, in preference order.
    pub fn types(&self) -> &'static [StorageType] {
        self.types
    }

    /// How many streams (each holds at most one open segment).
    pub fn count(&self) -> u32 {
        self.layout.count()
    }

    pub fn layout(&self) -> StreamLayout {
        self.layout
    }

    /// Under the stream lock: makes sure an open record of pages of `pg` grains can take
    /// `need_slots` more metadata slots (and a data page if `need_page`).
    fn prepare(&self, log: &Log, st: &mut Stream, need_page: bool, pg: u32, need_slots: u32) -> Prep {
        if let Some(r) = &st.rec {
            if r.meta.page_grains == pg && r.entries_left >= need_slots && (!need_page || r.pages_left > 0) {
                return Prep::Ready;
            }
            return match self.seal_record(log, st, None) {
                Some(s) => Prep::Write(s),
                None => Prep::Ready, // an empty record was dropped; loop again
            };
        }
        let Some(os) = st.seg.as_mut() else { return Prep::NeedSegment };
        let geo = log.geo;
        let gps = geo.grains_per_segment;
        let data_grains = gps.saturating_sub(os.next_grain + 1);
        let pages = (data_grains / pg).min(geo.meta_interval_pages);
        if pages == 0 {
            let s = os.segment;
            st.seg = None;
            log.seal_segment(s);
            return Prep::NeedSegment;
        }
        let record_id = log.tracker.begin();
        if os.incarnation == 0 {
            os.incarnation = record_id;
        }
        let total_grains = 1 + pages * pg;
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
                log.buffers
                    .get(((1 + geo.meta_interval_pages * self.page_grains) * geo.grain_bytes) as usize),
                log.parity_geometry
                    .as_ref()
                    .map(|g| WriteParity::new(g.clone(), os.next_grain as u64 * geo.grain_bytes as u64)),
            )),
            recycle: log.buffers.clone(),
        });
        let info = log.capacity.segment(os.segment);
        info.records.lock().push(buf.clone());
        {
            let synced = log.tracker.synced_through();
            let mut unsynced = info.unsynced_records.lock();
            unsynced.retain(|&(_, id)| id > synced);
            unsynced.push((os.next_grain, record_id));
        }
        st.rec = Some(OpenRecord {
            buf,
            meta: RecordMeta {
                pool_id: log.pool_id,
                segment: os.segment,
                incarnation: os.incarnation,
                volume_id: self.volume_id,
                stream: st.kind,
                opened_seq: os.opened_seq,
                record_id,
                synced_through: 0,
                start_grain: os.next_grain,
                page_grains: pg,
                pad_grains: 0,
                entries: Vec::new(),
                data_sizes: self.sized.then(Vec::new),
            },
            data_grains: 0,
            pages_left: pages,
            entries_left: self.meta_entries(log),
            gc_moves: false,
        });
        Prep::Ready
    }

    /// Under the stream lock: closes the open record. An empty one is dropped; otherwise its
    /// metadata page is encoded into its first grain and it is returned for writing. A record
    /// sealed to be made durable (`flush_align`: the array's flush alignment, or its row at a
    /// clean shutdown) is padded with zeros up to a multiple of it, so that a parity array
    /// without a parity buffer never holds a partial stripe at a flush; a record after which
    /// the segment closes is padded to the segment's end when the array has rows.
    fn seal_record(&self, log: &Log, st: &mut Stream, flush_align: Option<u32>) -> Option<SealedRecord> {
        let for_flush = flush_align.is_some();
        let align = flush_align.unwrap_or(1);
        let mut rec = st.rec.take()?;
        let seg_info = log.capacity.segment(rec.buf.segment);
        // An empty record sealed for a flush mid-row still goes out, as padding to the row's
        // end, so that no partial row is durable without its parity.
        let pad_only = for_flush && align > 1 && !rec.meta.start_grain.is_multiple_of(align);
        if rec.is_empty() && !pad_only {
            seg_info.records.lock().retain(|x| !Arc::ptr_eq(x, &rec.buf));
            log.tracker.complete(rec.buf.record_id);
            return None;
        }
        let gb = log.geo.grain_bytes as usize;
        rec.meta.synced_through = log.tracker.synced_through();
        let used = rec.used_grains();
        let gps = log.geo.grains_per_segment;
        let end = rec.meta.start_grain + used;
        // The segment closes after this record when the next could not hold a page (as
        // below); with rows to complete, the padding then runs to the segment's end.
        let closes = end + 2 + self.page_grains > gps;
        rec.meta.pad_grains = match (log.row_grains > 1, closes, for_flush) {
            (true, true, _) => gps - end,
            (_, false, true) => (align - end % align) % align,
            _ => 0,
        };
        {
            let mut b = rec.buf.bytes.write();
            rec.meta.encode_into(&mut b.own[..gb]);
            b.add_parity(0, 1, gb, rec.meta.start_grain as u64 * gb as u64);
        }
        rec.buf.span_grains.store(used, SeqCst);
        // A GC record sealed because it is full waits for its burst (`write_sealed`); it is
        // marked sealed when it leaves (`Streams::take_held`).
        let for_burst = !for_flush && holds_for_burst(log, st.kind);
        if !for_burst {
            log.tracker.mark_sealed(rec.buf.record_id);
        }
        log.counters.meta_bytes_written.fetch_add(gb as u64, SeqCst);
        let pad = rec.meta.pad_grains;
        log.counters.pad_bytes_written.fetch_add(pad as u64 * gb as u64, SeqCst);
        let os = st.seg.as_mut().expect("open record without open segment");
        os.next_grain += used + pad;
        assert!(os.next_grain <= gps, "record ran past the end of segment {}", os.segment);
        if os.next_grain + 2 + self.page_grains > gps {
            let s = os.segment;
            st.seg = None;
            log.seal_segment(s);
        }
        Some(SealedRecord {
            buf: rec.buf,
            used_grains: used,
            pad_grains: pad,
            user: matches!(st.kind, StreamKind::User(_)),
            for_burst,
        })
    }

    /// Seals the open record of every stream whose record `which` picks; returns the records
    /// to write.
    pub fn seal_matching(&self, log: &Log, which: impl Fn(&OpenRecord) -> bool) -> Vec<SealedRecord> {
        self.seal_streams(log, which, false)
    }

    /// Takes every record the streams hold back for a GC burst, marked sealed, in order; the
    /// caller writes them (before anything these streams seal after).
    pub fn take_held(&self, log: &Log) -> Vec<SealedRecord> {
        let mut out = Vec::new();
        for s in self.streams.iter() {
            let mut st = lock_stream(s);
            out.extend(take_held_locked(log, &mut st));
        }
        out
    }

    /// Seals every record and closes every open segment (clean shutdown, deletion); returns
    /// the records to write.
    pub fn close(&self, log: &Log) -> Vec<SealedRecord> {
        self.seal_streams(log, |_| true, true)
    }

    fn seal_streams(&self, log: &Log, which: impl Fn(&OpenRecord) -> bool, close: bool) -> Vec<SealedRecord> {
        let mut out = Vec::new();
        // A flush ends on the flush alignment; a clean shutdown completes every row.
        let align = if close { log.row_grains } else { log.flush_alignment() };
        for s in self.streams.iter() {
            let mut st = lock_stream(s);
            // Between records, mid-row: open one to carry the padding (see `seal_record`).
            let mid_row = st.seg.as_ref().is_some_and(|os| align > 1 && !os.next_grain.is_multiple_of(align));
            // Records held for a GC burst come before anything sealed now in the segment.
            if close || mid_row || st.rec.as_ref().is_some_and(&which) {
                out.extend(take_held_locked(log, &mut st));
            }
            if st.rec.is_none() && mid_row {
                if let Prep::Write(mut r) = self.prepare(log, &mut st, false, self.page_grains, 1) {
                    // Sealed full, possibly for a burst: it is written now, not held.
                    if r.for_burst {
                        r.for_burst = false;
                        log.tracker.mark_sealed(r.buf.record_id);
                    }
                    out.push(r);
                }
            }
            if st.rec.as_ref().is_some_and(&which) {
                out.extend(self.seal_record(log, &mut st, Some(align)));
            }
            if close {
                if let Some(os) = st.seg.take() {
                    log.seal_segment(os.segment);
                }
            }
        }
        out
    }

    /// Runs `commit` with an open record of stream `kind` that has room for one entry (and one
    /// data page when `page` is given, copied into the record's next slot first). `commit` gets
    /// the physical grain of the page (or the record's segment) and pushes the entry.
    pub fn place<R>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        page: Option<&[u8]>,
        commit: impl FnOnce(u64, &mut OpenRecord) -> R,
    ) -> Result<R> {
        self.place_sized(log, kind, purpose, self.page_grains, page, commit)
    }

    /// [`Streams::place`] of a page of `page_grains` grains.
    pub fn place_sized<R>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        page_grains: u32,
        page: Option<&[u8]>,
        commit: impl FnOnce(u64, &mut OpenRecord) -> R,
    ) -> Result<R> {
        self.place_one(log, kind, purpose, page_grains, 1, page, commit)
    }

    /// One item of `slots` metadata slots: [`Streams::place_sized`] and [`Streams::place_group`].
    #[allow(clippy::too_many_arguments)]
    fn place_one<R>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        pg: u32,
        slots: u32,
        page: Option<&[u8]>,
        commit: impl FnOnce(u64, &mut OpenRecord) -> R,
    ) -> Result<R> {
        let mut commit = Some(commit);
        let mut out = None;
        self.place_items(
            log,
            kind,
            purpose,
            pg,
            slots,
            1,
            |_| page.map(PageData::copied),
            |_, at, rec| {
                if let Some(c) = commit.take() {
                    out = Some(c(at, rec));
                }
            },
        )?;
        // place_items returns Ok only after committing every item, here exactly one.
        Ok(out.expect("place_items committed the item"))
    }

    /// Places `count` items in stream `kind` (a policy's answer, clamped to the declared
    /// streams), in order, each like [`Streams::place`]: item `i` is a data page `page(i)` or,
    /// for `None`, an entry only; `commit(i, at, record)` pushes its entry. A page whose
    /// payload is given is held there by the record rather than copied when the record can
    /// (see [`RecordBytes::hold`]). Consecutive items share one acquisition of the stream's
    /// lock for as long as the open record has room, so a many-page write does not contend for
    /// the lock per page. On an error the items before it stay committed.
    pub fn place_each<'d>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        count: usize,
        page: impl Fn(usize) -> Option<PageData<'d>>,
        commit: impl FnMut(usize, u64, &mut OpenRecord),
    ) -> Result<()> {
        self.place_each_sized(log, kind, purpose, self.page_grains, count, page, commit)
    }

    /// [`Streams::place_each`] of pages of `pg` grains (at most the volume's page): they go
    /// into records of their own size, in the same stream, so a volume with two page sizes
    /// writes each stream's segment in one sequence.
    #[allow(clippy::too_many_arguments)]
    pub fn place_each_sized<'d>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        pg: u32,
        count: usize,
        page: impl Fn(usize) -> Option<PageData<'d>>,
        commit: impl FnMut(usize, u64, &mut OpenRecord),
    ) -> Result<()> {
        self.place_items(log, kind, purpose, pg, 1, count, page, commit)
    }

    /// The stream a write of `kind` goes to: `kind`'s own, except for a GC write when `kind`'s
    /// stream holds no open segment and free segments are short (no more than this volume's
    /// GC streams): it then goes to a GC stream of the volume that holds one. Why: after a
    /// restart no stream holds a segment, and a victim whose pages a policy spreads over
    /// several classes needed a free segment per class, more than a pool that crashed near
    /// its GC reserve had left (the dual-mapping crash sweep, seed 11346). Classes mix for as
    /// long as space is that short, which costs placement quality only.
    fn index_for(&self, log: &Log, kind: StreamKind, purpose: Purpose) -> usize {
        let index = self.layout.index(kind);
        if purpose != Purpose::Gc || log.capacity.free_segments() > u32::from(self.layout.gcs) {
            return index;
        }
        let has_segment = |i: usize| lock_stream(&self.streams[i]).seg.is_some();
        if has_segment(index) {
            return index;
        }
        (self.layout.users as usize..self.streams.len())
            .find(|&i| has_segment(i))
            .unwrap_or(index)
    }

    /// Runs `commit` once with an open record of stream `kind` that has room for `slots`
    /// metadata slots (and one data page when `page` is given, copied into the record's next
    /// slot first), so that entries which must be atomic (a share batch, a shared page's
    /// owners) land in one record. `slots` is at most a metadata page's.
    pub fn place_group<R>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        slots: u32,
        page: Option<&[u8]>,
        commit: impl FnOnce(u64, &mut OpenRecord) -> R,
    ) -> Result<R> {
        assert!(
            slots >= 1 && slots <= self.meta_entries(log),
            "{slots} slots in one record; a metadata page has {}",
            self.meta_entries(log)
        );
        self.place_one(log, kind, purpose, self.page_grains, slots, page, commit)
    }

    /// [`Streams::place_each_sized`] of items that each need `slots` metadata slots.
    #[allow(clippy::too_many_arguments)]
    fn place_items<'d>(
        &self,
        log: &Log,
        kind: StreamKind,
        purpose: Purpose,
        pg: u32,
        slots: u32,
        count: usize,
        page: impl Fn(usize) -> Option<PageData<'d>>,
        mut commit: impl FnMut(usize, u64, &mut OpenRecord),
    ) -> Result<()> {
        assert!(
            pg >= 1 && pg <= self.page_grains,
            "pages of {pg} grains in streams of {}",
            self.page_grains
        );
        let index = self.index_for(log, kind, purpose);
        let stream = &self.streams[index];
        let gb = log.geo.grain_bytes as usize;
        let mut next = 0;
        while next < count {
            let mut st = lock_stream(stream);
            match self.prepare(log, &mut st, page(next).is_some(), pg, slots) {
                Prep::Ready => {
                    let Some(rec) = st.rec.as_mut() else { continue };
                    let mut full = false;
                    // One hold of the buffer for the whole run: releasing it after every page
                    // copy made each release wait for the copy's stores to drain.
                    let buf = rec.buf.clone();
                    let mut bytes = buf.bytes.write();
                    let mut held_bytes = 0u64;
                    while next < count && !full && rec.entries_left >= slots {
                        let at = match page(next) {
                            // A record is sealed when its last page slot is taken, so an open
                            // one always has a slot (and `OpenRecord::push` asserts it).
                            Some(PageData { bytes: data, held_in }) => {
                                // A sized record's page may be smaller than the record's
                                // pages (a compressed page); every other is a whole page.
                                let grains = (data.len() / gb) as u32;
                                assert!(
                                    data.len() % gb == 0 && grains >= 1 && grains <= pg && (grains == pg || rec.meta.data_sizes.is_some()),
                                    "a data page of {} bytes in a record of {pg}-grain pages",
                                    data.len()
                                );
                                let slot = 1 + rec.data_grains as usize;
                                let kept = held_in.is_some_and(|(payload, at)| bytes.hold(slot as u32, grains, payload, at, gb));
                                let record_start = rec.meta.start_grain as u64 * gb as u64;
                                if kept {
                                    held_bytes += data.len() as u64;
                                    bytes.add_parity(slot as u32, grains, gb, record_start);
                                } else {
                                    bytes.own[slot * gb..slot * gb + data.len()].copy_from_slice(data);
                                    bytes.add_parity_copied(slot as u32, grains, gb, record_start, data);
                                }
                                if let Some(sizes) = rec.meta.data_sizes.as_mut() {
                                    sizes.push(grains as u8);
                                }
                                rec.data_grains += grains;
                                let grain = rec.buf.first_grain + slot as u64;
                                log.capacity.add_valid(rec.buf.segment, grains);
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
                        log.counters.user_bytes_held.fetch_add(held_bytes, SeqCst);
                    }
                    let sealed = if full { self.seal_record(log, &mut st, None) } else { None };
                    if let Some(r) = sealed {
                        write_sealed(log, purpose, st, r)?;
                    }
                }
                Prep::Write(r) => write_sealed(log, purpose, st, r)?,
                Prep::NeedSegment => self.open_segment(log, index, st, purpose)?,
            }
        }
        Ok(())
    }

    /// Opens a new segment for stream `index`, whose lock `st` is held and which has none
    /// (or whose segment is full). One writer allocates while the others wait for it (briefly,
    /// then look again); the allocation runs without the lock.
    fn open_segment(&self, log: &Log, index: usize, mut st: StdMutexGuard<'_, Stream>, purpose: Purpose) -> Result<()> {
        let (stream, ready) = (&self.streams[index], &self.ready[index]);
        if st.allocating {
            drop(ready.wait_timeout(st, std::time::Duration::from_millis(50)));
            return Ok(());
        }
        st.allocating = true;
        drop(st);
        let r = log.allocate_segment(purpose, self.types);
        let mut st = lock_stream(stream);
        st.allocating = false;
        // The segment, unless another writer opened one meanwhile: then it goes back.
        let unused = r.map(|s| {
            if st.seg.is_some() {
                return Some(s);
            }
            let info = log.capacity.segment(s);
            info.owner_volume.store(self.volume_id, SeqCst);
            info.stream.store(st.kind.to_u8(), SeqCst);
            let opened_seq = log.now_seq();
            info.opened_seq.store(opened_seq, SeqCst);
            st.seg = Some(OpenSegment {
                segment: s,
                incarnation: 0,
                opened_seq,
                next_grain: 0,
            });
            None
        });
        drop(st);
        // Woken once the lock is let go: a writer woken under it may take this
        // one's CPU while every other writer of the stream waits for the lock.
        ready.notify_all();
        if let Some(s) = unused? {
            log.capacity.unallocate(s);
        }
        Ok(())
    }
}

/// Whether a record of stream `kind` sealed when full is held back for a GC burst.
fn holds_for_burst(log: &Log, kind: StreamKind) -> bool {
    matches!(kind, StreamKind::Gc(_)) && log.gc_burst_grains() > 0
}

/// Under the stream's lock: its held GC records, marked sealed, in order.
fn take_held_locked(log: &Log, st: &mut Stream) -> Vec<SealedRecord> {
    st.held_grains = 0;
    let held = std::mem::take(&mut st.held);
    held.into_iter()
        .map(|mut r| {
            r.for_burst = false;
            log.tracker.mark_sealed(r.buf.record_id);
            r
        })
        .collect()
}

/// Sends a record sealed under `st` to the device. A user record goes to write-back and the
/// writer returns (queued while the stream is still locked, so that the stream's records stay
/// in order); the GC writes its own, which paces it and lets a release count on them.
fn write_sealed(log: &Log, purpose: Purpose, mut st: StdMutexGuard<'_, Stream>, r: SealedRecord) -> Result<()> {
    if r.for_burst {
        // Held for a GC burst (see `seal_record`): written with the others once the burst or
        // the segment is full.
        let segment = r.buf.segment;
        st.held_grains += r.used_grains + r.pad_grains;
        st.held.push(r);
        let segment_closed = st.seg.as_ref().is_none_or(|os| os.segment != segment);
        if !segment_closed && st.held_grains < log.gc_burst_grains() {
            return Ok(());
        }
        let burst = take_held_locked(log, &mut st);
        drop(st);
        return log.write_gc_burst(burst);
    }
    let own = if matches!(purpose, Purpose::User | Purpose::Trim) {
        log.write_back.submit(r)
    } else {
        Some(r)
    };
    drop(st);
    match own {
        Some(r) => log.write_record(r),
        None => {
            log.write_back.wake_and_wait_for_room();
            Ok(())
        }
    }
}
