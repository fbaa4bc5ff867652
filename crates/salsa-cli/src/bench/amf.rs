//! `salsa bench-amf`: AMF's experiment (an append-only writer on application-managed flash
//! against a page-mapped device), on the `ssd` model. An LSM-style writer of segment-sized
//! tables runs, in one invocation and on identical fresh models, once on an AMF volume and once
//! on an LSA (page map) volume of the same size, rotating rounds (the AMF volume with its
//! default single stream and with eight streams): tables are written in
//! 1 MiB appends two at a time (a memtable flush and a compaction output, as RocksDB does),
//! and each compaction reads four live tables, writes three, adds one flushed table and trims
//! its four inputs whole. The live data stays at `--fill` of the volume.
//!
//! Reported per volume kind (medians over rounds) and as ratios: device write amplification
//! (SALSA's writes per user byte, the model's flash programs per host byte where it counts
//! them (`ssd`; a zoned drive has no FTL), and both together),
//! GC relocation, map memory (and per TiB of volume), modelled throughput (user bytes moved per
//! second of the model's time) and wall-clock throughput.

use crate::spec::DeviceSpec;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Volume, VolumeSpec};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// What one `salsa bench-amf` runs.
#[derive(Debug, Clone)]
pub struct Params {
    pub device: DeviceSpec,
    /// The device as given on the command line (for the report).
    pub device_text: String,
    /// The pool's segment and the AMF volume's (one table each).
    pub segment_bytes: u64,
    /// Live tables, as a share of the volume.
    pub fill: f64,
    /// User bytes written while measuring, in volume sizes.
    pub measure_volumes: f64,
    pub rounds: usize,
    pub seed: u64,
}

const WRITE_BYTES: u64 = 1 << 20;
/// The volumes compared: AMF with one stream (the default), AMF with eight, the page map.
const KINDS: [&str; 3] = ["amf", "amf8", "lsa"];
const COMPACTION_INPUTS: usize = 4;

/// The tables of the store: which slots (segment-sized) hold a live table.
struct Store {
    vol: Volume,
    table_bytes: u64,
    free: Vec<u64>,
    live: Vec<u64>,
    rng: SmallRng,
    buf: Vec<u8>,
    user_written: u64,
    user_read: u64,
}

impl Store {
    fn take_slot(&mut self) -> Result<u64, String> {
        let i = self.rng.gen_range(0..self.free.len().max(1));
        if self.free.is_empty() {
            return Err("no free table slot (lower --fill)".into());
        }
        Ok(self.free.swap_remove(i))
    }

    /// Writes whole tables into `slots`, 1 MiB at a time, the tables interleaved.
    fn write_tables(&mut self, slots: &[u64]) -> Result<(), String> {
        for off in (0..self.table_bytes).step_by(WRITE_BYTES as usize) {
            for &s in slots {
                let n = WRITE_BYTES.min(self.table_bytes - off) as usize;
                let stamp = self.rng.gen::<u64>();
                for chunk in self.buf[..n].chunks_mut(4096) {
                    chunk[..8].copy_from_slice(&stamp.to_le_bytes());
                }
                self.vol
                    .write(s * self.table_bytes + off, &self.buf[..n])
                    .map_err(|e| format!("table write: {e}"))?;
                self.user_written += n as u64;
            }
        }
        self.live.extend_from_slice(slots);
        Ok(())
    }

    /// A compaction: reads four live tables, writes three and a flushed one, trims the four.
    fn compact(&mut self) -> Result<(), String> {
        self.live.shuffle(&mut self.rng);
        let inputs: Vec<u64> = self.live.drain(..COMPACTION_INPUTS.min(self.live.len())).collect();
        let mut rbuf = vec![0u8; WRITE_BYTES as usize];
        for &s in &inputs {
            for off in (0..self.table_bytes).step_by(WRITE_BYTES as usize) {
                let n = WRITE_BYTES.min(self.table_bytes - off) as usize;
                self.vol
                    .read(s * self.table_bytes + off, &mut rbuf[..n])
                    .map_err(|e| format!("table read: {e}"))?;
                self.user_read += n as u64;
            }
        }
        let outs: Vec<u64> = (0..COMPACTION_INPUTS).map(|_| self.take_slot()).collect::<Result<_, _>>()?;
        self.write_tables(&outs[..2])?;
        self.write_tables(&outs[2..])?;
        self.vol.flush().map_err(|e| e.to_string())?;
        for s in inputs {
            self.vol
                .trim(s * self.table_bytes, self.table_bytes)
                .map_err(|e| format!("table trim: {e}"))?;
            self.free.push(s);
        }
        Ok(())
    }
}

