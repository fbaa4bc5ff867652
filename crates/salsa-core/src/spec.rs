//! Parsing of device specs and human sizes (`512M`, `1G`, `4096`).
//!
//! A device spec is a file or block device, `PATH[:SIZE]`, or an emulated device:
//! - `zoned:size=4G,zone=256M,conv=4,type=smr|zns[,file=PATH]`: a host-managed zoned drive,
//!   its zone state kept with its data (in the file, which persists, or in memory);
//! - `hmsmr:...`: the same with the timing of a disk (so throughput can be modelled);
//! - `ssd:size=2G[,op=7,unit=16K,block=4M,channels=8,cache=1M,mapcache=32K|full,file=PATH,realtime=on,precondition=on|SIZE]`:
//!   a commodity SSD model (`realtime=on`: every request waits for the flash operations it
//!   causes, on the wall clock, so that applications see the drive's latencies;
//!   `precondition`: its whole capacity, or its first SIZE bytes, written once in order and
//!   once at random when it is opened, as the SALSA paper's section V-A prepares a drive);
//! - `dmsmr:size=4G[,band=32M,cache=8M,file=PATH,realtime=on]`: a drive-managed SMR model;
//! - `hdd:size=8G[,seek_us=12000,mbps=150,file=PATH,realtime=on]`: a disk with the timing of
//!   one actuator (every access that does not continue the last costs a seek);
//! - `realtime=on` on the disk models (and `hmsmr:`): the actuator serves requests on the wall
//!   clock, one at a time in arrival order, each returning when its accesses end.
//!
//! Any spec may end in `@TYPE` (`flash`/`ssd`, `hdd`/`disk`, `nvm`) to declare the device's
//! storage type, which `salsa format` records (a file cannot tell whether it is on a disk or
//! an SSD; the hybrid controller puts its data on the disks and hot copies on the flash).
//!
//! The models' translation state lives in memory (a restart finds a freshly formatted drive
//! holding the same data); a zoned drive's state persists in its file.

use crate::device::file::FileOpenOptions;
use crate::device::{
    Declared, DiskTiming, DriveManagedSmr, FileDevice, MemoryDevice, SmrParams, SsdModel, SsdParams, TimedDisk, ZonedEmulator,
    ZonedGeometry,
};
use crate::{Device, StorageType};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Kinds of emulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    Zoned,
    HostManagedSmr,
    Ssd,
    DriveManagedSmr,
    Disk,
}

/// An emulated device named on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub kind: ModelKind,
    pub params: BTreeMap<String, String>,
}

