//! Reading a segment's record chain back from the device. Used by the GC (to find what a victim
//! holds, with the sequence numbers to carry over) and by crash recovery.
//!
//! A chain starts with the first record at grain 0, whose metadata page also names the
//! segment's incarnation, owner, stream and age; each record's metadata page says how many data
//! pages follow (and how many grains of padding after them), and the next record starts right
//! after them. The walk stops at the first page that is not a valid metadata page of this
//! segment's current incarnation: left-overs of an earlier use of the segment, or a torn write.
//! Such a page may also be damage on one member (a flipped bit in its checksummed bytes or
//! in its record magic): on a redundant array the walk first asks the redundancy for a copy
//! that continues the chain ([`repair_meta`]), so that damage does not cut off the records
//! after it. Only a page of zeros, where unwritten space begins, ends the chain unasked.
//!
//! A victim is read whole ([`walk_victim_whole`]) or, when its caller can tell live pages
//! from dead ones and few are live, in part ([`walk_victim_live`]): the chain of metadata
//! pages first, then the live runs. Either way every record of the chain is visited, in
//! order, and the visitor is told which data pages hold the bytes read ([`HeldPages`]).

use crate::array::{member_io, Array};
use crate::device::StorageType;
use crate::error::{Error, Result};
use crate::format::{MetaEntry, RecordMeta, SegmentHeader};

use crate::util::{AlignedBuf, BufferPool};

/// Most bytes read from a segment at once.
const WINDOW_BYTES_MAX: usize = 16 << 20;

/// A gap between two live runs of a victim up to this many bytes counts as read when the GC
/// decides whether to read a window of it whole ([`LIVE_READ_SHARE_MAX`]), and is read rather
/// than skipped on a disk or an SMR drive: a request costs about as much as reading 20 to 40
/// KiB on the disks measured (docs/BENCHMARKS.md, "GC reads of live pages only").
const LIVE_READ_GAP_BYTES: usize = 32 << 10;

/// The bytes of a gap between two live runs read rather than skipped, once a window of a
/// victim of `storage_type` is read in part. None on flash and NVM: the GC's reads there share
/// the device with the writes it cleans for, and what bounds the pool is the bytes the device
/// moves more than its requests; at the paper's working set on RAID-5, reading the gaps
/// through cost 0.25 bytes read per user byte against 0.09 and a fifth of the throughput
/// (docs/BENCHMARKS.md, "The GC's reads on flash without the gaps"). Whether to read a
/// window whole is decided as on a disk: at 70% of the volume, victims about a quarter live
/// read page by page were slower than read whole.
fn live_read_gap_bytes(storage_type: StorageType) -> usize {
    match storage_type {
        StorageType::Flash | StorageType::Nvm => 0,
        StorageType::Hdd | StorageType::SmrConventional | StorageType::SmrSequential => LIVE_READ_GAP_BYTES,
    }
}

/// A victim whose live runs (gaps under [`LIVE_READ_GAP_BYTES`] included) cover more than this
/// share of its records is read whole, in one request.
const LIVE_READ_SHARE_MAX: f64 = 0.5;

/// A victim with more than this share of its grains live is read whole at once, without its
/// metadata first: its live runs would cover more than [`LIVE_READ_SHARE_MAX`] of it (at a
/// third live and scattered, the gaps under [`LIVE_READ_GAP_BYTES`] alone make up most of the
/// rest).
const LIVE_READ_VALID_SHARE_MAX: f64 = 1.0 / 3.0;

/// Most requests of one victim in flight at once (each on a member I/O thread, or the
/// caller's): 1, 2, 4 and 16 were tried on the RAID-5 bench; from 2 on the throughput was
/// within the noise, and each more costs a thread hand-over.
const LIVE_READ_JOBS_MAX: usize = 4;

/// What a chain walk needs to know about the pool.
pub struct ScanGeometry {
    pub pool_id: u128,
    pub grain_bytes: usize,
    pub grains_per_segment: u32,
    /// A metadata page rebuilt from the array's redundancy is written back over the damaged
    /// copy (false when the pool is read-only).
    pub rewrite_repairs: bool,
}

/// Which data pages of a record [`walk_victim_live`] read: those its caller asked for, or all.
/// A page not held has unspecified bytes in the record's data.
pub struct HeldPages<'a>(Option<&'a [bool]>);

impl HeldPages<'_> {
    /// Every page of the record was read.
    pub const ALL: HeldPages<'static> = HeldPages(None);

    /// Whether data page `slot` (counting data entries only) holds its bytes.
    pub fn holds(&self, slot: usize) -> bool {
        self.0.is_none_or(|held| held.get(slot).copied().unwrap_or(false))
    }
}

