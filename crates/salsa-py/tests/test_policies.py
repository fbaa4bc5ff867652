"""Policies written in Python, called by the engine: ports of built-ins match them exactly,
a Python policy serves a real pool across a reopen, and a faulty one never takes the engine
down."""

import random

import pytest

import salsa
from salsa import ports

# Small, deterministic runs (the GC inline, queue depth 1): one seed gives one figure.
RUN = dict(memory_bytes=96 << 20, segment_bytes=1 << 20, warmup_volumes=1.5, measure_volumes=0.5, seed=7)


def setup_module():
    salsa.register_victim("py-greedy", ports.Greedy, "greedy, in Python")
    salsa.register_victim("py-sqrt-cost-benefit", ports.SqrtCostBenefit)
    salsa.register_victim("py-fifo", ports.Fifo)
    salsa.register_victim("py-min-assoc", ports.MinAssoc)
    salsa.register_victim("py-age^1", lambda aging: ports.PowerCostBenefit(aging, 1.0))
    salsa.register_victim("py-age^0.5", lambda aging: ports.PowerCostBenefit(aging, 0.5))
    salsa.register_placement("py-salsa", ports.SalsaHeat, "SALSA's heat separation, in Python")


def test_registered_policies_are_listed_beside_the_built_ins():
    victims, placements = salsa.policies()
    assert ("py-greedy", "greedy, in Python") in victims
    assert "greedy" in [n for n, _ in victims]
    assert ("py-salsa", "SALSA's heat separation, in Python") in placements
    assert ("salsa", "py-fifo") in salsa.compare_pairs("salsa+*")


@pytest.mark.parametrize(
    "builtin,port",
    [
        (("salsa", "greedy"), ("salsa", "py-greedy")),
        (("salsa", "sqrt-cost-benefit"), ("salsa", "py-sqrt-cost-benefit")),
        (("salsa", "fifo"), ("salsa", "py-fifo")),
        (("salsa", "min-assoc"), ("salsa", "py-min-assoc")),
        (("salsa", "cost-benefit"), ("salsa", "py-age^1")),
        (("salsa", "sqrt-cost-benefit"), ("salsa", "py-age^0.5")),
        (("salsa", "greedy"), ("py-salsa", "greedy")),
    ],
)
def test_a_python_port_gives_the_built_in_write_amplification(builtin, port):
    run = salsa.bench("zipf:1.0", [builtin, port], **RUN)
    assert [r.label for r in run] == ["+".join(builtin), "+".join(port)]
    ours, theirs = run
    assert ours.wa > 1.2, "the GC ran"
    assert theirs.wa == ours.wa
    assert theirs.raw["gc_segments_cleaned"] == ours.raw["gc_segments_cleaned"]
    assert "| " + "+".join(port) + " |" in run.table


def test_live_bands_are_counted_only_for_a_policy_that_asks():
    seen = {"asked": [], "not_asked": []}

    class Asks(ports.Greedy):
        counts_live_bands = True

        def score(self, c):
            seen["asked"].extend(c.live_bands)
            return super().score(c)

    class DoesNotAsk(ports.Greedy):
        def score(self, c):
            seen["not_asked"].extend(c.live_bands)
            return super().score(c)

    salsa.register_victim("py-asks-bands", Asks)
    salsa.register_victim("py-no-bands", DoesNotAsk)
    asked, not_asked = salsa.bench("zipf:1.0", [("salsa", "py-asks-bands"), ("salsa", "py-no-bands")], **RUN)
    # Same decisions (both greedy), but only one was handed the counts.
    assert asked.wa == not_asked.wa
    assert seen["not_asked"] and set(seen["not_asked"]) == {0}
    # Zipf writes scatter: candidates hold live pages of many bands.
    assert seen["asked"] and min(seen["asked"]) >= 1 and max(seen["asked"]) > 10


def test_a_different_python_policy_changes_the_outcome():
    class Youngest(salsa.VictimPolicy):
        """Cleans the most recently sealed segment: a bad policy, measurably worse."""

        def score(self, c):
            return [-float(s) for s in c.sealed_seq]

    salsa.register_victim("py-youngest", Youngest)
    greedy, youngest = salsa.bench("zipf:1.0", [("salsa", "greedy"), ("salsa", "py-youngest")], **RUN)
    assert youngest.wa > greedy.wa * 1.05


