//! `salsa bench-raid`: SALSA's RAID-5 against an in-place RAID-5 that does what Linux MD does,
//! over the same member files, side by side in one run (alternating rounds).
//!
//! The baseline ([`InPlaceRaid5`]) stripes a linear address space over the members in chunks
//! with rotating parity, and updates in place: a write that covers a whole row computes its
//! parity from the new data; any other write reads the old data and the old parity of what it
//! touches, and writes the new data and the new parity (read-modify-write), holding the row's
//! lock meanwhile, as MD does for a partial-stripe write: both reads at once, then both writes
//! at once (through the writing thread's io_uring, so that the kernel has both in flight). Its
//! whole-device resync reads every surviving member from start to end and writes the new one.
//!
//! Measured: 4 KiB random writes at a queue depth and 1 MiB sequential writes (throughput and
//! latency percentiles, and for SALSA the bytes written to all members per user byte, parity
//! included); SALSA's 4 KiB random reads healthy and with a member failed; and the rebuild of
//! a failed member of a half-full SALSA pool against the baseline's whole-device resync onto
//! the same spare file, beside the spare's own sequential write bandwidth.

use super::raw::{preallocate, sampled};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::{DiskTiming, FileDevice, MemoryDevice, SsdModel, TimedDisk};
use salsa_core::{ArrayKind, Device, OpenOptions, Pool, PoolConfig};
use serde_json::{json, Value};
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parameters of `salsa bench-raid`.
#[derive(Debug, Clone)]
pub struct RaidBenchParams {
    /// Directory of the member files (overwritten), `m0.img` to `m<members>.img` (the last
    /// one is the spare that rebuilds go to).
    pub dir: PathBuf,
    pub members: usize,
    pub member_bytes: u64,
    /// The baseline's chunk (MD's stripe unit).
    pub chunk_bytes: u64,
    pub queue_depth: usize,
    pub seconds: u64,
    pub rounds: usize,
    /// SALSA's layout on the members (RAID-5 normally; others to see what redundancy costs).
    pub salsa_array: ArrayKind,
    /// SALSA's stripe unit (`None`: the layout's default).
    pub salsa_stripe_unit: Option<u32>,
    /// Parts to run: `randwrite_4k`, `seqwrite_1m`, `flush_4k`, `ssd_models`, `ssd_real_time`,
    /// `reads_rebuild`, `raid1_reads` (empty: all).
    pub only: Vec<String>,
    /// SALSA paces its writers while the GC is behind.
    pub pace_writes: bool,
    /// Paced random writes come from one thread per queue slot, each sleeping for its turn;
    /// otherwise from one thread holding the queue's writes and acknowledging each at its
    /// turn (`drive_acknowledging`).
    pub paced_threads: bool,
    /// The share of the pool's logical capacity SALSA's volume takes; the write workloads of
    /// both sides cover as many bytes.
    pub volume_fraction: f64,
}

impl RaidBenchParams {
    /// Whether SALSA's paced random writes come from one thread holding the queue's
    /// acknowledgements ([`drive_acknowledging`]).
    fn holds_acknowledgements(&self) -> bool {
        self.pace_writes && !self.paced_threads
    }
}

fn open_direct(path: &Path) -> Result<Arc<dyn Device>, String> {
    Ok(Arc::new(super::raw::open_direct(path)?))
}

/// How the baseline writes less than a row, as the report names it.
const IN_PLACE_METHOD: &str = "read-modify-write: old data and old parity read at once, then new data and new parity written at once";

thread_local! {
    /// Each writing thread's own ring for the baseline's pairs of I/O (see [`in_flight_together`]).
    static RING: std::cell::RefCell<Option<io_uring::IoUring>> = const { std::cell::RefCell::new(None) };
}

/// One I/O of a pair: the member's file (`None`: a device without one, such as a model),
/// the device, the buffer.
type PairIo<'a, B> = (Option<RawFd>, &'a Arc<dyn Device>, B);

/// Reads both buffers at `at` of their members at once, as MD issues them: through the
/// writing thread's io_uring when both members are files (the kernel has both in flight, no
/// thread hands anything over), else one after the other but in flight together on models
/// that keep real time ([`salsa_core::device::issued_together`]).
fn read_both(a: PairIo<'_, &mut [u8]>, b: PairIo<'_, &mut [u8]>, at: u64) -> Result<(), String> {
    if let (Some(fa), Some(fb)) = (a.0, b.0) {
        let ops = [
            io_uring::opcode::Read::new(io_uring::types::Fd(fa), a.2.as_mut_ptr(), a.2.len() as u32).offset(at),
            io_uring::opcode::Read::new(io_uring::types::Fd(fb), b.2.as_mut_ptr(), b.2.len() as u32).offset(at),
        ];
        // SAFETY: both buffers are borrowed mutably until `in_flight_together` returns, which
        // is after both reads completed (or never, see there).
        return unsafe { in_flight_together(ops.map(|o| o.build()), [a.2.len(), b.2.len()]) };
    }
    salsa_core::device::issued_together(|| a.1.read_at(a.2, at).and_then(|_| b.1.read_at(b.2, at))).map_err(|e| e.to_string())
}

/// [`read_both`] for writes.
fn write_both(a: PairIo<'_, &[u8]>, b: PairIo<'_, &[u8]>, at: u64) -> Result<(), String> {
    if let (Some(fa), Some(fb)) = (a.0, b.0) {
        let ops = [
            io_uring::opcode::Write::new(io_uring::types::Fd(fa), a.2.as_ptr(), a.2.len() as u32).offset(at),
            io_uring::opcode::Write::new(io_uring::types::Fd(fb), b.2.as_ptr(), b.2.len() as u32).offset(at),
        ];
        // SAFETY: as in `read_both`; the buffers are only read.
        return unsafe { in_flight_together(ops.map(|o| o.build()), [a.2.len(), b.2.len()]) };
    }
    salsa_core::device::issued_together(|| a.1.write_at(a.2, at).and_then(|_| b.1.write_at(b.2, at))).map_err(|e| e.to_string())
}

/// Submits `ops` on this thread's ring and waits for both; each must move its whole length.
///
/// # Safety
/// The buffers `ops` point to must stay valid until this returns. If the wait fails with the
/// requests possibly still in flight, this never returns (it aborts the process): the kernel
/// could still write into buffers the caller would free.
unsafe fn in_flight_together(ops: [io_uring::squeue::Entry; 2], lens: [usize; 2]) -> Result<(), String> {
    RING.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(io_uring::IoUring::new(4).map_err(|e| format!("io_uring: {e}"))?);
        }
        let ring = cell.as_mut().ok_or("no io_uring")?;
        {
            let mut sq = ring.submission();
            for (i, op) in ops.iter().enumerate() {
                // SAFETY: the caller keeps the buffers valid until both complete (below).
                unsafe { sq.push(&op.clone().user_data(i as u64)) }.map_err(|_| "io_uring queue full".to_string())?;
            }
        }
        let mut results: [Option<i32>; 2] = [None, None];
        while results.iter().any(|r| r.is_none()) {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("io_uring wait failed with I/O in flight: {e}");
                    std::process::abort();
                }
            }
            for cqe in ring.completion() {
                if let Some(slot) = results.get_mut(cqe.user_data() as usize) {
                    *slot = Some(cqe.result());
                }
            }
        }
        for (r, len) in results.into_iter().flatten().zip(lens) {
            if r < 0 {
                return Err(std::io::Error::from_raw_os_error(-r).to_string());
            }
            if r as usize != len {
                return Err(format!("short I/O: {r} of {len} bytes"));
            }
        }
        Ok(())
    })
}

/// An in-place RAID-5 (see the module documentation). As a [`Device`] it is what `salsa serve
/// --raw --in-place-raid5` serves: the MD-like baseline for applications (Table IIb).
pub struct InPlaceRaid5 {
    name: String,
    devs: Vec<Arc<dyn Device>>,
    /// Each member's open file, when it is one (kept open by `devs`): a read-modify-write's
    /// pairs of I/O then go through io_uring.
    fds: Vec<Option<RawFd>>,
    chunk: u64,
    rows: u64,
    locks: Vec<Mutex<()>>,
}