impl ModelSpec {
    fn parse(kind: ModelKind, args: &str) -> Result<ModelSpec, String> {
        let allowed: &[&str] = match kind {
            ModelKind::Zoned => &["size", "zone", "conv", "type", "file"],
            ModelKind::HostManagedSmr => &["size", "zone", "conv", "type", "file", "realtime"],
            ModelKind::Ssd => &[
                "size",
                "op",
                "unit",
                "block",
                "channels",
                "cache",
                "mapcache",
                "file",
                "read_us",
                "program_us",
                "erase_us",
                "realtime",
                "precondition",
            ],
            ModelKind::DriveManagedSmr => &["size", "band", "cache", "file", "realtime"],
            ModelKind::Disk => &["size", "seek_us", "mbps", "file", "realtime"],
        };
        let mut params = BTreeMap::new();
        for kv in args.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("device parameter {kv:?} is not KEY=VALUE"))?;
            if !allowed.contains(&k) {
                return Err(format!("unknown device parameter {k:?}; this device takes {}", allowed.join(", ")));
            }
            if params.insert(k.to_string(), v.to_string()).is_some() {
                return Err(format!("device parameter {k:?} given twice"));
            }
        }
        if !params.contains_key("size") && !params.contains_key("file") {
            return Err("an emulated device needs size=SIZE (and file=PATH to keep its data in a file)".into());
        }
        Ok(ModelSpec { kind, params })
    }

    fn size(&self, key: &str, default: u64) -> Result<u64, String> {
        self.params.get(key).map_or(Ok(default), |v| parse_size(v))
    }

    fn number(&self, key: &str, default: f64) -> Result<f64, String> {
        self.params.get(key).map_or(Ok(default), |v| {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("device parameter {key}={v:?} is not a non-negative number"))
        })
    }

    /// `realtime=on|off` (off when absent).
    fn real_time(&self) -> Result<bool, String> {
        match self.params.get("realtime").map(String::as_str) {
            None | Some("off") => Ok(false),
            Some("on") => Ok(true),
            Some(other) => Err(format!("device parameter realtime={other:?}: use on or off")),
        }
    }

    /// The backing store for `bytes` of data: the file (created at that size when missing) or
    /// memory.
    fn backing(&self, bytes: u64, read_only: bool) -> Result<Arc<dyn Device>, String> {
        match self.params.get("file") {
            Some(path) => {
                let spec = DeviceSpec {
                    path: path.into(),
                    size_bytes: Some(bytes),
                    model: None,
                    declared: None,
                };
                spec.open_with(read_only, true)
            }
            None => Ok(Arc::new(MemoryDevice::new("memory", bytes))),
        }
    }

    fn open(&self, read_only: bool) -> Result<Arc<dyn Device>, String> {
        let size = self.size("size", 0)?;
        match self.kind {
            ModelKind::Zoned | ModelKind::HostManagedSmr => {
                let zone_bytes = self.size("zone", 256 << 20)?;
                let conventional = self.number("conv", 4.0)? as u32;
                let storage_type = match self.params.get("type").map(String::as_str) {
                    None | Some("smr") => StorageType::SmrSequential,
                    Some("zns") => StorageType::Flash,
                    Some(other) => return Err(format!("zoned type {other:?}: use smr or zns")),
                };
                // Room for the zone state after the zones.
                let backing = self.backing(size + (1 << 20), read_only)?;
                let geo = ZonedGeometry {
                    zone_bytes,
                    conventional_zones: conventional,
                    storage_type,
                };
                let z: Arc<dyn Device> = Arc::new(ZonedEmulator::open_or_create(backing, geo).map_err(|e| e.to_string())?);
                Ok(if self.kind == ModelKind::HostManagedSmr {
                    let disk = TimedDisk::new(z, DiskTiming::default());
                    disk.set_real_time(self.real_time()?);
                    Arc::new(disk)
                } else {
                    z
                })
            }
            ModelKind::Ssd => {
                let mut p = SsdParams::commodity(size);
                p.over_provisioning_percent = self.number("op", p.over_provisioning_percent)?;
                p.unit_bytes = self.size("unit", p.unit_bytes)?;
                p.erase_block_bytes = self.size("block", p.erase_block_bytes)?;
                p.channels = self.number("channels", p.channels as f64)? as u32;
                p.write_cache_bytes = self.size("cache", p.write_cache_bytes)?;
                p.map_cache_bytes = match self.params.get("mapcache").map(String::as_str) {
                    Some("full") => None,
                    Some(v) => Some(parse_size(v)?),
                    None => Some(SsdParams::default_map_cache_bytes(size, p.unit_bytes)),
                };
                p.read_us = self.number("read_us", p.read_us as f64)? as u64;
                p.program_us = self.number("program_us", p.program_us as f64)? as u64;
                p.erase_us = self.number("erase_us", p.erase_us as f64)? as u64;
                let real_time = self.real_time()?;
                let precondition_bytes = match self.params.get("precondition").map(String::as_str) {
                    None | Some("off") => 0,
                    Some("on") => size,
                    Some(v) => parse_size(v).map_err(|e| format!("device parameter precondition: {e}"))?,
                };
                if precondition_bytes > size {
                    return Err(format!(
                        "device parameter precondition={precondition_bytes} is more than the size {size}"
                    ));
                }
                let model = SsdModel::new(self.backing(size, read_only)?, p).map_err(|e| e.to_string())?;
                if precondition_bytes > 0 {
                    model.precondition(precondition_bytes, 0x5a15a);
                }
                model.set_real_time(real_time);
                Ok(Arc::new(model))
            }
            ModelKind::DriveManagedSmr => {
                let mut p = SmrParams::drive_managed(size);
                p.band_bytes = self.size("band", p.band_bytes)?;
                p.media_cache_bytes = self.size("cache", p.media_cache_bytes)?;
                let drive = DriveManagedSmr::new(self.backing(size, read_only)?, p).map_err(|e| e.to_string())?;
                drive.set_real_time(self.real_time()?);
                Ok(Arc::new(drive))
            }
            ModelKind::Disk => {
                let d = DiskTiming::default();
                let timing = DiskTiming {
                    position_us: self.number("seek_us", d.position_us as f64)? as u64,
                    media_mb_per_s: self.number("mbps", d.media_mb_per_s)?,
                };
                if timing.media_mb_per_s <= 0.0 {
                    return Err("device parameter mbps must be more than 0".into());
                }
                // The disk's clock counts nanoseconds in a u64: a seek of at most a minute.
                if timing.position_us > 60_000_000 {
                    return Err("device parameter seek_us must be at most 60000000 (a minute)".into());
                }
                let disk = TimedDisk::new(self.backing(size, read_only)?, timing);
                disk.set_real_time(self.real_time()?);
                Ok(Declared::wrap(Arc::new(disk), StorageType::Hdd))
            }
        }
    }
}

