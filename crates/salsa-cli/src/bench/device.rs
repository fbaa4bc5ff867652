//! `salsa bench-device`: the paper's microbenchmarks (section V-A) on an emulated device. The
//! same workload runs, in one invocation and on identical fresh models, once through SALSA and
//! once straight on the raw device (on a partition of the size of SALSA's volume, as the paper
//! did), and the report compares what the device did: its internal write amplification, the
//! flash or media writes per user byte (wear), and throughput over the device's modelled time.
//!
//! Owns: the two targets (raw partition, SALSA volume), the precondition (one sequential and
//! one random pass, as the paper), the sampler of device counters, and the report and charts.

use super::plot;
use super::trace::OpKind;
use super::workload::{Generator, Request, Spec};
use crate::spec::DeviceSpec;
use parking_lot::Mutex;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// What one `salsa bench-device` runs.
#[derive(Debug, Clone)]
pub struct Params {
    pub device: DeviceSpec,
    pub workload: Spec,
    pub read_percent: f64,
    pub block_bytes: u64,
    pub queue_depth: usize,
    pub spare_percent: f64,
    pub segment_bytes: Option<u64>,
    pub page_bytes: u32,
    pub placement: String,
    pub victim: String,
    /// Also run the raw device.
    pub raw: bool,
    /// SALSA discards the segments it frees.
    pub discard: bool,
    /// The GC's write burst (`None`: the device's preferred, `Some(0)`: off).
    pub gc_burst_bytes: Option<u64>,
    /// Precondition: one sequential and one random pass over the target.
    pub precondition: bool,
    /// Writes measured, in target sizes.
    pub measure_volumes: f64,
    /// The target split into this many equal volumes (partitions on the raw device).
    pub volumes: u32,
    /// Each worker flushes its volume after writing this many bytes.
    pub flush_every_bytes: Option<u64>,
    pub seed: u64,
    pub out_dir: Option<PathBuf>,
}

/// Where the workload goes: the raw device (a partition of `size` bytes at its start, split
/// into equal parts only by name), or SALSA volumes of one pool, each `size / vols.len()` bytes,
/// lying one after the other in the target's address space.
enum Target {
    Raw { dev: Arc<dyn Device>, size: u64 },
    Salsa { pool: Pool, vols: Vec<salsa_core::Volume> },
}

impl Target {
    fn size(&self) -> u64 {
        match self {
            Target::Raw { size, .. } => *size,
            Target::Salsa { vols, .. } => vols.iter().map(|v| v.size_bytes()).sum(),
        }
    }

    /// The volume holding target offset `offset`, the offset inside it and the bytes from
    /// there to the volume's end.
    fn locate(vols: &[salsa_core::Volume], offset: u64) -> Result<(&salsa_core::Volume, u64, u64), String> {
        let mut at = offset;
        for v in vols {
            if at < v.size_bytes() {
                return Ok((v, at, v.size_bytes() - at));
            }
            at -= v.size_bytes();
        }
        Err(format!("offset {offset} lies beyond the volumes"))
    }

