//! `salsa serve`: open (or create) the pool, serve its volumes over NBD, answer the control
//! socket, and shut down cleanly on SIGINT/SIGTERM.

use crate::control::{control_thread, ControlAnswer};
use crate::*;
use salsa_core::spec::control_path_for;

pub(crate) struct ServeArgs {
    pub(crate) tcp: Option<std::net::SocketAddr>,
    pub(crate) unix: Option<std::path::PathBuf>,
    pub(crate) read_only: bool,
    pub(crate) threads_per_connection: usize,
    pub(crate) control: Option<std::path::PathBuf>,
    pub(crate) page_cache: bool,
    pub(crate) parity_buffer: Option<DeviceSpec>,
    /// Bytes of DRAM for pages read (`None`: an eighth of the machine's memory, 64 MiB to 4 GiB).
    pub(crate) read_cache_bytes: Option<u64>,
    /// Bytes of DRAM for pages written and not yet flushed (`None`: as the read cache's).
    pub(crate) write_buffer_bytes: Option<u64>,
    pub(crate) write_buffer_expire: std::time::Duration,
    pub(crate) pace_writes: bool,
    /// Serve Prometheus metrics at `http://ADDR/metrics`.
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// A command run when a member changes state (see `commands/events.rs`).
    pub(crate) on_event: Option<String>,
    pub(crate) hot_spares: Vec<DeviceSpec>,
    /// Serve the device raw, without a pool (a baseline).
    pub(crate) raw: bool,
    /// With `raw`: serve the devices (three or more) as one in-place RAID-5 of this chunk,
    /// the MD-like baseline of `bench-raid` (read-modify-write of data and parity).
    pub(crate) in_place_raid5_chunk: Option<u64>,
    /// Discard freed segments on the devices.
    pub(crate) discard: bool,
    /// The GC's write burst (`None`: the devices' preferred write size).
    pub(crate) gc_burst_bytes: Option<u64>,
    /// TLS: the mode (`None`: `require` when credentials are given, else off) and credentials.
    pub(crate) tls: Option<salsa_nbd::proto::TlsMode>,
    pub(crate) tls_credentials: Option<salsa_nbd::tls::Credentials>,
}

impl ServeArgs {
    /// What the NBD server is told; bad TLS credentials are refused here, before anything is
    /// opened.
    fn server_config(&self) -> Result<salsa_nbd::server::ServerConfig, String> {
        use salsa_nbd::proto::TlsMode;
        let mode = self.tls.unwrap_or(if self.tls_credentials.is_some() {
            TlsMode::Require
        } else {
            TlsMode::Off
        });
        let tls_server = match (&self.tls_credentials, mode) {
            (_, TlsMode::Off) => None,
            (None, _) => return Err("--tls on|require needs --tls-certificates DIR or --tls-psk FILE".into()),
            (Some(c), _) => Some(salsa_nbd::tls::TlsServer::new(c)?),
        };
        Ok(salsa_nbd::server::ServerConfig {
            tcp: self.tcp,
            unix: self.unix.clone(),
            read_only: self.read_only,
            threads_per_connection: self.threads_per_connection,
            tls: mode,
            tls_server,
        })
    }
}

/// A flag that SIGINT and SIGTERM raise (the server's stop).
fn stop_on_signals() -> Result<Arc<std::sync::atomic::AtomicBool>, String> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    Ok(stop)
}

