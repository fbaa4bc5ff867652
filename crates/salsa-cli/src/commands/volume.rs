//! `salsa volume`: create, list, change, grow and delete a pool's volumes, offline (the
//! command opens the pool) or on a pool being served (the command is sent whole to the
//! server's control socket as `volume <JSON>`, and the server carries it out with the same
//! [`apply`] and answers `ok <JSON string to print>`). A new volume is an export for the next
//! client at once; a grown one shows its new size to clients that connect after; a volume is
//! deleted only when no client has its export open.

use crate::*;
use serde::{Deserialize, Serialize};

#[derive(Subcommand, Serialize, Deserialize)]
pub(crate) enum VolumeCommand {
    /// Create a volume (its size may exceed the free space: thin provisioning).
    Create {
        #[command(flatten)]
        #[serde(skip)]
        devices: Devices,
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
        /// The controller that maps the volume: `lsa` (a page map), `dual` (a dense map of
        /// large pages and a bounded sparse map of 4 KiB pages for small writes) or `hybrid` (a
        /// page map on the pool's disks, hot page groups copied to its flash; the pool needs
        /// both, declared with PATH@hdd / PATH@flash at format) or `amf` (append-only
        /// segments: each written from its start in order, never overwritten until trimmed
        /// whole; a map of runs instead of pages) or `extent` (a page map kept as runs of
        /// pages written together: memory in proportion to the runs, never more than lsa's).
        #[arg(long, default_value = "lsa", value_parser = parse_controller_name)]
        controller: String,
        /// The unit of mapping (dual: its large pages). Default 4K for lsa, 64K for dual.
        #[arg(long, value_parser = parse_size)]
        page_size: Option<u64>,
        /// Placement policy (default: the pool's; `salsa policies` lists them).
        #[arg(long)]
        placement: Option<String>,
        /// Victim policy ranking the volume's segments for the GC (default: the pool's).
        #[arg(long)]
        victim: Option<String>,
        /// dual: most 4 KiB pages its sparse map holds (default: one in 2048 of the volume's,
        /// at least 131072, at most a sixteenth).
        #[arg(long)]
        sparse_pages: Option<u64>,
        #[command(flatten)]
        hybrid: HybridArgs,
        /// lsa, dual: the devices its data goes to: any (flash first), fast (flash, NVM) or
        /// slow (disks), of those the pool has (types are declared at format, PATH@hdd).
        #[arg(long, default_value = "any", value_parser = ["any", "fast", "slow"])]
        storage: String,
        /// amf: the segment size, a power of two from 64K to 1G dividing the volume size
        /// (default: the pool's segment size).
        #[arg(long, value_parser = parse_size)]
        segment: Option<u64>,
        /// amf: user streams (1 to 8, default 1): up to that many segments written at once
        /// never share a log segment, so a trimmed one frees its log segments whole; more than
        /// one suits zoned drives, while a flash drive's own GC pays for the interleaving.
        #[arg(long)]
        segment_streams: Option<u8>,
        /// lsa: compress each page as it is written, stored in the fewest whole grains that
        /// hold it (an incompressible page as it is): off, lz4, zstd, zstd:LEVEL (1 to 19).
        /// Pages must be larger than the pool's grain; the page size defaults to 16K then.
        #[arg(long, default_value = "off", value_parser = parse_compression)]
        compression: String,
    },
    /// Change a volume's placement or victim policy, or its compression; new writes follow
    /// it. Works offline and, through its control socket, on a pool being served.
    Set {
        #[command(flatten)]
        #[serde(skip)]
        devices: Devices,
        name: String,
        /// New placement policy.
        #[arg(long)]
        placement: Option<String>,
        /// New victim policy (`pool`: the pool's).
        #[arg(long)]
        victim: Option<String>,
        /// New compression of an LSA volume (off, lz4, zstd, zstd:LEVEL); pages written
        /// before stay as they are stored until rewritten.
        #[arg(long, value_parser = parse_compression)]
        compression: Option<String>,
    },
    /// List volumes: a table with human sizes, or JSON with byte counts.
    List {
        #[command(flatten)]
        #[serde(skip)]
        devices: Devices,
        /// One JSON array, sizes in bytes.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume; its space returns to the pool.
    Delete {
        #[command(flatten)]
        #[serde(skip)]
        devices: Devices,
        name: String,
    },
    /// Grow a volume.
    Resize {
        #[command(flatten)]
        #[serde(skip)]
        devices: Devices,
        name: String,
        #[arg(value_parser = parse_size)]
        size: u64,
    },
}

/// The tiering options of a hybrid volume.
#[derive(clap::Args, Clone, Debug, Default, Serialize, Deserialize)]
pub struct HybridArgs {
    /// hybrid: pages per temperature group, the unit copied to the fast tier (default 256).
    #[arg(long)]
    group_pages: Option<u64>,
    /// hybrid: most fast-tier space the volume's copies use (default: what the fast devices
    /// can lend).
    #[arg(long, value_parser = parse_size)]
    tier_size: Option<u64>,
    /// hybrid: promotion bandwidth limit per second (default 32M).
    #[arg(long, value_parser = parse_size)]
    promote_rate: Option<u64>,
    /// hybrid: milliseconds in which a group's temperature halves (default 10000).
    #[arg(long)]
    half_life_ms: Option<u64>,
}

impl HybridArgs {
    pub(crate) fn spec(&self) -> salsa_core::HybridSpec {
        salsa_core::HybridSpec {
            group_pages: self.group_pages,
            tier_bytes: self.tier_size,
            promote_bytes_per_s: self.promote_rate,
            half_life_ms: self.half_life_ms,
        }
    }
}

impl VolumeCommand {
    /// Refuses a command that asks for nothing, before any pool is opened or asked for it.
    fn check(&self) -> Result<(), String> {
        match self {
            VolumeCommand::Set {
                placement: None,
                victim: None,
                compression: None,
                ..
            } => Err("give --placement, --victim and/or --compression".into()),
            _ => Ok(()),
        }
    }

