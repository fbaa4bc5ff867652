//! `salsa bench`: uniform random 4 KiB overwrites at a fixed queue depth on a pool with a given
//! spare, after the volume was written once, side by side with the same workload written
//! directly to the same backing file with `O_DIRECT` (same queue depth, same I/O engine:
//! one synchronous `pwrite` per in-flight request, from as many threads as the queue depth).
//!
//! Reports steady-state write amplification against Desnoyers' analytic value for greedy
//! cleaning, the median per-second throughput of both (and their ratio), and map memory.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::device::file::FileOpenOptions;
use salsa_core::device::{FileDevice, MemoryDevice};
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parameters of one benchmark run.
#[derive(Debug, Clone)]
pub struct BenchParams {
    /// Backing file; `None` runs on memory (no baseline then).
    pub file: Option<std::path::PathBuf>,
    pub size_bytes: u64,
    pub spare_percent: f64,
    pub queue_depth: usize,
    pub block_bytes: usize,
    /// Overwrites before measuring, in volume sizes.
    pub warmup_volumes: f64,
    /// Overwrites measured, in volume sizes.
    pub measure_volumes: f64,
    pub baseline_seconds: u64,
    pub segment_bytes: Option<u64>,
    pub victim_policy: String,
    /// SALSA's device goes through the page cache (the baseline is always `O_DIRECT`).
    pub page_cache: bool,
    /// SALSA paces its writers while the GC is behind (`salsa serve --pace-writes`).
    pub pace_writes: bool,
}

/// Steady-state write amplification of greedy cleaning under uniform random writes, with spare
/// fraction `s` of physical space, in the many-pages-per-segment limit (Desnoyers; Hu et al.):
/// the utilisation `u` of cleaned segments solves `α = (u - 1) / ln u` with `α = 1 - s` the
/// logical/physical ratio, and WA = 1 / (1 - u). For `s = 0.2` this is 2.69.
pub fn analytic_greedy_wa(spare_fraction: f64) -> f64 {
    let alpha = 1.0 - spare_fraction;
    // (u - 1) / ln u increases from 0 to 1 on (0, 1): bisect.
    let (mut lo, mut hi) = (1e-12f64, 1.0 - 1e-12);
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if (mid - 1.0) / mid.ln() < alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    1.0 / (1.0 - (lo + hi) / 2.0)
}

/// Samples a byte counter once a second while `run` runs; returns MB/s samples.
pub(crate) fn sampled<T>(counter: &AtomicU64, run: impl FnOnce() -> T) -> (T, Vec<f64>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut samples = Vec::new();
            let mut last = counter.load(Relaxed);
            let mut t = Instant::now();
            while !stop.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if t.elapsed() >= Duration::from_secs(1) {
                    let now = counter.load(Relaxed);
                    samples.push((now - last) as f64 / t.elapsed().as_secs_f64() / 1e6);
                    last = now;
                    t = Instant::now();
                }
            }
            // A run shorter than one interval still gets its rate, over what it took.
            if samples.is_empty() {
                samples.push((counter.load(Relaxed) - last) as f64 / t.elapsed().as_secs_f64().max(1e-3) / 1e6);
            }
            samples
        });
        let out = run();
        stop.store(true, Relaxed);
        (out, sampler.join().unwrap_or_default())
    })
}

