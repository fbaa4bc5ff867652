//! The AMF controller (application-managed flash): an append-only volume for applications
//! that already write logs (an LSM tree's tables, a log-structured file system). Its address
//! space is cut into segments of `segment_bytes`; each segment is written from its start in
//! order and never overwritten until the whole segment is trimmed, after which it is written
//! from its start again.
//!
//! Owns: the segment table (one write point per segment, in pages: 0 = empty, the segment's
//! pages = full, otherwise open) and the rules. The data path is the LSA controller's over an
//! extent map ([`super::extent_map`]): pages written in order land in the log in order, so the
//! map holds a run per record instead of an entry per page, and a trimmed segment's data goes
//! dead whole, so the GC finds its log segments empty (it moves only what shares a log segment
//! with a live neighbour). Its placement is fixed ([`SegmentStreams`]): a segment being
//! written owns one of its user streams (one by default, up to eight).
//!
//! Invariants: a write is accepted only if it is page-aligned and starts at its segment's write
//! point (continuing into the next segments only if they are empty); a trim only if it covers
//! whole segments; a refused request changes nothing. A segment's write point moves only under
//! its lock, forward by a write or back to 0 by a trim. After a crash or a checkpoint load the
//! write point is one past the last page the map holds in the segment (pages written but not
//! flushed may be gone; a lost page below the write point reads as zeros, as any unflushed
//! write may).

use super::lsa::LsaVolume;
use super::map::Entry;
use super::{Controller, ControllerStats, Reference, ScannedRecord, VolumeIo};
use crate::error::{Error, Result};
use crate::format::ControllerKind;
use crate::log::payload::WriteBuffer;
use crate::log::stream::Streams;
use crate::log::Log;
use crate::policy::placement::Placement;
use crate::util::Decoder;
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

/// The placement an AMF volume records and always uses ([`SegmentStreams`]).
pub const PLACEMENT: &str = "amf-segments";
/// Most user streams of [`SegmentStreams`].
pub const MAX_SEGMENT_STREAMS: u8 = 8;
/// Volume-table setting: the user streams (absent: 1).
pub const SETTING_STREAMS: u16 = 2;

/// Placement of an AMF volume over `streams` user streams (1 to 8, `--segment-streams`). A
/// segment being written owns a stream until it is full or trimmed; a segment that starts
/// takes the stream freed last, so that stream's open log segment goes on being written
/// without a pause. With several streams, up to that many segments written at once (a flush
/// and compactions of an LSM tree) never share log segments, so trimming one frees its log
/// segments whole (but for the two it shares, at its ends, with the segments before and after
/// it in its stream) and the GC moves nothing. The price is that the device sees that many log
/// segments written at once: a zoned drive keeps them apart, but a flash drive with its own
/// FTL mixes them in its erase blocks and pays in its own GC (bench-amf measures both), so one
/// stream is the default: segments written at once then share log segments, which the GC
/// cleans. With every stream taken, a segment shares stream `segment % streams`. One GC stream.
pub struct SegmentStreams {
    segment_pages: u64,
    streams: u8,
    table: Mutex<StreamTable>,
}

struct StreamTable {
    /// The segment each user stream is writing.
    owner: [Option<u64>; MAX_SEGMENT_STREAMS as usize],
    /// Streams without one, the one freed last on top.
    free: Vec<u8>,
}

impl SegmentStreams {
    pub fn new(segment_pages: u64, streams: u8) -> SegmentStreams {
        let streams = streams.clamp(1, MAX_SEGMENT_STREAMS);
        SegmentStreams {
            segment_pages: segment_pages.max(1),
            streams,
            table: Mutex::new(StreamTable {
                owner: [None; MAX_SEGMENT_STREAMS as usize],
                free: (0..streams).rev().collect(),
            }),
        }
    }

    /// `segment` is full or trimmed: its stream goes to the next segment that starts.
    pub fn release(&self, segment: u64) {
        let mut t = self.table.lock();
        if let Some(k) = t.owner.iter().position(|o| *o == Some(segment)) {
            t.owner[k] = None;
            t.free.push(k as u8);
        }
    }

    fn stream_of(&self, segment: u64) -> u8 {
        let mut t = self.table.lock();
        if let Some(k) = t.owner.iter().position(|o| *o == Some(segment)) {
            return k as u8;
        }
        match t.free.pop() {
            Some(k) => {
                t.owner[k as usize] = Some(segment);
                k
            }
            None => (segment % self.streams as u64) as u8,
        }
    }
}

