//! `salsa bench`: runs a workload in-process against a fresh pool, once per policy pair
//! (placement × victim selection), and reports JSON plus SVG charts: throughput and write
//! amplification over time, latency percentiles and CDF, and the policies side by side.
//!
//! Owns: the run loop (`run_policy` and its steps), workload generation ([`workload`]), trace replay and
//! device traces ([`trace`]), charts ([`plot`]), and the raw-device comparison of issue 2
//! ([`raw`]).
//!
//! Write amplification is reported two ways: `wa` counts user plus relocated data pages per
//! user page (what the analytic models describe); `device_wa` counts every byte written to the
//! devices (metadata pages and padding too) per user byte. The window starts after a flush,
//! and `device_wa` takes the device's bytes after another at its end: records still open or
//! queued for write-back at either edge would otherwise be counted in one window and their
//! device writes in another (a short run's `device_wa` fell below its `wa`, the GC streams'
//! open records alone being worth a few records).

pub mod amf;
pub mod device;
pub mod maps;
pub mod plot;
pub mod raid;
pub mod raw;
pub mod share;
pub mod trace;
pub mod workload;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use salsa_core::device::MemoryDevice;
use salsa_core::{Device, OpenOptions, Pool, PoolConfig, Stats};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trace::OpKind;
use workload::{Generator, Request, Spec};

/// Where the pool lives.
#[derive(Debug, Clone)]
pub enum Backing {
    /// A memory device of this many bytes.
    Memory(u64),
    /// Files (created or truncated to their sizes; overwritten).
    Files(Vec<crate::spec::DeviceSpec>),
}

/// Everything one `salsa bench` invocation runs.
#[derive(Debug, Clone)]
pub struct Params {
    pub backing: Backing,
    pub spare_percent: f64,
    pub segment_bytes: Option<u64>,
    /// Volume size; `None`: the pool's whole logical capacity.
    pub volume_bytes: Option<u64>,
    /// The GC's garbage trigger ([`salsa_core::OpenOptions::gc_garbage_percent`]).
    pub gc_garbage_percent: Option<f64>,
    pub workload: Spec,
    pub read_percent: f64,
    pub block_bytes: u64,
    pub queue_depth: usize,
    /// Write the whole volume once, sequentially, before anything is measured.
    pub precondition: bool,
    /// Bytes written (in volume sizes) before the measurement window.
    pub warmup_volumes: f64,
    /// Bytes written (in volume sizes) in the measurement window; a trace runs whole.
    pub measure_volumes: f64,
    /// Replay a trace at its recorded times instead of as fast as possible.
    pub realtime: bool,
    /// `(placement, victim)` pairs to run, each on a fresh pool.
    pub policies: Vec<(String, String)>,
    /// Where the policies' names are looked up: the built-ins, plus any a caller registered
    /// (the Python bindings register policies written in Python here).
    pub registry: salsa_core::Registry,
    pub gc_aging: f64,
    pub seed: u64,
    /// Writers run the GC themselves (deterministic for a seed at queue depth 1).
    pub inline_gc: bool,
    pub trace_format: Option<trace::Format>,
    pub trace_volume: Option<String>,
    /// Times a trace is replayed in a row (a short trace run often enough to keep the GC busy).
    pub trace_repeat: u32,
    /// Record what SALSA sends to its devices in this file (one per policy pair).
    pub device_trace: Option<(PathBuf, trace::Format)>,
    /// Where the charts and `results.json` go.
    pub out_dir: Option<PathBuf>,
    pub sample_ms: u64,
}

/// Fewer throughput samples than this in the measured window draw a warning.
const MIN_SAMPLES: usize = 5;

/// One sample of the counters.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t: f64,
    user_written: u64,
    user_read: u64,
    gc: u64,
    device: u64,
    free_segments: u32,
}

