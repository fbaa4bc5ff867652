//! A model of a commodity SSD: a page-mapped flash translation layer with greedy garbage
//! collection, a small write cache, a small mapping cache (DRAM-less drives keep most of their
//! map in flash), and time modelled per NAND operation over several channels.
//!
//! Owns: the FTL state (logical-to-physical map by mapping unit, valid counts per erase block,
//! free blocks per channel), the counters (host writes, NAND programs and reads, block erases),
//! and the model clock. The data itself is kept by logical address on a backing device (memory
//! or a file), so SALSA runs on the model for real; the FTL decides only what the flash would
//! have done and how long it would have taken.
//!
//! What makes a drive like this amplify writes, and what the model therefore keeps:
//! - the mapping unit is the NAND page (16 KiB by default): a host write that covers a unit
//!   only in part is a read-modify-write of the unit inside the drive;
//! - greedy GC over erase blocks: every valid unit of a victim is read and programmed again;
//! - the map cache holds a fraction of the map (translation pages of one NAND page each); a
//!   miss reads a translation page, and evicting a dirty one programs it;
//! - the write cache gathers units until they are complete or evicted (so sequential writes
//!   never pay the read-modify-write), and is written out on a flush.
//!
//! Time: each NAND operation occupies its channel for its latency (the channel of a block is
//! `block % channels`; programs rotate over the channels). The model clock is the busiest
//! channel's total, i.e. the time the drive needs when the host keeps it saturated (deep
//! queues). Host transfer time is not modelled.
//!
//! Real time ([`SsdModel::set_real_time`]): the same operations also occupy their channels on
//! the wall clock, first come first served, and each request returns when its last operation
//! ends, so that a host sees the drive's latencies and queueing, the tail included (a write
//! that evicts a unit behind the GC's erase waits for it). A request's operations start
//! together on their channels (as the saturated clock assumes), one after the other on one
//! channel; a request that needs no NAND operation (a write the cache absorbs, a read from
//! it) returns at once. A flush returns when the programs of what the cache held end (every
//! write that returned before it either was programmed before it returned or was in the
//! cache). Off by default: a model is filled or preconditioned at the host's speed, then
//! timed.

use crate::device::{modelled_io, Device, StorageType};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

const UNMAPPED: u32 = u32::MAX;

/// The longest a NAND operation may take (a minute): the clocks count nanoseconds in a u64.
const LATENCY_US_MAX: u64 = 60_000_000;

/// Parameters of the model (see the module doc for the defaults' rationale).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SsdParams {
    /// Capacity the host sees.
    pub capacity_bytes: u64,
    /// Flash beyond the capacity, in percent of the capacity.
    pub over_provisioning_percent: f64,
    /// Mapping unit and NAND page.
    pub unit_bytes: u64,
    pub erase_block_bytes: u64,
    pub channels: u32,
    pub write_cache_bytes: u64,
    /// Bytes of map the drive caches; `None` keeps the whole map in DRAM.
    pub map_cache_bytes: Option<u64>,
    pub read_us: u64,
    pub program_us: u64,
    pub erase_us: u64,
}

impl SsdParams {
    /// A DRAM-less TLC drive of `capacity_bytes`: 16 KiB pages, 8 channels, 7%
    /// over-provisioning, 1 MiB write cache, a map cache of 1/8 of the map (at least four
    /// translation pages). Erase blocks are 4 MiB, scaled down for small models so that the
    /// drive has at least 2048 of them (a real drive has hundreds of thousands; with few, the
    /// blocks held open per channel would eat the over-provisioning).
    pub fn commodity(capacity_bytes: u64) -> SsdParams {
        let unit = 16 << 10;
        SsdParams {
            capacity_bytes,
            over_provisioning_percent: 7.0,
            unit_bytes: unit,
            erase_block_bytes: (capacity_bytes / 2048).clamp(256 << 10, 4 << 20).next_power_of_two().min(4 << 20),
            channels: 8,
            write_cache_bytes: 1 << 20,
            map_cache_bytes: Some(Self::default_map_cache_bytes(capacity_bytes, unit)),
            read_us: 60,
            program_us: 700,
            erase_us: 3500,
        }
    }