    /// Runs `op` on each piece of `[offset, offset + len)` as the volumes divide it.
    fn pieces(
        &self,
        offset: u64,
        len: u64,
        mut op: impl FnMut(&salsa_core::Volume, u64, std::ops::Range<usize>) -> Result<(), String>,
    ) -> Result<(), String> {
        let Target::Salsa { vols, .. } = self else {
            unreachable!("pieces of a raw target")
        };
        let mut done = 0;
        while done < len {
            let (v, at, room) = Self::locate(vols, offset + done)?;
            let n = room.min(len - done);
            op(v, at, done as usize..(done + n) as usize)?;
            done += n;
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), String> {
        match self {
            Target::Raw { dev, .. } => dev.write_at(data, offset).map_err(|e| e.to_string()),
            Target::Salsa { .. } => self.pieces(offset, data.len() as u64, |v, at, r| {
                v.write(at, &data[r]).map_err(|e| e.to_string())
            }),
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
        match self {
            Target::Raw { dev, .. } => dev.read_at(buf, offset).map_err(|e| e.to_string()),
            Target::Salsa { .. } => self.pieces(offset, buf.len() as u64, |v, at, r| {
                v.read(at, &mut buf[r]).map_err(|e| e.to_string())
            }),
        }
    }
    /// A trace's discard: the raw device's discard (a TRIM on an SSD model), SALSA's trim.
    fn trim(&self, offset: u64, len: u64) -> Result<(), String> {
        match self {
            Target::Raw { dev, .. } => dev.discard(offset, len).map_err(|e| e.to_string()),
            Target::Salsa { .. } => self.pieces(offset, len, |v, at, r| v.trim(at, r.len() as u64).map_err(|e| e.to_string())),
        }
    }
    /// A commit after writes at `offset`: the raw device's cache flush, or the flush of the
    /// volume holding `offset`.
    fn flush(&self, offset: u64) -> Result<(), String> {
        match self {
            Target::Raw { dev, .. } => dev.sync().map_err(|e| e.to_string()),
            Target::Salsa { vols, .. } => Self::locate(vols, offset)?.0.flush().map_err(|e| e.to_string()),
        }
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        match self {
            Target::Raw { dev, .. } => vec![dev.clone()],
            Target::Salsa { pool, .. } => pool.devices(),
        }
    }
}

/// Device counters summed over the target's devices.
#[derive(Debug, Clone, Copy, Default)]
struct DeviceSample {
    user_bytes: u64,
    user_written: u64,
    host_written: u64,
    /// Flash programs (SSD) or media writes (disks), bytes.
    media_written: u64,
    erases: u64,
    model_us: u64,
}

fn sample(t: &Target, user_bytes: u64, user_written: u64) -> DeviceSample {
    let mut s = DeviceSample {
        user_bytes,
        user_written,
        ..DeviceSample::default()
    };
    for d in t.devices() {
        for (k, v) in d.counters() {
            match k.as_str() {
                "host_write_bytes" => s.host_written += v,
                "nand_program_bytes" | "media_write_bytes" => s.media_written += v,
                "block_erases" => s.erases += v,
                "model_time_us" => s.model_us = s.model_us.max(v),
                _ => {}
            }
        }
    }
    s
}

/// One aligned buffer per worker (O_DIRECT backings need it).
fn aligned(len: usize) -> salsa_core::AlignedBuf {
    salsa_core::AlignedBuf::zeroed(len)
}

/// Runs `bytes` of the workload at the queue depth; samples the devices every `sample_bytes`.
fn run_workload(
    t: &Target,
    gen: &mut Generator,
    p: &Params,
    bytes: u64,
    samples: &Mutex<Vec<DeviceSample>>,
    sample_bytes: u64,
) -> Result<(), String> {
    let gen = Mutex::new(gen);
    let done = AtomicU64::new(0);
    let written = AtomicU64::new(0);
    let next_sample = AtomicU64::new(sample_bytes);
    let failed = AtomicBool::new(false);
    let error: Mutex<Option<String>> = Mutex::new(None);
    let bar = crate::progress_bar("measure");
    std::thread::scope(|s| {
        for worker in 0..p.queue_depth.max(1) {
            let (gen, done, written, next_sample, failed, error, bar) = (&gen, &done, &written, &next_sample, &failed, &error, &bar);
            s.spawn(move || {
                let mut buf = aligned(p.block_bytes as usize);
                let mut stamp = (p.seed << 20) ^ (worker as u64) << 48;
                let mut unflushed = 0u64;
                while !failed.load(Relaxed) && done.load(Relaxed) < bytes {
                    let Some(Request { kind, offset, len, .. }) = gen.lock().next_request() else {
                        break;
                    };
                    let len = len.min(t.size().saturating_sub(offset)) as usize;
                    if len == 0 {
                        continue;
                    }
                    if kind == OpKind::Trim {
                        if let Err(e) = t.trim(offset, len as u64) {
                            failed.store(true, Relaxed);
                            *error.lock() = Some(e);
                            break;
                        }
                        continue;
                    }
                    let r = if kind == OpKind::Write {
                        stamp += 1;
                        for chunk in buf[..len].chunks_mut(4096) {
                            let n = chunk.len().min(8);
                            chunk[..n].copy_from_slice(&stamp.to_le_bytes()[..n]);
                        }
                        written.fetch_add(len as u64, Relaxed);
                        unflushed += len as u64;
                        t.write(offset, &buf[..len]).and_then(|()| match p.flush_every_bytes {
                            Some(every) if unflushed >= every => {
                                unflushed = 0;
                                t.flush(offset)
                            }
                            _ => Ok(()),
                        })
                    } else {
                        t.read(offset, &mut buf[..len])
                    };
                    if let Err(e) = r {
                        failed.store(true, Relaxed);
                        *error.lock() = Some(e);
                        break;
                    }
                    let d = done.fetch_add(len as u64, Relaxed) + len as u64;
                    let due = next_sample.load(Relaxed);
                    if d >= due && next_sample.compare_exchange(due, due + sample_bytes, Relaxed, Relaxed).is_ok() {
                        samples.lock().push(sample(t, d, written.load(Relaxed)));
                        bar(d.min(bytes) >> 20, bytes >> 20);
                    }
                }
            });
        }
    });
    if let Some(e) = error.into_inner() {
        return Err(e);
    }
    let d = done.load(Relaxed);
    samples.lock().push(sample(t, d, written.load(Relaxed)));
    Ok(())
}

/// Sequential pass, then one random pass (different pattern from the measured one).
fn precondition(t: &Target, p: &Params) -> Result<(), String> {
    let size = t.size();
    let chunk_len = (1usize << 20).min(size as usize);
    let chunk = {
        let mut b = aligned(chunk_len);
        b.fill(0x5a);
        b
    };
    let bar = crate::progress_bar("precondition");
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk_len as u64) as usize;
        t.write(off, &chunk[..n])?;
        off += n as u64;
        bar(off >> 20, size >> 21);
    }
    let spec = Spec::Uniform;
    let mut gen = Generator::new(&spec, size, p.block_bytes, 0.0, p.seed ^ 0xfeed, None)?;
    let mut buf = aligned(p.block_bytes as usize);
    buf.fill(0xa5);
    let mut done = 0;
    while done < size {
        let Some(r) = gen.next_request() else { break };
        let len = r.len.min(size - r.offset) as usize;
        t.write(r.offset, &buf[..len])?;
        done += len as u64;
        bar((size + done) >> 21, size >> 20);
    }
    Ok(())
}

