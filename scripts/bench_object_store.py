#!/usr/bin/env python3
"""The SALSA paper's object-store case study (section V-C), on this machine.

An object server writing the way Swift does (scripts/object_store.py: temporary file, body,
metadata in an extended attribute, fsync, rename, directory fsync; 128 KiB and 1 MiB objects;
PUT, GET, UPDATE, DELETE; 32 in flight) runs on XFS over an NBD export attached with nbdfuse
and a loop device, once on a drive-managed SMR disk model served raw (`salsa serve --raw`) and
once through a SALSA dual-mapping volume on an identical fresh model, in one run. The models
keep their clocks, so the report gives each target's operations per second of modelled device
time, the device's own counters (media-cache writes, bands cleaned, seeks), and the wall-clock
latency quartiles per operation (which on this machine are the host's, not the model's).

    python3 scripts/bench_object_store.py                 # the benchmark: 8 GiB model, 60 s
    python3 scripts/bench_object_store.py --quick         # a short run (the test suite's)
    python3 scripts/bench_object_store.py --phased --svg fig.svg   # as the paper's Fig. 7

--phased runs the paper's protocol instead of the mixed timed phase: for each object size on
its own, PUT every object, then UPDATE, GET and DELETE each once (caches dropped before each
phase), and reports each phase's throughput per modelled second, drawn with --svg.

Prints one JSON object with both targets and the ratios; needs root (loop devices, mounts).
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from object_store import parse_size  # noqa: E402  (the workload's own size parser)


def salsa_binary():
    """The salsa binary: $SALSA_BIN (the test suite's), or the release build, built if missing."""
    if os.environ.get("SALSA_BIN"):
        return os.environ["SALSA_BIN"]
    path = os.path.join(ROOT, "target", "release", "salsa")
    if not os.path.exists(path):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "salsa-cli"], cwd=ROOT, check=True)
    return path


