//! `salsa`: format, inspect, check and benchmark SALSA pools.

mod commands;
mod control;
use salsa_cli::{bench, progress_bar, spec};

use bench::workload;
use clap::{Parser, Subcommand};
use commands::admin::{check, format_pool, info, scrub_pool};
use commands::bench::{run_bench, run_device_bench, run_workload_bench, BenchArgs, BenchDeviceArgs};
use commands::serve::{serve, ServeArgs};
use commands::stats::stats;
use commands::volume::{volume, VolumeCommand};
use salsa_core::{ArrayKind, ControllerKind, OpenOptions, Pool, PoolConfig, VolumeSpec};
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

#[derive(clap::Args, Clone, Default)]
struct Devices {
    /// A pool member: a file or block device, PATH[:SIZE] (SIZE creates a missing file), or a
    /// device model (ssd:, dmsmr:, hmsmr:, zoned:, hdd:size=SIZE,...). A trailing @TYPE (flash,
    /// hdd, nvm) declares its storage type at format (hybrid volumes keep data on hdd and hot
    /// copies on flash). Repeat for several devices; `salsa format --array` chose how they
    /// combine (linearly by default).
    /// Default (every command but `format`): salsa-data/pool.img, the pool `salsa serve`
    /// makes by default.
    #[arg(long = "device", short = 'd', value_name = "PATH[:SIZE][@TYPE]")]
    devices: Vec<DeviceSpec>,
    /// RAID-5 only: a small fast device (a file or block device; on real hardware NVM, an NVMe
    /// PMR or a small SSD partition) that keeps the parity of the rows being filled, so that a
    /// flush never pads a row. PATH[:SIZE]; `salsa format` creates a missing file at SIZE, or
    /// at the size the layout needs. Every later command on the pool names it too.
    #[arg(long, value_name = "PATH[:SIZE]")]
    parity_buffer: Option<DeviceSpec>,
}

/// Where a command that changes a pool finds it: the running server (its control socket, or
/// the socket next to the first device), or, when none answers, the pool itself offline.
#[derive(clap::Args, Clone)]
struct ServerOrDevices {
    /// The pool's devices (offline), or its first device (to find the running server's control
    /// socket).
    #[arg(long = "device", short = 'd', value_name = "PATH[:SIZE]")]
    devices: Vec<DeviceSpec>,
    /// A RAID-5 pool's parity buffer (offline only).
    #[arg(long, value_name = "PATH")]
    parity_buffer: Option<DeviceSpec>,
    /// The running server's control socket.
    #[arg(long)]
    control: Option<PathBuf>,
}

impl Devices {
    /// Names the default pool (`salsa serve`'s, [`DEFAULT_DEVICE`]) when no device was given,
    /// as `salsa stats` finds the default server: for every command that looks at or changes
    /// a pool. `format` names its devices itself.
    fn or_default(&mut self) -> Result<(), String> {
        if self.devices.is_empty() {
            self.devices.push(DEFAULT_DEVICE.parse()?);
        }
        Ok(())
    }

    /// Opens (creating missing files at the sizes given): for `format`.
    fn open(&self, read_only: bool) -> Result<Vec<Arc<dyn salsa_core::Device>>, String> {
        if self.devices.is_empty() {
            return Err("give the pool's devices: --device PATH:SIZE (e.g. --device salsa-data/pool.img:1G)".into());
        }
        self.check_distinct()?;
        self.devices.iter().map(|d| d.open(read_only)).collect()
    }

    /// Opens devices that must exist: for the commands that only look at or change a pool
    /// (one gone from a redundant pool is left out, see [`open_present`]).
    fn open_existing(&self, read_only: bool) -> Result<Vec<Arc<dyn salsa_core::Device>>, String> {
        self.check_distinct()?;
        if let [only] = &self.devices[..] {
            if only.model.is_none() && only.path == std::path::Path::new(DEFAULT_DEVICE) && !only.path.exists() {
                return Err(format!(
                    "no pool at {DEFAULT_DEVICE} (the default); give its devices with --device PATH, or start one with `salsa serve`"
                ));
            }
        }
        open_present(&self.devices, |d| d.open_existing(read_only))
    }

    /// Every device, the parity buffer too, named once.
    fn check_distinct(&self) -> Result<(), String> {
        salsa_core::spec::check_distinct(self.devices.iter().chain(&self.parity_buffer))
    }

    /// Opens the existing pool on these devices (and its parity buffer) with `opts`.
    fn open_pool(&self, opts: OpenOptions) -> Result<Pool, String> {
        self.open_pool_with_progress(opts, &|_, _| {})
    }

