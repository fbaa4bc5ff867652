#!/usr/bin/env python3
"""The SALSA paper's video-server case study (section V-E, Table IV, Figure 9), on this machine.

A video library on XFS (over an NBD export attached with nbdfuse and a loop device): short
video files (10 MiB), a writer adding one file per interval (fsync'd), and a pool of readers
reading whole files with O_DIRECT in 1 MiB requests, mostly from a popular subset. It runs on
three targets, each on fresh device models, in one run:

- raw:    a disk model (`hdd:`, one actuator: every access that does not continue the last
          costs a seek) served as it is (`salsa serve --raw`);
- salsa:  a SALSA pool with an LSA volume on an identical disk model;
- hybrid: a SALSA pool over the disk model and an SSD model (`ssd:`), with a hybrid volume:
          data on the disk, hot page groups copied to the SSD in the background.

SALSA's DRAM read cache is off unless --dram-cache is given: with it, both SALSA targets serve
the popular videos from memory and the comparison says nothing about the devices.

Every interval does the same work on every target (one file written, the same files read), so
throughput per modelled second compares the targets. Each interval's write and reads are
measured apart, so each device's modelled time for either is known; one modelled second of the
server is then the writer's file plus as many reads as the devices' remaining time allows, the
devices of a pool working in parallel (on one disk: what is left of the second after the write;
with the hot videos on the SSD, the SSD's speed while the disk keeps up with the rest). Every
chunk read is checked against what was written. The report has, per target and per interval,
the read and write throughput and each device's time, bytes and seeks; --svg draws read
throughput over the intervals and the hybrid's reads per device (promotion reaching its steady
state), as the paper's Figure 9.

    python3 scripts/bench_video.py                  # the benchmark
    python3 scripts/bench_video.py --quick          # a short run (the test suite's)
    python3 scripts/bench_video.py --realtime --disk-model dmsmr   # as the paper ran it

--realtime runs the models in real time (`realtime=on`) and each interval's writer beside its
readers, as the paper's server did: the result is the readers' MiB per wall-clock second, the
writer's disk traffic (on the raw SMR disk: its media cache and band cleanings) in their way.
    python3 scripts/bench_video.py --svg fig.svg --out report.json

Prints one JSON object; needs root (loop devices, mounts, dropping caches).
"""

import argparse
import json
import math
import mmap
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_object_store import save_report, xfs_over_salsa  # noqa: E402
from object_store import control_stats, parse_size  # noqa: E402

CHUNK = 1 << 20


def device_counters(ctl):
    """Per device: its counters, from a server's control socket; and the volumes' statistics."""
    stats = control_stats(ctl)
    out = {}
    for c in stats.get("device_counters", []):
        out.setdefault(c["device"], {})[c["counter"]] = c["value"]
    volumes = stats.get("volumes", [])
    return out, volumes