/// Device counters of the model: host bytes written, flash programs, modelled time.
fn model_counters(devs: &[Arc<dyn Device>]) -> (u64, u64, u64) {
    let (mut host, mut nand, mut us) = (0, 0, 0);
    for d in devs {
        for (k, v) in d.counters() {
            match k.as_str() {
                "host_write_bytes" => host += v,
                "nand_program_bytes" | "media_write_bytes" => nand += v,
                "model_time_us" => us = us.max(v),
                _ => {}
            }
        }
    }
    (host, nand, us)
}

fn run_one(p: &Params, kind: &str, volume_bytes: u64, round: usize) -> Result<Value, String> {
    if !p.device.path.as_os_str().is_empty() {
        let _ = std::fs::remove_file(&p.device.path);
    }
    let dev = p.device.open(false)?;
    let cfg = PoolConfig {
        segment_bytes: Some(p.segment_bytes),
        ..PoolConfig::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &OpenOptions::default()).map_err(|e| format!("pool on the model: {e}"))?;
    let spec = match kind {
        "amf" => VolumeSpec::amf(4096, Some(p.segment_bytes)),
        "amf8" => VolumeSpec {
            segment_streams: Some(8),
            ..VolumeSpec::amf(4096, Some(p.segment_bytes))
        },
        _ => VolumeSpec::lsa(4096),
    };
    let vol = pool.create_volume_spec("lsm", volume_bytes, &spec).map_err(|e| e.to_string())?;
    let slots = volume_bytes / p.segment_bytes;
    let mut store = Store {
        vol,
        table_bytes: p.segment_bytes,
        free: (0..slots).collect(),
        live: Vec::new(),
        rng: SmallRng::seed_from_u64(p.seed ^ round as u64),
        buf: vec![0u8; WRITE_BYTES as usize],
        user_written: 0,
        user_read: 0,
    };
    // Load: flushed tables, two at a time, up to the fill.
    let target = ((slots as f64 * p.fill) as u64).max(COMPACTION_INPUTS as u64);
    while (store.live.len() as u64) < target {
        let pair = [store.take_slot()?, store.take_slot()?];
        store.write_tables(&pair)?;
    }
    store.vol.flush().map_err(|e| e.to_string())?;
    let devs = pool.devices();
    let (host0, nand0, us0) = model_counters(&devs);
    let st0 = pool.stats();
    let (w0, r0) = (store.user_written, store.user_read);
    let measure = (p.measure_volumes * volume_bytes as f64) as u64;
    let t = Instant::now();
    while store.user_written - w0 < measure {
        store.compact()?;
    }
    let wall_s = t.elapsed().as_secs_f64();
    let (host1, nand1, us1) = model_counters(&devs);
    let st = pool.stats();
    let written = store.user_written - w0;
    let moved = written + (store.user_read - r0);
    let host = (host1 - host0) as f64;
    let vs = st.volumes.iter().find(|v| v.name == "lsm").cloned().unwrap_or_default();
    let model_s = (us1 - us0) as f64 / 1e6;
    // SALSA's own writes (data, metadata, relocation, padding) per user byte; a model that
    // counts flash programs (ssd) adds its internal WA, one without an FTL (zoned) has none.
    let salsa_wa = (st.device_bytes_written - st0.device_bytes_written) as f64 / written.max(1) as f64;
    let internal_wa = (host > 0.0 && nand1 > nand0).then(|| (nand1 - nand0) as f64 / host);
    let out = json!({
        "volume": kind,
        "round": round,
        "user_written_bytes": written,
        "user_read_bytes": store.user_read - r0,
        "salsa_wa": salsa_wa,
        "device_internal_wa": internal_wa,
        "total_wa": salsa_wa * internal_wa.unwrap_or(1.0),
        "gc_relocated_bytes": st.gc_bytes_relocated - st0.gc_bytes_relocated,
        "discarded_bytes": st.discarded_bytes - st0.discarded_bytes,
        "free_segments_at_end": st.free_segments,
        "segments_by_state_at_end": st.segments_by_state.to_vec(),
        "map_memory_bytes": vs.map_memory_bytes,
        "map_memory_bytes_per_tib": vs.map_memory_bytes as f64 * (1u64 << 40) as f64 / volume_bytes as f64,
        "map_runs": vs.map_runs,
        "modelled_mb_per_s": (model_s > 0.0).then(|| moved as f64 / model_s / 1e6),
        "wall_mb_per_s": moved as f64 / wall_s.max(1e-9) / 1e6,
    });
    drop(store);
    pool.close().map_err(|e| e.to_string())?;
    if !p.device.path.as_os_str().is_empty() {
        let _ = std::fs::remove_file(&p.device.path);
    }
    Ok(out)
}

