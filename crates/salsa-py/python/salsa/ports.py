"""Python ports of built-in policies: examples to start a new policy from, and the check that
the engine calls Python policies faithfully (each gives the same write amplification as the
Rust policy it ports, on the same seed; ``tests/test_policies.py``)."""

from __future__ import annotations

import math

from . import PlacementPolicy, VictimPolicy


class Greedy(VictimPolicy):
    """``greedy``: the segment with the fewest valid grains."""

    def score(self, c):
        cap = float(c.capacity_grains)
        return [v / cap for v in c.valid_grains]


class PowerCostBenefit(VictimPolicy):
    """Cost-benefit with the age raised to ``exponent``: ``(1 - u) age^exponent / (1 + u)``.
    At 1 it is ``cost-benefit``, at 0.5 ``sqrt-cost-benefit``, exactly (same scores, so the
    same decisions); ``scripts/study_age_exponent.py`` sweeps the exponent."""

    def __init__(self, aging: float = 0.0, exponent: float = 1.0) -> None:
        super().__init__(aging)
        self.exponent = exponent

    def score(self, c):
        cap = float(c.capacity_grains)
        now, e = c.now_seq, self.exponent
        # The square root as the built-in takes it, so that 0.5 gives its scores to the bit.
        weight = math.sqrt if e == 0.5 else (lambda age: age**e)
        out = []
        for valid, sealed in zip(c.valid_grains, c.sealed_seq):
            u = valid / cap
            age = float(max(now - sealed, 0)) + 1.0
            out.append(-((1.0 - u) * weight(age) / (1.0 + u)))
        return out


class SqrtCostBenefit(PowerCostBenefit):
    """``sqrt-cost-benefit``: ``(1 - u) sqrt(age) / (1 + u)``, highest cleaned first."""

    def __init__(self, aging: float = 0.0) -> None:
        super().__init__(aging, 0.5)


class Fifo(VictimPolicy):
    """``fifo``: the segment sealed longest ago."""

    def score(self, c):
        return [float(s) for s in c.sealed_seq]


class MinAssoc(VictimPolicy):
    """``min-assoc`` (FSTL's min_assoc): the segment whose live pages belong to the fewest
    logical bands, then the emptiest. Asks the engine to count the bands."""

    counts_live_bands = True

    def score(self, c):
        cap = float(c.capacity_grains)
        out = []
        for valid, bands in zip(c.valid_grains, c.live_bands):
            b = max(bands, 1) if valid > 0 else 0
            out.append(float(b) + (valid / cap) * 0.999)
        return out


class SalsaHeat(PlacementPolicy):
    """``salsa``: a write is hot (user stream 0) when the version it replaces is younger than
    half the volume's mapped pages in clock ticks, judged by its segment's seal time; first
    writes are cold (stream 1); relocations go to the one GC stream."""

    user_streams = 2
    gc_streams = 1

    def place_user(self, w):
        prev = w.previous
        if prev is None:
            return 1
        age = 0 if prev.sealed_seq == 0 else max(w.now - prev.sealed_seq, 0)
        return 0 if age < max(w.mapped_pages // 2, 1) else 1

    def place_gc(self, r):
        return 0
