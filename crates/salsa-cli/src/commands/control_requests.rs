//! What the server answers on its control socket, request by request (the protocol is
//! described in [`crate::control`]).

use super::device::{fail_member, replace_with, report_json};
use super::stats;
use crate::*;
use std::io::{BufRead, BufReader, Write};

/// Serves one control connection (see the module documentation).
pub(crate) fn answer(mut s: std::os::unix::net::UnixStream, pool: &Pool, exports: &salsa_nbd::server::Exports) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(200)));
    let mut line = String::new();
    // A request is one line, at most 64 KiB (a share batch of 256 ranges fits).
    let request = match BufReader::new(std::io::Read::take(&s, 64 << 10)).read_line(&mut line) {
        Ok(_) => line.trim().to_string(),
        Err(_) => String::new(), // said nothing: the statistics
    };
    let mut words = request.split_whitespace();
    let reply = match words.next() {
        None | Some("stats") => {
            let mut v = stats::stats_json(pool);
            // The counters run since the pool was opened by this server.
            let since = crate::control::SERVING_SINCE.get_or_init(std::time::SystemTime::now);
            v["counters_since_unix_seconds"] = since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()).into();
            format!("{v}")
        }
        Some("scrub") => match super::admin::scrub_json(pool, words.next() == Some("repair")) {
            Ok(v) => v.to_string(),
            Err(e) => format!("error {e}"),
        },
        Some("replace") => {
            let (Some(old), Some(spec)) = (words.next(), words.next()) else {
                let _ = writeln!(s, "error usage: replace <member> <device spec> [<bytes per second> [force]]");
                return;
            };
            let opts = salsa_core::RebuildOptions {
                rate_bytes_per_sec: words.next().and_then(|r| r.parse::<u64>().ok()).filter(|r| *r > 0),
                overwrite: words.next() == Some("force"),
            };
            let result = spec.parse::<DeviceSpec>().and_then(|new| {
                let out = std::sync::Mutex::new(s.try_clone().map_err(|e| e.to_string())?);
                let progress = |done: u64, total: u64| {
                    if let Ok(mut o) = out.lock() {
                        let _ = writeln!(o, "progress {done} {total}");
                    }
                };
                replace_with(pool, old, &new, opts, &progress)
            });
            match result {
                Ok(r) => format!("ok {}", report_json(&r)),
                Err(e) => format!("error {e}"),
            }
        }
        Some("fail") => match words.next() {
            Some(member) => match fail_member(pool, member) {
                Ok(back) => format!("ok {}", serde_json::json!({"failed": member, "serves_again": back})),
                Err(e) => format!("error {e}"),
            },
            None => "error usage: fail <member>".into(),
        },
        Some("volume") => {
            let json = request.trim_start().strip_prefix("volume").unwrap_or_default();
            super::volume::answer(pool, exports, json)
        }
        Some("share") => super::share::answer(pool, words),
        Some("rebuild-rate") => match words.next().map(|r| r.parse::<u64>()) {
            Some(Ok(rate)) => match pool.set_rebuild_rate((rate > 0).then_some(rate)) {
                Ok(()) => "ok".into(),
                Err(e) => format!("error {e}"),
            },
            _ => "error usage: rebuild-rate <bytes per second, 0: no limit>".into(),
        },
        Some(other) => format!("error unknown request {other:?} (stats, scrub [repair], fail, replace, rebuild-rate, volume, share)"),
    };
    let _ = writeln!(s, "{reply}");
}
