//! `salsa bench` end to end: policies side by side with JSON and charts, trace replay, and the
//! device trace it writes.

mod common;
use common::*;
use std::process::Command;

fn salsa(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_salsa")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn policies_side_by_side_with_json_and_charts() {
    let dir = test_dir("side");
    let out = dir.join("report");
    let (ok, stdout, stderr) = salsa(&[
        "bench",
        "--memory",
        "96M",
        "--segment-size",
        "1M",
        "--workload",
        "hotcold:90/10",
        "--placement",
        "user-gc,sepbit",
        "--victim",
        "greedy",
        "--queue-depth",
        "2",
        "--warmup",
        "1",
        "--measure",
        "1",
        "--sample-ms",
        "50",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        let wa = r["wa"].as_f64().unwrap();
        assert!(wa > 1.0 && wa < 10.0, "GC ran and WA is sane: {wa}");
        assert!(r["device_wa"].as_f64().unwrap() >= wa);
        assert!(r["latency_write"]["count"].as_u64().unwrap() > 1000);
        assert!(r["latency_write"]["p99_us"].as_u64().unwrap() >= r["latency_write"]["p50_us"].as_u64().unwrap());
        assert!(!r["samples"].as_array().unwrap().is_empty());
    }
    assert_eq!(runs[1]["placement"], "sepbit");
    assert_eq!(runs[1]["placement_bytes_per_page"].as_f64().unwrap().round(), 4.0);
    for f in ["throughput.svg", "wa.svg", "latency_cdf.svg", "compare.svg", "results.json"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.contains("sepbit+greedy"), "{f} names both runs");
    }
}

