"""`salsa.bench` and `salsa.replay`: workloads and the shipped traces, results as objects, and
the report a comparison writes."""

import json

import pytest

import salsa


def test_bench_compares_policies_and_writes_the_report(scratch):
    out = scratch / "report"
    # The built-in victim policies only (other test modules register Python ones, some of
    # them faulty on purpose, in the same process).
    victims = [n for n, _ in salsa.policies()[0] if not n.startswith("py-")]
    run = salsa.bench(
        "hotcold:90/10",
        ["user-gc+greedy"] + [f"sepbit+{v}" for v in victims],
        memory_bytes=96 << 20,
        segment_bytes=1 << 20,
        warmup_volumes=1,
        measure_volumes=0.5,
        out_dir=str(out),
        sample_ms=50,
    )
    assert len(victims) >= 6
    assert len(run) == 1 + len(victims)
    assert run[0].label == "user-gc+greedy"
    for r in run:
        assert isinstance(r, salsa.BenchResult)
        assert 1.0 < r.wa < 10.0 and r.device_wa >= r.wa
        assert r.latency_write["count"] > 1000
        assert r.latency_read["count"] == 0
        assert r.samples
    assert json.loads((out / "results.json").read_text())[0]["wa"] == run[0].wa
    report = (out / "report.md").read_text()
    assert run.table in report
    assert all(f"| {r.label} |" in report for r in run)
    assert (out / "wa.svg").exists() and (out / "latency_cdf.svg").exists()


def test_replay_of_a_shipped_trace(repo):
    trace = repo / "traces" / "ext4-files.ftrace"
    run = salsa.replay(str(trace), ["salsa+greedy", "sepbit+fifo"], memory_bytes=640 << 20, trace_repeat=2)
    for r in run:
        assert r.raw["measured_user_bytes_written"] > 2 * 2000 * 4096, r.raw
        assert r.wa >= 1.0


def test_bench_refuses_bad_arguments():
    with pytest.raises(ValueError, match="PLACEMENT\\+VICTIM"):
        salsa.bench("uniform", ["salsa"])
    with pytest.raises(ValueError):
        salsa.bench("zipf:abc", ["salsa+greedy"])
    with pytest.raises(ValueError, match="spare_percent"):
        salsa.bench("uniform", ["salsa+greedy"], spare_percent=120)
    with pytest.raises(RuntimeError, match="block size"):
        salsa.bench("uniform", ["salsa+greedy"], block_bytes=1000, memory_bytes=32 << 20)
    with pytest.raises(RuntimeError):
        salsa.replay("/nonexistent/trace.csv", memory_bytes=32 << 20)