impl Placement for Arc<SegmentStreams> {
    fn user_streams(&self) -> u8 {
        self.streams
    }
    fn gc_streams(&self) -> u8 {
        1
    }
    fn place_user(&self, w: &crate::policy::placement::UserWrite) -> crate::format::StreamKind {
        crate::format::StreamKind::User(self.stream_of(w.page / self.segment_pages))
    }
    fn place_gc(&self, _r: &crate::policy::placement::Relocation) -> crate::format::StreamKind {
        crate::format::StreamKind::Gc(0)
    }
    fn state_bytes(&self) -> u64 {
        std::mem::size_of::<StreamTable>() as u64 + MAX_SEGMENT_STREAMS as u64
    }
}

/// Volume-table setting: the segment size in bytes.
pub const SETTING_SEGMENT_BYTES: u16 = 1;
/// Smallest and largest segment.
pub const MIN_SEGMENT_BYTES: u64 = 64 << 10;
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// The segment size a new AMF volume gets when none is given: the pool's segment, so one
/// segment of the volume fills about one segment of the log (power of two, within bounds).
pub fn default_segment_bytes(pool_segment_bytes: u64) -> u64 {
    let p = if pool_segment_bytes.is_power_of_two() {
        pool_segment_bytes
    } else {
        pool_segment_bytes.next_power_of_two() / 2
    };
    p.clamp(MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES)
}

/// Checks a segment size for a volume of `size_bytes` with pages of `page_bytes`.
pub fn check_segment(segment_bytes: u64, page_bytes: u32, size_bytes: u64) -> std::result::Result<(), String> {
    if !segment_bytes.is_power_of_two() || !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&segment_bytes) {
        return Err(format!(
            "an AMF segment is a power of two from {} KiB to {} MiB, not {segment_bytes} bytes",
            MIN_SEGMENT_BYTES >> 10,
            MAX_SEGMENT_BYTES >> 20
        ));
    }
    if segment_bytes < page_bytes as u64 {
        return Err(format!(
            "an AMF segment ({segment_bytes} bytes) holds whole pages of {page_bytes} bytes"
        ));
    }
    if !size_bytes.is_multiple_of(segment_bytes) {
        return Err(format!(
            "an AMF volume is a whole number of segments: {size_bytes} bytes is not a multiple of {segment_bytes}"
        ));
    }
    Ok(())
}

/// A segment's write point, in pages.
type WritePoint = u32;
const _: () = assert!(MAX_SEGMENT_BYTES / 4096 <= WritePoint::MAX as u64);

/// An append-only volume.
pub struct AmfVolume {
    inner: LsaVolume,
    segment_bytes: u64,
    segment_pages: u64,
    /// Write point of every segment, in pages (a segment of at most 1 GiB holds fewer than
    /// 2^32; 8 bytes a segment with its lock, a sixteenth of the map's flat entries for a
    /// segment of the smallest).
    segments: RwLock<Vec<Mutex<WritePoint>>>,
    /// Its placement, told when a segment is full or trimmed.
    streams: Arc<SegmentStreams>,
}

impl AmfVolume {
    /// `inner` maps the pages (over an extent map).
    pub fn new(inner: LsaVolume, segment_bytes: u64, streams: Arc<SegmentStreams>) -> AmfVolume {
        let segment_pages = segment_bytes / inner.page_bytes as u64;
        let count = inner.size_bytes() / segment_bytes;
        AmfVolume {
            inner,
            segment_bytes,
            segment_pages,
            segments: RwLock::new((0..count).map(|_| Mutex::new(0)).collect()),
            streams,
        }
    }

    /// Sets every write point from the map: one past the last page mapped in the segment.
    fn derive_write_points(&self) {
        let segments = self.segments.read();
        let mut points = vec![0u64; segments.len()];
        let map = self.inner.map();
        map.for_each_mapped(|page, v| {
            if let Entry::Mapped(_) = map.encoding.decode(v) {
                let s = (page / self.segment_pages) as usize;
                if let Some(p) = points.get_mut(s) {
                    *p = (*p).max(page % self.segment_pages + 1);
                }
            }
        });
        for (slot, p) in segments.iter().zip(points) {
            *slot.lock() = p as WritePoint;
        }
    }

