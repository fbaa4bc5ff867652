#!/usr/bin/env python3
"""A database as users run it: MariaDB under sysbench OLTP (read/write) on ext4, over SALSA and
over nbdkit, each served as it comes (issue 20's application pairing).

Each target is a file of the same size in the same directory, served on a Unix socket
(`salsa serve` with its defaults: O_DIRECT and its DRAM read cache; `nbdkit file`: the page
cache), attached with nbdfuse and a loop device (direct I/O), formatted ext4 and mounted; MariaDB
keeps its data there (O_DIRECT, a small buffer pool so that reads reach the device), sysbench
prepares the tables and runs for the given time. Rounds alternate between the targets; every
round starts from a fresh file. Reports transactions per second per round, the medians and the
ratio SALSA / nbdkit.

    python3 scripts/bench_oltp.py                       # 3 rounds of 60 s
    python3 scripts/bench_oltp.py --quick               # 1 round of 8 s, 2 small tables (the test suite's)

Prints one JSON object; needs root (loop devices, mounts), nbdkit, MariaDB and sysbench
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_mixed import MariaDB, sysbench  # noqa: E402
from bench_object_store import run, salsa_binary, save_report, wait_for  # noqa: E402


class Target:
    """One server on a fresh file, attached as a mounted ext4 file system."""

    def __init__(self, kind, work, args):
        self.kind, self.args = kind, args
        self.d = tempfile.mkdtemp(prefix=kind + "-", dir=work)
        self.sock = os.path.join(self.d, "nbd.sock")
        self.image = os.path.join(self.d, "disk.img")
        self.procs, self.loop, self.fuse, self.mnt = [], None, None, None

    def start(self):
        log = open(os.path.join(self.d, "serve.log"), "w")
        if self.kind == "salsa":
            cmd = [salsa_binary(), "serve", "--no-tcp", "--unix", self.sock, "--device", "%s:%s" % (self.image, self.args.size),
                   "--control", os.path.join(self.d, "pool.ctl")]
            uri = "nbd+unix:///default?socket=" + self.sock
        else:
            with open(self.image, "wb") as f:
                f.truncate(parse_bytes(self.args.size))
            cmd = ["nbdkit", "--foreground", "--unix", self.sock, "file", self.image]
            uri = "nbd+unix:///?socket=" + self.sock
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
        wait_for(self.sock, "the NBD socket", self.procs[0])
        self.fuse = os.path.join(self.d, "fuse")
        os.makedirs(self.fuse)
        p = subprocess.Popen(["nbdfuse", self.fuse, uri])
        self.procs.append(p)
        wait_for(os.path.join(self.fuse, "nbd"), "the nbdfuse node", p)
        self.loop = run(["losetup", "-f", "--show", "--direct-io=on", os.path.join(self.fuse, "nbd")]).strip()
        run(["mkfs.ext4", "-q", "-F", self.loop])
        self.mnt = os.path.join(self.d, "mnt")
        os.makedirs(self.mnt)
        run(["mount", self.loop, self.mnt])
        return self.mnt

    def close(self):
        if self.mnt:
            subprocess.run(["umount", self.mnt])
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop])
        if self.fuse:
            subprocess.run(["fusermount3", "-u", self.fuse])
        for p in self.procs[1:]:
            p.wait()
        if self.procs:
            self.procs[0].terminate()
            self.procs[0].wait()
        shutil.rmtree(self.d, ignore_errors=True)


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def one_round(kind, work, args):
    t = Target(kind, work, args)
    db = None
    try:
        mnt = t.start()
        db = MariaDB(os.path.join(mnt, "data"), t.d)
        db.start(args.buffer_pool)
        prep = sysbench(db.sock, args, "prepare")
        out, _ = prep.communicate()
        if prep.returncode != 0:
            raise SystemExit("sysbench prepare failed on %s: %s" % (kind, out[-2000:]))
        bench = sysbench(db.sock, args, "run", args.seconds)
        out, _ = bench.communicate()
        if bench.returncode != 0:
            raise SystemExit("sysbench run failed on %s: %s" % (kind, out[-2000:]))
        tps = float(re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", out).group(1))
        p95 = re.search(r"95th percentile:\s+([\d.]+)", out)
        db.stop()
        db = None
        return {"tps": tps, "latency_ms_p95": float(p95.group(1)) if p95 else None}
    finally:
        if db is not None:
            db.stop()
        t.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="the file each server serves")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--table-size", type=int, default=50000)
    ap.add_argument("--db-threads", type=int, default=8)
    ap.add_argument("--buffer-pool", default="64M")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary directory in /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="1 round of 8 s on 1 GiB, 2 tables of 5000 rows")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.size, args.seconds, args.rounds, args.tables, args.table_size = "1G", 8, 1, 2, 5000
    for tool in ("mariadbd", "sysbench", "nbdkit", "nbdfuse", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is not installed; run scripts/install-deps.sh" % tool)
    work = tempfile.mkdtemp(prefix="salsa-oltp-", dir=args.dir or "/var/tmp")
    rounds = {"salsa": [], "nbdkit": []}
    try:
        for r in range(args.rounds):
            for kind in (("salsa", "nbdkit") if r % 2 == 0 else ("nbdkit", "salsa")):
                res = one_round(kind, work, args)
                rounds[kind].append(res)
                print("[oltp] round %d %s: %.1f tps, p95 %s ms" % (r, kind, res["tps"], res["latency_ms_p95"]), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(x["tps"] for x in v) for k, v in rounds.items()}
    report = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "rounds": rounds,
        "tps_median": med,
        "salsa_vs_nbdkit": med["salsa"] / med["nbdkit"] if med["nbdkit"] else None,
    }
    save_report(report, args.out, None, None)
    print(json.dumps({"tps_median": med, "salsa_vs_nbdkit": report["salsa_vs_nbdkit"]}))


if __name__ == "__main__":
    main()
