//! `salsa stats`: the running server's statistics over its control socket, and their JSON form.

use crate::*;
use salsa_core::spec::control_path_for;

pub(crate) use salsa_cli::stats_json::{stats_json, volume_json};

pub(crate) fn stats(control: Option<std::path::PathBuf>, device: Option<&DeviceSpec>, json: bool) -> Result<(), String> {
    let path =
        control.unwrap_or_else(|| control_path_for(device.map(|d| d.path.as_path()).unwrap_or(std::path::Path::new(DEFAULT_DEVICE))));
    let v = query_stats(&path)?;
    if json {
        println!("{v}");
        return Ok(());
    }
    print_period(&v);
    print_pool(&v);
    print_caches(&v);
    if v["array"].as_str().is_some_and(|a| a != "linear") {
        print_array(&v);
    }
    let (mut pool_mapped, mut pool_stored) = (0u64, 0u64);
    for vol in v["volumes"].as_array().into_iter().flatten() {
        let (mapped, stored) = (vol["mapped_bytes"].as_u64().unwrap_or(0), vol["stored_bytes"].as_u64().unwrap_or(0));
        pool_mapped += mapped;
        pool_stored += stored;
        let compression = vol["compression"].as_str().unwrap_or("off");
        println!(
            "volume {:<20} size {:>10} mapped {:>10} stored {:>10}{}",
            vol["name"].as_str().unwrap_or("?"),
            human(vol["size_bytes"].as_u64().unwrap_or(0)),
            human(mapped),
            human(stored),
            if compression == "off" {
                String::new()
            } else {
                format!(" ({compression}, {:.2}x)", mapped as f64 / stored.max(1) as f64)
            }
        );
    }
    if v["compressed_bytes_saved"].as_u64().unwrap_or(0) > 0 {
        println!(
            "compression: {} mapped stored in {} ({:.2}x); writes since start saved {}",
            human(pool_mapped),
            human(pool_stored),
            pool_mapped as f64 / pool_stored.max(1) as f64,
            human(v["compressed_bytes_saved"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

/// Asks the server behind the control socket at `path` for its statistics.
fn query_stats(path: &std::path::Path) -> Result<serde_json::Value, String> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach a running server at {}: {e} (is `salsa serve` running?)",
            path.display()
        )
    })?;
    let _ = writeln!(s, "stats");
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(text.trim()).map_err(|e| format!("bad answer from {}: {e}", path.display()))
}

/// The period the counters cover: they restart with each server start.
fn print_period(v: &serde_json::Value) {
    if let Some(since) = v["counters_since_unix_seconds"].as_u64() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let ago = now.saturating_sub(since);
        println!(
            "counters since the server started {} ago (they restart with each start)",
            if ago >= 3600 {
                format!("{} h {:02} min", ago / 3600, ago % 3600 / 60)
            } else {
                format!("{} min {:02} s", ago / 60, ago % 60)
            }
        );
    }
}

/// Traffic, GC, free space, pacing, syncs and map memory of the pool.
fn print_pool(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    println!("user written      {}", human(n("user_bytes_written")));
    println!("user read         {}", human(n("user_bytes_read")));
    println!("GC relocated      {}", human(n("gc_bytes_relocated")));
    if n("gc_bursts") > 0 {
        println!(
            "GC bursts         {} ({} records, {:.1} a burst)",
            n("gc_bursts"),
            n("gc_burst_records"),
            n("gc_burst_records") as f64 / n("gc_bursts") as f64
        );
    }
    println!("device written    {}", human(n("device_bytes_written")));
    println!("write amp.        {:.3}", v["write_amplification"].as_f64().unwrap_or(0.0));
    println!(
        "free segments     {} of {} (the GC cleans below {} until {})",
        n("free_segments"),
        n("total_segments"),
        n("gc_low_watermark_segments"),
        n("gc_high_watermark_segments")
    );
    let spoken_for = v["write_buffer"]["reserved_bytes"].as_u64().unwrap_or(0);
    if spoken_for > 0 {
        println!(
            "  spoken for      {} by buffered writes not yet in the log (about {} segments)",
            human(spoken_for),
            spoken_for.div_ceil(n("segment_bytes").max(1))
        );
    }
    if n("free_segments_over_holes") > 0 {
        println!(
            "  over holes      {} (of the pool file: handed out last)",
            n("free_segments_over_holes")
        );
    }
    println!("syncs             {} for {} flushes", n("syncs"), n("flushes"));
    if n("paced_writes") > 0 || n("throttled_allocations") > 0 {
        println!(
            "pacing            {} writes paced ({} for the write-back; {:.1} s in all, {}), {} writer stalls",
            n("paced_writes"),
            n("paced_by_write_back"),
            n("paced_micros") as f64 / 1e6,
            match n("pacing_rate_bytes_per_sec") {
                0 => "not pacing now".to_string(),
                r => format!("admitting {}/s now", salsa_core::pool::human_bytes(r)),
            },
            n("throttled_allocations")
        );
    }
    if let Some(state) = salsa_cli::stats_json::victim_policy_state_text(&v["victim_policy_state"]) {
        println!("victim policy     {state}");
    }
    if n("records_written_ahead") > 0 {
        println!(
            "written ahead     {} records (write-behind: the writers flush after every write)",
            n("records_written_ahead")
        );
    }
    println!("map memory        {}", human(n("map_memory_bytes")));
    if n("discarded_bytes") > 0 || n("discard_errors") > 0 || n("discards_skipped") > 0 {
        println!(
            "discarded         {} of freed segments ({} refused, {} segments skipped: reused too soon)",
            human(n("discarded_bytes")),
            n("discard_errors"),
            n("discards_skipped")
        );
    }
    if n("hole_fill_bytes") > 0 {
        println!(
            "holes filled      {} of free segments (allocated ahead of writers)",
            human(n("hole_fill_bytes"))
        );
    }
    if n("share_batches") > 0 {
        println!("shared            {} pages in {} batches", n("pages_shared"), n("share_batches"));
    }
}

