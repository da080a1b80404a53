"""The pipeline simulator (tests/pipesim.py) against the schedules' theory, and its traces as tracelens reads them."""

from __future__ import annotations

import pytest

from tests import pipesim as ps

CASES = [(s, p, m) for s in ps.SCHEDULES for p in (2, 4, 8) for m in (4, 8, 32) if not (s == "interleaved" and m % p)]


@pytest.mark.parametrize(("schedule", "p", "m"), CASES)
def test_equal_stages_zero_latency_is_the_theory(schedule, p, m):
    sim = ps.simulate(schedule, p, m, v=2, tf_ns=1_000_000, tb_ns=2_000_000, latency_ns=0)
    want = (p - 1) / ((2 if schedule == "interleaved" else 1) * m + p - 1)
    assert sim.answer["theory_fraction"] == pytest.approx(want)
    for r, a in sim.answer["ranks"].items():
        assert a["bubble_fraction"] == pytest.approx(want, abs=1e-9), (r, a)
        assert a["warmup_ns"] + a["cooldown_ns"] + a["steady_ns"] == a["bubble_ns"]
        assert a["compute_ns"] == m * 3_000_000


def test_phases_of_gpipe():
    """GPipe on stage s: warm-up s*tf, cool-down s*tb, the F->B turn (p-1-s)(tf+tb) between."""
    p, m, tf, tb = 4, 8, 1_000_000, 2_000_000
    sim = ps.simulate("gpipe", p, m, tf_ns=tf, tb_ns=tb)
    for s, a in sim.answer["ranks"].items():
        assert a["warmup_ns"] == s * tf
        assert a["cooldown_ns"] == s * tb
        assert a["steady_ns"] == (p - 1 - s) * (tf + tb)


def test_latency_and_a_slow_stage_add_bubble():
    base = ps.simulate("1f1b", 4, 8).answer["bubble_fraction"]
    assert ps.simulate("1f1b", 4, 8, latency_ns=200_000).answer["bubble_fraction"] > base + 0.02
    slow = ps.simulate("1f1b", 4, 8, slow_stage=2, slow_factor=1.5).answer
    assert slow["ranks"][2]["bubble_fraction"] < slow["ranks"][0]["bubble_fraction"]  # the slow stage waits least
    assert slow["bubble_fraction"] > base + 0.05


def test_orders_are_the_schedules():
    o = ps.orders("1f1b", 4, 8)
    assert [f"{a.kind}{a.mb}" for a in o[3][:4]] == ["F0", "B0", "F1", "B1"]
    assert [f"{a.kind}{a.mb}" for a in o[0][:5]] == ["F0", "F1", "F2", "F3", "B0"]
    inter = ps.orders("interleaved", 2, 4, v=2)
    assert sorted({a.stage for a in inter[1]}) == [1, 3]
    assert len(inter[0]) == 2 * 2 * 4
    with pytest.raises(ValueError):
        ps.orders("interleaved", 4, 6, v=2)


def test_traces_read_as_one_job(tmp_path):
    from tracelens.analysis import analyze
    from tracelens.store.job import load

    sim = ps.simulate("1f1b", 4, 8)
    d = analyze(load(ps.write(sim, tmp_path))).to_dict()
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    for r in d["ranks"]:
        kept = [s for s in r["steps"] if not s["warmup"]][:2]
        assert [s["dur_ns"] for s in kept] == [sim.makespan] * 2  # each step's window is the makespan
