//! `salsa serve --metrics HOST:PORT`: the statistics of `salsa stats` in Prometheus' text
//! exposition format (version 0.0.4), pool-wide, per volume, per member and per device
//! counter, answered over plain HTTP at `/metrics`.
//!
//! The responder reads at most [`REQUEST_HEAD_MAX_BYTES`] of a request head within
//! [`REQUEST_TIMEOUT`] and answers one request per connection, one connection at a time (a
//! scrape takes microseconds; a slow or hostile client is cut off by the timeout).

use salsa_core::{Pool, Stats};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// Largest request head read.
const REQUEST_HEAD_MAX_BYTES: usize = 8 << 10;
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A label value as the exposition format quotes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Collects samples grouped by metric, each metric with its HELP and TYPE once.
#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let _ = writeln!(self.text, "# HELP salsa_{name} {help}");
        let _ = writeln!(self.text, "# TYPE salsa_{name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.text, "salsa_{name}{labels} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.metric(name, kind, help, &[(String::new(), value)]);
    }
}

/// The statistics as Prometheus text.
pub(crate) fn render(s: &Stats) -> String {
    let mut e = Exposition::default();
    render_pool(&mut e, s);
    render_volumes(&mut e, s);
    render_array(&mut e, s);
    render_caches(&mut e, s);
    render_devices_and_policy(&mut e, s);
    e.text
}

