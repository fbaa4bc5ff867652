#!/usr/bin/env python3
"""The SALSA paper's containerized MySQL experiment (section V-B, Table IIa, Fig. 6a), with its
protocol, on this machine.

Several MariaDB servers (the paper's four containers), each with its own database on its own
ext4 volume, run sysbench `oltp_read_write` at once on one commodity SSD model that keeps real
time (`ssd:...,realtime=on`: every request waits for the flash operations it causes), so the
figures are sysbench's own wall-clock transactions per second and latencies. Two setups, fresh
models for each, alternating over the rounds:

- raw:   the model served as it is (`salsa serve --raw`); the databases get partitions (loop
         devices at offsets) of SALSA's logical size split evenly (80% of the segments SALSA
         lays out on the model, found by formatting a scratch model), the rest of the drive
         never written;
- salsa: a SALSA pool with the default controller (one user and one GC stream, `--placement
         user-gc`, the paper's user/GC segregation; volumes of 16 KiB pages, InnoDB's, with
         `--page-size 16K`) and 20% spare on the model, served with the
         server's defaults (its write buffer; no read cache, which the raw drive does not have
         either). As the paper ("in this device we create one (logical) volume per MySQL
         instance"): one SALSA volume, split into one region per database of the same size as
         the raw partitions (`--salsa-layout one-volume`, the default), so the databases share
         SALSA's streams as they share the raw drive's write frontier; `--salsa-layout
         per-instance` gives each database a SALSA volume of its own instead.

Preconditioning, as the paper's section V-A prepares a drive, and through the same exports the
databases then use: every database's device written whole once in order (1 MiB writes), then
once more in a uniformly random order of 4 KiB blocks (every block once), with a flush after
every MiB so that no write buffer can sort the random pass. On the raw drive that writes its
partitions; on SALSA its volumes, so the drive sees what SALSA writes for them (its segments,
its GC), and SALSA's pool is as full as the paper's.

Both setups make their file systems with `mkfs.ext4 -b 4096 -E nodiscard`, so that making a
file system does not unmap what the preconditioning wrote (and with the 4 KiB blocks mkfs
gives large volumes). Each round: the databases are created with
`sysbench prepare` (on the device in real time, as the paper's images were placed on it), then
sysbench runs for the measured time in every instance at once, reporting every second
(Fig. 6). The report gives per setup and round each instance's tps, average and 95th
percentile latency, the SSD's write amplification over the measured phase, what each
transaction cost the drive (requests, bytes, flash programs, its GC's moves) and SALSA (user,
GC, metadata bytes), and medians over the rounds; `--svg` draws throughput over time of the
last round.

The drive's erase blocks are scaled with it (`--ssd-params block=256K`): the paper's SALSA wrote
segments "at the GiB level" on drives whose erase blocks are a few MiB, so a segment spanned
hundreds of them; on a 2 GiB model SALSA's segments must stay near 1/128 of the drive (16 MiB)
to leave its GC enough of them, and the model's own 1 MiB blocks (8 MiB stripes over 8
channels) would make a segment two stripes, half its data in blocks it shares with the
segments written before and after it (docs/BENCHMARKS.md, "Erase blocks scaled with the drive").

Scaled to this machine (2 cores, 24 GiB), see docs/RESULTS.md: a 2 GiB drive instead of 1 TB,
four instances of 4 tables x 150,000 rows (about 145 MiB each, with the redo log about 60% of a volume) instead of 160 GiB, two sysbench
threads each instead of four, a 32 MiB buffer pool each.

    python3 scripts/bench_sysbench_ssd.py                 # 3 rounds, 120 s measured
    python3 scripts/bench_sysbench_ssd.py --quick         # a short run (the test suite's)
    python3 scripts/bench_sysbench_ssd.py --raid5         # Table IIb: a 3+1 RAID-5 of four models

Prints one JSON object; needs root (loop devices, mounts), MariaDB and sysbench
(scripts/install-deps.sh installs them).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_mixed  # noqa: E402
from bench_mixed import MariaDB, device  # noqa: E402
from bench_object_store import run, salsa_binary, save_report, umount, wait_for  # noqa: E402
from object_store import control_stats  # noqa: E402

MIB = 1 << 20


class Setup(bench_mixed.Setup):
    """One setup on a fresh SSD model: serves it, attaches one block device per database
    (`bench_mixed.Setup.attach`), and takes everything down (`close`)."""

    def __init__(self, name, work, args):
        super().__init__(name, work, args)
        self.ssds = model_specs(args, self.d)
        # Each database's share of SALSA's logical size (`salsa_logical_bytes`), in whole MiB.
        self.volume_bytes = args.logical_bytes // args.instances // MIB * MIB

    def serve(self):
        salsa = salsa_binary()
        timing = ",realtime=on" if self.args.realtime else ""
        devices = device_args(self.ssds)
        if self.name == "raw":
            serve = [salsa, "serve", "--raw"] + device_args(self.ssds, timing)
            if self.args.raid5:
                serve += ["--in-place-raid5", self.args.raid5_chunk]
        else:
            run([salsa, "format"] + devices + format_args(self.args)
                + (["--victim", self.args.victim] if self.args.victim else []))
            for name, size in self.salsa_volumes():
                run([salsa, "volume", "create"] + devices + [name, str(size)]
                    + (["--placement", self.args.placement] if self.args.placement else [])
                    + (["--page-size", self.args.page_size] if self.args.page_size else []))
            # The device's own cache would hide what the setups change; MariaDB has its own.
            serve = [salsa, "serve"] + device_args(self.ssds, timing) + ["--read-cache", "0"]
            if self.args.write_buffer != "default":
                serve += ["--write-buffer", self.args.write_buffer]
        serve += ["--no-tcp", "--unix", self.sock, "--control", self.ctl]
        log = open(os.path.join(self.d, "serve.log"), "w")
        self.procs.append(subprocess.Popen(serve, stdout=log, stderr=log))
        wait_for(self.sock, "the NBD socket", self.procs[0], timeout=300)
        wait_for(self.ctl, "the control socket", self.procs[0], timeout=300)

    def salsa_volumes(self):
        """SALSA's volumes: (name, bytes)."""
        n, size = self.args.instances, self.volume_bytes
        if self.args.salsa_layout == "one-volume":
            return [("dbs", n * size)]
        return [("db%d" % i, size) for i in range(n)]

    def targets(self):
        """Each database's device as an NBD export: (export, offset in it)."""
        n, size = self.args.instances, self.volume_bytes
        if self.name == "raw":
            return [("raw", i * size) for i in range(n)]
        if self.args.salsa_layout == "one-volume":
            return [("dbs", i * size) for i in range(n)]
        return [("db%d" % i, 0) for i in range(n)]

    def precondition_targets(self):
        """What `bench_mixed.Setup.precondition` writes (section V-A's preconditioning, through
        the exports the databases then use): every database's device, its random pass in
        --precondition-bs blocks."""
        return [(export, offset, self.volume_bytes, self.args.precondition_bs) for export, offset in self.targets()]

    def devices(self):
        """A block device per database, over its export (`targets`)."""
        if self.name == "raw" or self.args.salsa_layout == "one-volume":
            return [self.attach(export, offset, self.volume_bytes) for export, offset in self.targets()]
        return [self.attach(export) for export, _ in self.targets()]