/// The median, `None` when no run reported the figure.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// Runs the rounds (AMF and LSA alternating, each on a fresh model) and returns the report.
pub fn run(p: &Params) -> Result<Value, String> {
    if p.device.model.is_none() {
        return Err("bench-amf runs on an emulated device: give --device ssd:size=... or zoned:size=...,zone=...".into());
    }
    if !(0.1..=0.9).contains(&p.fill) || p.rounds == 0 || p.measure_volumes <= 0.0 {
        return Err("--fill is 0.1 to 0.9, --rounds at least 1, --measure positive".into());
    }
    // One size for both kinds: what the AMF volume may hold (its eight streams keep open
    // segments of their own), in whole tables.
    let volume_bytes = {
        let dev = p.device.open(false)?;
        let cfg = PoolConfig {
            segment_bytes: Some(p.segment_bytes),
            ..PoolConfig::default()
        };
        let pool = Pool::create(vec![dev], &cfg, &OpenOptions::default()).map_err(|e| format!("pool on the model: {e}"))?;
        let usable = pool.logical_capacity_bytes().saturating_sub(10 * p.segment_bytes);
        drop(pool);
        usable / p.segment_bytes * p.segment_bytes
    };
    if volume_bytes < 8 * p.segment_bytes {
        return Err(format!(
            "the device holds too few tables of {} bytes; give a bigger model",
            p.segment_bytes
        ));
    }
    let mut runs = Vec::new();
    for round in 0..p.rounds {
        let mut order = KINDS;
        order.rotate_left(round % KINDS.len());
        for kind in order {
            eprintln!("round {}/{}: {kind}", round + 1, p.rounds);
            runs.push(run_one(p, kind, volume_bytes, round)?);
        }
    }
    let med = |kind: &str, key: &str| {
        median(
            runs.iter()
                .filter(|r| r["volume"] == kind)
                .filter_map(|r| r[key].as_f64())
                .collect(),
        )
    };
    let keys = [
        "discarded_bytes",
        "salsa_wa",
        "device_internal_wa",
        "total_wa",
        "gc_relocated_bytes",
        "map_memory_bytes",
        "map_memory_bytes_per_tib",
        "map_runs",
        "modelled_mb_per_s",
        "wall_mb_per_s",
    ];
    let summary = |kind: &str| -> Value { keys.iter().map(|k| (k.to_string(), json!(med(kind, k)))).collect() };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    Ok(json!({
        "benchmark": "amf_lsm_writer",
        "device": p.device_text,
        "volume_bytes": volume_bytes,
        "table_bytes": p.segment_bytes,
        "fill": p.fill,
        "measure_volumes": p.measure_volumes,
        "rounds": p.rounds,
        "amf": summary("amf"),
        "amf8": summary("amf8"),
        "lsa": summary("lsa"),
        "ratios": {
            "map_memory_lsa_over_amf": ratio(med("lsa", "map_memory_bytes"), med("amf", "map_memory_bytes")),
            "total_wa_amf_over_lsa": ratio(med("amf", "total_wa"), med("lsa", "total_wa")),
            "total_wa_amf8_over_lsa": ratio(med("amf8", "total_wa"), med("lsa", "total_wa")),
            "gc_relocated_amf_over_lsa": ratio(med("amf", "gc_relocated_bytes"), med("lsa", "gc_relocated_bytes")),
            "modelled_throughput_amf_over_lsa": ratio(med("amf", "modelled_mb_per_s"), med("lsa", "modelled_mb_per_s")),
            "modelled_throughput_amf8_over_lsa": ratio(med("amf8", "modelled_mb_per_s"), med("lsa", "modelled_mb_per_s")),
            "wall_throughput_amf_over_lsa": ratio(med("amf", "wall_mb_per_s"), med("lsa", "wall_mb_per_s")),
        },
        "runs": runs,
    }))
}
