#!/usr/bin/env python3
"""Ceph on SALSA: a Ceph cluster whose OSDs' BlueStores sit on SALSA volumes, against the same
cluster on the raw device models, brought up and torn down by one command.

SALSA is a per-host layer: a distributed store outgrows one host by running its storage
daemons on SALSA volumes, one SALSA server per host. Here each simulated host is its own
`ssd:` model (or file), its own `salsa serve`, and one block device made of the server's
export by nbdfuse and a loop device (this kernel has no nbd and no device-mapper). On it, Ceph's
own packages (Debian's ceph-mon, ceph-mgr, ceph-osd): one monitor, one manager and one OSD
per host, each OSD made with `ceph-osd --mkfs` on its block device, as Ceph's development
clusters are (`ceph-volume lvm` needs device-mapper). Three replicas, one per OSD.

Setups, each on fresh device models, in one run:
- raw:   each model served raw (`salsa serve --raw`), the OSD on a partition of SALSA's logical
         size (the rest of the model never written);
- salsa: a SALSA pool on each model (20% spare, one user and one GC stream) and one volume
         of its logical size.
The protocol of the SALSA paper's section V-A, as Table IIa runs it: the models keep real time
(`realtime=on`: Ceph's wall-clock figures are the result), and each drive is preconditioned by
what its setup writes before the OSD is made: the raw drive's partition written once in order
and once at random (the model's own `precondition=SIZE`, off the clock: the state fio through
the raw export would leave), SALSA's volume written through its export once in 1 MiB blocks
in order and once at random in 4 KiB blocks (BlueStore's allocation unit on flash), so that its
GC is in its steady state and its drive has seen only SALSA's segments
(`--model-precondition raw,salsa` also preconditions SALSA's drive at random first: BENCHMARKS,
"Ceph on SALSA", run 1). BlueStore as Ceph ships it but for a small cache of its own (reads
reach the devices); `--discard` turns on its discards on every setup.

Measured, per setup: `rados bench` write, then sequential and random reads, of 4 MiB and of
4 KiB objects (16 in flight), and fio's `rbd` engine writing 4 KiB at random at queue depth 32
into an RBD image written whole first; per phase the client's throughput, average and maximum
latency (rados bench reports no percentiles; fio gives the 99th), and the bytes the models
took from the host, programmed into flash and the blocks they erased.

`--faults` (on SALSA): a SALSA server killed with SIGKILL while a client writes objects;
the server restarted (its pool recovers), the OSD's BlueStore checked offline
(`ceph-bluestore-tool fsck`) and started again; once every placement group is clean a deep
scrub of every pool, then every object the client had acknowledged read back and compared.
Then the last host's thin volume filled past its pool: the OSD meets ENOSPC (its write fails;
BlueStore stops rather than write on), the cluster serves on from the other two, space is given
back (a volume beside it deleted), and the OSD comes back with a clean fsck and scrub.

    python3 scripts/ceph_on_salsa.py                 # the benchmark (about 30 minutes)
    python3 scripts/ceph_on_salsa.py --faults        # kill -9 and ENOSPC on SALSA (about 5 minutes)
    python3 scripts/ceph_on_salsa.py --quick         # files instead of models, short phases

Prints one JSON object; needs root (loop devices), nbdfuse and Ceph (scripts/install-deps.sh
installs them).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_mixed  # noqa: E402
from bench_sysbench_ssd import in_parallel  # noqa: E402
from bench_object_store import retry, run, salsa_binary, save_report, tear_down, wait_for  # noqa: E402
from bench_swift import free_port  # noqa: E402
from object_store import control_stats, parse_size  # noqa: E402

MIB = 1 << 20
SETUPS = ("raw", "salsa")
# Debian's librados for Python is built for the system interpreter; another interpreter of the
# same version (a pyenv one) loads it from there.
DIST_PACKAGES = "/usr/lib/python3/dist-packages"


def rados_module():
    try:
        import rados
    except ImportError:
        sys.path.append(DIST_PACKAGES)
        import rados
    return rados


class Host(bench_mixed.Setup):
    """One simulated host: its device (an `ssd:` model, or a file with --quick), its salsa
    server (raw, or a SALSA pool with one volume `osd`), and the block device its OSD uses."""

    def __init__(self, name, work, args, raw, volume_bytes):
        super().__init__(name, work, args)
        self.raw, self.volume_bytes = raw, volume_bytes
        image = os.path.join(self.d, "disk.img" if args.quick else "ssd.img")
        if args.quick:
            self.spec = "%s:%s" % (image, args.ssd_size)
        # The control socket where `salsa volume --device` finds the running server.
        self.ctl = os.path.splitext(image)[0] + ".ctl"
        self.first_serve = True
        self.export = "raw" if raw else "osd"
        self.server = None

    def timing(self):
        """What the device spec gains when served: real time, and on the first open the
        drive's own preconditioning (its FTL only: the data on it stays as it is)."""
        if self.args.quick:
            return ""
        extra = ",realtime=on"
        if self.first_serve and self.args.protocol and ("raw" if self.raw else "salsa") in self.args.model_precondition:
            extra += ",precondition=%s" % (self.volume_bytes if self.raw else "on")
        return extra

    def format(self, volumes):
        """Makes the SALSA pool and its volumes [(name, bytes)]."""
        salsa = salsa_binary()
        run([salsa, "format", "--device", self.spec] + format_args(self.args))
        for name, size in volumes:
            run([salsa, "volume", "create", "--device", self.spec, name, str(size)])

    def serve(self):
        salsa = salsa_binary()
        spec = self.spec + self.timing()
        cmd = [salsa, "serve", "--device", spec] + (["--raw"] if self.raw else ["--read-cache", "0"])
        cmd += ["--no-tcp", "--unix", self.sock, "--control", self.ctl]
        for stale in (self.sock, self.ctl):
            if os.path.exists(stale):
                os.unlink(stale)
        log = open(os.path.join(self.d, "serve.log"), "a")
        self.server = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.procs = [self.server]
        wait_for(self.sock, "the NBD socket", self.server, timeout=300)
        wait_for(self.ctl, "the control socket", self.server, timeout=300)
        self.first_serve = False

    def precondition_targets(self):
        return [(self.export, 0, self.volume_bytes, "4K")]

    def block_device(self):
        if self.raw:
            return self.attach(self.export, 0, self.volume_bytes)
        return self.attach(self.export)

    def detach(self):
        """Detaches the block device and nbdfuse (the OSD on them stopped first)."""
        tear_down((), self.loops, self.fuses, None)
        self.loops, self.fuses = [], []
        self.procs = [self.server]

    def kill_server(self):
        self.server.send_signal(signal.SIGKILL)
        self.server.wait()

    def counters(self):
        stats = control_stats(self.ctl)
        return bench_mixed.device(stats), stats