    fn open_pool_with_progress(&self, opts: OpenOptions, progress: &dyn Fn(u64, u64)) -> Result<Pool, String> {
        let devs = self.open_existing(opts.read_only)?;
        let opts = with_parity_buffer(opts, self.parity_buffer.as_ref(), None)?;
        Pool::open_with_progress(devs, &opts, progress).map_err(|e| e.to_string())
    }
}

/// Opens `specs` with `open`, except, when the ones that exist hold members of a pool, the
/// files that do not (a disk gone): those are left out with a warning, so that a redundant
/// pool opens degraded and the pool's open judges whether it can (a missing file is never
/// created for a pool that exists). Without a member among them, every spec is opened with
/// `open`, which creates or refuses.
pub(crate) fn open_present(
    specs: &[DeviceSpec],
    open: impl Fn(&DeviceSpec) -> Result<Arc<dyn salsa_core::Device>, String>,
) -> Result<Vec<Arc<dyn salsa_core::Device>>, String> {
    if specs.iter().any(DeviceSpec::is_missing) && !specs.iter().all(DeviceSpec::is_missing) {
        let present: Vec<_> = specs.iter().filter(|s| !s.is_missing()).map(&open).collect::<Result<_, _>>()?;
        if present.iter().any(|d| salsa_core::pool::read_superblock(d.as_ref()).is_ok()) {
            for s in specs.iter().filter(|s| s.is_missing()) {
                eprintln!("salsa: {} does not exist: the pool opens without it", s.path.display());
            }
            return Ok(present);
        }
    }
    specs.iter().map(open).collect()
}

/// `opts` with the parity buffer `spec` opened, read-only when they are. `new_pool`: the
/// configuration and member count of a pool about to be created, for the size of a missing
/// file given without one; otherwise the buffer must exist.
fn with_parity_buffer(
    mut opts: OpenOptions,
    spec: Option<&DeviceSpec>,
    new_pool: Option<(&PoolConfig, usize)>,
) -> Result<OpenOptions, String> {
    let Some(spec) = spec else { return Ok(opts) };
    let device = match new_pool {
        Some((cfg, members)) => {
            let mut spec = spec.clone();
            if spec.size_bytes.is_none() && spec.is_missing() {
                spec.size_bytes = Some(salsa_core::pool::default_parity_buffer_bytes(cfg, members as u32));
            }
            spec.open(false)?
        }
        None if spec.is_missing() => {
            return Err(format!(
                "parity buffer {}: no such file or device (one is created only with a new pool); if the pool's buffer is lost, go on without it or with a new one: salsa device parity-buffer",
                spec.path.display()
            ))
        }
        None => spec.open_existing(opts.read_only)?,
    };
    opts.parity_buffer = Some(device);
    Ok(opts)
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
    /// Page size of the default volume (4K to 64K, a multiple of the grain; default 4K, 64K
    /// with --controller dual).
    #[arg(long, value_parser = parse_size)]
    page_size: Option<u64>,
    /// Controller of the default volume: lsa (a page map), dual (large pages and a sparse map
    /// of small ones) or hybrid (data on the pool's disks, hot data copied to its flash); see
    /// `salsa volume create --help`.
    #[arg(long, default_value = "lsa", value_parser = parse_controller_name)]
    controller: String,
    /// With --controller amf: the default volume's segment size (default: the pool's
    /// segment size).
    #[arg(long, value_parser = parse_size)]
    amf_segment: Option<u64>,
    /// With --controller amf: the default volume's user streams (1 to 8, default 1).
    #[arg(long)]
    amf_segment_streams: Option<u8>,
    /// With --controller dual: most 4 KiB pages the default volume's sparse map holds.
    #[arg(long)]
    sparse_pages: Option<u64>,
    #[command(flatten)]
    hybrid: commands::volume::HybridArgs,
    /// GC victim selection policy (`salsa policies` lists them).
    #[arg(long, alias = "gc-policy", default_value = "aging-greedy")]
    victim: String,
    /// Placement policy of the volumes (`salsa policies` lists them).
    #[arg(long, default_value = "salsa")]
    placement: String,
    /// A metadata page after at most this many data pages (default: as many as fit one page).
    #[arg(long)]
    meta_interval: Option<u32>,
    /// How the devices are combined: linear (concatenated), raid0 (striped), raid1 (every
    /// device a mirror), raid5 (striped with rotating parity, no read-modify-write).
    #[arg(long, default_value = "linear", value_parser = parse_array)]
    array: ArrayKind,
    /// Stripe unit of raid0 (default 64K) or raid5 (default 16K): a power of two, 4K to 1M.
    #[arg(long, value_parser = parse_size)]
    stripe_unit: Option<u64>,
}