/// What one target measured.
struct Outcome {
    label: &'static str,
    json: Value,
    /// (modelled seconds, MB/s) per sample.
    throughput: Vec<(f64, f64)>,
    /// (user volumes written, media bytes per user byte so far).
    wear: Vec<(f64, f64)>,
    mbps: f64,
    wear_per_user_byte: f64,
}

fn measure(label: &'static str, t: &Target, p: &Params, quiet: bool) -> Result<Outcome, String> {
    let say = |m: &str| {
        if !quiet {
            eprintln!("[{label}] {m}");
        }
    };
    let size = t.size();
    if p.precondition {
        say(&format!("precondition: a sequential and a random pass over {} MiB", size >> 20));
        precondition(t, p)?;
    }
    let mut gen = Generator::new(&p.workload, size, p.block_bytes, p.read_percent, p.seed, None)?;
    let bytes = (size as f64 * p.measure_volumes) as u64;
    say(&format!(
        "measuring {:.1} volume(s) of {} at queue depth {}",
        p.measure_volumes, p.workload, p.queue_depth
    ));
    let start = sample(t, 0, 0);
    let pool_before = match t {
        Target::Salsa { pool, .. } => Some(pool.stats()),
        Target::Raw { .. } => None,
    };
    let samples = Mutex::new(vec![start]);
    run_workload(t, &mut gen, p, bytes, &samples, (bytes / 100).max(p.block_bytes))?;
    let mut samples = samples.into_inner();
    // Workers push samples concurrently; order them by progress.
    samples.sort_by_key(|s| (s.user_bytes, s.model_us));
    let last = *samples.last().expect("a final sample");
    let (throughput, wear, rates) = series_of(&samples, &start, size);
    let user = last.user_bytes as f64;
    let user_written = last.user_written as f64;
    let host = (last.host_written - start.host_written) as f64;
    let media = (last.media_written - start.media_written) as f64;
    let model_s = (last.model_us - start.model_us) as f64 / 1e6;
    let mbps = if model_s > 0.0 { user / model_s / 1e6 } else { 0.0 };
    let wear_per_user_byte = if user_written > 0.0 { media / user_written } else { 0.0 };
    let median = super::median(rates);
    let mut json = json!({
        "target": label,
        "device": p.device.model.as_ref().map(|m| format!("{:?} {:?}", m.kind, m.params)),
        "workload": p.workload.to_string(),
        "read_percent": p.read_percent,
        "block_bytes": p.block_bytes,
        "queue_depth": p.queue_depth,
        "volumes": p.volumes,
        "flush_every_bytes": p.flush_every_bytes,
        "target_bytes": size,
        "user_bytes": user,
        "user_bytes_written": user_written,
        "device_host_bytes_written": host,
        "device_media_bytes_written": media,
        "device_internal_wa": if host > 0.0 { media / host } else { 0.0 },
        "media_bytes_per_user_byte": wear_per_user_byte,
        "host_wa": if user_written > 0.0 { host / user_written } else { 0.0 },
        "block_erases": last.erases - start.erases,
        "model_seconds": model_s,
        "throughput_mbps_model": mbps,
        "throughput_mbps_model_median": median,
        "device_counters": t.devices().iter().map(|d| json!({"device": d.name(), "counters": d.counters().into_iter().collect::<std::collections::BTreeMap<_, _>>()})).collect::<Vec<_>>(),
    });
    if let Target::Salsa { pool, .. } = t {
        add_salsa_figures(&mut json, pool, p, pool_before.as_ref(), user_written);
    }
    say(&format!(
        "modelled {mbps:.1} MB/s (median {median:.1}), media writes per user byte {wear_per_user_byte:.2}, device-internal WA {:.2}",
        json["device_internal_wa"].as_f64().unwrap_or(0.0)
    ));
    Ok(Outcome {
        label,
        json,
        throughput,
        wear,
        mbps,
        wear_per_user_byte,
    })
}