impl InPlaceRaid5 {
    /// Over any devices (a model's): the I/O of a pair one after the other.
    pub fn new(devs: Vec<Arc<dyn Device>>, chunk: u64) -> InPlaceRaid5 {
        let fds = vec![None; devs.len()];
        InPlaceRaid5::with_fds(devs, fds, chunk)
    }

    /// Over files: the I/O of a pair at once, through io_uring.
    pub fn on_files(files: Vec<Arc<FileDevice>>, chunk: u64) -> InPlaceRaid5 {
        let fds = files.iter().map(|f| Some(f.as_raw_fd())).collect();
        let devs = files.into_iter().map(|f| f as Arc<dyn Device>).collect();
        InPlaceRaid5::with_fds(devs, fds, chunk)
    }

    fn with_fds(devs: Vec<Arc<dyn Device>>, fds: Vec<Option<RawFd>>, chunk: u64) -> InPlaceRaid5 {
        let rows = devs.iter().map(|d| d.size_bytes()).min().unwrap_or(0) / chunk.max(1);
        let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
        InPlaceRaid5 {
            name: format!("in-place-raid5({})", names.join(",")),
            devs,
            fds,
            chunk,
            rows,
            locks: (0..1024).map(|_| Mutex::new(())).collect(),
        }
    }

    fn fd(&self, member: usize) -> Option<RawFd> {
        self.fds[member]
    }

    fn n(&self) -> u64 {
        self.devs.len() as u64
    }