/// Parses `4096`, `64K`, `512M`, `1G`, `2T` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let m: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

/// A device named on the command line.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// The file (for a model: the file its data is kept in; empty for memory).
    pub path: PathBuf,
    pub size_bytes: Option<u64>,
    /// An emulated device instead of the file itself.
    pub model: Option<ModelSpec>,
    /// The storage type declared with `@TYPE`.
    pub declared: Option<StorageType>,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some((spec, name)) = s.rsplit_once('@') {
            let t = StorageType::declarable(name)
                .ok_or_else(|| format!("unknown storage type {name:?} after '@' in {s:?}; use flash, hdd or nvm"))?;
            let mut d: DeviceSpec = spec.parse()?;
            d.declared = Some(t);
            return Ok(d);
        }
        let models = [
            ("zoned:", ModelKind::Zoned),
            ("hmsmr:", ModelKind::HostManagedSmr),
            ("ssd:", ModelKind::Ssd),
            ("dmsmr:", ModelKind::DriveManagedSmr),
            ("hdd:", ModelKind::Disk),
        ];
        for (prefix, kind) in models {
            if let Some(args) = s.strip_prefix(prefix) {
                let model = ModelSpec::parse(kind, args)?;
                return Ok(DeviceSpec {
                    path: model.params.get("file").map(PathBuf::from).unwrap_or_default(),
                    size_bytes: model.params.get("size").map(|v| parse_size(v)).transpose()?,
                    model: Some(model),
                    declared: None,
                });
            }
        }
        match s.rsplit_once(':') {
            Some((path, size)) if !path.is_empty() && size.chars().next().is_some_and(|c| c.is_ascii_digit()) => Ok(DeviceSpec {
                path: path.into(),
                size_bytes: Some(parse_size(size)?),
                model: None,
                declared: None,
            }),
            _ if s.is_empty() => Err("empty device path".into()),
            _ => Ok(DeviceSpec {
                path: s.into(),
                size_bytes: None,
                model: None,
                declared: None,
            }),
        }
    }
}

impl DeviceSpec {
    /// Whether it names a file that does not exist (yet); a device model always exists.
    pub fn is_missing(&self) -> bool {
        self.model.is_none() && !self.path.exists()
    }

    /// Opens the device, creating a missing file when a size was given.
    pub fn open(&self, read_only: bool) -> Result<Arc<dyn Device>, String> {
        self.open_with(read_only, false)
    }

    /// Opens a device that must exist: commands that only look at or change a pool (`info`,
    /// `check`, `volume`, `device`) never create a file, whatever size the spec names.
    pub fn open_existing(&self, read_only: bool) -> Result<Arc<dyn Device>, String> {
        if self.is_missing() {
            return Err(format!(
                "{}: no such file or device (this command never creates one; `salsa format` or `salsa serve` do)",
                self.path.display()
            ));
        }
        self.open(read_only)
    }

    /// Opens the device; with `page_cache`, through the kernel's page cache instead of
    /// `O_DIRECT` (flushes still sync the device).
    pub fn open_with(&self, read_only: bool, page_cache: bool) -> Result<Arc<dyn Device>, String> {
        let dev = self.open_undeclared(read_only, page_cache)?;
        Ok(match self.declared {
            Some(t) if dev.zones().is_some() => {
                return Err(format!(
                    "{}: a zoned device's zones have their own storage type; declare a type (@{}) for flat devices only",
                    dev.name(),
                    t.name()
                ))
            }
            Some(t) => Declared::wrap(dev, t),
            None => dev,
        })
    }

