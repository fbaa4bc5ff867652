//! The hybrid controller (SALSA paper, section IV-B): a volume over two storage types of one
//! pool. Its data lives in the log on the slow tier (disks: the slow
//! [`StorageClass`](crate::log::StorageClass)); groups of consecutive pages that reads make hot
//! are copied to the fast tier (flash, NVM: [`FAST_TYPES`]) in the background and read from
//! there while they stay hot.
//!
//! Owns: the temperatures (one 64-bit word per group of pages) and the fast tier
//! ([`tier::Tier`]: which group has a copy in which fast segment, and which of its pages are
//! still current).
//!
//! Invariants:
//! - user and GC writes go only to slow segments (the LSA controller underneath writes through
//!   streams restricted to the slow class), so the fast tier never holds the only copy of
//!   anything: it holds copies of pages that are in the log, and nothing on it is needed to
//!   recover. Its segments hold no records; reopening the pool frees them (temperatures and
//!   copies start cold, as the paper allows);
//! - a copy is served only when its bytes match the checksum of the page the map points at
//!   now, read after the bytes (so an overwrite, a trim, a demotion or a reused fast segment
//!   can only make a read fall back to the slow tier, never return stale data); writes and
//!   trims also clear the copy's bits for the pages they touch, so that the fast tier is not
//!   asked for what it no longer has;
//! - a failing fast device costs performance, not data: the first I/O error on the fast tier
//!   stops it (every copy dropped, its segments kept out of the pool's use until reopen) and
//!   reads go to the slow tier;
//! - promotion copies at most the configured bandwidth, and the tier gives its segments back
//!   whenever the pool runs short of free segments, when copies cool down, and for hotter
//!   groups when it is full.

pub mod temperature;
pub mod tier;

use super::lsa::LsaVolume;
use super::map::Entry;
use super::{page_pieces, Controller, ControllerStats, Reference, ScannedRecord, VolumeIo};
use crate::error::{Error, Result};
use crate::format::ControllerKind;
use crate::log::payload::WriteBuffer;
use crate::log::stream::Streams;
use crate::log::Log;
use crate::policy::placement::Placement;
use crate::util::Decoder;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use temperature::Temperatures;
use tier::{Located, Tier};

use crate::log::FAST_TYPES;

/// Volume-table settings of a hybrid volume.
pub const SETTING_GROUP_PAGES: u16 = 1;
pub const SETTING_TIER_BYTES: u16 = 2;
pub const SETTING_PROMOTE_BYTES_PER_S: u16 = 3;
pub const SETTING_HALF_LIFE_MS: u16 = 4;

/// Pages per temperature group unless the volume says otherwise (the paper's 256).
pub const DEFAULT_GROUP_PAGES: u64 = 256;
/// Promotion bandwidth unless the volume says otherwise: a fraction of what a disk streams, so
/// that copying never starves the disk of its user reads.
pub const DEFAULT_PROMOTE_BYTES_PER_S: u64 = 32 << 20;
/// A temperature halves every this many milliseconds unless the volume says otherwise.
pub const DEFAULT_HALF_LIFE_MS: u64 = 10_000;
/// Reads (of a group, decayed) that make it hot enough to copy.
pub const PROMOTE_AT: u64 = 4;

/// What a hybrid volume is created with (`None`: the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HybridSpec {
    /// Pages per temperature group (and per fast-tier copy).
    pub group_pages: Option<u64>,
    /// Most bytes of fast tier the volume uses (`0`: as much as the fast devices have).
    pub tier_bytes: Option<u64>,
    /// Promotion bandwidth limit, bytes per second.
    pub promote_bytes_per_s: Option<u64>,
    /// Temperature half-life, milliseconds.
    pub half_life_ms: Option<u64>,
}

/// The settings of a hybrid volume, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridSettings {
    pub group_pages: u64,
    pub tier_bytes: u64,
    pub promote_bytes_per_s: u64,
    pub half_life_ms: u64,
}

impl HybridSettings {
    /// `spec` with its blanks filled in, checked against the pool's geometry.
    pub fn resolve(spec: &HybridSpec, page_bytes: u32, segment_bytes: u64) -> std::result::Result<HybridSettings, String> {
        let s = HybridSettings {
            group_pages: spec.group_pages.unwrap_or(DEFAULT_GROUP_PAGES),
            tier_bytes: spec.tier_bytes.unwrap_or(0),
            promote_bytes_per_s: spec.promote_bytes_per_s.unwrap_or(DEFAULT_PROMOTE_BYTES_PER_S),
            half_life_ms: spec.half_life_ms.unwrap_or(DEFAULT_HALF_LIFE_MS),
        };
        s.check(page_bytes, segment_bytes)?;
        Ok(s)
    }

