//! `salsa bench-share`: SHARE's two experiments, each side by side with its baseline in one
//! invocation, alternating rounds on a fresh pool over the same device.
//!
//! - **Double write against share** (SHARE's InnoDB experiment): a page store of 16 KiB pages
//!   flushes batches of pages to random home addresses. The baseline writes each batch to a
//!   double-write area, flushes, writes every page home and flushes again (what InnoDB does so
//!   that a torn page can be restored); with share it writes the batch to the area and shares
//!   it home in one atomic batch, then flushes. Reported: pages per second, device bytes per
//!   user byte, flushes and device syncs per batch.
//! - **Compaction without copy** (SHARE's Couchbase experiment): an append-only file of 4 KiB
//!   pages whose updates were appended at its end is compacted into a new file holding the
//!   live pages in order, by copying them (read and write) or by sharing them (runs of pages
//!   contiguous in the old file become one range); then the old file is trimmed. Reported:
//!   seconds and device bytes written by the compaction.

use crate::spec::DeviceSpec;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use salsa_core::{OpenOptions, Pool, PoolConfig, ShareRange, Volume, VolumeSpec};
use serde_json::{json, Value};
use std::time::Instant;

/// What one `salsa bench-share` runs.
#[derive(Debug, Clone)]
pub struct Params {
    pub device: DeviceSpec,
    pub device_text: String,
    /// Pages per flushed batch (InnoDB flushes up to 64 or 128).
    pub batch_pages: usize,
    /// Batches measured per round.
    pub batches: usize,
    /// Bytes of the file compacted.
    pub file_bytes: u64,
    /// Share of the file's pages updated (appended again) before compaction.
    pub updated: f64,
    pub rounds: usize,
    pub seed: u64,
}

const STORE_PAGE: u64 = 16 << 10;
const FILE_PAGE: u64 = 4 << 10;
/// Ranges per share call of the compaction (a batch must fit one record; see `Volume::share`).
const COMPACTION_BATCH_RANGES: usize = 64;

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

fn fresh_pool(p: &Params) -> Result<Pool, String> {
    if !p.device.path.as_os_str().is_empty() {
        let _ = std::fs::remove_file(&p.device.path);
    }
    let dev = p.device.open(false)?;
    Pool::create(vec![dev], &PoolConfig::default(), &OpenOptions::default()).map_err(|e| format!("pool: {e}"))
}

fn close(p: &Params, pool: Pool) -> Result<(), String> {
    pool.close().map_err(|e| e.to_string())?;
    if !p.device.path.as_os_str().is_empty() {
        let _ = std::fs::remove_file(&p.device.path);
    }
    Ok(())
}

