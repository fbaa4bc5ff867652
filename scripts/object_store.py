#!/usr/bin/env python3
"""An object-server workload that writes the way OpenStack Swift's object server does.

Each object lives at objects/<partition>/<suffix>/<hash>/<timestamp>.data. A PUT writes the
body into a temporary file under tmp/, stores the metadata (name, size, ETag) in an extended
attribute, fsyncs the file, renames it into the object's directory and fsyncs that directory;
the previous version, if any, is then removed. An UPDATE is a PUT of an existing object, a
DELETE writes a zero-byte <timestamp>.ts tombstone the same way and removes the data, and a
GET opens the newest .data file, reads its metadata and body and checks the body's MD5 against
the ETag (a mismatch is an error: the workload verifies what it reads).

Run on a mounted file system:

    python3 scripts/object_store.py --dir /mnt --objects 2000 --seconds 60 --threads 32

It first PUTs --objects objects (sizes drawn from --sizes), then runs the --mix of operations
with --threads in flight for --seconds (or --ops operations), and prints one JSON object:
counts, bytes, operations per second and latency quartiles per operation, for the timed phase.

With --phases put,update,get,delete it runs as the SALSA paper did instead: one phase per
operation over every object (PUT them all, then UPDATE, GET and DELETE each once, in a new
random order each time), dropping the kernel's caches before each phase with --drop-caches,
and reports each phase on its own (with --stats-socket, its device counters too).
"""

import argparse
import hashlib
import json
import os
import random
import threading
import time

XATTR = "user.swift.metadata"
PARTITIONS = 1024


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


class Store:
    """Objects on a file system laid out as Swift lays them out."""

    def __init__(self, root):
        self.root = root
        self.tmp = os.path.join(root, "tmp")
        os.makedirs(self.tmp, exist_ok=True)
        os.makedirs(os.path.join(root, "objects"), exist_ok=True)
        self.clock = 0
        self.clock_lock = threading.Lock()

    def timestamp(self):
        with self.clock_lock:
            self.clock += 1
            return "%016.5f_%08d" % (time.time(), self.clock)

    def object_dir(self, name):
        h = hashlib.md5(name.encode()).hexdigest()
        part = int(h[:4], 16) % PARTITIONS
        return os.path.join(self.root, "objects", str(part), h[-3:], h)

    @staticmethod
    def fsync_dir(path):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _commit(self, name, suffix, body):
        """Writes body into a temporary file, then moves it into place durably; returns the
        previous files of the object, which the caller removes."""
        directory = self.object_dir(name)
        meta = {"name": name, "Content-Length": len(body), "ETag": hashlib.md5(body).hexdigest()}
        fd, tmp = _mkstemp(self.tmp)
        try:
            view = memoryview(body)
            while view:
                n = os.write(fd, view[: 1 << 16])
                view = view[n:]
            os.setxattr(tmp, XATTR, json.dumps(meta).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.makedirs(directory, exist_ok=True)
        old = os.listdir(directory)
        os.rename(tmp, os.path.join(directory, self.timestamp() + suffix))
        self.fsync_dir(directory)
        return [os.path.join(directory, f) for f in old]

    def put(self, name, body):
        for f in self._commit(name, ".data", body):
            os.unlink(f)

    def delete(self, name):
        for f in self._commit(name, ".ts", b""):
            os.unlink(f)

    def get(self, name):
        directory = self.object_dir(name)
        files = sorted(os.listdir(directory))
        if not files or not files[-1].endswith(".data"):
            return None
        path = os.path.join(directory, files[-1])
        meta = json.loads(os.getxattr(path, XATTR))
        with open(path, "rb") as f:
            body = f.read()
        if len(body) != meta["Content-Length"] or hashlib.md5(body).hexdigest() != meta["ETag"]:
            raise RuntimeError("object %s: body does not match its metadata" % name)
        return len(body)


def _mkstemp(directory):
    for _ in range(100):
        path = os.path.join(directory, "%x.tmp" % random.getrandbits(64))
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), path
        except FileExistsError:
            continue
    raise RuntimeError("no free temporary name")