impl Sample {
    fn of(t: f64, s: &Stats) -> Sample {
        Sample {
            t,
            user_written: s.user_bytes_written,
            user_read: s.user_bytes_read,
            gc: s.gc_bytes_relocated,
            device: s.device_bytes_written,
            free_segments: s.free_segments,
        }
    }
}

/// What one policy pair measured.
pub struct Outcome {
    pub label: String,
    pub json: Value,
    throughput: Vec<(f64, f64)>,
    wa_over_time: Vec<(f64, f64)>,
    latency_cdf: Vec<(f64, f64)>,
    pub wa: f64,
}

/// The median of samples (0 for none).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn open_backing(p: &Params, label: &str) -> Result<Vec<Arc<dyn Device>>, String> {
    match &p.backing {
        Backing::Memory(size) => Ok(vec![Arc::new(MemoryDevice::new("memory", *size))]),
        Backing::Files(specs) => specs
            .iter()
            .map(|s| {
                s.size_bytes
                    .ok_or_else(|| format!("{}: give the bench file a size (PATH:SIZE)", s.path.display()))?;
                if let Some(dir) = s.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                }
                let _ = std::fs::remove_file(&s.path);
                tracing::debug!("{label}: creating {}", s.path.display());
                s.open(false)
            })
            .collect(),
    }
}

/// Runs every policy pair and writes the report. Returns the outcomes.
pub fn run(p: &Params, quiet: bool) -> Result<Vec<Outcome>, String> {
    if p.block_bytes == 0 || !p.block_bytes.is_multiple_of(4096) {
        return Err("block size must be a positive multiple of 4 KiB".into());
    }
    if !(0.0..=100.0).contains(&p.read_percent) {
        return Err("read percentage must be 0 to 100".into());
    }
    let trace_ops = match &p.workload {
        Spec::Trace(path) => Some(trace::repeat(
            trace::read(path, p.trace_format, p.trace_volume.as_deref())?,
            p.trace_repeat,
        )?),
        _ => None,
    };
    let mut outcomes = Vec::new();
    for (placement, victim) in &p.policies {
        outcomes.push(run_policy(p, placement, victim, trace_ops.clone(), quiet)?);
    }
    if let Some(dir) = &p.out_dir {
        write_report(p, dir, &outcomes)?;
    }
    Ok(outcomes)
}

