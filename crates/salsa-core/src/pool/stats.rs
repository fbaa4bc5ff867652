//! The statistics snapshot of a pool: counters, write amplification, segments by state, memory,
//! volumes and device counters.

use super::Pool;
use std::sync::atomic::Ordering::SeqCst;

/// Snapshot of the statistics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub user_bytes_written: u64,
    pub user_bytes_read: u64,
    pub gc_bytes_relocated: u64,
    pub device_bytes_written: u64,
    pub metadata_bytes_written: u64,
    /// Device bytes written per user byte written (data, relocations and metadata).
    pub write_amplification: f64,
    /// (user + GC relocation bytes) per user byte: the classical host WA of cleaning.
    pub gc_write_amplification: f64,
    pub free_segments: u32,
    /// Of those, segments over holes of their pool file (handed out last; see `hole_fill_bytes`).
    pub free_segments_over_holes: u32,
    /// The GC's watermarks now: it cleans once free segments fall below the low one and until
    /// they reach the high one (a paced pool's band follows its surplus space).
    pub gc_low_watermark_segments: u32,
    pub gc_high_watermark_segments: u32,
    pub total_segments: u32,
    pub segment_bytes: u64,
    pub gc_segments_cleaned: u64,
    pub flushes: u64,
    pub syncs: u64,
    pub sync_micros: u64,
    /// GC releases that another's sync covered (group commit; see `Log::sync_for_release`).
    pub releases_sharing_a_sync: u64,
    pub gc_micros: u64,
    /// Bytes the GC read from victims: their metadata and live pages where those are a small
    /// part of them, whole victims otherwise.
    pub gc_bytes_read: u64,
    pub throttled_allocations: u64,
    /// User writes paced while the GC was behind, the time they waited in all, and the rate
    /// writes are admitted at now, 0 when not pacing (see `pacing.rs`: the wait for the GC
    /// spread over every write).
    pub paced_writes: u64,
    pub paced_micros: u64,
    pub pacing_rate_bytes_per_sec: u64,
    /// Of the paced writes, those admitted at the write-back's pace (records waiting for the
    /// drives), not the GC's.
    pub paced_by_write_back: u64,
    /// Victims the GC waited a full second for, for writers to take replaced pages off their
    /// count (0 unless something is wrong).
    pub gc_wait_timeouts: u64,
    /// Bytes compressing volumes' writes did not store (their pages' bytes less their stored
    /// forms'), since the pool was opened.
    pub compressed_bytes_saved: u64,
    /// User bytes written that records held in the writers' payload buffers instead of
    /// copying them (zero-copy writes, [`Volume::write_payload`](crate::Volume::write_payload)).
    pub user_bytes_held: u64,
    /// Payload buffers out now: being received, or held by records not yet on the device
    /// (at most 64 MiB, `PAYLOAD_BUDGET_BYTES`).
    pub payload_buffer_bytes: u64,
    /// Memory held by the page maps.
    pub map_memory_bytes: u64,
    /// Memory held by the per-grain checksum table.
    pub crc_table_memory_bytes: u64,
    /// Segments per state: free, staged (open), allocated, victim, pending-free, checkpoint,
    /// tier (a hybrid volume's copies), offline (on a member missing at open).
    pub segments_by_state: [u32; 8],
    /// Segments the GC gave up on because their metadata did not account for every page the
    /// map places there (damage, or an accounting bug): their space is lost until reopen.
    pub unmovable_segments: u32,
    pub volumes: Vec<VolumeStats>,
    pub device_counters: Vec<(String, String, u64)>,
    /// What the pool's victim policy reports of itself (`VictimPolicy::state`: an adaptive
    /// policy's age exponent, for one).
    pub victim_policy_state: Vec<(String, f64)>,
    /// How the members are combined (`linear`, `raid0`, `raid1`, `raid5`).
    pub array: String,
    /// Health and I/O of every member, in slot order.
    pub members: Vec<crate::array::MemberStatus>,
    /// Zeros written so that flushes end on whole RAID-5 rows.
    pub pad_bytes_written: u64,
    /// Bytes of freed segments discarded on the devices.
    pub discarded_bytes: u64,
    /// Bursts in which the GC wrote the records it held back
    /// ([`crate::pool::OpenOptions::gc_burst_bytes`]), and the records they held.
    pub gc_bursts: u64,
    pub gc_burst_records: u64,
    /// Discards a device refused (advisory; nothing lost).
    pub discard_errors: u64,
    /// Freed segments left undiscarded on devices where a discard costs an allocation at
    /// reuse (punched holes in files): those within the eighth of the pool kept free.
    pub discards_skipped: u64,
    /// Zeros written into free segments over holes of their pool file, so that a file system
    /// allocates them in the background rather than under a writer's flush.
    pub hole_fill_bytes: u64,
    /// Pages remapped by share batches, and the batches (since the pool was opened).
    pub pages_shared: u64,
    pub share_batches: u64,
    /// User records written ahead of their flush by write-behind, for writers that flush
    /// after every write (since the pool was opened).
    pub records_written_ahead: u64,
    /// Bytes written to all members (data, metadata, padding, parity and mirror copies) per
    /// user byte written; for a linear array the same as `write_amplification`.
    pub array_write_amplification: f64,
    /// A member being rebuilt, and how far.
    pub rebuild: Option<RebuildProgress>,
    /// The RAID-5 parity buffer, when the pool has one.
    pub parity_buffer: Option<crate::array::ParityBufferStatus>,
    /// The DRAM read cache, when the pool has one.
    pub read_cache: Option<crate::log::read_cache::ReadCacheStats>,
    /// The DRAM write buffer, when the pool has one.
    pub write_buffer: Option<crate::dirty::WriteBufferStats>,
}