    /// The settings a volume-table entry records.
    pub fn from_record(settings: &[(u16, u64)], page_bytes: u32, segment_bytes: u64) -> std::result::Result<HybridSettings, String> {
        let mut spec = HybridSpec::default();
        for &(key, value) in settings {
            match key {
                SETTING_GROUP_PAGES => spec.group_pages = Some(value),
                SETTING_TIER_BYTES => spec.tier_bytes = Some(value),
                SETTING_PROMOTE_BYTES_PER_S => spec.promote_bytes_per_s = Some(value),
                SETTING_HALF_LIFE_MS => spec.half_life_ms = Some(value),
                _ => return Err(format!("the hybrid controller has no setting {key} (written by a newer SALSA?)")),
            }
        }
        HybridSettings::resolve(&spec, page_bytes, segment_bytes)
    }

    /// As the volume table records them.
    pub fn record(&self) -> Vec<(u16, u64)> {
        vec![
            (SETTING_GROUP_PAGES, self.group_pages),
            (SETTING_TIER_BYTES, self.tier_bytes),
            (SETTING_PROMOTE_BYTES_PER_S, self.promote_bytes_per_s),
            (SETTING_HALF_LIFE_MS, self.half_life_ms),
        ]
    }

    fn check(&self, page_bytes: u32, segment_bytes: u64) -> std::result::Result<(), String> {
        let group_bytes = self.group_pages.checked_mul(page_bytes as u64);
        if self.group_pages == 0 || !self.group_pages.is_power_of_two() || group_bytes.is_none_or(|b| b > segment_bytes) {
            return Err(format!(
                "a hybrid volume's group ({} pages of {page_bytes} bytes) must be a power of two of pages no larger than a segment ({segment_bytes} bytes)",
                self.group_pages
            ));
        }
        if self.promote_bytes_per_s == 0 {
            return Err("a hybrid volume's promotion bandwidth must be more than 0 bytes per second".into());
        }
        if !(1..=86_400_000).contains(&self.half_life_ms) {
            return Err(format!(
                "a hybrid volume's temperature half-life is 1 ms to 1 day, not {} ms",
                self.half_life_ms
            ));
        }
        Ok(())
    }
}

/// A volume served by the hybrid controller.
pub struct HybridVolume {
    /// The volume's data: an LSA page map whose streams write only slow segments.
    slow: LsaVolume,
    settings: HybridSettings,
    temperatures: Temperatures,
    tier: Tier,
    fast_read_bytes: AtomicU64,
    slow_read_bytes: AtomicU64,
}

impl HybridVolume {
    /// A hybrid volume over `slow` (built on the slow storage class).
    pub fn new(slow: LsaVolume, settings: HybridSettings, segment_bytes: u64) -> HybridVolume {
        let pages = slow.size_bytes() / slow.page_bytes as u64;
        HybridVolume {
            temperatures: Temperatures::new(pages.div_ceil(settings.group_pages), settings.half_life_ms),
            tier: Tier::new(settings, slow.page_bytes, segment_bytes),
            settings,
            slow,
            fast_read_bytes: AtomicU64::new(0),
            slow_read_bytes: AtomicU64::new(0),
        }
    }

    fn group_of(&self, page: u64) -> u64 {
        page / self.settings.group_pages
    }

    /// Raises the temperature of every group `[offset, offset + len)` touches, and asks for
    /// the copy of those that became hot.
    fn heat(&self, offset: u64, len: u64) {
        let pb = self.slow.page_bytes as u64;
        let first = self.group_of(offset / pb);
        let last = self.group_of((offset + len - 1) / pb);
        for g in first..=last {
            if self.temperatures.raise(g) >= PROMOTE_AT {
                self.tier.request(g);
            }
        }
    }

    /// Clears the fast copies of the pages `[offset, offset + len)` touches.
    fn invalidate(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let pb = self.slow.page_bytes as u64;
        self.tier.invalidate(offset / pb, (offset + len - 1) / pb + 1);
    }