/// One policy pair's run: a fresh pool on the backing, a volume sized for the workload,
/// preconditioning and warm-up, the measured window, the report.
fn run_policy(p: &Params, placement: &str, victim: &str, trace_ops: Option<Vec<trace::TraceOp>>, quiet: bool) -> Result<Outcome, String> {
    let label = format!("{placement}+{victim}");
    let say = |m: &str| {
        if !quiet {
            eprintln!("[{label}] {m}");
        }
    };
    let (devices, trace_writer) = record_device_trace(p, &label, open_backing(p, &label)?)?;
    let (cfg, opts) = pool_settings(p, placement, victim);
    let pool = Pool::create(devices, &cfg, &opts).map_err(|e| format!("{label}: {e}"))?;
    let vol_bytes = volume_bytes(p, &pool, trace_ops.as_deref())?;
    let vol = pool.create_volume("bench", vol_bytes, 4096).map_err(|e| e.to_string())?;
    if p.precondition {
        say(&format!("precondition: writing the {} MiB volume once", vol_bytes >> 20));
        precondition(&pool, &vol, vol_bytes)?;
    }
    let mut gen =
        Generator::new(&p.workload, vol_bytes, p.block_bytes, p.read_percent, p.seed, trace_ops).map_err(|e| format!("{label}: {e}"))?;
    let start_stats = pool.stats();
    let warm_bytes = if gen.trace_len().is_some() {
        0
    } else {
        (vol_bytes as f64 * p.warmup_volumes) as u64
    };
    if warm_bytes > 0 {
        say(&format!("warm-up: {:.1} volume(s) of {}", p.warmup_volumes, p.workload));
        drive(&vol, &mut gen, p, warm_bytes, None, &crate::progress_bar("warm-up"))?;
    }
    let measure_bytes = if gen.trace_len().is_some() {
        u64::MAX
    } else {
        (vol_bytes as f64 * p.measure_volumes) as u64
    };
    say(&format!(
        "measuring: {} at queue depth {}",
        if measure_bytes == u64::MAX {
            "the whole trace".to_string()
        } else {
            format!("{:.1} volume(s)", p.measure_volumes)
        },
        p.queue_depth
    ));
    let m = measure(p, &pool, &vol, &mut gen, measure_bytes)?;
    let json = outcome_json(p, &pool, &label, (placement, victim), vol_bytes, &start_stats, &m);
    say(&format!(
        "WA {:.3} (device {:.3}), {:.0} MB/s median, write p99 {} us",
        m.wa(),
        json["device_wa"].as_f64().unwrap_or(0.0),
        json["throughput_mbps_median"].as_f64().unwrap_or(0.0),
        percentile(&m.hist_write, 0.99)
    ));
    if let Some(state) = crate::stats_json::victim_policy_state_text(&json["victim_policy_state"]) {
        say(&format!("victim policy at the end: {state}"));
    }
    let (throughput, wa_over_time, _) = m.series(vol_bytes, p.sample_ms);
    if throughput.len() < MIN_SAMPLES {
        eprintln!(
            "[{label}] warning: the measured window holds only {} throughput sample(s) of {} ms; its median and charts say little (measure more volumes or lower --sample-ms)",
            throughput.len(),
            p.sample_ms.max(10)
        );
    }
    let outcome = Outcome {
        label,
        json,
        throughput,
        wa_over_time,
        latency_cdf: m.latency_cdf(),
        wa: m.wa(),
    };
    drop(vol);
    pool.close().map_err(|e| e.to_string())?;
    if let Some((w, names)) = trace_writer {
        w.finish(&names)?;
    }
    if let Backing::Files(specs) = &p.backing {
        for s in specs {
            let _ = std::fs::remove_file(&s.path);
        }
    }
    Ok(outcome)
}

/// A device trace writer and the names of the devices it records.
type DeviceTrace = (Arc<trace::TraceWriter>, Vec<String>);
/// The devices a pool is created on.
type DeviceList = Vec<Arc<dyn Device>>;

/// Wraps the devices so that what SALSA sends them is recorded, when a device trace was asked
/// for (one file per policy pair when several run).
fn record_device_trace(p: &Params, label: &str, devices: DeviceList) -> Result<(DeviceList, Option<DeviceTrace>), String> {
    let Some((path, format)) = &p.device_trace else {
        return Ok((devices, None));
    };
    let path = if p.policies.len() > 1 {
        PathBuf::from(format!("{}.{label}", path.display()))
    } else {
        path.clone()
    };
    let names: Vec<String> = devices.iter().map(|d| d.name().to_string()).collect();
    let w = trace::TraceWriter::create(&path, *format, &names)?;
    let devices = devices
        .into_iter()
        .enumerate()
        .map(|(i, d)| Arc::new(trace::RecordingDevice::new(d, i, w.clone())) as Arc<dyn Device>)
        .collect();
    Ok((devices, Some((w, names))))
}

/// The pool's configuration and opening options for one policy pair.
fn pool_settings(p: &Params, placement: &str, victim: &str) -> (PoolConfig, OpenOptions) {
    let cfg = PoolConfig {
        spare_percent: p.spare_percent,
        segment_bytes: p.segment_bytes,
        victim_policy: victim.to_string(),
        default_placement: placement.to_string(),
        gc_aging: p.gc_aging,
        ..PoolConfig::default()
    };
    let opts = OpenOptions {
        background_gc: !p.inline_gc,
        // Inline GC is the deterministic mode (a seed gives one figure): writers also write
        // their own records, so no thread timing enters.
        write_back_threads: if p.inline_gc {
            0
        } else {
            OpenOptions::default().write_back_threads
        },
        gc_garbage_percent: p.gc_garbage_percent,
        policies: p.registry.clone(),
        ..OpenOptions::default()
    };
    (cfg, opts)
}