/// Fills pages of `page_bytes` numbered `first..`: each page's words name its number, so a
/// page can be checked against where it came from.
fn stamp(buf: &mut [u8], page_bytes: u64, first: u64) {
    for (i, chunk) in buf.chunks_mut(page_bytes as usize).enumerate() {
        let word = first.wrapping_add(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for w in chunk.chunks_mut(8) {
            w.copy_from_slice(&word.to_le_bytes());
        }
    }
}

/// One round of the page store, `mode` "double-write" or "share".
fn page_store(p: &Params, mode: &str, round: usize) -> Result<Value, String> {
    let pool = fresh_pool(p)?;
    let usable = pool.logical_capacity_bytes();
    // Half the pool in home pages: the GC has room, as a database's tablespace leaves it.
    let home_pages = (usable / 2 / STORE_PAGE).max(p.batch_pages as u64 * 4);
    let area = home_pages; // the double-write area follows the homes
    let vol_bytes = (home_pages + p.batch_pages as u64) * STORE_PAGE;
    let vol = pool
        .create_volume_spec("store", vol_bytes, &VolumeSpec::lsa(STORE_PAGE as u32))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    for at in (0..home_pages * STORE_PAGE).step_by(buf.len()) {
        let n = (buf.len() as u64).min(home_pages * STORE_PAGE - at) as usize;
        stamp(&mut buf[..n], STORE_PAGE, at / STORE_PAGE);
        vol.write(at, &buf[..n]).map_err(|e| e.to_string())?;
    }
    vol.flush().map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(p.seed ^ round as u64);
    let mut batch = vec![0u8; p.batch_pages * STORE_PAGE as usize];
    let st0 = pool.stats();
    let t = Instant::now();
    for b in 0..p.batches {
        stamp(&mut batch, STORE_PAGE, rng.gen());
        let homes: Vec<u64> = (0..p.batch_pages).map(|_| rng.gen_range(0..home_pages)).collect();
        // The batch goes to the double-write area in one sequential write either way.
        vol.write(area * STORE_PAGE, &batch).map_err(|e| e.to_string())?;
        if mode == "double-write" {
            vol.flush().map_err(|e| e.to_string())?;
            for (i, h) in homes.iter().enumerate() {
                let page = &batch[i * STORE_PAGE as usize..(i + 1) * STORE_PAGE as usize];
                vol.write(h * STORE_PAGE, page).map_err(|e| e.to_string())?;
            }
        } else {
            // A page chosen twice in one batch goes home once (destinations must not overlap).
            let mut seen = std::collections::HashSet::new();
            let ranges: Vec<ShareRange> = homes
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, h)| seen.insert(**h))
                .map(|(i, h)| ShareRange {
                    dst_offset: h * STORE_PAGE,
                    src_offset: (area + i as u64) * STORE_PAGE,
                    len_bytes: STORE_PAGE,
                })
                .collect();
            vol.share(&ranges).map_err(|e| format!("share of batch {b}: {e}"))?;
        }
        vol.flush().map_err(|e| e.to_string())?;
    }
    let secs = t.elapsed().as_secs_f64();
    let st = pool.stats();
    let user = (p.batches * p.batch_pages) as u64 * STORE_PAGE;
    let out = json!({
        "mode": mode,
        "round": round,
        "pages_per_s": (p.batches * p.batch_pages) as f64 / secs.max(1e-9),
        "device_bytes_per_user_byte": (st.device_bytes_written - st0.device_bytes_written) as f64 / user as f64,
        "flushes_per_batch": (st.flushes - st0.flushes) as f64 / p.batches as f64,
        "syncs_per_batch": (st.syncs - st0.syncs) as f64 / p.batches as f64,
        "gc_relocated_bytes": st.gc_bytes_relocated - st0.gc_bytes_relocated,
        "shared_pages_at_end": st.volumes.iter().find(|v| v.name == "store").map(|v| v.shared_pages),
    });
    drop(vol);
    close(p, pool)?;
    Ok(out)
}

/// Where each page of the file lives: its offset in pages from the file's start.
fn write_file(vol: &Volume, pages: u64, updated: f64, rng: &mut SmallRng) -> Result<(Vec<u64>, u64), String> {
    let mut buf = vec![0u8; 1 << 20];
    let per = buf.len() as u64 / FILE_PAGE;
    let mut at = 0u64;
    while at < pages {
        let n = per.min(pages - at);
        stamp(&mut buf[..(n * FILE_PAGE) as usize], FILE_PAGE, at);
        vol.write(at * FILE_PAGE, &buf[..(n * FILE_PAGE) as usize])
            .map_err(|e| e.to_string())?;
        at += n;
    }
    // Updates are appended, a few pages at a time, as a B-tree file's are.
    let mut location: Vec<u64> = (0..pages).collect();
    let mut end = pages;
    let updates = (pages as f64 * updated) as u64;
    let mut done = 0;
    while done < updates {
        let run = rng.gen_range(1..=8u64).min(updates - done);
        let first = rng.gen_range(0..pages - run);
        stamp(&mut buf[..(run * FILE_PAGE) as usize], FILE_PAGE, end);
        vol.write(end * FILE_PAGE, &buf[..(run * FILE_PAGE) as usize])
            .map_err(|e| e.to_string())?;
        for i in 0..run {
            location[(first + i) as usize] = end + i;
        }
        end += run;
        done += run;
    }
    vol.flush().map_err(|e| e.to_string())?;
    Ok((location, end))
}

