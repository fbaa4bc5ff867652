#!/usr/bin/env python3
"""How much weight cost-benefit cleaning should give a segment's age: the victim score
``(1 - u) age^e / (1 + u)`` (salsa.ports.PowerCostBenefit, a Python policy) swept over the
exponent ``e`` with heatlog placement, on the workloads and spares of the cleaning study in
docs/BENCHMARKS.md (512 MiB pool, 1 MiB segments, GC inline: deterministic). ``e = 1`` is
cost-benefit and ``e = 0.5`` our sqrt-cost-benefit; the script checks that both ports give the
built-ins' write amplification to the last digit before it trusts the sweep.

Run with the package built (scripts/python-tests.sh builds it into target/py-venv):
    target/py-venv/bin/python scripts/study_age_exponent.py [--exponents 0.3,0.4,...] [--warmup 3]
Prints a Markdown table: WA per exponent, the lowest of each row in bold.
"""

import argparse

import salsa
from salsa import ports

WORKLOADS = ["hotcold:90/10", "zipf:1.0"]
SPARES = [10, 20, 28]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exponents", default="0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.2")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--spares", default=",".join(map(str, SPARES)))
    ap.add_argument("--warmup", type=float, default=3.0, help="volumes written before the measured one")
    a = ap.parse_args()
    exps = [float(x) for x in a.exponents.split(",")]
    for e in exps:
        salsa.register_victim(f"py-age^{e}", lambda aging, e=e: ports.PowerCostBenefit(aging, e))
    run = dict(memory_bytes=512 << 20, segment_bytes=1 << 20, warmup_volumes=a.warmup, measure_volumes=1.0, seed=1)
    print("| workload | spare | " + " | ".join(f"e = {e}" for e in exps) + " | best e |")
    print("|---|---:|" + "---:|" * (len(exps) + 1))
    for w in a.workloads.split(","):
        for spare in (float(s) for s in a.spares.split(",")):
            wa = {}
            for e in exps:
                (r,) = salsa.bench(w, [("heatlog", f"py-age^{e}")], spare_percent=spare, **run)
                wa[e] = r.wa
            for e, builtin in [(1.0, "cost-benefit"), (0.5, "sqrt-cost-benefit")]:
                if e in wa:
                    (r,) = salsa.bench(w, [("heatlog", builtin)], spare_percent=spare, **run)
                    assert r.wa == wa[e], f"{builtin}: built-in {r.wa} against its port's {wa[e]}"
            best = min(wa, key=wa.get)
            cells = [f"**{wa[e]:.3f}**" if e == best else f"{wa[e]:.3f}" for e in exps]
            print(f"| {w} | {spare:g}% | " + " | ".join(cells) + f" | {best} |", flush=True)


if __name__ == "__main__":
    main()