    /// Reads the pages of `[offset, offset + buf.len())` that group `group`'s fast copy has
    /// and that still match the map; returns a mask (per page of the range, from its first
    /// page) of those it filled.
    fn read_fast(&self, log: &Log, located: &Located, offset: u64, buf: &mut [u8]) -> Vec<bool> {
        let pb = self.slow.page_bytes as u64;
        let first_page = offset / pb;
        let last_page = (offset + buf.len() as u64 - 1) / pb;
        let pages = (last_page - first_page + 1) as usize;
        let mut filled = vec![false; pages];
        let wanted: Vec<bool> = (first_page..=last_page).map(|p| located.has(p)).collect();
        let (Some(a), Some(b)) = (wanted.iter().position(|w| *w), wanted.iter().rposition(|w| *w)) else {
            return filled;
        };
        // One read of the copy's pages from the first wanted to the last.
        let run_first = first_page + a as u64;
        let run_pages = (b - a + 1) as u64;
        let mut tmp = log.buffers().get((run_pages * pb) as usize);
        let read = log.array().read(located.grain_of(run_first), &mut tmp);
        if let Err(e) = read {
            self.tier.fail(&format!("reading a copy: {e}"));
            log.buffers().put(tmp);
            return filled;
        }
        let map = self.slow.map();
        for i in a..=b {
            if !wanted[i] {
                continue;
            }
            let page = first_page + i as u64;
            let bytes = &tmp[((page - run_first) * pb) as usize..((page - run_first + 1) * pb) as usize];
            // The copy counts only if it is the page the map points at now.
            let Entry::Mapped(g) = map.load(page) else { continue };
            if crc32c::crc32c(bytes) != log.crc_table()[g as usize].load(SeqCst) {
                continue;
            }
            let page_start = page * pb;
            let from = page_start.max(offset);
            let to = (page_start + pb).min(offset + buf.len() as u64);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&bytes[(from - page_start) as usize..(to - page_start) as usize]);
            filled[i] = true;
        }
        drop(map);
        log.buffers().put(tmp);
        // A copy demoted (and its segment reused) while it was read is not trusted, even where
        // the checksums agreed.
        if !self.tier.still_there(located) {
            filled.iter_mut().for_each(|f| *f = false);
        }
        filled
    }
}

impl VolumeIo for HybridVolume {
    fn kind(&self) -> ControllerKind {
        ControllerKind::Hybrid
    }

    fn size_bytes(&self) -> u64 {
        self.slow.size_bytes()
    }

    fn page_bytes(&self) -> u32 {
        self.slow.page_bytes
    }

    fn mapped_bytes(&self) -> u64 {
        VolumeIo::mapped_bytes(&self.slow)
    }

    /// Reads each group's part from its fast copy where it has one that matches the map, and
    /// the rest from the slow tier.
    fn read(&self, log: &Log, offset: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if self.is_retired() {
            return Err(Error::VolumeNotFound(self.slow.name.clone()));
        }
        // A read counts toward the heat and tier counters once: one that may not wait is
        // refused whole here, before it counts, and done again by a thread that may.
        crate::log::memory_reads::allow_device_read()?;
        self.heat(offset, buf.len() as u64);
        let pb = self.slow.page_bytes as u64;
        let group_bytes = self.settings.group_pages * pb;
        let mut at = offset;
        let end = offset + buf.len() as u64;
        while at < end {
            let group_end = ((at / group_bytes) + 1) * group_bytes;
            let part_end = group_end.min(end);
            let part = &mut buf[(at - offset) as usize..(part_end - offset) as usize];
            let filled = match self.tier.locate(self.group_of(at / pb)) {
                Some(located) => self.read_fast(log, &located, at, part),
                None => Vec::new(),
            };
            // What the copy did not give comes from the slow tier, in runs.
            let first_page = at / pb;
            let mut run: Option<u64> = None; // start offset of a run of unfilled bytes
            for (page, in_page, n) in page_pieces(at, part_end - at, self.slow.page_bytes) {
                let piece_start = page * pb + in_page as u64;
                let fast = filled.get((page - first_page) as usize).copied().unwrap_or(false);
                if fast {
                    self.fast_read_bytes.fetch_add(n as u64, SeqCst);
                    if let Some(r) = run.take() {
                        let slice = &mut buf[(r - offset) as usize..(piece_start - offset) as usize];
                        self.slow.read(log, r, slice)?;
                        self.slow_read_bytes.fetch_add(slice.len() as u64, SeqCst);
                    }
                } else {
                    run.get_or_insert(piece_start);
                }
            }
            if let Some(r) = run {
                let slice = &mut buf[(r - offset) as usize..(part_end - offset) as usize];
                self.slow.read(log, r, slice)?;
                self.slow_read_bytes.fetch_add(slice.len() as u64, SeqCst);
            }
            at = part_end;
        }
        Ok(())
    }

