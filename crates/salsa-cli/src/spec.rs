//! Parsing of device specs (`PATH[:SIZE]`) and human sizes (`512M`, `1G`, `4096`).

use salsa_core::device::file::FileOpenOptions;
use salsa_core::device::FileDevice;
use salsa_core::Device;
use std::path::PathBuf;
use std::sync::Arc;

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
    pub path: PathBuf,
    pub size_bytes: Option<u64>,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.rsplit_once(':') {
            Some((path, size)) if !path.is_empty() && size.chars().next().is_some_and(|c| c.is_ascii_digit()) => Ok(DeviceSpec {
                path: path.into(),
                size_bytes: Some(parse_size(size)?),
            }),
            _ if s.is_empty() => Err("empty device path".into()),
            _ => Ok(DeviceSpec {
                path: s.into(),
                size_bytes: None,
            }),
        }
    }
}

impl DeviceSpec {
    /// Opens the device, creating a missing file when a size was given.
    pub fn open(&self, read_only: bool) -> Result<Arc<dyn Device>, String> {
        self.open_with(read_only, false)
    }

    /// Opens the device; with `page_cache`, through the kernel's page cache instead of
    /// `O_DIRECT` (flushes still sync the device).
    pub fn open_with(&self, read_only: bool, page_cache: bool) -> Result<Arc<dyn Device>, String> {
        let opts = FileOpenOptions {
            create_size_bytes: self.size_bytes,
            direct: !page_cache,
            read_only,
        };
        FileDevice::open(&self.path, opts)
            .map(|d| Arc::new(d) as Arc<dyn Device>)
            .map_err(|e| format!("cannot open {}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
