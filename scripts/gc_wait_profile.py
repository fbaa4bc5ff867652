"""Where the GC and write-back threads of a paced RAID-5 bench wait, sampled from /proc.

Usage: python3 scripts/gc_wait_profile.py OUT_PREFIX SALSA_BINARY

Runs one round of `salsa bench-raid --dir /work/braid --only randwrite_4k --rounds 1
--seconds 10 --volume-percent 42 --pace-writes`, and for 6 s of SALSA's measured run reads
each `salsa-gc*` and `salsa-wb*` thread's state and kernel wait channel (`wchan`) every few
milliseconds. Prints, per thread class, the share of samples in each: "(running)" is state R
(on a core or waiting for one), `__iomap_dio_rw` a direct read or write in flight,
`futex_do_wait` a lock or condition variable, `submit_bio_wait` and `__sync_dirty_buffer`
a device sync. The sampler itself takes part of a core, so the bench runs a little slower
than without it (docs/BENCHMARKS.md).
"""
import os, sys, time, collections, subprocess
out, binary = sys.argv[1], sys.argv[2]
p = subprocess.Popen([binary, "bench-raid", "--dir", "/work/braid", "--only", "randwrite_4k", "--rounds", "1", "--seconds", "10", "--volume-percent", "42", "--pace-writes"], stdout=open(out + ".out", "w"), stderr=open(out + ".err", "w"))
time.sleep(0.5)
pid = p.pid
def errtext():
    return open(out + ".err").read()
while p.poll() is None and "in-place RAID-5" not in errtext():
    time.sleep(0.2)
time.sleep(8)
counts = collections.Counter()
end = time.time() + 6
n = 0
while time.time() < end:
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            if not (comm.startswith("salsa-gc") or comm.startswith("salsa-wb")):
                continue
            stat = open(f"/proc/{pid}/task/{t}/stat").read()
            state = stat.rsplit(")", 1)[1].split()[0]
            w = open(f"/proc/{pid}/task/{t}/wchan").read().strip() if state != "R" else "(running)"
            counts[(comm.rstrip("0123456789-"), w if w != "0" else "(none)")] += 1
        except OSError:
            pass
    n += 1
    time.sleep(0.002)
p.wait()
tot = collections.Counter()
for (c, w), k in counts.items():
    tot[c] += k
print(f"{n} samples")
for (c, w), k in sorted(counts.items(), key=lambda x: -x[1]):
    print(f"{c:10s} {w:28s} {k:6d} {100.0*k/tot[c]:5.1f}%")