/// The bench volume's size: as asked (at most the pool's logical capacity), the whole logical
/// capacity, or for a trace the extent it touches; a multiple of the block size.
fn volume_bytes(p: &Params, pool: &Pool, trace_ops: Option<&[trace::TraceOp]>) -> Result<u64, String> {
    let logical = pool.logical_capacity_bytes();
    let mut vol_bytes = match p.volume_bytes {
        Some(v) if v > logical => {
            return Err(format!(
                "--volume-size {} MiB is more than the {} MiB the pool offers at {}% spare",
                v >> 20,
                logical >> 20,
                p.spare_percent
            ))
        }
        Some(v) => v,
        None => logical,
    } / p.block_bytes
        * p.block_bytes;
    if let Some(ops) = trace_ops {
        let need = trace::extent(ops).div_ceil(p.block_bytes) * p.block_bytes;
        if need > vol_bytes {
            return Err(format!(
                "the trace touches {} MiB but the pool offers {} MiB at {}% spare; give the pool more room (--memory, larger --device files, or less --spare)",
                need >> 20,
                vol_bytes >> 20,
                p.spare_percent
            ));
        }
        vol_bytes = need.max(p.block_bytes);
    }
    Ok(vol_bytes)
}

/// Writes the whole volume once, sequentially, and flushes.
fn precondition(pool: &Pool, vol: &salsa_core::Volume, vol_bytes: u64) -> Result<(), String> {
    let chunk = vec![0x5au8; 1 << 20];
    let bar = crate::progress_bar("precondition");
    let mut off = 0;
    while off < vol_bytes {
        let n = (vol_bytes - off).min(chunk.len() as u64) as usize;
        vol.write(off, &chunk[..n]).map_err(|e| e.to_string())?;
        off += n as u64;
        bar(off >> 20, vol_bytes >> 20);
    }
    pool.flush().map_err(|e| e.to_string())
}

/// What the measured window recorded.
struct Measured {
    /// Counters at the window's start (after a flush) and end.
    before: Stats,
    after: Stats,
    /// Bytes written to the devices by the end of the flush after the window.
    device_bytes_flushed: u64,
    /// Counters sampled through the window, from its start to its end.
    samples: Vec<Sample>,
    /// Seconds from the first request to the last completion (the sampler's shutdown is not
    /// counted).
    seconds: f64,
    hist_write: Histogram<u64>,
    hist_read: Histogram<u64>,
}

/// Runs the measured window: the workload at the queue depth, with the pool's counters
/// sampled every `sample_ms`.
fn measure(p: &Params, pool: &Pool, vol: &salsa_core::Volume, gen: &mut Generator, bytes: u64) -> Result<Measured, String> {
    pool.flush().map_err(|e| e.to_string())?;
    let before = pool.stats();
    let samples = Mutex::new(vec![Sample::of(0.0, &before)]);
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let bar = crate::progress_bar("measure");
    let (hists, seconds) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            while !stop.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(p.sample_ms.max(10)));
                if !stop.load(Relaxed) {
                    samples.lock().push(Sample::of(t0.elapsed().as_secs_f64(), &pool.stats()));
                }
            }
        });
        let r = drive(vol, gen, p, bytes, Some(t0), &bar);
        let seconds = t0.elapsed().as_secs_f64();
        stop.store(true, Relaxed);
        let _ = sampler.join();
        (r, seconds)
    });
    let (hist_write, hist_read) = hists?;
    let after = pool.stats();
    pool.flush().map_err(|e| e.to_string())?;
    let device_bytes_flushed = pool.stats().device_bytes_written;
    let mut samples = samples.into_inner();
    // A sample the sampler took while the window was closing lies past its end.
    samples.retain(|s| s.t <= seconds);
    samples.push(Sample::of(seconds, &after));
    Ok(Measured {
        before,
        after,
        device_bytes_flushed,
        samples,
        seconds,
        hist_write,
        hist_read,
    })
}