    fn devices(&self) -> &Devices {
        match self {
            VolumeCommand::Create { devices, .. }
            | VolumeCommand::Set { devices, .. }
            | VolumeCommand::List { devices, .. }
            | VolumeCommand::Delete { devices, .. }
            | VolumeCommand::Resize { devices, .. } => devices,
        }
    }

    pub(crate) fn devices_mut(&mut self) -> &mut Devices {
        match self {
            VolumeCommand::Create { devices, .. }
            | VolumeCommand::Set { devices, .. }
            | VolumeCommand::List { devices, .. }
            | VolumeCommand::Delete { devices, .. }
            | VolumeCommand::Resize { devices, .. } => devices,
        }
    }
}

/// `salsa volume ...`: through the server that serves the pool when one answers, else offline.
pub(crate) fn volume(cmd: &VolumeCommand) -> Result<(), String> {
    cmd.check()?;
    let devices = cmd.devices();
    if let Some(control) = crate::control::running_server(&devices.devices, None) {
        let request = serde_json::to_string(cmd).map_err(|e| e.to_string())?;
        let answer = crate::control::request(&control, &format!("volume {request}"))?;
        let text: String = answer
            .strip_prefix("ok ")
            .and_then(|json| serde_json::from_str(json).ok())
            .ok_or_else(|| format!("the server answered what this salsa does not understand: {answer}"))?;
        print!("{text}");
        return Ok(());
    }
    let read_only = matches!(cmd, VolumeCommand::List { .. });
    let pool = devices.open_pool(if read_only { ro_options() } else { rw_options() })?;
    // Closed cleanly whether the command succeeded or not (a refused create leaves the pool
    // as clean as it found it).
    let result = apply(&pool, cmd, None);
    let closed = pool.close().map_err(|e| e.to_string());
    print!("{}", result?);
    closed
}

/// The control socket's `volume <JSON>` request: carries out the command on the served pool.
pub(crate) fn answer(pool: &Pool, exports: &salsa_nbd::server::Exports, request: &str) -> String {
    let result = serde_json::from_str::<VolumeCommand>(request)
        .map_err(|e| format!("bad volume request: {e}"))
        .and_then(|cmd| apply(pool, &cmd, Some(exports)));
    match result {
        Ok(text) => format!("ok {}", serde_json::Value::String(text)),
        Err(e) => format!("error {e}"),
    }
}

/// Carries out `cmd` on `pool` and returns what to print. `exports`: the server's, when the
/// pool is being served (a volume whose export a client has open is not deleted).
fn apply(pool: &Pool, cmd: &VolumeCommand, exports: Option<&salsa_nbd::server::Exports>) -> Result<String, String> {
    use std::fmt::Write;
    cmd.check()?;
    let mut out = String::new();
    match cmd {
        VolumeCommand::Create {
            name,
            size,
            controller,
            page_size,
            placement,
            victim,
            sparse_pages,
            hybrid,
            storage,
            segment,
            segment_streams,
            compression,
            ..
        } => {
            let compression = salsa_core::Compression::parse(compression)?;
            // A page of one grain cannot shrink: a compressing volume's pages default larger.
            let page_size = page_size.or((compression.is_on() && controller == "lsa").then_some(16 << 10));
            let spec = VolumeSpec {
                compression,
                segment_bytes: *segment,
                segment_streams: *segment_streams,
                storage: salsa_core::StorageClass::from_name(storage).unwrap_or_default(),
                placement: placement.clone(),
                victim: victim.clone().filter(|v| v != "pool"),
                sparse_pages: *sparse_pages,
                hybrid: hybrid.spec(),
                ..volume_spec(controller, page_size)?
            };
            pool.create_volume_spec(name, *size, &spec).map_err(|e| e.to_string())?;
            let _ = writeln!(
                out,
                "created volume {name}: {}, {} controller, {} pages{}",
                human(*size),
                spec.controller.name(),
                human(spec.page_bytes as u64),
                if compression.is_on() {
                    format!(", {} compression", compression.name())
                } else {
                    String::new()
                }
            );
        }
        VolumeCommand::Set {
            name,
            placement,
            victim,
            compression,
            ..
        } => {
            let compression = compression.as_deref().map(salsa_core::Compression::parse).transpose()?;
            if placement.is_some() || victim.is_some() {
                // `pool` (or nothing) stands for the pool's victim policy, recorded as empty.
                let victim = victim.as_deref().map(|v| if v == "pool" { "" } else { v });
                pool.set_volume_policies(name, placement.as_deref(), victim)
                    .map_err(|e| e.to_string())?;
                let _ = writeln!(out, "volume {name}: policies changed; new writes follow them");
            }
            if let Some(c) = compression {
                pool.set_volume_compression(name, c).map_err(|e| e.to_string())?;
                let _ = writeln!(out, "volume {name}: compression {}; new writes follow it", c.name());
            }
        }
        VolumeCommand::List { json, .. } => {
            let vols = pool.stats().volumes;
            if *json {
                let list: Vec<serde_json::Value> = vols.iter().map(super::stats::volume_json).collect();
                let _ = writeln!(out, "{}", serde_json::Value::Array(list));
                return Ok(out);
            }
            let _ = writeln!(
                out,
                "{:<24} {:<10} {:>12} {:>8} {:>12} {:>12} {:>10}  {:<7} {:<11} {:<18} VICTIM",
                "NAME", "CONTROLLER", "SIZE", "PAGE", "MAPPED", "STORED", "MAP", "STORAGE", "COMPRESSION", "PLACEMENT"
            );
            for v in vols {
                let _ = writeln!(
                    out,
                    "{:<24} {:<10} {:>12} {:>8} {:>12} {:>12} {:>10}  {:<7} {:<11} {:<18} {}",
                    v.name,
                    v.controller,
                    human(v.size_bytes),
                    human(v.page_bytes as u64),
                    human(v.mapped_bytes),
                    human(v.stored_bytes),
                    human(v.map_memory_bytes),
                    v.storage,
                    v.compression,
                    v.placement,
                    v.victim
                );
            }
        }
        VolumeCommand::Delete { name, .. } => {
            let delete = || pool.delete_volume(name).map_err(|e| e.to_string());
            match exports {
                None => delete()?,
                Some(exports) => exports
                    .unless_open(name, delete)
                    .map_err(|clients| format!("volume {name} is open by {clients} client(s) of the server; disconnect them first"))??,
            }
            let _ = writeln!(out, "deleted volume {name}");
        }
        VolumeCommand::Resize { name, size, .. } => {
            pool.grow_volume(name, *size).map_err(|e| e.to_string())?;
            let _ = writeln!(out, "volume {name} is now {}", human(*size));
        }
    }
    Ok(out)
}