def sysbench(sock, args, command):
    cmd = ["sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-socket=" + sock, "--mysql-user=root",
           "--mysql-db=sbtest", "--tables=%d" % args.tables, "--table-size=%d" % args.table_size]
    if command == "run":
        cmd += ["--threads=%d" % args.threads, "--time=%d" % args.seconds, "--report-interval=1", "--percentile=95"]
    else:
        cmd += ["--threads=%d" % min(args.tables, 4)]
    return subprocess.run(cmd + [command], capture_output=True, text=True)


def parse_run(out):
    """sysbench's run output: transactions per second, average and 95th percentile latency
    (ms), queries, and the per-second series of transactions per second."""
    def number(pattern):
        m = re.search(pattern, out)
        if m is None:
            raise SystemExit("sysbench output without %r:\n%s" % (pattern, out[-3000:]))
        return float(m.group(1))
    series = [float(x) for x in re.findall(r"^\[ *\d+s \].*? tps: ([\d.]+)", out, re.M)]
    return {
        "tps": number(r"transactions:\s+\d+\s+\(([\d.]+) per sec"),
        "transactions": int(number(r"transactions:\s+(\d+)")),
        "latency_ms_avg": number(r"avg:\s+([\d.]+)"),
        "latency_ms_p95": number(r"95th percentile:\s+([\d.]+)"),
        "errors": int(number(r"ignored errors:\s+(\d+)")),
        "tps_series": series,
    }