fn percentile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

impl Measured {
    fn user_written(&self) -> f64 {
        (self.after.user_bytes_written - self.before.user_bytes_written) as f64
    }

    /// User plus relocated pages per user page over the window.
    fn wa(&self) -> f64 {
        let user = self.user_written();
        let gc = (self.after.gc_bytes_relocated - self.before.gc_bytes_relocated) as f64;
        if user > 0.0 {
            (user + gc) / user
        } else {
            1.0
        }
    }

    /// Per sample interval: throughput (seconds, MB/s), WA over volumes written (volumes, WA),
    /// and the throughputs alone (for the median). The last interval is left out when it is
    /// shorter than half the sampling period: a few milliseconds at the window's end would
    /// show as a spike or a dip that no one measured.
    #[allow(clippy::type_complexity)]
    fn series(&self, vol_bytes: u64, sample_ms: u64) -> (Vec<(f64, f64)>, Vec<(f64, f64)>, Vec<f64>) {
        let mut throughput = Vec::new();
        let mut wa_over_time = Vec::new();
        let mut mbps = Vec::new();
        let last = self.samples.len().saturating_sub(2);
        let period = sample_ms.max(10) as f64 / 1000.0;
        for (i, w) in self.samples.windows(2).enumerate() {
            let dt = w[1].t - w[0].t;
            if dt <= 0.0 || (i == last && i > 0 && dt < period / 2.0) {
                continue;
            }
            let du = (w[1].user_written - w[0].user_written) as f64;
            let dr = (w[1].user_read - w[0].user_read) as f64;
            let dg = (w[1].gc - w[0].gc) as f64;
            let v = (du + dr) / dt / 1e6;
            throughput.push((w[1].t, v));
            mbps.push(v);
            if du > 0.0 {
                wa_over_time.push((
                    (w[1].user_written - self.before.user_bytes_written) as f64 / vol_bytes as f64,
                    (du + dg) / du,
                ));
            }
        }
        (throughput, wa_over_time, mbps)
    }

    /// Latency CDF of reads and writes together: (microseconds, fraction) at 201 quantiles.
    fn latency_cdf(&self) -> Vec<(f64, f64)> {
        let mut both = self.hist_write.clone();
        let _ = both.add(&self.hist_read);
        if both.is_empty() {
            return Vec::new();
        }
        (0..=200)
            .map(|i| {
                let q = i as f64 / 200.0;
                (both.value_at_quantile(q).max(1) as f64, q)
            })
            .collect()
    }
}

