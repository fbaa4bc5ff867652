#!/usr/bin/env python3
"""Inline compression (issue 71), side by side in one run.

Setups, each on a fresh pool file (or a fresh `ssd:` model in real time with --ssd SIZE):
  plain  SALSA volume of --page-size pages (default 16 KiB), no compression (the baseline)
  zstd   the same volume compressing with zstd at --level (default 1), of --compressed-page-size
         pages (default: --page-size; 64K compresses better, a larger unit)
  lz4    the same compressing with lz4 (with --lz4)
  btrfs  `salsa serve --raw` of the same device, btrfs mounted with compress=zstd:LEVEL
         (the file system's own compression over the raw device; this kernel has btrfs)

Workloads:
  pgbench   PostgreSQL's TPC-B-like transactions on ext4 over the SALSA setups (btrfs: on the
            raw device); tps, device bytes written per transaction, stored / logical bytes
  sysbench  MariaDB under sysbench oltp_read_write, the same figures (--db mariadb|both)
  fio       16 KiB random writes at QD 16 through the NBD engine on the SALSA volumes (no file
            system), buffer_compress_percentage 0, 50 and 75: throughput and device bytes per
            user byte, each against the plain volume's

SALSA's servers keep a write buffer of 64 MiB (far less than fio writes over, so that pages
reach the log, and the compressor, which runs as they are destaged, during the run); fio ends
with a flush. Device bytes are what reached the device: SALSA's device_bytes_written (data, GC moves,
metadata), or for the raw device what the loop device wrote. Stored / logical: SALSA's
volume stored_bytes / mapped_bytes; btrfs's from compsize (disk usage / uncompressed) over
the mount.

    python3 scripts/bench_compression.py                     # everything, 2G files, 60 s
    python3 scripts/bench_compression.py --quick             # a short run (the test suite's)
    python3 scripts/bench_compression.py --ssd 2G --db postgres
    python3 scripts/bench_compression.py --db postgres --no-fio --no-btrfs --rounds 3

Prints one JSON object; needs root (loop devices, mounts), PostgreSQL, MariaDB, sysbench, fio,
btrfs-progs and compsize (scripts/install-deps.sh installs them).
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_mixed import MariaDB, sysbench  # noqa: E402
from bench_object_store import attach_nbd, run, salsa_binary, save_report, tear_down, wait_for  # noqa: E402
from bench_oltp import Postgres  # noqa: E402


def loop_bytes_written(loop):
    with open("/sys/block/%s/stat" % os.path.basename(loop)) as f:
        return int(f.read().split()[6]) * 512


class Setup:
    """One setup on a fresh device: a SALSA pool with one volume (`compression` off, lz4 or
    zstd:LEVEL), or the raw device for btrfs. `attach()` gives a block device (nbdfuse and a
    loop device) for a file system; `uri` is the NBD export for fio."""

    def __init__(self, name, work, args):
        self.name, self.args = name, args
        self.d = tempfile.mkdtemp(prefix=name + "-", dir=work)
        self.sock = os.path.join(self.d, "nbd.sock")
        self.ctl = os.path.join(self.d, "pool.ctl")
        if args.ssd:
            self.device = "ssd:size=%s,block=256K,realtime=on,file=%s" % (args.ssd, os.path.join(self.d, "ssd.img"))
        else:
            self.device = "%s:%s" % (os.path.join(self.d, "disk.img"), args.size)
        self.server = self.fuse = self.loop = self.mnt = None
        self.fuse_dir = os.path.join(self.d, "fuse")
        self.raw = name == "btrfs"
        self.export = "raw" if self.raw else "db"

    def start(self):
        salsa = salsa_binary()
        serve = [salsa, "serve", "--no-tcp", "--unix", self.sock, "--control", self.ctl]
        if self.raw:
            serve += ["--raw", "--device", self.device]
        else:
            run([salsa, "format", "--no-default-volume", "--device", self.device])
            info = run([salsa, "info", "--device", self.device])
            logical = int(re.search(r"^logical\s+.*?\((\d+) bytes", info, re.M).group(1))
            size = logical * 9 // 10 // (1 << 20) << 20
            comp = {"plain": "off", "zstd": "zstd:%d" % self.args.level, "lz4": "lz4"}[self.name]
            page = self.args.page_size if self.name == "plain" else self.args.compressed_page_size or self.args.page_size
            run([salsa, "volume", "create", "--device", self.device, "db", str(size), "--page-size", page,
                 "--compression", comp])
            # A write buffer far smaller than what fio writes over, so that its pages reach the
            # log (and the compressor, which runs as they are destaged) during the run.
            serve += ["--device", self.device, "--write-buffer", "64M"]
        log = open(os.path.join(self.d, "serve.log"), "w")
        self.server = subprocess.Popen(serve, stdout=log, stderr=log)
        wait_for(self.sock, "the NBD socket", self.server)
        self.uri = "nbd+unix:///%s?socket=%s" % (self.export, self.sock)

    def attach(self, fs):
        self.fuse, self.loop = attach_nbd(self.fuse_dir, self.uri, ["--direct-io=on"])
        self.mnt = os.path.join(self.d, "mnt")
        os.makedirs(self.mnt)
        if fs == "btrfs":
            run(["mkfs.btrfs", "-q", "-f", self.loop])
            run(["mount", "-o", "compress=zstd:%d" % self.args.level, self.loop, self.mnt])
        else:
            run(["mkfs.ext4", "-q", "-F", "-E", "nodiscard", self.loop])
            run(["mount", self.loop, self.mnt])
        for path in (self.d, self.mnt):
            os.chmod(path, 0o755)
        return self.mnt

    def stats(self):
        """(device bytes written, stored bytes, logical bytes) now."""
        if self.raw:
            dev = loop_bytes_written(self.loop) if self.loop else 0
            stored = logical = None
            if self.mnt and shutil.which("compsize"):
                out = subprocess.run(["compsize", "-b", self.mnt], capture_output=True, text=True).stdout
                m = re.search(r"^TOTAL\s+\d+%\s+(\d+)\s+(\d+)", out, re.M)
                if m:
                    stored, logical = int(m.group(1)), int(m.group(2))
            return dev, stored, logical
        s = json.loads(run([salsa_binary(), "stats", "--json", "--control", self.ctl]))
        vol = next(v for v in s["volumes"] if v["name"] == "db")
        return s["device_bytes_written"], vol["stored_bytes"], vol["mapped_bytes"]

    def close(self):
        try:
            tear_down([self.mnt] if self.mnt and os.path.ismount(self.mnt) else [], [self.loop] if self.loop else [],
                      [(self.fuse_dir, self.fuse)] if self.fuse else [], self.server)
        finally:
            shutil.rmtree(self.d, ignore_errors=True)


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def measure(setup, before, work_done):
    dev, stored, logical = setup.stats()
    return {
        "device_bytes": dev - before,
        "device_bytes_per_unit": round((dev - before) / work_done, 3) if work_done else None,
        "stored_bytes": stored,
        "logical_bytes": logical,
        "stored_over_logical": ratio(stored, logical),
    }


def pgbench_run(setup, args):
    fs = "btrfs" if setup.raw else "ext4"
    db = Postgres(os.path.join(setup.attach(fs), "pgdata"), setup.d)
    try:
        db.start("32MB")
        db.pgbench("-i", "-q", "-s", str(args.pg_scale))
        before = setup.stats()[0]
        out = db.pgbench("-c", "8", "-j", "2", "-T", str(args.seconds))
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
        lat = re.search(r"latency average = ([\d.]+) ms", out)
        transactions = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
        db.stop()
        run(["sync"])
        return {"tps": tps, "latency_ms_avg": float(lat.group(1)) if lat else None, "transactions": transactions,
                **measure(setup, before, transactions)}
    finally:
        db.stop()


def sysbench_run(setup, args):
    fs = "btrfs" if setup.raw else "ext4"
    db = MariaDB(os.path.join(setup.attach(fs), "data"), setup.d)
    try:
        db.start("64M")
        prep = sysbench(db.sock, args, "prepare")
        out, _ = prep.communicate()
        if prep.returncode != 0:
            raise SystemExit("sysbench prepare failed: " + out[-2000:])
        before = setup.stats()[0]
        bench = sysbench(db.sock, args, "run", args.seconds)
        out, _ = bench.communicate()
        if bench.returncode != 0:
            raise SystemExit("sysbench run failed: " + out[-2000:])
        m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", out)
        transactions, tps = int(m.group(1)), float(m.group(2))
        p95 = re.search(r"95th percentile:\s+([\d.]+)", out)
        db.stop()
        run(["sync"])
        return {"tps": tps, "latency_ms_p95": float(p95.group(1)) if p95 else None, "transactions": transactions,
                **measure(setup, before, transactions)}
    finally:
        db.stop()


def fio_run(setup, args, percent):
    before = setup.stats()[0]
    out = run(["fio", "--name=c", "--ioengine=nbd", "--uri=" + setup.uri, "--rw=randwrite", "--bs=16k", "--iodepth=16",
               "--size=%dM" % args.fio_mib, "--time_based", "--runtime=%d" % args.fio_seconds, "--refill_buffers",
               "--end_fsync=1",
               "--buffer_compress_percentage=%d" % percent, "--buffer_compress_chunk=4k", "--output-format=json"])
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    user = job["io_bytes"]
    return {"buffer_compress_percentage": percent, "iops": round(job["iops"], 1), "user_bytes": user,
            "latency_us_p99": job["clat_ns"]["percentile"].get("99.000000", 0) // 1000,
            **measure(setup, before, user)}


def one(name, work, args, workload, percent=None):
    s = Setup(name, work, args)
    try:
        s.start()
        if workload == "pgbench":
            return pgbench_run(s, args)
        if workload == "sysbench":
            return sysbench_run(s, args)
        return fio_run(s, args, percent)
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="each setup's file")
    ap.add_argument("--ssd", default=None, help="an ssd: model of this size in real time instead of a file")
    ap.add_argument("--seconds", type=int, default=60, help="each database run")
    ap.add_argument("--level", type=int, default=1, help="zstd's level, for SALSA and btrfs alike")
    ap.add_argument("--page-size", default="16K", help="the SALSA volumes' page (the unit compressed; up to 64K)")
    ap.add_argument("--compressed-page-size", default=None, help="the compressing volumes' page, if not --page-size")
    ap.add_argument("--lz4", action="store_true", help="also a volume compressing with lz4")
    ap.add_argument("--db", choices=("postgres", "mariadb", "both", "none"), default="both")
    ap.add_argument("--pg-scale", type=int, default=30)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--table-size", type=int, default=100000)
    ap.add_argument("--db-threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each database workload (medians reported)")
    ap.add_argument("--btrfs", action=argparse.BooleanOptionalAction, default=True, help="the btrfs setup")
    ap.add_argument("--fio", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--fio-seconds", type=int, default=20)
    ap.add_argument("--fio-mib", type=int, default=512, help="the range fio writes over")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--quick", action="store_true", help="1G files, 8 s runs, small databases")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.size, args.seconds, args.pg_scale, args.tables, args.table_size = "1G", 8, 4, 2, 5000
        args.fio_seconds, args.fio_mib = 5, 256
    for tool in ["nbdfuse", "mkfs.ext4", "mkfs.btrfs", "fio"]:
        if shutil.which(tool) is None:
            raise SystemExit("%s is not installed; run scripts/install-deps.sh" % tool)
    setups = ["plain", "zstd"] + (["lz4"] if args.lz4 else [])
    work = tempfile.mkdtemp(prefix="salsa-compression-", dir=args.dir or "/var/tmp")
    os.chmod(work, 0o755)  # the postgres user reaches its cluster below it
    report = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "workloads": {}}
    try:
        dbs = {"both": ["pgbench", "sysbench"], "postgres": ["pgbench"], "mariadb": ["sysbench"], "none": []}[args.db]
        order = setups + (["btrfs"] if args.btrfs else [])
        for w, workload in enumerate(dbs):
            rounds = {name: [] for name in order}
            for r in range(args.rounds):
                # Each round of each workload starts from another setup (the host's disk slows
                # after bursts, and the machine's load drifts).
                k = (w + r) % len(order)
                for name in order[k:] + order[:k]:
                    rounds[name].append(one(name, work, args, workload))
                    print("[compression] %s round %d %s: %s" % (workload, r + 1, name, rounds[name][-1]), file=sys.stderr)
            # Each setup's median round by tps, with every round's tps beside it.
            res = {}
            for name, runs in rounds.items():
                res[name] = dict(sorted(runs, key=lambda x: x["tps"])[len(runs) // 2])
                res[name]["tps_rounds"] = [x["tps"] for x in runs]
            plain = res["plain"]
            res["ratios"] = {n: {"tps": ratio(statistics.median(res[n]["tps_rounds"]), statistics.median(plain["tps_rounds"])),
                                 "tps_per_round": [ratio(a["tps"], b["tps"]) for a, b in zip(rounds[n], rounds["plain"])],
                                 "device_bytes_per_transaction": ratio(res[n]["device_bytes_per_unit"], plain["device_bytes_per_unit"])}
                             for n in order if n != "plain"}
            report["workloads"][workload] = res
        if args.fio:
            for i, percent in enumerate((0, 50, 75)):
                res = {}
                # Alternate the order: the host's disk slows after a burst of writes, which
                # would otherwise always fall on the same setup.
                for name in (setups if i % 2 == 0 else setups[::-1]):
                    res[name] = one(name, work, args, "fio", percent)
                    print("[compression] fio %d%% %s: %s" % (percent, name, res[name]), file=sys.stderr)
                res["ratios"] = {n: {"iops": ratio(res[n]["iops"], res["plain"]["iops"]),
                                     "device_bytes_per_user_byte": ratio(res[n]["device_bytes_per_unit"],
                                                                         res["plain"]["device_bytes_per_unit"])}
                                 for n in setups[1:]}
                report["workloads"]["fio_%d" % percent] = res
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_report(report, args.out, None, None)
    print(json.dumps({w: r["ratios"] for w, r in report["workloads"].items()}))


if __name__ == "__main__":
    main()
