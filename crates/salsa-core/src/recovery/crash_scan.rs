//! The crash scan: rebuilds every volume's map by walking every segment's record chain (in
//! parallel), when the pool was not closed cleanly or its checkpoint does not load.
//!
//! Scan rules: every intact record of a live volume is considered; for each page the entry with
//! the highest sequence number wins (data or trim). A record whose id is at most the largest
//! `synced_through` seen anywhere was durable, so all its entries count; a later record may be
//! torn, so only its data pages whose crc32c matches count. Afterwards the array's redundancy
//! is brought back in line over what was in flight at the crash, and the segment counts and
//! states are derived from the maps alone ([`super::derive_segment_state`]).

use super::derive_segment_state;
use crate::controller::ScannedRecord;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::{RecordMeta, SegmentHeader, StreamKind};
use crate::log::chain::{walk_segment, ScanGeometry};
use std::sync::atomic::Ordering::SeqCst;

/// What one scan thread found: records, and the headers of segments in use.
type ScanPart = (Vec<Found>, Vec<(u32, SegmentHeader)>);

struct Found {
    segment: u32,
    header: SegmentHeader,
    meta: RecordMeta,
    /// Per data page: does its crc match?
    intact: Vec<bool>,
}

/// Rebuilds every volume's map by scanning all segments (in parallel).
pub fn scan(eng: &Engine, progress: &dyn Fn(u64, u64)) -> Result<()> {
    let n = eng.log.geo().total_segments;
    let geo = eng.log.scan_geometry();
    let threads = std::thread::available_parallelism().map(|p| p.get()).unwrap_or(1).clamp(1, 8) as u32;
    let done = std::sync::atomic::AtomicU64::new(0);
    let mut found: Vec<Found> = Vec::new();
    let mut headers: Vec<Option<SegmentHeader>> = vec![None; n as usize];
    std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let geo = &geo;
                let done = &done;
                scope.spawn(move || scan_part(eng, geo, t, threads, done))
            })
            .collect();
        for h in handles {
            let (f, hs) = h.join().map_err(|_| Error::Corrupt("recovery scan thread panicked".into()))??;
            found.extend(f);
            for (s, hdr) in hs {
                headers[s as usize] = Some(hdr);
            }
            progress(done.load(SeqCst), n as u64);
        }
        Ok(())
    })?;
    // Oldest record first, so that of two copies of a page with the same sequence number (a GC
    // move and its source, freed but not yet reused) the newer one, which the map pointed at,
    // wins the tie.
    found.sort_unstable_by_key(|f| f.meta.record_id);
    let durable_through = found.iter().map(|f| f.meta.synced_through).max().unwrap_or(0);
    let volumes = eng.volumes.read().clone();
    for v in volumes.values() {
        v.begin_replay();
    }
    for f in &found {
        if f.header.stream == StreamKind::Checkpoint {
            continue;
        }
        if let Some(vol) = volumes.get(&f.header.volume_id) {
            vol.replay(
                &eng.log,
                &ScannedRecord {
                    segment: f.segment,
                    meta: &f.meta,
                    intact: &f.intact,
                    trusted: f.meta.record_id <= durable_through,
                },
            );
        }
    }
    for v in volumes.values() {
        v.end_replay(&eng.log);
    }
    if !eng.log.is_read_only() {
        resync_unsynced(eng, &found, durable_through)?;
    }
    let opened: Vec<u64> = headers.iter().map(|h| h.as_ref().map_or(0, |h| h.opened_seq)).collect();
    derive_segment_state(eng, &opened)?;
    // The stream a segment was written by guides placement and victim policies.
    for (s, h) in headers.iter().enumerate() {
        if let Some(h) = h {
            eng.log.capacity().segment(s as u32).stream.store(h.stream.to_u8(), SeqCst);
        }
    }
    Ok(())
}