/// The JSON report of one run.
fn outcome_json(
    p: &Params,
    pool: &Pool,
    label: &str,
    (placement, victim): (&str, &str),
    vol_bytes: u64,
    start: &Stats,
    m: &Measured,
) -> Value {
    let (before, after) = (&m.before, &m.after);
    let user = m.user_written();
    let read = (after.user_bytes_read - before.user_bytes_read) as f64;
    let device = m.device_bytes_flushed.saturating_sub(before.device_bytes_written) as f64;
    let cum_user = (after.user_bytes_written - start.user_bytes_written) as f64;
    let cum_gc = (after.gc_bytes_relocated - start.gc_bytes_relocated) as f64;
    let physical = pool.geometry().total_segments as u64 * pool.geometry().segment_bytes;
    let (_, _, mbps) = m.series(vol_bytes, p.sample_ms);
    let lat = |h: &Histogram<u64>| {
        json!({"count": h.len(), "p50_us": percentile(h, 0.5), "p90_us": percentile(h, 0.9), "p99_us": percentile(h, 0.99),
               "p999_us": percentile(h, 0.999), "max_us": h.max(), "mean_us": if h.is_empty() { 0.0 } else { h.mean() }})
    };
    let vs = after.volumes.iter().find(|v| v.name == "bench");
    let placement_bytes = vs.map_or(0, |v| v.placement_memory_bytes);
    let pages = vol_bytes / 4096;
    json!({
        "label": label,
        "placement": placement,
        "victim": victim,
        "workload": p.workload.to_string(),
        "read_percent": p.read_percent,
        "block_bytes": p.block_bytes,
        "queue_depth": p.queue_depth,
        "volume_bytes": vol_bytes,
        "physical_bytes": physical,
        "spare_percent_requested": p.spare_percent,
        "gc_garbage_percent": p.gc_garbage_percent,
        "spare_percent_effective": (1.0 - vol_bytes as f64 / physical as f64) * 100.0,
        "segment_bytes": pool.geometry().segment_bytes,
        "segments": pool.geometry().total_segments,
        "precondition": p.precondition,
        "warmup_volumes": p.warmup_volumes,
        "measured_user_bytes_written": user,
        "measured_user_bytes_read": read,
        "wa": m.wa(),
        "device_wa": if user > 0.0 { device / user } else { 0.0 },
        "wa_cumulative": if cum_user > 0.0 { (cum_user + cum_gc) / cum_user } else { 1.0 },
        "throughput_mbps_median": median(mbps),
        "throughput_mbps_mean": (user + read) / m.seconds.max(1e-9) / 1e6,
        "seconds": m.seconds,
        "latency_write": lat(&m.hist_write),
        "latency_read": lat(&m.hist_read),
        "placement_memory_bytes": placement_bytes,
        "placement_bytes_per_page": placement_bytes as f64 / pages.max(1) as f64,
        "map_memory_bytes": after.map_memory_bytes,
        "gc_segments_cleaned": after.gc_segments_cleaned - before.gc_segments_cleaned,
        "free_segments_min": m.samples.iter().map(|s| s.free_segments).min(),
        "device_counters": after.device_counters.iter().map(|(d, k, v)| json!({"device": d, "counter": k, "value": v})).collect::<Vec<_>>(),
        "victim_policy_state": crate::stats_json::victim_policy_state_json(&after.victim_policy_state),
        "samples": m.samples.iter().map(|s| json!([s.t, s.user_written - before.user_bytes_written, s.user_read - before.user_bytes_read, s.gc - before.gc_bytes_relocated, s.device - before.device_bytes_written])).collect::<Vec<_>>(),
        "samples_columns": ["seconds", "user_bytes_written", "user_bytes_read", "gc_bytes_relocated", "device_bytes_written"],
    })
}