    fn open_undeclared(&self, read_only: bool, page_cache: bool) -> Result<Arc<dyn Device>, String> {
        if let Some(m) = &self.model {
            return m.open(read_only);
        }
        let opts = FileOpenOptions {
            create_size_bytes: self.size_bytes,
            direct: !page_cache,
            read_only,
        };
        if self.path.is_dir() {
            return Err(format!(
                "{} is a directory; a pool member is a file or a block device (PATH:SIZE creates a missing file, e.g. {}/pool.img:1G)",
                self.path.display(),
                self.path.display()
            ));
        }
        FileDevice::open(&self.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn Device>)
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied && !read_only {
                    "; run as a user who may write it, or look without writing: `--read-only` (serve), `salsa info`, `salsa check`".to_string()
                } else if e.kind() == std::io::ErrorKind::PermissionDenied {
                    "; run as a user who may read it".to_string()
                } else if e.kind() == std::io::ErrorKind::WouldBlock {
                    format!(
                        "; if `salsa serve` has it, ask the server: `salsa stats --device {0}`, `salsa device fail|replace --device {0} ...` (its control socket is {1})",
                        self.path.display(),
                        control_path_for(&self.path).display()
                    )
                } else {
                    String::new()
                };
                format!("cannot open {}: {e}{hint}", self.path.display())
            })
    }
}