/// The record whose metadata page is `page`, at grain `pos` of `segment` (of `gps` readable
/// grains), with its data grains and span, when it continues the chain: this pool's, this
/// incarnation's, where the chain says it starts, newer than the record before (`last_record`),
/// and ending inside the segment.
fn chained_record(
    page: &[u8],
    geo: &ScanGeometry,
    segment: u32,
    incarnation: u64,
    pos: usize,
    last_record: u64,
    gps: usize,
) -> Option<(RecordMeta, usize, usize)> {
    let meta = RecordMeta::decode(page).ok()?;
    if meta.pool_id != geo.pool_id
        || meta.segment != segment
        || meta.incarnation != incarnation
        || meta.start_grain as usize != pos
        || meta.record_id <= last_record
    {
        return None;
    }
    let span = meta.span_grains()?;
    let data_grains = meta.data_grains()?;
    if pos.checked_add(1 + data_grains)? > gps {
        return None;
    }
    Some((meta, data_grains, span))
}

/// A page at pool grain `grain` where the chain wants a metadata page and finds none it
/// `accept`s (a torn write, the chain's end, or damage on one member, its record magic
/// included): on a redundant array, the copy the redundancy holds that `accept`s is written
/// into `page` (and back over the damaged copy, see [`ScanGeometry::rewrite_repairs`]); true
/// when there was one. A page of zeros is not tried: it is where a never-written segment or
/// tail begins, the common end of a chain, and damage that zeroes a whole page is not what
/// one member's flipped bits look like.
fn repair_meta(array: &dyn Array, geo: &ScanGeometry, grain: u64, page: &mut [u8], accept: &dyn Fn(&[u8]) -> bool) -> bool {
    if page.iter().all(|b| *b == 0) {
        return false;
    }
    let mut copy = AlignedBuf::zeroed(page.len());
    match array.read_repair(grain, &mut copy, accept, geo.rewrite_repairs) {
        Ok(true) => {
            page.copy_from_slice(&copy);
            true
        }
        _ => false,
    }
}

/// Whether a record may start at grain `pos` of a segment of `gps` grains after one of pages
/// of `last_page_grains`: its stream sealed the segment once a metadata page and a page of
/// its largest size (at least the last record's) no longer fitted, so past that point lie
/// only an earlier use's bytes, not worth asking the redundancy about.
pub(crate) fn may_follow(pos: usize, last_page_grains: usize, gps: usize) -> bool {
    pos + 2 + last_page_grains <= gps
}

/// The header named by a segment's first metadata page, when it is this pool's and the page
/// is the segment's first.
fn first_header(page: &[u8], geo: &ScanGeometry, segment: u32) -> Option<SegmentHeader> {
    match RecordMeta::decode(page) {
        Ok(m) if m.pool_id == geo.pool_id && m.segment == segment && m.start_grain == 0 => Some(m.segment_header()),
        _ => None,
    }
}

/// Walks the chain of `segment`, calling `visit(header, meta, data)` for every intact record;
/// `data` holds the record's data pages back to back. Returns the header, or `None` when the
/// segment holds no valid header (never used, or not SALSA's). `sealed`: the caller knows the
/// segment holds records (a GC victim), so the walk reads it whole at once instead of
/// probing its first page alone.
pub fn walk_segment(
    array: &dyn Array,
    buffers: &BufferPool,
    geo: &ScanGeometry,
    segment: u32,
    sealed: bool,
    visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8]),
) -> Result<Option<SegmentHeader>> {
    walk_segment_counted(array, buffers, geo, segment, sealed, visit).map(|(header, _)| header)
}

/// [`walk_segment`] of a sealed GC victim, read whole; also returns the bytes it read.
pub fn walk_victim_whole(
    array: &dyn Array,
    buffers: &BufferPool,
    geo: &ScanGeometry,
    segment: u32,
    visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8]),
) -> Result<(Option<SegmentHeader>, u64)> {
    walk_segment_counted(array, buffers, geo, segment, true, visit)
}