/// Per pair of successive samples: the throughput (modelled seconds since `start`, bytes per
/// modelled microsecond), the media bytes written per user byte so far (against volumes
/// written) and the rates alone.
#[allow(clippy::type_complexity)]
fn series_of(samples: &[DeviceSample], start: &DeviceSample, size: u64) -> (Vec<(f64, f64)>, Vec<(f64, f64)>, Vec<f64>) {
    let mut throughput = Vec::new();
    let mut wear = Vec::new();
    let mut rates = Vec::new();
    for w in samples.windows(2) {
        let dt = w[1].model_us.saturating_sub(w[0].model_us) as f64;
        if dt > 0.0 {
            let v = w[1].user_bytes.saturating_sub(w[0].user_bytes) as f64 / dt;
            throughput.push(((w[1].model_us - start.model_us) as f64 / 1e6, v));
            rates.push(v);
        }
        if w[1].user_written > 0 {
            wear.push((
                w[1].user_written as f64 / size as f64,
                w[1].media_written.saturating_sub(start.media_written) as f64 / w[1].user_written as f64,
            ));
        }
    }
    (throughput, wear, rates)
}

/// SALSA's own figures in a run's report: its write amplification and where it came from.
fn add_salsa_figures(json: &mut Value, pool: &Pool, p: &Params, pool_before: Option<&salsa_core::Stats>, user_written: f64) {
    let s = pool.stats();
    json["salsa_wa"] = json!(s.write_amplification);
    json["spare_percent"] = json!(p.spare_percent);
    json["segment_bytes"] = json!(pool.geometry().segment_bytes);
    json["discarded_bytes"] = json!(s.discarded_bytes);
    // What SALSA wrote while measuring, per byte the workload wrote: where its own write
    // amplification comes from.
    if let Some(b) = pool_before {
        let per_user = |after: u64, before: u64| {
            if user_written > 0.0 {
                after.saturating_sub(before) as f64 / user_written
            } else {
                0.0
            }
        };
        json["salsa_per_user_byte"] = json!({
            "user": per_user(s.user_bytes_written, b.user_bytes_written),
            "gc": per_user(s.gc_bytes_relocated, b.gc_bytes_relocated),
            "metadata": per_user(s.metadata_bytes_written, b.metadata_bytes_written),
            "pad": per_user(s.pad_bytes_written, b.pad_bytes_written),
            "device": per_user(s.device_bytes_written, b.device_bytes_written),
            "flushes": per_user(s.flushes, b.flushes) * 1e6,
        });
    }
}

fn fresh_device(p: &Params) -> Result<Arc<dyn Device>, String> {
    if !p.device.path.as_os_str().is_empty() {
        let _ = std::fs::remove_file(&p.device.path);
    }
    p.device.open(false)
}

/// Runs SALSA and (optionally) raw; returns the report as JSON and writes it with its charts.
pub fn run(p: &Params, quiet: bool) -> Result<Value, String> {
    if p.device.model.is_none() {
        return Err("bench-device runs on an emulated device: give --device ssd:..., dmsmr:..., hmsmr:... or zoned:...".into());
    }
    if p.block_bytes == 0 || !p.block_bytes.is_multiple_of(4096) || !(0.0..=100.0).contains(&p.read_percent) {
        return Err("block size must be a positive multiple of 4 KiB and the read percentage 0 to 100".into());
    }
    let mut outcomes = Vec::new();
    let (salsa, salsa_size, zoned) = run_salsa(p, quiet)?;
    outcomes.push(salsa);
    if p.raw && zoned && !quiet {
        eprintln!("[raw] skipped: a host-managed zoned drive takes writes only at its write pointers");
    }
    if p.raw && !zoned {
        let dev = fresh_device(p)?;
        // The paper's fair comparison: a raw partition of the size of SALSA's volume.
        let t = Target::Raw { dev, size: salsa_size };
        outcomes.push(measure("raw", &t, p, quiet)?);
    }
    let report = compare(&outcomes, quiet);
    if let Some(dir) = &p.out_dir {
        write_report(dir, p, &outcomes, &report)?;
    }
    Ok(report)
}