    fn write(&self, log: &Log, offset: u64, data: &[u8], payload: Option<&Arc<WriteBuffer>>) -> Result<()> {
        // Cleared before (a copy in the making then knows) and after (a read between the two
        // may have found the old page current; the checksum check keeps it from being served).
        self.invalidate(offset, data.len() as u64);
        let r = self.slow.write(log, offset, data, payload);
        self.invalidate(offset, data.len() as u64);
        r
    }

    fn trim(&self, log: &Log, offset: u64, len: u64) -> Result<()> {
        self.invalidate(offset, len);
        let r = self.slow.trim(log, offset, len);
        self.invalidate(offset, len);
        r
    }

    fn page_location(&self, page: u64) -> Option<u64> {
        self.slow.page_location(page)
    }

    fn grow(&self, new_size_bytes: u64) -> Result<()> {
        VolumeIo::grow(&self.slow, new_size_bytes)?;
        let pages = new_size_bytes / self.slow.page_bytes as u64;
        self.temperatures.grow(pages.div_ceil(self.settings.group_pages));
        Ok(())
    }

    fn retire(&self) {
        VolumeIo::retire(&self.slow);
        self.tier.retire();
    }

    fn is_retired(&self) -> bool {
        self.slow.is_retired()
    }

    fn mapped_grains(&self) -> u64 {
        self.slow.mapped_grains()
    }
}

impl Controller for HybridVolume {
    fn id(&self) -> u32 {
        self.slow.id
    }

    fn name(&self) -> &str {
        &self.slow.name
    }

    fn streams(&self) -> Arc<Streams> {
        self.slow.placement_streams()
    }

    fn set_placement(&self, log: &Log, placement: Box<dyn Placement>, name: &str) -> Result<()> {
        let _gate = self.slow.gate.write();
        self.slow.replace_placement(log, placement, name)
    }

    fn stats(&self) -> ControllerStats {
        let slow = self.slow.stats();
        let t = self.tier.stats();
        ControllerStats {
            controller: ControllerKind::Hybrid.name().to_string(),
            map_memory_bytes: slow.map_memory_bytes + self.temperatures.memory_bytes() + t.memory_bytes,
            settings: vec![
                ("group_pages".into(), self.settings.group_pages),
                ("tier_bytes".into(), self.settings.tier_bytes),
                ("promote_bytes_per_s".into(), self.settings.promote_bytes_per_s),
                ("half_life_ms".into(), self.settings.half_life_ms),
            ],
            fast_tier_bytes: t.copy_bytes,
            fast_tier_segments: t.segments,
            promotions: t.promotions,
            demotions: t.demotions,
            fast_read_bytes: self.fast_read_bytes.load(SeqCst),
            slow_read_bytes: self.slow_read_bytes.load(SeqCst),
            fast_tier_failed: t.failed,
            ..slow
        }
    }

    fn maintain(&self, log: &Log) -> Result<bool> {
        if self.is_retired() {
            return Ok(false);
        }
        self.tier.maintain(log, &self.slow, &self.temperatures)
    }

    fn release(&self, log: &Log) {
        self.tier.release(log);
    }

    fn relocate(&self, log: &Log, victim: u32) -> Result<()> {
        // The GC moves slow pages; a fast copy is of the page's bytes, wherever they live.
        Controller::relocate(&self.slow, log, victim)
    }

    fn clear(&self) {
        self.slow.clear();
    }

    fn begin_replay(&self) {
        self.slow.begin_replay();
    }

    fn replay(&self, log: &Log, record: &ScannedRecord<'_>) {
        self.slow.replay(log, record);
    }

    fn end_replay(&self, log: &Log) {
        self.slow.end_replay(log);
    }

    fn account(&self, log: &Log, visit: &mut dyn FnMut(Reference) -> Result<()>) -> Result<u64> {
        self.slow.account(log, visit)
    }

    fn image_bytes(&self) -> u64 {
        self.slow.image_bytes()
    }

    fn encode_image(&self, out: &mut Vec<u8>) {
        self.slow.encode_image(out);
    }

    fn load_image(&self, d: &mut Decoder<'_>) -> Result<()> {
        self.slow.load_image(d)
    }
}