def in_parallel(fns):
    """Runs each function on its own thread; returns their results in order (re-raising the
    first failure)."""
    results, errors = [None] * len(fns), []

    def one(i, f):
        try:
            results[i] = f()
        except BaseException as e:  # noqa: BLE001 (re-raised below, on the caller's thread)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, f)) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def model_specs(args, directory):
    """The SSD models of a setup, in `directory`: one, or with --raid5 the array's members."""
    params = "," + args.ssd_params if args.ssd_params else ""
    count = args.raid5_members if args.raid5 else 1
    return ["ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(directory, "ssd%d.img" % i), params)
            for i in range(count)]


def device_args(specs, suffix=""):
    return [x for spec in specs for x in ("--device", spec + suffix)]


def format_args(args):
    """`salsa format`'s options for SALSA's pool (the scratch pool that finds its size too)."""
    return (["--spare", "20", "--no-default-volume", "--segment-size", args.segment_size]
            + (["--array", "raid5"] if args.raid5 else [])
            + (["--placement", args.placement] if args.placement else []))


def salsa_logical_bytes(args):
    """SALSA's logical size on the model at 20% spare with the chosen segments (`salsa info`'s
    `logical`: 80% of the segments the pool lays out, less what its open segments and GC
    reserve take). The raw partitions get the same size, as the paper's equal logical size."""
    return bench_mixed.scratch_logical_bytes(lambda work: device_args(model_specs(args, work)), format_args(args))


