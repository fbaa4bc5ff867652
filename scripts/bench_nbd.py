#!/usr/bin/env python3
"""fio's nbd engine against `salsa serve` and, side by side in the same run, the peers a user
would compare it with, each on a backing file of the same size on the same disk, each file
written with zeros first (SALSA formats its own in place).

Pairings:
  default  every server as it comes: `salsa serve` (O_DIRECT and its DRAM read cache),
           `nbdkit file` and `qemu-nbd` (both through the kernel's page cache);
  direct   no cache on either side: `salsa serve --read-cache 0 --write-buffer 0` against
           `nbdkit file cache=none` (which still writes through the page cache, evicting
           behind, and never syncs unless the client flushes).

Workloads, in this order within a round: 4 KiB random reads at queue depth 32 (after a fill),
4 KiB random writes at queue depth 32 (long enough that SALSA's GC runs), 1 MiB sequential
writes at queue depth 8 right after the random ones, and 4 KiB random writes each followed by
a flush at queue depth 1 (what a database's log does). Each workload runs on every server of
the pairing in alternation, ROUNDS times; after each run the server gets a flush (untimed), so
that what it deferred is written before the next server's window. The report gives medians
and SALSA's ratio to each peer.

Usage: scripts/bench_nbd.py [--pairing default|direct|all] [--size-mib 1024] [--seconds 20]
                            [--rounds 3] [--dir bench-nbd] [--only LABEL] [--salsa-arg=ARG ...]
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, time

WORK = [
    ("randread 4k qd32", "randread", "4k", 32, ()),
    ("randwrite 4k qd32", "randwrite", "4k", 32, ()),
    ("write 1M qd8 after random", "write", "1M", 8, ()),
    ("randwrite+flush 4k qd1", "randwrite", "4k", 1, ("--fsync=1",)),
]

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def wait_port(port, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close(); return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not start")

def fio(uri, name, rw, bs, iodepth, seconds, size=None, extra=()):
    cmd = ["fio", f"--name={name.replace(' ', '_')}", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={iodepth}", "--output-format=json", "--group_reporting"]
    if seconds:
        cmd += ["--time_based", f"--runtime={seconds}"]
    if size:
        cmd += [f"--size={size}"]
    out = subprocess.run(cmd + list(extra), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fio failed: {out.stderr}{out.stdout}")
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["read"] if rw.endswith("read") else job["write"]
    return side["bw_bytes"] / 1e6

def flush(uri):
    """An NBD flush, sent by qemu-io."""
    subprocess.run(["qemu-io", "-f", "raw", "-c", "flush", uri], check=True, capture_output=True)

def zero_file(path, mib):
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "oflag=direct"], check=True, capture_output=True)

def start_servers(pairing, a, d):
    """Starts the servers of a pairing; returns {name: (process, uri)} with SALSA first."""
    size = a.size_mib << 20
    servers = {}
    port = free_port()
    # Every backing file is prepared alike, written with zeros: a sparse file would make the
    # file system allocate under one side's writes and not the other's.
    zero_file(f"{d}/pool.img", a.size_mib)
    salsa_cmd = [a.salsa, "serve", "--device", f"{d}/pool.img:{size}", "--listen", f"127.0.0.1:{port}"]
    if pairing == "direct":
        salsa_cmd += ["--read-cache", "0", "--write-buffer", "0"]
    salsa_cmd += a.salsa_arg
    servers["salsa"] = (subprocess.Popen(salsa_cmd, stderr=open(f"{d}/salsa.log", "w")), port, "/default")
    zero_file(f"{d}/nbdkit.img", a.size_mib)
    port = free_port()
    nbdkit = ["nbdkit", "-f", "-p", str(port), "-i", "127.0.0.1", "file", f"{d}/nbdkit.img"]
    if pairing == "direct":
        nbdkit.append("cache=none")
    servers["nbdkit"] = (subprocess.Popen(nbdkit, stderr=open(f"{d}/nbdkit.log", "w")), port, "/")
    if pairing == "default":
        zero_file(f"{d}/qemu.img", a.size_mib)
        port = free_port()
        # -t only keeps the server up between fio runs (it serves one client at a time either way).
        qemu = ["qemu-nbd", "-f", "raw", "-t", "-b", "127.0.0.1", "-p", str(port), f"{d}/qemu.img"]
        servers["qemu-nbd"] = (subprocess.Popen(qemu, stderr=open(f"{d}/qemu.log", "w")), port, "/")
    out = {}
    for name, (proc, port, path) in servers.items():
        wait_port(port, proc, name)
        out[name] = (proc, f"nbd://127.0.0.1:{port}{path}")
    return out

def run_pairing(pairing, a):
    d = os.path.join(a.dir, pairing)
    shutil.rmtree(d, ignore_errors=True); os.makedirs(d)
    servers = start_servers(pairing, a, d)
    try:
        uris = {n: u for n, (_, u) in servers.items()}
        vol = int(subprocess.run(["nbdinfo", "--size", uris["salsa"]], capture_output=True, text=True, check=True).stdout)
        # Every server sees the same logical size: SALSA's volume (80% of its file).
        for uri in uris.values():
            fio(uri, "fill", "write", "1M", 8, 0, size=vol)
        results = {}
        work = [w for w in WORK if a.only is None or any(o in w[0] for o in a.only.split(","))]
        for r in range(a.rounds):
            for label, rw, bs, qd, extra in work:
                for name, uri in uris.items():
                    bw = fio(uri, label, rw, bs, qd, a.seconds, size=vol, extra=extra)
                    # Each server writes what it deferred before the next one's window opens:
                    # otherwise a page-cache server's writeback (or SALSA's destage) lands in
                    # another server's measured window. Not timed.
                    flush(uri)
                    results.setdefault(label, {}).setdefault(name, []).append(bw)
                    print(f"[{pairing}] {label:26} round {r + 1} {name:8} {bw:8.1f} MB/s", file=sys.stderr)
        stats = subprocess.run([a.salsa, "stats", "--json", "--device", f"{d}/pool.img"], capture_output=True, text=True).stdout
        report = {"volume_bytes": vol, "workloads": {}}
        for label, by in results.items():
            s = statistics.median(by["salsa"])
            row = {"salsa_mbps_median": round(s, 2), "salsa_runs": [round(x, 2) for x in by["salsa"]]}
            for peer in [n for n in uris if n != "salsa"]:
                k = statistics.median(by[peer])
                row[f"{peer}_mbps_median"] = round(k, 2)
                row[f"{peer}_runs"] = [round(x, 2) for x in by[peer]]
                row[f"ratio_vs_{peer}"] = round(s / k, 3) if k > 0 else None
            report["workloads"][label] = row
        report["salsa_stats"] = json.loads(stats) if stats.strip() else None
        return report
    finally:
        for name, (proc, _) in servers.items():
            proc.send_signal(signal.SIGTERM)
        for name, (proc, _) in servers.items():
            proc.wait()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairing", choices=["default", "direct", "all"], default="all")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="bench-nbd")
    ap.add_argument("--salsa", default="target/release/salsa")
    ap.add_argument("--only", default=None, help="run only workloads whose label contains this (or one of these, comma-separated)")
    ap.add_argument("--salsa-arg", action="append", default=[],
                    help="one more argument for `salsa serve` (repeat for several; to try an option)")
    a = ap.parse_args()
    for tool in ["fio", "nbdkit", "nbdinfo", "qemu-nbd"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} missing: run scripts/install-deps.sh")
    pairings = ["default", "direct"] if a.pairing == "all" else [a.pairing]
    report = {"size_mib": a.size_mib, "seconds": a.seconds, "rounds": a.rounds, "pairings": {}}
    for p in pairings:
        report["pairings"][p] = run_pairing(p, a)
    print(json.dumps(report, indent=1))

if __name__ == "__main__":
    main()