    /// 1/8 of the map (4 bytes per unit), at least four translation pages of one unit each.
    pub fn default_map_cache_bytes(capacity_bytes: u64, unit_bytes: u64) -> u64 {
        (capacity_bytes / unit_bytes * 4 / 8).max(4 * unit_bytes)
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.unit_bytes < 512 || !self.unit_bytes.is_power_of_two() {
            return bad(format!(
                "SSD model: unit {} must be a power of two of at least 512 bytes",
                self.unit_bytes
            ));
        }
        if self.erase_block_bytes < self.unit_bytes || !self.erase_block_bytes.is_multiple_of(self.unit_bytes) {
            return bad("SSD model: the erase block must be a multiple of the unit".into());
        }
        if self.capacity_bytes == 0 || !self.capacity_bytes.is_multiple_of(self.unit_bytes) {
            return bad("SSD model: capacity must be a positive multiple of the unit".into());
        }
        if self.capacity_bytes / self.unit_bytes >= UNMAPPED as u64 / 2 {
            return bad("SSD model: capacity too large for the model's 32-bit map".into());
        }
        if !(0.0..=400.0).contains(&self.over_provisioning_percent) || self.channels == 0 || self.channels > 256 {
            return bad("SSD model: over-provisioning must be 0-400% and channels 1-256".into());
        }
        if [self.read_us, self.program_us, self.erase_us].iter().any(|&us| us > LATENCY_US_MAX) {
            return bad(format!(
                "SSD model: read, program and erase times must be at most {LATENCY_US_MAX} us"
            ));
        }
        Ok(())
    }
}

#[derive(Default, Clone, Copy)]
struct Counters {
    host_writes: u64,
    host_write_bytes: u64,
    host_flushes: u64,
    host_read_bytes: u64,
    program_units: u64,
    map_program_units: u64,
    read_units: u64,
    map_read_units: u64,
    erases: u64,
    rmw_units: u64,
    gc_moved_units: u64,
    discarded_units: u64,
}

/// The wall clock of a model that keeps real time, in nanoseconds since `base`.
struct RealTime {
    base: Instant,
    /// When each channel finishes the operations scheduled on it so far.
    channel_free_ns: Vec<u64>,
    /// The request being modelled: when it was issued and when its last operation ends.
    request_start_ns: u64,
    request_end_ns: u64,
}

impl RealTime {
    fn ns_since_base(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    fn instant(&self, ns: u64) -> Instant {
        let at = Duration::from_nanos(ns);
        self.base.checked_add(at).unwrap_or(self.base)
    }
}

struct Ftl {
    p: SsdParams,
    units_per_block: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    /// Next unit to program in each block.
    written: Vec<u32>,
    free: Vec<VecDeque<u32>>,
    free_total: u32,
    open: Vec<Option<u32>>,
    next_channel: usize,
    /// Write cache: unit -> bitmap of 512-byte sectors present; FIFO order of insertion.
    cache: HashMap<u32, Vec<bool>>,
    cache_order: VecDeque<u32>,
    cache_units: usize,
    /// Map cache: translation page -> (last use, dirty); LRU order by last use.
    map_cache: HashMap<u32, (u64, bool)>,
    map_lru: BTreeMap<u64, u32>,
    map_cache_pages: Option<usize>,
    entries_per_translation_page: u64,
    tick: u64,
    busy_ns: Vec<u64>,
    real_time: Option<RealTime>,
    c: Counters,
}

impl Ftl {
    fn new(p: SsdParams) -> Ftl {
        let units = p.capacity_bytes / p.unit_bytes;
        let upb = (p.erase_block_bytes / p.unit_bytes) as u32;
        let physical_units = (units as f64 * (1.0 + p.over_provisioning_percent / 100.0)).ceil() as u64;
        // Enough blocks for the data plus one open block per channel and the GC's headroom.
        let blocks = (physical_units.div_ceil(upb as u64) as u32).max((units.div_ceil(upb as u64) as u32) + 2 * p.channels + 2);
        let mut free = vec![VecDeque::new(); p.channels as usize];
        for b in 0..blocks {
            free[(b % p.channels) as usize].push_back(b);
        }
        let entries = (p.unit_bytes / 4).max(1);
        Ftl {
            p,
            units_per_block: upb,
            l2p: vec![UNMAPPED; units as usize],
            p2l: vec![UNMAPPED; blocks as usize * upb as usize],
            valid: vec![0; blocks as usize],
            written: vec![0; blocks as usize],
            free,
            free_total: blocks,
            open: vec![None; p.channels as usize],
            next_channel: 0,
            cache: HashMap::new(),
            cache_order: VecDeque::new(),
            cache_units: (p.write_cache_bytes / p.unit_bytes) as usize,
            map_cache: HashMap::new(),
            map_lru: BTreeMap::new(),
            map_cache_pages: p.map_cache_bytes.map(|b| (b / p.unit_bytes).max(1) as usize),
            entries_per_translation_page: entries,
            tick: 0,
            busy_ns: vec![0; p.channels as usize],
            real_time: None,
            c: Counters::default(),
        }
    }