/// Refuses a list of devices (members, then any parity buffer) that names one file twice,
/// by two paths or one: the second open would find it locked by the first and blame another
/// process. Files that do not exist yet are compared by where they would be created.
pub fn check_distinct<'a>(specs: impl IntoIterator<Item = &'a DeviceSpec>) -> Result<(), String> {
    // A file's device and inode, or where a missing one would be created.
    type FileId = Result<(u64, u64), PathBuf>;
    let mut seen: Vec<(&'a DeviceSpec, FileId)> = Vec::new();
    for spec in specs {
        if spec.path.as_os_str().is_empty() {
            continue; // a model kept in memory
        }
        let id = match file_id(&spec.path) {
            Some(id) => Ok(id),
            // Not there yet: where it would be created.
            None => Err(match (spec.path.parent(), spec.path.file_name()) {
                (Some(dir), Some(name)) => {
                    let dir = if dir.as_os_str().is_empty() {
                        std::path::Path::new(".")
                    } else {
                        dir
                    };
                    dir.canonicalize().map_or_else(|_| spec.path.clone(), |d| d.join(name))
                }
                _ => spec.path.clone(),
            }),
        };
        if let Some((other, _)) = seen.iter().find(|(_, seen_id)| *seen_id == id) {
            return Err(if other.path == spec.path {
                format!("{} is given twice: name each device once", spec.path.display())
            } else {
                format!(
                    "{} and {} are the same file: name each device once",
                    other.path.display(),
                    spec.path.display()
                )
            });
        }
        seen.push((spec, id));
    }
    Ok(())
}

/// The device and inode of the file at `path` (two paths name one file when these agree);
/// `None` when there is none.
pub fn file_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The control socket `salsa serve` answers next to its first device (`pool.img` ->
/// `pool.ctl`).
pub fn control_path_for(device: &std::path::Path) -> std::path::PathBuf {
    device.with_extension("ctl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_named_twice_is_refused_by_either_name() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        let a = dir.join("a.img");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(dir.join("b.img"), b"x").unwrap();
        let spec = |p: &str| p.parse::<DeviceSpec>().unwrap();
        let (a_str, b_str) = (a.to_str().unwrap().to_string(), dir.join("b.img").to_str().unwrap().to_string());
        std::os::unix::fs::symlink(&a, dir.join("link.img")).unwrap();
        let other_name = dir.join("link.img").to_str().unwrap().to_string();
        let missing = dir.join("new.img").to_str().unwrap().to_string();
        assert!(check_distinct(&[spec(&a_str), spec(&b_str), spec(&missing)]).is_ok());
        let e = check_distinct(&[spec(&a_str), spec(&b_str), spec(&a_str)]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let e = check_distinct(&[spec(&a_str), spec(&other_name)]).unwrap_err();
        assert!(e.contains("are the same file"), "{e}");
        let e = check_distinct(&[spec(&format!("{missing}:1M")), spec(&missing)]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let missing_other_name = dir
            .join("..")
            .join(dir.file_name().unwrap())
            .join("new.img")
            .to_str()
            .unwrap()
            .to_string();
        let e = check_distinct(&[spec(&missing), spec(&missing_other_name)]).unwrap_err();
        assert!(e.contains("are the same file"), "{e}");
        // Models kept in memory have no file.
        assert!(check_distinct(&[spec("ssd:size=64M"), spec("ssd:size=64M")]).is_ok());
    }

    #[test]
    fn sizes_and_specs_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
        let d: DeviceSpec = "/tmp/a.img:1G".parse().unwrap();
        assert_eq!(d.size_bytes, Some(1 << 30));
        let d: DeviceSpec = "/dev/sdb".parse().unwrap();
        assert_eq!(d.size_bytes, None);
    }

    #[test]
    fn model_specs_parse_and_open() {
        let d: DeviceSpec = "ssd:size=64M,op=7,unit=16K,block=1M".parse().unwrap();
        assert_eq!(d.model.as_ref().map(|m| m.kind), Some(ModelKind::Ssd));
        let dev = d.open(false).unwrap();
        assert_eq!(dev.size_bytes(), 64 << 20);
        let d: DeviceSpec = "zoned:size=64M,zone=4M,conv=1".parse().unwrap();
        let dev = d.open(false).unwrap();
        assert_eq!(dev.zones().map(|z| (z.zone_count(), z.zone_bytes())), Some((16, 4 << 20)));
        let dev = "dmsmr:size=256M,band=32M".parse::<DeviceSpec>().unwrap().open(false).unwrap();
        assert_eq!(dev.preferred_alignment_bytes(), 32 << 20);
        let e = "ssd:size=64M,colour=blue".parse::<DeviceSpec>().unwrap_err();
        assert!(e.contains("unknown device parameter"), "{e}");
        assert!("ssd:op=7".parse::<DeviceSpec>().is_err(), "no size");
        assert!("zoned:size=64M,type=tape".parse::<DeviceSpec>().unwrap().open(false).is_err());
        assert!("ssd:size=64M,unit=3K".parse::<DeviceSpec>().unwrap().open(false).is_err());
        // In real time, a read of flash takes its read time on the wall clock.
        let ssd = "ssd:size=16M,read_us=30000,mapcache=full,realtime=on"
            .parse::<DeviceSpec>()
            .unwrap()
            .open(false)
            .unwrap();
        ssd.write_at(&vec![1u8; 1 << 20], 0).unwrap();
        ssd.sync().unwrap();
        let t = std::time::Instant::now();
        let mut buf = vec![0u8; 4096];
        ssd.read_at(&mut buf, 0).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(30) && buf == vec![1u8; 4096]);
        let e = "ssd:size=16M,realtime=maybe".parse::<DeviceSpec>().unwrap().open(false).err();
        assert!(e.is_some_and(|e| e.contains("realtime")));
        let e = "ssd:size=16M,precondition=32M".parse::<DeviceSpec>().unwrap().open(false).err();
        assert!(e.is_some_and(|e| e.contains("precondition")), "more than the drive");
        let e = "ssd:size=16M,precondition=lots".parse::<DeviceSpec>().unwrap().open(false).err();
        assert!(e.is_some_and(|e| e.contains("precondition")));
        let ssd = "ssd:size=16M,precondition=8M".parse::<DeviceSpec>().unwrap().open(false).unwrap();
        let written = ssd.counters().into_iter().find(|(n, _)| n == "host_write_bytes").map(|(_, v)| v);
        assert_eq!(written, Some(16 << 20), "8 MiB written twice");
        let e = "ssd:size=16M,erase_us=1e30".parse::<DeviceSpec>().unwrap().open(false).err();
        assert!(e.is_some_and(|e| e.contains("at most")), "an absurd latency is refused");
        let disk = "hdd:size=64M,seek_us=8000".parse::<DeviceSpec>().unwrap().open(false).unwrap();
        assert_eq!(disk.storage_type(), StorageType::Hdd);
        assert!(disk.counters().iter().any(|(k, _)| k == "seeks"), "a disk model counts its seeks");
        assert!("hdd:size=64M,mbps=0".parse::<DeviceSpec>().unwrap().open(false).is_err());
        assert!("hdd:size=64M,seek_us=1e30".parse::<DeviceSpec>().unwrap().open(false).is_err());
    }

    #[test]
    fn a_storage_type_is_declared_after_an_at_sign() {
        let d: DeviceSpec = "/tmp/a.img:1G@hdd".parse().unwrap();
        assert_eq!((d.size_bytes, d.declared), (Some(1 << 30), Some(StorageType::Hdd)));
        let d: DeviceSpec = "ssd:size=64M@nvm".parse().unwrap();
        assert_eq!(d.declared, Some(StorageType::Nvm));
        assert_eq!(d.open(false).unwrap().storage_type(), StorageType::Nvm);
        let e = "/tmp/a.img@tape".parse::<DeviceSpec>().unwrap_err();
        assert!(e.contains("unknown storage type"), "{e}");
        let e = "zoned:size=64M,zone=4M@hdd"
            .parse::<DeviceSpec>()
            .unwrap()
            .open(false)
            .err()
            .unwrap();
        assert!(e.contains("zones have their own storage type"), "{e}");
    }
}