def format_args(args):
    return ["--spare", "20", "--no-default-volume", "--segment-size", args.segment_size, "--placement", "user-gc"]


class Cluster:
    """A Ceph cluster in a directory: one monitor, one manager, OSDs added on block devices.
    Every daemon runs in the foreground as a child of this script, logging into the directory."""

    def __init__(self, d, osd_memory_bytes, discard=False):
        self.d = d
        self.conf = os.path.join(d, "ceph.conf")
        self.fsid = str(uuid.uuid4())
        self.port = free_port()
        self.daemons = {}
        for sub in ("run", "log", "mon", "mgr", "osd"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write(CONF.format(fsid=self.fsid, port=self.port, d=d, osd_memory=osd_memory_bytes, bluestore_cache=64 * MIB,
                                discard=str(discard).lower()))
        self.env = dict(os.environ, CEPH_CONF=self.conf)

    def ceph(self, *args, timeout=120):
        out = run(["ceph", "--conf", self.conf, "--connect-timeout", "30"] + list(args), timeout=timeout)
        return out

    def ceph_json(self, *args):
        return json.loads(self.ceph(*args, "--format", "json"))

    def spawn(self, name, cmd):
        log = open(os.path.join(self.d, "log", name + ".out"), "a")
        self.daemons[name] = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env)
        return self.daemons[name]

    def start(self):
        monmap = os.path.join(self.d, "monmap")
        keyring = os.path.join(self.d, "mon.keyring")
        run(["monmaptool", "--create", "--addv", "a", "[v2:127.0.0.1:%d]" % self.port, "--fsid", self.fsid, monmap])
        run(["ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"])
        run(["ceph-mon", "--conf", self.conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring])
        self.spawn("mon.a", ["ceph-mon", "-f", "--conf", self.conf, "-i", "a"])
        err = retry(["ceph", "--conf", self.conf, "--connect-timeout", "5", "mon", "stat"], 60)
        if err is not None:
            raise SystemExit("the monitor did not answer: " + err)
        os.makedirs(os.path.join(self.d, "mgr", "x"), exist_ok=True)
        self.spawn("mgr.x", ["ceph-mgr", "-f", "--conf", self.conf, "-i", "x"])

    def osd_dir(self, osd):
        return os.path.join(self.d, "osd", str(osd))

    def create_osd(self, block):
        """A new OSD whose BlueStore is made on `block`; returns its id once it is up."""
        osd_uuid = str(uuid.uuid4())
        osd = int(self.ceph("osd", "new", osd_uuid).strip())
        os.makedirs(self.osd_dir(osd))
        os.symlink(block, os.path.join(self.osd_dir(osd), "block"))
        run(["ceph-osd", "--conf", self.conf, "-i", str(osd), "--mkfs", "--osd-uuid", osd_uuid], timeout=600)
        self.start_osd(osd)
        return osd

    def set_block(self, osd, block):
        link = os.path.join(self.osd_dir(osd), "block")
        os.unlink(link)
        os.symlink(block, link)

    def start_osd(self, osd):
        self.spawn("osd.%d" % osd, ["ceph-osd", "-f", "--conf", self.conf, "-i", str(osd)])

    def stop_osd(self, osd, timeout=60):
        """Stops the OSD (SIGTERM, then SIGKILL after `timeout`); returns its exit code."""
        p = self.daemons.pop("osd.%d" % osd)
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def osd_alive(self, osd):
        p = self.daemons.get("osd.%d" % osd)
        return p is not None and p.poll() is None

    def wait_up(self, count, timeout=300):
        deadline = time.monotonic() + timeout
        while True:
            stat = self.ceph_json("osd", "stat")
            if stat.get("num_up_osds") == count and stat.get("num_in_osds") == count:
                return
            if time.monotonic() > deadline:
                raise SystemExit("OSDs not up after %d s: %s" % (timeout, stat))
            time.sleep(1)

    def wait_clean(self, timeout=600):
        """Waits until every placement group is active+clean."""
        deadline = time.monotonic() + timeout
        while True:
            stat = self.ceph_json("pg", "stat")
            summary = stat.get("pg_summary", stat)
            total = summary.get("num_pgs", 0)
            clean = sum(s["num"] for s in summary.get("num_pg_by_state", []) if s["name"] == "active+clean")
            if total and clean == total:
                return
            if time.monotonic() > deadline:
                raise SystemExit("placement groups not clean after %d s: %s" % (timeout, summary))
            time.sleep(2)

    def create_pool(self, name, pgs, application):
        self.ceph("osd", "pool", "create", name, str(pgs), str(pgs))
        self.ceph("osd", "pool", "application", "enable", name, application)

    def deep_scrub(self, timeout=900):
        """Deep-scrubs every placement group and waits until each has finished one that started
        after this call; returns the inconsistent placement groups of every pool, and the
        scrub errors the cluster's health reports."""
        before = {p["pgid"]: p["last_deep_scrub_stamp"] for p in self.ceph_json("pg", "ls")["pg_stats"]}
        for pgid in before:
            self.ceph("pg", "deep-scrub", pgid)
        deadline = time.monotonic() + timeout
        while True:
            now = {p["pgid"]: p["last_deep_scrub_stamp"] for p in self.ceph_json("pg", "ls")["pg_stats"]}
            pending = [pg for pg, stamp in before.items() if now.get(pg) == stamp]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise SystemExit("deep scrub not finished after %d s: %s" % (timeout, pending))
            time.sleep(2)
        inconsistent = []
        for pool in self.ceph_json("osd", "pool", "ls"):
            inconsistent += json.loads(run(["rados", "--conf", self.conf, "list-inconsistent-pg", pool]))
        health = self.ceph_json("health", "detail")
        scrub_errors = {k: v["summary"]["message"] for k, v in health.get("checks", {}).items()
                        if k in ("OSD_SCRUB_ERRORS", "PG_DAMAGED")}
        return {"pgs_scrubbed": len(before), "inconsistent_pgs": inconsistent, "scrub_errors": scrub_errors}

    def stop(self):
        errors = []
        for name in sorted(self.daemons, key=lambda n: (not n.startswith("osd"), n)):
            p = self.daemons[name]
            if p.poll() is None:
                p.terminate()
        for name, p in self.daemons.items():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                errors.append(name)
                p.kill()
                p.wait()
        self.daemons = {}
        if errors:
            raise SystemExit("Ceph daemons did not stop within 60 s: " + ", ".join(errors))