/// One metric of a table: its name, kind, help text, and its value read from a `T` (the pool's
/// statistics, one volume's, one member's).
type Metric<T> = (&'static str, &'static str, &'static str, fn(&T) -> f64);

const COUNTER: &str = "counter";
const GAUGE: &str = "gauge";

/// Pool-wide traffic, GC, discards, pacing, map memory and segments by state.
fn render_pool(e: &mut Exposition, s: &Stats) {
    let (c, g) = (COUNTER, GAUGE);
    let pool_metrics: [Metric<Stats>; 37] = [
        ("user_written_bytes_total", c, "Bytes written by clients.", |s| {
            s.user_bytes_written as f64
        }),
        (
            "compressed_saved_bytes_total",
            c,
            "Bytes compressing volumes' writes did not store (their pages less their stored forms).",
            |s| s.compressed_bytes_saved as f64,
        ),
        ("user_read_bytes_total", c, "Bytes read by clients.", |s| s.user_bytes_read as f64),
        ("gc_relocated_bytes_total", c, "Bytes the garbage collector moved.", |s| {
            s.gc_bytes_relocated as f64
        }),
        (
            "device_written_bytes_total",
            c,
            "Bytes the log wrote (data, relocations, metadata).",
            |s| s.device_bytes_written as f64,
        ),
        ("metadata_written_bytes_total", c, "Bytes of record metadata written.", |s| {
            s.metadata_bytes_written as f64
        }),
        (
            "pad_written_bytes_total",
            c,
            "Zeros written to end flushes on whole RAID-5 rows.",
            |s| s.pad_bytes_written as f64,
        ),
        (
            "gc_bursts_total",
            c,
            "Bursts in which the GC wrote the records it held back (its records together, for drives that program in arrival order).",
            |s| s.gc_bursts as f64,
        ),
        ("gc_burst_records_total", c, "GC records written in bursts.", |s| {
            s.gc_burst_records as f64
        }),
        (
            "discarded_bytes_total",
            c,
            "Bytes of freed segments discarded on the devices (TRIM, punched holes).",
            |s| s.discarded_bytes as f64,
        ),
        (
            "discard_errors_total",
            c,
            "Discards a device refused (advisory, nothing lost).",
            |s| s.discard_errors as f64,
        ),
        (
            "discards_skipped_total",
            c,
            "Freed segments not discarded: a punched hole would be allocated again at their imminent reuse.",
            |s| s.discards_skipped as f64,
        ),
        (
            "hole_fill_bytes_total",
            c,
            "Zeros written into free segments over holes of their pool file, allocated ahead of writers.",
            |s| s.hole_fill_bytes as f64,
        ),
        ("pages_shared_total", c, "Pages remapped by share batches (SHARE).", |s| {
            s.pages_shared as f64
        }),
        ("share_batches_total", c, "Share batches applied.", |s| s.share_batches as f64),
        (
            "records_written_ahead_total",
            c,
            "User records written ahead of their flush (write-behind).",
            |s| s.records_written_ahead as f64,
        ),
        ("write_amplification", g, "Device bytes written per user byte.", |s| {
            s.write_amplification
        }),
        ("array_write_amplification", g, "Bytes written to all members per user byte.", |s| {
            s.array_write_amplification
        }),
        ("free_segments", g, "Segments free to write.", |s| s.free_segments as f64),
        ("gc_low_watermark_segments", g, "Free segments below which the GC cleans.", |s| {
            s.gc_low_watermark_segments as f64
        }),
        (
            "gc_high_watermark_segments",
            g,
            "Free segments up to which the GC cleans once started.",
            |s| s.gc_high_watermark_segments as f64,
        ),
        (
            "free_segments_over_holes",
            g,
            "Free segments over holes of their pool file (handed out last).",
            |s| s.free_segments_over_holes as f64,
        ),
        ("segments", g, "Segments in the pool.", |s| s.total_segments as f64),
        ("segment_bytes", g, "Bytes per segment.", |s| s.segment_bytes as f64),
        ("gc_segments_cleaned_total", c, "Victim segments cleaned.", |s| {
            s.gc_segments_cleaned as f64
        }),
        ("flushes_total", c, "Flushes served.", |s| s.flushes as f64),
        ("syncs_total", c, "Device syncs.", |s| s.syncs as f64),
        ("sync_seconds_total", c, "Time spent in device syncs.", |s| {
            s.sync_micros as f64 / 1e6
        }),
        (
            "gc_releases_sharing_a_sync_total",
            c,
            "Garbage-collector releases covered by a sync another began after them.",
            |s| s.releases_sharing_a_sync as f64,
        ),
        ("gc_seconds_total", c, "Time the garbage collector worked.", |s| {
            s.gc_micros as f64 / 1e6
        }),
        (
            "throttled_allocations_total",
            c,
            "Writers that waited for the garbage collector.",
            |s| s.throttled_allocations as f64,
        ),
        (
            "paced_writes_total",
            c,
            "User writes paced while the garbage collector was behind.",
            |s| s.paced_writes as f64,
        ),
        (
            "paced_by_write_back_total",
            c,
            "Paced user writes admitted at the pace the write-back threads write at (records waiting for the devices).",
            |s| s.paced_by_write_back as f64,
        ),
        ("paced_seconds_total", c, "Time paced user writes slept.", |s| {
            s.paced_micros as f64 / 1e6
        }),
        (
            "pacing_rate_bytes_per_second",
            g,
            "The rate user writes are admitted at while the garbage collector is behind (0: not pacing).",
            |s| s.pacing_rate_bytes_per_sec as f64,
        ),
        ("map_memory_bytes", g, "Memory held by the volume maps.", |s| {
            s.map_memory_bytes as f64
        }),
        ("unmovable_segments", g, "Segments the garbage collector gave up on.", |s| {
            s.unmovable_segments as f64
        }),
    ];
    for (name, kind, help, f) in pool_metrics {
        e.one(name, kind, help, f(s));
    }
    let states = [
        "free",
        "staged",
        "allocated",
        "victim",
        "pending_free",
        "checkpoint",
        "tier",
        "offline",
    ];
    let by_state: Vec<(String, f64)> = states
        .iter()
        .zip(s.segments_by_state)
        .map(|(st, n)| (format!("{{state=\"{st}\"}}"), n as f64))
        .collect();
    e.metric("segments_by_state", g, "Segments per state.", &by_state);
}

/// One sample per volume for each volume metric.
fn render_volumes(e: &mut Exposition, s: &Stats) {
    let (c, g) = (COUNTER, GAUGE);

    let volume_metrics: [Metric<salsa_core::VolumeStats>; 20] = [
        (
            "volume_stored_bytes",
            g,
            "Bytes the volume's data takes on the devices (less than mapped when compressed).",
            |v| v.stored_bytes as f64,
        ),
        (
            "volume_gc_relocated_bytes_total",
            c,
            "Bytes of the volume's data the GC moved.",
            |v| v.gc_bytes_relocated as f64,
        ),
        ("volume_size_bytes", g, "Volume size.", |v| v.size_bytes as f64),
        ("volume_mapped_bytes", g, "Bytes of the volume that hold data.", |v| {
            v.mapped_bytes as f64
        }),
        ("volume_map_memory_bytes", g, "Memory held by the volume's map.", |v| {
            v.map_memory_bytes as f64
        }),
        ("volume_page_bytes", g, "Volume page size.", |v| v.page_bytes as f64),
        ("volume_sparse_pages", g, "Dual mapping: small pages in the sparse map.", |v| {
            v.sparse_pages as f64
        }),
        (
            "volume_sparse_capacity_pages",
            g,
            "Dual mapping: most small pages the sparse map holds.",
            |v| v.sparse_capacity_pages as f64,
        ),
        (
            "volume_merged_pages_total",
            c,
            "Dual mapping: large pages merged to free sparse entries.",
            |v| v.merged_pages as f64,
        ),
        (
            "volume_small_pages_written_total",
            c,
            "Dual mapping: small pages written to the sparse map.",
            |v| v.small_pages_written as f64,
        ),
        (
            "volume_fast_tier_bytes",
            g,
            "Hybrid: bytes of current copies on the fast tier.",
            |v| v.fast_tier_bytes as f64,
        ),
        ("volume_promotions_total", c, "Hybrid: page groups copied to the fast tier.", |v| {
            v.promotions as f64
        }),
        (
            "volume_demotions_total",
            c,
            "Hybrid: page groups dropped from the fast tier.",
            |v| v.demotions as f64,
        ),
        ("volume_fast_read_bytes_total", c, "Hybrid: bytes read from the fast tier.", |v| {
            v.fast_read_bytes as f64
        }),
        ("volume_slow_read_bytes_total", c, "Hybrid: bytes read from the slow tier.", |v| {
            v.slow_read_bytes as f64
        }),
        ("volume_amf_segments_written", g, "AMF: segments written (open or full).", |v| {
            v.amf_segments_written as f64
        }),
        ("volume_amf_segments_full", g, "AMF: segments written to their end.", |v| {
            v.amf_segments_full as f64
        }),
        ("volume_map_runs", g, "AMF: runs in the volume's extent map.", |v| v.map_runs as f64),
        (
            "volume_shared_pages",
            g,
            "Physical pages with several logical owners (share).",
            |v| v.shared_pages as f64,
        ),
        (
            "volume_fast_tier_failed",
            g,
            "Hybrid: 1 when the fast tier stopped after an I/O error.",
            |v| v.fast_tier_failed as u8 as f64,
        ),
    ];
    for (name, kind, help, f) in volume_metrics {
        let samples: Vec<(String, f64)> = s
            .volumes
            .iter()
            .map(|v| {
                (
                    format!("{{volume=\"{}\",controller=\"{}\"}}", label(&v.name), label(&v.controller)),
                    f(v),
                )
            })
            .collect();
        e.metric(name, kind, help, &samples);
    }
}

/// The array's members, its rebuild and its parity buffer.
fn render_array(e: &mut Exposition, s: &Stats) {
    let (c, g) = (COUNTER, GAUGE);
    let member_metrics: [Metric<salsa_core::MemberStatus>; 10] = [
        ("member_read_bytes_total", c, "Bytes read from the member.", |m| m.bytes_read as f64),
        ("member_written_bytes_total", c, "Bytes written to the member.", |m| {
            m.bytes_written as f64
        }),
        ("member_parity_written_bytes_total", c, "Parity bytes written to the member.", |m| {
            m.parity_bytes_written as f64
        }),
        ("member_read_errors_total", c, "Read errors of the member.", |m| {
            m.read_errors as f64
        }),
        ("member_write_errors_total", c, "Write errors of the member.", |m| {
            m.write_errors as f64
        }),
        (
            "member_repaired_bytes_total",
            c,
            "Bytes rewritten on the member from redundancy.",
            |m| m.repaired_bytes as f64,
        ),
        (
            "member_damaged_bytes_total",
            c,
            "Bytes found failing their checksum on the member, rewritten or not.",
            |m| m.damaged_bytes as f64,
        ),
        ("member_failed", g, "1 when the member has failed.", |m| m.failed as u8 as f64),
        ("member_rebuilding", g, "1 while the member is being rebuilt.", |m| {
            m.rebuilding as u8 as f64
        }),
        (
            "member_outgoing_in_service",
            g,
            "1 while the healthy device the member replaces still serves its slot (the array keeps its redundancy until the rebuild ends).",
            |m| m.outgoing.is_some() as u8 as f64,
        ),
    ];
    if !s.members.is_empty() {
        for (name, kind, help, f) in member_metrics {
            let samples: Vec<(String, f64)> = s
                .members
                .iter()
                .enumerate()
                .map(|(slot, m)| (format!("{{slot=\"{slot}\",member=\"{}\"}}", label(&m.name)), f(m)))
                .collect();
            e.metric(name, kind, help, &samples);
        }
    }
    if let Some(r) = s.rebuild {
        let l = format!("{{slot=\"{}\",segments=\"{}\"}}", r.slot, r.total_segments);
        e.metric(
            "rebuild_segments_passed",
            g,
            "Segments a rebuild has passed, of segments.",
            &[(l.clone(), r.next_segment as f64)],
        );
        e.metric(
            "rebuild_rate_limit_bytes_per_second",
            g,
            "The rebuild's rate limit in bytes a second (0: none).",
            &[(l, r.rate_bytes_per_sec.unwrap_or(0) as f64)],
        );
    }
    if let Some(b) = &s.parity_buffer {
        let l = format!("{{buffer=\"{}\"}}", label(&b.name));
        e.metric(
            "parity_buffer_written_bytes_total",
            c,
            "Bytes written to the RAID-5 parity buffer.",
            &[(l.clone(), b.bytes_written as f64)],
        );
        e.metric(
            "parity_buffer_banks_written_total",
            c,
            "Banks written to the parity buffer.",
            &[(l.clone(), b.banks_written as f64)],
        );
        e.metric(
            "parity_buffer_failed",
            g,
            "1 when the parity buffer went out of service (flushes pad to whole rows since).",
            &[(l, if b.failed.is_some() { 1.0 } else { 0.0 })],
        );
    }
}

/// The read cache and the write buffer, when the pool has them.
fn render_caches(e: &mut Exposition, s: &Stats) {
    let (c, g) = (COUNTER, GAUGE);
    if let Some(r) = &s.read_cache {
        e.one("read_cache_capacity_bytes", g, "Read cache size.", r.capacity_bytes as f64);
        e.one("read_cache_used_bytes", g, "Bytes the read cache holds.", r.used_bytes as f64);
        e.one("read_cache_pages", g, "Pages the read cache holds.", r.pages as f64);
        e.one("read_cache_hits_total", c, "Reads served from the read cache.", r.hits as f64);
        e.one("read_cache_misses_total", c, "Reads that went to the devices.", r.misses as f64);
    }
    if let Some(w) = &s.write_buffer {
        e.one("write_buffer_capacity_bytes", g, "Write buffer size.", w.capacity_bytes as f64);
        e.one(
            "write_buffer_dirty_bytes",
            g,
            "Bytes of written pages not yet given to the log.",
            w.dirty_bytes as f64,
        );
        e.one(
            "write_buffer_pages_written_total",
            c,
            "Pages written into the write buffer.",
            w.pages_written as f64,
        );
        e.one(
            "write_buffer_pages_absorbed_total",
            c,
            "Buffered pages overwritten before they reached the log.",
            w.pages_absorbed as f64,
        );
        e.one(
            "write_buffer_pages_destaged_total",
            c,
            "Pages the write buffer gave to the log.",
            w.pages_destaged as f64,
        );
        e.one(
            "write_buffer_writer_waits_total",
            c,
            "Writes that waited for room in the write buffer.",
            w.writer_waits as f64,
        );
        e.one(
            "write_buffer_spare_bytes",
            g,
            "Page buffers the write buffer keeps for reuse.",
            w.spare_bytes as f64,
        );
    }
}

/// The device models' counters and the victim policy's own state.
fn render_devices_and_policy(e: &mut Exposition, s: &Stats) {
    let counters: Vec<(String, f64)> = s
        .device_counters
        .iter()
        .map(|(d, k, v)| (format!("{{device=\"{}\",counter=\"{}\"}}", label(d), label(k)), *v as f64))
        .collect();
    if !counters.is_empty() {
        e.metric("device_counter", "untyped", "Counters of the device models.", &counters);
    }
    let policy: Vec<(String, f64)> = s
        .victim_policy_state
        .iter()
        .map(|(k, v)| (format!("{{name=\"{}\"}}", label(k)), *v))
        .collect();
    if !policy.is_empty() {
        e.metric(
            "victim_policy_state",
            "gauge",
            "What the pool's victim policy reports of itself (an adaptive policy's age exponent).",
            &policy,
        );
    }
}

/// Answers one HTTP request on `stream`.
fn answer(mut stream: std::net::TcpStream, pool: &Pool) {
    let _ = stream.set_read_timeout(Some(REQUEST_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > REQUEST_HEAD_MAX_BYTES {
            let _ = stream.write_all(b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n");
            return;
        }
    }
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or(&[])).into_owned();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => ("200 OK", render(&pool.stats())),
        ("GET", _) | ("HEAD", _) => ("404 Not Found", "salsa serves its metrics at /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", String::new()),
    };
    let mut reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        reply.push_str(&body);
    }
    let _ = stream.write_all(reply.as_bytes());
}