/// Issues requests from `gen` at the queue depth until `bytes` were transferred or the trace
/// ends. Returns write and read latency histograms (microseconds).
fn drive(
    vol: &salsa_core::Volume,
    gen: &mut Generator,
    p: &Params,
    bytes: u64,
    t0: Option<Instant>,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(Histogram<u64>, Histogram<u64>), String> {
    let gen = Mutex::new(gen);
    let done = AtomicU64::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string());
    let (mut hw, mut hr) = (new_hist()?, new_hist()?);
    let start = t0.unwrap_or_else(Instant::now);
    let total = gen.lock().trace_len().map(|n| n as u64);
    let issued = AtomicU64::new(0);
    // Progress in requests for a trace, in MiB for a byte budget; none for an endless run.
    let report = |requests: u64, transferred: u64| match total {
        Some(total) => progress(requests.min(total), total),
        None if bytes != u64::MAX => progress(transferred.min(bytes) >> 20, bytes >> 20),
        None => {}
    };
    std::thread::scope(|s| -> Result<(), String> {
        let workers: Vec<_> = (0..p.queue_depth.max(1))
            .map(|worker| {
                let (gen, done, failed, issued, report) = (&gen, &done, &failed, &issued, &report);
                s.spawn(move || -> Result<(Histogram<u64>, Histogram<u64>), String> {
                    let (mut w, mut r) = (new_hist()?, new_hist()?);
                    let mut buf: Vec<u8> = Vec::new();
                    let mut stamp = (p.seed << 20) ^ (worker as u64) << 48;
                    loop {
                        if failed.lock().is_some() || done.load(Relaxed) >= bytes {
                            break;
                        }
                        let Some(req) = gen.lock().next_request() else { break };
                        let n = issued.fetch_add(1, Relaxed) + 1;
                        if p.realtime && req.at_us > 0 {
                            let due = start + Duration::from_micros(req.at_us);
                            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                        }
                        let t = Instant::now();
                        let (write, len) = match issue(vol, req, &mut buf, &mut stamp) {
                            Ok(Some(done)) => done,
                            Ok(None) => continue,
                            Err(e) => {
                                *failed.lock() = Some(e);
                                break;
                            }
                        };
                        let us = t.elapsed().as_micros() as u64;
                        let h = if write { &mut w } else { &mut r };
                        h.saturating_record(us.max(1));
                        let d = done.fetch_add(len, Relaxed) + len;
                        if worker == 0 {
                            report(n, d);
                        }
                    }
                    Ok((w, r))
                })
            })
            .collect();
        for h in workers {
            let (w, r) = h.join().map_err(|_| "benchmark thread panicked".to_string())??;
            hw.add(&w).map_err(|e| e.to_string())?;
            hr.add(&r).map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    report(u64::MAX, u64::MAX);
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    Ok((hw, hr))
}

/// Issues one request of a workload on `vol`: a read or write into `buf` (a write's contents
/// stamped with the next `stamp`, so nothing can pass by accident), or a trim. Whether it was a
/// write and its length when it was a read or write; `None` for a trim (not timed: the
/// histograms are of reads and writes) or a request past the volume's end.
fn issue(vol: &salsa_core::Volume, req: Request, buf: &mut Vec<u8>, stamp: &mut u64) -> Result<Option<(bool, u64)>, String> {
    let Request { kind, offset, len, .. } = req;
    let len = len.min(vol.size_bytes().saturating_sub(offset));
    if len == 0 {
        return Ok(None);
    }
    if kind == OpKind::Trim {
        vol.trim(offset, len).map_err(|e| format!("trim at {offset} ({len} bytes): {e}"))?;
        return Ok(None);
    }
    let write = kind == OpKind::Write;
    buf.resize(len as usize, 0);
    let res = if write {
        *stamp += 1;
        // A trace may carry requests shorter than the stamp.
        for chunk in buf.chunks_mut(4096) {
            let n = chunk.len().min(8);
            chunk[..n].copy_from_slice(&stamp.to_le_bytes()[..n]);
        }
        vol.write(offset, buf)
    } else {
        vol.read(offset, buf)
    };
    res.map_err(|e| format!("{} at {offset} ({len} bytes): {e}", if write { "write" } else { "read" }))?;
    Ok(Some((write, len)))
}

/// Creates a report directory and returns the function that writes a file into it.
fn report_writer(dir: &std::path::Path) -> Result<impl Fn(&str, String) -> Result<(), String> + '_, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(move |name: &str, text: String| std::fs::write(dir.join(name), text).map_err(|e| format!("{}: {e}", dir.join(name).display())))
}

/// One chart series per run: its label and the points `points` picks from it.
fn chart_series<T>(runs: &[T], label: impl Fn(&T) -> &str, points: impl Fn(&T) -> &Vec<(f64, f64)>) -> Vec<plot::Series> {
    runs.iter()
        .map(|r| plot::Series {
            name: label(r).to_string(),
            points: points(r).clone(),
        })
        .collect()
}

/// The policy pairs `salsa bench --compare` names: `all` (every placement with every victim
/// policy), or `PLACEMENT+VICTIM` items where `*` stands for every policy of its kind
/// (`salsa+*`, `*+greedy`). Every name is checked against `registry`; a pair named twice runs
/// once.
pub fn compare_pairs(items: &[String], registry: &salsa_core::Registry) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for item in items.iter().map(|i| i.trim()) {
        let (placement, victim) = match item {
            "all" => ("*", "*"),
            _ => item
                .split_once('+')
                .ok_or_else(|| format!("--compare {item:?}: give PLACEMENT+VICTIM (or all; * for every policy of a kind)"))?,
        };
        let expand = |name: &str, all: Vec<&'static str>, check: &dyn Fn(&str) -> Result<(), String>| {
            if name == "*" {
                Ok(all.into_iter().map(String::from).collect::<Vec<_>>())
            } else {
                check(name).map(|_| vec![name.to_string()])
            }
        };
        let placements = expand(placement, registry.placement_names(), &|n| registry.check_placement(n))?;
        let victims = expand(victim, registry.victim_names(), &|n| registry.check_victim(n))?;
        for pl in &placements {
            for v in &victims {
                if !pairs.iter().any(|(a, b)| a == pl && b == v) {
                    pairs.push((pl.clone(), v.clone()));
                }
            }
        }
    }
    if pairs.is_empty() {
        return Err("--compare names no policy pair".into());
    }
    Ok(pairs)
}