/// A volume of the controller named `controller` (`lsa` or `dual`) with pages of `page_size`,
/// by default 4 KiB for `lsa` and 64 KiB for `dual` (its large pages), and the pool's
/// policies.
fn volume_spec(controller: &str, page_size: Option<u64>) -> Result<VolumeSpec, String> {
    let controller = ControllerKind::from_name(controller).ok_or_else(|| format!("unknown controller {controller:?}"))?;
    let default_page = if controller == ControllerKind::Dual { 64 << 10 } else { 4096 };
    let page = u32::try_from(page_size.unwrap_or(default_page)).map_err(|_| "page size too large")?;
    Ok(VolumeSpec {
        controller,
        ..VolumeSpec::lsa(page)
    })
}

/// Checks `--compression` (kept as given, so that the command travels to a server as text).
fn parse_compression(s: &str) -> Result<String, String> {
    salsa_core::Compression::parse(s).map(|_| s.to_string())
}

/// Parses `--array`.
fn parse_array(s: &str) -> Result<ArrayKind, String> {
    ArrayKind::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = ArrayKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown array layout {s:?}; one of {}", names.join(", "))
    })
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
            array: self.array,
            stripe_unit_bytes: self
                .stripe_unit
                .map(|u| u32::try_from(u).map_err(|_| "stripe unit too large"))
                .transpose()?,
            ..PoolConfig::default()
        })
    }

    /// Creates the volume `default` over the pool's logical space; returns its size.
    fn create_default_volume(&self, pool: &Pool) -> Result<u64, String> {
        let spec = VolumeSpec {
            sparse_pages: self.sparse_pages,
            hybrid: self.hybrid.spec(),
            segment_bytes: self.amf_segment,
            segment_streams: self.amf_segment_streams,
            ..volume_spec(&self.controller, self.page_size)?
        };
        let page_bytes = spec.page_bytes.max(1) as u64;
        let mut logical = if spec.controller == ControllerKind::Hybrid {
            // Its data lives on the slow devices only; the fast ones hold copies.
            pool.slow_capacity_bytes()
        } else {
            pool.logical_capacity_bytes()
        };
        if spec.controller == ControllerKind::Dual {
            // Its small pages take room on top of the large pages they overlay.
            let g = pool.geometry();
            let pages = self
                .sparse_pages
                .unwrap_or_else(|| salsa_core::pool::default_sparse_pages(logical, g.grain_bytes));
            let sparse = pages.saturating_mul(g.grain_bytes as u64);
            logical = logical.saturating_sub(sparse);
        }
        let unit = match spec.controller {
            // An AMF volume is a whole number of its segments.
            ControllerKind::Amf => spec
                .segment_bytes
                .unwrap_or_else(|| salsa_core::pool::default_amf_segment_bytes(pool.geometry().segment_bytes)),
            _ => page_bytes,
        };
        let size = logical / unit * unit;
        if size == 0 {
            return Err(format!(
                "the pool is too small to hold a volume once its spare ({}%) and the GC's reserve are set aside: {} segments of {}; give bigger devices or a smaller --segment-size",
                self.spare,
                pool.geometry().total_segments,
                human(pool.geometry().segment_bytes)
            ));
        }
        pool.create_volume_spec("default", size, &spec).map_err(|e| e.to_string())?;
        Ok(size)
    }
}

