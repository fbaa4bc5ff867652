#!/usr/bin/env python3
"""OpenStack Swift's own object server on a drive-managed SMR disk, raw against SALSA (the SALSA
paper's section V-C: Fig. 7 and Fig. 8), in real time.

Swift's object server (Debian's swift-object, started from its own WSGI entry point with a
configuration written here) stores its objects on XFS over an NBD export, attached with
nbdfuse and a loop device. Two targets, each on a fresh `dmsmr:` model that keeps real time
(`realtime=on`: every request waits for the actuator, band cleanings included), in one run:
- raw: the model served as it is (`salsa serve --raw`), XFS on a partition of SALSA's logical
  size (the volume below; the rest of the disk never written), as the paper's equal logical size;
- SALSA: the paper's controller for SMR, dual mapping (`--controller dual`, 64 KiB pages), on an
  identical model, SALSA's read cache off so that reads reach the disk as on the raw target.
XFS on both gets the 64 KiB stripe unit a kernel NBD client would report for the volume
(`mkfs.xfs -d su=64k,sw=1`).

For each object size on its own (128 KiB and 1 MiB, as the paper's), 32 clients drive the
server's HTTP API through the phases PUT every object, UPDATE (PUT it again with a new body),
GET, DELETE, the page cache dropped before each phase. Every GET's body must hash to what its
last PUT sent, every request must succeed, and after DELETE a sample of the objects must answer
404; the file system must be clean (xfs_repair -n) at the end. Reported per phase: objects and
MiB per wall-clock second, latency quartiles and p99 (the paper's Fig. 8), and what the disk
did (seeks, bands cleaned, bytes written to its media cache); ratios SALSA / raw.

The SMR model needs no preconditioning: a drive-managed model whose every band was written in
order is in the state of a fresh one (no band in its media cache, no stream under way), so the
paper's sequential fill changes nothing but the bytes; and a random fill would take hours of
modelled disk time here. A phase stops issuing new requests after --phase-seconds (the raw disk
can be that slow); the next phases work on the objects that were stored, and the report says so.

    python3 scripts/bench_swift.py                 # the experiment: 8 GiB models, 128K and 1M objects
    python3 scripts/bench_swift.py --quick         # a short run (the test suite's)

Prints one JSON object (and writes it with --out, a chart with --svg); needs root (loop devices,
mounts, dropping caches) and swift-object (scripts/install-deps.sh installs it).
"""

import argparse
import concurrent.futures
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_mixed import device  # noqa: E402
from bench_object_store import phase_chart, run, salsa_binary, save_report, xfs_over_salsa  # noqa: E402
from object_store import control_stats, parse_size  # noqa: E402

