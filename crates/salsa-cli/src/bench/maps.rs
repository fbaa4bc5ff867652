//! `salsa bench-map-memory`: map memory of the extent-mapped controller against the page map
//! on three workloads, each on a fresh in-memory pool: `sequential` (the volume written once
//! in 1 MiB writes), `video` (10 MiB files written in 1 MiB writes into random free slots, a
//! fifth of them deleted and rewritten, and a 4 KiB metadata write per file, as a file system
//! holding videos does) and `random` (the volume written sequentially, then overwritten once
//! by 4 KiB writes at random). Reports bytes, bytes per TiB of volume and the ratio.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use salsa_core::device::MemoryDevice;
use salsa_core::{ControllerKind, Device, OpenOptions, Pool, PoolConfig, Volume, VolumeSpec};
use serde_json::{json, Value};
use std::sync::Arc;

const FILE_BYTES: u64 = 10 << 20;
const WRITE_BYTES: u64 = 1 << 20;

fn run_workload(workload: &str, vol: &Volume, rng: &mut SmallRng) -> Result<(), String> {
    let size = vol.size_bytes();
    let big = vec![0x5Au8; WRITE_BYTES as usize];
    let small = vec![0xA5u8; 4096];
    let e = |e: salsa_core::Error| e.to_string();
    let sequential = |vol: &Volume| -> Result<(), String> {
        for at in (0..size).step_by(WRITE_BYTES as usize) {
            vol.write(at, &big[..WRITE_BYTES.min(size - at) as usize]).map_err(e)?;
        }
        Ok(())
    };
    match workload {
        "sequential" => sequential(vol)?,
        "random" => {
            sequential(vol)?;
            for _ in 0..size / 4096 {
                vol.write(rng.gen_range(0..size / 4096) * 4096, &small).map_err(e)?;
            }
        }
        "video" => {
            // The first 1% of the volume is the file system's metadata area.
            let meta_pages = (size / 100 / 4096).max(1);
            let slots = (size - meta_pages * 4096) / FILE_BYTES;
            let mut free: Vec<u64> = (0..slots).collect();
            free.shuffle(rng);
            let mut live = Vec::new();
            let write_file = |vol: &Volume, slot: u64, rng: &mut SmallRng| -> Result<(), String> {
                let base = meta_pages * 4096 + slot * FILE_BYTES;
                for off in (0..FILE_BYTES).step_by(WRITE_BYTES as usize) {
                    vol.write(base + off, &big).map_err(e)?;
                }
                vol.write(rng.gen_range(0..meta_pages) * 4096, &small).map_err(e)
            };
            while let Some(s) = free.pop() {
                write_file(vol, s, rng)?;
                live.push(s);
            }
            for _ in 0..slots / 5 {
                let i = rng.gen_range(0..live.len());
                let s = live.swap_remove(i);
                vol.trim(meta_pages * 4096 + s * FILE_BYTES, FILE_BYTES).map_err(e)?;
                write_file(vol, s, rng)?;
                live.push(s);
            }
        }
        other => return Err(format!("unknown workload {other:?}")),
    }
    vol.flush().map_err(e)
}

/// Runs every workload on both controllers; `volume_bytes` of volume in a pool a quarter
/// larger.
pub fn run(volume_bytes: u64, seed: u64) -> Result<Value, String> {
    let volume_bytes = volume_bytes / FILE_BYTES * FILE_BYTES;
    if volume_bytes < 4 * FILE_BYTES {
        return Err("the volume must hold a few 10 MiB files (at least 40M)".into());
    }
    let mut rows = Vec::new();
    for workload in ["sequential", "video", "random"] {
        let mut row = json!({ "workload": workload });
        for (name, kind) in [("lsa", ControllerKind::Lsa), ("extent", ControllerKind::Extent)] {
            let dev: Arc<dyn Device> = Arc::new(MemoryDevice::new("mem", volume_bytes + volume_bytes / 2 + (64 << 20)));
            let pool = Pool::create(vec![dev], &PoolConfig::default(), &OpenOptions::default()).map_err(|e| e.to_string())?;
            let spec = VolumeSpec {
                controller: kind,
                ..VolumeSpec::lsa(4096)
            };
            let vol = pool.create_volume_spec("v", volume_bytes, &spec).map_err(|e| e.to_string())?;
            run_workload(workload, &vol, &mut SmallRng::seed_from_u64(seed))?;
            let st = pool.stats();
            let v = st.volumes.iter().find(|v| v.name == "v").cloned().unwrap_or_default();
            row[name] = json!({
                "map_memory_bytes": v.map_memory_bytes,
                "map_memory_bytes_per_tib": v.map_memory_bytes as f64 * (1u64 << 40) as f64 / volume_bytes as f64,
                "map_runs": v.map_runs,
                "checkpoint_image_bytes": v.checkpoint_image_bytes,
            });
            drop(vol);
            pool.close().map_err(|e| e.to_string())?;
        }
        let (l, x) = (
            row["lsa"]["map_memory_bytes"].as_f64().unwrap_or(0.0),
            row["extent"]["map_memory_bytes"].as_f64().unwrap_or(0.0),
        );
        row["lsa_over_extent"] = json!(if x > 0.0 { l / x } else { 0.0 });
        rows.push(row);
    }
    Ok(json!({ "benchmark": "map_memory", "volume_bytes": volume_bytes, "seed": seed, "workloads": rows }))
}
