//! Models of shingled disks: the timing of a single-actuator disk ([`DiskTimer`]), a
//! drive-managed SMR disk with a persistent media cache ([`DriveManagedSmr`]), and a timing
//! decorator ([`TimedDisk`]) that gives any device (a host-managed zoned emulation, typically)
//! the same disk timing.
//!
//! Owns: head position and the model clock; for the drive-managed model, the media cache's
//! contents by band and the cleaning that empties it.
//!
//! The drive-managed model follows what Skylight and the FSTL paper measured on such drives:
//! - a write that starts at a band's start, or continues the band's last in-place write
//!   exactly, goes to its home location (the drive detects sequential streams);
//! - any other write is appended to the persistent media cache;
//! - when the cache is full, bands are cleaned in the order they first entered the cache, each
//!   by a read-modify-write of the whole band (read the band, merge, rewrite it), which frees
//!   every cache byte that belonged to the band.
//!
//! Time: an access costs a positioning time unless it starts where the previous one ended,
//! plus its transfer at the media rate. The data is kept by logical address on a backing
//! device, so SALSA runs on the model for real.
//!
//! Real time ([`DriveManagedSmr::set_real_time`], [`TimedDisk::set_real_time`]): the actuator
//! also serves requests on the wall clock, one at a time in the order they arrive (no
//! reordering of the queue, no volatile write cache: a write returns when it is on the media),
//! and each request returns when its accesses end, a band cleaning it set off included, so that
//! an application sees the disk's latencies and queueing. Off by default, as for the SSD model.

use crate::device::{modelled_io, Device, StorageType};
use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Timing of one actuator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskTiming {
    /// Average seek plus rotational delay.
    pub position_us: u64,
    pub media_mb_per_s: f64,
}

impl Default for DiskTiming {
    fn default() -> Self {
        DiskTiming {
            position_us: 12_000,
            media_mb_per_s: 150.0,
        }
    }
}

/// Head position and model clock of one actuator.
#[derive(Debug, Default)]
pub struct DiskTimer {
    timing: DiskTiming,
    head: u64,
    busy_ns: u64,
    seeks: u64,
    real_time: Option<DiskRealTime>,
}

/// The wall clock of an actuator that keeps real time.
#[derive(Debug, Clone, Copy)]
struct DiskRealTime {
    base: Instant,
    /// When the actuator finishes what has been scheduled on it, in nanoseconds since `base`.
    free_ns: u64,
}

impl DiskTimer {
    pub fn new(timing: DiskTiming) -> DiskTimer {
        DiskTimer {
            timing,
            head: u64::MAX,
            busy_ns: 0,
            seeks: 0,
            real_time: None,
        }
    }

    /// Keeps real time from now on (the actuator starts idle), or stops.
    pub fn set_real_time(&mut self, on: bool) {
        self.real_time = on.then(|| DiskRealTime {
            base: Instant::now(),
            free_ns: 0,
        });
    }

    /// Runs one host request's model work (`work`, which makes its accesses on `timer(state)`)
    /// and, in real time, returns when the request completes: it starts when it was `issued`
    /// or when the actuator has served the requests before it, whichever is later, and lasts
    /// as long as its accesses.
    fn request<S>(state: &mut S, timer: fn(&mut S) -> &mut DiskTimer, issued: Instant, work: impl FnOnce(&mut S)) -> Option<Instant> {
        let busy_before_ns = timer(state).busy_ns;
        work(state);
        let t = timer(state);
        let cost_ns = t.busy_ns - busy_before_ns;
        let rt = t.real_time.as_mut()?;
        let issued_ns = u64::try_from(issued.saturating_duration_since(rt.base).as_nanos()).unwrap_or(u64::MAX);
        rt.free_ns = rt.free_ns.max(issued_ns).saturating_add(cost_ns);
        Some(rt.base.checked_add(Duration::from_nanos(rt.free_ns)).unwrap_or(rt.base))
    }

