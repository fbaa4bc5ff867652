//! Rebuilding the in-memory state at open: from a clean-shutdown checkpoint when there is one,
//! otherwise by scanning every segment's record chain.
//!
//! Scan rules: every intact record of a live volume is considered; for each page the entry with
//! the highest sequence number wins (data or trim). A record whose id is at most the largest
//! `synced_through` seen anywhere was durable, so all its entries count; a later record may be
//! torn, so only its data pages whose crc32c matches count. Afterwards the segment counts and
//! states are derived from the maps alone.

use crate::controller::{Reference, ScannedRecord};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::MAX_VOLUME_PAGES;
use crate::format::{decode_checkpoint_header, CheckpointRef, RecordMeta, SegmentHeader, StreamKind};
use crate::log::capacity::SegmentState;
use crate::scan::{walk_segment, ScanGeometry};
use crate::util::{AlignedBuf, Decoder};
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
        let pb = |m: &RecordMeta| m.page_grains as usize * geo.grain_bytes;
        let h = walk_segment(eng.log.array(), eng.log.buffers(), geo, s, false, |header, meta, data| {
            let size = pb(meta);
            let base = s as u64 * geo.grains_per_segment as u64;
            let intact = meta
                .data_crcs()
                .enumerate()
                .map(|(i, crc)| {
                    // A page that fails its checksum may be torn, or damaged on
                    // one member of a redundant array: then the redundancy
                    // holds it whole.
                    crc32c::crc32c(&data[i * size..(i + 1) * size]) == crc
                        || eng.log.repair_page(meta.data_grain(base, i), size, crc).is_some()
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
        if mirrored && crate::scan::may_follow(end as usize, last_page_grains as usize, gps as usize) {
            cover(segment, end, end + 1);
        }
    }
    for (segment, (from, to)) in ranges {
        eng.log.array().resync(segment, from, to.min(gps))?;
    }
    Ok(())
}

/// Derives every segment's counts, owner and state from the volume maps.
pub fn derive_segment_state(eng: &Engine, sealed_seq: &[u64]) -> Result<()> {
    let gps = eng.log.geo().grains_per_segment;
    let n = eng.log.geo().total_segments as usize;
    let mut valid = vec![0u64; n];
    let mut tombs = vec![0u64; n];
    let mut owner = vec![u32::MAX; n];
    let mut claim = |s: usize, vol: u32| -> Result<()> {
        if owner[s] != u32::MAX && owner[s] != vol {
            return Err(Error::Corrupt(format!(
                "segment {s} is referenced by volumes {} and {vol}",
                owner[s]
            )));
        }
        owner[s] = vol;
        Ok(())
    };
    let mut mapped_total = 0u64;
    for (id, vol) in eng.volumes.read().iter() {
        mapped_total += vol.account(&eng.log, &mut |r| {
            let s = r.segment() as usize;
            if s >= n {
                return Err(Error::Corrupt(format!("volume {id} references segment {s} of {n}")));
            }
            claim(s, *id)?;
            match r {
                Reference::Data { grains, .. } => valid[s] += grains as u64,
                Reference::Tombstone { .. } => tombs[s] += 1,
            }
            Ok(())
        })?;
    }
    for s in 0..n {
        if valid[s] > gps as u64 || tombs[s] > u32::MAX as u64 {
            return Err(Error::Corrupt(format!("segment {s} would hold {} grains of {gps}", valid[s])));
        }
        let info = eng.log.capacity().segment(s as u32);
        if eng.log.array().is_segment_offline(s as u32) {
            if valid[s] > 0 || tombs[s] > 0 {
                return Err(Error::Corrupt(format!(
                    "a volume map points into segment {s}, on a member that is missing and was recorded as never holding log data"
                )));
            }
            info.set_state(SegmentState::Offline);
            continue;
        }
        info.valid_grains.store(valid[s] as u32, SeqCst);
        info.tombstones.store(tombs[s] as u32, SeqCst);
        info.owner_volume.store(owner[s], SeqCst);
        info.sealed_seq.store(sealed_seq.get(s).copied().unwrap_or(0), SeqCst);
        // Only the one clock value survives a restart; it stands in for both.
        info.opened_seq.store(sealed_seq.get(s).copied().unwrap_or(0), SeqCst);
        info.set_state(if valid[s] > 0 || tombs[s] > 0 {
            SegmentState::Allocated
        } else {
            SegmentState::Free
        });
    }
    eng.log.set_mapped_grains(mapped_total);
    eng.log.capacity().rebuild_queues();
    eng.log.mark_free_holes();
    Ok(())
}

/// Size of the image [`encode_checkpoint`] would produce now.
pub fn checkpoint_bytes(eng: &Engine) -> usize {
    let header = crate::format::encode_checkpoint_header(eng.log.pool_id(), 0, 0, 0).len() + 4;
    let maps: u64 = eng.volumes.read().values().map(|v| 4 + v.image_bytes()).sum();
    let shared: usize = eng
        .volumes
        .read()
        .values()
        .map(|v| v.shared_pages())
        .filter(|grains| !grains.is_empty())
        // Its id, the two counts, each grain, and each owner a share entry maps (as written).
        .map(|grains| {
            20 + grains
                .iter()
                .map(|(_, o)| 8 + 12 * o.iter().filter(|(_, e)| e.is_some()).count())
                .sum::<usize>()
        })
        .sum();
    header + maps as usize + eng.log.crc_table().len() * 4 + eng.log.geo().total_segments as usize * 8 + 4 + shared
}

/// Serialises the state a clean shutdown leaves: every map, the crc table, segment ages.
pub fn encode_checkpoint(eng: &Engine, session_id: u64) -> Vec<u8> {
    let mut out = crate::format::encode_checkpoint_header(eng.log.pool_id(), session_id, 0, 0);
    let vols = eng.volumes.read();
    out.extend_from_slice(&(vols.len() as u32).to_le_bytes());
    for (id, v) in vols.iter() {
        out.extend_from_slice(&id.to_le_bytes());
        v.encode_image(&mut out);
    }
    for c in eng.log.crc_table().iter() {
        out.extend_from_slice(&c.load(SeqCst).to_le_bytes());
    }
    for s in eng.log.capacity().segments() {
        out.extend_from_slice(&s.sealed_seq.load(SeqCst).to_le_bytes());
    }
    // Version 11: the shared pages of each volume that has any (older checkpoints end above):
    // its shared grains, then its pages mapped by a share entry in another segment, with it.
    let shared: Vec<(u32, Vec<crate::controller::SharedGrain>)> = vols
        .iter()
        .map(|(id, v)| (*id, v.shared_pages()))
        .filter(|(_, g)| !g.is_empty())
        .collect();
    out.extend_from_slice(&(shared.len() as u32).to_le_bytes());
    for (id, grains) in shared {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&(grains.len() as u64).to_le_bytes());
        for (g, _) in &grains {
            out.extend_from_slice(&g.to_le_bytes());
        }
        let entries: Vec<(u64, u32)> = grains
            .iter()
            .flat_map(|(_, o)| o.iter().filter_map(|&(p, e)| e.map(|e| (p, e))))
            .collect();
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (p, e) in entries {
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
    }
    out
}

/// Loads a checkpoint written by session `session_id`. On any inconsistency returns an error
/// and leaves the maps to be rebuilt by a scan.
pub fn load_checkpoint(eng: &Engine, cp: &CheckpointRef, session_id: u64) -> Result<()> {
    let sb = eng.log.geo().segment_bytes as usize;
    let mut blob = Vec::with_capacity(cp.bytes as usize);
    for &s in &cp.segments {
        if s >= eng.log.geo().total_segments || blob.len() as u64 >= cp.bytes {
            return Err(Error::Corrupt("checkpoint segment list".into()));
        }
        // Only the bytes the checkpoint wrote: the tail of its last segment may be unwritten
        // (and unreadable, in a sequential zone).
        let take = (cp.bytes as usize - blob.len()).min(sb);
        let grains = take.div_ceil(eng.log.geo().grain_bytes as usize);
        if (grains as u64) > eng.log.array().readable_grains(s) {
            return Err(Error::Corrupt(format!("checkpoint segment {s} was not written to its end")));
        }
        let mut buf = AlignedBuf::zeroed(grains * eng.log.geo().grain_bytes as usize);
        eng.log.array().read(s as u64 * eng.log.geo().grains_per_segment as u64, &mut buf)?;
        blob.extend_from_slice(&buf[..take]);
    }
    if blob.len() as u64 != cp.bytes || crc32c::crc32c(&blob) != cp.crc {
        return Err(Error::Corrupt("checkpoint checksum mismatch".into()));
    }
    let bad = |what: &str| Error::Corrupt(format!("checkpoint: {what}"));
    let mut d = Decoder::new(&blob);
    let h = decode_checkpoint_header(&mut d).map_err(|e| bad(&e.to_string()))?;
    if h.pool_id != eng.log.pool_id() || h.session_id != session_id {
        return Err(bad("belongs to another pool or session"));
    }
    let vols = eng.volumes.read().clone();
    let count = d.u32("volume count").map_err(|_| bad("truncated"))? as usize;
    if count != vols.len() {
        return Err(bad("volume count differs from the volume table"));
    }
    for _ in 0..count {
        let id = d.u32("volume id").map_err(|_| bad("truncated"))?;
        let vol = vols.get(&id).ok_or_else(|| bad("unknown volume"))?;
        vol.load_image(&mut d)?;
    }
    for c in eng.log.crc_table().iter() {
        c.store(d.u32("crc").map_err(|_| bad("truncated crc table"))?, SeqCst);
    }
    let mut sealed = Vec::with_capacity(eng.log.geo().total_segments as usize);
    for _ in 0..eng.log.geo().total_segments {
        sealed.push(d.u64("age").map_err(|_| bad("truncated segment table"))?);
    }
    // Shared pages (absent from checkpoints older than version 11, which had none).
    if let Ok(count) = d.u32("shared volumes") {
        for _ in 0..count {
            let id = d.u32("volume id").map_err(|_| bad("truncated shared pages"))?;
            let vol = vols.get(&id).ok_or_else(|| bad("shared pages of an unknown volume"))?;
            let n = d.u64("shared count").map_err(|_| bad("truncated shared pages"))?;
            if n > eng.log.geo().total_grains {
                return Err(bad("shared page count"));
            }
            let grains = (0..n)
                .map(|_| d.u64("shared grain").map_err(|_| bad("truncated shared pages")))
                .collect::<Result<Vec<u64>>>()?;
            if grains.iter().any(|&g| g >= eng.log.geo().total_grains) {
                return Err(bad("shared page past the end of the pool"));
            }
            let n = d.u64("share entry count").map_err(|_| bad("truncated shared pages"))?;
            if n > MAX_VOLUME_PAGES {
                return Err(bad("share entry count"));
            }
            let mut entries = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let page = d.u64("shared page").map_err(|_| bad("truncated shared pages"))?;
                let segment = d.u32("share entry segment").map_err(|_| bad("truncated shared pages"))?;
                if segment >= eng.log.geo().total_segments {
                    return Err(bad("share entry segment past the end of the pool"));
                }
                entries.push((page, segment));
            }
            vol.load_shared_pages(&grains, &entries);
        }
    }
    derive_segment_state(eng, &sealed)
}

/// Clears every map (before falling back from a bad checkpoint to a scan).
pub fn clear_maps(eng: &Engine) {
    for v in eng.volumes.read().values() {
        v.clear();
    }
}