CONF = """[global]
fsid = {fsid}
mon_host = v2:127.0.0.1:{port}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
run_dir = {d}/run
log_file = {d}/log/$name.log
admin_socket = {d}/run/$name.asok
osd_pool_default_size = 3
osd_pool_default_min_size = 2
osd_crush_chooseleaf_type = 0
mon_allow_pool_delete = true
mon_data_avail_warn = 1
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_warn_on_pool_no_redundancy = false
osd_heartbeat_interval = 1
osd_heartbeat_grace = 6
mon_osd_down_out_interval = 0
[mon]
mon_data = {d}/mon/$name
[mgr]
mgr_data = {d}/mgr/$id
[osd]
osd_data = {d}/osd/$id
osd_objectstore = bluestore
osd_memory_target = {osd_memory}
bluestore_fsck_on_mount = false
# A small cache of BlueStore's own, so that reads reach the devices being compared.
bluestore_cache_autotune = false
bluestore_cache_size = {bluestore_cache}
bdev_enable_discard = {discard}
bdev_async_discard = {discard}
"""


def rados_bench(cluster, pool, seconds, mode, block, threads, max_objects=None):
    cmd = ["rados", "--conf", cluster.conf, "-p", pool, "bench", str(seconds), mode, "-t", str(threads)]
    if mode == "write":
        cmd += ["-b", str(block), "--no-cleanup", "--max-objects", str(max_objects)]
    out = run(cmd, timeout=seconds * 4 + 120)

    def field(label):
        m = re.search(r"^%s:\s+([0-9.eE+-]+)" % re.escape(label), out, re.M)
        return float(m.group(1)) if m else None

    ops = field("Total writes made") if mode == "write" else field("Total reads made")
    return {
        "ops": ops,
        "mb_per_s": field("Bandwidth (MB/sec)"),
        "iops": field("Average IOPS"),
        "latency_ms_avg": field("Average Latency(s)") * 1000,
        "latency_ms_max": field("Max latency(s)") * 1000,
    }