    /// Accounts for an access of `len` bytes at `position` (a physical byte position).
    pub fn access(&mut self, position: u64, len: u64) {
        // Saturating: the timing comes from a user's device spec.
        if position != self.head {
            self.busy_ns = self.busy_ns.saturating_add(self.timing.position_us.saturating_mul(1000));
            self.seeks += 1;
        }
        self.busy_ns = self
            .busy_ns
            .saturating_add((len as f64 / (self.timing.media_mb_per_s * 1e6) * 1e9) as u64);
        self.head = position + len;
    }

    pub fn time_us(&self) -> u64 {
        self.busy_ns / 1000
    }

    pub fn seeks(&self) -> u64 {
        self.seeks
    }
}

/// Parameters of the drive-managed SMR model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmrParams {
    pub capacity_bytes: u64,
    pub band_bytes: u64,
    pub media_cache_bytes: u64,
    pub timing: DiskTiming,
}

impl SmrParams {
    /// A drive of `capacity_bytes` with 32 MiB bands and a media cache of 0.2% of the capacity
    /// (at least 4 MiB), so that, as on the 8 TB drive the SALSA paper measured (1.4 GiB of
    /// cache over some 250,000 bands), the cache holds about one 64 KiB write per band.
    pub fn drive_managed(capacity_bytes: u64) -> SmrParams {
        SmrParams {
            capacity_bytes,
            band_bytes: 32 << 20,
            media_cache_bytes: (capacity_bytes / 500).max(4 << 20),
            timing: DiskTiming::default(),
        }
    }
}

#[derive(Default, Clone, Copy)]
struct SmrCounters {
    host_write_bytes: u64,
    host_read_bytes: u64,
    cached_write_bytes: u64,
    direct_write_bytes: u64,
    bands_cleaned: u64,
    cleaning_bytes: u64,
}

struct Band {
    /// Where the band's last in-place write ended (`None`: no in-place stream under way).
    frontier: Option<u64>,
    /// 4 KiB blocks of the band whose newest copy is in the media cache.
    cached: HashSet<u32>,
    /// Cache bytes this band's writes occupy (live and overwritten copies).
    cache_bytes: u64,
}

struct SmrState {
    p: SmrParams,
    bands: Vec<Band>,
    /// Bands in the order they entered the cache (cleaning order).
    queue: VecDeque<u32>,
    cache_used: u64,
    /// Append position in the cache region (which sits after the user space).
    cache_head: u64,
    timer: DiskTimer,
    c: SmrCounters,
}

const CACHE_BLOCK_BYTES: u64 = 4096;

impl SmrState {
    fn clean(&mut self) {
        let Some(b) = self.queue.pop_front() else { return };
        let band = &mut self.bands[b as usize];
        if !band.cached.is_empty() {
            // Read-modify-write of the whole band: read it, read its cached blocks, rewrite it.
            let start = b as u64 * self.p.band_bytes;
            let len = self.p.band_bytes.min(self.p.capacity_bytes - start);
            let cached = band.cached.len() as u64 * CACHE_BLOCK_BYTES;
            self.timer.access(start, len);
            self.timer.access(self.p.capacity_bytes + self.cache_head, cached);
            self.timer.access(start, len);
            self.c.bands_cleaned += 1;
            self.c.cleaning_bytes += 2 * len;
            band.cached.clear();
        }
        band.frontier = None;
        self.cache_used -= band.cache_bytes;
        band.cache_bytes = 0;
    }