    /// The write point of `segment` from the map (after a failed write).
    fn write_point_from_map(&self, segment: u64) -> u64 {
        let map = self.inner.map();
        let first = segment * self.segment_pages;
        (0..self.segment_pages)
            .rev()
            .find(|&k| matches!(map.load(first + k), Entry::Mapped(_)))
            .map_or(0, |k| k + 1)
    }

    /// Segments written (open or full) and full.
    pub fn segment_counts(&self) -> (u64, u64) {
        let segments = self.segments.read();
        let mut used = 0;
        let mut full = 0;
        for s in segments.iter() {
            let wp = u64::from(*s.lock());
            used += u64::from(wp > 0);
            full += u64::from(wp == self.segment_pages);
        }
        (used, full)
    }

    fn refuse(&self, what: String) -> Error {
        Error::AppendOnly(format!("volume {:?}: {what}", self.inner.name))
    }
}

impl VolumeIo for AmfVolume {
    fn kind(&self) -> ControllerKind {
        ControllerKind::Amf
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn page_bytes(&self) -> u32 {
        self.inner.page_bytes
    }

    /// A whole segment: what an application should write at once, and the unit of trim.
    fn preferred_write_bytes(&self) -> u32 {
        self.segment_bytes.min(u32::MAX as u64) as u32
    }

    fn mapped_bytes(&self) -> u64 {
        VolumeIo::mapped_bytes(&self.inner)
    }

    fn read(&self, log: &Log, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(log, offset, buf)
    }

    fn segment_bytes(&self) -> Option<u64> {
        Some(self.segment_bytes)
    }

    fn write_point(&self, segment: u64) -> Result<u64> {
        let segments = self.segments.read();
        let slot = segments.get(segment as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "volume {:?} has {} segments, not {segment}",
                self.inner.name,
                segments.len()
            ))
        })?;
        let wp = u64::from(*slot.lock());
        Ok(wp * self.inner.page_bytes as u64)
    }

    /// Under the segment's lock, so appenders of one segment never collide.
    fn append(&self, log: &Log, segment: u64, data: &[u8]) -> Result<u64> {
        let pb = self.inner.page_bytes as u64;
        let len = data.len() as u64;
        if !len.is_multiple_of(pb) {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is append-only: appends are whole pages of {pb} bytes, not {len}",
                self.inner.name
            )));
        }
        let segments = self.segments.read();
        let slot = segments.get(segment as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "volume {:?} has {} segments, not {segment}",
                self.inner.name,
                segments.len()
            ))
        })?;
        let mut wp = slot.lock();
        let written = u64::from(*wp);
        if written * pb + len > self.segment_bytes {
            return Err(self.refuse(format!(
                "an append of {len} bytes does not fit segment {segment} ({} of {} bytes written)",
                written * pb,
                self.segment_bytes
            )));
        }
        let offset = segment * self.segment_bytes + written * pb;
        let r = self.inner.write(log, offset, data, None);
        *wp = match r {
            Ok(()) => written + len / pb,
            Err(_) => self.write_point_from_map(segment),
        } as WritePoint;
        if u64::from(*wp) == self.segment_pages {
            self.streams.release(segment);
        }
        r.map(|()| offset)
    }

    fn write(&self, log: &Log, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let pb = self.inner.page_bytes as u64;
        let len = data.len() as u64;
        if !offset.is_multiple_of(pb) || !len.is_multiple_of(pb) {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is append-only: writes are whole pages of {pb} bytes ({len} bytes at {offset} is not)",
                self.inner.name
            )));
        }
        let first = offset / self.segment_bytes;
        let last = (offset + len - 1) / self.segment_bytes;
        let segments = self.segments.read();
        // Locks in ascending order, so writers spanning segments never deadlock.
        let mut points: Vec<_> = (first..=last).map(|s| segments[s as usize].lock()).collect();
        let start = (offset % self.segment_bytes) / pb;
        let written = u64::from(*points[0]);
        if written != start {
            let why = if start < written { "would overwrite" } else { "would leave a hole" };
            return Err(self.refuse(format!(
                "segment {first} is written up to page {written} of {}; a write at page {start} {why} (trim the whole segment to rewrite it)",
                self.segment_pages
            )));
        }
        if let Some(k) = points[1..].iter().position(|p| **p != 0) {
            return Err(self.refuse(format!(
                "the write runs on into segment {}, which is not empty",
                first + 1 + k as u64
            )));
        }
        let r = self.inner.write(log, offset, data, payload);
        for (k, wp) in points.iter_mut().enumerate() {
            let s = first + k as u64;
            **wp = match r {
                Ok(()) => ((offset + len).min((s + 1) * self.segment_bytes) - s * self.segment_bytes) / pb,
                // Some pages may have made it: the map says how far.
                Err(_) => self.write_point_from_map(s),
            } as WritePoint;
            if u64::from(**wp) == self.segment_pages {
                self.streams.release(s);
            }
        }
        r
    }

    /// Trims whole segments only; each returns to empty.
    fn trim(&self, log: &Log, offset: u64, len: u64) -> Result<()> {
        if !offset.is_multiple_of(self.segment_bytes) || !len.is_multiple_of(self.segment_bytes) {
            return Err(Error::InvalidArgument(format!(
                "volume {:?} is append-only: it trims whole segments of {} bytes ({len} bytes at {offset} is not)",
                self.inner.name, self.segment_bytes
            )));
        }
        let segments = self.segments.read();
        for s in offset / self.segment_bytes..(offset + len) / self.segment_bytes {
            let mut wp = segments[s as usize].lock();
            if *wp == 0 {
                continue;
            }
            self.inner.trim(log, s * self.segment_bytes, self.segment_bytes)?;
            *wp = 0;
            self.streams.release(s);
        }
        Ok(())
    }

    fn page_location(&self, page: u64) -> Option<u64> {
        self.inner.page_location(page)
    }

    fn grow(&self, new_size_bytes: u64) -> Result<()> {
        check_segment(self.segment_bytes, self.inner.page_bytes, new_size_bytes).map_err(Error::InvalidArgument)?;
        let mut segments = self.segments.write();
        self.inner.grow(new_size_bytes);
        let count = new_size_bytes / self.segment_bytes;
        while (segments.len() as u64) < count {
            segments.push(Mutex::new(0));
        }
        Ok(())
    }

    fn retire(&self) {
        self.inner.retire()
    }

    fn is_retired(&self) -> bool {
        self.inner.is_retired()
    }

    fn mapped_grains(&self) -> u64 {
        self.inner.mapped_grains()
    }
}