def fio_rbd(cluster, rw, bs, depth, seconds=None, size=None):
    cmd = ["fio", "--output-format=json", "--name=rbd", "--ioengine=rbd", "--clientname=admin", "--pool=rbd",
           "--rbdname=image", "--rw=" + rw, "--bs=" + bs, "--iodepth=%d" % depth, "--direct=1", "--randrepeat=0"]
    if seconds:
        cmd += ["--time_based", "--runtime=%d" % seconds]
    if size:
        cmd += ["--size=%d" % size]
    out = run(cmd, env=cluster.env, timeout=(seconds or 600) * 4 + 120)
    job = json.loads(out[out.index("{"):])["jobs"][0]["write"]
    pct = job["clat_ns"].get("percentile", {})
    return {
        "mb_per_s": job["bw_bytes"] / 1e6,
        "iops": job["iops"],
        "latency_ms_avg": job["clat_ns"]["mean"] / 1e6,
        "latency_ms_p99": pct.get("99.000000", 0) / 1e6,
        "latency_ms_max": job["clat_ns"]["max"] / 1e6,
    }


MODEL_COUNTERS = ("host_write_bytes", "host_flushes", "host_read_bytes", "nand_read_bytes", "nand_program_bytes", "nand_map_program_bytes", "gc_moved_bytes",
                  "block_erases", "read_modify_write_units")
SALSA_COUNTERS = ("user_bytes_written", "device_bytes_written", "gc_bytes_relocated", "metadata_bytes_written", "syncs")


def counters(hosts):
    """Every host's model counters and (on SALSA) the server's own, summed over the hosts."""
    out = {}
    for h in hosts:
        model, stats = h.counters()
        for key in MODEL_COUNTERS:
            out[key] = out.get(key, 0) + model.get(key, 0)
        for key in SALSA_COUNTERS:
            if isinstance(stats.get(key), (int, float)):
                out["salsa_" + key] = out.get("salsa_" + key, 0) + stats[key]
    return out


def model_delta(hosts, before):
    after = counters(hosts)
    return {k: v - before.get(k, 0) for k, v in after.items()}