    fn write(&mut self, offset: u64, len: u64) {
        self.c.host_write_bytes += len;
        let bb = self.p.band_bytes;
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let b = (at / bb) as usize;
            let band_start = b as u64 * bb;
            let piece_end = ((b as u64 + 1) * bb).min(end);
            let n = piece_end - at;
            let band = &mut self.bands[b];
            let in_place = at == band_start || band.frontier == Some(at);
            let blocks = (at / CACHE_BLOCK_BYTES) as u32..piece_end.div_ceil(CACHE_BLOCK_BYTES) as u32;
            if in_place {
                for blk in blocks {
                    band.cached.remove(&blk);
                }
                band.frontier = Some(piece_end).filter(|&f| f < band_start + bb);
                self.timer.access(at, n);
                self.c.direct_write_bytes += n;
            } else {
                while self.cache_used + n > self.p.media_cache_bytes && !self.queue.is_empty() {
                    self.clean();
                }
                let band = &mut self.bands[b];
                if band.cache_bytes == 0 {
                    self.queue.push_back(b as u32);
                }
                band.cached.extend(blocks);
                band.cache_bytes += n;
                self.cache_used += n;
                let pos = self.p.capacity_bytes + self.cache_head;
                self.cache_head = (self.cache_head + n) % self.p.media_cache_bytes.max(1);
                self.timer.access(pos, n);
                self.c.cached_write_bytes += n;
            }
            at = piece_end;
        }
    }

    fn read(&mut self, offset: u64, len: u64) {
        self.c.host_read_bytes += len;
        let first = (offset / CACHE_BLOCK_BYTES) as u32;
        let last = ((offset + len - 1) / CACHE_BLOCK_BYTES) as u32;
        let bb = self.p.band_bytes;
        let cached = (first..=last).any(|blk| self.bands[(blk as u64 * CACHE_BLOCK_BYTES / bb) as usize].cached.contains(&blk));
        if cached {
            // Part of the range sits in the cache: one access there, one at home.
            self.timer.access(self.p.capacity_bytes + self.cache_head / 2, len);
        }
        self.timer.access(offset, len);
    }
}

/// The drive-managed SMR model as a device.
pub struct DriveManagedSmr {
    name: String,
    backing: Arc<dyn Device>,
    params: SmrParams,
    state: Mutex<SmrState>,
}

impl DriveManagedSmr {
    pub fn new(backing: Arc<dyn Device>, params: SmrParams) -> io::Result<DriveManagedSmr> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if params.band_bytes == 0
            || !params.band_bytes.is_multiple_of(CACHE_BLOCK_BYTES)
            || params.media_cache_bytes < params.band_bytes / 64
        {
            return bad(format!(
                "SMR model: band {} must be a positive multiple of 4 KiB and the media cache {} at least 1/64 of a band",
                params.band_bytes, params.media_cache_bytes
            ));
        }
        if backing.size_bytes() < params.capacity_bytes || params.capacity_bytes < params.band_bytes {
            return bad(format!(
                "SMR model: {} is smaller than the capacity {} or than one band",
                backing.name(),
                params.capacity_bytes
            ));
        }
        let bands = params.capacity_bytes.div_ceil(params.band_bytes);
        Ok(DriveManagedSmr {
            name: format!("dmsmr:{}", backing.name()),
            backing,
            params,
            state: Mutex::new(SmrState {
                p: params,
                bands: (0..bands)
                    .map(|_| Band {
                        frontier: None,
                        cached: HashSet::new(),
                        cache_bytes: 0,
                    })
                    .collect(),
                queue: VecDeque::new(),
                cache_used: 0,
                cache_head: 0,
                timer: DiskTimer::new(params.timing),
                c: SmrCounters::default(),
            }),
        })
    }

    /// Keeps real time from now on (`true`: see the module doc; the actuator starts idle) or
    /// stops (`false`: requests return at the host's speed again).
    pub fn set_real_time(&self, on: bool) {
        self.state.lock().timer.set_real_time(on);
    }

    /// Models one host request issued at `issued`, and in real time returns when it completes.
    fn request(&self, issued: Instant, work: impl FnOnce(&mut SmrState)) {
        let done = DiskTimer::request(&mut *self.state.lock(), |s| &mut s.timer, issued, work);
        if let Some(at) = done {
            crate::device::complete_at(at);
        }
    }
}