/// [`walk_segment`], also returning the bytes it read.
fn walk_segment_counted(
    array: &dyn Array,
    buffers: &BufferPool,
    geo: &ScanGeometry,
    segment: u32,
    sealed: bool,
    mut visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8]),
) -> Result<(Option<SegmentHeader>, u64)> {
    let gb = geo.grain_bytes;
    let gps = geo.grains_per_segment as usize;
    let base = segment as u64 * gps as u64;
    // Only what was written can be read (a sequential zone fails reads past its write pointer).
    let readable = (array.readable_grains(segment) as usize).min(gps);
    if readable == 0 {
        return Ok((None, 0));
    }
    let gps = readable;
    let window_grains = (WINDOW_BYTES_MAX / gb).min(gps);
    let mut w = Window {
        // From the pool, like every buffer that goes back to it: a fresh window per walk would
        // fill the pool with windows and leave no room for the record buffers writes recycle.
        buf: buffers.get(window_grains * gb),
        start: 0,
        len: 0,
        grains: window_grains,
        bytes_read: 0,
    };
    // The first metadata page alone first, unless the caller knows the segment holds records
    // (a GC victim): most segments of a young pool were never written. The window then
    // holds what it read and the walk goes on from it.
    let first_read = if sealed { window_grains } else { 1 };
    array.read(base, &mut w.buf[..first_read * gb])?;
    w.bytes_read += (first_read * gb) as u64;
    let accept_first = |b: &[u8]| first_header(b, geo, segment).is_some();
    if first_header(&w.buf[..gb], geo, segment).is_none() {
        repair_meta(array, geo, base, &mut w.buf[..gb], &accept_first);
    }
    let Some(header) = first_header(&w.buf[..gb], geo, segment) else {
        buffers.put(w.buf);
        return Ok((None, w.bytes_read));
    };
    w.start = 0;
    w.len = first_read;
    let mut pos = 0usize;
    let mut last_record = 0u64;
    let mut last_page_grains = 0usize;
    while w.ensure(array, base, gps, gb, pos, 1)? {
        let off = (pos - w.start) * gb;
        let chained = |b: &[u8]| chained_record(b, geo, segment, header.incarnation, pos, last_record, gps);
        let mut found = chained(&w.buf[off..off + gb]);
        if found.is_none()
            && may_follow(pos, last_page_grains, gps)
            && repair_meta(array, geo, base + pos as u64, &mut w.buf[off..off + gb], &|b| chained(b).is_some())
        {
            found = chained(&w.buf[off..off + gb]);
        }
        let Some((meta, data_grains, span)) = found else {
            break;
        };
        if !w.ensure(array, base, gps, gb, pos, 1 + data_grains)? {
            break;
        }
        let off = (pos - w.start) * gb;
        visit(&header, &meta, &w.buf[off + gb..off + gb + data_grains * gb]);
        last_record = meta.record_id;
        last_page_grains = meta.page_grains as usize;
        pos += span;
    }
    buffers.put(w.buf);
    Ok((Some(header), w.bytes_read))
}

