"""The pipeline schedule replay (issue 18, Must 5's "predicted bubble from the replay"):
``analysis.job.pipeline.replay`` rebuilds a step from per-stage block times and P2P latency for a
schedule; checked against the simulator's own event times (tests/pipesim.py, an independent list
scheduler) and, from the measured blocks, against the measured step."""

from __future__ import annotations

import pytest

from tests import pipesim as ps
from tracelens.analysis import analyze
from tracelens.analysis.job import pipeline as jp
from tracelens.store.job import load


def _stage_ns(sim) -> dict[int, tuple[int, int]]:
    """Per global stage, (F, B) of micro-batch 0 as the simulator timed it."""
    out = {}
    for g in range(sim.p * sim.v):
        f = sim.times[(g % sim.p, ps.Action("F", g, 0))]
        b = sim.times[(g % sim.p, ps.Action("B", g, 0))]
        out[g] = (f[1] - f[0], b[1] - b[0])
    return out


@pytest.mark.parametrize(("schedule", "p", "m"), [(s, p, m) for s in ps.SCHEDULES for p in (2, 4, 8) for m in (4, 8, 32)])
def test_replay_equals_the_simulator_at_m_prime(schedule, p, m):
    # the stage times read at the simulator's m, the replay at m' = 2m against the simulator run at m'
    v = 2 if schedule == "interleaved" else 1
    if schedule == "interleaved" and m % p:
        m = p * max(1, m // p)
    sim = ps.simulate(schedule, p, m, v=2, latency_ns=30_000, slow_stage=1 if p > 1 else None, steps=1)
    at = ps.simulate(schedule, p, 2 * m, v=2, latency_ns=30_000, slow_stage=1, steps=1)
    got = jp.replay(schedule, p, 2 * m, v, _stage_ns(sim), 30_000)
    want = max(e for (_, e) in at.times.values())  # the last compute's end: the step's makespan
    assert got["step_ns"] == want
    busy = sum(e - s for (s, e) in at.times.values())
    assert got["bubble_fraction"] == pytest.approx(1 - busy / (p * want))


def test_replay_of_gpipe_by_hand():
    # p=2, m=2, F=1, B=2 on both stages, no latency: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] F1 [2,3],
    # B0 [3,5] B1 [5,7]; stage 0 B0 [5,7] B1 [7,9]: step 9, busy 6+6 of 2*9 -> bubble 1/3 = (p-1)/(m+p-1)
    got = jp.replay("gpipe", 2, 2, 1, {0: (1, 2), 1: (1, 2)})
    assert got["step_ns"] == 9
    assert got["bubble_fraction"] == pytest.approx(1 / 3)
    assert jp.replay("zero_bubble", 2, 2, 1, {0: (1, 2), 1: (1, 2)}) is None
    assert jp.replay("gpipe", 2, 2, 1, {0: (1, 2)}) is None


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_measured_replay_and_the_suggestion(tmp_path, schedule):
    # no latency: the replay from the measured blocks reproduces the measured step (the windows: the
    # makespan, plus the sends' tail the sim adds) within 5%; the suggestion's what_if is the replay at m'
    sim = ps.simulate(schedule, 4, 8, v=2, slow_stage=2, annotations="none", steps=2)
    d = analyze(load(ps.write(sim, tmp_path), use_cache=False)).to_dict()
    rep = d["job"]["pipeline"]["replay"]
    assert rep["step_ns"] == pytest.approx(max(e for (_, e) in sim.times.values()), rel=0.01)
    assert rep["step_ns"] == pytest.approx(rep["measured_step_ns"], rel=0.05)
    sg = next(s for s in d["suggestions"] if s["id"] == "pipeline_schedule")
    w = sg["what_if"]
    m2 = int(w["change"].split("=")[1])
    at = ps.simulate(schedule, 4, m2, v=2, slow_stage=2, steps=1,
                     tf_ns=1_000_000 * 8 // m2, tb_ns=2_000_000 * 8 // m2)  # the same batch in m2 micro-batches
    want = max(e for (_, e) in at.times.values()) + (rep["measured_step_ns"] - rep["step_ns"])
    assert w["predicted_step_ns"] == pytest.approx(want, rel=0.01)
    assert w["predicted_speedup"] == pytest.approx(rep["measured_step_ns"] / w["predicted_step_ns"], rel=1e-3)
    mb = [o for o in sg["evidence"]["options"] if o["change"] == "microbatches"]
    assert all("replay_fraction" in o for o in mb)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_replay_on_real_recordings(pipeline_traces, schedule):
    # the real gloo runs: the replay holds only the measured blocks (P2P latency 0), so it is at most
    # the measured step; the gap is the blocking gloo transfers (ms each on 2 shared cores)
    d = analyze(load(pipeline_traces[schedule], use_cache=False)).to_dict()
    rep = d["job"]["pipeline"]["replay"]
    assert rep is not None
    assert 0 < rep["step_ns"] <= rep["measured_step_ns"] * 1.05
    print(schedule, rep)