def test_a_python_policy_serves_a_pool_and_is_found_again_on_reopen(scratch):
    img = str(scratch / "pool.img")
    calls = {"score": 0, "place_user": 0, "place_gc": 0}

    class CountingGreedy(ports.Greedy):
        def score(self, c):
            calls["score"] += 1
            return super().score(c)

    class CountingPlacement(ports.SalsaHeat):
        def place_user(self, w):
            calls["place_user"] += 1
            assert 0 <= w.page < w.volume_pages
            return super().place_user(w)

        def place_gc(self, r):
            calls["place_gc"] += 1
            assert r.victim.stream.startswith(("user:", "gc:"))
            return super().place_gc(r)

    salsa.register_victim("py-counting", CountingGreedy)
    salsa.register_placement("py-counting", CountingPlacement)
    with salsa.Pool.create([f"{img}:96M"], segment_bytes=1 << 20, victim="py-counting", placement="py-counting") as pool:
        assert pool.victim_policy == "py-counting"
        vol = pool.create_volume("v", 64 << 20)
        # Rounds in shuffled order over two thirds of the pool, so that overwrites leave
        # segments partly live and the GC (and the Python victim policy) must clean:
        # sequential rounds empty whole segments, which need no cleaning at all.
        blocks = list(range(0, 64 << 20, 64 << 10))
        order = random.Random(1)
        for round_ in range(4):
            order.shuffle(blocks)
            for block in blocks:
                vol.write(block, bytes([round_ + 1]) * (64 << 10))
        stats = pool.stats()
        assert stats["gc_bytes_relocated"] >= 0 and stats["gc_segments_cleaned"] > 0
        assert stats["volumes"][0]["placement"] == "py-counting"
    assert calls["score"] > 0 and calls["place_user"] >= 4 * (64 << 20) // 4096
    before = dict(calls)
    with salsa.Pool.open([img]) as pool:
        vol = pool.volume("v")
        assert vol.read(0, 4096) == bytes([4]) * 4096
        vol.write(0, b"\x09" * 4096)
    assert calls["place_user"] > before["place_user"]
    assert salsa.policy_errors() == []


def test_a_faulty_python_policy_falls_back_is_reported_and_fails_the_run():
    class Raising(salsa.VictimPolicy):
        def score(self, c):
            raise RuntimeError("policy bug")

    class WrongLength(salsa.VictimPolicy):
        def score(self, c):
            return [0.0]

    class OutOfRange(salsa.PlacementPolicy):
        user_streams = 2

        def place_user(self, w):
            return 5

    salsa.register_victim("py-raising", Raising)
    salsa.register_victim("py-wrong-length", WrongLength)
    salsa.register_placement("py-out-of-range", OutOfRange)
    salsa.policy_errors()
    for pair, says in [
        (("salsa", "py-raising"), "policy bug"),
        (("salsa", "py-wrong-length"), "scores for"),
        (("py-out-of-range", "greedy"), "returned stream 5; it declared 2"),
    ]:
        with pytest.raises(RuntimeError, match=says):
            salsa.bench("uniform", [pair], **RUN)
        errors = salsa.policy_errors()
        assert errors and says in errors[0], errors


def test_registration_checks_the_policy_and_its_name():
    with pytest.raises(ValueError, match="built-in"):
        salsa.register_victim("greedy", ports.Greedy)
    with pytest.raises(ValueError, match="without"):
        salsa.register_victim("a+b", ports.Greedy)
    with pytest.raises(ValueError, match="1 to 32 bytes"):
        salsa.register_placement("x" * 33, ports.SalsaHeat)
    with pytest.raises(TypeError, match="score"):
        salsa.register_victim("py-none", lambda aging: object())
    with pytest.raises(TypeError, match="place_user"):
        salsa.register_placement("py-none", lambda pages: type("P", (), {"user_streams": 1, "gc_streams": 1})())

    class TooManyStreams(salsa.PlacementPolicy):
        user_streams = 17

    with pytest.raises(ValueError, match="1 to 16"):
        salsa.register_placement("py-many", TooManyStreams)
    with pytest.raises(ValueError, match="unknown victim policy"):
        salsa.bench("uniform", [("salsa", "py-never-registered")], **RUN)
