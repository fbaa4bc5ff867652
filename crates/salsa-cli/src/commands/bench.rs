//! `salsa bench`, `salsa bench-device` and `salsa bench-raw`: their arguments and the steps that
//! turn them into runs of the bench module.

use crate::*;

/// What the benchmarks send: the workload, its read share, request size and queue depth.
#[derive(clap::Args)]
pub(crate) struct LoadArgs {
    /// Workload: seq, uniform, hotcold:W/S (W% of writes to S% of the space), zipf:SKEW,
    /// dynzipf:SKEW[:INTERVAL] (SepBIT's: the hottest 20% of ranks move every INTERVAL
    /// written), trace:PATH (MSR, Alibaba, fio iolog, blkparse
    /// output or the kernel's block_rq_issue events from tracefs).
    #[arg(long, default_value = "uniform")]
    workload: workload::Spec,
    /// Percentage of requests that are reads.
    #[arg(long, default_value_t = 0.0)]
    read_percent: f64,
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    block_size: u64,
    /// Requests in flight (one thread each).
    #[arg(long, default_value_t = 32)]
    queue_depth: usize,
}

#[derive(clap::Args)]
pub(crate) struct BenchDeviceArgs {
    /// The model: ssd:size=2G[,op=7,unit=16K,block=4M,channels=8,cache=1M,mapcache=SIZE|full],
    /// dmsmr:size=4G[,band=32M,cache=8M], hmsmr:size=4G[,zone=32M,conv=4] or
    /// zoned:size=...; add file=PATH to keep its data in a file instead of memory.
    #[arg(long)]
    device: DeviceSpec,
    #[command(flatten)]
    load: LoadArgs,
    /// SALSA's spare space, in percent of the device.
    #[arg(long, default_value_t = 20.0)]
    spare: f64,
    #[arg(long, value_parser = parse_size)]
    segment_size: Option<u64>,
    /// SALSA volume page size.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    page_size: u64,
    #[arg(long, default_value = "salsa")]
    placement: String,
    #[arg(long, alias = "gc-policy", default_value = "aging-greedy")]
    victim: String,
    /// Run only SALSA (no raw-device run).
    #[arg(long)]
    no_raw: bool,
    /// SALSA does not discard the segments it frees (shows what the device's own GC pays
    /// without TRIM).
    #[arg(long)]
    no_discard: bool,
    /// SALSA's GC writes its records in bursts of SIZE (0: each as it fills; default: the
    /// device's preferred write size, an SSD model's stripe).
    #[arg(long, value_parser = parse_size)]
    gc_burst: Option<u64>,
    /// Skip the precondition (one sequential and one random pass).
    #[arg(long)]
    no_precondition: bool,
    /// Volumes written while measuring.
    #[arg(long, default_value_t = 2.0)]
    measure: f64,
    /// Split the target into this many equal volumes (SALSA volumes of one pool; on the raw
    /// device, equal partitions), as several applications share a drive; each request goes to
    /// the volume its offset falls in.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    volumes: u32,
    /// Each worker flushes its volume after writing this many bytes (a database's commits); by
    /// default nothing flushes while measuring.
    #[arg(long, value_parser = parse_size)]
    flush_every: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for results.json, throughput.svg and wear.svg.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Pool in memory of this size (the default).
    #[arg(long, value_parser = parse_size, default_value = "1G", conflicts_with = "device")]
    memory: u64,
    /// Pool on files instead, PATH:SIZE (repeatable; overwritten, removed afterwards).
    #[arg(long)]
    device: Vec<DeviceSpec>,
    /// Physical space kept spare, in percent.
    #[arg(long, default_value_t = 20.0)]
    spare: f64,
    #[arg(long, value_parser = parse_size)]
    segment_size: Option<u64>,
    /// Volume size (default: all the logical space the pool offers at --spare).
    #[arg(long, value_parser = parse_size)]
    volume_size: Option<u64>,
    /// Also run the GC while garbage is above this percentage of the written space, however
    /// much is free (SepBIT's trigger; give the pool room with --spare or --volume-size).
    #[arg(long)]
    gc_garbage_percent: Option<f64>,
    /// Placement policies, comma-separated; each is run with each victim policy.
    #[arg(long, default_value = "salsa", value_delimiter = ',')]
    placement: Vec<String>,
    /// Victim-selection policies, comma-separated.
    #[arg(long, alias = "gc-policy", default_value = "aging-greedy", value_delimiter = ',')]
    victim: Vec<String>,
    /// Compare policies side by side in one report (report.md, wa.svg, throughput.svg,
    /// latency_cdf.svg): `all` (every placement with every victim policy), or
    /// comma-separated PLACEMENT+VICTIM pairs, `*` standing for every policy of its kind
    /// (`salsa+*`, `*+fifo`). Replaces --placement and --victim.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["placement", "victim"])]
    compare: Vec<String>,
    /// Aging factor of aging-greedy.
    #[arg(long, default_value_t = 0.1)]
    aging: f64,
    /// Skip writing the volume once before the workload.
    #[arg(long)]
    no_precondition: bool,
    /// Volumes written before measuring.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Volumes written while measuring (a trace runs whole).
    #[arg(long, default_value_t = 1.0)]
    measure: f64,
    /// Replay a trace at its recorded times (default: as fast as possible).
    #[arg(long)]
    realtime: bool,
    /// Trace format (default: guessed from the first line): msr, alibaba, fio, blkparse, ftrace.
    #[arg(long)]
    trace_format: Option<bench::trace::Format>,
    /// Volume (Alibaba), disk number (MSR) or device MAJ,MIN (blkparse, ftrace) of the trace to
    /// replay.
    #[arg(long)]
    trace_volume: Option<String>,
    /// Replay the trace this many times in a row (a short trace, repeated, keeps the GC busy
    /// for a cleaning study).
    #[arg(long, default_value_t = 1)]
    trace_repeat: u32,
    /// Record every device request SALSA issues in this file.
    #[arg(long)]
    device_trace: Option<PathBuf>,
    /// Format of --device-trace: msr, alibaba, fio (the kernel's formats are read only).
    #[arg(long, default_value = "alibaba")]
    device_trace_format: bench::trace::Format,
    /// Writers run the GC themselves: deterministic for a seed at queue depth 1.
    #[arg(long)]
    inline_gc: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for results.json and the SVG charts.
    #[arg(long, default_value = "salsa-data/bench-report")]
    out: PathBuf,
    /// Counter sampling period, milliseconds.
    #[arg(long, default_value_t = 500)]
    sample_ms: u64,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run_device_bench(a: &BenchDeviceArgs) -> Result<(), String> {
    let p = bench::device::Params {
        device: a.device.clone(),
        workload: a.load.workload.clone(),
        read_percent: a.load.read_percent,
        block_bytes: a.load.block_size,
        queue_depth: a.load.queue_depth,
        spare_percent: a.spare,
        segment_bytes: a.segment_size,
        page_bytes: u32::try_from(a.page_size).map_err(|_| "page size too large".to_string())?,
        placement: a.placement.clone(),
        victim: a.victim.clone(),
        raw: !a.no_raw,
        discard: !a.no_discard,
        gc_burst_bytes: a.gc_burst,
        precondition: !a.no_precondition,
        measure_volumes: a.measure,
        volumes: a.volumes,
        flush_every_bytes: a.flush_every,
        seed: a.seed,
        out_dir: a.out.clone(),
    };
    let report = bench::device::run(&p, a.json)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    }
    Ok(())
}