/// A member's rebuild in progress ([`Stats::rebuild`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildProgress {
    /// The slot being rebuilt.
    pub slot: u32,
    /// Every segment below this one is done (recorded about once a second).
    pub next_segment: u32,
    /// Segments in the pool.
    pub total_segments: u32,
    /// The rebuild's rate limit; `None`: none.
    pub rate_bytes_per_sec: Option<u64>,
}

/// A volume's statistics, as its controller reports them.
pub type VolumeStats = crate::controller::ControllerStats;

impl Pool {
    /// Each member's state and counters (what [`Pool::stats`] reports as `members`), without
    /// the rest of the statistics.
    pub fn members(&self) -> Vec<crate::MemberStatus> {
        self.eng.log.array().member_status()
    }

    /// The RAID-5 parity buffer's state and counters (`None` without one); cheaper than
    /// [`Pool::stats`], for a monitor that polls it.
    pub fn parity_buffer(&self) -> Option<crate::array::ParityBufferStatus> {
        self.eng.log.array().parity_buffer_status()
    }

    /// Current statistics.
    pub fn stats(&self) -> Stats {
        let c = self.eng.log.counters();
        let user = c.user_bytes_written.load(SeqCst);
        let gc = c.gc_bytes_relocated.load(SeqCst);
        let dev = c.device_bytes_written.load(SeqCst);
        let ratio = |a: u64| if user == 0 { 0.0 } else { a as f64 / user as f64 };
        // A buffered page the controller does not map yet is mapped all the same: it reads as
        // written and holds room in the pool (before, `stats` showed such a volume empty while
        // its writes were refused for want of space).
        let mut vols: Vec<VolumeStats> = self
            .eng
            .volumes
            .read()
            .values()
            .map(|v| {
                let mut s = v.stats();
                s.stored_bytes = v.mapped_grains() * self.eng.log.geo().grain_bytes as u64;
                s.mapped_bytes += self.eng.dirty.reserved_bytes_of(v.id());
                s
            })
            .collect();
        {
            let meta = self.eng.log.meta().lock();
            for v in &mut vols {
                let own = meta
                    .volumes
                    .iter()
                    .find(|r| r.name == v.name)
                    .map(|r| r.victim.as_str())
                    .unwrap_or("");
                v.victim = if own.is_empty() {
                    self.victim_policy.clone()
                } else {
                    own.to_string()
                };
            }
        }
        let mut device_counters = Vec::new();
        for m in self.eng.log.array().members() {
            for (k, v) in m.device.counters() {
                device_counters.push((m.device.name().to_string(), k, v));
            }
        }
        let members = self.members();
        let array_bytes: u64 = members.iter().map(|m| m.bytes_written).sum::<u64>() + self.eng.log.array().replaced_bytes_written();
        let array_bytes = if self.eng.log.array().kind() == crate::ArrayKind::Linear {
            dev
        } else {
            array_bytes
        };
        let rebuild = self.eng.log.meta().lock().rebuild.map(|r| RebuildProgress {
            slot: r.slot,
            next_segment: r.next_segment,
            total_segments: self.eng.log.geo().total_segments,
            rate_bytes_per_sec: (r.rate_bytes_per_sec > 0).then_some(r.rate_bytes_per_sec),
        });
        // One snapshot, so that both watermarks come from the same band.
        let watermarks = self.eng.log.capacity().watermarks();
        Stats {
            rebuild,
            parity_buffer: self.eng.log.array().parity_buffer_status(),
            read_cache: self.eng.log.read_cache_stats(),
            write_buffer: self.eng.dirty.stats(),
            array: self.eng.log.array().kind().name().to_string(),
            members,
            pad_bytes_written: c.pad_bytes_written.load(SeqCst),
            discarded_bytes: c.discarded_bytes.load(SeqCst),
            gc_bursts: c.gc_bursts.load(SeqCst),
            gc_burst_records: c.gc_burst_records.load(SeqCst),
            discard_errors: c.discard_errors.load(SeqCst),
            discards_skipped: c.discards_skipped.load(SeqCst),
            hole_fill_bytes: c.hole_fill_bytes.load(SeqCst),
            pages_shared: c.pages_shared.load(SeqCst),
            share_batches: c.share_batches.load(SeqCst),
            records_written_ahead: c.records_written_ahead.load(SeqCst),
            array_write_amplification: ratio(array_bytes),
            user_bytes_written: user,
            user_bytes_read: c.user_bytes_read.load(SeqCst),
            gc_bytes_relocated: gc,
            device_bytes_written: dev,
            metadata_bytes_written: c.meta_bytes_written.load(SeqCst),
            write_amplification: ratio(dev),
            gc_write_amplification: ratio(user + gc),
            free_segments: self.eng.log.capacity().free_segments(),
            free_segments_over_holes: self.eng.log.capacity().free_and_hole_counts().1,
            gc_low_watermark_segments: watermarks.low,
            gc_high_watermark_segments: watermarks.high,
            total_segments: self.eng.log.geo().total_segments,
            segment_bytes: self.eng.log.geo().segment_bytes,
            gc_segments_cleaned: c.gc_segments_cleaned.load(SeqCst),
            flushes: c.flushes.load(SeqCst),
            syncs: c.syncs.load(SeqCst),
            sync_micros: c.sync_micros.load(SeqCst),
            releases_sharing_a_sync: c.releases_sharing_a_sync.load(SeqCst),
            gc_micros: c.gc_micros.load(SeqCst),
            gc_bytes_read: c.gc_bytes_read.load(SeqCst),
            throttled_allocations: c.throttled_allocations.load(SeqCst),
            paced_writes: self.eng.pacer.paced_writes.load(SeqCst),
            paced_micros: self.eng.pacer.paced_micros.load(SeqCst),
            pacing_rate_bytes_per_sec: self.eng.pacer.rate_bytes_per_sec(),
            paced_by_write_back: self.eng.pacer.paced_by_write_back.load(SeqCst),
            gc_wait_timeouts: c.gc_wait_timeouts.load(SeqCst),
            user_bytes_held: c.user_bytes_held.load(SeqCst),
            compressed_bytes_saved: c.compressed_bytes_saved.load(SeqCst),
            payload_buffer_bytes: self.eng.log.payloads().outstanding_bytes() as u64,
            map_memory_bytes: vols.iter().map(|v| v.map_memory_bytes).sum(),
            crc_table_memory_bytes: self.eng.log.crc_table().len() as u64 * 4,
            segments_by_state: {
                let mut by = [0u32; 8];
                for s in self.eng.log.capacity().segments() {
                    by[s.state() as usize] += 1;
                }
                by
            },
            unmovable_segments: self
                .eng
                .log
                .capacity()
                .segments()
                .iter()
                .filter(|s| s.unmovable.load(SeqCst))
                .count() as u32,
            volumes: vols,
            device_counters,
            victim_policy_state: self.eng.victim_policy_state(),
        }
    }
}