/// The side-by-side table of a run, as Markdown: one row per policy pair, with its write
/// amplification relative to the lowest of the run.
pub fn table(outcomes: &[Outcome]) -> String {
    let best = outcomes.iter().map(|o| o.wa).filter(|w| *w > 0.0).fold(f64::INFINITY, f64::min);
    let mut t = String::from(
        "| policy (placement+victim) | WA | WA / lowest | device WA | MB/s median | write p99 us | read p99 us |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for o in outcomes {
        let relative = if best.is_finite() && best > 0.0 { o.wa / best } else { 0.0 };
        // A kind of request the workload never sent has no percentile.
        let p99 = |kind: &str| match o.json[kind]["count"].as_u64() {
            Some(n) if n > 0 => o.json[kind]["p99_us"].to_string(),
            _ => "-".to_string(),
        };
        t.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.1} | {} | {} |\n",
            o.label,
            o.wa,
            relative,
            o.json["device_wa"].as_f64().unwrap_or(0.0),
            o.json["throughput_mbps_median"].as_f64().unwrap_or(0.0),
            p99("latency_write"),
            p99("latency_read"),
        ));
    }
    t
}

fn write_report(p: &Params, dir: &std::path::Path, outcomes: &[Outcome]) -> Result<(), String> {
    let put = report_writer(dir)?;
    put(
        "report.md",
        format!(
            "# salsa bench: {}, {}% spare, seed {}\n\n{}\nCharts: wa.svg (write amplification over time), throughput.svg, \
             latency_cdf.svg, compare.svg; every figure in results.json.\n",
            p.workload,
            p.spare_percent,
            p.seed,
            table(outcomes)
        ),
    )?;
    let series = |f: fn(&Outcome) -> &Vec<(f64, f64)>| chart_series(outcomes, |o| &o.label, f);
    let w = &p.workload;
    put(
        "throughput.svg",
        plot::line_chart(
            &format!("Throughput, {w}"),
            "seconds",
            "MB/s (reads + writes)",
            &series(|o| &o.throughput),
            false,
        ),
    )?;
    put(
        "wa.svg",
        plot::line_chart(
            &format!("Write amplification, {w}"),
            "volumes written",
            "WA per interval",
            &series(|o| &o.wa_over_time),
            false,
        ),
    )?;
    put(
        "latency_cdf.svg",
        plot::line_chart(
            &format!("Latency CDF, {w}"),
            "microseconds (log)",
            "fraction of requests",
            &series(|o| &o.latency_cdf),
            true,
        ),
    )?;
    let bars: Vec<(String, f64)> = outcomes.iter().map(|o| (o.label.clone(), o.wa)).collect();
    put(
        "compare.svg",
        plot::bar_chart(
            &format!("Write amplification by policy, {w}, {}% spare", p.spare_percent),
            "WA",
            &bars,
            None,
        ),
    )?;
    let all: Vec<&Value> = outcomes.iter().map(|o| &o.json).collect();
    put("results.json", serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?)?;
    Ok(())
}