def content(seed):
    """The 1 MiB that every chunk of video `seed` repeats."""
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(4096)) * (CHUNK // 4096)


def write_file(path, size, seed):
    """A video file of `size` bytes, written in 1 MiB chunks and fsync'd."""
    block = content(seed)
    with open(path + ".tmp", "wb") as f:
        left = size
        while left > 0:
            n = min(left, CHUNK)
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def read_file(path, buf, expected):
    """Reads a whole file with O_DIRECT in 1 MiB requests, checking every chunk against
    `expected`; returns (bytes read, chunks that differed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    total = bad = 0
    try:
        while True:
            n = os.readv(fd, [buf])
            total += n
            if n and buf[:n] != expected[:n]:
                bad += 1
            if n < len(buf):
                break
    finally:
        os.close(fd)
    return total, bad


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run_target(name, serve_args, export, args, work):
    """Runs the workload on one target; returns its report."""
    size = parse_size(args.file_size)
    rng = random.Random(7)
    intervals = []
    with xfs_over_salsa(os.path.join(work, name), serve_args, export, ["--direct-io=on"]) as (mnt, ctl, _):
        lib = os.path.join(mnt, "videos")
        os.makedirs(lib)
        files = []
        seed_of = {}
        for i in range(args.files):
            p = os.path.join(lib, "v%05d.mp4" % i)
            write_file(p, size, i)
            files.append(p)
            seed_of[p] = i
        bad_chunks = 0
        popular = files[: max(1, len(files) * args.popular_percent // 100)]
        buffers = [mmap.mmap(-1, CHUNK) for _ in range(args.readers)]
        for k in range(args.intervals):
            drop_caches()
            started = time.monotonic()
            # The same choices on every target: the generator is seeded and drawn in order.
            picks = [rng.choice(popular) if rng.random() < args.popular_share else rng.choice(files) for _ in range(args.reads)]
            new = os.path.join(lib, "v%05d.mp4" % (args.files + k))
            read_bytes = [0] * args.readers
            bad = [0] * args.readers
            expected = {p: content(seed_of[p]) for p in set(picks)}

            def reader(r):
                for p in picks[r :: args.readers]:
                    n, wrong = read_file(p, buffers[r], expected[p])
                    read_bytes[r] += n
                    bad[r] += wrong

            threads = [threading.Thread(target=reader, args=(r,)) for r in range(args.readers)]
            c0, _ = device_counters(ctl)
            if args.realtime:
                # The writer beside the readers, on the wall clock.
                writer = threading.Thread(target=write_file, args=(new, size, args.files + k))
                t0 = time.monotonic()
                writer.start()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                read_seconds = time.monotonic() - t0
                writer.join()
                write_seconds = time.monotonic() - t0
                c1 = c0
            else:
                # The write, then the reads, each measured on its own, so that each device's
                # time for either is known (see `per_second`).
                write_file(new, size, args.files + k)
                c1, _ = device_counters(ctl)
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            files.append(new)
            seed_of[new] = args.files + k
            c2, volumes = device_counters(ctl)
            bad_chunks += sum(bad)
            devices = {}
            for dev in c2:
                devices[dev] = {
                    "write_phase": delta(c0.get(dev, {}), c1.get(dev, {})),
                    "read_phase": delta(c1.get(dev, {}), c2.get(dev, {})),
                }
            entry = {"interval": k, "read_bytes": sum(read_bytes), "written_bytes": size, "devices": devices}
            if args.realtime:
                entry["read_mib_per_second"] = sum(read_bytes) / CHUNK / read_seconds
                entry["read_seconds"] = read_seconds
                entry["write_seconds"] = write_seconds
            else:
                entry.update(per_second(devices, sum(read_bytes), size))
            hybrid = [v for v in volumes if v.get("controller") == "hybrid"]
            if hybrid:
                entry["fast_tier_bytes"] = hybrid[0].get("fast_tier_bytes", 0)
                entry["promotions"] = hybrid[0].get("promotions", 0)
            intervals.append(entry)
            # One file per interval of at least `--interval-seconds` of wall time: promotion
            # runs in the background at its own pace, as a server's would.
            rest = args.interval_seconds - (time.monotonic() - started)
            if rest > 0:
                time.sleep(rest)
        for b in buffers:
            b.close()
    metric = read_metric(args)
    steady = [i[metric] for i in intervals[len(intervals) // 2 :]]
    if args.realtime:
        # One file per interval: the writer's file done while the readers read (plus the
        # interval's pause), the disk shared with them.
        keeps_up = all(i["write_seconds"] <= i["read_seconds"] + args.interval_seconds for i in intervals)
    else:
        keeps_up = all(i["write_mib_per_model_second"] >= size / CHUNK for i in intervals)
    return {
        "intervals": intervals,
        metric: statistics.median(i[metric] for i in intervals),
        "steady_" + metric: statistics.median(steady),
        "bad_chunks": bad_chunks,
        "write_keeps_up": keeps_up,
    }


def read_metric(args):
    """The readers' throughput the report compares: per wall-clock second in real time, per
    modelled second otherwise."""
    return "read_mib_per_second" if args.realtime else "read_mib_per_model_second"


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("model_time_us", "host_read_bytes", "host_write_bytes", "seeks")}


def per_second(devices, read_bytes, written_bytes):
    """One modelled second of the server: the writer adds its file (each device spends its
    write-phase time on it), and the readers read as much as the devices' remaining time
    allows, the devices working in parallel: reads per second are `x` times the interval's
    reads, where `x` is the smallest, over the devices the reads used, of the time left after
    the write divided by the read phase's time. (On one disk: what is left of the second after
    the write, at the speed the reads went; with an SSD holding the hot data, the SSD's speed,
    as long as the disk keeps up with its share.)"""
    x = None
    write_seconds = 0.0
    for d in devices.values():
        w = d["write_phase"]["model_time_us"] / 1e6
        r = d["read_phase"]["model_time_us"] / 1e6
        write_seconds = max(write_seconds, w)
        if r > 0:
            share = max(0.0, 1.0 - w) / r
            x = share if x is None else min(x, share)
    reads_per_second = (x if x is not None else 0.0) * read_bytes
    return {
        "write_model_seconds": write_seconds,
        "read_mib_per_model_second": reads_per_second / CHUNK,
        # The writer's file per second, when the write fits in a second.
        "write_mib_per_model_second": written_bytes / CHUNK if write_seconds <= 1.0 else written_bytes / CHUNK / write_seconds,
        "device_read_mib_per_model_second": {
            dev: (x or 0.0) * d["read_phase"]["host_read_bytes"] / CHUNK for dev, d in devices.items()
        },
    }


def chart(report):
    """Figure 9: read throughput per modelled second over the intervals, per target; and the
    hybrid's bytes read per device per interval."""
    w, h, pad = 760, 300, 60
    colours = {"raw": "#888888", "salsa": "#1f77b4", "hybrid": "#d62728"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (w, 2 * h)]
    out.append('<rect width="100%" height="100%" fill="white"/>')

    def panel(y0, title, series, ylabel):
        # A logarithmic axis (as the paper's Figure 9), from 1 MiB/s to the next power of ten.
        n = max(len(s) for _, s, _ in series)
        top = max(max((v or 0) for v in s) for _, s, _ in series)
        decades = max(1, math.ceil(math.log10(max(top, 10))))
        x = lambda i: pad + (w - 2 * pad) * i / max(1, n - 1)  # noqa: E731
        y = lambda v: y0 + h - pad - (h - 2 * pad) * min(decades, max(0.0, math.log10(max(v or 0, 1)))) / decades  # noqa: E731
        out.append('<text x="%d" y="%d" font-size="14">%s</text>' % (pad, y0 + 25, title))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (pad, y0 + h - pad, w - pad, y0 + h - pad))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (pad, y0 + pad, pad, y0 + h - pad))
        for d in range(decades + 1):
            yy = y(10**d)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#dddddd"/>' % (pad, yy, w - pad, yy))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (pad - 5, yy + 4, 10**d))
        out.append('<text x="%d" y="%d">interval (one file written, the same files read)</text>' % (w / 2 - 120, y0 + h - pad + 30))
        out.append('<text x="12" y="%d" transform="rotate(-90 12 %d)">%s</text>' % (y0 + h / 2 + 60, y0 + h / 2 + 60, ylabel))
        for k, (label, s, colour) in enumerate(series):
            pts = " ".join("%.1f,%.1f" % (x(i), y(v)) for i, v in enumerate(s))
            out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (colour, pts))
            out.append('<text x="%d" y="%d" fill="%s">%s</text>' % (w - pad - 200, y0 + h - pad - 40 + 15 * k, colour, label))

    t = report["targets"]
    metric = report.get("metric", "read_mib_per_model_second")
    per = "wall-clock" if metric == "read_mib_per_second" else "modelled"
    panel(
        0,
        "Video server: read throughput per %s second" % per,
        [(name, [i[metric] for i in t[name]["intervals"]], colours[name]) for name in ("raw", "salsa", "hybrid")],
        "MiB/s (log)",
    )
    hy = t["hybrid"]["intervals"]
    if "device_read_mib_per_model_second" not in hy[0]:
        out.append("</svg>")
        return "\n".join(out) + "\n"
    devs = sorted(hy[0]["devices"])
    per_dev = []
    for j, dev in enumerate(devs):
        label = "hybrid: read from %s" % ("disk" if j == 0 else "ssd")
        per_dev.append((label, [i["device_read_mib_per_model_second"][dev] for i in hy], ["#1f77b4", "#2ca02c"][j % 2]))
    panel(h, "Hybrid: reads per device (MiB per modelled second)", per_dev, "MiB/s (log)")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--disk-size", default="6G")
    ap.add_argument(
        "--disk-model", default="hdd", choices=["hdd", "dmsmr"], help="the disk: one actuator (hdd) or a drive-managed SMR disk (dmsmr)"
    )
    ap.add_argument("--ssd-size", default="1G")
    ap.add_argument("--files", type=int, default=200, help="videos in the library at the start")
    ap.add_argument("--file-size", default="10M")
    ap.add_argument("--popular-percent", type=int, default=10, help="share of the library that is popular")
    ap.add_argument("--popular-share", type=float, default=1.0, help="share of reads that go to popular videos")
    ap.add_argument("--reads", type=int, default=16, help="videos read per interval")
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--intervals", type=int, default=40)
    ap.add_argument("--interval-seconds", type=float, default=1.0)
    ap.add_argument("--salsa-args", default="", help="more `salsa serve` options for the SALSA targets")
    ap.add_argument(
        "--dram-cache",
        action="store_true",
        help="leave SALSA's DRAM read cache on (by default it is off, so that the comparison is of placement and tiering)",
    )
    ap.add_argument("--realtime", action="store_true", help="the models in real time, the writer beside the readers (wall-clock MiB/s)")
    ap.add_argument("--quick", action="store_true", help="a short run: 2 GiB disk, 40 files, 12 intervals")
    ap.add_argument("--out")
    ap.add_argument("--svg")
    ap.add_argument("--plot", metavar="REPORT", help="only draw --svg from a report written by --out")
    args = ap.parse_args()
    if args.plot:
        with open(args.plot) as f, open(args.svg, "w") as out:
            out.write(chart(json.load(f)))
        return
    if args.quick:
        args.disk_size, args.ssd_size, args.files, args.intervals, args.reads = "2G", "512M", 40, 12, 8
    work = tempfile.mkdtemp(prefix="salsa-video-")
    extra = args.salsa_args.split() + ([] if args.dram_cache else ["--read-cache", "0"])
    try:
        live = ",realtime=on" if args.realtime else ""
        disk = lambda name: "%s:size=%s,file=%s%s" % (args.disk_model, args.disk_size, os.path.join(work, name + ".disk"), live)  # noqa: E731
        ssd = "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(work, "hybrid.ssd"), live)
        targets = {
            "raw": (["--raw", "--device", disk("raw")], "raw"),
            "salsa": (["--device", disk("salsa")] + extra, "default"),
            "hybrid": (["--device", disk("hybrid"), "--device", ssd, "--controller", "hybrid"] + extra, "default"),
        }
        report = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "svg")}, "targets": {}}
        for name, (serve_args, export) in targets.items():
            report["targets"][name] = run_target(name, serve_args, export, args, work)
        t = report["targets"]
        metric = report["metric"] = read_metric(args)
        report["ratio_read_vs_raw"] = {n: t[n][metric] / t["raw"][metric] for n in ("salsa", "hybrid")}
        report["ratio_steady_read_vs_raw"] = {n: t[n]["steady_" + metric] / t["raw"]["steady_" + metric] for n in ("salsa", "hybrid")}
        report["write_keeps_up"] = {n: t[n]["write_keeps_up"] for n in t}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_report(report, args.out, args.svg, chart)
    summary = {k: report[k] for k in ("ratio_read_vs_raw", "ratio_steady_read_vs_raw", "write_keeps_up")}
    summary["bad_chunks"] = {n: t["bad_chunks"] for n, t in report["targets"].items()}
    summary["steady_" + metric] = {n: t["steady_" + metric] for n, t in report["targets"].items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
