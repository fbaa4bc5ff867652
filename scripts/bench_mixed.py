#!/usr/bin/env python3
"""The SALSA paper's mixed-workload case study (section V-D, Table III), on this machine, with
the protocol of its application experiments.

Two applications share one SSD: MariaDB under sysbench OLTP (read/write) and an object server
PUTting 128 KiB objects the way Swift does (scripts/object_store.py), each on XFS aligned to the
pages of SALSA's tailored volumes (16 KiB and 64 KiB stripe units; the same on every setup). Each runs on
its own block device attached with nbdfuse and a loop device; the SSD is the `ssd:` model, fresh
for each of three setups, in one run:

- raw:          the model served raw (`salsa serve --raw`), split into two partitions (loop
                devices at offsets);
- salsa-single: a SALSA pool on the model with two LSA volumes of 4 KiB pages (one controller
                configuration for both, as partitions would be);
- salsa-dual:   a SALSA pool on the model with an LSA volume of 16 KiB pages (InnoDB's page)
                for the database and a dual-mapping volume for the objects.

The protocol (section V-A, as scripts/bench_sysbench_ssd.py runs Table IIa): a 2 GiB `ssd:`
model with its erase blocks scaled with it (256 KiB) that keeps real time (`realtime=on`, so the
applications' own wall-clock figures are the result); equal logical size (SALSA's logical
capacity at 20% spare with 16 MiB segments, found by formatting a scratch model, split between
the database, 40%, and the objects; the raw partitions get the same sizes and the rest of the
drive is never written); every device preconditioned through the export the application then
uses (written whole once in order, once in a uniformly random order of blocks with a flush
every MiB: 16 KiB on the database's device and 64 KiB on the objects', the units their file
systems are aligned to, on every setup; 4 KiB random writes into the dual-mapping volume, which
maps 4 KiB writes in a bounded sparse map and merges them into its large pages, ran its GC at
a write amplification of 12.8 for over 17 minutes); file systems made without discards (`mkfs.xfs -K`), so that they do not unmap what
the preconditioning wrote. SALSA's LSA volumes use one user and one GC stream (`--placement
user-gc`, the paper's user/GC segregation, as in Table IIa). `--no-protocol` gives the earlier
run: a fresh 4 GiB model in modelled time, fixed sizes, no preconditioning.

Both applications run at once for the same wall time (the object server PUTs and DELETEs, so that
its store stops growing and the volumes reach a steady state of overwrites); the report gives, per setup, sysbench
transactions and object MiB per wall second (and per second of the SSD model's modelled time),
the SSD's own write amplification, and for SALSA the map memory, the bytes a checkpoint of the
maps takes on the device (metadata capacity) and the GC's relocation traffic during the run.

    python3 scripts/bench_mixed.py                # the benchmark
    python3 scripts/bench_mixed.py --quick        # a short run (the test suite's)

Prints one JSON object; needs root (loop devices, mounts) and MariaDB and sysbench
(scripts/install-deps.sh installs them).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_object_store import run, salsa_binary, save_report, tear_down, umount, wait_for  # noqa: E402
from object_store import control_stats, parse_size  # noqa: E402


def device(stats):
    out = {}
    for c in stats.get("device_counters", []):
        out[c["counter"]] = out.get(c["counter"], 0) + c["value"]
    return out


class Setup:
    """Serves one setup, attaches its two block devices, and takes everything down."""

    def __init__(self, name, work, args):
        self.name, self.args = name, args
        self.d = os.path.join(work, name)
        os.makedirs(self.d)
        self.procs, self.loops, self.mounts, self.fuses = [], [], [], []
        self.ctl = os.path.join(self.d, "pool.ctl")
        self.sock = os.path.join(self.d, "nbd.sock")
        params = "," + args.ssd_params if args.ssd_params else ""
        self.spec = "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(self.d, "ssd.img"), params)

    def serve(self):
        salsa = salsa_binary()
        db, objects = parse_size(self.args.db_size), parse_size(self.args.objects_size)
        timing = ",realtime=on" if self.args.protocol else ""
        serve = [salsa, "serve", "--no-tcp", "--unix", self.sock, "--control", self.ctl, "--device", self.spec + timing]
        if self.name == "raw":
            serve.append("--raw")
        else:
            run([salsa, "format", "--device", self.spec] + format_args(self.args))
            db_page = "16K" if self.name == "salsa-dual" else "4K"
            run([salsa, "volume", "create", "--device", self.spec, "db", str(db), "--page-size", db_page] + placement_args(self.args))
            controller = ["--controller", "dual"] if self.name == "salsa-dual" else placement_args(self.args)
            run([salsa, "volume", "create", "--device", self.spec, "objects", str(objects)] + controller)
            # The device's own cache would hide what the setups change; MariaDB has its own.
            serve += ["--read-cache", "0"]
        log = open(os.path.join(self.d, "serve.log"), "w")
        self.procs.append(subprocess.Popen(serve, stdout=log, stderr=log))
        wait_for(self.sock, "the NBD socket", self.procs[0])
        wait_for(self.ctl, "the control socket", self.procs[0])

    def attach(self, export, offset=None, size=None):
        fuse_dir = os.path.join(self.d, "fuse-" + export + ("" if offset is None else "-%d" % offset))
        node = os.path.join(fuse_dir, "nbd")
        if not os.path.exists(node):
            os.makedirs(fuse_dir, exist_ok=True)
            p = subprocess.Popen(["nbdfuse", fuse_dir, "nbd+unix:///%s?socket=%s" % (export, self.sock)])
            self.procs.append(p)
            self.fuses.append((fuse_dir, p))
            wait_for(node, "the nbdfuse node", p)
        cmd = ["losetup", "-f", "--show", "--direct-io=on"]
        if offset is not None:
            cmd += ["--offset", str(offset), "--sizelimit", str(size)]
        loop = run(cmd + [node]).strip()
        self.loops.append(loop)
        return loop

    def targets(self):
        """The database's and the objects' devices as NBD exports: (export, offset, bytes)."""
        db, objects = parse_size(self.args.db_size), parse_size(self.args.objects_size)
        if self.name == "raw":
            return [("raw", 0, db), ("raw", db, objects)]
        return [("db", 0, db), ("objects", 0, objects)]

    def precondition_targets(self):
        """What `precondition` writes: each device of `targets` with the block of its random
        pass (--precondition-bs: the database's, the objects')."""
        return [t + (bs,) for t, bs in zip(self.targets(), self.args.precondition_bs.split(","))]

    def precondition(self):
        """Section V-A's preconditioning through the exports the applications then use, every
        device of `precondition_targets` at once: written whole in order (1 MiB writes), then
        once more in a uniformly random order of its blocks with a flush every MiB (so that no
        write buffer can sort it). On the raw drive that writes its partitions (the rest stays
        never written); on SALSA its volumes, so the drive sees SALSA's segments and GC. Then
        flushed: what a server buffered reaches the drive before anything is measured. Returns
        the seconds each pass took."""
        took = {}
        for name, rw, depth in (("sequential", "write", 4), ("random", "randwrite", 32)):
            cmd = ["fio", "--output-format=json", "--ioengine=nbd", "--rw=" + rw, "--iodepth=%d" % depth,
                   "--randrepeat=0", "--end_fsync=1"]
            for export, offset, size, random_bs in self.precondition_targets():
                bs = "1M" if rw == "write" else random_bs
                cmd += ["--name=%s-%s-%d" % (name, export, offset), "--uri=nbd+unix:///%s?socket=%s" % (export, self.sock),
                        "--offset=%d" % offset, "--size=%d" % size, "--bs=" + bs, "--fsync=%d" % ((1 << 20) // parse_size(bs))]
            out = run(cmd)
            jobs = json.loads(out[out.index("{"):])["jobs"]
            took[name] = max(j["job_runtime"] for j in jobs) / 1000.0
        return took

    def devices(self):
        """(database device, objects device)."""
        if self.name == "raw":
            return tuple(self.attach(export, offset, size) for export, offset, size in self.targets())
        return self.attach("db"), self.attach("objects")

    def mount(self, dev, mkfs, where):
        os.makedirs(where)
        run(mkfs.split() + [dev])
        run(["mount", dev, where])
        self.mounts.append(where)

    def close(self):
        tear_down(list(reversed(self.mounts)), self.loops, self.fuses, self.procs[0] if self.procs else None)


class MariaDB:
    def __init__(self, datadir, d):
        self.datadir, self.sock = datadir, os.path.join(d, "mysql.sock")
        self.log = os.path.join(d, "mariadb.err")
        # A temporary directory of its own: with the shared /tmp, mariadb-install-db once
        # aborted in CI on a temporary table someone else had removed ("Could not remove
        # temporary table '/tmp/#sql-temptable-...', error: 2"), another run's or a cleaner's.
        self.tmpdir = os.path.join(d, "mariadb-tmp")
        self.proc = None

    def start(self, buffer_pool):
        os.makedirs(self.tmpdir, exist_ok=True)
        run(["mariadb-install-db", "--no-defaults", "--user=root", "--datadir=" + self.datadir,
             "--tmpdir=" + self.tmpdir, "--auth-root-authentication-method=normal", "--skip-test-db"])
        self.proc = subprocess.Popen([
            "mariadbd", "--no-defaults", "--user=root", "--datadir=" + self.datadir, "--socket=" + self.sock,
            "--tmpdir=" + self.tmpdir,
            "--pid-file=" + self.sock + ".pid", "--skip-networking", "--log-error=" + self.log,
            "--innodb-buffer-pool-size=" + buffer_pool, "--innodb-log-file-size=64M", "--innodb-flush-method=O_DIRECT",
        ])
        deadline = time.monotonic() + 120
        while True:
            r = subprocess.run(["mariadb", "--no-defaults", "-S", self.sock, "-u", "root", "-e", "CREATE DATABASE IF NOT EXISTS sbtest"],
                               capture_output=True)
            if r.returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("mariadbd did not start: " + open(self.log).read()[-2000:])
            time.sleep(0.5)

    def stop(self):
        """Shuts the server down, and kills it when it does not go within two minutes (a
        server stuck on a corrupt page must not outlive the run and hold its mount)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                subprocess.run(["mariadb-admin", "--no-defaults", "-S", self.sock, "-u", "root", "shutdown"],
                               capture_output=True, timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sysbench(sock, args, command, seconds=0):
    cmd = ["sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-socket=" + sock, "--mysql-user=root",
           "--mysql-db=sbtest", "--tables=%d" % args.tables, "--table-size=%d" % args.table_size]
    if command == "run":
        cmd += ["--threads=%d" % args.db_threads, "--time=%d" % seconds, "--report-interval=0"]
    return subprocess.Popen(cmd + [command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def format_args(args):
    """`salsa format`'s options for SALSA's pool (the scratch pool that finds its size too)."""
    if not args.protocol:
        return ["--no-default-volume"]
    return ["--no-default-volume", "--spare", "20", "--segment-size", args.segment_size] + placement_args(args)


def placement_args(args):
    return ["--placement", args.placement] if args.protocol and args.placement else []


def salsa_logical_bytes(args):
    """SALSA's logical capacity on the model: the raw partitions and SALSA's volumes together
    get that much."""
    params = "," + args.ssd_params if args.ssd_params else ""
    return scratch_logical_bytes(
        lambda work: ["--device", "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(work, "ssd.img"), params)],
        format_args(args))


def scratch_logical_bytes(devices_in, format_options):
    """A pool's logical capacity (`salsa info`'s `logical`), found by formatting scratch
    devices: `devices_in(directory)` gives their `--device` arguments in a temporary directory,
    `format_options` the rest of `salsa format`'s."""
    work = tempfile.mkdtemp(prefix="salsa-logical-size-")
    try:
        devices = devices_in(work)
        salsa = salsa_binary()
        run([salsa, "format"] + devices + format_options)
        info = run([salsa, "info"] + devices)
        m = re.search(r"^logical\s+.*\((\d+) bytes", info, re.M)
        if not m:
            raise SystemExit("cannot read the pool's logical capacity from salsa info:\n" + info)
        return int(m.group(1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_setup(name, work, args):
    s = Setup(name, work, args)
    db = None
    try:
        s.serve()
        took = s.precondition() if args.protocol else {}
        db_dev, obj_dev = s.devices()
        db_mnt, obj_mnt = os.path.join(s.d, "db"), os.path.join(s.d, "objects")
        s.mount(db_dev, args.db_mkfs, db_mnt)
        s.mount(obj_dev, args.objects_mkfs, obj_mnt)
        db = MariaDB(os.path.join(db_mnt, "data"), s.d)
        db.start(args.buffer_pool)
        prep = sysbench(db.sock, args, "prepare")
        out, _ = prep.communicate()
        if prep.returncode != 0:
            raise SystemExit("sysbench prepare failed: " + out[-2000:])
        before = control_stats(s.ctl)
        bench = sysbench(db.sock, args, "run", args.seconds)
        objects = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "object_store.py"), "--dir", obj_mnt, "--objects", str(args.objects), "--sizes", args.object_size,
             "--mix", args.object_mix, "--threads", str(args.object_threads), "--seconds", str(args.seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        bench_out, _ = bench.communicate()
        obj_out, obj_err = objects.communicate()
        after = control_stats(s.ctl)
        if bench.returncode != 0:
            raise SystemExit("sysbench run failed: " + bench_out[-2000:])
        if objects.returncode != 0:
            raise SystemExit("object workload failed: " + obj_err[-2000:])
        m = re.search(r"transactions:\s+(\d+)", bench_out)
        transactions = int(m.group(1))
        obj = json.loads(obj_out.strip().splitlines()[-1])
        db.stop()
        db = None
        dev0, dev1 = device(before), device(after)
        model_seconds = (dev1.get("model_time_us", 0) - dev0.get("model_time_us", 0)) / 1e6
        host_w = dev1.get("host_write_bytes", 0) - dev0.get("host_write_bytes", 0)
        media_w = dev1.get("nand_program_bytes", 0) - dev0.get("nand_program_bytes", 0)
        report = {
            "transactions": transactions,
            "object_ops": obj["ops"],
            "object_bytes": obj["bytes_written"],
            "object_errors": len(obj["errors"]),
            "model_seconds": model_seconds,
            "tps_per_model_second": transactions / model_seconds if model_seconds else None,
            "object_mib_per_model_second": obj["bytes_written"] / (1 << 20) / model_seconds if model_seconds else None,
            "tps_wall": transactions / args.seconds,
            "object_mib_per_wall_second": obj["bytes_written"] / (1 << 20) / args.seconds,
            "ssd_write_amplification": media_w / host_w if host_w else None,
            "ssd_host_write_bytes": host_w,
            "precondition_seconds": took,
        }
        if name != "raw":
            vols = after.get("volumes", [])
            report["map_memory_bytes"] = sum(v["map_memory_bytes"] for v in vols)
            report["checkpoint_image_bytes"] = sum(v.get("checkpoint_image_bytes", 0) for v in vols)
            report["gc_bytes_relocated"] = after["gc_bytes_relocated"] - before["gc_bytes_relocated"]
            report["volumes"] = {v["name"]: {k: v.get(k) for k in ("controller", "page_bytes", "map_memory_bytes", "checkpoint_image_bytes")} for v in vols}
        # The file systems must be clean.
        for mnt in list(reversed(s.mounts)):
            umount(mnt)
            s.mounts.remove(mnt)
        for dev, mkfs in ((db_dev, args.db_mkfs), (obj_dev, args.objects_mkfs)):
            run(["xfs_repair", "-n", dev] if "xfs" in mkfs else ["e2fsck", "-fn", dev])
        return report
    finally:
        if db is not None:
            db.stop()
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", action=argparse.BooleanOptionalAction, default=True,
                    help="the paper's protocol: the model in real time, equal logical size, preconditioning "
                         "(--no-protocol: a fresh 4 GiB model in modelled time, fixed sizes)")
    ap.add_argument("--ssd-size", help="the model's size (default 2G; --no-protocol 4G)")
    ap.add_argument("--ssd-params", help="more parameters of the ssd: model (default block=256K under the protocol: "
                                         "erase blocks scaled with the drive, as in Table IIa)")
    ap.add_argument("--segment-size", default="16M", help="SALSA's segments under the protocol (as in Table IIa)")
    ap.add_argument("--placement", default="user-gc",
                    help="placement of SALSA's LSA volumes under the protocol (one user and one GC stream)")
    ap.add_argument("--db-share", type=float, default=0.4, help="the database's share of the logical size under the protocol")
    ap.add_argument("--precondition-bs", default="16k,64k",
                    help="blocks of the random preconditioning pass on the database's and the objects' devices "
                         "(default 16k,64k: the units their file systems are aligned to, InnoDB's pages and the "
                         "dual-mapping volume's large pages; the same on every setup)")
    ap.add_argument("--db-size", help="the database's device (default: its share of SALSA's logical size; --no-protocol 1280M)")
    ap.add_argument("--objects-size", help="the objects' device (default: the rest of SALSA's logical size; --no-protocol 2G)")
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--table-size", type=int, default=50000)
    ap.add_argument("--db-threads", type=int, default=8)
    ap.add_argument("--buffer-pool", default="128M")
    ap.add_argument("--object-size", default="128K")
    ap.add_argument("--objects", type=int, help="objects PUT before the timed phase (default 3000, about 40%% of the objects' "
                                                "device under the protocol; --no-protocol 2000)")
    ap.add_argument("--object-mix", help="the object workload's operations (default put:1,delete:1 under the protocol: the "
                                         "store stays at its size and its device sees a steady state of overwrites; "
                                         "--no-protocol put:3,delete:2)")
    # The same file systems on every setup, aligned to the pages SALSA's tailored volumes use
    # (a file system cannot learn them through the loop device): InnoDB's 16 KiB pages, the
    # dual-mapping volume's 64 KiB large pages.
    # Without discards (-K), which would unmap what the preconditioning wrote.
    ap.add_argument("--db-mkfs", default="mkfs.xfs -q -f -K -d su=16k,sw=1")
    ap.add_argument("--objects-mkfs", default="mkfs.xfs -q -f -K -d su=64k,sw=1")
    ap.add_argument("--object-threads", type=int, default=16)
    ap.add_argument("--setups", default="raw,salsa-single,salsa-dual")
    ap.add_argument("--quick", action="store_true", help="a short run: 20 s, small tables")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.tables, args.table_size, args.buffer_pool = 20, 2, 10000, "64M"
        args.objects = args.objects or 200
        if not args.protocol:
            args.ssd_size, args.db_size, args.objects_size = "3G", "1G", "1536M"
    if args.objects is None:
        args.objects = 3000 if args.protocol else 2000
    if args.object_mix is None:
        args.object_mix = "put:1,delete:1" if args.protocol else "put:3,delete:2"
    if args.ssd_size is None:
        # A quick run too: mkfs.xfs with a 16 KiB stripe unit refuses a file system under about
        # 600 MiB, and the database gets 40% of about 1.6 GiB.
        args.ssd_size = "2G" if args.protocol else "4G"
    if args.ssd_params is None:
        args.ssd_params = "block=256K" if args.protocol else ""
    if args.protocol:
        mib = 1 << 20
        logical = salsa_logical_bytes(args)
        args.logical_bytes = logical
        if args.db_size is None:
            args.db_size = str(int(logical * args.db_share) // mib * mib)
        if args.objects_size is None:
            args.objects_size = str((logical - parse_size(args.db_size)) // mib * mib)
    else:
        args.db_size, args.objects_size = args.db_size or "1280M", args.objects_size or "2G"
    for tool in ("mariadbd", "mariadb-install-db", "sysbench", "nbdfuse", "mkfs.xfs", "mkfs.ext4", "fio"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is not installed; run scripts/install-deps.sh" % tool)
    work = tempfile.mkdtemp(prefix="salsa-mixed-")
    report = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "setups": {}}
    try:
        for name in args.setups.split(","):
            report["setups"][name] = run_setup(name, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    st = report["setups"]
    # In real time the applications' own (wall-clock) figures are the result; in modelled time
    # the device's cost of the work.
    rates = ("tps_wall", "object_mib_per_wall_second") if args.protocol else ("tps_per_model_second", "object_mib_per_model_second")
    if "raw" in st:
        report["vs_raw"] = {
            n: {k: st[n][k] / st["raw"][k] for k in rates if st[n][k] and st["raw"][k]}
            for n in st if n != "raw"
        }
    if "salsa-single" in st and "salsa-dual" in st:
        single, dual = st["salsa-single"], st["salsa-dual"]
        report["dual_vs_single"] = {
            k: dual[k] / single[k] for k in ("map_memory_bytes", "checkpoint_image_bytes", "gc_bytes_relocated") + rates
            if single.get(k)
        }
    save_report(report, args.out, None, None)
    print(json.dumps({k: report[k] for k in ("vs_raw", "dual_vs_single") if k in report}))


if __name__ == "__main__":
    main()