impl Device for DriveManagedSmr {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.params.capacity_bytes
    }
    fn storage_type(&self) -> StorageType {
        StorageType::Hdd
    }
    fn alignment_bytes(&self) -> usize {
        self.backing.alignment_bytes()
    }
    fn preferred_alignment_bytes(&self) -> u64 {
        self.params.band_bytes
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (len, issued) = (buf.len(), Instant::now());
        modelled_io(
            self.params.capacity_bytes,
            offset,
            len,
            || self.backing.read_at(buf, offset),
            |at, n| self.request(issued, |s| s.read(at, n)),
        )
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let issued = Instant::now();
        modelled_io(
            self.params.capacity_bytes,
            offset,
            buf.len(),
            || self.backing.write_at(buf, offset),
            |at, n| self.request(issued, |s| s.write(at, n)),
        )
    }
    fn sync(&self) -> io::Result<()> {
        self.backing.sync()
    }
    fn counters(&self) -> Vec<(String, u64)> {
        let s = self.state.lock();
        let c = s.c;
        vec![
            ("host_write_bytes".into(), c.host_write_bytes),
            ("host_read_bytes".into(), c.host_read_bytes),
            (
                "media_write_bytes".into(),
                c.cached_write_bytes + c.direct_write_bytes + c.cleaning_bytes / 2,
            ),
            ("media_cache_write_bytes".into(), c.cached_write_bytes),
            ("in_place_write_bytes".into(), c.direct_write_bytes),
            ("bands_cleaned".into(), c.bands_cleaned),
            ("cleaning_bytes".into(), c.cleaning_bytes),
            ("media_cache_used_bytes".into(), s.cache_used),
            ("seeks".into(), s.timer.seeks()),
            ("model_time_us".into(), s.timer.time_us()),
        ]
    }
}

/// Gives any device the timing of one disk actuator (for a host-managed SMR drive emulated by
/// [`crate::device::ZonedEmulator`]): every access costs positioning unless sequential, plus transfer.
pub struct TimedDisk {
    name: String,
    inner: Arc<dyn Device>,
    timer: Mutex<DiskTimer>,
    written: std::sync::atomic::AtomicU64,
    read: std::sync::atomic::AtomicU64,
}

impl TimedDisk {
    pub fn new(inner: Arc<dyn Device>, timing: DiskTiming) -> TimedDisk {
        TimedDisk {
            name: inner.name().to_string(),
            inner,
            timer: Mutex::new(DiskTimer::new(timing)),
            written: Default::default(),
            read: Default::default(),
        }
    }

    /// Keeps real time from now on, or stops (see the module doc).
    pub fn set_real_time(&self, on: bool) {
        self.timer.lock().set_real_time(on);
    }

    /// Times one access issued at `issued`; in real time, returns when it completes.
    fn access(&self, issued: Instant, offset: u64, len: u64) {
        let done = DiskTimer::request(&mut *self.timer.lock(), |t| t, issued, |t| t.access(offset, len));
        if let Some(at) = done {
            crate::device::complete_at(at);
        }
    }
}

impl Device for TimedDisk {
    fn name(&self) -> &str {
        &self.name
    }
    crate::forward_device_properties!(inner);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let issued = Instant::now();
        self.inner.read_at(buf, offset)?;
        self.access(issued, offset, buf.len() as u64);
        self.read.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let issued = Instant::now();
        self.inner.write_at(buf, offset)?;
        self.access(issued, offset, buf.len() as u64);
        self.written.fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn counters(&self) -> Vec<(String, u64)> {
        let t = self.timer.lock();
        let mut c = self.inner.counters();
        c.extend([
            (
                "host_write_bytes".to_string(),
                self.written.load(std::sync::atomic::Ordering::Relaxed),
            ),
            ("host_read_bytes".to_string(), self.read.load(std::sync::atomic::Ordering::Relaxed)),
            (
                "media_write_bytes".to_string(),
                self.written.load(std::sync::atomic::Ordering::Relaxed),
            ),
            ("seeks".to_string(), t.seeks()),
            ("model_time_us".to_string(), t.time_us()),
        ]);
        c
    }
}