#[test]
fn compare_runs_every_named_pair_and_writes_one_report() {
    let dir = test_dir("compare");
    let out = dir.join("report");
    let (ok, stdout, stderr) = salsa(&[
        "bench",
        "--memory",
        "64M",
        "--segment-size",
        "1M",
        "--workload",
        "zipf:1.0",
        "--compare",
        "user-gc+*,sepbit+fifo,user-gc+greedy",
        "--inline-gc",
        "--queue-depth",
        "1",
        "--warmup",
        "1",
        "--measure",
        "0.5",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = results.as_array().unwrap();
    // Every victim policy with user-gc (greedy named twice runs once), then sepbit+fifo.
    let (ok, victims, _) = salsa(&["policies"]);
    assert!(ok);
    let victim_count = victims
        .lines()
        .skip_while(|l| !l.starts_with("victim"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .count();
    assert!(victim_count >= 6, "{victims}");
    // Descriptions start in one column, however long a name is.
    let columns: std::collections::BTreeSet<usize> = victims
        .lines()
        .filter(|l| l.starts_with("  "))
        .map(|l| {
            let name_end = 2 + l[2..].find(' ').unwrap();
            name_end + l[name_end..].find(|c: char| c != ' ').unwrap()
        })
        .collect();
    assert_eq!(columns.len(), 1, "{victims}");
    assert_eq!(runs.len(), victim_count + 1);
    assert_eq!(runs.last().unwrap()["victim"], "fifo");
    let lowest = runs.iter().map(|r| r["wa"].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert_eq!(stdout.lines().filter(|l| l.starts_with("| ")).count(), runs.len() + 1, "{stdout}");
    for r in runs {
        let label = format!("| {}+{} |", r["placement"].as_str().unwrap(), r["victim"].as_str().unwrap());
        let row = report
            .lines()
            .find(|l| l.starts_with(&label))
            .unwrap_or_else(|| panic!("{label} in {report}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let wa = r["wa"].as_f64().unwrap();
        assert_eq!(cells[2], format!("{wa:.3}"));
        assert_eq!(cells[3], format!("{:.3}", wa / lowest), "relative to the lowest WA of the run");
        assert_eq!(cells[7], "-", "no reads were sent");
    }
    for f in ["wa.svg", "throughput.svg", "latency_cdf.svg"] {
        assert!(std::fs::read_to_string(out.join(f)).unwrap().contains("sepbit+fifo"));
    }
    for (bad, says) in [
        ("nope+greedy", "unknown placement policy \"nope\""),
        ("salsa+nope", "unknown victim policy \"nope\""),
        ("salsa", "give PLACEMENT+VICTIM"),
    ] {
        let (ok, _, stderr) = salsa(&["bench", "--memory", "16M", "--compare", bad, "--out", out.to_str().unwrap()]);
        assert!(!ok && stderr.contains(says), "{bad}: {stderr}");
    }
}

#[test]
fn trace_replay_and_device_trace() {
    let dir = test_dir("trace");
    // An Alibaba-format trace: volume 3 writes 16 MiB twice with 64 KiB requests and reads
    // some back; volume 4's lines must be ignored.
    let mut t = String::new();
    let mut ts = 0;
    for round in 0..2 {
        for i in 0..256u64 {
            ts += 10;
            let off = ((i * 37) % 256) * 65536;
            t.push_str(&format!("3,W,{off},65536,{ts}\n"));
            if round == 1 && i % 4 == 0 {
                t.push_str(&format!("3,R,{off},65536,{ts}\n"));
            }
            t.push_str(&format!("4,W,{},4096,{ts}\n", 1u64 << 40));
        }
    }
    let trace = dir.join("in.csv");
    std::fs::write(&trace, t).unwrap();
    let dev_trace = dir.join("dev.log");
    let (ok, stdout, stderr) = salsa(&[
        "bench",
        "--memory",
        "64M",
        "--segment-size",
        "1M",
        "--workload",
        &format!("trace:{}", trace.display()),
        "--trace-volume",
        "3",
        "--no-precondition",
        "--queue-depth",
        "1",
        "--device-trace",
        dev_trace.to_str().unwrap(),
        "--device-trace-format",
        "fio",
        "--json",
        "--out",
        dir.join("report").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let r = &v[0];
    assert_eq!(r["measured_user_bytes_written"].as_f64().unwrap(), (2 * 256 * 65536) as f64);
    assert_eq!(r["measured_user_bytes_read"].as_f64().unwrap(), (64 * 65536) as f64);
    assert_eq!(r["volume_bytes"].as_u64().unwrap(), 16 << 20);
    // The device trace is a fio iolog of large writes.
    let log = std::fs::read_to_string(&dev_trace).unwrap();
    assert!(log.starts_with("fio version 2 iolog\n"));
    let writes: Vec<u64> = log
        .lines()
        .filter(|l| l.contains(" write "))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    let bytes: u64 = writes.iter().sum();
    assert!(bytes >= 32 << 20, "every user byte reached the device: {bytes}");
    assert!(bytes / writes.len() as u64 >= 64 << 10, "SALSA writes in large records");
    // Requests shorter than a sector are replayed (read-modify-write), not a crash.
    std::fs::write(&trace, "3,W,100,4,1\n3,W,9000,1,2\n3,R,100,4,3\n").unwrap();
    let (ok, stdout, stderr) = salsa(&[
        "bench",
        "--memory",
        "64M",
        "--workload",
        &format!("trace:{}", trace.display()),
        "--no-precondition",
        "--json",
        "--out",
        dir.join("report-small").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v[0]["measured_user_bytes_written"].as_f64().unwrap(), 5.0);
    // A malformed trace is refused with its line number.
    std::fs::write(&trace, "3,W,0,4096,1\n3,Q,0,4096,2\n").unwrap();
    let (ok, _, stderr) = salsa(&["bench", "--memory", "64M", "--workload", &format!("trace:{}", trace.display())]);
    assert!(!ok && stderr.contains(":2:"), "{stderr}");
}

fn json_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// SALSA and the raw device side by side on identical SSD models: the report compares device
/// write amplification, wear and modelled throughput, and draws both over time.
#[test]
fn device_bench_ssd_model_raw_versus_salsa() {
    let dir = test_dir("ssd");
    let out = dir.join("report");
    let (ok, stdout, stderr) = salsa(&[
        "bench-device",
        "--device",
        "ssd:size=512M",
        "--measure",
        "0.5",
        "--queue-depth",
        "4",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let r = json_of(&stdout);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    let (s, raw) = (&runs[0], &runs[1]);
    assert_eq!((s["target"].as_str(), raw["target"].as_str()), (Some("salsa"), Some("raw")));
    assert_eq!(s["target_bytes"], raw["target_bytes"], "raw runs on a partition of SALSA's size");
    // Random 4 KiB writes into 16 KiB flash pages amplify inside the drive; SALSA's
    // sequential segments do not.
    let dev_wa = |x: &serde_json::Value| x["device_internal_wa"].as_f64().unwrap();
    assert!(dev_wa(raw) > 4.0, "raw device WA {}", dev_wa(raw));
    assert!(dev_wa(s) < 1.5, "SALSA device WA {}", dev_wa(s));
    assert!(r["wear_ratio_raw_over_salsa"].as_f64().unwrap() > 1.0);
    assert!(r["throughput_ratio_salsa_over_raw"].as_f64().unwrap() > 1.0);
    for f in ["results.json", "throughput.svg", "wear.svg"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.contains("salsa") && text.contains("raw"), "{f}");
    }
}

/// Several volumes on one drive, each worker flushing its volume as a database commits:
/// the report says so, SALSA's pool holds that many volumes, and its own bytes per user byte
/// (user, GC, metadata) come with the flushes it took.
#[test]
fn device_bench_splits_the_drive_into_volumes_that_flush() {
    let (ok, stdout, stderr) = salsa(&[
        "bench-device",
        "--device",
        "ssd:size=256M",
        "--measure",
        "0.25",
        "--queue-depth",
        "4",
        "--volumes",
        "4",
        "--flush-every",
        "64K",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let r = json_of(&stdout);
    let runs = r["runs"].as_array().unwrap();
    let (s, raw) = (&runs[0], &runs[1]);
    for x in [s, raw] {
        assert_eq!(
            (x["volumes"].as_u64(), x["flush_every_bytes"].as_u64()),
            (Some(4), Some(64 << 10)),
            "{x}"
        );
    }
    let per_user = &s["salsa_per_user_byte"];
    assert!((per_user["user"].as_f64().unwrap() - 1.0).abs() < 0.01, "{per_user}");
    // A flush after every 64 KiB a worker writes: about 16 per MB written.
    let flushes_per_mb = per_user["flushes"].as_f64().unwrap();
    assert!(
        (8.0..=20.0).contains(&flushes_per_mb),
        "{flushes_per_mb} flushes per MB: {per_user}"
    );
    assert!(per_user["metadata"].as_f64().unwrap() > 0.0, "{per_user}");
    // The raw drive took a cache flush for each.
    let raw_flushes = raw["device_counters"][0]["counters"]["host_flushes"].as_u64().unwrap();
    assert!(raw_flushes > 0, "{raw}");
    let (ok, _, stderr) = salsa(&["bench-device", "--device", "ssd:size=64M", "--volumes", "0"]);
    assert!(!ok && stderr.contains("volumes"), "{stderr}");
}

/// Through SALSA on a host-managed SMR drive (zoned, with disk timing); a raw run is not
/// possible there and is skipped; a wrong model parameter is a clear error.
#[test]
fn device_bench_on_host_managed_smr_and_bad_specs() {
    let (ok, stdout, stderr) = salsa(&[
        "bench-device",
        "--device",
        "hmsmr:size=512M,zone=8M,conv=2",
        "--block-size",
        "64K",
        "--queue-depth",
        "2",
        "--spare",
        "10",
        "--measure",
        "0.5",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let r = json_of(&stdout);
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "no raw run on a zoned drive");
    assert!(runs[0]["throughput_mbps_model"].as_f64().unwrap() > 0.0);
    assert!(runs[0]["host_wa"].as_f64().unwrap() > 1.0, "the GC ran");
    let (ok, _, stderr) = salsa(&["bench-device", "--device", "ssd:size=64M,speed=9"]);
    assert!(!ok && stderr.contains("unknown device parameter"), "{stderr}");
    let (ok, _, stderr) = salsa(&["bench-device", "--device", "/tmp/plain-file:64M"]);
    assert!(!ok && stderr.contains("emulated device"), "{stderr}");
}

/// Recording the device trace keeps what the device is: on a zoned drive the pool still sees
/// the zones (it would otherwise write and read as on a flat disk, and the drive refuses that).
#[test]
fn device_trace_on_a_zoned_drive() {
    let dir = test_dir("zoned-trace");
    let trace = dir.join("zoned.log");
    let (ok, _, stderr) = salsa(&[
        "bench",
        "--device",
        "zoned:size=96M,zone=1M,conv=2",
        "--warmup",
        "0.2",
        "--measure",
        "0.2",
        "--queue-depth",
        "2",
        "--device-trace",
        trace.to_str().unwrap(),
        "--out",
        dir.join("report").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(std::fs::read_to_string(&trace).unwrap().lines().count() > 10);
}

/// `bench-raw` runs the raw O_DIRECT baseline and SALSA on the same file, in both of SALSA's
/// I/O modes, and reports throughput, the ratio and write amplification; the scratch file is
/// removed afterwards.
#[test]
fn raw_baseline_against_salsa_in_both_io_modes() {
    let dir = test_dir("raw");
    let file = dir.join("bench.img");
    for (flag, mode) in [(None, "direct"), (Some("--page-cache"), "page-cache")] {
        let mut args = vec![
            "bench-raw",
            "--file",
            file.to_str().unwrap(),
            "--size",
            "96M",
            "--queue-depth",
            "8",
            "--warmup",
            "1",
            "--measure",
            "1",
            "--baseline-seconds",
            "1",
            "--json",
        ];
        args.extend(flag);
        let (ok, out, err) = salsa(&args);
        assert!(ok, "bench-raw {flag:?} failed: {err}");
        let v = json_of(out.lines().last().unwrap_or(""));
        assert_eq!(v["salsa_io"], mode);
        let (salsa_mbps, raw_mbps) = (
            v["salsa_mbps_median"].as_f64().unwrap(),
            v["baseline_mbps_median"].as_f64().unwrap(),
        );
        assert!(salsa_mbps > 0.0 && raw_mbps > 0.0, "{v}");
        assert!((v["throughput_ratio"].as_f64().unwrap() - salsa_mbps / raw_mbps).abs() < 1e-9);
        // Random overwrites at 20% spare: the GC ran, and WA is near the analytic 2.69.
        let wa = v["gc_write_amplification"].as_f64().unwrap();
        assert!(wa > 1.5 && wa < 4.0, "WA {wa}");
        assert!(!file.exists(), "the scratch file is left behind");
    }
    let (ok, _, err) = salsa(&["bench-raw", "--file", file.to_str().unwrap(), "--block-size", "1000"]);
    assert!(!ok && err.contains("multiple of 4 KiB"), "{err}");
}

#[test]
fn garbage_trigger_and_volume_size_run_sepbit_style_cleaning_on_a_roomy_pool() {
    let dir = test_dir("garbage");
    let run = |volume: &str, extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--memory",
            "128M",
            "--segment-size",
            "1M",
            "--volume-size",
            volume,
            "--workload",
            "uniform",
            "--placement",
            "user-gc",
            "--victim",
            "greedy",
            "--inline-gc",
            "--queue-depth",
            "1",
            "--warmup",
            "2",
            "--measure",
            "2",
            "--json",
            "--out",
            dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        salsa(&args)
    };
    // A 24 MiB volume on a 128 MiB pool: free space never runs low, so the GC only runs when
    // the garbage trigger asks, and then as it would at 20% spare (uniform greedy: about 2.7).
    let (ok, stdout, stderr) = run("24M", &[]);
    assert!(ok, "{stderr}");
    let r = &json_of(&stdout)[0];
    assert_eq!(r["volume_bytes"].as_u64().unwrap(), 24 << 20);
    assert!(r["wa"].as_f64().unwrap() < 1.05, "no trigger, no GC: {}", r["wa"]);
    let (ok, stdout, stderr) = run("24M", &["--gc-garbage-percent", "20"]);
    assert!(ok, "{stderr}");
    let r = &json_of(&stdout)[0];
    let wa = r["wa"].as_f64().unwrap();
    assert!((2.2..3.4).contains(&wa), "20% garbage, uniform greedy: WA {wa}");
    assert_eq!(r["gc_garbage_percent"].as_f64().unwrap(), 20.0);
    for (volume, bad, says) in [
        ("24M", &["--gc-garbage-percent", "95"][..], "garbage trigger"),
        ("1G", &[][..], "more than"),
    ] {
        let (ok, _, stderr) = run(volume, bad);
        assert!(!ok && stderr.contains(says), "{bad:?}: {stderr}");
    }
}

#[test]
fn a_window_too_short_for_its_sampling_period_is_reported() {
    let run = |sample_ms: &str| {
        salsa(&[
            "bench",
            "--memory",
            "64M",
            "--segment-size",
            "1M",
            "--workload",
            "uniform",
            "--warmup",
            "0",
            "--measure",
            "0.5",
            "--sample-ms",
            sample_ms,
            "--json",
        ])
    };
    // Half a volume of 4 KiB writes in memory takes well under ten seconds.
    let (ok, _, stderr) = run("10000");
    assert!(ok, "{stderr}");
    assert!(stderr.contains("warning: the measured window holds only"), "{stderr}");
    let (ok, stdout, stderr) = run("10");
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let samples = v[0]["samples"].as_array().unwrap();
    let seconds = v[0]["seconds"].as_f64().unwrap();
    let times: Vec<f64> = samples.iter().map(|s| s[0].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "samples in time order: {times:?}");
    assert_eq!(*times.last().unwrap(), seconds, "the last sample closes the window");
    // The warning counts throughput samples: the gaps between samples that have a length, the
    // last left out when shorter than half a period (counted here the same way; the number of
    // samples alone was flaky: 6 samples can give 4 throughput figures).
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let throughput_samples = gaps
        .iter()
        .enumerate()
        .filter(|&(i, &dt)| dt > 0.0 && !(i + 1 == gaps.len() && i > 0 && dt < 0.010 / 2.0))
        .count();
    assert_eq!(
        stderr.contains("warning: the measured window"),
        throughput_samples < 5,
        "{throughput_samples} throughput samples: {stderr}"
    );
}

/// A short `salsa bench-raid`: both sides ran every part and the report holds their figures
/// (the long run behind BENCHMARKS.md uses the defaults).
#[test]
fn raid_bench_compares_salsa_raid5_with_an_in_place_raid5() {
    let dir = test_dir("raid");
    // One round of a second on small members, with `extra` arguments.
    let short_raid_bench = |extra: &[&str]| {
        let members = dir.join("m");
        let mut args = vec!["bench-raid", "--dir", members.to_str().unwrap()];
        args.extend(["--member-size", "48M", "--seconds", "1", "--rounds", "1"]);
        args.extend(extra);
        salsa(&args)
    };
    let (ok, stdout, stderr) = short_raid_bench(&[]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for part in ["randwrite_4k", "seqwrite_1m"] {
        let r = &v[part];
        for k in ["in_place_mbps", "salsa_mbps", "in_place_p99_us", "salsa_p99_us"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{part}.{k}: {v}");
        }
        // Parity is written: every user byte costs at least 4/3 bytes on the members.
        assert!(r["salsa_array_write_amplification"].as_f64().unwrap() >= 1.3, "{part}: {v}");
    }
    // Random overwrites of the whole volume make the GC read its victims; sequential ones
    // leave victims nearly empty, and a full-stripe write itself reads nothing.
    let read = |part: &str| v[part]["salsa_array_read_per_user_byte"].as_f64().unwrap();
    assert!(read("randwrite_4k") > 0.5, "{v}");
    assert!(read("seqwrite_1m") < 0.1, "{v}");
    // Flush-heavy writes: the parity buffer takes the padding away.
    let f = &v["flush_4k"];
    for k in ["in_place_mbps", "salsa_padding_mbps", "salsa_parity_buffer_mbps"] {
        assert!(f[k].as_f64().unwrap() > 0.0, "flush_4k.{k}: {v}");
    }
    assert!(f["salsa_padding_pad_per_user_byte"].as_f64().unwrap() > 1.0, "{v}");
    assert!(f["salsa_parity_buffer_pad_per_user_byte"].as_f64().unwrap() < 0.5, "{v}");
    assert!(f["salsa_parity_buffer_bytes_per_user_byte"].as_f64().unwrap() > 1.0, "{v}");
    // On emulated commodity SSDs, whose own FTL suffers under small random writes, the
    // in-place array's read-modify-writes cost far more than SALSA's whole-segment writes.
    let m = &v["ssd_models"];
    assert!(m["ratio_same_span"].as_f64().unwrap() > 1.5, "{v}");
    assert!(m["ratio_full"].as_f64().unwrap() > m["ratio_same_span"].as_f64().unwrap(), "{v}");
    // The same models in real time: every in-place write waits for the flash reads of its old
    // data and parity (60 us each, at once), and SALSA writes faster than it.
    let t = &v["ssd_real_time"];
    assert!(t["in_place_p50_us"].as_f64().unwrap() >= 60.0, "{v}");
    assert!(t["salsa_p99_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(t["throughput_ratio"].as_f64().unwrap() > 1.5, "{v}");
    let rebuild = &v["rebuild"];
    let (done, total) = (
        rebuild["salsa_segments_rebuilt"].as_u64().unwrap(),
        rebuild["segments_total"].as_u64().unwrap(),
    );
    assert!(done > 0 && done < total, "a half-full pool rebuilds part of its segments: {v}");
    let degraded = v["degraded_reads"]["ratio"].as_f64().unwrap();
    assert!(degraded > 0.0 && degraded < 2.0, "{v}");
    assert!(!dir.join("m").join("m0.img").exists(), "the member files are removed");
    // A working set of half the volume, paced: both sides write half as many bytes.
    let (ok, stdout, stderr) = short_raid_bench(&["--only", "randwrite_4k", "--volume-percent", "50", "--pace-writes"]);
    assert!(ok, "{stderr}");
    let half: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let (whole_bytes, half_bytes) = (v["workload_bytes"].as_u64().unwrap(), half["workload_bytes"].as_u64().unwrap());
    assert!(
        half_bytes <= whole_bytes / 2 && half_bytes + (1 << 20) >= whole_bytes / 2,
        "{half_bytes} bytes against {whole_bytes}"
    );
    assert!(half["randwrite_4k"]["salsa_mbps"].as_f64().unwrap() > 0.0, "{half}");
    assert_eq!(
        half["randwrite_4k"]["salsa_driver"], "one thread holding the acknowledgements",
        "{half}"
    );
    assert_eq!(v["randwrite_4k"]["salsa_driver"], "a thread per queue slot", "{v}");
    assert!(half.get("seqwrite_1m").is_none(), "only the part asked for ran: {half}");
    let (ok, _, stderr) = short_raid_bench(&["--volume-percent", "0"]);
    assert!(!ok && stderr.contains("volume-percent"), "{stderr}");
}

/// The object-store case study, short: Swift-style object writes on XFS over nbdfuse, on the
/// drive-managed SMR model served raw and through a dual-mapping volume. SALSA must do the
/// same work in less modelled device time (no media-cache writes, no band cleaning), every
/// object must read back intact (the workload checks each GET's MD5), and XFS must be clean.
#[test]
fn object_store_on_a_drive_managed_smr_model_raw_against_dual_mapping() {
    let r = case_study("bench_object_store.py", &[], &["nbdfuse", "mkfs.xfs", "xfs_repair", "losetup"]);
    for target in ["raw", "salsa_dual"] {
        assert!(r[target]["ops"].as_u64().unwrap() > 100, "{target}: {}", r[target]);
        assert_eq!(r[target]["errors"].as_array().unwrap().len(), 0);
    }
    let dual = &r["salsa_dual"]["device"];
    assert_eq!(dual["media_cache_write_bytes"], 0, "SALSA writes whole bands in place: {dual}");
    assert!(r["raw"]["device"]["bands_cleaned"].as_u64().unwrap() > 0, "{}", r["raw"]["device"]);
    assert!(
        dual["salsa_small_pages_written"].as_u64().unwrap() > 0,
        "XFS metadata went to the sparse map: {dual}"
    );
    let ratio = r["ratio_ops_per_model_second"].as_f64().unwrap();
    assert!(
        ratio > 2.0,
        "SALSA dual did {ratio:.2}x the raw model's operations per modelled second"
    );
}

/// Swift's own object server, short: PUT, UPDATE, GET and DELETE of 128 KiB and 1 MiB objects
/// through its HTTP API, on XFS over nbdfuse, on a drive-managed SMR model in real time served
/// raw and through a dual-mapping volume. Every request must succeed, every GET must return what
/// the last PUT stored (the script checks each body's MD5 against the server's ETag), deleted
/// objects must answer 404 and XFS must be clean (the script raises otherwise); SALSA writes its
/// segments in place, the raw disk goes through its media cache and cleans bands. No timing.
#[test]
fn swift_object_server_on_a_drive_managed_smr_model_raw_against_dual_mapping() {
    let r = case_study(
        "bench_swift.py",
        &[],
        &["swift-object-server", "nbdfuse", "mkfs.xfs", "xfs_repair", "losetup"],
    );
    for size in ["128K", "1M"] {
        let s = &r["sizes"][size];
        for target in ["raw", "salsa"] {
            let phases = s[target].as_array().unwrap();
            let ops: Vec<&str> = phases.iter().map(|p| p["op"].as_str().unwrap()).collect();
            assert_eq!(ops, ["put", "update", "get", "delete"], "{size} {target}");
            for p in phases {
                assert_eq!(p["complete"], true, "{size} {target}: {p}");
                assert_eq!(p["objects"], s["objects"], "{size} {target}: {p}");
            }
        }
        let put = |target: &str| s[target][0]["disk"].clone();
        assert_eq!(put("salsa")["media_cache_write_bytes"], 0, "{size}: {}", put("salsa"));
        assert!(
            put("raw")["media_cache_write_bytes"].as_u64().unwrap() > 0,
            "{size}: {}",
            put("raw")
        );
    }
}

/// The video-server case study, short: videos on XFS over nbdfuse, a writer adding one per
/// interval and readers reading the popular ones, on a disk model served raw, through SALSA on
/// the disk, and through a hybrid volume on the disk plus an SSD model. Every chunk must read
/// back as written, the hybrid must have copied the popular videos to the SSD and read them
/// from there, and its read throughput per modelled second in the second half must be well
/// above the raw disk's.
#[test]
fn video_server_on_a_disk_raw_against_salsa_and_a_hybrid_volume() {
    let r = case_study("bench_video.py", &[], &["nbdfuse", "mkfs.xfs", "xfs_repair", "losetup"]);
    for target in ["raw", "salsa", "hybrid"] {
        assert_eq!(r["targets"][target]["bad_chunks"], 0, "{target} read back what was written");
        assert_eq!(r["targets"][target]["write_keeps_up"], true, "{target}");
    }
    let last = r["targets"]["hybrid"]["intervals"].as_array().unwrap().last().unwrap().clone();
    assert!(last["promotions"].as_u64().unwrap() > 0, "{last}");
    let ssd_reads: u64 = last["devices"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.ends_with(".ssd"))
        .map(|(_, d)| d["read_phase"]["host_read_bytes"].as_u64().unwrap())
        .sum();
    assert!(ssd_reads > 0, "the hybrid read the popular videos from the SSD: {last}");
    let ratio = r["ratio_steady_read_vs_raw"]["hybrid"].as_f64().unwrap();
    assert!(ratio > 5.0, "the hybrid read {ratio:.1}x the raw disk per modelled second");
}

/// The mixed-workload case study under the paper's protocol, short: MariaDB under sysbench and
/// an object server on one SSD model in real time at once, on raw partitions, on two 4 KiB LSA
/// volumes, and on a 16 KiB LSA volume beside a dual-mapping one, every device preconditioned
/// through its export first. Every setup must run both applications without an error and leave
/// clean file systems (the script runs xfs_repair); the tailored setup must need well under half
/// the map memory and checkpoint space of the single-configuration one. Never a timing.
#[test]
fn mixed_workload_on_one_ssd_raw_single_and_tailored_volumes() {
    let r = case_study(
        "bench_mixed.py",
        &[],
        &["mariadbd", "sysbench", "nbdfuse", "mkfs.xfs", "losetup", "fio"],
    );
    let config = &r["config"];
    let logical = config["logical_bytes"].as_u64().unwrap();
    let db: u64 = config["db_size"].as_str().unwrap().parse().unwrap();
    let objects: u64 = config["objects_size"].as_str().unwrap().parse().unwrap();
    assert!(
        db + objects <= logical && db + objects + (2 << 20) > logical,
        "equal logical size: {config}"
    );
    for setup in ["raw", "salsa-single", "salsa-dual"] {
        let s = &r["setups"][setup];
        assert!(s["transactions"].as_u64().unwrap() > 0, "{setup}: {s}");
        assert!(s["object_ops"].as_u64().unwrap() > 0, "{setup}: {s}");
        assert_eq!(s["object_errors"], 0, "{setup}");
        for pass in ["sequential", "random"] {
            assert!(s["precondition_seconds"][pass].as_f64().unwrap() > 0.0, "{setup}: {s}");
        }
    }
    let d = &r["dual_vs_single"];
    assert!(d["map_memory_bytes"].as_f64().unwrap() < 0.5, "{d}");
    assert!(d["checkpoint_image_bytes"].as_f64().unwrap() < 0.5, "{d}");
    assert!(r["vs_raw"]["salsa-dual"]["tps_wall"].as_f64().is_some(), "{}", r["vs_raw"]);
}

/// The paper's Table IIa protocol, short: MariaDB instances under sysbench, each on ext4 over
/// its own partition of an SSD model in real time and over its own SALSA volume on another,
/// each device preconditioned through its export first. Every instance must run transactions
/// without an error, every table must hold the rows prepare put in it (the script counts
/// them), the file systems must be clean (it runs e2fsck), and the report must be consistent
/// and hold the preconditioning and the per-transaction costs; never a timing.
#[test]
fn sysbench_on_one_ssd_model_raw_partitions_against_salsa_volumes() {
    check_sysbench_case_study(&[]);
}

/// Table IIb's protocol, short: the same on a 3+1 RAID-5 of four SSD models, the in-place
/// RAID-5 (`salsa serve --raw --in-place-raid5`) against a SALSA RAID-5 pool.
#[test]
fn sysbench_on_a_raid5_of_ssd_models_in_place_against_salsa() {
    check_sysbench_case_study(&["--raid5"]);
}

fn check_sysbench_case_study(extra: &[&str]) {
    let r = case_study(
        "bench_sysbench_ssd.py",
        extra,
        &["mariadbd", "sysbench", "nbdfuse", "mkfs.ext4", "e2fsck", "losetup"],
    );
    assert_eq!(r["config"]["raid5"], extra.contains(&"--raid5"), "{r}");
    let rounds = r["rounds"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(rounds.len(), 1, "{r}");
    for setup in ["raw", "salsa"] {
        let s = &rounds[0][setup];
        let instances = s["instances"].as_array().unwrap_or_else(|| panic!("{setup}: {s}"));
        assert_eq!(instances.len(), 2, "{setup}: {s}");
        for i in instances {
            assert!(i["tps"].as_f64().unwrap() > 0.0, "{setup}: {i}");
            // sysbench's "ignored errors" are deadlocks it rolled back and retried (InnoDB
            // picks a victim among concurrent transactions), not failed I/O: a few are normal.
            let errors = i["errors"].as_u64().unwrap();
            let transactions = i["transactions"].as_u64().unwrap();
            assert!(errors * 100 <= transactions, "{setup}: {i}");
            assert!(!i["tps_series"].as_array().unwrap().is_empty(), "{setup}: {i}");
        }
        assert!(s["ssd_host_write_bytes"].as_u64().unwrap() > 0, "{setup}: {s}");
        // Both passes of the preconditioning ran through the setup's exports, and the drive's
        // requests per transaction were counted.
        for pass in ["sequential", "random"] {
            assert!(s["precondition_seconds"][pass].as_f64().is_some_and(|t| t > 0.0), "{setup}: {s}");
        }
        assert!(
            s["ssd_per_transaction"]["host_writes"].as_f64().is_some_and(|n| n > 0.0),
            "{setup}: {s}"
        );
    }
    let salsa = &rounds[0]["salsa"]["salsa_per_transaction"];
    assert!(salsa["user_bytes_written"].as_f64().is_some_and(|b| b > 0.0), "{salsa}");
    let ratio = r["salsa_vs_raw"]["tps"].as_f64().unwrap();
    let (salsa, raw) = (
        r["median"]["salsa"]["tps_total"].as_f64().unwrap(),
        r["median"]["raw"]["tps_total"].as_f64().unwrap(),
    );
    assert!((ratio - salsa / raw).abs() < 1e-9, "{r}");
}

/// MariaDB under sysbench and PostgreSQL under pgbench, each on ext4 over `salsa serve`, over
/// `nbdkit file` and over `nbdkit memory` (the ceiling), each as it comes: every database ran
/// transactions on all three, and the report holds each ratio (`scripts/bench_oltp.py --quick
/// --ceiling`).
#[test]
fn oltp_on_ext4_over_salsa_and_over_nbdkit() {
    let r = case_study(
        "bench_oltp.py",
        &["--ceiling"],
        &["mariadbd", "sysbench", "nbdkit", "nbdfuse", "mkfs.ext4", "losetup"],
    );
    for db in ["mariadb", "postgres"] {
        let d = &r["databases"][db];
        let ceiling = d["ceiling_vs_nbdkit"].as_f64().unwrap_or_else(|| panic!("{db}: {r}"));
        let memory = d["tps_median"]["memory"].as_f64().unwrap();
        assert!(
            (ceiling - memory / d["tps_median"]["nbdkit"].as_f64().unwrap()).abs() < 1e-9,
            "{db}: {r}"
        );
        for kind in ["salsa", "nbdkit", "memory"] {
            let rounds = d["rounds"][kind].as_array().unwrap_or_else(|| panic!("{db}: {r}"));
            assert_eq!(rounds.len(), 1, "{db}: {r}");
            assert!(rounds[0]["tps"].as_f64().unwrap() > 10.0, "{db} on {kind}: {r}");
        }
        let ratio = d["salsa_vs_nbdkit"].as_f64().unwrap();
        let (s, n) = (
            d["tps_median"]["salsa"].as_f64().unwrap(),
            d["tps_median"]["nbdkit"].as_f64().unwrap(),
        );
        assert!((ratio - s / n).abs() < 1e-9, "{db}: {r}");
    }
}

/// Compression side by side (`scripts/bench_compression.py --quick --db postgres`): pgbench ran
/// on ext4 over a plain and a compressing SALSA volume and on btrfs with compress=zstd over
/// the raw device; the compressing volume stored PostgreSQL's pages in less than two thirds of
/// their bytes and wrote fewer device bytes per transaction; fio's incompressible writes cost
/// it about what they cost the plain volume, its compressible ones less. (Bytes, not times:
/// what the test asserts does not depend on the machine's speed.)
#[test]
fn compression_on_databases_and_fio_against_the_plain_volume_and_btrfs() {
    let r = case_study(
        "bench_compression.py",
        &["--db", "postgres"],
        &["pgbench", "fio", "nbdfuse", "mkfs.ext4", "mkfs.btrfs", "losetup"],
    );
    let pg = &r["workloads"]["pgbench"];
    for setup in ["plain", "zstd", "btrfs"] {
        assert!(pg[setup]["tps"].as_f64().unwrap() > 10.0, "{setup}: {r}");
    }
    assert!(pg["zstd"]["stored_over_logical"].as_f64().unwrap() < 0.67, "{r}");
    assert!(pg["plain"]["stored_over_logical"].as_f64().unwrap() > 0.99, "{r}");
    assert!(pg["ratios"]["zstd"]["device_bytes_per_transaction"].as_f64().unwrap() < 0.8, "{r}");
    let per_byte = |w: &str, setup: &str| r["workloads"][w][setup]["device_bytes_per_unit"].as_f64().unwrap();
    let incompressible = per_byte("fio_0", "zstd") / per_byte("fio_0", "plain");
    assert!(
        (0.8..1.25).contains(&incompressible),
        "incompressible data cost {incompressible}x: {r}"
    );
    assert!(per_byte("fio_75", "zstd") < per_byte("fio_75", "plain") * 0.8, "{r}");
}

/// Whether Ceph's daemons and tools installed (scripts/install-deps.sh tries; where they did
/// not, the Ceph case study's tests are skipped with a message).
fn ceph_installed() -> bool {
    let found = ["ceph-mon", "ceph-mgr", "ceph-osd", "rados"].iter().all(|t| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        eprintln!("skipped: Ceph is not installed (scripts/install-deps.sh installs ceph-mon, ceph-mgr, ceph-osd)");
    }
    found
}

/// Every loop device and mount of the Ceph case study's run that reported `report` is gone
/// (those of its work directory; another run may be going on beside it).
fn assert_ceph_torn_down(report: &serde_json::Value) {
    let work = report["work_dir"].as_str().unwrap();
    assert!(work.contains("salsa-ceph-") && !std::path::Path::new(work).exists(), "{work}");
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    let loops = String::from_utf8_lossy(&loops.stdout);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    for line in loops.lines().chain(mounts.lines()) {
        assert!(!line.contains(work), "left behind: {line}");
    }
}

/// Ceph on SALSA, short: a monitor, a manager and three OSDs, each OSD's BlueStore on the
/// volume of its own SALSA server (a simulated host) through nbdfuse and a loop device; a few
/// seconds of rados bench with 4 MiB and 4 KiB objects and of fio's rbd engine, every phase
/// moving data; a deep scrub of every placement group that finds nothing inconsistent; all of
/// it torn down. Never a timing.
#[test]
fn ceph_cluster_on_salsa_volumes_benches_and_scrubs_clean() {
    if !ceph_installed() {
        return;
    }
    let r = case_study("ceph_on_salsa.py", &["--setups", "salsa"], &["nbdfuse", "losetup", "fio"]);
    let s = &r["salsa"];
    for size in ["4M", "4K"] {
        for mode in ["write", "seq", "rand"] {
            let p = &s["phases"][format!("rados_{mode}_{size}")];
            assert!(
                p["ops"].as_f64().unwrap() > 0.0 && p["mb_per_s"].as_f64().unwrap() > 0.0,
                "{mode} {size}: {p}"
            );
        }
    }
    for phase in ["rbd_fill_4M", "rbd_randwrite_4K"] {
        let p = &s["phases"][phase];
        assert!(p["iops"].as_f64().unwrap() > 0.0, "{phase}: {p}");
        assert!(p["latency_ms_p99"].as_f64().unwrap() > 0.0, "{phase}: {p}");
    }
    let scrub = &s["deep_scrub"];
    assert!(scrub["pgs_scrubbed"].as_u64().unwrap() > 0, "{scrub}");
    assert_eq!(scrub["inconsistent_pgs"], serde_json::json!([]), "{scrub}");
    assert_eq!(scrub["scrub_errors"], serde_json::json!({}), "{scrub}");
    assert!(s["map_memory_bytes"].as_u64().unwrap() > 0, "{s}");
    assert_ceph_torn_down(&r);
}

/// Ceph on SALSA under faults, short: a SALSA server killed with SIGKILL while a client writes
/// objects, then restarted: its OSD's BlueStore passes a deep fsck, the OSD rejoins, a deep
/// scrub finds nothing inconsistent and every object the client had acknowledged reads back
/// whole. Then an OSD's thin volume filled past its pool: the OSD meets ENOSPC from the device
/// and stops, and once space is given back its BlueStore passes fsck, the OSD rejoins, and
/// nothing acknowledged is lost.
#[test]
fn ceph_osd_survives_its_salsa_server_killed_and_its_volume_filling() {
    if !ceph_installed() {
        return;
    }
    let r = case_study("ceph_on_salsa.py", &["--faults"], &["nbdfuse", "losetup", "fio"]);
    for test in ["kill_9", "enospc"] {
        let t = &r["salsa"][test];
        assert!(t["acked"].as_u64().unwrap() > 0, "{test}: {t}");
        assert_eq!(t["fsck_exit_code"], 0, "{test}: {t}");
        assert_eq!(t["inconsistent_pgs"], serde_json::json!([]), "{test}: {t}");
        assert_eq!(t["scrub_errors"], serde_json::json!({}), "{test}: {t}");
        assert_eq!(t["objects_lost"], 0, "{test}: {t}");
        assert_eq!(t["objects_wrong"], 0, "{test}: {t}");
    }
    let kill = &r["salsa"]["kill_9"];
    assert!(kill["acked_before_kill"].as_u64().unwrap() > 0, "{kill}");
    let full = &r["salsa"]["enospc"];
    assert_eq!(full["osd_stopped"], true, "{full}");
    let log = full["log"].as_array().unwrap();
    assert!(
        log.iter().any(|l| l.as_str().unwrap().contains("No space left on device")),
        "{full}"
    );
    assert_ceph_torn_down(&r);
}

/// Runs a case-study script of scripts/ with `--quick` and `args` (after checking that the tools
/// it drives are installed) and returns its JSON report.
fn case_study(script: &str, args: &[&str], tools: &[&str]) -> serde_json::Value {
    for tool in tools {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
        assert!(found.status.success(), "{tool} is not installed; run scripts/install-deps.sh");
    }
    let dir = test_dir(script.trim_end_matches(".py"));
    let out = dir.join("report.json");
    let path = format!("{}/../../scripts/{script}", env!("CARGO_MANIFEST_DIR"));
    let run = Command::new("python3")
        .arg(path)
        .arg("--quick")
        .args(args)
        .arg("--out")
        .arg(&out)
        .env("SALSA_BIN", env!("CARGO_BIN_EXE_salsa"))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

/// `salsa bench-amf` on a small SSD model: the three volumes ran, every table write and trim
/// was taken (no relocation of the AMF volume with one stream), the extent map is far smaller
/// than the page map, and bad parameters are refused.
#[test]
fn amf_bench_compares_append_only_volumes_with_the_page_map() {
    let (ok, out, err) = salsa(&[
        "bench-amf",
        "--device",
        "ssd:size=256M",
        "--segment-size",
        "2M",
        "--rounds",
        "1",
        "--measure",
        "1",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    assert_eq!(j["runs"].as_array().map(|r| r.len()), Some(3), "{j}");
    for kind in ["amf", "amf8", "lsa"] {
        let wa = j[kind]["salsa_wa"].as_f64().unwrap();
        assert!((1.0..1.5).contains(&wa), "{kind}: SALSA WA {wa}");
        assert!(j[kind]["modelled_mb_per_s"].as_f64().unwrap() > 0.0, "{kind}");
    }
    let (amf, lsa) = (
        j["amf"]["map_memory_bytes"].as_f64().unwrap(),
        j["lsa"]["map_memory_bytes"].as_f64().unwrap(),
    );
    assert!(amf * 10.0 < lsa, "AMF map {amf} bytes, page map {lsa}");
    assert!(j["amf"]["map_runs"].as_f64().unwrap() > 0.0);
    let (ok, _, err) = salsa(&["bench-amf", "--device", "ssd:size=256M", "--fill", "0.95"]);
    assert!(!ok && err.contains("--fill"), "{err}");
    let (ok, _, err) = salsa(&["bench-amf", "--device", "mem.img:64M"]);
    assert!(!ok && err.contains("emulated device"), "{err}");
}

/// `salsa bench-share` on a small file: sharing a batch home writes about half
/// the bytes of the double write, and a compaction by share writes almost nothing; both check
/// the data they produce (the compaction reads back every 97th page against its origin).
#[test]
fn share_bench_compares_double_write_and_compaction_with_their_baselines() {
    let dir = test_dir("share");
    let device = format!("{}:256M", dir.join("b.img").display());
    let (ok, out, err) = salsa(&[
        "bench-share",
        "--device",
        &device,
        "--batches",
        "20",
        "--file-size",
        "8M",
        "--rounds",
        "1",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    let store = &j["page_store"];
    let (dw, sh) = (
        store["double_write"]["device_bytes_per_user_byte"].as_f64().unwrap(),
        store["share"]["device_bytes_per_user_byte"].as_f64().unwrap(),
    );
    assert!((1.9..2.3).contains(&dw), "double write: {dw} device bytes per user byte");
    assert!((0.95..1.3).contains(&sh), "share: {sh} device bytes per user byte");
    assert_eq!(store["share"]["flushes_per_batch"].as_f64(), Some(2.0), "{store}");
    let compaction = &j["compaction"];
    let (copy, share) = (
        compaction["copy"]["device_bytes_written"].as_f64().unwrap(),
        compaction["share"]["device_bytes_written"].as_f64().unwrap(),
    );
    assert!(copy >= 8.0 * 1048576.0, "the copy wrote {copy} bytes for an 8 MiB file");
    assert!(share * 20.0 < copy, "the share wrote {share} bytes against the copy's {copy}");
    let (ok, _, err) = salsa(&["bench-share", "--device", &device, "--batch", "0"]);
    assert!(!ok && err.contains("--batch"), "{err}");
}

/// `salsa bench-map-memory` on a small volume: the extent map is far smaller than the page map
/// for sequential and video-like writes, and random 4 KiB writes cost it no more than the page
/// map (its chunks fall back to one entry per page).
#[test]
fn map_memory_of_the_extent_controller_against_the_page_map() {
    let (ok, out, err) = salsa(&["bench-map-memory", "--volume-size", "80M"]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    let rows = j["workloads"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for r in rows {
        let (l, x) = (
            r["lsa"]["map_memory_bytes"].as_f64().unwrap(),
            r["extent"]["map_memory_bytes"].as_f64().unwrap(),
        );
        match r["workload"].as_str().unwrap() {
            "sequential" | "video" => assert!(x * 10.0 < l, "{r}"),
            _ => assert!(x <= l * 1.05 && x * 2.0 > l, "{r}"),
        }
    }
    let (ok, _, err) = salsa(&["bench-map-memory", "--volume-size", "1M"]);
    assert!(!ok && err.contains("40M"), "{err}");
}

fn shipped_trace(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces").join(name)
}

/// The traces shipped in `traces/` (recorded here with scripts/record_trace.py: ext4 and
/// MariaDB over a SALSA volume, the kernel's block_rq_issue events; one gzip-compressed)
/// replay whole, twice with --trace-repeat: every write and read request of the trace, trims
/// included in the replay.
#[test]
fn the_shipped_traces_replay_whole_and_repeated() {
    for name in ["ext4-files.ftrace", "mariadb-oltp.ftrace", "mariadb-oltp-30s.ftrace.gz"] {
        let path = shipped_trace(name);
        let mut text = String::new();
        if name.ends_with(".gz") {
            use std::io::Read;
            flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
                .read_to_string(&mut text)
                .unwrap();
        } else {
            text = std::fs::read_to_string(&path).unwrap();
        }
        // The trace's own totals, read here independently of the parser under test.
        let (mut written, mut read, mut trims) = (0u64, 0u64, 0u64);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((_, ev)) = line.split_once("block_rq_issue: ") else {
                continue;
            };
            let f: Vec<&str> = ev.split_whitespace().collect();
            let plus = f.iter().position(|t| *t == "+").unwrap();
            let bytes = f[plus + 1].parse::<u64>().unwrap() * 512;
            match f[1] {
                k if k.contains('D') => trims += 1,
                k if k.contains('W') => written += bytes,
                k if k.contains('R') => read += bytes,
                _ => {}
            }
        }
        assert!(written > 0 && trims > 0, "{name}: the trace holds writes and trims");
        let dir = test_dir(&format!("shipped-{name}"));
        let (ok, stdout, stderr) = salsa(&[
            "bench",
            "--memory",
            "640M",
            "--workload",
            &format!("trace:{}", path.display()),
            "--trace-repeat",
            "2",
            "--no-precondition",
            "--queue-depth",
            "1",
            "--json",
            "--out",
            dir.join("report").to_str().unwrap(),
        ]);
        assert!(ok, "{name}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(
            v[0]["measured_user_bytes_written"].as_f64().unwrap(),
            (2 * written) as f64,
            "{name}"
        );
        assert_eq!(v[0]["measured_user_bytes_read"].as_f64().unwrap(), (2 * read) as f64, "{name}");
    }
}

/// The 30 s MariaDB trace overwrites its pages scattered enough that, replayed once on a
/// preconditioned volume with 10% spare, the GC moves live data, and the cleaners part: FIFO
/// moves more than greedy (the trace half of the cleaning study in docs/BENCHMARKS.md).
#[test]
fn the_long_database_trace_makes_the_cleaners_differ() {
    let dir = test_dir("trace-cleaning");
    let (ok, stdout, stderr) = salsa(&[
        "bench",
        "--memory",
        "455M",
        "--spare",
        "5",
        "--segment-size",
        "1M",
        "--workload",
        &format!("trace:{}", shipped_trace("mariadb-oltp-30s.ftrace.gz").display()),
        "--compare",
        "salsa+greedy,salsa+fifo",
        "--inline-gc",
        "--queue-depth",
        "1",
        "--json",
        "--out",
        dir.join("report").to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let run = |i: usize| (v[i]["wa"].as_f64().unwrap(), v[i]["gc_segments_cleaned"].as_u64().unwrap());
    let ((greedy_wa, greedy_cleaned), (fifo_wa, fifo_cleaned)) = (run(0), run(1));
    assert!(greedy_cleaned > 100 && fifo_cleaned > 100, "{stdout}");
    assert!(greedy_wa > 1.05, "the GC moved live data: {stdout}");
    assert!(fifo_wa > greedy_wa * 1.1, "FIFO moves more than greedy: {stdout}");
}