def run_setup(name, work, args):
    s = Setup(name, work, args)
    dbs = []
    try:
        s.serve()
        took = s.precondition() if args.precondition else {}
        devs = s.devices()
        mounts = []
        for i, dev in enumerate(devs):
            mnt = os.path.join(s.d, "mnt%d" % i)
            os.makedirs(mnt)
            run(args.mkfs.split() + [dev])
            run(["mount", dev, mnt])
            s.mounts.append(mnt)
            mounts.append(mnt)
        for i, mnt in enumerate(mounts):
            d = os.path.join(s.d, "db%d" % i)
            os.makedirs(d)
            db = MariaDB(os.path.join(mnt, "data"), d)
            dbs.append(db)
            db.start(args.buffer_pool)
        prepared = in_parallel([lambda db=db: sysbench(db.sock, args, "prepare") for db in dbs])
        for p in prepared:
            if p.returncode != 0:
                raise SystemExit("sysbench prepare failed: " + (p.stdout + p.stderr)[-2000:])
        before = control_stats(s.ctl)
        runs = in_parallel([lambda db=db: sysbench(db.sock, args, "run") for db in dbs])
        after = control_stats(s.ctl)
        instances = []
        for p in runs:
            if p.returncode != 0:
                raise SystemExit("sysbench run failed: " + (p.stdout + p.stderr)[-2000:])
            instances.append(parse_run(p.stdout))
        # Every row is still there: each table holds what prepare inserted (oltp_read_write
        # deletes and inserts the same ids).
        for db in dbs:
            for t in range(1, args.tables + 1):
                r = run(["mariadb", "--no-defaults", "-S", db.sock, "-u", "root", "-N", "-e",
                         "SELECT COUNT(*) FROM sbtest.sbtest%d" % t])
                if int(r.strip()) != args.table_size:
                    raise SystemExit("table sbtest%d holds %s rows, not %d" % (t, r.strip(), args.table_size))
        for db in dbs:
            db.stop()
        dbs = []
        dev0, dev1 = device(before), device(after)
        host_w = dev1.get("host_write_bytes", 0) - dev0.get("host_write_bytes", 0)
        media_w = dev1.get("nand_program_bytes", 0) - dev0.get("nand_program_bytes", 0)
        transactions = sum(i["transactions"] for i in instances)

        def per_transaction(counter, stats=(dev0, dev1)):
            return (stats[1].get(counter, 0) - stats[0].get(counter, 0)) / max(transactions, 1)

        report = {
            "instances": instances,
            # What each transaction cost the drive: the requests it saw and what it wrote.
            "ssd_per_transaction": {c: per_transaction(c) for c in (
                "host_writes", "host_write_bytes", "host_flushes", "nand_program_bytes", "nand_map_program_bytes",
                "read_modify_write_units", "gc_moved_bytes", "discarded_bytes")},
            "tps_total": sum(i["tps"] for i in instances),
            "latency_ms_avg": statistics.mean(i["latency_ms_avg"] for i in instances),
            "latency_ms_p95": statistics.mean(i["latency_ms_p95"] for i in instances),
            "ssd_host_write_bytes": host_w,
            "ssd_write_amplification": media_w / host_w if host_w else None,
            "precondition_seconds": took,
        }
        if name != "raw":
            report["gc_bytes_relocated"] = after["gc_bytes_relocated"] - before["gc_bytes_relocated"]
            report["user_bytes_written"] = after.get("user_bytes_written", 0) - before.get("user_bytes_written", 0)
            report["salsa_per_transaction"] = {c: per_transaction(c, (before, after)) for c in (
                "user_bytes_written", "gc_bytes_relocated", "metadata_bytes_written", "pad_bytes_written", "device_bytes_written",
                "flushes", "syncs", "records_written_ahead")}
        # The file systems must be clean.
        for mnt in list(reversed(s.mounts)):
            umount(mnt)
            s.mounts.remove(mnt)
        for dev in devs:
            run(["xfs_repair", "-n", dev] if "xfs" in args.mkfs else ["e2fsck", "-fn", dev])
        return report
    finally:
        for db in dbs:
            db.stop()
        s.close()