    fn channel_of(&self, block: u32) -> usize {
        (block % self.p.channels) as usize
    }

    fn occupy(&mut self, channel: usize, us: u64) {
        // (Latencies are at most LATENCY_US_MAX: a u64 of nanoseconds lasts centuries of them.)
        self.busy_ns[channel] = self.busy_ns[channel].saturating_add(us * 1000);
        if let Some(rt) = &mut self.real_time {
            let end = rt.channel_free_ns[channel].max(rt.request_start_ns).saturating_add(us * 1000);
            rt.channel_free_ns[channel] = end;
            rt.request_end_ns = rt.request_end_ns.max(end);
        }
    }

    /// Runs one host request's model work; in real time, returns when it completes.
    fn request(&mut self, issued: Instant, work: impl FnOnce(&mut Ftl)) -> Option<Instant> {
        if let Some(rt) = &mut self.real_time {
            rt.request_start_ns = rt.ns_since_base(issued);
            rt.request_end_ns = rt.request_start_ns;
        }
        work(self);
        let rt = self.real_time.as_ref()?;
        Some(rt.instant(rt.request_end_ns))
    }

    fn sectors_per_unit(&self) -> usize {
        (self.p.unit_bytes / 512) as usize
    }

    /// Looks up (and with `dirty`, updates) the map entry of `unit` through the map cache.
    fn map_access(&mut self, unit: u32, dirty: bool) {
        let Some(capacity) = self.map_cache_pages else { return };
        let tp = (unit as u64 / self.entries_per_translation_page) as u32;
        self.tick += 1;
        let tick = self.tick;
        if let Some((last, d)) = self.map_cache.get_mut(&tp) {
            self.map_lru.remove(last);
            *last = tick;
            *d |= dirty;
            self.map_lru.insert(tick, tp);
            return;
        }
        // Miss: read the translation page from flash.
        self.c.map_read_units += 1;
        let ch = tp as usize % self.busy_ns.len();
        self.occupy(ch, self.p.read_us);
        self.map_cache.insert(tp, (tick, dirty));
        self.map_lru.insert(tick, tp);
        while self.map_cache.len() > capacity {
            let Some((&oldest, &victim)) = self.map_lru.iter().next() else {
                break;
            };
            self.map_lru.remove(&oldest);
            if let Some((_, true)) = self.map_cache.remove(&victim) {
                // Translation pages live in their own blocks, rewritten so often that they are
                // nearly all invalid when erased: one erase per block of them.
                self.c.map_program_units += 1;
                let ch = victim as usize % self.busy_ns.len();
                self.occupy(ch, self.p.program_us);
                if self.c.map_program_units.is_multiple_of(self.units_per_block as u64) {
                    self.c.erases += 1;
                    self.occupy(ch, self.p.erase_us);
                }
            }
        }
    }

    /// Takes a free block on `channel` (or any channel).
    fn take_free(&mut self, channel: usize) -> u32 {
        let ch = if self.free[channel].is_empty() {
            (0..self.free.len()).max_by_key(|&c| self.free[c].len()).unwrap_or(channel)
        } else {
            channel
        };
        let b = self.free[ch].pop_front().expect("the GC keeps free blocks");
        self.free_total -= 1;
        b
    }