# Swift's ring would spread objects over its partitions; the object server stores each under
# the partition the request names. As many as a small ring's.
PARTITIONS = 1024
ACCOUNT, CONTAINER = "AUTH_bench", "bench"
DEVICE_NAME = "mnt"  # the directory xfs_over_salsa mounts the file system on
# XFS told the volume's 64 KiB large pages as its stripe unit, on both targets: what mkfs.xfs
# reads from a block device's optimal I/O size (the kernel NBD client sets it from the export's
# preferred block size; nbdfuse and a loop device lose it). Files then start on a large page,
# so reading one in 128 KiB requests reads no large page twice.
XFS_ARGS = ["-d", "su=64k,sw=1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ObjectServer:
    """Swift's object server over the directory `devices` (whose `mnt` is the file system),
    on a loopback port; stopped with its workers."""

    def __init__(self, work, devices, workers):
        self.port = free_port()
        self.conf = os.path.join(work, "object-server.conf")
        with open(self.conf, "w") as f:
            f.write(
                "[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = %d\ndevices = %s\nmount_check = false\n"
                "workers = %d\nuser = root\nlog_level = WARNING\n"
                # No syslog here: log over UDP to the discard port.
                "log_udp_host = 127.0.0.1\nlog_udp_port = 9\n\n"
                "[pipeline:main]\npipeline = healthcheck object-server\n\n"
                "[app:object-server]\nuse = egg:swift#object\n\n"
                "[filter:healthcheck]\nuse = egg:swift#healthcheck\n" % (self.port, devices, workers)
            )
        self.log = open(os.path.join(work, "object-server.log"), "w")
        self.proc = subprocess.Popen(
            ["swift-object-server", self.conf], stdout=self.log, stderr=self.log, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.flush()
                raise SystemExit("swift-object-server exited: " + open(self.log.name).read()[-2000:])
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/healthcheck")
                if c.getresponse().status == 200:
                    c.close()
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("swift-object-server did not answer its health check within 120 s")
            time.sleep(0.2)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def timestamp():
    # Swift's X-Timestamp: seconds with five decimals. Phases are seconds apart, so each PUT
    # of an object is newer than the last.
    return "%016.05f" % time.time()


class Client:
    """One connection per client thread to the object server."""

    def __init__(self, port):
        self.port = port
        self.local = threading.local()

    def request(self, method, name, body=None):
        """One request on this thread's connection (opened again if the server closed it);
        returns (status, headers, body)."""
        path = "/%s/%d/%s/%s/%s" % (DEVICE_NAME, int(name[1:]) % PARTITIONS, ACCOUNT, CONTAINER, name)
        headers = {"X-Timestamp": timestamp()}
        if body is not None:
            headers.update({"Content-Type": "application/octet-stream", "Content-Length": str(len(body))})
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                return r.status, dict(r.getheaders()), r.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                self.local.conn = None
                if attempt == 1:
                    raise


def quartiles(values):
    if not values:
        return None
    s = sorted(values)
    at = lambda q: s[min(len(s) - 1, int(q * len(s)))]
    return {"p25": at(0.25), "p50": at(0.50), "p75": at(0.75), "p99": at(0.99), "max": s[-1]}


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run_phase(op, names, size, client, etags, clients, deadline_s, ctl):
    """Runs `op` on every object of `names` with `clients` in flight, starting no request after
    `deadline_s` seconds; returns the phase's report and the names it completed. Raises on any
    request that fails or any GET whose body is not what was stored."""
    drop_caches()
    before = device(control_stats(ctl))
    latencies, done, errors = [], [], []
    lock = threading.Lock()
    start = time.monotonic()

    def one(name):
        if time.monotonic() - start > deadline_s:
            return
        t = time.monotonic()
        if op in ("put", "update"):
            body = os.urandom(size)
            status, headers, _ = client.request("PUT", name, body)
            digest = hashlib.md5(body).hexdigest()
            # The server's ETag (quoted) is the MD5 of the body it stored.
            etag = {k.lower(): v for k, v in headers.items()}.get("etag", "").strip('"')
            ok = status == 201 and etag == digest
        elif op == "get":
            status, _, body = client.request("GET", name)
            digest = hashlib.md5(body).hexdigest()
            ok = status == 200 and digest == etags[name] and len(body) == size
        else:
            status, _, _ = client.request("DELETE", name)
            ok, digest = status == 204, None
        elapsed_ms = (time.monotonic() - t) * 1000
        with lock:
            if not ok:
                errors.append("%s %s: status %d" % (op.upper(), name, status) + ("" if status >= 300 else ", wrong body"))
                return
            latencies.append(elapsed_ms)
            done.append(name)
            if op in ("put", "update"):
                etags[name] = digest

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        for f in [pool.submit(one, n) for n in names]:
            f.result()
    seconds = time.monotonic() - start
    if errors:
        raise SystemExit("%d %s requests failed, first: %s" % (len(errors), op.upper(), errors[0]))
    after = device(control_stats(ctl))
    disk = {k: after.get(k, 0) - before.get(k, 0) for k in ("seeks", "bands_cleaned", "media_cache_write_bytes",
                                                           "in_place_write_bytes", "host_write_bytes", "host_read_bytes")}
    report = {
        "op": op,
        "objects": len(done),
        "of": len(names),
        "complete": len(done) == len(names),
        "seconds": seconds,
        "objects_per_second": len(done) / seconds if seconds > 0 else None,
        "mib_per_second": len(done) * size / (1 << 20) / seconds if seconds > 0 else None,
        "latency_ms": quartiles(latencies),
        "disk": disk,
    }
    return report, done


def one_target(name, serve_args, export, loop_args, size, objects, args, work):
    """Serves the target, makes XFS on it, runs Swift's object server and the four phases."""
    d = os.path.join(work, name)
    with xfs_over_salsa(d, serve_args, export, loop_args, XFS_ARGS) as (mnt, ctl, _):
        server = ObjectServer(d, d, args.workers)
        try:
            client = Client(server.port)
            etags = {}
            names = ["o%d" % i for i in range(objects)]
            phases = []
            for op in ("put", "update", "get", "delete"):
                report, names = run_phase(op, names, size, client, etags, args.clients, args.phase_seconds, ctl)
                phases.append(report)
                print("[swift] %s %s %s: %d objects, %.1f/s, p50 %.0f ms" % (
                    name, size_label(size), op.upper(), report["objects"], report["objects_per_second"] or 0,
                    (report["latency_ms"] or {}).get("p50", 0)), file=sys.stderr)
            # Deleted means gone: a sample answers 404.
            for n in names[:50]:
                status, _, _ = client.request("GET", n)
                if status != 404:
                    raise SystemExit("GET of deleted object %s answered %d" % (n, status))
        finally:
            server.stop()
    return phases


def size_label(size):
    return "%dK" % (size >> 10) if size < (1 << 20) else "%dM" % (size >> 20)


def salsa_volume_bytes(model, serve_extra):
    """The size of the dual-mapping volume SALSA serves on `model` (found on a scratch copy
    of the model, formatted as the server formats it): the raw target's partition."""
    work = tempfile.mkdtemp(prefix="salsa-swift-size-")
    try:
        spec = "%s,file=%s" % (model, os.path.join(work, "d.img"))
        salsa = salsa_binary()
        run([salsa, "format", "--device", spec, "--controller", "dual"] + serve_extra)
        volumes = json.loads(run([salsa, "volume", "list", "--device", spec, "--json"]))
        return next(v for v in volumes if v["name"] == "default")["size_bytes"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def chart(report):
    """Fig. 7: objects per second of each phase, raw against SALSA, one panel per size."""
    return phase_chart(
        report,
        title="Swift object server on XFS, drive-managed SMR model in real time: objects/s",
        metric="objects_per_second",
        salsa="salsa",
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-size", default="8G", help="each drive-managed SMR model's capacity")
    ap.add_argument("--sizes", default="128K,1M", help="object sizes, one experiment each")
    ap.add_argument("--mib", type=int, default=512, help="MiB of objects stored per size (objects = this / size)")
    ap.add_argument("--clients", type=int, default=32, help="requests in flight")
    ap.add_argument("--workers", type=int, default=2, help="the object server's worker processes")
    ap.add_argument("--phase-seconds", type=float, default=600, help="start no request of a phase after this")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per size; ratios are medians over them")
    ap.add_argument("--salsa-args", default="", help="more arguments for the SALSA server")
    ap.add_argument("--quick", action="store_true", help="2 GiB models, 16 MiB of objects per size")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--svg", help="draw the phases' objects per second here (Fig. 7)")
    args = ap.parse_args()
    if args.quick:
        args.model_size, args.mib = "2G", 16
    for tool in ("swift-object-server", "nbdfuse", "losetup", "mkfs.xfs", "xfs_repair", "fusermount3"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is missing: run scripts/install-deps.sh" % tool)
    model = "dmsmr:size=%s" % args.model_size
    salsa_extra = args.salsa_args.split()
    volume_bytes = salsa_volume_bytes(model, [])
    live = model + ",realtime=on"
    raw_serve = ["--raw", "-d", live]
    salsa_serve = ["-d", live, "--controller", "dual", "--read-cache", "0"] + salsa_extra
    report = {"model": live, "partition_bytes": volume_bytes, "clients": args.clients, "workers": args.workers,
              "mib_per_size": args.mib, "rounds": args.rounds, "sizes": {}}
    for label in args.sizes.split(","):
        size = parse_size(label)
        objects = max(8, args.mib * (1 << 20) // size)
        rounds = []
        for _ in range(args.rounds):
            work = tempfile.mkdtemp(prefix="salsa-swift-")
            try:
                raw = one_target("raw", raw_serve, "raw", ["--sizelimit", str(volume_bytes)], size, objects, args, work)
                salsa = one_target("salsa", salsa_serve, "default", [], size, objects, args, work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            rounds.append({"raw": raw, "salsa": salsa})
        last = rounds[-1]
        ratios = {}
        for i, op in enumerate(p["op"] for p in last["raw"]):
            rs = [r["salsa"][i]["objects_per_second"] / r["raw"][i]["objects_per_second"]
                  for r in rounds if r["raw"][i]["objects_per_second"] and r["salsa"][i]["objects_per_second"]]
            ratios[op] = statistics.median(rs) if rs else None
        report["sizes"][label] = {"objects": objects, "raw": last["raw"], "salsa": last["salsa"],
                                  "ratio_objects_per_second": ratios, "rounds": rounds if args.rounds > 1 else None}
    print(save_report(report, args.out, args.svg, chart))


if __name__ == "__main__":
    main()
