#!/usr/bin/env python3
"""RocksDB on three setups of one SSD model, side by side in one run (issue 70; the AMF
paper's ALSM case study, section 6):

- ext4-raw:   RocksDB on ext4 on the raw `ssd:` model (what users run today; the AMF paper's
              baseline), served with `salsa serve --raw`, attached with nbdfuse and a loop
              device of SALSA's logical size (the rest of the drive is never written);
- ext4-salsa: RocksDB on ext4 on an LSA volume of a SALSA pool on the model;
- amf-plugin: RocksDB on an AMF volume of a SALSA pool on the model, through the plugin
              (plugins/rocksdb: each file in segments of its own, trimmed whole on delete).

Protocol (the SALSA paper's section V-A, as the other application experiments run it): a
fresh model per setup that keeps real time (`realtime=on`, so RocksDB's own wall-clock figures
are the result), preconditioned (`precondition=on`: the drive's whole capacity written once in
order and once in a uniformly random order of its units before the run); equal logical size
(SALSA's logical capacity at 20% spare, found by formatting a scratch model: the raw loop
device and the LSA volume get it, and the AMF volume twice as many addresses over the same pool,
since each file takes whole segments); every setup starts from the same drive
state, and the application from an empty file system or file store (SALSA's volumes are not
written before: the AMF volume could only be written through RocksDB, and filling the LSA
volume alone handed its setup a drive already rewritten in SALSA's order); ext4 made without
discards.
RocksDB reads with O_DIRECT on ext4 (`--direct`), so that its block cache, a fraction of the
database, is the only cache on every setup (the plugin's pool keeps SALSA's default read cache
of 64 MiB).

The workloads run in one process per setup (plugins/rocksdb/kvbench.cc): db_bench's fillrandom,
overwrite, readrandom and readwhilewriting, and YCSB A, B, C, D and F over 4 KiB values, each
for the same wall time, but fillrandom and overwrite, which write every key once (the same
work on every setup, so that what the drive wears for it compares). The report gives per setup and phase ops/s and p99 latency; the bytes
RocksDB wrote (flushes, compactions, WAL), the bytes SALSA wrote to the drive, and inside the
model the host bytes, flash programs and block erasures over the whole run; the map memory of
SALSA's volume beside a page map of the same volume.

    python3 scripts/bench_rocksdb.py              # the experiment (about 25 minutes)
    python3 scripts/bench_rocksdb.py --quick      # a short run

Prints one JSON object; needs root (loop devices, mounts), fio and RocksDB's headers
(scripts/install-deps.sh installs them).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_mixed import device, scratch_logical_bytes  # noqa: E402
from bench_object_store import attach_nbd, run, salsa_binary, save_report, tear_down, wait_for  # noqa: E402
from object_store import control_stats, parse_size  # noqa: E402

SETUPS = ("ext4-raw", "ext4-salsa", "amf-plugin")
PHASES = "fillrandom,overwrite,readrandom,readwhilewriting,ycsb-a,ycsb-b,ycsb-c,ycsb-d,ycsb-f"


def build_tools(work):
    """The plugin (scripts/build-rocksdb-plugin.sh) and the workload driver."""
    plugin = run(["bash", os.path.join(HERE, "build-rocksdb-plugin.sh")]).strip().splitlines()[-1]
    kvbench = os.path.join(work, "kvbench")
    run(["c++", "-std=c++17", "-O2", "-pthread", "-o", kvbench, os.path.join(ROOT, "plugins/rocksdb/kvbench.cc"), "-lrocksdb"])
    return os.path.join(ROOT, plugin), kvbench


def plugin_device_counters(counters):
    """Model counters summed by name from the plugin's report (`device.NAME.COUNTER` keys), as
    bench_mixed.device sums a server's `device_counters`."""
    out = {}
    for k, v in counters.items():
        if k.startswith("device."):
            name = k.rsplit(".", 1)[1]
            out[name] = out.get(name, 0) + v
    return out


def kvbench_cmd(kvbench, db, args, uri=None):
    cmd = [kvbench, "--db", db, "--keys", str(args.keys), "--value", "4096", "--cache", str(parse_size(args.cache)),
           "--threads", str(args.threads), "--seconds", str(args.seconds), "--phases", PHASES]
    if uri:
        cmd += ["--uri", uri]
    else:
        cmd += ["--direct", "1"]
    return cmd