    /// Programs `unit` at the write frontier (rotating over the channels).
    fn program(&mut self, unit: u32, gc: bool) {
        if !gc {
            self.collect_garbage();
        }
        let ch = self.next_channel;
        self.next_channel = (self.next_channel + 1) % self.open.len();
        let block = match self.open[ch] {
            Some(b) => b,
            None => {
                let b = self.take_free(ch);
                self.open[ch] = Some(b);
                b
            }
        };
        let ppn = block * self.units_per_block + self.written[block as usize];
        self.written[block as usize] += 1;
        if self.written[block as usize] == self.units_per_block {
            self.open[ch] = None;
        }
        let old = self.l2p[unit as usize];
        if old != UNMAPPED {
            self.p2l[old as usize] = UNMAPPED;
            self.valid[(old / self.units_per_block) as usize] -= 1;
        }
        self.l2p[unit as usize] = ppn;
        self.p2l[ppn as usize] = unit;
        self.valid[block as usize] += 1;
        self.c.program_units += 1;
        if gc {
            self.c.gc_moved_units += 1;
        }
        let bch = self.channel_of(block);
        self.occupy(bch, self.p.program_us);
        // The GC batches its map updates per translation page (see collect_garbage).
        if !gc {
            self.map_access(unit, true);
        }
    }

    /// Greedy GC: while free blocks run short, clean the closed block with the fewest valid
    /// units.
    fn collect_garbage(&mut self) {
        let reserve = self.p.channels + 2;
        while self.free_total < reserve {
            let open: Vec<u32> = self.open.iter().flatten().copied().collect();
            let victim = (0..self.valid.len() as u32)
                .filter(|&b| self.written[b as usize] == self.units_per_block && !open.contains(&b))
                .min_by_key(|&b| self.valid[b as usize]);
            // A victim without invalid units frees nothing (the map cannot be that full, as
            // flash exceeds the capacity, but never loop on it).
            let Some(victim) = victim.filter(|&b| self.valid[b as usize] < self.units_per_block) else {
                return;
            };
            let vch = self.channel_of(victim);
            let base = victim * self.units_per_block;
            let mut pages = Vec::new();
            for ppn in base..base + self.units_per_block {
                let unit = self.p2l[ppn as usize];
                if unit != UNMAPPED {
                    self.c.read_units += 1;
                    self.occupy(vch, self.p.read_us);
                    self.program(unit, true);
                    pages.push(unit as u64 / self.entries_per_translation_page);
                }
            }
            // One map update per translation page the moved units belong to (DFTL's batching).
            pages.sort_unstable();
            pages.dedup();
            for tp in pages {
                self.map_access((tp * self.entries_per_translation_page) as u32, true);
            }
            assert_eq!(self.valid[victim as usize], 0, "SSD model: GC left valid units in block {victim}");
            self.written[victim as usize] = 0;
            self.c.erases += 1;
            self.occupy(vch, self.p.erase_us);
            self.free[vch].push_back(victim);
            self.free_total += 1;
        }
    }

    /// Writes a unit out of the write cache: a unit not wholly present is read first, when the
    /// flash holds an older copy of it.
    fn write_out(&mut self, unit: u32, complete: bool) {
        if !complete && self.l2p[unit as usize] != UNMAPPED {
            self.c.rmw_units += 1;
            self.read_unit(unit);
        }
        self.program(unit, false);
    }

    fn read_unit(&mut self, unit: u32) {
        self.map_access(unit, false);
        let ppn = self.l2p[unit as usize];
        if ppn != UNMAPPED {
            self.c.read_units += 1;
            let ch = self.channel_of(ppn / self.units_per_block);
            self.occupy(ch, self.p.read_us);
        }
    }