def measured(cluster, hosts, args):
    """The measured phases, each with the models' counters over it."""
    phases = {}

    def phase(name, fn):
        before = counters(hosts)
        r = fn()
        r.update(model_delta(hosts, before))
        phases[name] = r
        print("  %s: %s" % (name, json.dumps(r)), file=sys.stderr, flush=True)

    cluster.create_pool("bench", args.pgs, "rados")
    cluster.wait_clean()
    for label, block in (("4M", 4 * MIB), ("4K", 4096)):
        # Every OSD holds a replica of everything: the objects of a phase fill at most 40% of
        # one, whatever its speed (BlueStore's own database takes a part too).
        max_objects = int(0.4 * hosts[0].volume_bytes) // block
        phase("rados_write_" + label,
              lambda: rados_bench(cluster, "bench", args.seconds, "write", block, args.threads, max_objects))
        phase("rados_seq_" + label, lambda: rados_bench(cluster, "bench", args.seconds, "seq", block, args.threads))
        phase("rados_rand_" + label, lambda: rados_bench(cluster, "bench", args.seconds, "rand", block, args.threads))
        run(["rados", "--conf", cluster.conf, "-p", "bench", "cleanup"], timeout=600)
    cluster.create_pool("rbd", args.pgs // 2, "rbd")
    run(["rbd", "--conf", cluster.conf, "create", "rbd/image", "--size", str(parse_size(args.image_size) // MIB)])
    cluster.wait_clean()
    phase("rbd_fill_4M", lambda: fio_rbd(cluster, "write", "4M", 4, size=parse_size(args.image_size)))
    phase("rbd_randwrite_4K", lambda: fio_rbd(cluster, "randwrite", "4K", 32, seconds=args.seconds))
    return phases


class ObjectWriter(threading.Thread):
    """Writes objects of known content (derived from their names) until told to stop,
    several in flight, and remembers every one Ceph acknowledged."""

    def __init__(self, conf, pool, size, in_flight=8):
        super().__init__(daemon=True)
        self.conf, self.pool, self.size, self.in_flight = conf, pool, size, in_flight
        self.acked, self.failed = [], []
        self.stop_at = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        rados = rados_module()
        cluster = rados.Rados(conffile=self.conf)
        cluster.connect()
        ioctx = cluster.open_ioctx(self.pool)
        slots = threading.Semaphore(self.in_flight)
        i = 0
        while not self.stop_at.is_set():
            slots.acquire()
            name = "obj-%06d" % i
            i += 1

            def done(completion, name=name):
                with self.lock:
                    (self.acked if completion.get_return_value() >= 0 else self.failed).append(name)
                slots.release()

            ioctx.aio_write_full(name, object_bytes(name, self.size), oncomplete=done)
        for _ in range(self.in_flight):
            slots.acquire()
        ioctx.close()
        cluster.shutdown()


def object_bytes(name, size):
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def read_back(conf, pool, names, size):
    """(objects missing, objects whose bytes differ)."""
    rados = rados_module()
    cluster = rados.Rados(conffile=conf)
    cluster.connect()
    ioctx = cluster.open_ioctx(pool)
    missing, wrong = [], []
    try:
        for name in names:
            try:
                data = ioctx.read(name, size + 1)
            except rados.ObjectNotFound:
                missing.append(name)
                continue
            if data != object_bytes(name, size):
                wrong.append(name)
    finally:
        ioctx.close()
        cluster.shutdown()
    return missing, wrong


def restart_host(cluster, host, osd, check):
    """After its server died: the OSD stopped, the devices detached, the server started again
    (the pool recovers), the OSD's BlueStore checked offline, the OSD started."""
    check["osd_exit_code"] = cluster.stop_osd(osd)
    host.detach()
    host.serve()
    cluster.set_block(osd, host.block_device())
    fsck_and_start(cluster, osd, check)


def fsck_and_start(cluster, osd, check):
    """Checks the stopped OSD's BlueStore offline (deep: every object read), then starts it."""
    fsck = subprocess.run(["ceph-bluestore-tool", "fsck", "--deep", "1", "--path", cluster.osd_dir(osd)],
                          capture_output=True, text=True, timeout=1800)
    check["fsck_exit_code"] = fsck.returncode
    check["fsck_output"] = (fsck.stdout + fsck.stderr).strip()[-400:]
    cluster.start_osd(osd)


def settle_and_verify(cluster, osds, pool, writer, check, since=None):
    """Once every OSD is up and every placement group clean (with `since`, a monotonic time:
    how long after it that was), a deep scrub, then every object `writer` had acknowledged
    read back."""
    cluster.wait_up(len(osds))
    cluster.wait_clean()
    if since is not None:
        check["seconds_to_clean"] = round(time.monotonic() - since, 1)
    check.update(cluster.deep_scrub())
    missing, wrong = read_back(cluster.conf, pool, writer.acked, writer.size)
    check["objects_lost"], check["objects_wrong"] = len(missing), len(wrong)


def osd_log_tail(cluster, osd, pattern):
    path = os.path.join(cluster.d, "log", "osd.%d.log" % osd)
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f if re.search(pattern, l)]
        return lines[-3:]
    except OSError:
        return []


def kill_test(cluster, hosts, osds, args):
    """kill -9 of one SALSA server under a writing client; see the module doc."""
    cluster.create_pool("faults", args.pgs, "rados")
    cluster.wait_clean()
    writer = ObjectWriter(cluster.conf, "faults", parse_size(args.object_size))
    writer.start()
    time.sleep(args.fault_seconds)
    victim = 1
    acked_before_kill = len(writer.acked)
    hosts[victim].kill_server()
    killed_at = time.monotonic()
    time.sleep(args.fault_seconds)
    writer.stop_at.set()
    writer.join(timeout=600)
    check = {"acked_before_kill": acked_before_kill, "acked": len(writer.acked), "failed_writes": len(writer.failed),
             "osd_alive_after_kill": cluster.osd_alive(osds[victim])}
    restart_host(cluster, hosts[victim], osds[victim], check)
    settle_and_verify(cluster, osds, "faults", writer, check, since=killed_at)
    return check


def enospc_test(cluster, hosts, osds, args):
    """The last host's OSD on a thin volume that its pool cannot back: see the module doc."""
    host, osd = hosts[-1], osds[-1]
    salsa = salsa_binary()
    cluster.create_pool("fill", args.pgs, "rados")
    cluster.wait_clean()
    writer = ObjectWriter(cluster.conf, "fill", 4 * MIB, in_flight=4)
    writer.start()
    deadline = time.monotonic() + args.fill_timeout
    while cluster.osd_alive(osd) and time.monotonic() < deadline:
        time.sleep(1)
    check = {"osd_stopped": not cluster.osd_alive(osd), "log": osd_log_tail(cluster, osd, r"No space left on device")}
    writer.stop_at.set()
    writer.join(timeout=600)
    check["acked"], check["failed_writes"] = len(writer.acked), len(writer.failed)
    # Space back: the volume beside the OSD's deleted through the running server.
    run([salsa, "volume", "delete", "--device", host.spec, "spare"])
    check["osd_exit_code"] = cluster.stop_osd(osd)
    fsck_and_start(cluster, osd, check)
    settle_and_verify(cluster, osds, "fill", writer, check)
    return check


def run_setup(name, work, args, volume_bytes):
    raw = name == "raw"
    d = os.path.join(work, name)
    os.makedirs(d)
    hosts = [Host(os.path.join(name, "host%d" % i), work, args, raw, volume_bytes) for i in range(args.osds)]
    cluster = None
    report = {"volume_bytes": volume_bytes}
    try:
        for i, h in enumerate(hosts):
            if not raw:
                # Thin on the last host with --faults: the OSD's volume and a spare one together
                # more than the pool holds.
                spare = args.faults and i == len(hosts) - 1
                h.format([("osd", volume_bytes)] + ([("spare", volume_bytes // 2)] if spare else []))
            h.serve()
        if args.protocol and not raw:
            started = time.monotonic()
            in_parallel([h.precondition for h in hosts])
            report["precondition_seconds"] = round(time.monotonic() - started, 1)
        if args.faults and not raw:
            fill_spare(hosts[-1], volume_bytes // 2)
        cluster = Cluster(os.path.join(d, "ceph"), parse_size(args.osd_memory), args.discard)
        cluster.start()
        osds = [cluster.create_osd(h.block_device()) for h in hosts]
        cluster.wait_up(len(osds))
        if args.faults:
            report["kill_9"] = kill_test(cluster, hosts, osds, args)
            report["enospc"] = enospc_test(cluster, hosts, osds, args)
        else:
            report["phases"] = measured(cluster, hosts, args)
            report["deep_scrub"] = cluster.deep_scrub()
        if not raw:
            stats = [h.counters()[1] for h in hosts]
            report["map_memory_bytes"] = sum(v["map_memory_bytes"] for s in stats for v in s.get("volumes", []))
            report["gc_bytes_relocated"] = sum(s.get("gc_bytes_relocated", 0) for s in stats)
        return report
    finally:
        if cluster is not None:
            cluster.stop()
        for h in hosts:
            h.close()


def fill_spare(host, size):
    """Writes the spare volume whole, so the thin pool has no room left for it and the OSD's
    volume together."""
    run(["fio", "--name=spare", "--ioengine=nbd", "--uri=nbd+unix:///spare?socket=%s" % host.sock, "--rw=write",
         "--bs=1M", "--iodepth=4", "--size=%d" % size, "--end_fsync=1"])


def ratios(report):
    raw, salsa = report.get("raw", {}).get("phases"), report.get("salsa", {}).get("phases")
    if not raw or not salsa:
        return {}
    out = {}
    for phase, r in raw.items():
        s = salsa.get(phase)
        if not s:
            continue
        out[phase] = {"throughput": s["mb_per_s"] / r["mb_per_s"] if r["mb_per_s"] else None,
                      "erases": s["block_erases"] / r["block_erases"] if r["block_erases"] else None}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="files instead of device models, 3 s phases, no preconditioning")
    ap.add_argument("--faults", action="store_true", help="kill -9 and ENOSPC on SALSA instead of the measured phases")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--osds", type=int, default=3)
    ap.add_argument("--ssd-size", default="2G", help="each host's device")
    ap.add_argument("--ssd-params", default="block=256K", help="extra `ssd:` parameters")
    ap.add_argument("--segment-size", default="16M")
    ap.add_argument("--seconds", type=int, default=60, help="each measured phase")
    ap.add_argument("--threads", type=int, default=16, help="rados bench's operations in flight")
    ap.add_argument("--pgs", type=int, default=32)
    ap.add_argument("--image-size", default="256M", help="the RBD image fio writes")
    ap.add_argument("--osd-memory", default="1G", help="osd_memory_target")
    ap.add_argument("--object-size", default="64K", help="objects the kill test writes")
    ap.add_argument("--fault-seconds", type=int, default=20, help="writing before and after the kill")
    ap.add_argument("--fill-timeout", type=int, default=900)
    ap.add_argument("--discard", action="store_true",
                    help="BlueStore discards what it frees (bdev_enable_discard, off by Ceph's default), on every setup")
    ap.add_argument("--no-protocol", dest="protocol", action="store_false", help="no preconditioning")
    ap.add_argument("--model-precondition", default="raw",
                    help="the setups whose drives are preconditioned by the model itself (SALSA's volume is "
                         "written through its export in any case)")
    ap.add_argument("--json", "--out", dest="json")
    args = ap.parse_args()
    # A stop asked of the run takes everything down as an error would (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.ssd_size, args.seconds, args.protocol, args.fault_seconds = "2G", 3, False, 5
        args.image_size = "64M"
    for tool in ("ceph-mon", "ceph-mgr", "ceph-osd", "rados", "nbdfuse", "fio"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is missing (scripts/install-deps.sh installs it)" % tool)
    setups = args.setups.split(",")
    if args.faults:
        setups = ["salsa"]
    work = tempfile.mkdtemp(prefix="salsa-ceph-")
    report = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "work_dir": work}
    try:
        volume_bytes = salsa_logical_bytes(args)
        for name in setups:
            print("setup %s" % name, file=sys.stderr, flush=True)
            report[name] = run_setup(name, work, args, volume_bytes)
            if args.json:
                save_report(report, args.json, None, None)
        report["salsa_over_raw"] = ratios(report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=1))
    if args.json:
        save_report(report, args.json, None, None)


def salsa_logical_bytes(args):
    """SALSA's logical capacity on one host's device, in whole MiB: the raw partitions and
    SALSA's volumes get that much."""
    params = "," + args.ssd_params if args.ssd_params else ""

    def devices(work):
        if args.quick:
            return ["--device", "%s:%s" % (os.path.join(work, "disk.img"), args.ssd_size)]
        return ["--device", "ssd:size=%s,file=%s%s" % (args.ssd_size, os.path.join(work, "ssd.img"), params)]

    return bench_mixed.scratch_logical_bytes(devices, format_args(args)) // MIB * MIB


if __name__ == "__main__":
    main()