/// The read cache and the write buffer, when the pool has them.
fn print_caches(v: &serde_json::Value) {
    if let Some(c) = v["read_cache"].as_object() {
        let k = |key: &str| c.get(key).and_then(|x| x.as_u64()).unwrap_or(0);
        let lookups = (k("hits") + k("misses")).max(1);
        println!(
            "read cache        {} of {} ({} pages); {} hits, {} misses ({:.1}% hits)",
            human(k("used_bytes")),
            human(k("capacity_bytes")),
            k("pages"),
            k("hits"),
            k("misses"),
            100.0 * k("hits") as f64 / lookups as f64
        );
    }
    if let Some(w) = v["write_buffer"].as_object() {
        let k = |key: &str| w.get(key).and_then(|x| x.as_u64()).unwrap_or(0);
        println!(
            "write buffer      {} of {} dirty ({} pages, {} spare); {} pages written, {} absorbed by later writes, {} destaged in {} destages",
            human(k("dirty_bytes")),
            human(k("capacity_bytes")),
            k("dirty_pages"),
            human(k("spare_bytes")),
            k("pages_written"),
            k("pages_absorbed"),
            k("pages_destaged"),
            k("destages")
        );
    }
}

/// An array's layout, parity buffer, rebuild and members.
fn print_array(v: &serde_json::Value) {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    println!(
        "array             {} (all members written per user byte: {:.3}; padding {})",
        v["array"].as_str().unwrap_or("?"),
        v["array_write_amplification"].as_f64().unwrap_or(0.0),
        human(n("pad_bytes_written"))
    );
    if let Some(b) = v["parity_buffer"].as_object() {
        let k = |key: &str| b.get(key).and_then(|x| x.as_u64()).unwrap_or(0);
        println!(
            "parity buffer     {} ({}, {} rows per bank): {} banks written, {}; {} syncs had nothing new",
            b.get("name").and_then(|x| x.as_str()).unwrap_or("?"),
            human(k("size_bytes")),
            k("rows_per_bank"),
            k("banks_written"),
            human(k("bytes_written")),
            k("banks_skipped")
        );
        if let Some(why) = b.get("failed").and_then(|x| x.as_str()) {
            println!(
                "  OUT OF SERVICE   {why}: flushes pad to whole rows; after a stop, `salsa device parity-buffer` gives the pool a new one"
            );
        }
    }
    if let Some(r) = v["rebuild"].as_object() {
        let k = |key: &str| r.get(key).and_then(|x| x.as_u64()).unwrap_or(0);
        let limit = rate_limit_text(Some(k("rate_bytes_per_sec")).filter(|r| *r > 0));
        println!(
            "rebuilding        slot {}: {} of {} segments passed, {limit}",
            k("slot"),
            k("next_segment"),
            k("total_segments")
        );
    }
    for m in v["members"].as_array().into_iter().flatten() {
        let k = |key: &str| m[key].as_u64().unwrap_or(0);
        println!(
            "  {:<7} {} ({})  read {}  written {} (parity {})  errors {}r/{}w  damaged {}  repaired {}",
            m["state"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?"),
            m["storage_type"].as_str().unwrap_or("?"),
            human(k("bytes_read")),
            human(k("bytes_written")),
            human(k("parity_bytes_written")),
            k("read_errors"),
            k("write_errors"),
            human(k("damaged_bytes")),
            human(k("repaired_bytes"))
        );
        if let Some(out) = m["outgoing"].as_str() {
            println!("          {out} still serves the slot until the rebuild ends");
        }
    }
}