    fn host_write(&mut self, offset: u64, len: u64) {
        self.c.host_writes += 1;
        self.c.host_write_bytes += len;
        let ub = self.p.unit_bytes;
        let spu = self.sectors_per_unit();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let unit = (at / ub) as u32;
            let unit_end = ((at / ub) + 1) * ub;
            let piece_end = unit_end.min(end);
            let (s0, s1) = (((at % ub) / 512) as usize, (((piece_end - 1) % ub) / 512 + 1) as usize);
            if self.cache_units == 0 {
                let complete = s0 == 0 && s1 == spu;
                self.write_out(unit, complete);
            } else {
                let present = self.cache.entry(unit).or_insert_with(|| {
                    self.cache_order.push_back(unit);
                    vec![false; spu]
                });
                present[s0..s1].iter_mut().for_each(|x| *x = true);
                while self.cache.len() > self.cache_units {
                    self.evict_one();
                }
            }
            at = piece_end;
        }
    }

    /// TRIM of the units wholly inside the range (a partial unit is left as it is, as drives
    /// do): they leave the write cache and the map, so the GC never moves them again. One map
    /// update per translation page touched.
    fn discard(&mut self, offset: u64, len: u64) {
        let ub = self.p.unit_bytes;
        let (first, end) = (offset.div_ceil(ub), (offset + len) / ub);
        let mut pages = Vec::new();
        for unit in first..end {
            let unit = unit as u32;
            self.cache.remove(&unit);
            let old = self.l2p[unit as usize];
            if old != UNMAPPED {
                self.p2l[old as usize] = UNMAPPED;
                self.valid[(old / self.units_per_block) as usize] -= 1;
                self.l2p[unit as usize] = UNMAPPED;
                self.c.discarded_units += 1;
                pages.push(unit as u64 / self.entries_per_translation_page);
            }
        }
        pages.dedup();
        for tp in pages {
            self.map_access((tp * self.entries_per_translation_page) as u32, true);
        }
    }

    fn evict_one(&mut self) {
        let Some(unit) = self.cache_order.pop_front() else { return };
        if let Some(present) = self.cache.remove(&unit) {
            let complete = present.iter().all(|&x| x);
            self.write_out(unit, complete);
        }
    }

    fn flush(&mut self) {
        while !self.cache.is_empty() {
            self.evict_one();
        }
    }

    fn host_read(&mut self, offset: u64, len: u64) {
        self.c.host_read_bytes += len;
        let ub = self.p.unit_bytes;
        let first = offset / ub;
        let last = (offset + len - 1) / ub;
        for unit in first..=last {
            if !self.cache.contains_key(&(unit as u32)) {
                self.read_unit(unit as u32);
            }
        }
    }

    fn model_time_us(&self) -> u64 {
        self.busy_ns.iter().copied().max().unwrap_or(0) / 1000
    }
}

/// The SSD model as a device.
pub struct SsdModel {
    name: String,
    backing: Arc<dyn Device>,
    params: SsdParams,
    ftl: Mutex<Ftl>,
}

