//! The clean-shutdown checkpoint: its image (every volume's map, the crc table, segment ages,
//! shared pages) and its load at the next open. A checkpoint that fails any check (checksum,
//! pool and session, counts, ranges) is refused whole, and the open falls back to the crash
//! scan after [`clear_maps`].

use super::derive_segment_state;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::format::MAX_VOLUME_PAGES;
use crate::format::{decode_checkpoint_header, CheckpointRef};
use crate::util::{AlignedBuf, Decoder};
use std::sync::atomic::Ordering::SeqCst;

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
