"""SALSA from Python.

Pools and volumes (``Pool``, ``Volume``), the benchmark runner and trace replay (``bench``,
``replay``), and policies written in Python: subclass ``VictimPolicy`` or ``PlacementPolicy``,
``register_victim``/``register_placement`` it under a name, and use that name wherever a
built-in policy's name goes (``Pool.create(victim=...)``, ``create_volume(placement=...)``,
``bench(policies=[...])``). ``docs/POLICIES.md`` shows one policy in Rust and in Python and
what each call costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

from . import _salsa
from ._salsa import (  # noqa: F401  (re-exported)
    Candidates,
    Pool,
    Relocation,
    SegmentView,
    UserWrite,
    Volume,
    policies,
    policy_errors,
)

__version__ = _salsa.__version__

__all__ = [
    "Pool", "Volume", "bench", "replay", "compare_pairs", "BenchResult", "VictimPolicy",
    "PlacementPolicy", "register_victim", "register_placement", "policies", "policy_errors",
    "Candidates", "SegmentView", "UserWrite", "Relocation",
]


@dataclass
class BenchResult:
    """One policy pair's run of ``bench``: the figures ``salsa bench --json`` reports."""

    placement: str
    victim: str
    wa: float
    device_wa: float
    throughput_mbps_median: float
    latency_write: dict
    latency_read: dict
    samples: list
    raw: dict = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.placement}+{self.victim}"

    @classmethod
    def _of(cls, d: dict) -> "BenchResult":
        return cls(
            placement=d["placement"],
            victim=d["victim"],
            wa=d["wa"],
            device_wa=d["device_wa"],
            throughput_mbps_median=d["throughput_mbps_median"],
            latency_write=d["latency_write"],
            latency_read=d["latency_read"],
            samples=d.get("samples", []),
            raw=d,
        )


class BenchRun(list):
    """The results of one ``bench`` call, in the order the pairs ran, with ``table``: the
    Markdown table ``salsa bench`` prints (WA, WA relative to the lowest, throughput, p99s)."""

    table: str = ""


PolicyPair = Union[str, tuple]


def _pairs(policies: Union[PolicyPair, Iterable[PolicyPair]]) -> list:
    if isinstance(policies, (str, tuple)):
        policies = [policies]
    out = []
    for p in policies:
        if isinstance(p, tuple):
            placement, victim = p
            out.append(f"{placement}+{victim}")
        else:
            out.append(p)
    return out


def compare_pairs(policies: Union[PolicyPair, Iterable[PolicyPair]]) -> list:
    """Expands ``"placement+victim"`` items (``"all"``; ``*`` for every policy of a kind)
    against every registered policy, the ones written in Python included."""
    return _salsa.compare_pairs(_pairs(policies))


