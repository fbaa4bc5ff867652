#!/usr/bin/env python3
"""What a policy written in Python costs: each built-in policy and its Python port
(salsa.ports) run side by side in one process on the same workload and seed, with the ratio
of their run times and the cost per Python call; then a replay of about a million writes
(the shipped MariaDB trace, repeated) with Python placement and victim policies.

Run with the package built (scripts/python-tests.sh builds it into target/py-venv):
    target/py-venv/bin/python scripts/bench_python_policy.py [--runs 3] [--repeat 80]
Prints Markdown for docs/BENCHMARKS.md.
"""

import argparse
import pathlib
import statistics
import time

import salsa
from salsa import ports

REPO = pathlib.Path(__file__).resolve().parents[1]


def timed(workload, pair, **kw):
    t = time.perf_counter()
    (r,) = salsa.bench(workload, [pair], **kw)
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=130, help="times the MariaDB trace is replayed")
    a = ap.parse_args()
    salsa.register_victim("py-greedy", ports.Greedy)
    salsa.register_placement("py-salsa", ports.SalsaHeat)
    run = dict(memory_bytes=512 << 20, segment_bytes=1 << 20, warmup_volumes=1.0, measure_volumes=1.0, seed=1)
    print("| built-in | Python port | WA (both) | run time ratio, median of %d | Python calls | cost per call |" % a.runs)
    print("|---|---|---:|---:|---:|---:|")
    for builtin, port in [(("salsa", "greedy"), ("salsa", "py-greedy")), (("salsa", "greedy"), ("py-salsa", "greedy"))]:
        ratios, extra = [], []
        for _ in range(a.runs):
            t_rust, r_rust = timed("zipf:1.0", builtin, **run)
            t_py, r_py = timed("zipf:1.0", port, **run)
            assert r_py.wa == r_rust.wa, (r_py.wa, r_rust.wa)
            ratios.append(t_py / t_rust)
            extra.append(t_py - t_rust)
        # Pages written by users and by the GC over the whole run (precondition, warm-up,
        # measure); each is one placement call. Victim choices: one call per segment cleaned.
        pages_total = (run["memory_bytes"] * 0.8 * (1 + run["warmup_volumes"] + run["measure_volumes"])) / 4096
        if port[0].startswith("py-"):
            calls = pages_total * r_rust.wa
            what = "placement"
        else:
            calls = r_rust.raw["gc_segments_cleaned"]
            what = "victim choice"
        per_call_us = statistics.median(extra) / calls * 1e6
        cost = f"{per_call_us:.2f} us" if per_call_us > 0 else "below the noise"
        print(f"| {'+'.join(builtin)} | {'+'.join(port)} | {r_rust.wa:.3f} | {statistics.median(ratios):.2f} | "
              f"about {calls:,.0f} ({what}) | {cost} |")
    trace = REPO / "traces" / "mariadb-oltp.ftrace"
    print()
    print(f"Replay of traces/mariadb-oltp.ftrace x {a.repeat}:")
    print()
    print("| policies | requests | WA | segments cleaned | wall seconds |")
    print("|---|---:|---:|---:|---:|")
    for pair in [("salsa", "greedy"), ("py-salsa", "py-greedy")]:
        t = time.perf_counter()
        # 520 MiB at 20% spare: a volume just large enough for the 408 MiB the trace touches,
        # so the repeated replay keeps the GC (and a Python victim policy) busy.
        (r,) = salsa.replay(str(trace), [pair], memory_bytes=520 << 20, trace_repeat=a.repeat)
        wall = time.perf_counter() - t
        requests = r.latency_write["count"] + r.latency_read["count"]
        print(f"| {'+'.join(pair)} | {requests:,} | {r.wa:.3f} | {r.raw['gc_segments_cleaned']:,} | {wall:.1f} |")


if __name__ == "__main__":
    main()