def wait_for(path, what, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc is not None and proc.poll() is not None:
            raise SystemExit("%s exited before %s appeared" % (proc.args, what))
        if time.monotonic() > deadline:
            raise SystemExit("%s did not appear" % what)
        time.sleep(0.05)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit("%s failed: %s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def retry(cmd, timeout, done=lambda: False):
    """Runs `cmd` until it succeeds (or `done()` says its work is done anyway), every half
    second for up to `timeout` seconds; returns None then, else the last attempt's error
    output."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode == 0 or done():
            return None
        if time.monotonic() > deadline:
            return r.stderr.strip()
        time.sleep(0.5)


def umount(mnt, timeout=30):
    """Unmounts `mnt`, retrying while it is busy: a database that has just stopped, or the
    kernel's last writeback, can hold it for a few seconds. Raises after `timeout` seconds."""
    err = retry(["umount", mnt], timeout, done=lambda: not os.path.ismount(mnt))
    if err is not None:
        raise SystemExit("umount %s still failing after %d s: %s" % (mnt, timeout, err))


def mounted_paths():
    """The mount points /proc/mounts lists (a disconnected FUSE mount among them, which
    os.path.ismount cannot stat)."""
    with open("/proc/mounts") as f:
        return {line.split()[1] for line in f}


def tear_down(mounts=(), loops=(), fuses=(), server=None, timeout=30):
    """Takes a stack down from the top, every step bounded so a busy mount or a stuck process
    can never hang the caller: unmounts `mounts` (lazily if still busy after `timeout`), detaches
    `loops`, unmounts each nbdfuse `(directory, process)` of `fuses` and waits for it (a mount an
    exited nbdfuse left is detached lazily), then stops
    `server`. Every step is tried; the first failure is raised at the end."""
    errors = []

    def attempt(what, cmd):
        err = retry(cmd, timeout)
        if err is not None:
            errors.append("%s: %s" % (what, err))
        return err is None

    def stop(proc, terminate):
        if terminate:
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            errors.append("%s did not exit within %d s; killed" % (proc.args[0], timeout))
            proc.kill()
            proc.wait()

    for mnt in mounts:
        if os.path.ismount(mnt) and not attempt("umount " + mnt, ["umount", mnt]):
            subprocess.run(["umount", "-l", mnt])
    for loop in loops:
        attempt("losetup -d " + loop, ["losetup", "-d", loop])
    for fuse_dir, proc in fuses:
        if proc.poll() is None:
            attempt("fusermount3 -u " + fuse_dir, ["fusermount3", "-u", fuse_dir])
        stop(proc, terminate=False)
        # An nbdfuse whose server died has exited and left its mount behind, disconnected.
        if fuse_dir in mounted_paths():
            attempt("fusermount3 -u -z " + fuse_dir, ["fusermount3", "-u", "-z", fuse_dir])
    if server is not None:
        stop(server, terminate=True)
    if errors:
        raise SystemExit("tear-down: " + "; ".join(errors))


def attach_nbd(fuse_dir, uri, loop_args=()):
    """Attaches NBD export `uri` as a block device: nbdfuse mounted on `fuse_dir` (made when
    missing), a loop device over its node (`loop_args` given to losetup). Returns (nbdfuse
    process, loop device) for the caller to tear down (`tear_down`); when the loop device
    cannot be made, nbdfuse is unmounted before the error goes up."""
    os.makedirs(fuse_dir, exist_ok=True)
    fuse = subprocess.Popen(["nbdfuse", fuse_dir, uri])
    try:
        wait_for(os.path.join(fuse_dir, "nbd"), "the nbdfuse node", fuse)
        loop = run(["losetup", "-f", "--show"] + list(loop_args) + [os.path.join(fuse_dir, "nbd")]).strip()
    except BaseException:
        tear_down([], [], [(fuse_dir, fuse)], None)
        raise
    return fuse, loop


@contextlib.contextmanager
def xfs_over_salsa(d, serve_args, export, loop_args=(), mkfs_args=()):
    """Serves `serve_args` from directory `d`, attaches export `export` with nbdfuse and a loop
    device (`loop_args` given to losetup), makes XFS on it (`mkfs_args` given to mkfs.xfs) and
    mounts it; yields (mount point,
    control socket, loop device). Unmounts, checks the file system with xfs_repair -n and
    stops everything on the way out."""
    os.makedirs(d)
    sock, ctl = os.path.join(d, "nbd.sock"), os.path.join(d, "pool.ctl")
    log = open(os.path.join(d, "serve.log"), "w")
    server = subprocess.Popen(
        [salsa_binary(), "serve", "--no-tcp", "--unix", sock, "--control", ctl] + list(serve_args), stdout=log, stderr=log
    )
    fuse_dir, mnt = os.path.join(d, "fuse"), os.path.join(d, "mnt")
    os.makedirs(mnt)
    fuse = loop = None
    mounted = False
    try:
        wait_for(sock, "the NBD socket", server)
        wait_for(ctl, "the control socket", server)
        fuse, loop = attach_nbd(fuse_dir, "nbd+unix:///%s?socket=%s" % (export, sock), loop_args)
        run(["mkfs.xfs", "-q", "-f"] + list(mkfs_args) + [loop])
        run(["mount", loop, mnt])
        mounted = True
        yield mnt, ctl, loop
        umount(mnt)
        mounted = False
        run(["xfs_repair", "-n", loop])
    finally:
        try:
            tear_down([mnt] if mounted else [], [loop] if loop else [], [(fuse_dir, fuse)] if fuse is not None else [], server)
        finally:
            log.close()


def one_target(name, serve_args, export, workload_args, work):
    """Serves, attaches, makes XFS, runs the workload with `workload_args`; returns its
    report."""
    with xfs_over_salsa(os.path.join(work, name), serve_args, export) as (mnt, ctl, _):
        out = run([sys.executable, os.path.join(HERE, "object_store.py"), "--dir", mnt, "--stats-socket", ctl] + workload_args)
        report = json.loads(out.strip().splitlines()[-1])
    if "phases" in report:
        return report
    model_seconds = report["device"].get("model_time_us", 0) / 1e6
    report["model_seconds"] = model_seconds
    report["ops_per_model_second"] = report["ops"] / model_seconds if model_seconds > 0 else None
    report["written_mib_per_model_second"] = report["bytes_written"] / (1 << 20) / model_seconds if model_seconds > 0 else None
    return report


def phased(args, raw_serve, dual_serve):
    """The paper's protocol, per object size: phases PUT, UPDATE, GET, DELETE."""
    sizes = args.sizes.split(",")
    # About the same bytes per size: fewer objects when they are larger.
    smallest = min(parse_size(s) for s in sizes)
    report = {"model": args.model, "threads": args.threads, "sizes": {}}
    for size in sizes:
        objects = max(50, args.objects * smallest // parse_size(size))
        workload = ["--objects", str(objects), "--sizes", size, "--threads", str(args.threads)]
        workload += ["--phases", "put,update,get,delete", "--drop-caches"]
        work = tempfile.mkdtemp(prefix="salsa-objects-")
        try:
            raw = one_target("raw", raw_serve, "raw", workload, work)["phases"]
            dual = one_target("salsa-dual", dual_serve, "default", workload, work)["phases"]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        ratios = {}
        for r, d in zip(raw, dual):
            if r["ops_per_model_second"] and d["ops_per_model_second"]:
                ratios[r["op"]] = d["ops_per_model_second"] / r["ops_per_model_second"]
        report["sizes"][size] = {"objects": objects, "raw": raw, "salsa_dual": dual, "ratio_ops_per_model_second": ratios}
    print(save_report(report, args.out, args.svg, phase_chart))


def save_report(report, out, svg, chart):
    """Writes the report as JSON to `out` and `chart(report)` to `svg`, each when given;
    returns the JSON text."""
    text = json.dumps(report, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    if svg:
        with open(svg, "w") as f:
            f.write(chart(report))
    return text


def phase_chart(
    report,
    title="Object server on XFS, drive-managed SMR model: operations per modelled second",
    metric="ops_per_model_second",
    salsa="salsa_dual",
):
    """Grouped bars, one panel per object size: `metric` of each phase, raw against SALSA
    (the report's `salsa` target), each bar labelled with its value (also bench_swift.py's
    Fig. 7)."""
    sizes = list(report["sizes"])
    panel_w, h, top, bottom, left = 330, 300, 40, 50, 50
    w = left + panel_w * len(sizes) + 20
    colors = {"raw": "#9e9e9e", salsa: "#1f77b4"}
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">' % (w, h)]
    out.append('<rect width="100%" height="100%" fill="white"/>')
    out.append('<text x="%d" y="16" font-size="13">%s</text>' % (left, title))
    for i, size in enumerate(sizes):
        s = report["sizes"][size]
        phases = [p["op"] for p in s["raw"]]
        top_value = max(max(p[metric] or 0 for p in s[t]) for t in ("raw", salsa)) or 1
        x0 = left + i * panel_w
        plot_h = h - top - bottom
        out.append('<text x="%d" y="%d" font-size="12">%s objects</text>' % (x0 + 10, top - 6, size))
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (x0, h - bottom, x0 + panel_w - 20, h - bottom))
        group = (panel_w - 30) / len(phases)
        for j, op in enumerate(phases):
            for k, t in enumerate(("raw", salsa)):
                v = s[t][j][metric] or 0
                bh = plot_h * v / top_value
                bx = x0 + 5 + j * group + k * (group / 2 - 2)
                out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (bx, h - bottom - bh, group / 2 - 4, bh, colors[t]))
                out.append('<text x="%.1f" y="%.1f" font-size="9">%.0f</text>' % (bx, h - bottom - bh - 3, v))
            out.append('<text x="%.1f" y="%d">%s</text>' % (x0 + 5 + j * group + 4, h - bottom + 14, op.upper()))
    for k, (t, label) in enumerate((("raw", "raw dmsmr"), (salsa, "SALSA dual mapping"))):
        out.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>' % (left + k * 160, h - 22, colors[t]))
        out.append('<text x="%d" y="%d">%s</text>' % (left + 14 + k * 160, h - 13, label))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dmsmr:size=8G", help="the device model, as salsa --device takes it")
    ap.add_argument("--objects", type=int, default=3000, help="objects stored before the timed phase")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--sizes", default="128K,1M")
    ap.add_argument("--quick", action="store_true", help="a 2 GiB model, 300 objects, 8 s")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--salsa-args", default="", help="more arguments for the SALSA server (e.g. --placement user-gc)")
    ap.add_argument("--phased", action="store_true", help="the paper's protocol: one phase per operation, per object size")
    ap.add_argument("--svg", help="with --phased: draw the phases' throughput per modelled second here")
    args = ap.parse_args()
    if args.quick:
        args.model, args.objects, args.seconds = "dmsmr:size=2G", 300, 8.0
    for tool in ("nbdfuse", "losetup", "mkfs.xfs", "xfs_repair", "fusermount3"):
        if shutil.which(tool) is None:
            raise SystemExit("%s is missing: run scripts/install-deps.sh" % tool)
    raw_serve = ["--raw", "-d", args.model]
    dual_serve = ["-d", args.model, "--controller", "dual", "--read-cache", "0"] + args.salsa_args.split()
    if args.phased:
        return phased(args, raw_serve, dual_serve)
    work = tempfile.mkdtemp(prefix="salsa-objects-")
    mixed = ["--objects", str(args.objects), "--seconds", str(args.seconds), "--threads", str(args.threads), "--sizes", args.sizes]
    try:
        raw = one_target("raw", raw_serve, "raw", mixed, work)
        dual = one_target("salsa-dual", dual_serve, "default", mixed, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = lambda k: (dual[k] / raw[k]) if raw.get(k) and dual.get(k) else None
    report = {
        "model": args.model,
        "objects": args.objects,
        "seconds": args.seconds,
        "threads": args.threads,
        "sizes": args.sizes,
        "raw": raw,
        "salsa_dual": dual,
        "ratio_ops_per_model_second": ratio("ops_per_model_second"),
        "ratio_ops_per_wall_second": ratio("ops_per_second"),
    }
    print(save_report(report, args.out, None, None))


if __name__ == "__main__":
    main()