def chart(report):
    """Fig. 6a: every instance's transactions per second over the measured time, last round."""
    last = report["rounds"][-1]
    w, h, left, top, bottom = 720, 320, 50, 30, 40
    series = [(setup, i, inst["tps_series"]) for setup, r in last.items() for i, inst in enumerate(r["instances"])]
    peak = max((max(s) for _, _, s in series if s), default=1) or 1
    length = max((len(s) for _, _, s in series), default=1) or 1
    colors = {"raw": "#9e9e9e", "salsa": "#1f77b4"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h)]
    out.append('<rect width="100%" height="100%" fill="white"/>')
    where = "a 3+1 RAID-5 of SSD models" if report["config"].get("raid5") else "one SSD model"
    out.append('<text x="%d" y="18" font-size="13">sysbench oltp_read_write per instance on %s in real time: tps over time</text>' % (left, where))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, h - bottom, w - 10, h - bottom))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (left, top, left, h - bottom))
    out.append('<text x="5" y="%d">%.0f</text>' % (top + 4, peak))
    out.append('<text x="%d" y="%d">%d s</text>' % (w - 40, h - bottom + 14, length))
    for setup, _, s in series:
        pts = " ".join("%.1f,%.1f" % (left + (w - 10 - left) * k / max(length - 1, 1), h - bottom - (h - top - bottom) * v / peak)
                       for k, v in enumerate(s))
        out.append('<polyline fill="none" stroke="%s" stroke-width="1" points="%s"/>' % (colors.get(setup, "black"), pts))
    for k, setup in enumerate(colors):
        out.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (left + k * 120, h - 18, colors[setup]))
        out.append('<text x="%d" y="%d">%s</text>' % (left + 14 + k * 120, h - 9, setup))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ssd-size", help="the model's size (default 2G; --quick: 1G)")
    ap.add_argument("--ssd-params", default="block=256K",
                    help="more parameters of the ssd: model (default block=256K: erase blocks scaled with the "
                         "drive, so that a SALSA segment spans many stripes as the paper's GiB segments did; "
                         "'' for the model's own 1 MiB at 2 GiB)")
    ap.add_argument("--raid5", action="store_true",
                    help="Table IIb: the databases on a 3+1 RAID-5 of four ssd: models of --ssd-size each (default 1G): "
                         "raw is an in-place RAID-5 over them (salsa serve --raw --in-place-raid5: read-modify-write "
                         "of data and parity, as Linux MD, which this kernel lacks), SALSA a RAID-5 pool "
                         "(full-row writes); SALSA's segments default to 24M (8 MiB, four 2 MiB stripes, on each member)")
    ap.add_argument("--raid5-members", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--raid5-chunk", default="64K", help="the in-place RAID-5's chunk (bench-raid's default)")
    ap.add_argument("--placement", default="user-gc",
                    help="SALSA's placement policy for the volumes (salsa volume create --placement; default "
                         "user-gc: one user stream and one GC stream, the paper's user/GC segregation. SALSA's "
                         "hot/cold user streams (salsa) interleave two slowly filled segments in the drive's one "
                         "write frontier, whose erase blocks then hold data that dies at different times: 0.76x "
                         "against 1.12x raw in Table IIa, docs/BENCHMARKS.md)")
    ap.add_argument("--victim", help="SALSA's GC victim policy (salsa format --victim)")
    ap.add_argument("--page-size", default="16K",
                    help="the page of SALSA's volumes (salsa volume create --page-size; default 16K, InnoDB's page "
                         "and the drive's: a database page read is one read of one drive page, where 4 KiB pages "
                         "scattered by the log cost up to four, and flushed records end on the drive's pages; "
                         "4K: 85.7 against 108.8 tps in one run of Table IIa, docs/BENCHMARKS.md)")
    ap.add_argument("--segment-size",
                    help="SALSA's segments (salsa format --segment-size; default 16M, with --raid5 24M). Scaled with the drive: the paper's 1 GiB "
                         "segments are a thousandth of its 1 TB drive and its few streams hold under 1%% of it. "
                         "16 MiB is eight stripes (an erase block on each of the model's channels) of the default "
                         "256 KiB blocks: a segment of few stripes shares its end stripes with its neighbours and "
                         "the drive's own GC moves what SALSA wrote (docs/BENCHMARKS.md)")
    ap.add_argument("--salsa-layout", choices=("one-volume", "per-instance"), default="one-volume",
                    help="the databases on one SALSA volume split into regions, as the paper's logical volumes on "
                         "its SALSA device (default), or on a SALSA volume each")
    ap.add_argument("--instances", type=int, help="MariaDB instances (default 4; --quick: 2)")
    ap.add_argument("--tables", type=int, help="sysbench tables per database (default 4; --quick: 2)")
    ap.add_argument("--table-size", type=int, help="rows per table (default 150000: with InnoDB's redo log about 60%% of a volume, the paper's databases filled most of theirs; --quick: 5000)")
    ap.add_argument("--threads", type=int, default=2, help="sysbench threads per instance")
    ap.add_argument("--buffer-pool", help="InnoDB buffer pool per instance (default 32M; --quick: 16M)")
    ap.add_argument("--seconds", type=int, help="measured seconds (default 120; --quick: 15)")
    ap.add_argument("--write-buffer", default="default",
                    help="SALSA's write buffer (salsa serve --write-buffer SIZE, 0: off; default: the server's own, "
                         "an eighth of the machine's memory; the preconditioning flushes every MiB, so it cannot "
                         "sort the random pass)")
    ap.add_argument("--precondition-bs", help="block size of the random preconditioning pass (default 4k; --quick: 64k)")
    ap.add_argument("--rounds", type=int, help="rounds, setups alternating (default 3; --quick: 1)")
    ap.add_argument("--setups", default="raw,salsa")
    ap.add_argument("--precondition", action=argparse.BooleanOptionalAction, default=True,
                    help="precondition the drive as section V-A does (--no-precondition: a fresh drive)")
    ap.add_argument("--realtime", action=argparse.BooleanOptionalAction, default=True,
                    help="the model keeps real time (--no-realtime: at the host's speed)")
    ap.add_argument("--quick", action="store_true", help="a short run: 1 GiB SSD, 2 instances, 15 s, one round, the random preconditioning in 64 KiB blocks (options given explicitly are kept)")
    ap.add_argument("--mkfs", default="mkfs.ext4 -q -F -b 4096 -E nodiscard",
                    help="how each database's file system is made (without discards: they would unmap what "
                         "preconditioning wrote; 4 KiB blocks, which mkfs gives the paper's 200 GB volumes, not the "
                         "1 KiB it picks under 512 MiB)")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs, the drive images)")
    ap.add_argument("--out")
    ap.add_argument("--svg")
    args = ap.parse_args()
    defaults = dict(ssd_size="1G" if args.raid5 else "2G", segment_size="24M" if args.raid5 else "16M",
                    instances=4, tables=4, table_size=150000, seconds=120, rounds=3,
                    buffer_pool="32M", precondition_bs="4k")
    if args.quick:
        defaults.update(ssd_size="512M" if args.raid5 else "1G", instances=2, tables=2, table_size=5000, seconds=15, rounds=1,
                        buffer_pool="16M", precondition_bs="64k")
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for tool in ("mariadbd", "mariadb-install-db", "sysbench", "nbdfuse", "mkfs.ext4", "e2fsck"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is not installed; run scripts/install-deps.sh" % tool)
    setups = args.setups.split(",")
    args.logical_bytes = salsa_logical_bytes(args)
    report = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "svg")}, "rounds": []}
    for r in range(args.rounds):
        # Alternating order, so that neither setup always runs on a warmer machine.
        order = setups if r % 2 == 0 else list(reversed(setups))
        results = {}
        for name in order:
            work = tempfile.mkdtemp(prefix="salsa-sysbench-")
            try:
                results[name] = run_setup(name, work, args)
            finally:
                if args.keep:
                    print("kept %s" % work, file=sys.stderr)
                else:
                    shutil.rmtree(work, ignore_errors=True)
            print("round %d %s: %.1f tps, p95 %.1f ms" % (r + 1, name, results[name]["tps_total"], results[name]["latency_ms_p95"]),
                  file=sys.stderr)
        report["rounds"].append({n: results[n] for n in setups})
    med = {n: {k: statistics.median(r[n][k] for r in report["rounds"]) for k in ("tps_total", "latency_ms_avg", "latency_ms_p95")}
           for n in setups}
    report["median"] = med
    if "raw" in med and "salsa" in med:
        report["salsa_vs_raw"] = {
            "tps": med["salsa"]["tps_total"] / med["raw"]["tps_total"],
            "latency_avg_lower": med["raw"]["latency_ms_avg"] / med["salsa"]["latency_ms_avg"],
            "latency_p95_lower": med["raw"]["latency_ms_p95"] / med["salsa"]["latency_ms_p95"],
            "tps_ratio_per_round": [r["salsa"]["tps_total"] / r["raw"]["tps_total"] for r in report["rounds"]],
        }
    save_report(report, args.out, args.svg, chart)
    print(json.dumps({k: report[k] for k in ("median", "salsa_vs_raw") if k in report}))


if __name__ == "__main__":
    main()