def parse_kvbench(out):
    phases, rocksdb = {}, {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if "phase" in j:
            phases[j["phase"]] = {k: j[k] for k in ("ops_per_sec", "p50_us", "p99_us", "p999_us", "ops", "seconds")}
        else:
            rocksdb = j
    return phases, rocksdb


class Setup:
    def __init__(self, name, work, args, logical):
        self.name, self.args, self.logical = name, args, logical
        self.d = os.path.join(work, name)
        os.makedirs(self.d)
        self.procs, self.loops, self.mounts, self.fuses = [], [], [], []
        self.ctl = os.path.join(self.d, "pool.ctl")
        self.sock = os.path.join(self.d, "nbd.sock")
        self.spec = "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(self.d, "ssd.img"), "," + args.ssd_params if args.ssd_params else "")
        self.timed = self.spec + ",realtime=on,precondition=on"

    def format(self, volume, extra):
        salsa = salsa_binary()
        run([salsa, "format", "--device", self.spec, "--no-default-volume", "--spare", "20", "--segment-size", self.args.segment_size])
        run([salsa, "volume", "create", "--device", self.spec, volume, str(self.logical)] + extra)

    def serve(self, raw):
        cmd = [salsa_binary(), "serve", "--no-tcp", "--unix", self.sock, "--control", self.ctl, "--device", self.timed]
        cmd += ["--raw"] if raw else ["--read-cache", "0"]
        log = open(os.path.join(self.d, "serve.log"), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log))
        wait_for(self.sock, "the NBD socket", self.procs[0], timeout=600)
        wait_for(self.ctl, "the control socket", self.procs[0], timeout=600)

    def attach(self, export):
        fuse_dir = os.path.join(self.d, "fuse")
        p, loop = attach_nbd(fuse_dir, "nbd+unix:///%s?socket=%s" % (export, self.sock),
                             ["--direct-io=on", "--sizelimit", str(self.logical)])
        self.procs.append(p)
        self.fuses.append((fuse_dir, p))
        self.loops.append(loop)
        return loop

    def mount(self, dev):
        where = os.path.join(self.d, "mnt")
        os.makedirs(where)
        run(["mkfs.ext4", "-q", "-E", "nodiscard", "-F", dev])
        run(["mount", dev, where])
        self.mounts.append(where)
        return where

    def close(self):
        tear_down(list(reversed(self.mounts)), self.loops, self.fuses, self.procs[0] if self.procs else None)


def run_ext4(setup, kvbench, args):
    raw = setup.name == "ext4-raw"
    if not raw:
        setup.format("db", [])
    setup.serve(raw)
    export = "raw" if raw else "db"
    mnt = setup.mount(setup.attach(export))
    before = control_stats(setup.ctl)
    out = run(kvbench_cmd(kvbench, os.path.join(mnt, "db"), args))
    run(["sync"])
    after = control_stats(setup.ctl)
    report = measured(parse_kvbench(out), device(before), device(after))
    if not raw:
        report["salsa_device_bytes_written"] = after["device_bytes_written"] - before["device_bytes_written"]
        report["salsa_gc_bytes_relocated"] = after["gc_bytes_relocated"] - before["gc_bytes_relocated"]
        vol = next(v for v in after["volumes"] if v["name"] == "db")
        report["map_memory_bytes"] = vol["map_memory_bytes"]
    return report


def run_plugin(setup, plugin, kvbench, args):
    # Twice the logical size as address space (thin: the pool's space is the same): each file
    # takes whole segments, and a compaction's outputs live beside its inputs, so RocksDB needs
    # more addresses than bytes (the first full run ran out of 16 MiB segments at 201 in use).
    setup.logical *= 2
    setup.format("kv", ["--controller", "amf", "--segment", args.amf_segment])
    setup.logical //= 2
    report_path = os.path.join(setup.d, "plugin-report.json")
    env = dict(os.environ, LD_PRELOAD=plugin, SALSA_FS_DEVICES=setup.timed, SALSA_FS_REPORT=report_path)
    out = run(kvbench_cmd(kvbench, "db", args, uri="salsa://kv"), env=env)
    with open(report_path) as f:
        pr = json.load(f)
    report = measured(parse_kvbench(out), plugin_device_counters(pr["at_open"]), plugin_device_counters(pr["at_close"]))
    report["salsa_device_bytes_written"] = pr["at_close"]["device_bytes_written"] - pr["at_open"]["device_bytes_written"]
    report["salsa_gc_bytes_relocated"] = pr["at_close"]["gc_bytes_relocated"] - pr["at_open"]["gc_bytes_relocated"]
    report["map_memory_bytes"] = pr["at_close"]["volume.kv.map_memory_bytes"]
    report["files"] = pr["files"]
    return report