/// Opens the pool on `specs`, or creates it when every device is blank; refuses anything else.
pub(crate) fn open_or_create(specs: &[DeviceSpec], args: &ServeArgs, format: &FormatArgs) -> Result<Pool, String> {
    let (parity_buffer, read_only) = (args.parity_buffer.as_ref(), args.read_only);
    salsa_core::spec::check_distinct(specs.iter().chain(parity_buffer).chain(&args.hot_spares))?;
    super::spares::check_spares(&args.hot_spares)?;
    for s in specs {
        if let Some(dir) = s
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && s.size_bytes.is_some() && s.model.is_none())
        {
            if !dir.is_dir() {
                return Err(format!(
                    "directory {} does not exist; create it first (only the default salsa-data/ is created)",
                    dir.display()
                ));
            }
        }
    }
    let devs = open_present(specs, |d| d.open_with(read_only, args.page_cache))?;
    let (mut members, mut holds_data) = (0, None);
    for d in &devs {
        match salsa_core::pool::read_superblock(d.as_ref()) {
            Ok(_) => members += 1,
            Err(salsa_core::Error::NotAPool { .. }) => {
                if holds_data.is_none() && !salsa_core::pool::device_is_blank(d.as_ref()).map_err(|e| e.to_string())? {
                    holds_data = Some(d.name().to_string());
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    // With members of a pool among them, the pool's open says what the others are (a member
    // that lost its superblock is not a device to format).
    if let (0, Some(name)) = (members, holds_data) {
        let list: Vec<String> = specs.iter().map(|s| format!("--device {}", s.path.display())).collect();
        return Err(format!(
            "{name} holds data that is not a SALSA pool; nothing was written. To overwrite it: salsa format --force {}",
            list.join(" ")
        ));
    }
    let opts = OpenOptions {
        read_only,
        read_cache_bytes: args
            .read_cache_bytes
            .unwrap_or_else(salsa_core::pool::default_server_read_cache_bytes),
        discard_freed_segments: args.discard,
        gc_burst_bytes: args.gc_burst_bytes,
        write_buffer_bytes: args
            .write_buffer_bytes
            .unwrap_or_else(salsa_core::pool::default_server_write_buffer_bytes),
        write_buffer_expire: args.write_buffer_expire,
        pace_user_writes: args.pace_writes,
        ..OpenOptions::default()
    };
    if members > 0 {
        eprintln!("salsa: opening pool on {} device(s)", devs.len());
        let opts = with_parity_buffer(opts, parity_buffer, None)?;
        return Pool::open_with_progress(devs, &opts, &progress_bar("recovery scan")).map_err(|e| e.to_string());
    }
    if read_only {
        return Err("the devices hold no pool and --read-only forbids creating one".into());
    }
    let cfg = format.pool_config()?;
    let opts = with_parity_buffer(opts, parity_buffer, Some((&cfg, devs.len())))?;
    let pool = Pool::create(devs, &cfg, &opts).map_err(|e| e.to_string())?;
    let size = format.create_default_volume(&pool)?;
    eprintln!(
        "salsa: created a new pool {:032x} with volume default ({})",
        pool.pool_id(),
        human(size)
    );
    Ok(pool)
}

/// `salsa serve --raw`: the one device given, served as it is (a baseline), with a control
/// socket that answers `stats` with the device's counters.
fn serve_raw(specs: &[DeviceSpec], args: &ServeArgs) -> Result<(), String> {
    let spec = match (specs, args.in_place_raid5_chunk) {
        ([spec], None) => spec,
        (_, None) => return Err("--raw serves exactly one device (or several with --in-place-raid5)".into()),
        (specs, Some(_)) if specs.len() < 3 => return Err("--in-place-raid5 needs at least three devices (give --device for each)".into()),
        (specs, Some(_)) => &specs[0],
    };
    if args.parity_buffer.is_some() || args.metrics.is_some() || args.on_event.is_some() {
        return Err("--raw serves a device without a pool: --parity-buffer, --metrics and --on-event do not apply".into());
    }
    let mut members = Vec::new();
    for spec in specs {
        let dev = spec.open_with(args.read_only, args.page_cache)?;
        if salsa_core::pool::read_superblock(dev.as_ref()).is_ok() {
            return Err(format!(
                "{} holds a SALSA pool; serving it raw would let clients overwrite it. Serve it without --raw",
                dev.name()
            ));
        }
        members.push(dev);
    }
    let dev: Arc<dyn salsa_core::Device> = match args.in_place_raid5_chunk {
        Some(chunk) => {
            if chunk < 4096 || !chunk.is_power_of_two() {
                return Err(format!("--in-place-raid5 chunk {chunk}: a power of two of at least 4 KiB, please"));
            }
            Arc::new(crate::bench::raid::InPlaceRaid5::new(members, chunk))
        }
        None => members.remove(0),
    };
    let cfg = args.server_config()?;
    let export = salsa_core::frontend::RawVolume::new("raw", dev.clone());
    let listening = salsa_nbd::server::Listening::bind_exports(salsa_nbd::server::Exports::raw(export, args.read_only), &cfg)?;
    let stop = stop_on_signals()?;
    let control_path = args.control.clone().unwrap_or_else(|| control_path_for(&spec.path));
    let control = salsa_nbd::server::bind_unix(&control_path)?;
    let control_thread = {
        let (dev, stop) = (dev.clone(), stop.clone());
        let answer: ControlAnswer = Arc::new(move |mut s| {
            use std::io::Write;
            let counters: Vec<serde_json::Value> = dev
                .counters()
                .into_iter()
                .map(|(counter, value)| serde_json::json!({"device": dev.name(), "counter": counter, "value": value}))
                .collect();
            let _ = writeln!(s, "{}", serde_json::json!({ "raw": dev.name(), "device_counters": counters }));
        });
        std::thread::spawn(move || control_thread(control, answer, stop))
    };
    eprintln!("salsa: serving {} raw as export `raw`", dev.name());
    let stopped = stop.clone();
    listening.run(stop);
    stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = control_thread.join();
    let _ = std::fs::remove_file(&control_path);
    dev.sync().map_err(|e| format!("{}: sync: {e}", dev.name()))?;
    eprintln!("salsa: stopped cleanly");
    Ok(())
}

/// Where clients reach the server, as NBD URIs.
fn listening_addresses(listening: &salsa_nbd::server::Listening, args: &ServeArgs, cfg: &salsa_nbd::server::ServerConfig) -> String {
    let mut wheres = Vec::new();
    let scheme = match cfg.tls {
        salsa_nbd::proto::TlsMode::Require => "nbds",
        _ => "nbd",
    };
    if let Some(a) = listening.tcp_addr() {
        wheres.push(format!("{scheme}://{a}"));
    }
    if let Some(u) = &args.unix {
        wheres.push(format!("{scheme}+unix:///?socket={}", u.display()));
    }
    if cfg.tls == salsa_nbd::proto::TlsMode::On {
        wheres.push("(TLS offered: nbds:// too)".into());
    }
    wheres.join(" and ")
}

pub(crate) fn serve(specs: &[DeviceSpec], args: ServeArgs, format: &FormatArgs) -> Result<(), String> {
    let default = [DeviceSpec {
        path: "salsa-data/pool.img".into(),
        size_bytes: Some(1 << 30),
        model: None,
        declared: None,
    }];
    let specs = if specs.is_empty() {
        std::fs::create_dir_all("salsa-data").map_err(|e| format!("salsa-data: {e}"))?;
        &default[..]
    } else {
        specs
    };
    if args.tcp.is_none() && args.unix.is_none() {
        return Err("nothing to listen on: give a TCP address (--listen) or a Unix socket (--unix); nothing was created".into());
    }
    // A port already in use is found before anything is created.
    if let Some(addr) = args.tcp {
        std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}; nothing was created"))?;
    }
    if args.raw {
        return serve_raw(specs, &args);
    }
    let cfg = args.server_config().map_err(|e| format!("{e}; nothing was created"))?;
    let metrics = match args.metrics {
        Some(addr) => {
            Some(std::net::TcpListener::bind(addr).map_err(|e| format!("cannot serve metrics on {addr}: {e}; nothing was created"))?)
        }
        None => None,
    };
    // Files this start creates are removed again if it fails.
    let created = super::files_to_create::FilesToCreate::of(specs, args.parity_buffer.as_ref());
    let pool = Arc::new(open_or_create(specs, &args, format).map_err(|e| created.remove(e))?);
    if !args.hot_spares.is_empty() {
        if let Err(e) = super::spares::check_layout(&pool) {
            if let Ok(pool) = Arc::try_unwrap(pool) {
                let _ = pool.close();
            }
            return Err(created.remove(e));
        }
    }
    let listening = match salsa_nbd::server::Listening::bind(pool.clone(), &cfg) {
        Ok(l) => l,
        Err(e) => {
            drop(pool);
            return Err(created.remove(e));
        }
    };
    let stop = stop_on_signals()?;
    eprintln!(
        "salsa: serving {} on {}",
        pool.volume_names().join(", "),
        listening_addresses(&listening, &args, &cfg)
    );
    let control_path = args.control.clone().unwrap_or_else(|| control_path_for(&specs[0].path));
    let control = salsa_nbd::server::bind_unix(&control_path)?;
    let control_thread = {
        let (pool, exports, stop) = (pool.clone(), listening.exports(), stop.clone());
        let answer: ControlAnswer = Arc::new(move |s| super::control_requests::answer(s, &pool, &exports));
        std::thread::spawn(move || control_thread(control, answer, stop))
    };
    let metrics_thread = metrics.map(|listener| {
        if let Ok(a) = listener.local_addr() {
            eprintln!("salsa: metrics on http://{a}/metrics");
        }
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || super::metrics::metrics_thread(listener, pool, stop))
    });
    let events_thread = args.on_event.clone().map(|command| {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || super::events::events_thread(pool, command, stop))
    });
    let spares_thread = (!args.hot_spares.is_empty()).then(|| {
        let (pool, stop, spares) = (pool.clone(), stop.clone(), args.hot_spares.clone());
        std::thread::spawn(move || super::spares::spares_thread(pool, spares, stop))
    });
    let stopped = stop.clone();
    listening.run(stop);
    // However the listeners ended, the helper threads end too.
    stopped.store(true, std::sync::atomic::Ordering::SeqCst);
    for h in metrics_thread.into_iter().chain(events_thread) {
        let _ = h.join();
    }
    // A rebuild in progress stops at its next segment (and resumes at the next start).
    pool.begin_shutdown();
    if let Some(h) = spares_thread {
        let _ = h.join();
    }
    let _ = control_thread.join();
    let _ = std::fs::remove_file(&control_path);
    eprintln!("salsa: stopping: writing the checkpoint");
    let pool = Arc::try_unwrap(pool).map_err(|_| "internal error: the pool is still in use after the server stopped".to_string())?;
    pool.close().map_err(|e| e.to_string())?;
    eprintln!("salsa: stopped cleanly");
    Ok(())
}