impl Controller for AmfVolume {
    fn id(&self) -> u32 {
        self.inner.id
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn streams(&self) -> Arc<Streams> {
        self.inner.placement_streams()
    }

    fn set_placement(&self, _log: &Log, _placement: Box<dyn Placement>, _name: &str) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "volume {:?} is append-only: each of its segments has its own stream ({PLACEMENT}); it takes no placement policy",
            self.inner.name
        )))
    }

    fn stats(&self) -> ControllerStats {
        let inner = self.inner.stats();
        let (used, full) = self.segment_counts();
        let table = self.segments.read().len() as u64 * std::mem::size_of::<Mutex<WritePoint>>() as u64;
        ControllerStats {
            controller: ControllerKind::Amf.name().to_string(),
            map_memory_bytes: inner.map_memory_bytes + table,
            settings: vec![
                ("segment_bytes".into(), self.segment_bytes),
                ("segment_streams".into(), self.streams.streams as u64),
            ],
            amf_segments: self.segments.read().len() as u64,
            amf_segments_written: used,
            amf_segments_full: full,
            map_runs: self.inner.map().run_count().unwrap_or(0),
            ..inner
        }
    }

    fn relocate(&self, log: &Log, victim: u32) -> Result<()> {
        Controller::relocate(&self.inner, log, victim)
    }

    fn clear(&self) {
        self.inner.clear();
        for s in self.segments.read().iter() {
            *s.lock() = 0;
        }
    }

    fn begin_replay(&self) {
        self.inner.begin_replay();
    }

    fn replay(&self, log: &Log, record: &ScannedRecord<'_>) {
        self.inner.replay(log, record);
    }

    fn end_replay(&self, log: &Log) {
        self.inner.end_replay(log);
        self.derive_write_points();
    }

    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64> {
        self.inner.account(log, visit)
    }

    fn image_bytes(&self) -> u64 {
        self.inner.image_bytes()
    }

    fn encode_image(&self, out: &mut Vec<u8>) {
        self.inner.encode_image(out)
    }

    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()> {
        self.inner.load_image(d)?;
        self.derive_write_points();
        Ok(())
    }
}