pub(crate) fn run_workload_bench(a: &BenchArgs) -> Result<(), String> {
    let registry = salsa_core::Registry::builtin();
    // --placement x --victim is the comparison of every placement with every victim policy.
    let pairs: Vec<String> = if a.compare.is_empty() {
        a.placement
            .iter()
            .flat_map(|pl| a.victim.iter().map(move |v| format!("{pl}+{v}")))
            .collect()
    } else {
        a.compare.clone()
    };
    let policies = bench::compare_pairs(&pairs, &registry)?;
    let p = bench::Params {
        backing: if a.device.is_empty() {
            bench::Backing::Memory(a.memory)
        } else {
            bench::Backing::Files(a.device.clone())
        },
        spare_percent: a.spare,
        segment_bytes: a.segment_size,
        volume_bytes: a.volume_size,
        gc_garbage_percent: a.gc_garbage_percent,
        workload: a.load.workload.clone(),
        read_percent: a.load.read_percent,
        block_bytes: a.load.block_size,
        queue_depth: a.load.queue_depth.clamp(1, 1024),
        precondition: !a.no_precondition,
        warmup_volumes: a.warmup,
        measure_volumes: a.measure,
        realtime: a.realtime,
        policies,
        registry,
        gc_aging: a.aging,
        seed: a.seed,
        inline_gc: a.inline_gc,
        trace_format: a.trace_format,
        trace_volume: a.trace_volume.clone(),
        trace_repeat: a.trace_repeat,
        device_trace: a.device_trace.clone().map(|p| (p, a.device_trace_format)),
        out_dir: Some(a.out.clone()),
        sample_ms: a.sample_ms,
    };
    let outcomes = bench::run(&p, a.json)?;
    if a.json {
        let all: Vec<&serde_json::Value> = outcomes.iter().map(|o| &o.json).collect();
        println!("{}", serde_json::to_string(&all).map_err(|e| e.to_string())?);
    } else {
        print!("{}", bench::table(&outcomes));
        println!("report: {}", a.out.join("report.md").display());
    }
    Ok(())
}

