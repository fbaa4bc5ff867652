#!/usr/bin/env python3
"""Side-by-side runs of two NBD servers over fio's nbd engine, alternating, each round on a fresh
1 GiB backing file (written with zeros first, or with --sparse created empty as `salsa serve
--device new.img:1G` or `truncate` would): two builds of `salsa` (A/B of a change), or a build against
`nbdkit file cache=none` (give `nbdkit` as a server) or `nbdkit file` as it comes, through the page
cache (give `nbdkit-default`).

Rounds alternate which side goes first. Each round starts the server, fills the volume once with 1 MiB writes, runs the workload, and
reports the bandwidth (or IOPS for `fsync`) and the server's CPU time (user + system, all
threads, from /proc) per GiB moved during the workload. The summary gives medians per server.

Workloads:
  write1m    1 MiB sequential writes, QD 8 (time-based)
  randread   4 KiB random reads, QD 32
  randwrite  4 KiB random writes, QD 32
  fsync      4 KiB random writes at QD 1, each followed by a flush (IOPS)
  fsync4     the same from 4 clients at once, 8 KiB writes (a database's commits from
             several connections; IOPS of all four)
  cpu1m      6.4 GiB of 1 MiB sequential writes, QD 8 (fixed work, for CPU per GiB)

Usage: scripts/bench_ab.py --a target/release/salsa --b nbdkit --workload write1m [--rounds 3]
       [--seconds 6] [--dir bench-ab] [--sparse] [--salsa-arg=ARG ...]
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, time

WORKLOADS = {
    "write1m": dict(rw="write", bs="1M", qd=8),
    "randread": dict(rw="randread", bs="4k", qd=32),
    "randwrite": dict(rw="randwrite", bs="4k", qd=32),
    "fsync": dict(rw="randwrite", bs="4k", qd=1, extra=["--fsync=1"]),
    "fsync4": dict(rw="randwrite", bs="8k", qd=1, extra=["--fsync=1", "--numjobs=4", "--group_reporting"]),
    "cpu1m": dict(rw="write", bs="1M", qd=8, extra=["--loops=8"], fixed=True),
}
POOL_MIB = 1024
FILL = "800M"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, proc, what):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"{what} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not start")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, all threads


def fio(uri, args):
    out = subprocess.run(["fio", "--ioengine=nbd", f"--uri={uri}", "--output-format=json"] + args,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fio failed: {out.stderr}{out.stdout}")
    return json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]


def one_round(server, work, seconds, d, sparse, salsa_args):
    img = os.path.join(d, "pool.img")
    if os.path.exists(img):
        os.remove(img)
    if sparse:
        with open(img, "wb") as f:
            f.truncate(POOL_MIB << 20)
    else:
        subprocess.run(["dd", "if=/dev/zero", f"of={img}", "bs=1M", f"count={POOL_MIB}", "oflag=direct"],
                       check=True, capture_output=True)
    port = free_port()
    if server in ("nbdkit", "nbdkit-default"):
        cmd = ["nbdkit", "-f", "-p", str(port), "-i", "127.0.0.1", "file", img] + (["cache=none"] if server == "nbdkit" else [])
        uri = f"nbd://127.0.0.1:{port}/"
    else:
        cmd = [server, "serve", "--device", f"{img}:{POOL_MIB << 20}", "--listen", f"127.0.0.1:{port}"] + salsa_args
        uri = f"nbd://127.0.0.1:{port}/default"
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, server)
        fio(uri, ["--name=fill", "--rw=write", "--bs=1M", "--iodepth=8", f"--size={FILL}"])
        args = [f"--name={work['rw']}", f"--rw={work['rw']}", f"--bs={work['bs']}", f"--iodepth={work['qd']}",
                f"--size={FILL}"] + work.get("extra", [])
        if not work.get("fixed"):
            args += ["--time_based", f"--runtime={seconds}"]
        before = cpu_ticks(proc.pid)
        job = fio(uri, args)
        ticks = cpu_ticks(proc.pid) - before
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    side = job["read"] if work["rw"].endswith("read") else job["write"]
    gib = side["io_bytes"] / 2**30
    hz = os.sysconf("SC_CLK_TCK")
    return {"mbps": side["bw_bytes"] / 1e6, "iops": side["iops"], "cpu_s_per_gib": ticks / hz / gib if gib else 0.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="a salsa binary, nbdkit (cache=none) or nbdkit-default")
    ap.add_argument("--b", required=True, help="a salsa binary, nbdkit (cache=none) or nbdkit-default")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="write1m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--dir", default="bench-ab")
    ap.add_argument("--sparse", action="store_true", help="backing files created empty, not written with zeros")
    ap.add_argument("--salsa-arg", action="append", default=[],
                    help="one more argument for every `salsa serve` (repeat for several)")
    a = ap.parse_args()
    for tool in ["fio"] + (["nbdkit"] if {"nbdkit", "nbdkit-default"} & {a.a, a.b} else []):
        if not shutil.which(tool):
            sys.exit(f"{tool} missing: run scripts/install-deps.sh")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    work = WORKLOADS[a.workload]
    runs = {"a": [], "b": []}
    for r in range(a.rounds):
        # Which side runs first alternates: on this kind of host the first of a pair often
        # runs faster (the disk's cache, the other side's writeback), in both directions.
        pair = (("a", a.a), ("b", a.b))
        for key, server in (pair if r % 2 == 0 else pair[::-1]):
            res = one_round(server, work, a.seconds, a.dir, a.sparse, a.salsa_arg)
            runs[key].append(res)
            print(f"round {r + 1} {key} {server}: {res['mbps']:.1f} MB/s, {res['iops']:.0f} IOPS, "
                  f"{res['cpu_s_per_gib']:.3f} CPU s/GiB", file=sys.stderr)
    report = {"workload": a.workload, "rounds": a.rounds, "seconds": a.seconds, "sparse": a.sparse, "servers": {}}
    for key, server in (("a", a.a), ("b", a.b)):
        rs = runs[key]
        report["servers"][key] = {
            "server": server,
            "mbps_median": round(statistics.median(x["mbps"] for x in rs), 1),
            "iops_median": round(statistics.median(x["iops"] for x in rs)),
            "cpu_s_per_gib_median": round(statistics.median(x["cpu_s_per_gib"] for x in rs), 3),
            "runs": [{k: round(v, 3) for k, v in x.items()} for x in rs],
        }
    sa, sb = report["servers"]["a"], report["servers"]["b"]
    report["ratio_b_over_a"] = round(sb["mbps_median"] / sa["mbps_median"], 3) if sa["mbps_median"] else None
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