/// [`walk_segment`] of a sealed GC victim, returning the bytes it read, that reads only what
/// the caller needs when that is a small part of the victim: the metadata pages first (one
/// request per record, each naming where the next one starts), then the data pages for which
/// `live(meta, slot, entry)` holds, in runs read at once (a victim mostly emptied by
/// overwrites costs a few small reads instead of a whole segment). `visit(header, meta, data,
/// held)` then sees every record, `held` saying which of its pages were read. The records are
/// taken a read window ([`WINDOW_BYTES_MAX`]) at a time, so a segment of any size is walked in
/// bounded memory; a window whose live runs cover most of it is read whole, every page of its
/// records held. A victim whose `valid_grains` (the pool's count of its live grains) already
/// say that much is live is read whole at once, without its metadata first.
///
/// `live` must be conservative: a page it calls dead must stay dead until the visit, or the
/// visitor must read it itself (a page not held has unspecified bytes).
pub fn walk_victim_live(
    array: &dyn Array,
    buffers: &BufferPool,
    geo: &ScanGeometry,
    segment: u32,
    valid_grains: u32,
    mut live: impl FnMut(&RecordMeta, usize, &MetaEntry) -> bool,
    mut visit: impl FnMut(&SegmentHeader, &RecordMeta, &[u8], &HeldPages<'_>),
) -> Result<(Option<SegmentHeader>, u64)> {
    let gb = geo.grain_bytes;
    let gps = (array.readable_grains(segment) as usize).min(geo.grains_per_segment as usize);
    let window_grains = (WINDOW_BYTES_MAX / gb).min(gps);
    if gps < 2 || valid_grains as f64 > LIVE_READ_VALID_SHARE_MAX * gps as f64 {
        return walk_victim_whole(array, buffers, geo, segment, |h, m, d| visit(h, m, d, &HeldPages::ALL));
    }
    let base = segment as u64 * geo.grains_per_segment as u64;
    let mut page = buffers.get(gb);
    let chain = read_chain(array, &mut page, geo, segment, base, gps);
    buffers.put(page);
    let (header, records, mut bytes_read) = chain?;
    let Some(header) = header else {
        return Ok((None, bytes_read));
    };
    // A record larger than a window (none is written so: records are bounded far below it)
    // cannot be held at once; the whole walk handles it as it handles any chain.
    if records.iter().any(|r| r.extent_grains() > window_grains) {
        let (header, whole_bytes) = walk_victim_whole(array, buffers, geo, segment, |h, m, d| visit(h, m, d, &HeldPages::ALL))?;
        return Ok((header, bytes_read + whole_bytes));
    }
    let read_gap_grains = live_read_gap_bytes(array.storage_type(segment)) / gb;
    let mut window = buffers.get(window_grains * gb);
    let mut result = Ok(());
    let mut first = 0;
    while first < records.len() {
        // The records from `first` that fit in one window from where the first one starts.
        let start = records[first].pos;
        let end = records[first..]
            .iter()
            .take_while(|r| r.pos + r.extent_grains() - start <= window_grains)
            .count()
            + first;
        let records = &records[first..end];
        match walk_live_window(
            array,
            &mut window,
            base,
            gb,
            read_gap_grains,
            &header,
            records,
            &mut live,
            &mut visit,
        ) {
            Ok(read) => bytes_read += read,
            Err(e) => {
                result = Err(e);
                break;
            }
        }
        first = end;
    }
    buffers.put(window);
    result.map(|()| (Some(header), bytes_read))
}

/// A record of a victim's chain, as [`read_chain`] found it.
struct ChainRecord {
    /// Grain of the segment where its metadata page is.
    pos: usize,
    meta: RecordMeta,
    data_grains: usize,
}

impl ChainRecord {
    /// Grains from its metadata page to the end of its data.
    fn extent_grains(&self) -> usize {
        1 + self.data_grains
    }
}

/// The header and the records of the chain of `segment` (at pool grain `base`, `gps`
/// readable grains), its metadata pages read one at a time into `page`, each where the one
/// before says the next starts; and the bytes read.
fn read_chain(
    array: &dyn Array,
    page: &mut [u8],
    geo: &ScanGeometry,
    segment: u32,
    base: u64,
    gps: usize,
) -> Result<(Option<SegmentHeader>, Vec<ChainRecord>, u64)> {
    let gb = geo.grain_bytes as u64;
    let mut bytes_read = gb;
    array.read(base, page)?;
    if first_header(page, geo, segment).is_none() {
        repair_meta(array, geo, base, page, &|b| first_header(b, geo, segment).is_some());
    }
    let Some(header) = first_header(page, geo, segment) else {
        return Ok((None, Vec::new(), bytes_read));
    };
    let mut records = Vec::new();
    let (mut pos, mut last_record, mut last_page_grains) = (0usize, 0u64, 0usize);
    while pos < gps {
        if pos > 0 {
            bytes_read += gb;
            array.read(base + pos as u64, page)?;
        }
        let chained = |b: &[u8]| chained_record(b, geo, segment, header.incarnation, pos, last_record, gps);
        let mut found = chained(page);
        if found.is_none()
            && may_follow(pos, last_page_grains, gps)
            && repair_meta(array, geo, base + pos as u64, page, &|b| chained(b).is_some())
        {
            found = chained(page);
        }
        let Some((meta, data_grains, span)) = found else {
            break;
        };
        last_record = meta.record_id;
        last_page_grains = meta.page_grains as usize;
        records.push(ChainRecord { pos, meta, data_grains });
        pos += span;
    }
    Ok((Some(header), records, bytes_read))
}

/// Reads what `records` (consecutive, all within one window from the first one's metadata
/// page) need of their data into `window`, their live runs (gaps of up to `read_gap_grains`
/// read through) or all of them when the runs with gaps under [`LIVE_READ_GAP_BYTES`] would
/// cover most of it, and visits them; returns the bytes read.
#[allow(clippy::too_many_arguments)]
fn walk_live_window(
    array: &dyn Array,
    window: &mut [u8],
    base: u64,
    gb: usize,
    read_gap_grains: usize,
    header: &SegmentHeader,
    records: &[ChainRecord],
    live: &mut impl FnMut(&RecordMeta, usize, &MetaEntry) -> bool,
    visit: &mut impl FnMut(&SegmentHeader, &RecordMeta, &[u8], &HeldPages<'_>),
) -> Result<u64> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Ok(0);
    };
    let start = first.pos;
    let extent = last.pos + last.extent_grains() - start;
    // The live pages, as grains `[start, end)` from the window's start (ascending).
    let mut pages: Vec<(usize, usize)> = Vec::new();
    let mut held: Vec<Vec<bool>> = Vec::with_capacity(records.len());
    for r in records {
        let mut record_held = Vec::new();
        let layout = r.meta.data_layout();
        for (e, (offset, pg)) in r.meta.entries.iter().filter(|e| matches!(e, MetaEntry::Data { .. })).zip(layout) {
            let slot = record_held.len();
            let is_live = live(&r.meta, slot, e);
            record_held.push(is_live);
            if is_live {
                let at = r.pos - start + 1 + offset;
                pages.push((at, at + pg as usize));
            }
        }
        held.push(record_held);
    }
    let grains = |runs: &[(usize, usize)]| runs.iter().map(|(s, e)| e - s).sum::<usize>();
    let covered = grains(&runs_of(&pages, LIVE_READ_GAP_BYTES / gb));
    let whole = covered as f64 > LIVE_READ_SHARE_MAX * extent as f64;
    let bytes_read = if whole {
        // Most of it is needed: one request for the window's records.
        array.read(base + start as u64, &mut window[..extent * gb])?;
        extent * gb
    } else {
        let runs = runs_of(&pages, read_gap_grains);
        read_runs(array, &mut window[..extent * gb], base + start as u64, gb, &runs)?;
        grains(&runs) * gb
    };
    for (r, record_held) in records.iter().zip(&held) {
        let at = (r.pos - start + 1) * gb;
        let data = &window[at..at + r.data_grains * gb];
        let held = if whole { HeldPages::ALL } else { HeldPages(Some(record_held)) };
        visit(header, &r.meta, data, &held);
    }
    Ok(bytes_read as u64)
}