/// One round of compaction, `mode` "copy" or "share".
fn compaction(p: &Params, mode: &str, round: usize) -> Result<Value, String> {
    let pool = fresh_pool(p)?;
    let pages = p.file_bytes / FILE_PAGE;
    let file_span = pages + (pages as f64 * p.updated) as u64 + 8;
    let vol_bytes = (file_span + pages) * FILE_PAGE;
    if vol_bytes * 10 / 7 > pool.logical_capacity_bytes() {
        return Err(format!("the device is too small for a {} file; give a bigger one", p.file_bytes));
    }
    let vol = pool
        .create_volume_spec("file", vol_bytes, &VolumeSpec::lsa(FILE_PAGE as u32))
        .map_err(|e| e.to_string())?;
    let mut rng = SmallRng::seed_from_u64(p.seed ^ 0x5eed ^ round as u64);
    let (location, end) = write_file(&vol, pages, p.updated, &mut rng)?;
    let new_file = file_span; // the compacted file starts after the old one's span
    let st0 = pool.stats();
    let t = Instant::now();
    // Runs of the new file whose pages sit one after another in the old.
    let mut runs: Vec<(u64, u64, u64)> = Vec::new(); // (new page, old page, pages)
    for (i, &loc) in location.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.0 + r.2 == i as u64 && r.1 + r.2 == loc => r.2 += 1,
            _ => runs.push((i as u64, loc, 1)),
        }
    }
    if mode == "copy" {
        let mut buf = vec![0u8; 1 << 20];
        let per = buf.len() as u64 / FILE_PAGE;
        let mut i = 0u64;
        while i < pages {
            let n = per.min(pages - i);
            // Read the live pages of this window (runs at a time), then write it in order.
            let mut k = 0u64;
            while k < n {
                let loc = location[(i + k) as usize];
                let mut len = 1;
                while k + len < n && location[(i + k + len) as usize] == loc + len {
                    len += 1;
                }
                let out = &mut buf[(k * FILE_PAGE) as usize..((k + len) * FILE_PAGE) as usize];
                vol.read(loc * FILE_PAGE, out).map_err(|e| e.to_string())?;
                k += len;
            }
            vol.write((new_file + i) * FILE_PAGE, &buf[..(n * FILE_PAGE) as usize])
                .map_err(|e| e.to_string())?;
            i += n;
        }
    } else {
        for chunk in runs.chunks(COMPACTION_BATCH_RANGES) {
            share_split(&vol, chunk, new_file)?;
        }
    }
    vol.flush().map_err(|e| e.to_string())?;
    // The old file is deleted.
    vol.trim(0, end * FILE_PAGE).map_err(|e| e.to_string())?;
    vol.flush().map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let st = pool.stats();
    // Check the new file (every 97th page) against where its pages came from.
    let mut page = vec![0u8; FILE_PAGE as usize];
    let mut want = vec![0u8; FILE_PAGE as usize];
    for i in (0..pages).step_by(97) {
        vol.read((new_file + i) * FILE_PAGE, &mut page).map_err(|e| e.to_string())?;
        stamp(&mut want, FILE_PAGE, location[i as usize]);
        if page != want {
            return Err(format!(
                "{mode}: compacted page {i} does not hold the live page at {}",
                location[i as usize]
            ));
        }
    }
    let out = json!({
        "mode": mode,
        "round": round,
        "seconds": secs,
        "device_bytes_written": st.device_bytes_written - st0.device_bytes_written,
        "runs": runs.len(),
        "file_bytes": pages * FILE_PAGE,
    });
    drop(vol);
    close(p, pool)?;
    Ok(out)
}