def control_stats(path):
    """The statistics a salsa server answers on its control socket (`salsa serve --raw`
    answers without reading the request, so a closed pipe on sending is not an error)."""
    import socket

    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    try:
        s.sendall(b"stats\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    s.close()
    return json.loads(data)


def device_counters(path):
    """The device counters a salsa server reports on its control socket, summed by name."""
    if not path:
        return {}
    stats = control_stats(path)
    out = {}
    for c in stats.get("device_counters", []):
        out[c["counter"]] = out.get(c["counter"], 0) + c["value"]
    # SALSA's own counters, when it is a pool (not a device served raw).
    for k in ("user_bytes_written", "user_bytes_read", "gc_bytes_relocated", "device_bytes_written", "flushes", "syncs"):
        if k in stats:
            out["salsa_" + k] = stats[k]
    for v in stats.get("volumes", []):
        for k in ("merged_pages", "small_pages_written"):
            if k in v:
                out["salsa_" + k] = out.get("salsa_" + k, 0) + v[k]
    return out


def run_threads(target, seeds):
    """Runs target(seed) on one thread per seed; returns the seconds until all finished."""
    threads = [threading.Thread(target=target, args=(seed,)) for seed in seeds]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started


def quartiles(values):
    if not values:
        return None
    v = sorted(values)
    pick = lambda q: v[min(len(v) - 1, int(q * len(v)))]
    return {"p25_ms": pick(0.25) * 1e3, "p50_ms": pick(0.5) * 1e3, "p75_ms": pick(0.75) * 1e3, "p99_ms": pick(0.99) * 1e3}


def run_phases(store, args, sizes):
    """One phase per operation over every object, as the SALSA paper ran Swift."""
    names = ["/AUTH_bench/c/o%d" % i for i in range(args.objects)]
    phases = []
    for p, op in enumerate(args.phases.split(",")):
        if op not in ("put", "update", "get", "delete"):
            raise SystemExit("unknown phase %r" % op)
        order = names[:]
        random.Random(args.seed * 31 + p).shuffle(order)
        if args.drop_caches:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        before = device_counters(args.stats_socket)
        lat, moved, errors = [], [0], []
        lock = threading.Lock()
        at = [0]

        def worker(seed):
            r = random.Random(seed)
            while True:
                with lock:
                    if at[0] >= len(order) or errors:
                        return
                    name = order[at[0]]
                    at[0] += 1
                started = time.monotonic()
                try:
                    if op in ("put", "update"):
                        b = r.randbytes(r.choice(sizes))
                        store.put(name, b)
                        n = len(b)
                    elif op == "get":
                        n = store.get(name) or 0
                    else:
                        store.delete(name)
                        n = 0
                except Exception as e:
                    with lock:
                        errors.append("%s %s: %s" % (op, name, e))
                    return
                with lock:
                    lat.append(time.monotonic() - started)
                    moved[0] += n

        started = time.monotonic()
        run_threads(worker, [args.seed * 7919 + p * 131 + t for t in range(args.threads)])
        # The phase ends when its writes are durable on the device.
        os.sync()
        seconds = time.monotonic() - started
        after = device_counters(args.stats_socket)
        if errors:
            raise SystemExit("errors: %s" % errors[:5])
        device = {k: after[k] - before.get(k, 0) for k in after}
        model_s = device.get("model_time_us", 0) / 1e6
        phases.append(
            {
                "op": op,
                "ops": len(lat),
                "bytes": moved[0],
                "seconds": seconds,
                "mib_per_second": moved[0] / (1 << 20) / seconds if seconds > 0 else 0.0,
                "model_seconds": model_s,
                "ops_per_model_second": len(lat) / model_s if model_s > 0 else None,
                "mib_per_model_second": moved[0] / (1 << 20) / model_s if model_s > 0 else None,
                "latency": quartiles(lat),
                "device": device,
            }
        )
    print(json.dumps({"objects": args.objects, "sizes": args.sizes, "threads": args.threads, "phases": phases}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="mounted file system to store objects in")
    ap.add_argument("--objects", type=int, default=1000, help="objects PUT before the timed phase")
    ap.add_argument("--sizes", default="128K,1M", help="object sizes, drawn uniformly")
    ap.add_argument("--mix", default="put:10,get:40,update:40,delete:10", help="operation weights of the timed phase")
    ap.add_argument("--threads", type=int, default=32, help="operations in flight")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the timed phase")
    ap.add_argument("--ops", type=int, default=0, help="stop the timed phase after this many operations instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats-socket", help="a salsa server's control socket: report its device counters' change over the timed phase")
    ap.add_argument("--phases", help="run these operations one phase each over every object (e.g. put,update,get,delete)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the kernel's caches before each phase (root)")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    mix = []
    for part in args.mix.split(","):
        op, weight = part.split(":")
        if op not in ("put", "get", "update", "delete"):
            ap.error("unknown operation %r in --mix" % op)
        mix.append((op, float(weight)))
    store = Store(args.dir)
    if args.phases:
        return run_phases(store, args, sizes)
    live = set()
    next_id = [0]
    state = threading.Lock()

    def new_name():
        with state:
            next_id[0] += 1
            return "/AUTH_bench/c/o%d" % next_id[0]

    def body(r):
        return r.randbytes(r.choice(sizes))

    # Fill: PUT the initial objects with all threads.
    names = [new_name() for _ in range(args.objects)]
    fill_at = [0]

    def filler(seed):
        r = random.Random(seed)
        while True:
            with state:
                if fill_at[0] >= len(names):
                    return
                name = names[fill_at[0]]
                fill_at[0] += 1
            store.put(name, body(r))
            with state:
                live.add(name)

    fill_seconds = run_threads(filler, [args.seed * 1000 + t for t in range(args.threads)])

    before = device_counters(args.stats_socket)
    lat = {op: [] for op, _ in mix}
    done = {"ops": 0, "bytes_written": 0, "bytes_read": 0, "errors": []}
    deadline = time.monotonic() + args.seconds
    ops_names = [op for op, _ in mix]
    weights = [w for _, w in mix]

    def worker(seed):
        r = random.Random(seed)
        while True:
            with state:
                if (args.ops and done["ops"] >= args.ops) or (not args.ops and time.monotonic() >= deadline):
                    return
                done["ops"] += 1
                op = r.choices(ops_names, weights)[0]
                # One operation per object at a time: take it out of the live set meanwhile.
                if op == "put" or not live:
                    name, op = None, "put"
                else:
                    name = r.choice(tuple(live)) if len(live) < 4096 else r.sample(sorted(live), 1)[0]
                    live.discard(name)
            if name is None:
                name = new_name()
            started = time.monotonic()
            try:
                if op in ("put", "update"):
                    b = body(r)
                    store.put(name, b)
                    written, read, keep = len(b), 0, True
                elif op == "get":
                    read, written, keep = store.get(name) or 0, 0, True
                else:
                    store.delete(name)
                    written, read, keep = 0, 0, False
            except Exception as e:  # reported, and the run fails
                with state:
                    done["errors"].append("%s %s: %s" % (op, name, e))
                return
            elapsed = time.monotonic() - started
            with state:
                lat[op].append(elapsed)
                done["bytes_written"] += written
                done["bytes_read"] += read
                if keep:
                    live.add(name)

    seconds = run_threads(worker, [args.seed * 7919 + t for t in range(args.threads)])
    after = device_counters(args.stats_socket)
    out = {
        "objects_filled": len(names),
        "fill_seconds": fill_seconds,
        "seconds": seconds,
        "ops": sum(len(v) for v in lat.values()),
        "ops_per_second": sum(len(v) for v in lat.values()) / seconds if seconds > 0 else 0.0,
        "bytes_written": done["bytes_written"],
        "bytes_read": done["bytes_read"],
        "per_op": {op: {"count": len(v), "latency": quartiles(v)} for op, v in lat.items()},
        "errors": done["errors"],
        "device": {k: after[k] - before.get(k, 0) for k in after},
    }
    print(json.dumps(out))
    if done["errors"]:
        raise SystemExit("errors: %s" % done["errors"][:5])


if __name__ == "__main__":
    main()
