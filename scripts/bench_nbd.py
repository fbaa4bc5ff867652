#!/usr/bin/env python3
"""fio's nbd engine against `salsa serve` and, side by side in the same run, against
`nbdkit file` on a backing file of the same size on the same disk.

Workloads: 4 KiB random reads (after a fill), 4 KiB random writes at queue depth 32 (long
enough that SALSA's GC runs), 1 MiB sequential writes. Each workload runs on both servers in
alternation, ROUNDS times; the report gives the median bandwidth of each and the ratio.

Usage: scripts/bench_nbd.py [--size-mib 1024] [--seconds 20] [--rounds 3] [--dir bench-nbd]
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, time

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
    cmd = ["fio", f"--name={name}", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
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

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="bench-nbd")
    ap.add_argument("--salsa", default="target/release/salsa")
    ap.add_argument("--page-cache", action="store_true", help="SALSA through the page cache, against nbdkit's default (also cached)")
    ap.add_argument("--only", default=None, help="run only workloads whose label contains this")
    a = ap.parse_args()
    for tool in ["fio", "nbdkit", "nbdinfo"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} missing: run scripts/install-deps.sh")
    shutil.rmtree(a.dir, ignore_errors=True); os.makedirs(a.dir)
    size = a.size_mib << 20
    raw = os.path.join(a.dir, "nbdkit.img")
    subprocess.run(["dd", "if=/dev/zero", f"of={raw}", "bs=1M", f"count={a.size_mib}", "oflag=direct"], check=True, capture_output=True)
    sp, kp = free_port(), free_port()
    # Like with like: SALSA with O_DIRECT against nbdkit cache=none (it drops pages after use;
    # nbdkit 1.32 has no O_DIRECT), or both through the page cache with --page-cache.
    salsa = subprocess.Popen([a.salsa, "serve", "--device", f"{a.dir}/pool.img:{size}", "--listen", f"127.0.0.1:{sp}"]
                             + (["--page-cache"] if a.page_cache else []), stderr=open(f"{a.dir}/salsa.log", "w"))
    nbdkit = subprocess.Popen(["nbdkit", "-f", "-p", str(kp), "-i", "127.0.0.1", "file", raw] + ([] if a.page_cache else ["cache=none"]),
                              stderr=open(f"{a.dir}/nbdkit.log", "w"))
    try:
        wait_port(sp, salsa, "salsa"); wait_port(kp, nbdkit, "nbdkit")
        uris = {"salsa": f"nbd://127.0.0.1:{sp}/default", "nbdkit": f"nbd://127.0.0.1:{kp}/"}
        vol = int(subprocess.run(["nbdinfo", "--size", uris["salsa"]], capture_output=True, text=True, check=True).stdout)
        # Both see the same logical size: SALSA's volume (80% of its file).
        for name, uri in uris.items():
            fio(uri, "fill", "write", "1M", 8, 0, size=vol)
        results = {}
        work = [("randread 4k qd32", "randread", "4k", 32), ("randwrite 4k qd32", "randwrite", "4k", 32), ("write 1M qd8", "write", "1M", 8)]
        for label, rw, bs, qd in [w for w in work if a.only is None or a.only in w[0]]:
            for r in range(a.rounds):
                for name, uri in uris.items():
                    bw = fio(uri, label, rw, bs, qd, a.seconds, size=vol)
                    results.setdefault(label, {}).setdefault(name, []).append(bw)
                    print(f"{label:18} round {r + 1} {name:6} {bw:8.1f} MB/s", file=sys.stderr)
        stats = subprocess.run([a.salsa, "stats", "--json", "--device", f"{a.dir}/pool.img"], capture_output=True, text=True).stdout
        report = {"mode": "page cache" if a.page_cache else "O_DIRECT vs nbdkit cache=none", "volume_bytes": vol, "seconds": a.seconds, "rounds": a.rounds, "workloads": {}}
        for label, by in results.items():
            s, k = statistics.median(by["salsa"]), statistics.median(by["nbdkit"])
            report["workloads"][label] = {"salsa_mbps_median": round(s, 1), "nbdkit_mbps_median": round(k, 1),
                                          "ratio": round(s / k, 3), "salsa_runs": [round(x, 1) for x in by["salsa"]],
                                          "nbdkit_runs": [round(x, 1) for x in by["nbdkit"]]}
        report["salsa_stats"] = json.loads(stats) if stats.strip() else None
        print(json.dumps(report, indent=1))
    finally:
        salsa.send_signal(signal.SIGTERM); nbdkit.terminate()
        salsa.wait(); nbdkit.wait()

if __name__ == "__main__":
    main()