/// Serves `/metrics` on `listener` until `stop`.
pub(crate) fn metrics_thread(listener: std::net::TcpListener, pool: Arc<Pool>, stop: Arc<AtomicBool>) {
    let _ = listener.set_nonblocking(true);
    while !stop.load(SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                answer(s, &pool);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_every_metric_has_help_and_type() {
        let s = Stats {
            user_bytes_written: 4096,
            volumes: vec![salsa_core::VolumeStats {
                name: "a\"b\\c".into(),
                controller: "lsa".into(),
                size_bytes: 1 << 20,
                ..Default::default()
            }],
            members: vec![
                salsa_core::MemberStatus {
                    name: "new".into(),
                    rebuilding: true,
                    outgoing: Some("old".into()),
                    ..Default::default()
                },
                salsa_core::MemberStatus {
                    name: "other".into(),
                    ..Default::default()
                },
            ],
            ..Stats::default()
        };
        let text = render(&s);
        assert!(text.contains("salsa_user_written_bytes_total 4096\n"), "{text}");
        assert!(
            text.contains("salsa_member_outgoing_in_service{slot=\"0\",member=\"new\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("salsa_member_outgoing_in_service{slot=\"1\",member=\"other\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"salsa_volume_size_bytes{volume="a\"b\\c",controller="lsa"} 1048576"#),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} has no TYPE");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
