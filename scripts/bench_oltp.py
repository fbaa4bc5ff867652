#!/usr/bin/env python3
"""Databases as users run them: MariaDB under sysbench OLTP (read/write) and PostgreSQL under
pgbench (TPC-B-like), each on ext4, over SALSA and over nbdkit, each server as it comes (issue
20's application pairing).

Each target is a file of the same size in the same directory, served on a Unix socket
(`salsa serve` with its defaults: O_DIRECT and its DRAM read cache; `nbdkit file`: the page
cache), attached with nbdfuse and a loop device (direct I/O), formatted ext4 and mounted. MariaDB
keeps its data there (O_DIRECT, a small buffer pool so that reads reach the device), sysbench
prepares the tables and runs for the given time. PostgreSQL keeps its cluster there as it comes
(buffered I/O, fsync at every commit, a small shared_buffers), pgbench initialises its tables
and runs its default transaction from several clients. Rounds alternate between the targets;
every round of every database starts from a fresh file. Reports transactions per second per
round, the medians and the ratio SALSA / nbdkit, per database. With `--ceiling`, a third target,
`nbdkit memory` (RAM, flushes free), shows how much any server could gain over this client stack.

    python3 scripts/bench_oltp.py                       # both databases, 3 rounds of 60 s each
    python3 scripts/bench_oltp.py --db postgres         # pgbench only
    python3 scripts/bench_oltp.py --quick               # 1 round of 8 s, small tables (the test suite's)

Prints one JSON object; needs root (loop devices, mounts), nbdkit, MariaDB, sysbench and
PostgreSQL (scripts/install-deps.sh installs them).
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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_mixed import MariaDB, sysbench  # noqa: E402
from bench_object_store import attach_nbd, run, salsa_binary, save_report, tear_down, wait_for  # noqa: E402


class Target:
    """One server on a fresh file, attached as a mounted ext4 file system."""

    def __init__(self, kind, work, args):
        self.kind, self.args = kind, args
        self.d = tempfile.mkdtemp(prefix=kind + "-", dir=work)
        self.sock = os.path.join(self.d, "nbd.sock")
        self.control = os.path.join(self.d, "pool.ctl")
        self.image = os.path.join(self.d, "disk.img")
        self.procs, self.loop, self.fuse, self.mnt = [], None, None, None

    def start(self):
        log = open(os.path.join(self.d, "serve.log"), "w")
        if self.kind == "salsa":
            cmd = [salsa_binary(), "serve", "--no-tcp", "--unix", self.sock, "--device", "%s:%s" % (self.image, self.args.size),
                   "--control", self.control]
            uri = "nbd+unix:///default?socket=" + self.sock
        elif self.kind == "memory":
            # The ceiling: data in RAM, a flush that costs nothing. No server that stores data
            # durably can beat it over the same client stack.
            cmd = ["nbdkit", "--foreground", "--unix", self.sock, "memory", "size=%d" % parse_bytes(self.args.size)]
            uri = "nbd+unix:///?socket=" + self.sock
        else:
            with open(self.image, "wb") as f:
                f.truncate(parse_bytes(self.args.size))
            cmd = ["nbdkit", "--foreground", "--unix", self.sock, "file", self.image]
            uri = "nbd+unix:///?socket=" + self.sock
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
        wait_for(self.sock, "the NBD socket", self.procs[0])
        self.fuse = os.path.join(self.d, "fuse")
        p, self.loop = attach_nbd(self.fuse, uri, ["--direct-io=on"])
        self.procs.append(p)
        run(["mkfs.ext4", "-q", "-F", self.loop])
        self.mnt = os.path.join(self.d, "mnt")
        os.makedirs(self.mnt)
        run(["mount", self.loop, self.mnt])
        return self.mnt

    def close(self):
        try:
            tear_down(
                [self.mnt] if self.mnt else [],
                [self.loop] if self.loop else [],
                [(self.fuse, p) for p in self.procs[1:]],
                self.procs[0] if self.procs else None,
            )
        finally:
            shutil.rmtree(self.d, ignore_errors=True)


class Probe:
    """What the measured run cost around a target: the server's CPU seconds, the host's idle
    share (two cores shared by the database, its client, nbdfuse, the loop device and the
    server: a busy host makes the server's CPU per request count), and for SALSA its flushes,
    syncs and records written ahead (`salsa stats --json` on the control socket)."""

    def __init__(self, target):
        self.target = target
        self.before = self.sample()
        # Threads that end during the run (the client, PostgreSQL's backends) are seen by a
        # sampler every two seconds: each thread's last sample counts (a scan of /proc costs
        # about 25 ms of CPU; the last two seconds of a thread that ends are lost).
        self.seen, self.stop = dict(self.before[3]), threading.Event()
        self.sampler = threading.Thread(target=self.sample_threads, daemon=True)
        self.sampler.start()

    def sample_threads(self):
        while not self.stop.wait(2.0):
            self.seen.update(ticks_by_command())

    def sample(self):
        _, server_ticks = stat_ticks("/proc/%d/stat" % self.target.procs[0].pid)
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        counters = {}
        if self.target.kind == "salsa":
            out = subprocess.run([salsa_binary(), "stats", "--json", "--control", self.target.control],
                                 capture_output=True, text=True)
            if out.returncode == 0:
                j = json.loads(out.stdout)
                counters = {k: j.get(k, 0) for k in ("flushes", "syncs", "records_written_ahead")}
        return server_ticks, cpu, counters, ticks_by_command()

    def done(self):
        self.stop.set()
        self.sampler.join()
        (t0, cpu0, c0, p0), (t1, cpu1, c1, p1) = self.before, self.sample()
        p1 = {**self.seen, **p1}
        hz = os.sysconf("SC_CLK_TCK")
        total = sum(cpu1) - sum(cpu0)
        idle = (cpu1[3] + cpu1[4]) - (cpu0[3] + cpu0[4])
        out = {"server_cpu_s": round((t1 - t0) / hz, 1), "host_idle_pct": round(100.0 * idle / total, 1) if total else None}
        out.update({k: c1[k] - c0.get(k, 0) for k in c1})
        # Where the host's CPU went: the six commands that took the most.
        by = {}
        for key, ticks in p1.items():
            by[key[1]] = by.get(key[1], 0) + ticks - p0.get(key, 0)
        top = sorted(by.items(), key=lambda kv: -kv[1])[:6]
        out["cpu_s_by_command"] = {name: round(t / hz, 1) for name, t in top}
        return out


def ticks_by_command():
    """CPU ticks (user + system) of every thread on the host, by (tid, command; the kernel's
    workers under one name, as they change names with the work they take)."""
    ticks = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir("/proc/%s/task" % pid)
        except OSError:
            continue
        for tid in tids:
            try:
                comm, t = stat_ticks("/proc/%s/task/%s/stat" % (pid, tid))
            except OSError:
                continue
            ticks[(tid, "kworker" if comm.startswith("kworker/") else comm)] = t
    return ticks


def stat_ticks(path):
    """(command, user + system CPU ticks) from a /proc stat file."""
    with open(path) as f:
        text = f.read()
    fields = text.rsplit(")", 1)[1].split()
    return text[text.index("(") + 1:text.rindex(")")], int(fields[11]) + int(fields[12])


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def postgres_bin(tool):
    """A PostgreSQL server tool: Debian keeps them in /usr/lib/postgresql/VERSION/bin (the
    newest version wins), elsewhere they are on PATH."""
    versions = sorted((d for d in os.listdir("/usr/lib/postgresql") if d.isdigit()), key=int) if os.path.isdir("/usr/lib/postgresql") else []
    for v in reversed(versions):
        path = os.path.join("/usr/lib/postgresql", v, "bin", tool)
        if os.path.exists(path):
            return path
    return shutil.which(tool)


class Postgres:
    """A PostgreSQL cluster in `datadir`, run as the `postgres` user (initdb refuses root),
    listening only on a Unix socket in its own directory."""

    def __init__(self, datadir, d):
        self.datadir = datadir
        self.sockdir = os.path.join(d, "pgsock")
        self.log = os.path.join(d, "postgres.log")
        self.started = False

    def as_postgres(self, cmd):
        r = subprocess.run(["runuser", "-u", "postgres", "--"] + cmd, capture_output=True, text=True)
        if r.returncode != 0:
            log = open(self.log).read()[-2000:] if os.path.exists(self.log) else ""
            raise SystemExit("%s failed: %s%s\nserver log:\n%s" % (" ".join(cmd), r.stdout, r.stderr[-2000:], log))
        return r.stdout

    def start(self, shared_buffers):
        for path in (self.datadir, self.sockdir):
            os.makedirs(path)
            shutil.chown(path, "postgres", "postgres")
        open(self.log, "w").close()
        shutil.chown(self.log, "postgres", "postgres")
        # --no-sync: only initdb's own files skip their fsync; the server syncs as it comes.
        self.as_postgres([postgres_bin("initdb"), "--no-sync", "-U", "postgres", "-D", self.datadir])
        opts = "-k %s -c listen_addresses='' -c shared_buffers=%s -c max_connections=64" % (self.sockdir, shared_buffers)
        self.as_postgres([postgres_bin("pg_ctl"), "-D", self.datadir, "-l", self.log, "-w", "-t", "120", "-o", opts, "start"])
        self.started = True

    def pgbench(self, *args):
        return self.as_postgres([postgres_bin("pgbench"), "-h", self.sockdir, "-U", "postgres"] + list(args) + ["postgres"])

    def stop(self):
        if self.started:
            subprocess.run(["runuser", "-u", "postgres", "--", postgres_bin("pg_ctl"), "-D", self.datadir, "-m", "fast", "-w", "stop"],
                           capture_output=True)
            self.started = False


def postgres_round(target, d, args):
    db = Postgres(os.path.join(target.mnt, "pgdata"), d)
    try:
        db.start(args.shared_buffers)
        db.pgbench("-i", "-q", "-s", str(args.pg_scale))
        t = time.monotonic()
        probe = Probe(target)
        out = db.pgbench("-c", str(args.db_threads), "-j", "2", "-T", str(args.seconds))
        cost = probe.done()
        took = time.monotonic() - t
        tps = re.search(r"tps = ([\d.]+)", out)
        lat = re.search(r"latency average = ([\d.]+) ms", out)
        if tps is None:
            raise SystemExit("pgbench printed no tps: " + out[-2000:])
        return {"tps": float(tps.group(1)), "latency_ms_avg": float(lat.group(1)) if lat else None, "seconds": round(took, 1), **cost}
    finally:
        db.stop()


def mariadb_round(target, d, args):
    db = MariaDB(os.path.join(target.mnt, "data"), d)
    try:
        db.start(args.buffer_pool)
        prep = sysbench(db.sock, args, "prepare")
        out, _ = prep.communicate()
        if prep.returncode != 0:
            raise SystemExit("sysbench prepare failed: " + out[-2000:])
        probe = Probe(target)
        bench = sysbench(db.sock, args, "run", args.seconds)
        out, _ = bench.communicate()
        cost = probe.done()
        if bench.returncode != 0:
            raise SystemExit("sysbench run failed: " + out[-2000:])
        tps = float(re.search(r"transactions:\s+\d+\s+\(([\d.]+) per sec", out).group(1))
        p95 = re.search(r"95th percentile:\s+([\d.]+)", out)
        return {"tps": tps, "latency_ms_p95": float(p95.group(1)) if p95 else None, **cost}
    finally:
        db.stop()


def one_round(kind, work, args, database="mariadb"):
    """One database's run on a fresh target of `kind` (salsa or nbdkit)."""
    t = Target(kind, work, args)
    try:
        t.start()
        if database == "postgres":
            # The postgres user must reach its cluster and socket below these directories.
            for path in (work, t.d):
                os.chmod(path, 0o755)
            return postgres_round(t, t.d, args)
        return mariadb_round(t, t.d, args)
    finally:
        t.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="the file each server serves")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--table-size", type=int, default=50000)
    ap.add_argument("--db-threads", type=int, default=8)
    ap.add_argument("--buffer-pool", default="64M", help="MariaDB's InnoDB buffer pool")
    ap.add_argument("--db", choices=("mariadb", "postgres", "both"), default="both")
    ap.add_argument("--pg-scale", type=int, default=20,
                    help="pgbench's scale factor (about 15 MiB of tables per unit, and as much WAL while loading)")
    ap.add_argument("--shared-buffers", default="32MB", help="PostgreSQL's shared_buffers")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary directory in /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="1 round of 8 s on 1 GiB: 2 tables of 5000 rows, pgbench scale 2")
    ap.add_argument("--ceiling", action="store_true",
                    help="also run on `nbdkit memory` (RAM, flushes free): the most any server can give over this "
                         "client stack (nbdfuse, loop, ext4), reported as ceiling_vs_nbdkit")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.size, args.seconds, args.rounds, args.tables, args.table_size, args.pg_scale = "1G", 8, 1, 2, 5000, 2
    databases = ["mariadb", "postgres"] if args.db == "both" else [args.db]
    tools = ["nbdkit", "nbdfuse", "mkfs.ext4"]
    tools += ["mariadbd", "sysbench"] if "mariadb" in databases else []
    for tool in tools:
        if shutil.which(tool) is None:
            raise SystemExit("%s is not installed; run scripts/install-deps.sh" % tool)
    if "postgres" in databases and not all(postgres_bin(t) for t in ("initdb", "pg_ctl", "pgbench")):
        raise SystemExit("PostgreSQL (initdb, pg_ctl, pgbench) is not installed; run scripts/install-deps.sh")
    work = tempfile.mkdtemp(prefix="salsa-oltp-", dir=args.dir or "/var/tmp")
    report = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "databases": {}}
    try:
        for database in databases:
            kinds = ["salsa", "nbdkit"] + (["memory"] if args.ceiling else [])
            rounds = {k: [] for k in kinds}
            for r in range(args.rounds):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    res = one_round(kind, work, args, database)
                    rounds[kind].append(res)
                    print("[oltp] %s round %d %s: %s" % (database, r, kind, res), file=sys.stderr)
            med = {k: statistics.median(x["tps"] for x in v) for k, v in rounds.items()}
            report["databases"][database] = {
                "rounds": rounds,
                "tps_median": med,
                "salsa_vs_nbdkit": med["salsa"] / med["nbdkit"] if med["nbdkit"] else None,
            }
            if args.ceiling:
                report["databases"][database]["ceiling_vs_nbdkit"] = med["memory"] / med["nbdkit"] if med["nbdkit"] else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_report(report, args.out, None, None)
    print(json.dumps({db: {k: v for k, v in r.items() if k != "rounds"} for db, r in report["databases"].items()}))


if __name__ == "__main__":
    main()
