//! `salsa`: format, inspect, check and benchmark SALSA pools.

mod bench;
mod spec;

use bench::workload;
use clap::{Parser, Subcommand};
use salsa_core::{OpenOptions, Pool, PoolConfig};
use spec::{parse_size, DeviceSpec};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "salsa", version, about = "SALSA: a log-structured host translation layer in user space")]
struct Cli {
    /// More logging (-v info, -vv debug, -vvv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Devices {
    /// A pool member: a file or block device, PATH[:SIZE] (SIZE creates a missing file). Repeat
    /// for several devices, combined linearly.
    #[arg(long = "device", short = 'd', required = true, value_name = "PATH[:SIZE]")]
    devices: Vec<DeviceSpec>,
}

impl Devices {
    fn open(&self, read_only: bool) -> Result<Vec<Arc<dyn salsa_core::Device>>, String> {
        self.devices.iter().map(|d| d.open(read_only)).collect()
    }
}

#[derive(clap::Args, Clone)]
struct FormatArgs {
    /// Physical space kept spare for garbage collection, in percent.
    #[arg(long, default_value_t = 20.0)]
    spare: f64,
    /// Segment size (1M to 1G); default scales with the pool.
    #[arg(long, value_parser = parse_size)]
    segment_size: Option<u64>,
    /// Grain size, the smallest allocation unit.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    grain_size: u64,
    /// Page size of the default volume (4K to 64K, a multiple of the grain).
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    page_size: u64,
    /// GC victim selection policy (`salsa policies` lists them).
    #[arg(long, alias = "gc-policy", default_value = "aging-greedy")]
    victim: String,
    /// Placement policy of the volumes (`salsa policies` lists them).
    #[arg(long, default_value = "salsa")]
    placement: String,
    /// A metadata page after at most this many data pages (default: as many as fit one page).
    #[arg(long)]
    meta_interval: Option<u32>,
}

impl FormatArgs {
    /// The pool configuration these options describe.
    fn pool_config(&self) -> Result<PoolConfig, String> {
        Ok(PoolConfig {
            grain_bytes: u32::try_from(self.grain_size).map_err(|_| "grain size too large")?,
            segment_bytes: self.segment_size,
            meta_interval_pages: self.meta_interval,
            victim_policy: self.victim.clone(),
            default_placement: self.placement.clone(),
            spare_percent: self.spare,
            ..PoolConfig::default()
        })
    }