impl SsdModel {
    /// A fresh (low-level formatted: every unit unmapped) drive whose data lives on `backing`,
    /// which must hold at least the capacity.
    pub fn new(backing: Arc<dyn Device>, params: SsdParams) -> io::Result<SsdModel> {
        params.validate()?;
        if backing.size_bytes() < params.capacity_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "SSD model: {} holds {} bytes, less than the capacity {}",
                    backing.name(),
                    backing.size_bytes(),
                    params.capacity_bytes
                ),
            ));
        }
        Ok(SsdModel {
            name: format!("ssd:{}", backing.name()),
            backing,
            params,
            ftl: Mutex::new(Ftl::new(params)),
        })
    }

    pub fn params(&self) -> SsdParams {
        self.params
    }

    /// Brings the first `bytes` of the drive (rounded down to whole units) to the steady state
    /// the SALSA paper measures from (section V-A): written once in order, then once more in
    /// a uniformly random order of units (`seed` picks it), then flushed. Only the FTL is
    /// written, at the host's speed and off the real-time clock: what those writes would
    /// have held is garbage nobody reads, and the data already on the backing device (a pool
    /// formatted on it) is left as it is. The counters and the model clock count the work, as
    /// the drive's SMART counters would; a benchmark takes the difference over its phase.
    pub fn precondition(&self, bytes: u64, seed: u64) {
        let mut f = self.ftl.lock();
        let unit = self.params.unit_bytes;
        let units = bytes.min(self.params.capacity_bytes) / unit;
        for u in 0..units {
            f.host_write(u * unit, unit);
        }
        // xorshift64*: a fixed, seedable order without a dependency.
        let mut x = seed | 1;
        for _ in 0..units {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let u = x.wrapping_mul(0x2545_f491_4f6c_dd1d) % units;
            f.host_write(u * unit, unit);
        }
        f.flush();
    }

    /// Keeps real time from now on (`true`: see the module doc; every channel starts idle) or
    /// stops (`false`: requests return at the host's speed again).
    pub fn set_real_time(&self, on: bool) {
        self.ftl.lock().real_time = on.then(|| RealTime {
            base: Instant::now(),
            channel_free_ns: vec![0; self.params.channels as usize],
            request_start_ns: 0,
            request_end_ns: 0,
        });
    }

    /// Models one host request issued at `issued`, and in real time returns when it completes.
    fn request(&self, issued: Instant, work: impl FnOnce(&mut Ftl)) {
        let done = self.ftl.lock().request(issued, work);
        if let Some(at) = done {
            crate::device::complete_at(at);
        }
    }
}