    /// Makes every write durable: syncs every member, all at once (as MD's flush does).
    pub fn sync(&self) -> Result<(), String> {
        std::thread::scope(|s| {
            let hs: Vec<_> = self.devs.iter().map(|d| s.spawn(move || d.sync())).collect();
            hs.into_iter()
                .try_for_each(|h| h.join().map_err(|_| "sync thread panicked".to_string())?.map_err(|e| e.to_string()))
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.rows * (self.n() - 1) * self.chunk
    }

    fn parity_member(&self, row: u64) -> usize {
        (self.n() - 1 - row % self.n()) as usize
    }

    fn data_member(&self, row: u64, unit: u64) -> usize {
        ((self.parity_member(row) as u64 + 1 + unit) % self.n()) as usize
    }

    /// Writes `data` at `offset` (both multiples of 4 KiB). Returns the device bytes moved.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        let row_bytes = (self.n() - 1) * self.chunk;
        let mut at = 0u64;
        while at < data.len() as u64 {
            let pos = offset + at;
            let row = pos / row_bytes;
            let in_row = pos % row_bytes;
            let n = (row_bytes - in_row).min(data.len() as u64 - at);
            let piece = &data[at as usize..(at + n) as usize];
            let _lock = self.locks[(row % self.locks.len() as u64) as usize].lock();
            let p = self.parity_member(row);
            let base = row * self.chunk;
            let err = |e: std::io::Error| e.to_string();
            if n == row_bytes {
                // A whole row: parity from the new data alone.
                // Every member's write in flight together on models that keep real time.
                salsa_core::device::issued_together(|| -> Result<(), String> {
                    let mut parity = salsa_core::AlignedBuf::zeroed(self.chunk as usize);
                    for (u, unit) in piece.chunks(self.chunk as usize).enumerate() {
                        for (x, y) in parity.iter_mut().zip(unit) {
                            *x ^= *y;
                        }
                        self.devs[self.data_member(row, u as u64)].write_at(unit, base).map_err(err)?;
                    }
                    self.devs[p].write_at(&parity, base).map_err(err)
                })?;
            } else {
                // Read-modify-write of each unit touched: old data, old parity, new both.
                let mut done = 0u64;
                while done < n {
                    let x = in_row + done;
                    let unit = x / self.chunk;
                    let in_unit = x % self.chunk;
                    let len = (self.chunk - in_unit).min(n - done) as usize;
                    let new = &piece[done as usize..done as usize + len];
                    let d = self.data_member(row, unit);
                    let at = base + in_unit;
                    let mut old = salsa_core::AlignedBuf::zeroed(len);
                    let mut parity = salsa_core::AlignedBuf::zeroed(len);
                    // Both reads at once, then both writes at once, as MD issues them.
                    read_both((self.fd(d), &self.devs[d], &mut old), (self.fd(p), &self.devs[p], &mut parity), at)?;
                    for ((q, o), w) in parity.iter_mut().zip(old.iter()).zip(new) {
                        *q ^= *o ^ *w;
                    }
                    let mut data_buf = salsa_core::AlignedBuf::zeroed(len);
                    data_buf.copy_from_slice(new);
                    write_both((self.fd(d), &self.devs[d], &data_buf), (self.fd(p), &self.devs[p], &parity), at)?;
                    done += len as u64;
                }
            }
            at += n;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` from the data members (a healthy array reads no
    /// parity).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let row_bytes = (self.n() - 1) * self.chunk;
        let mut at = 0usize;
        while at < buf.len() {
            let pos = offset + at as u64;
            let (row, in_row) = (pos / row_bytes, pos % row_bytes);
            let (unit, in_unit) = (in_row / self.chunk, in_row % self.chunk);
            let len = ((self.chunk - in_unit) as usize).min(buf.len() - at);
            let member = self.data_member(row, unit);
            self.devs[member].read_at(&mut buf[at..at + len], row * self.chunk + in_unit)?;
            at += len;
        }
        Ok(())
    }

    /// Whole-device resync of member `lost` onto `spare`: every row, read from the others.
    pub fn resync(&self, lost: usize, spare: &dyn Device) -> Result<u64, String> {
        let step = (1u64 << 20) / self.chunk * self.chunk;
        let end = self.rows * self.chunk;
        let mut out = salsa_core::AlignedBuf::zeroed(step as usize);
        let mut tmp = salsa_core::AlignedBuf::zeroed(step as usize);
        let mut at = 0;
        while at < end {
            let len = step.min(end - at) as usize;
            out[..len].fill(0);
            for (i, d) in self.devs.iter().enumerate() {
                if i != lost {
                    d.read_at(&mut tmp[..len], at).map_err(|e| e.to_string())?;
                    for (x, y) in out[..len].iter_mut().zip(tmp[..len].iter()) {
                        *x ^= *y;
                    }
                }
            }
            spare.write_at(&out[..len], at).map_err(|e| e.to_string())?;
            at += len as u64;
        }
        spare.sync().map_err(|e| e.to_string())?;
        Ok(end)
    }
}

impl Device for InPlaceRaid5 {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.capacity_bytes()
    }
    fn storage_type(&self) -> salsa_core::device::StorageType {
        self.devs
            .first()
            .map_or(salsa_core::device::StorageType::Flash, |d| d.storage_type())
    }
    fn alignment_bytes(&self) -> usize {
        self.devs.iter().map(|d| d.alignment_bytes()).max().unwrap_or(512)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        salsa_core::device::check_range(self.capacity_bytes(), offset, buf.len())?;
        self.read(offset, buf)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        salsa_core::device::check_range(self.capacity_bytes(), offset, buf.len())?;
        self.write(offset, buf).map_err(std::io::Error::other)
    }
    fn sync(&self) -> std::io::Result<()> {
        InPlaceRaid5::sync(self).map_err(std::io::Error::other)
    }
    /// The members' counters, summed by name (an SSD model's flash programs over the array;
    /// `model_time_us` so becomes the members' total busy time, not the array's).
    fn counters(&self) -> Vec<(String, u64)> {
        let mut sum: Vec<(String, u64)> = Vec::new();
        for d in &self.devs {
            for (name, value) in d.counters() {
                match sum.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, v)) => *v += value,
                    None => sum.push((name, value)),
                }
            }
        }
        sum
    }
}

/// One side's measured run.
#[derive(Clone)]
struct Run {
    mbps: f64,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    max_us: u64,
}

/// A histogram of latencies in microseconds, 1 us to 10 minutes.
fn latency_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string())
}

/// Runs `op(thread, rng)` (returning bytes moved) from `threads` threads for `seconds`.
fn drive(threads: usize, seconds: u64, op: &(dyn Fn(usize, &mut SmallRng) -> Result<u64, String> + Sync)) -> Result<Run, String> {
    let moved = AtomicU64::new(0);
    let hist = Mutex::new(latency_histogram()?);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (res, samples) = sampled(&moved, || {
        std::thread::scope(|s| -> Result<(), String> {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (moved, hist) = (&moved, &hist);
                    s.spawn(move || -> Result<(), String> {
                        let mut rng = SmallRng::seed_from_u64(t as u64 * 7919 + 1);
                        let mut h = latency_histogram()?;
                        while Instant::now() < deadline {
                            let t0 = Instant::now();
                            let n = op(t, &mut rng)?;
                            h.saturating_record(t0.elapsed().as_micros().max(1) as u64);
                            moved.fetch_add(n, Relaxed);
                        }
                        hist.lock().add(&h).map_err(|e| e.to_string())
                    })
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().map_err(|_| "benchmark thread panicked".to_string())?)
        })
    });
    res?;
    Ok(run_of(&hist.into_inner(), samples))
}

/// Writes one block and returns its bytes and when it may be acknowledged (`None`: at once).
type AcknowledgedWriteFn<'a> = dyn Fn(&mut SmallRng) -> Result<(u64, Option<Instant>), String> + Sync + 'a;

/// Keeps `queue_depth` writes in flight for `seconds` from one thread, as a front-end that
/// holds its clients' acknowledgements does (the NBD server's receiving thread): `op` writes
/// one block and returns its bytes and the instant before which it is not to be acknowledged
/// (the pacer's turn; `None`: at once). The thread acknowledges every write whose time has
/// come (a write's latency runs from its issue to then), issues the next in its slot, and
/// sleeps until the earliest time still ahead. The client side of each slot waits for its
/// acknowledgement before it writes again, as at any queue depth.
fn drive_acknowledging(queue_depth: usize, seconds: u64, op: &AcknowledgedWriteFn<'_>) -> Result<Run, String> {
    let moved = AtomicU64::new(0);
    let mut h = latency_histogram()?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (res, samples) = sampled(&moved, || -> Result<(), String> {
        let mut rng = SmallRng::seed_from_u64(7919);
        // Each slot: when its write was issued, when it may be acknowledged, its bytes.
        let mut slots = Vec::with_capacity(queue_depth);
        for _ in 0..queue_depth.max(1) {
            let issued = Instant::now();
            let (bytes, ack_at) = op(&mut rng)?;
            slots.push((issued, ack_at, bytes));
        }
        while Instant::now() < deadline {
            let now = Instant::now();
            let mut next_ack: Option<Instant> = None;
            for slot in slots.iter_mut() {
                if slot.1.is_none_or(|at| salsa_core::ack_due(at, now)) {
                    h.saturating_record(now.duration_since(slot.0).as_micros().max(1) as u64);
                    moved.fetch_add(slot.2, Relaxed);
                    let issued = Instant::now();
                    let (bytes, ack_at) = op(&mut rng)?;
                    *slot = (issued, ack_at, bytes);
                }
                if let Some(at) = slot.1 {
                    next_ack = Some(next_ack.map_or(at, |n| n.min(at)));
                }
            }
            if let Some(at) = next_ack {
                salsa_core::sleep_until_ack_time(at);
            }
        }
        Ok(())
    });
    res?;
    Ok(run_of(&h, samples))
}

/// A run's figures: the median of the throughput samples and the latency percentiles.
fn run_of(h: &Histogram<u64>, mut samples: Vec<f64>) -> Run {
    samples.sort_by(|a, b| a.total_cmp(b));
    Run {
        mbps: samples.get(samples.len() / 2).copied().unwrap_or(0.0),
        p50_us: h.value_at_quantile(0.5),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn member_paths(p: &RaidBenchParams) -> Vec<PathBuf> {
    (0..=p.members).map(|i| p.dir.join(format!("m{i}.img"))).collect()
}

/// The parity buffer file of `salsa_pool(.., true)`.
fn parity_buffer_path(p: &RaidBenchParams) -> PathBuf {
    p.dir.join("parity-buffer.img")
}

/// The bytes of a volume that takes `fraction` of `pool`'s logical capacity.
fn volume_bytes(pool: &Pool, fraction: f64) -> u64 {
    (pool.logical_capacity_bytes() as f64 * fraction) as u64 / (1 << 20) * (1 << 20)
}

/// Random 4 KiB writes on SALSA's freshly filled volume until its GC has cleaned as many
/// segments as the pool has, each segment then written by the random workload: the volume's
/// first random writes fill the pool's free segments at the speed of sequential writes, and
/// while victims written sequentially remain the GC cleans faster than it will (1.2 GB/s two
/// seconds after it started, 600 MB/s a second later, on the RAID-5 bench), neither the
/// steady state the measured run is for. `one_second` runs a second of the measured run's own
/// workload and driver: a warm-up by 32 threads that each slept for their turn left a paced
/// pool's rate half again above what the GC sustains (they had not kept up with it while the
/// GC idled), and the one thread holding acknowledgements then ran free segments down to the
/// reserve, with stalls through the measured run's first 200 ms (docs/BENCHMARKS.md).
fn warm_up(pool: &Pool, one_second: &dyn Fn() -> Result<Run, String>) -> Result<(), String> {
    let turnover = u64::from(pool.stats().total_segments);
    for _ in 0..WARM_UP_SECONDS_MAX {
        one_second()?;
        if pool.stats().gc_segments_cleaned >= turnover {
            return Ok(());
        }
    }
    Ok(())
}

/// The warm-up runs at most this long.
const WARM_UP_SECONDS_MAX: u32 = 60;

/// SALSA's pool configuration: the layout and stripe unit asked for.
fn salsa_config(p: &RaidBenchParams) -> PoolConfig {
    PoolConfig {
        array: p.salsa_array,
        stripe_unit_bytes: p.salsa_stripe_unit,
        ..PoolConfig::default()
    }
}

/// SALSA's open options: no read cache (reads measure the array, healthy against degraded,
/// not the DRAM cache), writers paced if asked.
fn salsa_options(p: &RaidBenchParams) -> OpenOptions {
    OpenOptions {
        read_cache_bytes: 0,
        pace_user_writes: p.pace_writes,
        ..OpenOptions::default()
    }
}

/// A fresh SALSA RAID-5 pool on the members (with a parity buffer file beside them when
/// `parity_buffer`), without volumes.
fn salsa_pool_empty(p: &RaidBenchParams, parity_buffer: bool) -> Result<Pool, String> {
    let devs: Vec<Arc<dyn Device>> = member_paths(p)[..p.members]
        .iter()
        .map(|m| open_direct(m))
        .collect::<Result<_, _>>()?;
    let cfg = salsa_config(p);
    let mut opts = salsa_options(p);
    if parity_buffer {
        let path = parity_buffer_path(p);
        preallocate(&path, salsa_core::pool::default_parity_buffer_bytes(&cfg, p.members as u32))?;
        opts.parity_buffer = Some(open_direct(&path)?);
    }
    Pool::create(devs, &cfg, &opts).map_err(|e| e.to_string())
}

/// [`salsa_pool_empty`] with a volume of `volume_fraction` of its capacity, written once.
fn salsa_pool(p: &RaidBenchParams, volume_fraction: f64, parity_buffer: bool) -> Result<Pool, String> {
    let pool = salsa_pool_empty(p, parity_buffer)?;
    let size = volume_bytes(&pool, volume_fraction);
    let vol = pool.create_volume("bench", size, 4096).map_err(|e| e.to_string())?;
    fill_once(size, &|o, d| vol.write(o, d).map_err(|e| e.to_string()))?;
    pool.flush().map_err(|e| e.to_string())?;
    Ok(pool)
}

fn baseline_array(p: &RaidBenchParams) -> Result<InPlaceRaid5, String> {
    let files: Vec<Arc<FileDevice>> = member_paths(p)[..p.members]
        .iter()
        .map(|m| super::raw::open_direct(m).map(Arc::new))
        .collect::<Result<_, _>>()?;
    Ok(InPlaceRaid5::on_files(files, p.chunk_bytes))
}

/// How a workload writes `data` at an offset, on either side.
type WriteFn<'a> = dyn Fn(u64, &[u8]) -> Result<(), String> + Sync + 'a;

/// A write workload on either side: 4 KiB random at the queue depth, or 1 MiB sequential
/// from one writer.
#[derive(Clone, Copy)]
enum Workload {
    Random4k,
    Sequential1m,
}

fn run_workload(p: &RaidBenchParams, w: Workload, capacity: u64, write: &WriteFn<'_>) -> Result<Run, String> {
    let (threads, block) = match w {
        Workload::Random4k => (p.queue_depth, 4096u64),
        Workload::Sequential1m => (1, 1 << 20),
    };
    let blocks = capacity / block;
    let next = AtomicU64::new(0);
    let bufs: Vec<Mutex<salsa_core::AlignedBuf>> = (0..threads)
        .map(|t| {
            let mut b = salsa_core::AlignedBuf::zeroed(block as usize);
            SmallRng::seed_from_u64(t as u64).fill(&mut b[..]);
            Mutex::new(b)
        })
        .collect();
    drive(threads, p.seconds, &|t, rng| {
        let b = match w {
            Workload::Random4k => rng.gen_range(0..blocks),
            Workload::Sequential1m => next.fetch_add(1, Relaxed) % blocks,
        };
        let mut buf = bufs[t].lock();
        buf[0] = buf[0].wrapping_add(1);
        write(b * block, &buf)?;
        Ok(block)
    })
}

/// One SALSA round's figures.
struct SalsaRound {
    run: Run,
    /// Bytes written to all members per user byte, parity included.
    array_wa: f64,
    /// Bytes read from all members per user byte.
    array_read: f64,
}

/// Measures workload `w` on `pool`'s volume `bench` for `seconds` (random writes after the
/// [`warm_up`]); `before_measuring` runs between the warm-up and the measured run (the SSD
/// models' real time starts there), followed by `settle_seconds` of the workload unmeasured.
/// Prints the round's line.
fn salsa_round(
    p: &RaidBenchParams,
    name: &str,
    round: usize,
    w: Workload,
    pool: &Pool,
    before_measuring: &dyn Fn() -> Result<(), String>,
    settle_seconds: u64,
) -> Result<SalsaRound, String> {
    let vol = pool.volume("bench").map_err(|e| e.to_string())?;
    let write = |off, data: &[u8]| vol.write(off, data).map_err(|e| e.to_string());
    let blocks = vol.size_bytes() / 4096;
    let mut buf = salsa_core::AlignedBuf::zeroed(4096);
    SmallRng::seed_from_u64(0).fill(&mut buf[..]);
    let buf = Mutex::new(buf);
    let write_held = |rng: &mut SmallRng| {
        let mut buf = buf.lock();
        buf[0] = buf[0].wrapping_add(1);
        let ack_at = vol.write_with_ack_time(rng.gen_range(0..blocks) * 4096, &buf);
        Ok((4096, ack_at.map_err(|e| e.to_string())?))
    };
    // The measured run's workload and driver for `seconds`.
    let measure = |seconds: u64| match w {
        Workload::Random4k if p.holds_acknowledgements() => drive_acknowledging(p.queue_depth, seconds, &write_held),
        _ => run_workload(&RaidBenchParams { seconds, ..p.clone() }, w, vol.size_bytes(), &write),
    };
    if let Workload::Random4k = w {
        warm_up(pool, &|| measure(1))?;
    }
    before_measuring()?;
    if settle_seconds > 0 {
        measure(settle_seconds)?;
    }
    let before = pool.stats();
    let s = measure(p.seconds)?;
    let after = pool.stats();
    let user = (after.user_bytes_written - before.user_bytes_written).max(1) as f64;
    // Bytes every member moved between the two snapshots, per user byte.
    let per_user_byte = |f: fn(&salsa_core::MemberStatus) -> u64| {
        let sum = |st: &salsa_core::Stats| st.members.iter().map(f).sum::<u64>();
        (sum(&after) - sum(&before)) as f64 / user
    };
    let array_wa = per_user_byte(|m| m.bytes_written);
    // With the GC's reads of whole victims, the parity units between each member's data
    // units are read through (one request per member).
    let array_read = per_user_byte(|m| m.bytes_read);
    let pad = (after.pad_bytes_written - before.pad_bytes_written) as f64 / user;
    let gc_wa = (user + (after.gc_bytes_relocated - before.gc_bytes_relocated) as f64) / user;
    let gc_read = (after.gc_bytes_read - before.gc_bytes_read) as f64 / user;
    eprintln!(
        "[bench-raid] {name} round {round}: SALSA {} {:.1} MB/s, p99 {} us, p99.9 {} us, max {} us, all members written per user byte {array_wa:.2} (GC {gc_wa:.2}, padding {pad:.2}), GC read per user byte {gc_read:.2}, all members read per user byte {array_read:.2}; {} syncs ({} ms), GC busy {} ms, {} stalls, {} writes paced ({} for the write-back)",
        p.salsa_array.name(),
        s.mbps,
        s.p99_us,
        s.p999_us,
        s.max_us,
        after.syncs - before.syncs,
        (after.sync_micros - before.sync_micros) / 1000,
        (after.gc_micros - before.gc_micros) / 1000,
        after.throttled_allocations - before.throttled_allocations,
        after.paced_writes - before.paced_writes,
        after.paced_by_write_back - before.paced_by_write_back
    );
    Ok(SalsaRound {
        run: s,
        array_wa,
        array_read,
    })
}

/// The medians of both sides' rounds of workload `w`, and their ratios, as the report has them.
fn comparison(p: &RaidBenchParams, w: Workload, base: &[Run], ours: &[SalsaRound]) -> Value {
    let m = |v: &[Run], f: fn(&Run) -> f64| median(v.iter().map(f).collect());
    let runs: Vec<Run> = ours.iter().map(|r| r.run.clone()).collect();
    let (bm, sm) = (m(base, |r| r.mbps), m(&runs, |r| r.mbps));
    let (b99, s99) = (m(base, |r| r.p99_us as f64), m(&runs, |r| r.p99_us as f64));
    json!({
        "in_place_mbps": bm, "salsa_mbps": sm, "throughput_ratio": sm / bm.max(1e-9),
        "in_place_p50_us": m(base, |r| r.p50_us as f64), "salsa_p50_us": m(&runs, |r| r.p50_us as f64),
        "in_place_p99_us": b99, "salsa_p99_us": s99, "p99_ratio": b99 / s99.max(1.0),
        "in_place_p999_us": m(base, |r| r.p999_us as f64), "salsa_p999_us": m(&runs, |r| r.p999_us as f64),
        "in_place_max_us": m(base, |r| r.max_us as f64), "salsa_max_us": m(&runs, |r| r.max_us as f64),
        "salsa_array_write_amplification": median(ours.iter().map(|r| r.array_wa).collect()),
        "salsa_array_read_per_user_byte": median(ours.iter().map(|r| r.array_read).collect()),
        "in_place_method": IN_PLACE_METHOD,
        "salsa_driver": match w {
            Workload::Random4k if p.holds_acknowledgements() => "one thread holding the acknowledgements",
            Workload::Random4k => "a thread per queue slot",
            Workload::Sequential1m => "one thread",
        },
    })
}

/// The parts of the comparison, in the order they run.
const PARTS: [&str; 7] = [
    "randwrite_4k",
    "seqwrite_1m",
    "flush_4k",
    "ssd_models",
    "ssd_real_time",
    "reads_rebuild",
    "raid1_reads",
];

/// Runs the whole comparison; returns the JSON report (and prints a table on stderr).
pub fn run(p: &RaidBenchParams) -> Result<Value, String> {
    if let Some(unknown) = p.only.iter().find(|o| !PARTS.contains(&o.as_str())) {
        return Err(format!("no part {unknown:?}: the parts are {}", PARTS.join(", ")));
    }
    if p.only.iter().all(|o| o == "raid1_reads") && !p.only.is_empty() {
        // The one part that needs neither member files nor a RAID-5.
        return Ok(json!({ "queue_depth": p.queue_depth, "seconds": p.seconds, "rounds": p.rounds, "raid1_reads": raid1_reads(p)? }));
    }
    if p.members < 3 {
        return Err("RAID-5 needs at least 3 members".into());
    }
    std::fs::create_dir_all(&p.dir).map_err(|e| format!("{}: {e}", p.dir.display()))?;
    let paths = member_paths(p);
    let mut report = json!({
        "members": p.members, "member_bytes": p.member_bytes, "chunk_bytes": p.chunk_bytes,
        "queue_depth": p.queue_depth, "seconds": p.seconds, "rounds": p.rounds,
    });
    let wanted = |part: &str| p.only.is_empty() || p.only.iter().any(|o| o == part);
    // The bytes SALSA's volume holds, which both sides' write workloads cover (the in-place
    // array is measured on as much of its space, as the SALSA paper measured the raw device on
    // a partition of the SALSA volume's size).
    let same_bytes = {
        for path in &paths[..p.members] {
            preallocate(path, p.member_bytes)?;
        }
        let pool = salsa_pool_empty(p, false)?;
        let bytes = volume_bytes(&pool, p.volume_fraction);
        pool.close().map_err(|e| e.to_string())?;
        bytes
    };
    report["volume_fraction"] = p.volume_fraction.into();
    report["workload_bytes"] = same_bytes.into();
    for (name, w) in [("randwrite_4k", Workload::Random4k), ("seqwrite_1m", Workload::Sequential1m)] {
        if wanted(name) {
            report[name] = writes_on_both(p, &paths, name, w, same_bytes)?;
        }
    }
    if wanted("flush_4k") {
        report["flush_4k"] = flush_heavy(p)?;
    }
    if wanted("ssd_models") {
        report["ssd_models"] = on_ssd_models(p)?;
    }
    if wanted("ssd_real_time") {
        report["ssd_real_time"] = on_ssd_models_in_real_time(p)?;
    }
    if wanted("raid1_reads") {
        report["raid1_reads"] = raid1_reads(p)?;
    }
    if wanted("reads_rebuild") {
        let (degraded, rebuild) = reads_and_rebuild(p, &paths)?;
        report["degraded_reads"] = degraded;
        report["rebuild"] = rebuild;
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(report)
}

/// Workload `w` over `same_bytes` on the in-place RAID-5 and on SALSA's, round after round on
/// fresh member files; the comparison as JSON.
fn writes_on_both(p: &RaidBenchParams, paths: &[PathBuf], name: &str, w: Workload, same_bytes: u64) -> Result<Value, String> {
    let say = |m: String| eprintln!("[bench-raid] {m}");
    let mut base = Vec::new();
    let mut ours = Vec::new();
    for round in 0..p.rounds {
        for path in &paths[..p.members] {
            preallocate(path, p.member_bytes)?;
        }
        let arr = baseline_array(p)?;
        let b = run_workload(p, w, same_bytes.min(arr.capacity_bytes()), &|off, data| arr.write(off, data))?;
        say(format!(
            "{name} round {round}: in-place RAID-5 {:.1} MB/s, p99 {} us, p99.9 {} us, max {} us",
            b.mbps, b.p99_us, b.p999_us, b.max_us
        ));
        base.push(b);
        drop(arr);
        let pool = salsa_pool(p, p.volume_fraction, false)?;
        ours.push(salsa_round(p, name, round, w, &pool, &|| Ok(()), 0)?);
        pool.close().map_err(|e| e.to_string())?;
    }
    Ok(comparison(p, w, &base, &ours))
}

/// Random reads on a half-full SALSA RAID-5, healthy and with a member failed, then the
/// rebuild of that member onto the spare against the in-place array's whole-device resync;
/// the two reports (degraded reads, rebuild) as JSON.
fn reads_and_rebuild(p: &RaidBenchParams, paths: &[PathBuf]) -> Result<(Value, Value), String> {
    let say = |m: String| eprintln!("[bench-raid] {m}");
    for path in paths {
        preallocate(path, p.member_bytes)?;
    }
    let pool = salsa_pool(p, 0.5, false)?;
    let vol = pool.volume("bench").map_err(|e| e.to_string())?;
    let pages = vol.size_bytes() / 4096;
    let read = |_: usize, rng: &mut SmallRng| -> Result<u64, String> {
        let mut buf = vec![0u8; 4096];
        vol.read(rng.gen_range(0..pages) * 4096, &mut buf).map_err(|e| e.to_string())?;
        Ok(4096)
    };
    let healthy = drive(p.queue_depth, p.seconds, &read)?;
    pool.fail_member("1").map_err(|e| e.to_string())?;
    let degraded = drive(p.queue_depth, p.seconds, &read)?;
    say(format!(
        "random 4 KiB reads: healthy {:.1} MB/s, one member failed {:.1} MB/s",
        healthy.mbps, degraded.mbps
    ));
    let spare = open_direct(&paths[p.members])?;
    let seq = {
        let buf = salsa_core::AlignedBuf::zeroed(1 << 20);
        let blocks = p.member_bytes >> 20;
        let next = AtomicU64::new(0);
        drive(1, p.seconds.min(5), &|_, _| {
            spare
                .write_at(&buf, (next.fetch_add(1, Relaxed) % blocks) << 20)
                .map_err(|e| e.to_string())?;
            Ok(1 << 20)
        })?
    };
    let rebuild = pool
        .replace_member("1", spare.clone(), salsa_core::RebuildOptions::default(), &|_, _| {})
        .map_err(|e| e.to_string())?;
    drop(vol);
    pool.close().map_err(|e| e.to_string())?;
    let arr = baseline_array(p)?;
    let t = Instant::now();
    let resynced = arr.resync(1, spare.as_ref())?;
    let resync_seconds = t.elapsed().as_secs_f64();
    say(format!(
        "rebuild of a half-full pool: SALSA {} segments of {} in {:.2} s ({:.1} MB/s); in-place whole-device resync {:.2} s; spare's sequential writes {:.1} MB/s",
        rebuild.segments_rebuilt,
        rebuild.segments_total,
        rebuild.seconds,
        rebuild.bytes_written as f64 / rebuild.seconds.max(1e-9) / 1e6,
        resync_seconds,
        seq.mbps
    ));
    let degraded_reads = json!({
        "healthy_mbps": healthy.mbps, "degraded_mbps": degraded.mbps,
        "ratio": degraded.mbps / healthy.mbps.max(1e-9),
    });
    let rebuild = json!({
        "salsa_seconds": rebuild.seconds, "salsa_segments_rebuilt": rebuild.segments_rebuilt,
        "segments_total": rebuild.segments_total, "salsa_bytes_written": rebuild.bytes_written,
        "salsa_mbps": rebuild.bytes_written as f64 / rebuild.seconds.max(1e-9) / 1e6,
        "in_place_resync_seconds": resync_seconds, "in_place_resync_bytes": resynced,
        "speedup": resync_seconds / rebuild.seconds.max(1e-9),
        "spare_sequential_write_mbps": seq.mbps,
    });
    Ok((degraded_reads, rebuild))
}

/// One side of the flush-heavy comparison.
struct FlushRun {
    run: Run,
    /// Bytes written to all members per user byte.
    array_wa: f64,
    /// Bytes written to the parity buffer per user byte.
    buffer_per_user_byte: f64,
    pad_per_user_byte: f64,
}

/// 4 KiB random writes, each followed by a flush, from one writer (what a database's log
/// does): the in-place array (write, then sync every member), SALSA RAID-5 padding each flush
/// to its row, and SALSA RAID-5 keeping the partial row's parity in a parity buffer file.
fn flush_heavy(p: &RaidBenchParams) -> Result<Value, String> {
    let paths = member_paths(p);
    let say = |m: String| eprintln!("[bench-raid] {m}");
    let (mut base, mut padded, mut buffered) = (Vec::new(), Vec::new(), Vec::new());
    let qd1 = RaidBenchParams {
        queue_depth: 1,
        ..p.clone()
    };
    for round in 0..p.rounds {
        for path in &paths[..p.members] {
            preallocate(path, p.member_bytes)?;
        }
        let arr = baseline_array(p)?;
        let b = run_workload(&qd1, Workload::Random4k, arr.capacity_bytes(), &|off, data| {
            arr.write(off, data)?;
            arr.sync()
        })?;
        say(format!(
            "flush_4k round {round}: in-place RAID-5 {:.2} MB/s, p99 {} us",
            b.mbps, b.p99_us
        ));
        base.push(b);
        drop(arr);
        for with_buffer in [false, true] {
            let pool = salsa_pool(p, 1.0, with_buffer)?;
            let vol = pool.volume("bench").map_err(|e| e.to_string())?;
            let before = pool.stats();
            let r = run_workload(&qd1, Workload::Random4k, vol.size_bytes(), &|off, data| {
                vol.write(off, data).map_err(|e| e.to_string())?;
                vol.flush().map_err(|e| e.to_string())
            })?;
            let after = pool.stats();
            let user = (after.user_bytes_written - before.user_bytes_written).max(1) as f64;
            let written = |st: &salsa_core::Stats| st.members.iter().map(|m| m.bytes_written).sum::<u64>();
            let buffer = |st: &salsa_core::Stats| st.parity_buffer.as_ref().map_or(0, |b| b.bytes_written);
            let side = FlushRun {
                array_wa: (written(&after) - written(&before)) as f64 / user,
                buffer_per_user_byte: (buffer(&after) - buffer(&before)) as f64 / user,
                pad_per_user_byte: (after.pad_bytes_written - before.pad_bytes_written) as f64 / user,
                run: r,
            };
            say(format!(
                "flush_4k round {round}: SALSA raid5 {} {:.2} MB/s, p99 {} us, members written per user byte {:.2} (padding {:.2}), parity buffer {:.2}",
                if with_buffer { "with a parity buffer" } else { "padding flushes" },
                side.run.mbps,
                side.run.p99_us,
                side.array_wa,
                side.pad_per_user_byte,
                side.buffer_per_user_byte
            ));
            if with_buffer { &mut buffered } else { &mut padded }.push(side);
            drop(vol);
            pool.close().map_err(|e| e.to_string())?;
            let _ = std::fs::remove_file(parity_buffer_path(p));
        }
    }
    let m = |v: &[FlushRun], f: fn(&FlushRun) -> f64| median(v.iter().map(f).collect());
    let bm = median(base.iter().map(|r| r.mbps).collect());
    let (pm, fm) = (m(&padded, |r| r.run.mbps), m(&buffered, |r| r.run.mbps));
    Ok(json!({
        "in_place_mbps": bm,
        "in_place_p99_us": median(base.iter().map(|r| r.p99_us as f64).collect()),
        "salsa_padding_mbps": pm,
        "salsa_padding_p99_us": m(&padded, |r| r.run.p99_us as f64),
        "salsa_padding_members_written_per_user_byte": m(&padded, |r| r.array_wa),
        "salsa_padding_pad_per_user_byte": m(&padded, |r| r.pad_per_user_byte),
        "salsa_parity_buffer_mbps": fm,
        "salsa_parity_buffer_p99_us": m(&buffered, |r| r.run.p99_us as f64),
        "salsa_parity_buffer_members_written_per_user_byte": m(&buffered, |r| r.array_wa),
        "salsa_parity_buffer_pad_per_user_byte": m(&buffered, |r| r.pad_per_user_byte),
        "salsa_parity_buffer_bytes_per_user_byte": m(&buffered, |r| r.buffer_per_user_byte),
        "parity_buffer_vs_padding": fm / pm.max(1e-9),
        "parity_buffer_vs_in_place": fm / bm.max(1e-9),
    }))
}

/// Bytes of each emulated SSD of the `ssd_models` part.
const SSD_MODEL_BYTES: u64 = 256 << 20;

/// The members' modelled device time: the array is as slow as its busiest member.
fn model_time_us(devs: &[Arc<dyn Device>]) -> u64 {
    devs.iter()
        .map(|d| d.counters().iter().find(|(k, _)| k == "model_time_us").map_or(0, |(_, v)| *v))
        .max()
        .unwrap_or(0)
}

/// Fresh commodity SSD models (DRAM-less TLC, 16 KiB pages, 7% over-provisioning), in memory.
fn ssd_members(n: usize) -> Result<Vec<Arc<SsdModel>>, String> {
    (0..n)
        .map(|i| {
            let mem: Arc<dyn Device> = Arc::new(salsa_core::device::MemoryDevice::new(format!("ssd{i}"), SSD_MODEL_BYTES));
            SsdModel::new(mem, salsa_core::device::SsdParams::commodity(SSD_MODEL_BYTES))
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// The models as the pool and the baseline take them.
fn as_devices(models: &[Arc<SsdModel>]) -> Vec<Arc<dyn Device>> {
    models.iter().map(|m| m.clone() as Arc<dyn Device>).collect()
}

/// Writes `capacity` bytes once in order, 1 MiB at a time.
fn fill_once(capacity: u64, write: &WriteFn<'_>) -> Result<(), String> {
    let chunk = salsa_core::AlignedBuf::zeroed(1 << 20);
    let mut off = 0;
    while off + (1 << 20) <= capacity {
        write(off, &chunk)?;
        off += 1 << 20;
    }
    Ok(())
}

/// Writes twice `capacity` bytes in 4 KiB blocks at random (seeded), from one writer;
/// returns the bytes written.
fn random_writes_twice(capacity: u64, write: &WriteFn<'_>) -> Result<u64, String> {
    let mut rng = SmallRng::seed_from_u64(42);
    let mut buf = salsa_core::AlignedBuf::zeroed(4096);
    let n = 2 * capacity / 4096;
    for i in 0..n {
        buf[..8].copy_from_slice(&i.to_le_bytes());
        write(rng.gen_range(0..capacity / 4096) * 4096, &buf)?;
    }
    Ok(n * 4096)
}

/// 4 KiB random writes on RAID-5 arrays of emulated commodity SSDs, where the paper measured
/// its 35x: each side on fresh models, filled once, then as many random writes as twice its
/// capacity, from one writer (the models keep their own clock, so the figure is modelled
/// device time, the same on any host: user bytes over the busiest member's time).
fn on_ssd_models(p: &RaidBenchParams) -> Result<Value, String> {
    let say = |m: String| eprintln!("[bench-raid] {m}");
    // SALSA.
    let devs = as_devices(&ssd_members(p.members)?);
    let cfg = salsa_config(p);
    let opts = OpenOptions {
        read_cache_bytes: 0,
        ..OpenOptions::default()
    };
    let pool = Pool::create(devs.clone(), &cfg, &opts).map_err(|e| e.to_string())?;
    let size = pool.logical_capacity_bytes() / (1 << 20) * (1 << 20);
    let vol = pool.create_volume("bench", size, 4096).map_err(|e| e.to_string())?;
    fill_once(size, &|o, d| vol.write(o, d).map_err(|e| e.to_string()))?;
    pool.flush().map_err(|e| e.to_string())?;
    let before = pool.stats();
    let t0 = model_time_us(&devs);
    let user = random_writes_twice(size, &|o, d| vol.write(o, d).map_err(|e| e.to_string()))?;
    pool.flush().map_err(|e| e.to_string())?;
    let salsa_us = (model_time_us(&devs) - t0).max(1);
    let after = pool.stats();
    let salsa_mbps = user as f64 / salsa_us as f64;
    let members = |st: &salsa_core::Stats| st.members.iter().map(|m| m.bytes_written).sum::<u64>();
    let array_wa = (members(&after) - members(&before)) as f64 / user as f64;
    say(format!(
        "ssd models: SALSA {} {salsa_mbps:.1} MB/s modelled, members written per user byte {array_wa:.2}",
        p.salsa_array.name()
    ));
    drop(vol);
    pool.close().map_err(|e| e.to_string())?;
    // The in-place array, on as much of its space as SALSA's volume holds, and on all of it.
    let in_place = |span: Option<u64>| -> Result<(u64, f64), String> {
        let devs = as_devices(&ssd_members(p.members)?);
        let arr = InPlaceRaid5::new(devs.clone(), p.chunk_bytes);
        let capacity = span.unwrap_or(arr.capacity_bytes()) / (1 << 20) * (1 << 20);
        fill_once(capacity, &|o, d| arr.write(o, d))?;
        let t0 = model_time_us(&devs);
        let user = random_writes_twice(capacity, &|o, d| arr.write(o, d))?;
        let mbps = user as f64 / (model_time_us(&devs) - t0).max(1) as f64;
        say(format!(
            "ssd models: in-place RAID-5 over {} MiB: {mbps:.1} MB/s modelled",
            capacity >> 20
        ));
        Ok((capacity, mbps))
    };
    let (_, same_mbps) = in_place(Some(size))?;
    let (capacity, full_mbps) = in_place(None)?;
    Ok(json!({
        "ssd_model_bytes": SSD_MODEL_BYTES, "salsa_volume_bytes": size, "in_place_capacity_bytes": capacity,
        "salsa_modelled_mbps": salsa_mbps, "salsa_array_write_amplification": array_wa,
        "in_place_same_span_modelled_mbps": same_mbps, "ratio_same_span": salsa_mbps / same_mbps.max(1e-9),
        "in_place_full_modelled_mbps": full_mbps, "ratio_full": salsa_mbps / full_mbps.max(1e-9),
    }))
}

/// Seconds of the workload each side runs in real time, unmeasured, before its measured run:
/// after preconditioning at the host's speed, SALSA's pacer and GC meet the drives' real
/// speed, and the in-place array's drives their queues.
const REAL_TIME_SETTLE_SECONDS: u64 = 3;

/// The `randwrite_4k` comparison on four emulated commodity SSDs that keep real time, where
/// the paper measured its 35x and its latencies: both sides on fresh models (in memory),
/// preconditioned at the host's speed (SALSA: its volume written once and the [`warm_up`];
/// the in-place array: the same span written once and then twice over at random, one writer),
/// then [`REAL_TIME_SETTLE_SECONDS`] and the measured run in real time, so that every request
/// waits for the flash operations it causes and for those queued before it on their channels.
/// Throughput and latencies are wall-clock figures like `randwrite_4k`'s, from the same
/// drivers.
fn on_ssd_models_in_real_time(p: &RaidBenchParams) -> Result<Value, String> {
    let start = |models: &[Arc<SsdModel>]| models.iter().for_each(|m| m.set_real_time(true));
    let (cfg, opts) = (salsa_config(p), salsa_options(p));
    let (mut base, mut ours, mut span) = (Vec::new(), Vec::new(), 0);
    for round in 0..p.rounds {
        let models = ssd_members(p.members)?;
        let pool = Pool::create(as_devices(&models), &cfg, &opts).map_err(|e| e.to_string())?;
        span = volume_bytes(&pool, p.volume_fraction);
        let vol = pool.create_volume("bench", span, 4096).map_err(|e| e.to_string())?;
        fill_once(span, &|o, d| vol.write(o, d).map_err(|e| e.to_string()))?;
        drop(vol);
        pool.flush().map_err(|e| e.to_string())?;
        let before_measuring = || {
            start(&models);
            Ok(())
        };
        ours.push(salsa_round(
            p,
            "ssd_real_time",
            round,
            Workload::Random4k,
            &pool,
            &before_measuring,
            REAL_TIME_SETTLE_SECONDS,
        )?);
        pool.close().map_err(|e| e.to_string())?;
        let models = ssd_members(p.members)?;
        let arr = InPlaceRaid5::new(as_devices(&models), p.chunk_bytes);
        let write = |o, d: &[u8]| arr.write(o, d);
        fill_once(span, &write)?;
        random_writes_twice(span, &write)?;
        start(&models);
        run_workload(
            &RaidBenchParams {
                seconds: REAL_TIME_SETTLE_SECONDS,
                ..p.clone()
            },
            Workload::Random4k,
            span,
            &write,
        )?;
        let b = run_workload(p, Workload::Random4k, span, &write)?;
        eprintln!(
            "[bench-raid] ssd_real_time round {round}: in-place RAID-5 {:.1} MB/s, p99 {} us, p99.9 {} us, max {} us",
            b.mbps, b.p99_us, b.p999_us, b.max_us
        );
        base.push(b);
    }
    let mut report = comparison(p, Workload::Random4k, &base, &ours);
    report["ssd_model_bytes"] = SSD_MODEL_BYTES.into();
    report["workload_bytes"] = span.into();
    report["settle_seconds"] = REAL_TIME_SETTLE_SECONDS.into();
    Ok(report)
}

/// The size of each disk model of [`raid1_reads`], and the bytes its reads cover.
const RAID1_DISK_BYTES: u64 = 1 << 30;
const RAID1_READ_SPAN_BYTES: u64 = 256 << 20;

/// A disk model ([`TimedDisk`], default timing) over memory, not yet in real time.
fn disk_model(name: &str) -> Arc<TimedDisk> {
    let mem: Arc<dyn Device> = Arc::new(MemoryDevice::new(name.to_string(), RAID1_DISK_BYTES));
    Arc::new(TimedDisk::new(mem, DiskTiming::default()))
}

/// Reads into the buffer at the offset, on either side.
type ReadFn<'a> = dyn Fn(u64, &mut [u8]) -> Result<(), String> + Sync + 'a;

/// Random 4 KiB reads of `span` bytes by `read`, from `p.queue_depth` threads for `p.seconds`.
fn random_reads(p: &RaidBenchParams, span: u64, read: &ReadFn<'_>) -> Result<Run, String> {
    drive(p.queue_depth, p.seconds, &|_, rng: &mut SmallRng| {
        let mut buf = salsa_core::AlignedBuf::zeroed(4096);
        read(rng.gen_range(0..span / 4096) * 4096, &mut buf)?;
        Ok(4096)
    })
}

/// RAID-1 random reads on disk models in real time, as MD's RAID-1 is judged: SALSA's RAID-1
/// of two disk models, whose reads go to either mirror (the nearer head, the shorter queue),
/// against one such disk read directly, over the same bytes (written once, sequentially,
/// before the clock starts), `queue_depth` readers, alternating rounds. Reports reads per
/// second, their ratio (two mirrors can serve up to twice one disk) and what each mirror read.
fn raid1_reads(p: &RaidBenchParams) -> Result<Value, String> {
    let say = |m: String| eprintln!("[bench-raid] {m}");
    let span = RAID1_READ_SPAN_BYTES;
    let (mut base, mut ours, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..p.rounds {
        let disk = disk_model("disk");
        fill_once(span, &|o, d| disk.write_at(d, o).map_err(|e| e.to_string()))?;
        disk.set_real_time(true);
        let b = random_reads(p, span, &|o, buf| disk.read_at(buf, o).map_err(|e| e.to_string()))?;
        let mirrors = [disk_model("mirror0"), disk_model("mirror1")];
        let devs: Vec<Arc<dyn Device>> = mirrors.iter().map(|m| m.clone() as Arc<dyn Device>).collect();
        let cfg = PoolConfig {
            array: ArrayKind::Raid1,
            ..PoolConfig::default()
        };
        let opts = OpenOptions {
            read_cache_bytes: 0,
            ..OpenOptions::default()
        };
        let pool = Pool::create(devs, &cfg, &opts).map_err(|e| e.to_string())?;
        let vol = pool.create_volume("bench", span, 4096).map_err(|e| e.to_string())?;
        fill_once(span, &|o, d| vol.write(o, d).map_err(|e| e.to_string()))?;
        pool.flush().map_err(|e| e.to_string())?;
        let before: Vec<u64> = pool.stats().members.iter().map(|m| m.bytes_read).collect();
        mirrors.iter().for_each(|m| m.set_real_time(true));
        let o = random_reads(p, span, &|o, buf| vol.read(o, buf).map_err(|e| e.to_string()))?;
        let read: Vec<u64> = pool.stats().members.iter().zip(&before).map(|(m, b)| m.bytes_read - b).collect();
        let total = read.iter().sum::<u64>().max(1);
        let share: Vec<f64> = read.iter().map(|r| *r as f64 / total as f64).collect();
        say(format!(
            "raid1_reads round {round}: one disk {:.0} reads/s (p99 {} us), SALSA RAID-1 of two {:.0} reads/s (p99 {} us), mirrors' shares {share:.2?}",
            b.mbps * 1e6 / 4096.0,
            b.p99_us,
            o.mbps * 1e6 / 4096.0,
            o.p99_us
        ));
        drop(vol);
        pool.close().map_err(|e| e.to_string())?;
        base.push(b);
        ours.push(o);
        shares.push(share);
    }
    let iops = |runs: &[Run]| median(runs.iter().map(|r| r.mbps * 1e6 / 4096.0).collect());
    let (one, two) = (iops(&base), iops(&ours));
    Ok(json!({
        "disk_model": "hdd (12 ms positioning, 150 MB/s), real time", "span_bytes": span,
        "one_disk_reads_per_s": one, "raid1_reads_per_s": two, "ratio": two / one.max(1e-9),
        "one_disk_p99_us": base.iter().map(|r| r.p99_us).collect::<Vec<_>>(),
        "raid1_p99_us": ours.iter().map(|r| r.p99_us).collect::<Vec<_>>(),
        "mirror_read_shares": shares,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use salsa_core::device::MemoryDevice;

    const CHUNK: u64 = 16 << 10;

    /// The baseline's logical bytes, read from the members where its layout puts them.
    fn read_back(a: &InPlaceRaid5, len: u64) -> Vec<u8> {
        let row_bytes = (a.n() - 1) * CHUNK;
        let mut out = vec![0u8; len as usize];
        for (i, chunk) in out.chunks_mut(CHUNK as usize).enumerate() {
            let pos = i as u64 * CHUNK;
            let (row, unit) = (pos / row_bytes, pos % row_bytes / CHUNK);
            let mut buf = salsa_core::AlignedBuf::zeroed(CHUNK as usize);
            a.devs[a.data_member(row, unit)].read_at(&mut buf, row * CHUNK).unwrap();
            chunk.copy_from_slice(&buf[..chunk.len()]);
        }
        out
    }

    /// Whether every row's parity unit is the XOR of its data units.
    fn parity_holds(a: &InPlaceRaid5) -> bool {
        (0..a.rows).all(|row| {
            let mut xor = vec![0u8; CHUNK as usize];
            for m in 0..a.n() as usize {
                let mut buf = salsa_core::AlignedBuf::zeroed(CHUNK as usize);
                a.devs[m].read_at(&mut buf, row * CHUNK).unwrap();
                xor.iter_mut().zip(buf.iter()).for_each(|(x, y)| *x ^= *y);
            }
            xor.iter().all(|&b| b == 0)
        })
    }

    /// Random 4 KiB writes (read-modify-write, from several threads as the benchmark drives
    /// them), whole rows and writes across rows leave every byte where a plain buffer says and
    /// every parity right; a resync rebuilds a lost member exactly.
    fn check_baseline(a: &InPlaceRaid5) {
        let len = a.capacity_bytes();
        let model = Mutex::new(vec![0u8; len as usize]);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let model = &model;
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(t);
                    for _ in 0..300 {
                        // Each thread its own quarter, so that the model's order is the array's.
                        let quarter = len / 4;
                        let size = [4096u64, 3 * CHUNK, 2 * 3 * CHUNK + 8192][rng.gen_range(0..3)];
                        let at = t * quarter + rng.gen_range(0..(quarter - size) / 4096) * 4096;
                        // Aligned, as O_DIRECT wants the benchmark's buffers.
                        let mut data = salsa_core::AlignedBuf::zeroed(size as usize);
                        rng.fill(&mut data[..]);
                        a.write(at, &data).unwrap();
                        model.lock()[at as usize..(at + size) as usize].copy_from_slice(&data);
                    }
                });
            }
        });
        assert!(read_back(a, len) == *model.lock(), "a byte is not where it was written");
        assert!(parity_holds(a), "a parity is not the XOR of its row");
        // Through the device interface (what `salsa serve --raw --in-place-raid5` serves):
        // reads across units and rows find what was written, a write through it lands where
        // reads find it with the parity kept, and an access past the end is refused.
        let dev: &dyn Device = a;
        assert_eq!(dev.size_bytes(), len);
        let mut rng = SmallRng::seed_from_u64(99);
        for _ in 0..200 {
            let size = rng.gen_range(1..=(3 * CHUNK as usize + 8192) / 4096) * 4096;
            let at = rng.gen_range(0..=(len - size as u64) / 4096) * 4096;
            let mut buf = salsa_core::AlignedBuf::zeroed(size);
            dev.read_at(&mut buf, at).unwrap();
            assert!(buf[..] == model.lock()[at as usize..at as usize + size], "read of {size} at {at}");
        }
        let mut data = salsa_core::AlignedBuf::zeroed(2 * CHUNK as usize);
        rng.fill(&mut data[..]);
        let at = CHUNK + 4096;
        dev.write_at(&data, at).unwrap();
        model.lock()[at as usize..at as usize + data.len()].copy_from_slice(&data);
        assert!(
            read_back(a, len) == *model.lock(),
            "a write through the device is not where reads find it"
        );
        assert!(parity_holds(a), "a write through the device left a parity wrong");
        let mut page = salsa_core::AlignedBuf::zeroed(4096);
        assert!(dev.read_at(&mut page, len).is_err(), "a read past the end is refused");
        assert!(dev.write_at(&page, len - 2048).is_err(), "a write past the end is refused");
        let spare: Arc<dyn Device> = Arc::new(MemoryDevice::new("spare", 64 * CHUNK));
        a.resync(2, spare.as_ref()).unwrap();
        let mut want = salsa_core::AlignedBuf::zeroed((64 * CHUNK) as usize);
        let mut got = salsa_core::AlignedBuf::zeroed((64 * CHUNK) as usize);
        a.devs[2].read_at(&mut want, 0).unwrap();
        spare.read_at(&mut got, 0).unwrap();
        assert!(*want == *got, "the resync did not rebuild the lost member");
    }

    #[test]
    fn the_in_place_baseline_keeps_its_data_and_parity_right_on_models() {
        let devs: Vec<Arc<dyn Device>> = (0..4)
            .map(|i| Arc::new(MemoryDevice::new(format!("m{i}"), 64 * CHUNK)) as Arc<dyn Device>)
            .collect();
        check_baseline(&InPlaceRaid5::new(devs, CHUNK));
    }

    /// The same on O_DIRECT files, whose pairs of I/O go through io_uring.
    #[test]
    fn the_in_place_baseline_keeps_its_data_and_parity_right_on_files() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let files: Vec<Arc<FileDevice>> = (0..4)
            .map(|i| {
                let path = dir.join(format!("m{i}.img"));
                std::fs::File::create(&path).unwrap().set_len(64 * CHUNK).unwrap();
                Arc::new(super::super::raw::open_direct(&path).unwrap())
            })
            .collect();
        let a = InPlaceRaid5::on_files(files, CHUNK);
        assert!(a.fds.iter().all(|f| f.is_some()));
        check_baseline(&a);
        drop(a);
    }
}
