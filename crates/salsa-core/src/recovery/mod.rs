//! Rebuilding the in-memory state at open: from the clean-shutdown checkpoint when there is
//! one ([`checkpoint`]), otherwise by the crash scan of every segment's record chain
//! ([`crash_scan`], which replays each record through its volume's controller). Both end in
//! [`derive_segment_state`]: each segment's live counts, owner and state come from the volume
//! maps alone, so the log's accounting cannot disagree with the maps after an open.
//!
//! The record-chain walk itself is the log's ([`crate::log::chain`]): the GC walks victims with
//! it too, and the log sits below both.

pub(crate) mod checkpoint;
pub(crate) mod crash_scan;

pub(crate) use checkpoint::{checkpoint_bytes, clear_maps, encode_checkpoint, load_checkpoint};
pub(crate) use crash_scan::scan;

use crate::controller::Reference;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::log::capacity::SegmentState;
use std::sync::atomic::Ordering::SeqCst;

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