impl Device for SsdModel {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.params.capacity_bytes
    }
    fn storage_type(&self) -> StorageType {
        StorageType::Flash
    }
    fn alignment_bytes(&self) -> usize {
        self.backing.alignment_bytes()
    }
    /// A stripe of one erase block on every channel, and at least 8 MiB: a host that
    /// interleaves a few sequential streams in writes of about 1 MiB (SALSA's records) fills
    /// whole blocks with data that dies together only when each stream writes that much in
    /// order. Measured on this model: 2 MiB segments make the drive's internal WA 7 to 10,
    /// 8 MiB and more keep it at 1.0 (docs/BENCHMARKS.md).
    fn preferred_alignment_bytes(&self) -> u64 {
        (self.params.erase_block_bytes * self.params.channels as u64).max(8 << 20)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (len, issued) = (buf.len(), Instant::now());
        modelled_io(
            self.params.capacity_bytes,
            offset,
            len,
            || self.backing.read_at(buf, offset),
            |at, n| self.request(issued, |f| f.host_read(at, n)),
        )
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let issued = Instant::now();
        modelled_io(
            self.params.capacity_bytes,
            offset,
            buf.len(),
            || self.backing.write_at(buf, offset),
            |at, n| self.request(issued, |f| f.host_write(at, n)),
        )
    }
    fn sync(&self) -> io::Result<()> {
        self.request(Instant::now(), |f| {
            f.c.host_flushes += 1;
            f.flush()
        });
        self.backing.sync()
    }
    /// Unmaps the whole units of the range in the FTL, and discards the range on the backing
    /// device too (a file gets its space back).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::device::check_range(self.params.capacity_bytes, offset, usize::try_from(len).map_err(io::Error::other)?)?;
        self.backing.discard(offset, len)?;
        self.request(Instant::now(), |f| f.discard(offset, len));
        Ok(())
    }
    fn counters(&self) -> Vec<(String, u64)> {
        let f = self.ftl.lock();
        let ub = self.params.unit_bytes;
        let c = f.c;
        vec![
            ("host_writes".into(), c.host_writes),
            ("host_write_bytes".into(), c.host_write_bytes),
            ("host_flushes".into(), c.host_flushes),
            ("host_read_bytes".into(), c.host_read_bytes),
            ("nand_program_bytes".into(), (c.program_units + c.map_program_units) * ub),
            ("nand_data_program_bytes".into(), c.program_units * ub),
            ("nand_map_program_bytes".into(), c.map_program_units * ub),
            ("nand_read_bytes".into(), (c.read_units + c.map_read_units) * ub),
            ("block_erases".into(), c.erases),
            ("read_modify_write_units".into(), c.rmw_units),
            ("gc_moved_bytes".into(), c.gc_moved_units * ub),
            ("discarded_bytes".into(), c.discarded_units * ub),
            ("model_time_us".into(), f.model_time_us()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small drive of 2 channels without a write cache or map cache, so that each unit
    /// written is programmed at once and nothing else is.
    fn uncached() -> Ftl {
        let mut p = SsdParams::commodity(64 << 20);
        p.channels = 2;
        p.write_cache_bytes = 0;
        p.map_cache_bytes = None;
        Ftl::new(p)
    }

    fn start_real_time(f: &mut Ftl) -> Instant {
        let base = Instant::now();
        f.real_time = Some(RealTime {
            base,
            channel_free_ns: vec![0; f.p.channels as usize],
            request_start_ns: 0,
            request_end_ns: 0,
        });
        base
    }

    fn us(base: Instant, at: Option<Instant>) -> u128 {
        at.expect("real time").duration_since(base).as_micros()
    }

    #[test]
    fn real_time_queues_each_channel_and_overlaps_channels() {
        let mut f = uncached();
        let unit = f.p.unit_bytes;
        assert_eq!(f.request(Instant::now(), |f| f.host_write(0, unit)), None, "not timed until asked");
        let base = start_real_time(&mut f);
        // Programs rotate over the two channels: the first two run side by side, the third
        // waits for the first channel.
        let ends: Vec<u128> = (0..3)
            .map(|i| us(base, f.request(base, |f| f.host_write(i * unit, unit))))
            .collect();
        assert_eq!(ends, vec![700, 700, 1400]);
        // A request issued after a channel went idle starts when it is issued.
        let later = base + Duration::from_millis(10);
        assert_eq!(us(base, f.request(later, |f| f.host_write(0, unit))), 10_700);
        // A read of a unit never written needs no NAND operation: it completes when issued.
        assert_eq!(us(base, f.request(later, |f| f.host_read(32 * unit, 4096))), 10_000);
        // A flush of a drive without a cache programs nothing: it completes when issued.
        assert_eq!(us(base, f.request(later, Ftl::flush)), 10_000);
    }

    #[test]
    fn a_write_the_cache_absorbs_returns_at_once_and_the_flush_waits_for_its_programs() {
        let mut p = SsdParams::commodity(64 << 20);
        p.channels = 2;
        p.map_cache_bytes = None;
        let mut f = Ftl::new(p);
        let base = start_real_time(&mut f);
        assert_eq!(us(base, f.request(base, |f| f.host_write(0, 4096))), 0);
        assert_eq!(us(base, f.request(base, |f| f.host_write(p.unit_bytes, p.unit_bytes))), 0);
        // The flush programs both units, one on each channel.
        assert_eq!(us(base, f.request(base, Ftl::flush)), 700);
    }

    #[test]
    fn preconditioning_maps_the_range_and_leaves_the_drive_amplifying_random_writes() {
        let capacity = 64 << 20;
        let mut p = SsdParams::commodity(capacity);
        p.map_cache_bytes = None;
        let backing = Arc::new(crate::device::MemoryDevice::new("m", capacity));
        backing.write_at(&[7u8; 4096], 0).unwrap();
        let model = SsdModel::new(backing, p).unwrap();
        let count = |name: &str| model.counters().iter().find(|(n, _)| n == name).map(|&(_, v)| v).unwrap();
        let part = capacity / 5 * 4 / p.unit_bytes * p.unit_bytes;
        model.precondition(part, 42);
        let f = model.ftl.lock();
        let mapped = f.l2p.iter().filter(|&&ppn| ppn != UNMAPPED).count() as u64;
        assert_eq!(mapped, part / p.unit_bytes, "every unit of the range mapped, nothing beyond it");
        assert!(f.l2p[(part / p.unit_bytes) as usize..].iter().all(|&ppn| ppn == UNMAPPED));
        drop(f);
        assert_eq!(count("host_write_bytes"), 2 * part, "one sequential and one random pass");
        assert!(count("gc_moved_bytes") > 0, "the random pass made the drive collect garbage");
        let mut back = [0u8; 4096];
        model.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [7u8; 4096], "the data on the backing device is left as it was");
    }
}