/// One scan thread's part: segments `t`, `t + threads`, ... (counted in `done`), their
/// records with which data pages pass their checksums, and the headers of those in use.
fn scan_part(eng: &Engine, geo: &ScanGeometry, t: u32, threads: u32, done: &std::sync::atomic::AtomicU64) -> Result<ScanPart> {
    let n = eng.log.geo().total_segments;
    let mut out = Vec::new();
    let mut hdrs = Vec::new();
    let mut s = t;
    while s < n {
        if eng.log.array().is_segment_offline(s) {
            done.fetch_add(1, SeqCst);
            s += threads;
            continue;
        }
        let gb = geo.grain_bytes;
        let h = walk_segment(eng.log.array(), eng.log.buffers(), geo, s, false, |header, meta, data| {
            let base = s as u64 * geo.grains_per_segment as u64;
            let intact = meta
                .data_crcs()
                .zip(meta.data_layout())
                .enumerate()
                .map(|(i, (crc, (offset, grains)))| {
                    let (at, size) = (offset * gb, grains as usize * gb);
                    // A page that fails its checksum may be torn, or damaged on
                    // one member of a redundant array: then the redundancy
                    // holds it whole.
                    crc32c::crc32c(&data[at..at + size]) == crc || eng.log.repair_page(meta.data_grain(base, i), size, crc).is_some()
                })
                .collect();
            out.push(Found {
                segment: s,
                header: header.clone(),
                meta: meta.clone(),
                intact,
            });
        })?;
        if let Some(h) = h {
            hdrs.push((s, h));
        }
        done.fetch_add(1, SeqCst);
        s += threads;
    }
    Ok((out, hdrs))
}

/// Brings the array's redundancy back in line over what was being written at the crash: in
/// every segment, from the first record that was not known durable to the end of its chain,
/// and the row a chain ends in when it ends inside one. (Every other row was complete, and its
/// parity or mirror copies synced, when the records in it became durable.) On RAID-1 also the
/// grain where a chain ends, when another record could have followed: a record in flight at
/// the crash may have reached one mirror and not the one recovery read, and once reads are
/// balanced a walk of the segment must find the chain ending there on every mirror.
fn resync_unsynced(eng: &Engine, found: &[Found], durable_through: u64) -> Result<()> {
    let mut ranges: std::collections::BTreeMap<u32, (u64, u64)> = std::collections::BTreeMap::new();
    // Widens segment `s`'s range to cover grains `[from, to)`.
    let mut cover = |s: u32, from: u64, to: u64| {
        let r = ranges.entry(s).or_insert((from, to));
        r.0 = r.0.min(from);
        r.1 = r.1.max(to);
    };
    // Per segment: where its chain ends, and the page size of its last record.
    let mut chain_end: std::collections::BTreeMap<u32, (u64, u32)> = std::collections::BTreeMap::new();
    for f in found {
        let start = f.meta.start_grain as u64;
        let end = start + f.meta.span_grains().unwrap_or(1) as u64;
        let e = chain_end.entry(f.segment).or_insert((end, f.meta.page_grains));
        if end >= e.0 {
            *e = (end, f.meta.page_grains);
        }
        if f.meta.record_id > durable_through {
            cover(f.segment, start, end);
        }
    }
    // A chain that ends inside a row: that row's parity was never written (the row was still
    // filling), durable records or not.
    let align = eng.log.array().row_grains(eng.log.geo().grain_bytes) as u64;
    let gps = eng.log.geo().grains_per_segment as u64;
    let mirrored = eng.log.array().kind() == crate::array::ArrayKind::Raid1;
    for (segment, (end, last_page_grains)) in chain_end {
        if align > 1 && !end.is_multiple_of(align) {
            cover(segment, end - 1, end);
        }
        if mirrored && crate::log::chain::may_follow(end as usize, last_page_grains as usize, gps as usize) {
            cover(segment, end, end + 1);
        }
    }
    for (segment, (from, to)) in ranges {
        eng.log.array().resync(segment, from, to.min(gps))?;
    }
    Ok(())
}