// One value per process, parsed once: the size of its largest variant (serve's options) costs
// nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve the pool's volumes over NBD (one export per volume). Without --device, uses (and
    /// the first time creates) a 1 GiB pool under ./salsa-data with a volume named `default`.
    Serve {
        /// Pool members, PATH[:SIZE]; missing files are created at SIZE, and devices that hold
        /// no data at all are formatted. Default: salsa-data/pool.img:1G.
        #[arg(long = "device", short = 'd', value_name = "PATH[:SIZE]")]
        devices: Vec<DeviceSpec>,
        /// TCP address to listen on, HOST:PORT (an address or a name: 0.0.0.0:10809,
        /// [::1]:10809, localhost:10809).
        #[arg(long, default_value = "127.0.0.1:10809", value_parser = parse_listen)]
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
        /// DRAM kept for copies of pages read, so hot data is re-read from memory (e.g. 2G; 0
        /// turns it off). Default: an eighth of the machine's memory, 64 MiB to 4 GiB.
        #[arg(long, value_parser = parse_size)]
        read_cache: Option<u64>,
        /// DRAM kept for pages written and not yet flushed (e.g. 1G; 0 turns it off): a page
        /// overwritten before the next flush never reaches the disk, as with a server on the
        /// kernel's page cache, and flushes make every write before them durable as always.
        /// Default: an eighth of the machine's memory, 64 MiB to 4 GiB.
        #[arg(long, value_parser = parse_size)]
        write_buffer: Option<u64>,
        /// Write buffered pages down once the oldest has waited this long, flush or not.
        #[arg(long, value_name = "MS", default_value_t = 5000)]
        write_buffer_expire_ms: u64,
        /// Pace writes while the garbage collector is behind: writes are admitted at the rate
        /// it sustains (found by feedback), each waiting its turn, instead of a few waiting for
        /// whole victims. Cuts the tail of write latency under sustained overwrites; raises
        /// write amplification a little (the GC keeps a few more segments free).
        #[arg(long)]
        pace_writes: bool,
        /// Serve the statistics for Prometheus at http://HOST:PORT/metrics (pool, volumes,
        /// members, read cache, device counters).
        #[arg(long, value_name = "HOST:PORT")]
        metrics: Option<std::net::SocketAddr>,
        /// Run CMD (with `sh -c`) when a member changes state: it fails or is missing, its
        /// replacement is being rebuilt, or it is in service again. The command gets
        /// SALSA_EVENT (member-failed, member-rebuilding, member-ok), SALSA_SLOT,
        /// SALSA_MEMBER, SALSA_STATE, SALSA_PREVIOUS_STATE and SALSA_ARRAY.
        #[arg(long, value_name = "CMD")]
        on_event: Option<String>,
        /// A hot spare of a redundant pool, PATH[:SIZE] (a missing file is created at SIZE
        /// when it is needed): when a member fails, the server rebuilds it onto the next spare
        /// at once, without being asked, as MD's and ZFS's spares do. Repeat for several. A
        /// spare that holds data or a pool is refused at start.
        #[arg(long = "hot-spare", value_name = "PATH[:SIZE]")]
        hot_spares: Vec<DeviceSpec>,
        /// A RAID-5 pool's parity buffer, PATH[:SIZE] (see `salsa format --help`); created with
        /// a new pool when missing.
        #[arg(long, value_name = "PATH[:SIZE]")]
        parity_buffer: Option<DeviceSpec>,
        /// Serve the one device given as it is, without a pool, as the export `raw`: a
        /// baseline, so a file system on a device model can be measured without SALSA through
        /// the same server and clients. Refuses a device that holds a SALSA pool.
        #[arg(long)]
        raw: bool,
        /// With --raw: serve the devices given (three or more) as one in-place RAID-5 with
        /// chunks of SIZE (rotating parity, read-modify-write of data and parity on every
        /// partial-row write, as Linux MD does; `bench-raid`'s baseline): the baseline of the
        /// paper's Table IIb, which MD is not in this kernel to give.
        #[arg(long, value_parser = parse_size, value_name = "CHUNK", requires = "raw")]
        in_place_raid5: Option<u64>,
        /// Do not discard freed segments on the devices. By default a segment the GC or
        /// overwrites emptied is discarded before reuse (TRIM on an SSD or a block device, a
        /// hole punched in an image file), so that an SSD does not move dead data in its own
        /// garbage collection and an image file gives the space back. On an image file an eighth
        /// of the pool stays free without holes (a segment reused at once would only make the
        /// file system allocate it again); only free segments beyond that are punched.
        #[arg(long)]
        no_discard: bool,
        /// The GC writes its records in bursts of SIZE (0: each as it fills). Default: what
        /// the devices prefer to be written in order (an SSD model's stripe, an SMR band;
        /// nothing on files), so that a drive which programs in arrival order keeps the GC's
        /// cold data apart from the users' hot data.
        #[arg(long, value_parser = parse_size)]
        gc_burst: Option<u64>,
        /// TLS for clients (NBD STARTTLS): off, on (clients may start it) or require
        /// (default: require when credentials are given, else off).
        #[arg(long, value_parser = parse_tls_mode)]
        tls: Option<salsa_nbd::proto::TlsMode>,
        /// TLS with X.509 certificates: a directory holding server-cert.pem and server-key.pem
        /// (and ca-cert.pem for --tls-verify-peer), as nbdkit and qemu-nbd take them.
        #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
        tls_certificates: Option<std::path::PathBuf>,
        /// TLS with pre-shared keys: a file of identity:hexkey lines (GnuTLS psktool's format).
        #[arg(long, value_name = "FILE")]
        tls_psk: Option<std::path::PathBuf>,
        /// Require clients to present a certificate signed by ca-cert.pem (with
        /// --tls-certificates).
        #[arg(long, requires = "tls_certificates")]
        tls_verify_peer: bool,
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
    /// Remap ranges of a volume without copying data (SHARE): afterwards each destination reads
    /// what its source read. The batch is atomic (after a crash, all of it or none) and durable
    /// when the command returns. Through the running server when one answers, else offline.
    /// Ranges are whole pages; at most 256, with destinations that do not overlap.
    Share {
        #[command(flatten)]
        target: ServerOrDevices,
        /// The volume (default: the one `salsa serve` creates).
        #[arg(long, default_value = "default")]
        volume: String,
        /// DST:SRC:LEN: byte offsets and a length (suffixes K, M, G), e.g. 1G:0:64K.
        #[arg(required = true, value_name = "DST:SRC:LEN")]
        ranges: Vec<String>,
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
    /// Offline check of every checksum and map; exits non-zero on damage. With --scrub on a
    /// pool being served, the scrub alone, through the server (the pool keeps serving).
    Check {
        #[command(flatten)]
        devices: Devices,
        /// Also compare the array's redundancy (RAID-5 parity, RAID-1 copies) with the data
        /// of every segment in use.
        #[arg(long)]
        scrub: bool,
        /// With --scrub: rewrite redundancy that disagrees with the data.
        #[arg(long, requires = "scrub")]
        repair: bool,
    },
    /// Manage the devices of a pool.
    Device {
        #[command(subcommand)]
        command: DeviceCommand,
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
    /// Benchmark: map memory of the extent-mapped controller against the page map on a
    /// sequential, a video-library and a random-write workload (fresh in-memory pools). Prints
    /// JSON.
    BenchMapMemory {
        /// Size of the volume (the pool is half as large again, in memory).
        #[arg(long, value_parser = parse_size, default_value = "1G")]
        volume_size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Benchmark: an LSM-style writer of segment-sized tables (1 MiB appends two tables at a
    /// time, compactions that read four tables, write four and trim four) on an AMF volume
    /// against an LSA (page map) volume, alternating rounds on fresh SSD models: write
    /// amplification, GC relocation, map memory, modelled and wall throughput. Prints JSON.
    BenchAmf {
        /// The model (fresh for every run).
        #[arg(long, default_value = "ssd:size=2G")]
        device: String,
        /// The pool's segment, the AMF volume's segment and a table's size.
        #[arg(long, value_parser = parse_size, default_value = "8M")]
        segment_size: u64,
        /// Live tables as a share of the volume.
        #[arg(long, default_value_t = 0.7)]
        fill: f64,
        /// User bytes written while measuring, in volume sizes.
        #[arg(long, default_value_t = 2.0)]
        measure: f64,
        /// Alternating rounds of each volume kind.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Benchmark: SHARE's experiments, each against its baseline in one run: a page store
    /// flushing batches of 16 KiB pages through a double-write area against sharing them home,
    /// and an append-only file compacted by copying against sharing its live pages. Prints
    /// one JSON object.
    BenchShare {
        /// The device (a file spec, created and removed; or a model).
        #[arg(long, default_value = "salsa-data/bench-share.img:2G")]
        device: String,
        /// Pages per flushed batch.
        #[arg(long = "batch", default_value_t = 64)]
        batch_pages: usize,
        /// Batches measured per round.
        #[arg(long, default_value_t = 400)]
        batches: usize,
        /// Size of the file the compaction runs on.
        #[arg(long, value_parser = parse_size, default_value = "256M")]
        file_size: u64,
        /// Share of the file's pages updated (appended again) before compaction.
        #[arg(long, default_value_t = 0.3)]
        updated: f64,
        /// Alternating rounds of each mode.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Benchmark: SALSA's RAID-5 against an in-place RAID-5 doing what Linux MD does (read old
    /// data and parity to write), on the same member files, alternating rounds: 4 KiB random
    /// and 1 MiB sequential writes, degraded reads, rebuild against a whole-device resync.
    /// Prints one JSON object.
    BenchRaid {
        /// Directory for the member files (m0.img.. and a spare; overwritten, then removed).
        #[arg(long, default_value = "salsa-data/bench-raid")]
        dir: PathBuf,
        #[arg(long, default_value_t = 4)]
        members: usize,
        /// Size of each member file.
        #[arg(long, value_parser = parse_size, default_value = "512M")]
        member_size: u64,
        /// The in-place baseline's chunk (stripe unit).
        #[arg(long, value_parser = parse_size, default_value = "64K")]
        chunk: u64,
        #[arg(long, default_value_t = 32)]
        queue_depth: usize,
        /// Seconds of each measured run.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Alternating rounds of each side.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// SALSA's layout (raid5; the others show what redundancy costs on the same files).
        #[arg(long, default_value = "raid5", value_parser = parse_array)]
        salsa_array: ArrayKind,
        /// SALSA's stripe unit (default: the layout's).
        #[arg(long, value_parser = parse_size)]
        salsa_stripe_unit: Option<u64>,
        /// Run only these parts: randwrite_4k, seqwrite_1m, flush_4k, ssd_models, ssd_real_time,
        /// reads_rebuild, raid1_reads (RAID-1 random reads on disk models against one disk)
        /// (comma-separated).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// SALSA paces its writers while the GC is behind (`salsa serve --pace-writes`). Its
        /// random writes are then kept in flight by one thread that acknowledges each at its
        /// paced time, as the NBD server does.
        #[arg(long)]
        pace_writes: bool,
        /// With --pace-writes: one thread per queue slot instead, each sleeping for its
        /// write's turn (how the paced figures before 2026-11-28 were measured).
        #[arg(long, requires = "pace_writes")]
        paced_threads: bool,
        /// The share of the pool's capacity SALSA's volume takes, in percent; the writes of
        /// both sides go to as many bytes (100: the whole volume a pool of 20% spare offers;
        /// less: a working set smaller than the array, as in the SALSA paper's RAID-5 study).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
        volume_percent: u32,
    },
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
        /// SALSA paces its writers while the GC is behind (`salsa serve --pace-writes`).
        #[arg(long)]
        pace_writes: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum DeviceCommand {
    /// Mark member MEMBER (its path or slot number) failed, as a dying disk would be; a
    /// redundant pool keeps serving without it. Through the running server when one answers.
    Fail {
        #[command(flatten)]
        target: ServerOrDevices,
        member: String,
    },
    /// Replace member OLD (its path or slot number) with NEW and rebuild it from the others,
    /// only the segments that hold data. A healthy OLD keeps serving its slot until the
    /// rebuild ends (copied onto NEW, the pool keeps its redundancy meanwhile). Through the
    /// running server's control socket when one answers (the pool keeps serving), else
    /// offline on --device.
    Replace {
        #[command(flatten)]
        target: ServerOrDevices,
        /// Most bytes per second written to the new member (e.g. 200M); default: no limit.
        #[arg(long, value_parser = parse_size)]
        rate: Option<u64>,
        /// Take a new device that holds data or another pool (refused otherwise, as by
        /// `salsa format`).
        #[arg(long)]
        force: bool,
        /// The member to replace: its device path as the pool knows it, or its slot number.
        old: String,
        /// The new device: PATH[:SIZE] (SIZE creates a missing file).
        new: DeviceSpec,
    },
    /// Give a RAID-5 pool a new parity buffer NEW (PATH[:SIZE]; a missing file is created at
    /// the size the layout needs), or none (`none`: flushes pad to whole rows). Offline: the
    /// pool closes cleanly first, so the old buffer keeps nothing it needs. Name the old one
    /// with --parity-buffer; without it, the old one is taken as lost, which every member
    /// being present makes safe (the parity of the rows it kept is re-derived from them).
    ParityBuffer {
        #[command(flatten)]
        target: ServerOrDevices,
        /// Take a NEW that holds data or another pool (refused otherwise).
        #[arg(long)]
        force: bool,
        /// The new parity buffer, PATH[:SIZE], or `none`.
        new: String,
    },
    /// Change the rate limit of the rebuild in progress, at once and for when it resumes after
    /// a restart. Through the running server when one answers, else offline on --device.
    RebuildRate {
        #[command(flatten)]
        target: ServerOrDevices,
        /// Most bytes per second written to the new member (e.g. 200M), or `none` (0 too)
        /// for no limit.
        #[arg(value_parser = parse_rate)]
        rate: Rate,
    },
}

/// `salsa device ...`: each goes through the running server when one answers, else opens the
/// pool on its devices.
fn device(command: &DeviceCommand) -> Result<(), String> {
    let (DeviceCommand::Fail { target, .. }
    | DeviceCommand::Replace { target, .. }
    | DeviceCommand::ParityBuffer { target, .. }
    | DeviceCommand::RebuildRate { target, .. }) = command;
    let (devices, parity_buffer, control) = (&target.devices, target.parity_buffer.as_ref(), target.control.as_deref());
    match command {
        DeviceCommand::Fail { member, .. } => commands::device::fail(devices, parity_buffer, control, member),
        DeviceCommand::Replace { rate, force, old, new, .. } => {
            let opts = salsa_core::RebuildOptions {
                rate_bytes_per_sec: *rate,
                overwrite: *force,
            };
            commands::device::replace(devices, parity_buffer, control, old, new, opts)
        }
        DeviceCommand::RebuildRate { rate, .. } => commands::device::set_rebuild_rate(devices, parity_buffer, control, rate.0),
        DeviceCommand::ParityBuffer { force, new, .. } => {
            let new = match new.as_str() {
                "none" => None,
                spec => Some(spec.parse::<DeviceSpec>()?),
            };
            commands::device::set_parity_buffer(devices, parity_buffer, control, new.as_ref(), *force)
        }
    }
}

/// A rate limit on the command line: bytes a second, or none.
#[derive(Clone, Copy, Debug)]
struct Rate(Option<u64>);

fn parse_rate(s: &str) -> Result<Rate, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Rate(None));
    }
    parse_size(s).map(|r| Rate((r > 0).then_some(r)))
}

/// Prints a benchmark's report as pretty JSON on stdout.
fn print_report(report: serde_json::Value) -> Result<(), String> {
    println!("{}", serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?);
    Ok(())
}

/// `--listen`: an address, or a host name resolved to its first address.
fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = s.parse() {
        return Ok(addr);
    }
    let hint = "give HOST:PORT, e.g. 127.0.0.1:10809, [::1]:10809 or localhost:10809";
    let mut addrs = s.to_socket_addrs().map_err(|e| format!("{e}; {hint}"))?;
    addrs.next().ok_or_else(|| format!("{s} names no address; {hint}"))
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a terminal: a log redirected to a file or a journal stays plain text.
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// A rebuild's rate limit as `salsa info`, `salsa stats` and `salsa device rebuild-rate` say it.
fn rate_limit_text(rate_bytes_per_sec: Option<u64>) -> String {
    match rate_bytes_per_sec {
        Some(rate) => format!("at most {}/s", human(rate)),
        None => "no rate limit".into(),
    }
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

/// `--tls off|on|require`.
fn parse_tls_mode(s: &str) -> Result<salsa_nbd::proto::TlsMode, String> {
    use salsa_nbd::proto::TlsMode;
    match s {
        "off" => Ok(TlsMode::Off),
        "on" => Ok(TlsMode::On),
        "require" => Ok(TlsMode::Require),
        _ => Err(format!("{s:?}: want off, on or require")),
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

impl Command {
    /// The default pool for the commands that look at or change one and were given no device.
    fn default_devices(&mut self) -> Result<(), String> {
        match self {
            Command::Info { devices } | Command::Check { devices, .. } => devices.or_default(),
            Command::Volume { command } => command.devices_mut().or_default(),
            _ => Ok(()),
        }
    }
}

/// `salsa check`, then with `scrub` the scrub (also after check found damage: repairing it is
/// what it is for); whether the pool is clean. Damage a member holds but the redundancy covers
/// counts as fixed only when the scrub rewrote it. A served pool is scrubbed through its
/// server; the offline check needs it closed.
fn check_and_scrub(devices: &Devices, scrub: bool, repair: bool) -> Result<bool, String> {
    let served = control::running_server(&devices.devices, None).is_some();
    match (served, scrub) {
        (true, true) => scrub_pool(devices, repair),
        (true, false) => Err(format!(
            "the pool is being served: `salsa check` reads it offline, so stop the server first; `salsa check --scrub --device {}` scrubs it while it serves",
            devices.devices[0].path.display()
        )),
        (false, _) => check(devices).and_then(|c| {
            let scrub_clean = !scrub || scrub_pool(devices, repair)?;
            Ok(c.problems == 0 && scrub_clean && (c.repairable_bytes == 0 || (scrub && repair)))
        }),
    }
}

/// `salsa policies`: the built-in placement and victim policies with what each does.
fn print_policies() {
    let (victims, placements) = salsa_core::Registry::builtin().describe();
    // One column for the names of both lists, as wide as the longest.
    let width = placements.iter().chain(&victims).map(|(n, _)| n.len()).max().unwrap_or(0);
    println!("placement policies (--placement):");
    for (n, a) in placements {
        println!("  {n:<width$}  {a}");
    }
    println!("victim policies (--victim):");
    for (n, a) in victims {
        println!("  {n:<width$}  {a}");
    }
}

/// A controller's name as `--controller` takes it: one `ControllerKind` knows (so a new kind
/// needs no list here).
fn parse_controller_name(name: &str) -> Result<String, String> {
    match ControllerKind::from_name(name) {
        Some(kind) => Ok(kind.name().to_string()),
        None => Err(format!(
            "no controller {name:?}: the controllers are {}",
            ControllerKind::ALL.map(|k| k.name()).join(", ")
        )),
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    init_logging(cli.verbose);
    if let Err(e) = cli.command.default_devices() {
        eprintln!("salsa: {e}");
        return ExitCode::from(2);
    }
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
            parity_buffer,
            read_cache,
            write_buffer,
            write_buffer_expire_ms,
            pace_writes,
            metrics,
            on_event,
            hot_spares,
            raw,
            in_place_raid5,
            no_discard,
            gc_burst,
            tls,
            tls_certificates,
            tls_psk,
            tls_verify_peer,
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
                parity_buffer: parity_buffer.clone(),
                read_cache_bytes: *read_cache,
                write_buffer_bytes: *write_buffer,
                write_buffer_expire: std::time::Duration::from_millis(*write_buffer_expire_ms),
                pace_writes: *pace_writes,
                metrics: *metrics,
                on_event: on_event.clone(),
                hot_spares: hot_spares.clone(),
                raw: *raw,
                in_place_raid5_chunk: *in_place_raid5,
                discard: !*no_discard,
                gc_burst_bytes: *gc_burst,
                tls: *tls,
                tls_credentials: match (tls_certificates, tls_psk) {
                    (Some(dir), _) => Some(salsa_nbd::tls::Credentials::Certificates {
                        dir: dir.clone(),
                        verify_peer: *tls_verify_peer,
                    }),
                    (None, Some(file)) => Some(salsa_nbd::tls::Credentials::Psk(file.clone())),
                    (None, None) => None,
                },
            },
            format,
        ),
        Command::Stats { control, device, json } => stats(control.clone(), device.as_ref(), *json),
        Command::Share {
            target: ServerOrDevices {
                devices,
                parity_buffer,
                control,
            },
            volume,
            ranges,
        } => commands::share::share(devices, parity_buffer.as_ref(), control.as_deref(), volume, ranges),
        Command::Format {
            devices,
            format,
            force,
            no_default_volume,
        } => format_pool(devices, format, *force, !no_default_volume),
        Command::Info { devices } => info(devices),
        Command::Check { devices, scrub, repair } => match check_and_scrub(devices, *scrub, *repair) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Volume { command } => volume(command),
        Command::Device { command } => device(command),
        Command::BenchMapMemory { volume_size, seed } => bench::maps::run(*volume_size, *seed).and_then(print_report),
        Command::BenchShare {
            device,
            batch_pages,
            batches,
            file_size,
            updated,
            rounds,
            seed,
        } => device
            .parse()
            .and_then(|spec| {
                bench::share::run(&bench::share::Params {
                    device: spec,
                    device_text: device.clone(),
                    batch_pages: *batch_pages,
                    batches: *batches,
                    file_bytes: *file_size,
                    updated: *updated,
                    rounds: *rounds,
                    seed: *seed,
                })
            })
            .and_then(print_report),
        Command::BenchAmf {
            device,
            segment_size,
            fill,
            measure,
            rounds,
            seed,
        } => device
            .parse()
            .and_then(|spec| {
                bench::amf::run(&bench::amf::Params {
                    device: spec,
                    device_text: device.clone(),
                    segment_bytes: *segment_size,
                    fill: *fill,
                    measure_volumes: *measure,
                    rounds: *rounds,
                    seed: *seed,
                })
            })
            .and_then(print_report),
        Command::BenchRaid {
            dir,
            members,
            member_size,
            chunk,
            queue_depth,
            seconds,
            rounds,
            only,
            salsa_array,
            salsa_stripe_unit,
            pace_writes,
            paced_threads,
            volume_percent,
        } => bench::raid::run(&bench::raid::RaidBenchParams {
            pace_writes: *pace_writes,
            paced_threads: *paced_threads,
            volume_fraction: *volume_percent as f64 / 100.0,
            salsa_stripe_unit: salsa_stripe_unit.map(|u| u.min(u32::MAX as u64) as u32),
            only: only.clone(),
            salsa_array: *salsa_array,
            dir: dir.clone(),
            members: *members,
            member_bytes: *member_size,
            chunk_bytes: *chunk,
            queue_depth: *queue_depth,
            seconds: *seconds,
            rounds: *rounds,
        })
        .map(|v| println!("{v}")),
        Command::Policies => {
            print_policies();
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
            pace_writes,
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
                pace_writes: *pace_writes,
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

const DEFAULT_DEVICE: &str = "salsa-data/pool.img";
