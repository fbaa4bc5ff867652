//! `salsa share`: remap ranges of a volume without copying data (SHARE), through the running
//! server's control socket (request `share <volume> <dst>:<src>:<len> ...`, answered `ok
//! <json>` or `error <message>`) or offline on the pool's devices. The batch is atomic and
//! durable when the command returns.

use crate::control::{open_offline, request, running_server};
use crate::*;
use salsa_core::ShareRange;

/// Parses `DST:SRC:LEN` (byte offsets and length, size suffixes allowed).
pub(crate) fn parse_range(s: &str) -> Result<ShareRange, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [dst, src, len] = parts[..] else {
        return Err(format!("{s:?} is not DST:SRC:LEN (byte offsets and a length, e.g. 1G:0:64K)"));
    };
    let size = |v: &str, what: &str| parse_size(v).map_err(|e| format!("{what} in {s:?}: {e}"));
    Ok(ShareRange {
        dst_offset: size(dst, "destination")?,
        src_offset: size(src, "source")?,
        len_bytes: size(len, "length")?,
    })
}

/// Applies the batch on `pool` and makes it durable; the JSON the command and the control
/// socket report.
pub(crate) fn apply(pool: &Pool, volume: &str, ranges: &[ShareRange]) -> Result<serde_json::Value, String> {
    let vol = pool.volume(volume).map_err(|e| e.to_string())?;
    vol.share_fua(ranges).map_err(|e| e.to_string())?;
    Ok(serde_json::json!({
        "volume": volume,
        "ranges": ranges.len(),
        "bytes": ranges.iter().map(|r| r.len_bytes).sum::<u64>(),
    }))
}

/// The control socket's `share` request (`words`: what follows the request name).
pub(crate) fn answer<'a>(pool: &Pool, mut words: impl Iterator<Item = &'a str>) -> String {
    let Some(volume) = words.next() else {
        return "error usage: share <volume> <dst>:<src>:<len> ...".into();
    };
    let ranges: Result<Vec<ShareRange>, String> = words.map(parse_range).collect();
    match ranges.and_then(|r| apply(pool, volume, &r)) {
        Ok(j) => format!("ok {j}"),
        Err(e) => format!("error {e}"),
    }
}

fn report(j: &serde_json::Value) {
    println!(
        "shared {} range(s), {} in all, on volume {} (no data copied; durable)",
        j["ranges"],
        human(j["bytes"].as_u64().unwrap_or(0)),
        j["volume"].as_str().unwrap_or("?")
    );
}

/// `salsa share`: online when a server answers, else offline on `devices`.
pub(crate) fn share(
    devices: &[DeviceSpec],
    parity_buffer: Option<&DeviceSpec>,
    control: Option<&std::path::Path>,
    volume: &str,
    ranges: &[String],
) -> Result<(), String> {
    let parsed: Vec<ShareRange> = ranges.iter().map(|r| parse_range(r)).collect::<Result<_, _>>()?;
    if volume.contains(char::is_whitespace) {
        return Err("a volume name with spaces cannot go through the control socket".into());
    }
    if let Some(path) = running_server(devices, control) {
        let ranges: Vec<String> = parsed
            .iter()
            .map(|r| format!("{}:{}:{}", r.dst_offset, r.src_offset, r.len_bytes))
            .collect();
        let line = request(&path, &format!("share {volume} {}", ranges.join(" ")))?;
        let j = line
            .strip_prefix("ok ")
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default();
        report(&j);
        return Ok(());
    }
    let pool = open_offline(devices, parity_buffer)?;
    let j = apply(&pool, volume, &parsed)?;
    report(&j);
    pool.close().map_err(|e| e.to_string())
}