pub(crate) fn run_bench(p: &bench::raw::BenchParams, json: bool) -> Result<(), String> {
    if p.block_bytes == 0 || !p.block_bytes.is_multiple_of(4096) {
        return Err("block size must be a multiple of 4 KiB".into());
    }
    if let Some(f) = &p.file {
        if let Some(dir) = f.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let quiet = json;
    let r = bench::raw::run(p, &|msg| {
        if !quiet {
            eprintln!("{msg}");
        }
    })?;
    if let Some(f) = &p.file {
        let _ = std::fs::remove_file(f);
    }
    let ratio = r.baseline_mbps_median.map(|b| r.salsa_mbps_median / b);
    if json {
        let v = serde_json::json!({
            "volume_bytes": r.volume_bytes,
            "spare_percent": p.spare_percent,
            "queue_depth": p.queue_depth,
            "block_bytes": p.block_bytes,
            "salsa_io": if p.page_cache { "page-cache" } else { "direct" },
            "gc_write_amplification": r.gc_write_amplification,
            "device_write_amplification": r.device_write_amplification,
            "analytic_greedy_wa": r.analytic_wa,
            "salsa_mbps_median": r.salsa_mbps_median,
            "baseline_mbps_median": r.baseline_mbps_median,
            "throughput_ratio": ratio,
            "map_bytes_per_gib_of_volume": r.map_bytes_per_gib,
            "crc_table_bytes_per_gib_of_pool": r.crc_table_bytes_per_gib,
            "salsa_mbps_samples": r.salsa_samples,
            "baseline_mbps_samples": r.baseline_samples,
        });
        println!("{v}");
    } else {
        println!("volume                      {}", human(r.volume_bytes));
        println!(
            "write amplification (GC)    {:.3}  (analytic greedy {:.3}, {:+.1}%)",
            r.gc_write_amplification,
            r.analytic_wa,
            (r.gc_write_amplification / r.analytic_wa - 1.0) * 100.0
        );
        println!(
            "write amplification (dev)   {:.3}  (including metadata pages)",
            r.device_write_amplification
        );
        println!("SALSA throughput, median    {:.1} MB/s", r.salsa_mbps_median);
        if let (Some(b), Some(ratio)) = (r.baseline_mbps_median, ratio) {
            println!("raw O_DIRECT, median        {b:.1} MB/s");
            println!("ratio SALSA / raw           {ratio:.2}");
        }
        println!(
            "map memory                  {} per GiB of volume",
            human(r.map_bytes_per_gib as u64)
        );
        println!(
            "checksum table              {} per GiB of pool",
            human(r.crc_table_bytes_per_gib as u64)
        );
    }
    Ok(())
}