/// `pages` (grains `[start, end)`, ascending) as runs, each taking the next page in when the
/// gap before it is at most `gap_grains`.
fn runs_of(pages: &[(usize, usize)], gap_grains: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &(at, end) in pages {
        match runs.last_mut() {
            Some(run) if at <= run.1 + gap_grains => run.1 = end,
            _ => runs.push((at, end)),
        }
    }
    runs
}

/// Reads grain runs `[start, end)` of the segment at `base` into their places in `buf`, up to
/// [`LIVE_READ_JOBS_MAX`] requests at once.
fn read_runs(array: &dyn Array, buf: &mut [u8], base: u64, gb: usize, runs: &[(usize, usize)]) -> Result<()> {
    // Each run's part of the buffer, cut off in ascending order.
    let mut parts: Vec<(u64, &mut [u8])> = Vec::with_capacity(runs.len());
    let mut rest = buf;
    let mut at = 0usize;
    for &(start, end) in runs {
        let (_, tail) = rest.split_at_mut((start - at) * gb);
        let (part, tail) = tail.split_at_mut((end - start) * gb);
        parts.push((base + start as u64, part));
        rest = tail;
        at = end;
    }
    let jobs_count = parts.len().clamp(1, LIVE_READ_JOBS_MAX);
    let mut jobs: Vec<Vec<(u64, &mut [u8])>> = (0..jobs_count).map(|_| Vec::new()).collect();
    for (i, part) in parts.into_iter().enumerate() {
        jobs[i % jobs_count].push(part);
    }
    let results = member_io::run_all(
        jobs.into_iter()
            .map(|job| move || job.into_iter().try_for_each(|(grain, part)| array.read(grain, part)))
            .collect(),
    );
    results
        .into_iter()
        .try_for_each(|r| r.unwrap_or_else(|| Err(Error::Poisoned("a GC read panicked".into()))))
}

/// A sliding read window over one segment.
struct Window {
    buf: AlignedBuf,
    /// First grain (in the segment) held.
    start: usize,
    /// Grains held.
    len: usize,
    /// Capacity in grains.
    grains: usize,
    /// Bytes read so far.
    bytes_read: u64,
}

impl Window {
    /// Makes grains `[from, from + n)` of the segment available, re-reading from `from` when
    /// needed. False when the range leaves the segment or can never fit.
    fn ensure(&mut self, array: &dyn Array, base: u64, gps: usize, gb: usize, from: usize, n: usize) -> Result<bool> {
        if from + n > gps || n > self.grains {
            return Ok(false);
        }
        if from >= self.start && from + n <= self.start + self.len {
            return Ok(true);
        }
        let len = self.grains.min(gps - from);
        array.read(base + from as u64, &mut self.buf[..len * gb])?;
        self.bytes_read += (len * gb) as u64;
        self.start = from;
        self.len = len;
        Ok(true)
    }
}