/// Shares `runs` into the new file, halving a batch whose entries do not fit one record.
fn share_split(vol: &Volume, runs: &[(u64, u64, u64)], new_file: u64) -> Result<(), String> {
    let ranges: Vec<ShareRange> = runs
        .iter()
        .map(|&(new, old, n)| ShareRange {
            dst_offset: (new_file + new) * FILE_PAGE,
            src_offset: old * FILE_PAGE,
            len_bytes: n * FILE_PAGE,
        })
        .collect();
    match vol.share(&ranges) {
        Ok(()) => Ok(()),
        Err(e) if e.to_string().contains("metadata slots") && runs.len() > 1 => {
            let (a, b) = runs.split_at(runs.len() / 2);
            share_split(vol, a, new_file)?;
            share_split(vol, b, new_file)
        }
        Err(e) => Err(format!("share: {e}")),
    }
}

/// Runs both experiments, alternating their modes round by round, and returns the report.
pub fn run(p: &Params) -> Result<Value, String> {
    if p.batch_pages == 0 || p.batch_pages > salsa_core::pool::MAX_SHARE_RANGES || p.batches == 0 || p.rounds == 0 {
        return Err(format!(
            "--batch is 1 to {}, --batches and --rounds at least 1",
            salsa_core::pool::MAX_SHARE_RANGES
        ));
    }
    if !(0.0..=1.0).contains(&p.updated) || p.file_bytes < (1 << 20) {
        return Err("--updated is 0 to 1 and --file-size at least 1M".into());
    }
    let mut store_runs = Vec::new();
    let mut compaction_runs = Vec::new();
    for round in 0..p.rounds {
        let store_modes = if round % 2 == 0 {
            ["double-write", "share"]
        } else {
            ["share", "double-write"]
        };
        for mode in store_modes {
            eprintln!("round {}/{}: page store, {mode}", round + 1, p.rounds);
            store_runs.push(page_store(p, mode, round)?);
        }
        let compaction_modes = if round % 2 == 0 { ["copy", "share"] } else { ["share", "copy"] };
        for mode in compaction_modes {
            eprintln!("round {}/{}: compaction, {mode}", round + 1, p.rounds);
            compaction_runs.push(compaction(p, mode, round)?);
        }
    }
    let med =
        |runs: &[Value], mode: &str, key: &str| median(runs.iter().filter(|r| r["mode"] == mode).filter_map(|r| r[key].as_f64()).collect());
    // The median of `key` in mode `a`'s runs over mode `b`'s.
    let ratio = |runs: &[Value], a: &str, b: &str, key: &str| match (med(runs, a, key), med(runs, b, key)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let store = |mode: &str| {
        json!({
            "pages_per_s": med(&store_runs, mode, "pages_per_s"),
            "device_bytes_per_user_byte": med(&store_runs, mode, "device_bytes_per_user_byte"),
            "flushes_per_batch": med(&store_runs, mode, "flushes_per_batch"),
            "syncs_per_batch": med(&store_runs, mode, "syncs_per_batch"),
            "gc_relocated_bytes": med(&store_runs, mode, "gc_relocated_bytes"),
        })
    };
    let compact = |mode: &str| {
        json!({
            "seconds": med(&compaction_runs, mode, "seconds"),
            "device_bytes_written": med(&compaction_runs, mode, "device_bytes_written"),
        })
    };
    Ok(json!({
        "benchmark": "share",
        "device": p.device_text,
        "rounds": p.rounds,
        "page_store": {
            "page_bytes": STORE_PAGE,
            "batch_pages": p.batch_pages,
            "batches": p.batches,
            "double_write": store("double-write"),
            "share": store("share"),
            "ratios": {
                "throughput_share_over_double_write": ratio(&store_runs, "share", "double-write", "pages_per_s"),
                "device_bytes_share_over_double_write": ratio(&store_runs, "share", "double-write", "device_bytes_per_user_byte"),
            },
            "runs": store_runs,
        },
        "compaction": {
            "file_bytes": p.file_bytes,
            "updated": p.updated,
            "copy": compact("copy"),
            "share": compact("share"),
            "ratios": {
                "time_share_over_copy": ratio(&compaction_runs, "share", "copy", "seconds"),
                "device_bytes_share_over_copy": ratio(&compaction_runs, "share", "copy", "device_bytes_written"),
            },
            "runs": compaction_runs,
        },
    }))
}