/// The SALSA side on a fresh device: its outcome, the bytes its volumes hold (the raw side's
/// size) and whether the device is a host-managed zoned drive.
fn run_salsa(p: &Params, quiet: bool) -> Result<(Outcome, u64, bool), String> {
    let dev = fresh_device(p)?;
    let cfg = PoolConfig {
        spare_percent: p.spare_percent,
        segment_bytes: p.segment_bytes,
        victim_policy: p.victim.clone(),
        default_placement: p.placement.clone(),
        ..PoolConfig::default()
    };
    let opts = OpenOptions {
        discard_freed_segments: p.discard,
        gc_burst_bytes: p.gc_burst_bytes,
        ..OpenOptions::default()
    };
    let pool = Pool::create(vec![dev], &cfg, &opts).map_err(|e| format!("SALSA on the model: {e}"))?;
    // Equal volumes of whole blocks, so that no request of the workload spans two. Several
    // take no more than the pool holds with every volume's streams holding a segment open
    // (one volume keeps the pool's logical size, as the paper's runs and ours always had).
    let mut total = pool.logical_capacity_bytes();
    if p.volumes > 1 {
        let placements = vec![p.placement.as_str(); p.volumes as usize];
        total = total.min(pool.usable_bytes_for(&placements).map_err(|e| e.to_string())?);
    }
    let volume_bytes = total / p.volumes as u64 / p.block_bytes * p.block_bytes;
    let vols = (0..p.volumes)
        .map(|i| {
            let name = if p.volumes == 1 { "bench".to_string() } else { format!("bench{i}") };
            pool.create_volume(&name, volume_bytes, p.page_bytes).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    let size = volume_bytes * p.volumes as u64;
    // A host-managed zoned drive refuses random writes: there is no raw run to compare with.
    let zoned = pool.devices().iter().any(|d| d.zones().is_some());
    let t = Target::Salsa { pool, vols };
    let o = measure("salsa", &t, p, quiet)?;
    if let Target::Salsa { pool, vols } = t {
        drop(vols);
        pool.close().map_err(|e| e.to_string())?;
    }
    Ok((o, size, zoned))
}

/// The runs as JSON, with SALSA's ratios over raw when both ran.
fn compare(outcomes: &[Outcome], quiet: bool) -> Value {
    let mut report = json!({ "runs": outcomes.iter().map(|o| o.json.clone()).collect::<Vec<_>>() });
    if let [s, r] = outcomes {
        report["throughput_ratio_salsa_over_raw"] = json!(if r.mbps > 0.0 { s.mbps / r.mbps } else { 0.0 });
        report["wear_ratio_raw_over_salsa"] = json!(if s.wear_per_user_byte > 0.0 {
            r.wear_per_user_byte / s.wear_per_user_byte
        } else {
            0.0
        });
        if !quiet {
            eprintln!(
                "SALSA vs raw: {:.2}x the modelled throughput, {:.2}x less wear",
                report["throughput_ratio_salsa_over_raw"].as_f64().unwrap_or(0.0),
                report["wear_ratio_raw_over_salsa"].as_f64().unwrap_or(0.0)
            );
        }
    }
    report
}

/// Writes the report and its charts (throughput, wear) into `dir`.
fn write_report(dir: &std::path::Path, p: &Params, outcomes: &[Outcome], report: &Value) -> Result<(), String> {
    let put = super::report_writer(dir)?;
    let series = |f: fn(&Outcome) -> &Vec<(f64, f64)>| super::chart_series(outcomes, |o| o.label, f);
    let w = &p.workload;
    put(
        "throughput.svg",
        plot::line_chart(
            &format!("Modelled throughput, {w}"),
            "modelled seconds",
            "MB/s (user reads + writes)",
            &series(|o| &o.throughput),
            false,
        ),
    )?;
    put(
        "wear.svg",
        plot::line_chart(
            &format!("Wear, {w}"),
            "volumes written",
            "media bytes written per user byte",
            &series(|o| &o.wear),
            false,
        ),
    )?;
    put("results.json", serde_json::to_string_pretty(report).map_err(|e| e.to_string())?)?;
    Ok(())
}
