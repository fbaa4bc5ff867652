#!/usr/bin/env python3
"""Records a block trace of a real application running on a SALSA volume, for `salsa bench
--workload trace:PATH` and the cleaning studies.

The volume is served by `salsa serve` (defaults), attached with nbdfuse and a loop device, and
formatted ext4 (mounted with online discard, so deleted files become trims); then the kernel's
`block:block_rq_issue` tracepoint, filtered to the loop device, records every request the file
system sends while the workload runs. The trace is what tracefs prints
(`/sys/kernel/tracing/trace`), which `salsa bench` reads as `--trace-format ftrace`; on a machine
where `blktrace` may run, `blktrace -d DEV -o - | blkparse -i -` gives the same requests in the
format `salsa bench` reads as `blkparse`. (On this project's machines blktrace is refused
access to its relay files, while tracefs works.)

Workloads:
  ext4      a file tree written, a third of it rewritten in place, half deleted, more written
  mariadb   MariaDB under sysbench OLTP read/write (tables prepared, then --seconds of run)

    python3 scripts/record_trace.py ext4 traces/ext4-files.ftrace
    python3 scripts/record_trace.py mariadb traces/mariadb-oltp.ftrace --seconds 10

Needs root (loop devices, mounts, tracefs), nbdfuse, and for mariadb MariaDB and sysbench
(scripts/install-deps.sh installs them).
"""

import argparse
import gzip
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_mixed import MariaDB, sysbench  # noqa: E402
from bench_oltp import Target  # noqa: E402

TRACEFS = "/sys/kernel/tracing"
EVENT = os.path.join(TRACEFS, "events", "block", "block_rq_issue")


def tracefs():
    if not os.path.isdir(EVENT):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=False)
    if not os.path.isdir(EVENT):
        raise SystemExit("tracefs with block events is not available at " + TRACEFS)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


class Recording:
    """The block_rq_issue events of one device, from start() to stop()."""

    def __init__(self, device):
        st = os.stat(device)
        # The kernel's dev_t in trace events: major << 20 | minor.
        self.dev = os.major(st.st_rdev) << 20 | os.minor(st.st_rdev)

    def start(self):
        write(os.path.join(TRACEFS, "tracing_on"), "0")
        write(os.path.join(TRACEFS, "buffer_size_kb"), "65536")
        write(os.path.join(EVENT, "filter"), "dev == %d" % self.dev)
        write(os.path.join(TRACEFS, "trace"), "")
        write(os.path.join(EVENT, "enable"), "1")
        write(os.path.join(TRACEFS, "tracing_on"), "1")

    def stop(self, out):
        write(os.path.join(EVENT, "enable"), "0")
        with open(os.path.join(TRACEFS, "trace")) as f:
            text = f.read()
        write(os.path.join(EVENT, "filter"), "0")
        write(os.path.join(TRACEFS, "trace"), "")
        # "# entries-in-buffer/entries-written: N/M": fewer in the buffer than written means lost.
        for line in text.splitlines()[:5]:
            if "entries-in-buffer/entries-written:" in line:
                kept, written = line.split(":")[1].split()[0].split("/")
                if kept != written:
                    raise SystemExit("the trace buffer overflowed: %s of %s events kept" % (kept, written))
        if out.endswith(".gz"):
            # ftrace text compresses about tenfold; salsa bench reads gzip as it comes.
            with gzip.open(out, "wt") as f:
                f.write(text)
        else:
            write(out, text)
        return sum(1 for line in text.splitlines() if "block_rq_issue:" in line)


def ext4_files(mnt, args):
    rng = random.Random(args.seed)
    root = os.path.join(mnt, "tree")
    files = []
    for d in range(args.dirs):
        os.makedirs(os.path.join(root, "d%03d" % d))
        for i in range(args.files_per_dir):
            p = os.path.join(root, "d%03d" % d, "f%04d" % i)
            size = rng.choice([4096, 16384, 65536, 262144, 1 << 20])
            with open(p, "wb") as f:
                f.write(os.urandom(size))
            files.append((p, size))
        subprocess.run(["sync"], check=True)
    # A third rewritten in place (random 4 KiB blocks), as an application updating its files.
    for p, size in rng.sample(files, len(files) // 3):
        with open(p, "r+b") as f:
            for _ in range(max(1, size // 16384)):
                f.seek(rng.randrange(0, size // 4096) * 4096)
                f.write(os.urandom(4096))
            os.fsync(f.fileno())
    # Half deleted (online discard trims their blocks), then new files where they were.
    for p, _ in rng.sample(files, len(files) // 2):
        os.unlink(p)
    subprocess.run(["sync"], check=True)
    for i in range(len(files) // 4):
        with open(os.path.join(root, "new%05d" % i), "wb") as f:
            f.write(os.urandom(rng.choice([65536, 262144])))
    subprocess.run(["sync"], check=True)


def mariadb_oltp(mnt, args, d):
    db = MariaDB(os.path.join(mnt, "data"), d)
    db.start(args.buffer_pool)
    try:
        prep = sysbench(db.sock, args, "prepare")
        out, _ = prep.communicate()
        if prep.returncode != 0:
            raise SystemExit("sysbench prepare failed: " + out[-2000:])
        bench = sysbench(db.sock, args, "run", args.seconds)
        out, _ = bench.communicate()
        if bench.returncode != 0:
            raise SystemExit("sysbench run failed: " + out[-2000:])
    finally:
        db.stop()
    subprocess.run(["sync"], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=["ext4", "mariadb"])
    ap.add_argument("out", help="the trace file to write (gzip-compressed when it ends in .gz)")
    ap.add_argument("--size", default="512M", help="the SALSA volume's pool file")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dirs", type=int, default=8, help="ext4: directories")
    ap.add_argument("--files-per-dir", type=int, default=40, help="ext4: files per directory")
    ap.add_argument("--seconds", type=int, default=10, help="mariadb: seconds of sysbench run")
    ap.add_argument("--tables", type=int, default=2)
    ap.add_argument("--table-size", type=int, default=5000)
    ap.add_argument("--db-threads", type=int, default=4)
    ap.add_argument("--buffer-pool", default="32M", help="mariadb: InnoDB buffer pool size")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one in /var/tmp)")
    args = ap.parse_args()
    tracefs()
    work = tempfile.mkdtemp(prefix="salsa-record-", dir=args.dir or "/var/tmp")
    t = Target("salsa", work, args)
    try:
        mnt = t.start()
        subprocess.run(["mount", "-o", "remount,discard", mnt], check=True)
        rec = Recording(t.loop)
        rec.start()
        try:
            if args.workload == "ext4":
                ext4_files(mnt, args)
            else:
                mariadb_oltp(mnt, args, t.d)
        finally:
            n = rec.stop(args.out)
        print("recorded %d requests of %s on %s into %s" % (n, args.workload, t.loop, args.out))
        if n == 0:
            raise SystemExit("no requests were recorded")
    finally:
        t.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