def bench(
    workload: str = "uniform",
    policies: Union[PolicyPair, Iterable[PolicyPair]] = ("salsa", "aging-greedy"),
    *,
    memory_bytes: int = 1 << 30,
    devices: Sequence[str] = (),
    spare_percent: float = 20.0,
    segment_bytes: Optional[int] = None,
    volume_bytes: Optional[int] = None,
    gc_garbage_percent: Optional[float] = None,
    read_percent: float = 0.0,
    block_bytes: int = 4096,
    queue_depth: int = 1,
    precondition: bool = True,
    warmup_volumes: float = 2.0,
    measure_volumes: float = 1.0,
    realtime: bool = False,
    gc_aging: float = 0.1,
    seed: int = 1,
    inline_gc: bool = True,
    trace_format: Optional[str] = None,
    trace_volume: Optional[str] = None,
    trace_repeat: int = 1,
    out_dir: Optional[str] = None,
    sample_ms: int = 500,
    quiet: bool = True,
) -> BenchRun:
    """Runs ``salsa bench`` in this process: each policy pair on a fresh pool (in memory by
    default, or on ``devices``), the workload (``uniform``, ``seq``, ``hotcold:90/10``,
    ``zipf:1.0``, ``dynzipf:1.0``, ``trace:PATH``) preconditioned, warmed up and measured.

    ``policies``: one ``(placement, victim)`` pair or ``"placement+victim"`` string, or a list
    of them; ``"all"`` and ``*`` expand as ``salsa bench --compare`` does. Python policies go by
    the names they were registered under. Defaults differ from the command's in one place:
    ``inline_gc=True`` and ``queue_depth=1``, the deterministic mode (one seed, one figure).
    With ``out_dir`` the report (``report.md``, ``results.json``, the SVG charts) is written
    there. Raises ``RuntimeError`` if a Python policy raised during the run."""
    results, table = _salsa.bench(
        workload=workload,
        policies=_pairs(policies),
        memory_bytes=memory_bytes,
        devices=list(devices),
        spare_percent=spare_percent,
        segment_bytes=segment_bytes,
        volume_bytes=volume_bytes,
        gc_garbage_percent=gc_garbage_percent,
        read_percent=read_percent,
        block_bytes=block_bytes,
        queue_depth=queue_depth,
        precondition=precondition,
        warmup_volumes=warmup_volumes,
        measure_volumes=measure_volumes,
        realtime=realtime,
        gc_aging=gc_aging,
        seed=seed,
        inline_gc=inline_gc,
        trace_format=trace_format,
        trace_volume=trace_volume,
        trace_repeat=trace_repeat,
        out_dir=out_dir,
        sample_ms=sample_ms,
        quiet=quiet,
    )
    run = BenchRun(BenchResult._of(d) for d in json.loads(results))
    run.table = table
    return run


def replay(trace: str, policies: Union[PolicyPair, Iterable[PolicyPair]] = ("salsa", "aging-greedy"), **kwargs: Any) -> BenchRun:
    """Replays a block trace (MSR, Alibaba, fio iolog, blkparse output, tracefs
    block_rq_issue events; the format is guessed or given as ``trace_format``) through each
    policy pair: ``bench(workload="trace:" + trace, ...)``, without preconditioning unless
    asked."""
    kwargs.setdefault("precondition", False)
    return bench(workload=f"trace:{trace}", policies=policies, **kwargs)


class VictimPolicy:
    """Base of victim-selection policies written in Python. The engine builds one per pool
    (and per volume that names it) by calling the class with the pool's aging factor, and
    calls ``score`` once per victim choice with every candidate segment; the lowest score is
    cleaned first. Override ``score``. Set ``counts_live_bands = True`` to have
    ``candidates.live_bands`` counted (a walk of every volume's map per choice)."""

    counts_live_bands = False

    def __init__(self, aging: float = 0.0) -> None:
        self.aging = aging

    def score(self, candidates: Candidates) -> Sequence[float]:
        raise NotImplementedError


class PlacementPolicy:
    """Base of placement policies written in Python. The engine builds one per volume by
    calling the class with the volume's size in pages, and calls ``place_user`` for every page
    a user writes and ``place_gc`` for every page the GC moves; each returns a stream number
    below ``user_streams`` (resp. ``gc_streams``), both 1 to 16. ``trimmed``,
    ``segment_reclaimed`` and ``resize`` are told what happened; ``state_bytes`` reports the
    memory the policy holds."""

    user_streams = 1
    gc_streams = 1

    def __init__(self, volume_pages: int) -> None:
        self.volume_pages = volume_pages

    def place_user(self, w: UserWrite) -> int:
        return 0

    def place_gc(self, r: Relocation) -> int:
        return 0


def register_victim(name: str, policy: Any, about: str = "") -> None:
    """Registers a victim policy under ``name``: ``policy(aging)`` builds it (a
    ``VictimPolicy`` subclass, or any callable returning an object with ``score``)."""
    _salsa.register_victim(name, policy, about)


def register_placement(name: str, policy: Any, about: str = "") -> None:
    """Registers a placement policy under ``name``: ``policy(volume_pages)`` builds it (a
    ``PlacementPolicy`` subclass, or any callable returning an object with ``user_streams``,
    ``gc_streams``, ``place_user`` and ``place_gc``)."""
    _salsa.register_placement(name, policy, about)