    /// Creates the volume `default` over the pool's logical space; returns its size.
    fn create_default_volume(&self, pool: &Pool) -> Result<u64, String> {
        let page = u32::try_from(self.page_size).map_err(|_| "page size too large")?;
        let size = pool.logical_capacity_bytes() / self.page_size.max(1) * self.page_size;
        pool.create_volume("default", size, page).map_err(|e| e.to_string())?;
        Ok(size)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the pool's volumes over NBD (one export per volume). Without --device, uses (and
    /// the first time creates) a 1 GiB pool under ./salsa-data with a volume named `default`.
    Serve {
        /// Pool members, PATH[:SIZE]; missing files are created at SIZE, and devices that hold
        /// no data at all are formatted. Default: salsa-data/pool.img:1G.
        #[arg(long = "device", short = 'd', value_name = "PATH[:SIZE]")]
        devices: Vec<DeviceSpec>,
        /// TCP address to listen on.
        #[arg(long, default_value = "127.0.0.1:10809")]
        listen: std::net::SocketAddr,
        /// Do not listen on TCP (use with --unix).
        #[arg(long)]
        no_tcp: bool,
        /// Also (or only) listen on this Unix socket.
        #[arg(long)]
        unix: Option<std::path::PathBuf>,
        /// Serve every export read-only.
        #[arg(long)]
        read_only: bool,
        /// Requests of one connection executed at once, each on its own thread (started on
        /// demand; at most 256).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads_per_connection: u16,
        /// Go through the kernel's page cache instead of O_DIRECT (faster re-reads when memory
        /// is plentiful; flushes still sync the devices).
        #[arg(long)]
        page_cache: bool,
        /// Control socket answering `salsa stats` (default: next to the first device, `.ctl`).
        #[arg(long)]
        control: Option<std::path::PathBuf>,
        /// Options used only when a new pool is created.
        #[command(flatten)]
        format: FormatArgs,
    },
    /// Create a pool on the given devices, with one volume named `default` covering its
    /// logical space. Refuses devices that hold data unless --force.
    Format {
        #[command(flatten)]
        devices: Devices,
        #[command(flatten)]
        format: FormatArgs,
        /// Overwrite devices that hold data (including another SALSA pool).
        #[arg(long)]
        force: bool,
        /// Do not create the `default` volume.
        #[arg(long)]
        no_default_volume: bool,
    },
    /// Statistics of a running server, read from its control socket.
    Stats {
        /// The server's control socket (default: salsa-data/pool.ctl, as `salsa serve` uses).
        #[arg(long)]
        control: Option<std::path::PathBuf>,
        /// Or: the server's first device; its control socket sits next to it.
        #[arg(long = "device", short = 'd', value_name = "PATH")]
        device: Option<DeviceSpec>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show a pool's geometry, volumes and free space.
    Info {
        #[command(flatten)]
        devices: Devices,
    },
    /// Offline check of every checksum and map; exits non-zero on damage.
    Check {
        #[command(flatten)]
        devices: Devices,
    },
    /// Manage volumes.
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
    },
    /// List the placement and victim-selection policies this build knows.
    Policies,
    /// Run a workload against fresh pools, one per policy pair, and report WA, throughput and
    /// latency as JSON and SVG charts.
    Bench(BenchArgs),
    /// Benchmark on an emulated device (SSD, drive-managed or host-managed SMR, zoned): the
    /// workload through SALSA and straight on the raw device, side by side on identical fresh
    /// models; reports device write amplification, wear and modelled throughput over time.
    BenchDevice(BenchDeviceArgs),
    /// Benchmark: random overwrites through SALSA against the same writes straight to the file
    /// with O_DIRECT, side by side.
    BenchRaw {
        /// Scratch file (overwritten); omit for an in-memory pool without baseline.
        #[arg(long, default_value = "salsa-data/bench.img")]
        file: String,
        /// Run in memory instead of on the file.
        #[arg(long)]
        memory: bool,
        #[arg(long, value_parser = parse_size, default_value = "1G")]
        size: u64,
        #[arg(long, default_value_t = 20.0)]
        spare: f64,
        /// Requests in flight (one thread each).
        #[arg(long, default_value_t = 32)]
        queue_depth: usize,
        #[arg(long, value_parser = parse_size, default_value = "4K")]
        block_size: u64,
        /// Overwrites before measuring, in volume sizes.
        #[arg(long, default_value_t = 2.0)]
        warmup: f64,
        /// Overwrites measured, in volume sizes.
        #[arg(long, default_value_t = 1.0)]
        measure: f64,
        /// Seconds of each raw baseline run (one before, one after).
        #[arg(long, default_value_t = 10)]
        baseline_seconds: u64,
        #[arg(long, value_parser = parse_size)]
        segment_size: Option<u64>,
        #[arg(long, alias = "gc-policy", default_value = "aging-greedy")]
        victim: String,
        /// SALSA goes through the kernel's page cache instead of O_DIRECT (the baseline stays
        /// O_DIRECT); its GC then re-reads victims from memory where they are still cached.
        #[arg(long)]
        page_cache: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// What the benchmarks send: the workload, its read share, request size and queue depth.
#[derive(clap::Args)]
struct LoadArgs {
    /// Workload: seq, uniform, hotcold:W/S (W% of writes to S% of the space), zipf:SKEW,
    /// dynzipf:SKEW[:INTERVAL] (SepBIT's: the hottest 20% of ranks move every INTERVAL
    /// written), trace:PATH (MSR, Alibaba or fio iolog).
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
struct BenchDeviceArgs {
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
    /// Skip the precondition (one sequential and one random pass).
    #[arg(long)]
    no_precondition: bool,
    /// Volumes written while measuring.
    #[arg(long, default_value_t = 2.0)]
    measure: f64,
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
struct BenchArgs {
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
    /// Trace format (default: guessed from the first line): msr, alibaba, fio.
    #[arg(long)]
    trace_format: Option<bench::trace::Format>,
    /// Volume (Alibaba) or disk number (MSR) of the trace to replay.
    #[arg(long)]
    trace_volume: Option<String>,
    /// Record every device request SALSA issues in this file.
    #[arg(long)]
    device_trace: Option<PathBuf>,
    /// Format of --device-trace: msr, alibaba, fio.
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

fn run_device_bench(a: &BenchDeviceArgs) -> Result<(), String> {
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
        precondition: !a.no_precondition,
        measure_volumes: a.measure,
        seed: a.seed,
        out_dir: a.out.clone(),
    };
    let report = bench::device::run(&p, a.json)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    }
    Ok(())
}

fn run_workload_bench(a: &BenchArgs) -> Result<(), String> {
    let registry = salsa_core::Registry::builtin();
    for pl in &a.placement {
        registry.check_placement(pl)?;
    }
    for v in &a.victim {
        registry.check_victim(v)?;
    }
    let policies = a
        .placement
        .iter()
        .flat_map(|pl| a.victim.iter().map(move |v| (pl.clone(), v.clone())))
        .collect();
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
        gc_aging: a.aging,
        seed: a.seed,
        inline_gc: a.inline_gc,
        trace_format: a.trace_format,
        trace_volume: a.trace_volume.clone(),
        device_trace: a.device_trace.clone().map(|p| (p, a.device_trace_format)),
        out_dir: Some(a.out.clone()),
        sample_ms: a.sample_ms,
    };
    let outcomes = bench::run(&p, a.json)?;
    if a.json {
        let all: Vec<&serde_json::Value> = outcomes.iter().map(|o| &o.json).collect();
        println!("{}", serde_json::to_string(&all).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{:<28} {:>8} {:>10} {:>12} {:>12}",
            "policy", "WA", "device WA", "MB/s median", "write p99 us"
        );
        for o in &outcomes {
            println!(
                "{:<28} {:>8.3} {:>10.3} {:>12.1} {:>12}",
                o.label,
                o.wa,
                o.json["device_wa"].as_f64().unwrap_or(0.0),
                o.json["throughput_mbps_median"].as_f64().unwrap_or(0.0),
                o.json["latency_write"]["p99_us"]
            );
        }
        println!("report: {}", a.out.display());
    }
    Ok(())
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create a volume (its size may exceed the free space: thin provisioning).
    Create {
        #[command(flatten)]
        devices: Devices,
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
        #[arg(long, value_parser = parse_size, default_value = "4K")]
        page_size: u64,
        /// Placement policy (default: the pool's; `salsa policies` lists them).
        #[arg(long)]
        placement: Option<String>,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        devices: Devices,
    },
    /// Delete a volume; its space returns to the pool.
    Delete {
        #[command(flatten)]
        devices: Devices,
        name: String,
    },
    /// Grow a volume.
    Resize {
        #[command(flatten)]
        devices: Devices,
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
    },
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < units.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

fn rw_options() -> OpenOptions {
    OpenOptions {
        background_gc: false,
        ..OpenOptions::default()
    }
}

fn ro_options() -> OpenOptions {
    OpenOptions {
        background_gc: false,
        read_only: true,
        ..OpenOptions::default()
    }
}

/// Refuses devices that hold anything, unless forced.
fn check_blank(devs: &[Arc<dyn salsa_core::Device>], force: bool) -> Result<(), String> {
    if force {
        return Ok(());
    }
    for d in devs {
        if salsa_core::pool::read_superblock(d.as_ref()).is_ok() {
            return Err(format!("{} already holds a SALSA pool; use --force to overwrite it", d.name()));
        }
        if !salsa_core::pool::device_is_blank(d.as_ref()).map_err(|e| e.to_string())? {
            return Err(format!(
                "{} holds data (its first MiB is not all zeros); use --force to overwrite it",
                d.name()
            ));
        }
    }
    Ok(())
}

fn format_pool(devices: &Devices, f: &FormatArgs, force: bool, default_volume: bool) -> Result<(), String> {
    let devs = devices.open(false)?;
    check_blank(&devs, force)?;
    let pool = Pool::create(devs, &f.pool_config()?, &rw_options()).map_err(|e| e.to_string())?;
    if default_volume {
        let size = f.create_default_volume(&pool)?;
        println!("created volume default: {}", human(size));
    }
    println!("formatted pool {:032x}", pool.pool_id());
    pool.close().map_err(|e| e.to_string())
}

fn info(devices: &Devices) -> Result<(), String> {
    let pool = Pool::open(devices.open(true)?, &ro_options()).map_err(|e| e.to_string())?;
    let g = pool.geometry();
    let st = pool.stats();
    println!("pool        {:032x}", pool.pool_id());
    for d in &devices.devices {
        println!("device      {}", d.path.display());
    }
    println!("array       {} ({} devices)", pool.array_layout(), devices.devices.len());
    println!("physical    {}", human(g.total_grains * g.grain_bytes as u64));
    println!(
        "segments    {} x {} (grain {})",
        g.total_segments,
        human(g.segment_bytes),
        human(g.grain_bytes as u64)
    );
    println!(
        "free        {} segments ({})",
        st.free_segments,
        human(st.free_segments as u64 * g.segment_bytes)
    );
    println!("spare       {}%", pool.spare_percent());
    println!("victim      {}", pool.victim_policy());
    println!("placement   {} (default for new volumes)", pool.default_placement());
    println!("opened from {:?}", pool.opened_from());
    println!("volumes     {}", st.volumes.len());
    for v in &st.volumes {
        println!(
            "  {:<20} size {:>10}  page {:>6}  mapped {:>10}  placement {} ({})",
            v.name,
            human(v.size_bytes),
            human(v.page_bytes as u64),
            human(v.mapped_bytes),
            v.placement,
            human(v.placement_memory_bytes)
        );
    }
    Ok(())
}

fn check(devices: &Devices) -> Result<bool, String> {
    // First as a server would open it (the checkpoint after a clean shutdown), remembering every
    // page's location; then again, rebuilding everything from the log alone. One at a time: the
    // pool is locked while open.
    let mut locations = std::collections::HashMap::new();
    let mut damage = 0u64;
    {
        let normal = Pool::open(devices.open(true)?, &ro_options()).map_err(|e| e.to_string())?;
        for name in normal.volume_names() {
            let v = normal.volume(&name).map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; v.page_bytes() as usize];
            let mut locs = Vec::with_capacity(v.pages() as usize);
            for p in 0..v.pages() {
                let loc = v.page_location(p);
                // Every page the open view maps must match its checksum.
                if loc.is_some() {
                    if let Err(e) = v.read(p * v.page_bytes() as u64, &mut buf) {
                        println!("volume {name}: page {p}: {e}");
                        damage += 1;
                    }
                }
                locs.push(loc);
            }
            locations.insert(name, locs);
        }
    }
    let scanned = Pool::open_with_progress(
        devices.open(true)?,
        &OpenOptions {
            force_scan: true,
            ..ro_options()
        },
        &progress_bar("scan"),
    )
    .map_err(|e| e.to_string())?;
    let mut pages_checked = 0u64;
    for name in scanned.volume_names() {
        let b = scanned.volume(&name).map_err(|e| e.to_string())?;
        let Some(a) = locations.get(&name) else {
            println!("volume {name}: present in the log but not at open");
            damage += 1;
            continue;
        };
        let mut buf = vec![0u8; b.page_bytes() as usize];
        let mut differ = 0;
        let progress = progress_bar("verify");
        for p in 0..b.pages() {
            let (at_open, in_log) = (a.get(p as usize).copied().flatten(), b.page_location(p));
            if at_open != in_log {
                if differ < 10 {
                    println!("volume {name}: page {p}: checkpoint says grain {at_open:?}, the log says grain {in_log:?}");
                }
                differ += 1;
            }
            if b.page_location(p).is_some() {
                pages_checked += 1;
                if let Err(e) = b.read(p * b.page_bytes() as u64, &mut buf) {
                    println!("volume {name}: page {p}: {e}");
                    damage += 1;
                }
            }
            if p % 65536 == 0 || p + 1 == b.pages() {
                progress(p + 1, b.pages());
            }
        }
        if differ > 0 {
            println!("volume {name}: {differ} pages map differently in the checkpoint and in the log");
            damage += differ;
        }
    }
    println!(
        "checked {pages_checked} mapped pages in {} volumes: {damage} problems",
        scanned.volume_names().len()
    );
    Ok(damage == 0)
}

fn volume(cmd: &VolumeCommand) -> Result<(), String> {
    match cmd {
        VolumeCommand::Create {
            devices,
            name,
            size,
            page_size,
            placement,
        } => {
            let pool = Pool::open(devices.open(false)?, &rw_options()).map_err(|e| e.to_string())?;
            let page = u32::try_from(*page_size).map_err(|_| "page size too large")?;
            let placement = placement.clone().unwrap_or_else(|| pool.default_placement().to_string());
            pool.create_volume_with(name, *size, page, &placement).map_err(|e| e.to_string())?;
            println!("created volume {name}: {}", human(*size));
            pool.close().map_err(|e| e.to_string())
        }
        VolumeCommand::List { devices } => {
            let pool = Pool::open(devices.open(true)?, &ro_options()).map_err(|e| e.to_string())?;
            for v in pool.stats().volumes {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    v.name, v.size_bytes, v.page_bytes, v.mapped_bytes, v.placement
                );
            }
            Ok(())
        }
        VolumeCommand::Delete { devices, name } => {
            let pool = Pool::open(devices.open(false)?, &rw_options()).map_err(|e| e.to_string())?;
            pool.delete_volume(name).map_err(|e| e.to_string())?;
            println!("deleted volume {name}");
            pool.close().map_err(|e| e.to_string())
        }
        VolumeCommand::Resize { devices, name, size } => {
            let pool = Pool::open(devices.open(false)?, &rw_options()).map_err(|e| e.to_string())?;
            pool.grow_volume(name, *size).map_err(|e| e.to_string())?;
            println!("volume {name} is now {}", human(*size));
            pool.close().map_err(|e| e.to_string())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match &cli.command {
        Command::Serve {
            devices,
            listen,
            no_tcp,
            unix,
            read_only,
            threads_per_connection,
            control,
            page_cache,
            format,
        } => serve(
            devices,
            ServeArgs {
                tcp: (!no_tcp).then_some(*listen),
                unix: unix.clone(),
                read_only: *read_only,
                threads_per_connection: usize::from(*threads_per_connection),
                control: control.clone(),
                page_cache: *page_cache,
            },
            format,
        ),
        Command::Stats { control, device, json } => stats(control.clone(), device.as_ref(), *json),
        Command::Format {
            devices,
            format,
            force,
            no_default_volume,
        } => format_pool(devices, format, *force, !no_default_volume),
        Command::Info { devices } => info(devices),
        Command::Check { devices } => match check(devices) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Volume { command } => volume(command),
        Command::Policies => {
            let (victims, placements) = salsa_core::Registry::builtin().describe();
            println!("placement policies (--placement):");
            for (n, a) in placements {
                println!("  {n:<14} {a}");
            }
            println!("victim policies (--victim):");
            for (n, a) in victims {
                println!("  {n:<14} {a}");
            }
            Ok(())
        }
        Command::Bench(args) => run_workload_bench(args),
        Command::BenchDevice(a) => run_device_bench(a),
        Command::BenchRaw {
            file,
            memory,
            size,
            spare,
            queue_depth,
            block_size,
            warmup,
            measure,
            baseline_seconds,
            segment_size,
            victim,
            page_cache,
            json,
        } => run_bench(
            &bench::raw::BenchParams {
                file: (!memory).then(|| file.into()),
                size_bytes: *size,
                spare_percent: *spare,
                queue_depth: (*queue_depth).clamp(1, 1024),
                block_bytes: *block_size as usize,
                warmup_volumes: *warmup,
                measure_volumes: *measure,
                baseline_seconds: *baseline_seconds,
                segment_bytes: *segment_size,
                victim_policy: victim.clone(),
                page_cache: *page_cache,
            },
            *json,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("salsa: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_bench(p: &bench::raw::BenchParams, json: bool) -> Result<(), String> {
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

struct ServeArgs {
    tcp: Option<std::net::SocketAddr>,
    unix: Option<std::path::PathBuf>,
    read_only: bool,
    threads_per_connection: usize,
    control: Option<std::path::PathBuf>,
    page_cache: bool,
}

const DEFAULT_DEVICE: &str = "salsa-data/pool.img";

/// The control socket of a server whose first device is `device`: `<device without extension>.ctl`.
fn control_path_for(device: &std::path::Path) -> std::path::PathBuf {
    device.with_extension("ctl")
}

/// The statistics as one JSON object.
fn stats_json(pool: &Pool) -> serde_json::Value {
    let s = pool.stats();
    serde_json::json!({
        "user_bytes_written": s.user_bytes_written,
        "user_bytes_read": s.user_bytes_read,
        "gc_bytes_relocated": s.gc_bytes_relocated,
        "device_bytes_written": s.device_bytes_written,
        "metadata_bytes_written": s.metadata_bytes_written,
        "write_amplification": s.write_amplification,
        "gc_write_amplification": s.gc_write_amplification,
        "free_segments": s.free_segments,
        "total_segments": s.total_segments,
        "segment_bytes": s.segment_bytes,
        "gc_segments_cleaned": s.gc_segments_cleaned,
        "flushes": s.flushes,
        "syncs": s.syncs,
        "throttled_allocations": s.throttled_allocations,
        "unmovable_segments": s.unmovable_segments,
        "gc_wait_timeouts": s.gc_wait_timeouts,
        "user_bytes_held": s.user_bytes_held,
        "payload_buffer_bytes": s.payload_buffer_bytes,
        "map_memory_bytes": s.map_memory_bytes,
        "crc_table_memory_bytes": s.crc_table_memory_bytes,
        "volumes": s.volumes.iter().map(|v| serde_json::json!({
            "name": v.name, "size_bytes": v.size_bytes, "page_bytes": v.page_bytes,
            "mapped_bytes": v.mapped_bytes, "map_memory_bytes": v.map_memory_bytes,
            "placement": v.placement, "placement_memory_bytes": v.placement_memory_bytes,
        })).collect::<Vec<_>>(),
    })
}

/// Answers every connection on the control socket with the statistics, until `stop`.
fn control_thread(listener: std::os::unix::net::UnixListener, pool: Arc<Pool>, stop: Arc<std::sync::atomic::AtomicBool>) {
    use std::io::Write;
    let _ = listener.set_nonblocking(true);
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = writeln!(s, "{}", stats_json(&pool));
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

fn stats(control: Option<std::path::PathBuf>, device: Option<&DeviceSpec>, json: bool) -> Result<(), String> {
    use std::io::Read;
    let path =
        control.unwrap_or_else(|| control_path_for(device.map(|d| d.path.as_path()).unwrap_or(std::path::Path::new(DEFAULT_DEVICE))));
    let mut s = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        format!(
            "cannot reach a running server at {}: {e} (is `salsa serve` running?)",
            path.display()
        )
    })?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|e| format!("bad answer from {}: {e}", path.display()))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    println!("user written      {}", human(n("user_bytes_written")));
    println!("user read         {}", human(n("user_bytes_read")));
    println!("GC relocated      {}", human(n("gc_bytes_relocated")));
    println!("device written    {}", human(n("device_bytes_written")));
    println!("write amp.        {:.3}", v["write_amplification"].as_f64().unwrap_or(0.0));
    println!("free segments     {} of {}", n("free_segments"), n("total_segments"));
    println!("map memory        {}", human(n("map_memory_bytes")));
    for vol in v["volumes"].as_array().into_iter().flatten() {
        println!(
            "volume {:<20} size {:>10} mapped {:>10}",
            vol["name"].as_str().unwrap_or("?"),
            human(vol["size_bytes"].as_u64().unwrap_or(0)),
            human(vol["mapped_bytes"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

/// Opens the pool on `specs`, or creates it when every device is blank; refuses anything else.
fn open_or_create(specs: &[DeviceSpec], format: &FormatArgs, read_only: bool, page_cache: bool) -> Result<Pool, String> {
    for s in specs {
        if let Some(dir) = s.path.parent().filter(|d| !d.as_os_str().is_empty() && s.size_bytes.is_some()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let devs: Vec<_> = specs.iter().map(|d| d.open_with(read_only, page_cache)).collect::<Result<_, _>>()?;
    let mut members = 0;
    for d in &devs {
        match salsa_core::pool::read_superblock(d.as_ref()) {
            Ok(_) => members += 1,
            Err(salsa_core::Error::NotAPool { .. }) => {
                if !salsa_core::pool::device_is_blank(d.as_ref()).map_err(|e| e.to_string())? {
                    let list: Vec<String> = specs.iter().map(|s| format!("--device {}", s.path.display())).collect();
                    return Err(format!(
                        "{} holds data that is not a SALSA pool; nothing was written. To overwrite it: salsa format --force {}",
                        d.name(),
                        list.join(" ")
                    ));
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let opts = OpenOptions {
        read_only,
        ..OpenOptions::default()
    };
    if members == devs.len() {
        eprintln!("salsa: opening pool on {} device(s)", devs.len());
        return Pool::open_with_progress(devs, &opts, &progress_bar("recovery scan")).map_err(|e| e.to_string());
    }
    if members > 0 {
        return Err("some devices belong to a SALSA pool and others are blank; give exactly the pool's members".into());
    }
    if read_only {
        return Err("the devices hold no pool and --read-only forbids creating one".into());
    }
    let pool = Pool::create(devs, &format.pool_config()?, &opts).map_err(|e| e.to_string())?;
    let size = format.create_default_volume(&pool)?;
    eprintln!(
        "salsa: created a new pool {:032x} with volume default ({})",
        pool.pool_id(),
        human(size)
    );
    Ok(pool)
}

/// A progress reporter for long operations: a bar on a terminal, silence otherwise.
fn progress_bar(what: &'static str) -> impl Fn(u64, u64) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    move |done: u64, total: u64| {
        if tty && total > 0 {
            let width = 40;
            let filled = (done * width / total) as usize;
            eprint!(
                "\r{what} [{}{}] {done}/{total}",
                "#".repeat(filled),
                " ".repeat(width as usize - filled)
            );
            if done >= total {
                eprintln!();
            }
        }
    }
}

fn serve(specs: &[DeviceSpec], args: ServeArgs, format: &FormatArgs) -> Result<(), String> {
    let default = [DeviceSpec {
        path: "salsa-data/pool.img".into(),
        size_bytes: Some(1 << 30),
        model: None,
    }];
    let specs = if specs.is_empty() { &default[..] } else { specs };
    let pool = Arc::new(open_or_create(specs, format, args.read_only, args.page_cache)?);
    let cfg = salsa_nbd::server::ServerConfig {
        tcp: args.tcp,
        unix: args.unix.clone(),
        read_only: args.read_only,
        threads_per_connection: args.threads_per_connection,
    };
    let listening = salsa_nbd::server::Listening::bind(pool.clone(), &cfg)?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let mut wheres = Vec::new();
    if let Some(a) = listening.tcp_addr() {
        wheres.push(format!("nbd://{a}"));
    }
    if let Some(u) = &args.unix {
        wheres.push(format!("nbd+unix:///?socket={}", u.display()));
    }
    eprintln!("salsa: serving {} on {}", pool.volume_names().join(", "), wheres.join(" and "));
    let control_path = args.control.clone().unwrap_or_else(|| control_path_for(&specs[0].path));
    let control = salsa_nbd::server::bind_unix(&control_path)?;
    let control_thread = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || control_thread(control, pool, stop))
    };
    listening.run(stop);
    let _ = control_thread.join();
    let _ = std::fs::remove_file(&control_path);
    eprintln!("salsa: stopping: writing the checkpoint");
    let pool = Arc::try_unwrap(pool).map_err(|_| "internal error: the pool is still in use after the server stopped".to_string())?;
    pool.close().map_err(|e| e.to_string())?;
    eprintln!("salsa: stopped cleanly");
    Ok(())
}