/// Opens an existing file with `O_DIRECT`, refusing a file system that falls back to the page
/// cache (a baseline would then measure memory).
pub(crate) fn open_direct(path: &std::path::Path) -> Result<FileDevice, String> {
    let dev = FileDevice::open(
        path,
        FileOpenOptions {
            create_size_bytes: None,
            direct: true,
            read_only: false,
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if !dev.is_direct() {
        return Err(format!(
            "{} does not support O_DIRECT; the baseline would measure the page cache",
            path.display()
        ));
    }
    Ok(dev)
}

/// Random block writes straight to the file, `O_DIRECT`, for `seconds`.
fn raw_baseline(p: &BenchParams, path: &std::path::Path) -> Result<Vec<f64>, String> {
    let dev = open_direct(path)?;
    let blocks = dev.size_bytes() / p.block_bytes as u64;
    let written = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(p.baseline_seconds);
    let (res, samples) = sampled(&written, || {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..p.queue_depth)
                .map(|t| {
                    let (dev, written) = (&dev, &written);
                    s.spawn(move || -> Result<(), String> {
                        let mut rng = SmallRng::seed_from_u64(t as u64 + 1);
                        let mut buf = salsa_core::AlignedBuf::zeroed(p.block_bytes);
                        rng.fill(&mut buf[..]);
                        while Instant::now() < deadline {
                            let b = rng.gen_range(0..blocks);
                            dev.write_at(&buf, b * p.block_bytes as u64).map_err(|e| e.to_string())?;
                            written.fetch_add(p.block_bytes as u64, Relaxed);
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().map_err(|_| "baseline thread panicked".to_string())?)
        })
    });
    res?;
    Ok(samples)
}

/// Writes the whole file once so both runs see allocated blocks.
pub(crate) fn preallocate(path: &std::path::Path, size: u64) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let dev = FileDevice::open(
        path,
        FileOpenOptions {
            create_size_bytes: Some(size),
            direct: true,
            read_only: false,
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let chunk = salsa_core::AlignedBuf::zeroed(1 << 20);
    let mut off = 0;
    while off < size {
        let n = (size - off).min(1 << 20) as usize;
        dev.write_at(&chunk[..n], off).map_err(|e| e.to_string())?;
        off += n as u64;
    }
    dev.sync().map_err(|e| e.to_string())
}

/// What one run measured.
#[derive(Debug)]
pub struct BenchReport {
    pub salsa_mbps_median: f64,
    pub baseline_mbps_median: Option<f64>,
    pub gc_write_amplification: f64,
    pub device_write_amplification: f64,
    pub analytic_wa: f64,
    pub map_bytes_per_gib: f64,
    pub crc_table_bytes_per_gib: f64,
    pub volume_bytes: u64,
    pub salsa_samples: Vec<f64>,
    pub baseline_samples: Vec<f64>,
}

pub fn run(p: &BenchParams, progress: &dyn Fn(&str)) -> Result<BenchReport, String> {
    let mut baseline_samples = Vec::new();
    let dev = open_device(p, progress, &mut baseline_samples)?;
    let cfg = PoolConfig {
        spare_percent: p.spare_percent,
        segment_bytes: p.segment_bytes,
        victim_policy: p.victim_policy.clone(),
        ..PoolConfig::default()
    };
    let opts = OpenOptions {
        pace_user_writes: p.pace_writes,
        ..OpenOptions::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &opts).map_err(|e| e.to_string())?;
    let vol = pool
        .create_volume("bench", pool.logical_capacity_bytes(), 4096)
        .map_err(|e| e.to_string())?;
    let vol_bytes = vol.size_bytes();
    progress(&format!("precondition: writing the {} MiB volume once", vol_bytes >> 20));
    let chunk = vec![0x5au8; 1 << 20];
    let mut off = 0;
    while off < vol_bytes {
        let n = (vol_bytes - off).min(chunk.len() as u64) as usize;
        vol.write(off, &chunk[..n]).map_err(|e| e.to_string())?;
        off += n as u64;
    }
    pool.flush().map_err(|e| e.to_string())?;
    let written = AtomicU64::new(0);
    progress(&format!("warm-up: {:.1} volume(s) of random overwrites", p.warmup_volumes));
    overwrite(p, &vol, &written, (vol_bytes as f64 * p.warmup_volumes) as u64, 1)?;
    let before = pool.stats();
    progress(&format!("measuring: {:.1} volume(s) of random overwrites", p.measure_volumes));
    let (res, salsa_samples) = sampled(&written, || {
        overwrite(p, &vol, &written, (vol_bytes as f64 * p.measure_volumes) as u64, 2)
    });
    res?;
    let after = pool.stats();
    progress(&format!(
        "window: {} victims cleaned ({} ms relocating), {} syncs ({} ms), {} flushes, {} throttled allocations",
        after.gc_segments_cleaned - before.gc_segments_cleaned,
        (after.gc_micros - before.gc_micros) / 1000,
        after.syncs - before.syncs,
        (after.sync_micros - before.sync_micros) / 1000,
        after.flushes - before.flushes,
        after.throttled_allocations - before.throttled_allocations
    ));
    let user = (after.user_bytes_written - before.user_bytes_written) as f64;
    let gc = (after.gc_bytes_relocated - before.gc_bytes_relocated) as f64;
    let device = (after.device_bytes_written - before.device_bytes_written) as f64;
    let gib = (1u64 << 30) as f64;
    let physical = after.total_segments as f64 * after.segment_bytes as f64;
    let report_pre = (
        after.map_memory_bytes as f64 / (vol_bytes as f64 / gib),
        after.crc_table_memory_bytes as f64 / (physical / gib),
    );
    drop(vol);
    pool.close().map_err(|e| e.to_string())?;
    if let Some(path) = &p.file {
        progress("baseline again (brackets the SALSA run against drift of the shared disk)");
        baseline_samples.extend(raw_baseline(p, path)?);
    }
    Ok(BenchReport {
        salsa_mbps_median: super::median(salsa_samples.clone()),
        baseline_mbps_median: (!baseline_samples.is_empty()).then(|| super::median(baseline_samples.clone())),
        gc_write_amplification: (user + gc) / user,
        device_write_amplification: device / user,
        analytic_wa: analytic_greedy_wa(p.spare_percent / 100.0),
        map_bytes_per_gib: report_pre.0,
        crc_table_bytes_per_gib: report_pre.1,
        volume_bytes: vol_bytes,
        salsa_samples,
        baseline_samples,
    })
}

/// Random overwrites of `p.block_bytes` from `p.queue_depth` threads until `written` has
/// grown by `bytes`; each thread's data seeded from `seed`.
fn overwrite(p: &BenchParams, vol: &salsa_core::Volume, written: &AtomicU64, bytes: u64, seed: u64) -> Result<(), String> {
    let blocks = vol.size_bytes() / p.block_bytes as u64;
    let target = written.load(Relaxed) + bytes;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..p.queue_depth)
            .map(|t| {
                s.spawn(move || -> Result<(), String> {
                    let mut rng = SmallRng::seed_from_u64(seed * 1000 + t as u64);
                    let mut buf = vec![0u8; p.block_bytes];
                    rng.fill(&mut buf[..]);
                    while written.load(Relaxed) < target {
                        let b = rng.gen_range(0..blocks);
                        buf[..8].copy_from_slice(&b.to_le_bytes());
                        vol.write(b * p.block_bytes as u64, &buf).map_err(|e| e.to_string())?;
                        written.fetch_add(p.block_bytes as u64, Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().map_err(|_| "writer thread panicked".to_string())?)
    })
}

/// The device the bench runs on: a preallocated file (measuring the raw baseline on it first,
/// into `baseline_samples`) or memory.
fn open_device(p: &BenchParams, progress: &dyn Fn(&str), baseline_samples: &mut Vec<f64>) -> Result<Arc<dyn Device>, String> {
    Ok(match &p.file {
        Some(path) => {
            progress(&format!("preallocating {} ({} MiB)", path.display(), p.size_bytes >> 20));
            preallocate(path, p.size_bytes)?;
            progress(&format!(
                "baseline: random {} B O_DIRECT writes, {} threads, {} s",
                p.block_bytes, p.queue_depth, p.baseline_seconds
            ));
            baseline_samples.extend(raw_baseline(p, path)?);
            Arc::new(
                FileDevice::open(
                    path,
                    FileOpenOptions {
                        create_size_bytes: None,
                        direct: !p.page_cache,
                        read_only: false,
                    },
                )
                .map_err(|e| e.to_string())?,
            )
        }
        None => Arc::new(MemoryDevice::new("memory", p.size_bytes)),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn analytic_value_matches_the_issue() {
        let wa = super::analytic_greedy_wa(0.2);
        assert!((wa - 2.69).abs() < 0.005, "{wa}");
        assert!(super::analytic_greedy_wa(0.1) > wa && super::analytic_greedy_wa(0.28) < wa);
    }
}