def measured(kv, dev0, dev1):
    phases, rocksdb = kv

    def diff(k):
        return dev1.get(k, 0) - dev0.get(k, 0)

    written = sum(rocksdb.values())
    return {
        "phases": phases,
        "rocksdb_bytes_written": written,
        "erases_per_rocksdb_gib": diff("block_erases") / (written / (1 << 30)) if written else None,
        "rocksdb": rocksdb,
        "ssd_host_write_bytes": diff("host_write_bytes"),
        "ssd_nand_program_bytes": diff("nand_program_bytes"),
        "ssd_block_erases": diff("block_erases"),
        "ssd_model_seconds": diff("model_time_us") / 1e6,
    }


def ratios(report):
    base = report["setups"].get("ext4-raw")
    out = {}
    if not base:
        return out
    for name in SETUPS[1:]:
        s = report["setups"].get(name)
        if not s:
            continue
        r = {ph: round(s["phases"][ph]["ops_per_sec"] / base["phases"][ph]["ops_per_sec"], 3)
             for ph in s["phases"] if base["phases"].get(ph, {}).get("ops_per_sec")}
        if base["ssd_block_erases"]:
            r["erases"] = round(s["ssd_block_erases"] / base["ssd_block_erases"], 3)
        if base.get("erases_per_rocksdb_gib"):
            r["erases_per_rocksdb_gib"] = round(s["erases_per_rocksdb_gib"] / base["erases_per_rocksdb_gib"], 3)
        out[name + "/ext4-raw"] = r
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short run (smaller drive and database, 3 s phases)")
    ap.add_argument("--ssd-size", default="4G")
    ap.add_argument("--ssd-params", default="block=1M", help="extra `ssd:` parameters (default: 1 MiB erase blocks)")
    ap.add_argument("--segment-size", default="16M", help="SALSA's segment size")
    ap.add_argument("--amf-segment", default="8M", help="the AMF volume's segment size (a file's unit of space)")
    ap.add_argument("--keys", type=int, default=200000,
                    help="keys of 4 KiB values (default: 800 MB, a quarter of the logical size: compactions need room)")
    ap.add_argument("--cache", default="64M", help="RocksDB's block cache")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60, help="wall time of each phase but fillrandom")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--json", "--out", dest="json", help="also write the report here")
    args = ap.parse_args()
    if args.quick:
        args.ssd_size, args.keys, args.seconds, args.segment_size, args.amf_segment = "1G", 40000, 3, "4M", "4M"
    if os.geteuid() != 0:
        raise SystemExit("needs root (loop devices and mounts)")
    work = tempfile.mkdtemp(prefix="salsa-rocksdb-")
    try:
        plugin, kvbench = build_tools(work)
        params = "," + args.ssd_params if args.ssd_params else ""
        logical = scratch_logical_bytes(
            lambda w: ["--device", "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(w, "ssd.img"), params)],
            ["--no-default-volume", "--spare", "20", "--segment-size", args.segment_size])
        logical -= logical % parse_size(args.amf_segment)
        report = {"ssd_size": args.ssd_size, "ssd_params": args.ssd_params, "logical_bytes": logical, "keys": args.keys,
                  "value_bytes": 4096, "cache": args.cache, "threads": args.threads, "seconds": args.seconds, "setups": {}}
        for name in args.setups.split(","):
            setup = Setup(name, work, args, logical)
            try:
                report["setups"][name] = run_plugin(setup, plugin, kvbench, args) if name == "amf-plugin" else run_ext4(setup, kvbench, args)
            finally:
                setup.close()
            report["setups"][name]["page_map_bytes"] = logical // 4096 * 4
            if args.json:
                save_report(report, args.json + ".partial", None, None)
        report["ratios"] = ratios(report)
        print(save_report(report, args.json, None, None))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
