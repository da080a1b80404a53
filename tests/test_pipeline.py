"""Pipeline parallelism (issue 18): the stages, p, m, v and the schedule detected, and the bubble
measured per rank against the simulator's known answer (tests/pipesim.py), on real CPU pipeline
runs (tests/pipe_recorder.py), and no claim on a job whose SendRecv kernels are collectives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import pipesim as ps
from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.model.saved import validator
from tracelens.store.job import load


def _report(paths) -> dict:
    d = analyze(load(paths, use_cache=False)).to_dict()
    assert validator().first_error(d) is None, validator().first_error(d)
    return d


def _check_against(sim, d, tol=0.02):
    pipe, want = d["job"]["pipeline"], sim.answer
    assert pipe["stages"] == sim.p
    assert pipe["microbatches"] == sim.m
    assert pipe["virtual_stages"] == sim.v
    assert pipe["schedule"] == sim.schedule, pipe["evidence"]
    assert pipe["theory_fraction"] == pytest.approx(want["theory_fraction"])
    assert pipe["bubble_fraction"] == pytest.approx(want["bubble_fraction"], abs=tol)
    for r in d["ranks"]:
        got, exp = r["pipeline"], want["ranks"][r["rank"]]
        assert got["stage"] == exp["stage"]
        assert got["bubble_fraction"] == pytest.approx(exp["bubble_fraction"], abs=tol)
        assert got["warmup_ns"] + got["cooldown_ns"] + got["steady_ns"] == got["bubble_ns"]
        n = len(got["steps"])
        assert got["warmup_ns"] == pytest.approx(n * exp["warmup_ns"], abs=0.02 * n * exp["step_ns"])
        assert got["cooldown_ns"] == pytest.approx(n * exp["cooldown_ns"], abs=0.02 * n * exp["step_ns"])


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=st.sampled_from(ps.SCHEDULES), p=st.sampled_from([2, 4, 8]), m=st.sampled_from([4, 8, 32]),
       annotations=st.sampled_from(["torch", "pp", "none"]), latency=st.sampled_from([0, 50_000]),
       slow=st.sampled_from([None, 1]))
def test_simulated_pipelines_are_recovered(tmp_path_factory, schedule, p, m, annotations, latency, slow):
    if schedule == "interleaved" and m % p:  # (Megatron's interleaved schedule needs m a multiple of p)
        m = p * max(1, m // p)
    sim = ps.simulate(schedule, p, m, v=2, latency_ns=latency, slow_stage=slow if slow is None or slow < p else None,
                      annotations=annotations, steps=2)
    d = _report(ps.write(sim, tmp_path_factory.mktemp("sim")))
    _check_against(sim, d)


@pytest.mark.parametrize(("schedule", "p", "m", "annotations"), [
    ("gpipe", 4, 8, "none"), ("1f1b", 8, 4, "none"), ("1f1b", 2, 32, "torch"), ("interleaved", 4, 8, "none"), ("interleaved", 2, 4, "pp"),
])
def test_simulated_cases(tmp_path, schedule, p, m, annotations):
    sim = ps.simulate(schedule, p, m, v=2, annotations=annotations, latency_ns=20_000)
    _check_against(sim, _report(ps.write(sim, tmp_path)))


def test_a_slow_stage_shows_where_it_waits_least(tmp_path):
    sim = ps.simulate("1f1b", 4, 8, slow_stage=2, slow_factor=1.6)
    d = _report(ps.write(sim, tmp_path))
    _check_against(sim, d)
    fr = {r["rank"]: r["pipeline"]["bubble_fraction"] for r in d["ranks"]}
    assert min(fr, key=fr.get) == 2
    assert d["job"]["pipeline"]["bubble_fraction"] > d["job"]["pipeline"]["theory_fraction"] + 0.05


def test_ranks_missing_make_no_claim_on_p(tmp_path):
    """Two middle ranks of an 8-stage pipeline: no p, no stages, and the evidence says why."""
    sim = ps.simulate("1f1b", 8, 8, annotations="none")
    paths = ps.write(sim, tmp_path)
    d = _report([paths[3], paths[4]])
    pipe = d["job"]["pipeline"]
    assert pipe["stages"] is None and pipe["theory_fraction"] is None
    assert pipe["confidence"] == "low"
    assert any("2 of 8 ranks" in e for e in pipe["evidence"])
    assert [r["pipeline"]["stage"] for r in d["ranks"]] == [None, None]
    assert pipe["schedule"] == "1f1b"  # the rank's own blocks alternate: that much can be told


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_real_cpu_pipeline(pipeline_traces, schedule):
    d = _report(pipeline_traces[schedule])
    _no_false_clock(d)  # one host's clock: P2P pairs bound the offset to their transfers, no collective sets it
    pipe = d["job"]["pipeline"]
    assert pipe["stages"] == 2
    assert pipe["microbatches"] == 4
    assert pipe["virtual_stages"] == (2 if schedule == "interleaved" else 1)
    assert pipe["schedule"] == schedule, pipe["evidence"]
    assert pipe["confidence"] == "high"
    assert pipe["theory_fraction"] == pytest.approx(1 / (4 * pipe["virtual_stages"] + 1))
    stages = [r["pipeline"]["stage"] for r in d["ranks"]]
    assert stages == [0, 1]
    for r in d["ranks"]:
        pr = r["pipeline"]
        # the bubble is the window less the stage's CPU ops (its compute), split into the three phases
        assert pr["bubble_ns"] + pr["busy_ns"] == pr["window_ns"]
        assert pr["warmup_ns"] + pr["cooldown_ns"] + pr["steady_ns"] == pr["bubble_ns"]
        assert 0 <= pr["exposed_p2p_ns"] <= pr["bubble_ns"]
        # a real run's bubble against the theory depends on how the 2 cores were shared while it was recorded
        # (1F1B measured 0.08 beside theory 0.2 in a loaded CI run, 0.49 in a quiet one): bounded, not pinned
        assert 0 < pr["bubble_fraction"] < 1.0
        for s in pr["steps"]:
            assert s["forward_blocks"] == 4 * pipe["virtual_stages"] == s["backward_blocks"]
    first, last = (r["pipeline"] for r in d["ranks"])
    assert last["warmup_ns"] > first["warmup_ns"]  # the last stage waits for the first forward to arrive
    # the gap to the theory, attributed: consistent with the per-stage compute the trace shows
    g = pipe["gap"]
    per_step = [r["pipeline"]["busy_ns"] / len(r["pipeline"]["steps"]) for r in d["ranks"]]
    assert g["stage_compute_ns"] == [pytest.approx(b, abs=1) for b in per_step]
    assert g["slowest_stage"] == max(range(2), key=lambda s: per_step[s])
    assert g["slow_stage_ns"] + g["p2p_ns"] + g["host_ns"] == g["gap_ns"] == pytest.approx(pipe["bubble_ns"] - g["theory_bubble_ns"], abs=2)
    assert min(g["slow_stage_ns"], g["p2p_ns"], g["host_ns"]) >= 0


def test_trace_filter_makes_no_claim():
    """2 of 128 ranks whose SendRecv kernels are all-to-all, all-gather and all-reduce: no pipeline."""
    d = _report(sorted((real_traces() / "hta" / "trace_filter").glob("*.json.gz")))
    pipe = d["job"]["pipeline"]
    assert {k: pipe[k] for k in ("stages", "microbatches", "virtual_stages", "schedule", "confidence", "bubble_fraction",
                                 "theory_fraction")} == dict.fromkeys(("stages", "microbatches", "virtual_stages", "schedule",
                                                                       "confidence", "bubble_fraction", "theory_fraction"))
    text = " ".join(pipe["evidence"])
    assert "2 of 128 ranks" in text and "alltoall" in text and "not pipeline P2P" in text
    assert all(r["pipeline"]["stage"] is None for r in d["ranks"])


def test_no_pipeline_no_key(tmp_path):
    """A trace without P2P: no job pipeline key, the rank's three keys as before."""
    d = _report([real_traces() / "amd-tracelens" / "b200" / "eager_trace.json.gz"])
    assert "pipeline" not in d["job"]
    assert set(d["ranks"][0]["pipeline"]) == {"stage", "bubble_ns", "bubble_fraction"}


def _no_false_clock(d):
    assert not [w for w in d["warnings"] if "clock differs" in w or "do not overlap in aligned time" in w], d["warnings"]


def test_simulated_p2p_sets_no_clock_offset(tmp_path):
    """The simulator's ranks share one clock: P2P send/recv are no collective to align on, and the
    pairs' bounds (a recv cannot end before its send starts) keep the offsets at 0."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=50_000, slow_stage=1)
    a = analyze(load(ps.write(sim, tmp_path), use_cache=False))
    d = a.to_dict()
    _no_false_clock(d)
    assert [r.clock_offset_ns for r in a.ranks] == [0, 0, 0, 0]
    p2p = a.collectives.filter(a.collectives["collective"].is_in(["send", "recv"]))
    assert p2p.height and (p2p["n_ranks"] == 1).all()  # each rank's send/recv is its own row, never matched as a collective


def test_p2p_bounds():
    from tracelens.analysis.job.clocks import _within_bounds, p2p_bounds

    # rank 0 sends at 100 (its clock), rank 1's recv ends at 50 (its clock): off_1 - off_0 >= 50;
    # rank 1 sends at 200, rank 0's recv ends at 290: off_0 - off_1 >= -90, i.e. off_1 - off_0 <= 90
    pairs = {0: {"what": ["send", "recv"], "peer": [1, 1], "step": [1, 1], "k": [0, 0], "s": [100, 280], "e": [120, 290]},
             1: {"what": ["recv", "send"], "peer": [0, 0], "step": [1, 1], "k": [0, 0], "s": [10, 200], "e": [50, 210]}}
    b = p2p_bounds(pairs, {0: 0, 1: 1})
    assert b == {(0, 1): (50, 90)}
    off = {0: 0, 1: 7_000}
    assert _within_bounds(off, {1}, b) == {1} and off[1] == 90
    off = {0: 0, 1: 60}
    assert _within_bounds(off, {1}, b) == set() and off[1] == 60
    # a step-start estimate (soft) the pairs contradict is dropped: the file goes back to its own clock, 0, here in the
    # range [-1000, 100] (a V-shaped pipeline's 2-rank run put -6.16 ms from step starts into [-6.16 ms, 92 us])
    wide = {(0, 1): (-1000, 100)}
    off = {0: 0, 1: -7_000}
    assert _within_bounds(off, {1}, wide, soft={1}) == {1} and off[1] == 0
    off = {0: 0, 1: -7_000}
    assert _within_bounds(off, {1}, wide) == {1} and off[1] == -1000  # an estimate that is no guess (not soft): the range's end
    off = {0: 0, 1: -400}
    assert _within_bounds(off, {1}, wide, soft={1}) == set() and off[1] == -400  # inside the range: kept
    off = {0: 0, 1: 7_000}
    assert _within_bounds(off, {1}, b, soft={1}) == {1} and off[1] == 50  # 0 outside [50, 90]: the nearest end
    pairs[0]["e"][1] = 150  # off_1 - off_0 <= -50 < 50: contradicting bounds (lo > hi): the records do not pair so, no bound
    assert p2p_bounds(pairs, {0: 0, 1: 1}) == {}


def _bars(r) -> dict[str, int]:
    return {b["key"]: b["ns"] for b in r["waterfall"]}


def test_waterfall_bubble_is_the_pipeline_measurement(tmp_path):
    """On a pipeline rank the waterfall's bubble bar is the measured bubble (idle outside the blocks
    and the exposed P2P the stage waits on), not the idle before a P2P kernel; the bars still
    partition the window exactly."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=50_000, slow_stage=2, slow_factor=1.6)
    d = _report(ps.write(sim, tmp_path))
    for r in d["ranks"]:
        bars, pr = _bars(r), r["pipeline"]
        assert sum(bars.values()) == r["window_ns"]
        assert bars["pipeline_bubble"] == pr["bubble_ns"]  # the simulator's blocks have no gaps inside them
        assert bars["exposed_comm"] == 0  # the P2P transfers are the bubble's, no other communication here
        assert r["idle_ns"]["pipeline_bubble"] == pr["bubble_ns"] - pr["exposed_p2p_ns"]


def test_gap_to_theory_is_attributed(tmp_path):
    """The known answers: balanced with zero latency, no gap; P2P latency, all communication; a
    slow stage without latency, all the slow stage's (and it is named)."""
    def gap(**kw):
        sim = ps.simulate("1f1b", 4, 8, **kw)
        return _report(ps.write(sim, tmp_path / str(len(list(tmp_path.iterdir())))))["job"]["pipeline"]

    g = gap(latency_ns=0)["gap"]
    assert g["gap_ns"] == 0 and g["slow_stage_ns"] == g["p2p_ns"] == g["host_ns"] == 0
    pipe = gap(latency_ns=50_000)
    g = pipe["gap"]
    assert g["gap_ns"] > 0 and g["p2p_ns"] == g["gap_ns"] and g["slow_stage_ns"] == 0
    assert pipe["bubble_ns"] - g["theory_bubble_ns"] == pytest.approx(g["gap_ns"], abs=1)
    g = gap(latency_ns=0, slow_stage=2, slow_factor=1.6)["gap"]
    assert g["slowest_stage"] == 2 and g["gap_ns"] > 0 and g["slow_stage_ns"] == g["gap_ns"]
    assert g["slowest_stage_excess"] == pytest.approx(1.6 * 4 / (3 + 1.6) - 1)


def test_pipeline_suggestion(tmp_path):
    """The schedule-specific fix, with the theory's numbers: m' = 2m and 4p, v = 2, and the slow
    stage to balance, by how much."""
    from tracelens.analysis.job.pipeline import theory

    sim = ps.simulate("1f1b", 4, 4, slow_stage=2, slow_factor=1.6)
    d = _report(ps.write(sim, tmp_path))
    (sg,) = [s for s in d["suggestions"] if s["id"] == "pipeline_schedule"]
    ev = sg["evidence"]
    assert (ev["schedule"], ev["stages"], ev["microbatches"], ev["virtual_stages"]) == ("1f1b", 4, 4, 1)
    opts = {(o["change"], o.get("microbatches") or o.get("virtual_stages") or o.get("stage")): o for o in ev["options"]}
    assert opts["microbatches", 8]["theory_fraction"] == pytest.approx(theory("1f1b", 4, 8, 1), abs=1e-4)
    assert opts["microbatches", 16]["theory_fraction"] == pytest.approx(3 / 19, abs=1e-4)  # m' = 4p
    assert opts["interleave", 2]["theory_fraction"] == pytest.approx(3 / 11, abs=1e-4)
    bal = opts["balance", 2]
    assert bal["excess"] == pytest.approx(1.6 * 4 / 4.6 - 1, abs=1e-3) and bal["saves_ns"] == d["job"]["pipeline"]["gap"]["slow_stage_ns"]
    assert "stage 2" in sg["detail"] and "m=16" in sg["detail"] and "v=2" in sg["detail"]
    assert sg["ranks"] == [0, 1, 2, 3] and sg["est_speedup"] > 1


def test_no_pipeline_no_pipeline_suggestion():
    from tracelens.analysis.suggest import pipeline_suggestion

    assert pipeline_suggestion(None) is None
    assert pipeline_suggestion({"theory_fraction": None, "bubble_fraction": 0.5}) is None  # 2 of 128 ranks: nothing to predict
    d = _report([real_traces() / "amd-tracelens" / "b200" / "eager_trace.json.gz"])
    assert not [s for s in d["suggestions"] if s["id"] == "pipeline_schedule"]


def test_megatron_markers_and_the_records_rank_field(tmp_path):
    """``## forward ##`` / ``## backward ##`` ranges label the blocks, and without the nccl:send/recv
    annotations the record_param_comms ``Rank`` field (the peer) still chains the stages."""
    import json
    import re

    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="torch")
    paths = ps.write(sim, tmp_path)
    for p in paths:
        d = json.loads(p.read_text())
        for e in d["traceEvents"]:
            e["name"] = re.sub(r"^Forward \d+$", "## forward ##", re.sub(r"^Backward \d+$", "## backward ##", e.get("name", "")))
        d["traceEvents"] = [e for e in d["traceEvents"] if not e["name"].startswith("nccl:")]
        p.write_text(json.dumps(d))
    d = _report(paths)
    _check_against(sim, d)
    ev = d["job"]["pipeline"]["evidence"]
    assert d["job"]["pipeline"]["confidence"] == "high" and any("P2P peers chain the ranks: 0 -> 1 -> 2 -> 3" in e for e in ev)
    assert any("marker ranges" in e for e in ev) and any("m = 8 from forward blocks per step" in e for e in ev)


def test_markers_alone_claim_no_pipeline(tmp_path):
    """Marker ranges without any P2P record are no evidence of a pipeline."""
    import json

    sim = ps.simulate("gpipe", 2, 4, annotations="torch")
    p = ps.write(sim, tmp_path)[0]
    d = json.loads(p.read_text())
    d["traceEvents"] = [dict(e, name="## forward ##") if str(e.get("name", "")).startswith("Forward ") else e for e in d["traceEvents"]
                        if "send" not in str(e.get("name", "")) and "recv" not in str(e.get("name", ""))
                        and "SendRecv" not in str(e.get("name", "")) and e.get("name") != "record_param_comms"
                        and not str(e.get("name", "")).startswith("Backward ")]
    p.write_text(json.dumps(d))
    assert "pipeline" not in _report([p])["job"]


def test_idle_table_bubble_is_labelled_and_the_whole_bubble_shown(tmp_path):
    """One definition (MFU.md 4.3): the bubble is its idle part |I_pp| plus the exposed P2P the stage
    waits on |X_pp|.  The idle table (a split of GPU idle) keeps the idle part, headed "pp bubble
    idle"; the whole bubble, the waterfall's bar and ranks[].pipeline.bubble_ns (the same number),
    is printed below it with the split.  Before, the table's "pipeline bubble" column read 18% on
    a rank whose waterfall bar read 28%, with nothing saying they differ.  Expected numbers from
    the JSON: bar = pipeline.bubble_ns, its idle part idle_ns.pipeline_bubble, over window_ns."""
    from tracelens.render.text import render_text

    sim = ps.simulate("1f1b", 4, 8, latency_ns=50_000)
    d = _report(ps.write(sim, tmp_path, stream_waits=True))
    text = render_text(d)
    assert "pp bubble idle" in text and "pipeline bubble (the waterfall's bar" in text
    shown = 0
    for r in d["ranks"]:
        bar, idle, w = _bars(r)["pipeline_bubble"], r["idle_ns"]["pipeline_bubble"], r["window_ns"]
        assert bar == r["pipeline"]["bubble_ns"]
        if bar > idle:
            a, b, c = (f"{100.0 * ns / w:5.1f}%" for ns in (bar, idle, bar - idle))
            assert f"rank {r['rank']} {a} ({b} idle + {c} exposed P2P)" in text
            shown += 1
    assert shown > 0


@pytest.mark.parametrize("latency", [0, 200_000, 500_000])
def test_slow_stage_share_under_p2p_latency(tmp_path, latency):
    """1F1B p=4 m=8, stage 2 at 1.6x, P2P latency L: the slow stage's share is what the imbalance
    costs with instant P2P (the schedule replayed at the stages' block times less at their mean),
    the P2P's the rest.  Expected per rank and kept step (2 of 3): slow = W(slow, L=0) - W_th, the
    simulator's makespan at zero latency (45.8 ms) less the theory's (m+p-1) x mean stage time
    (11 x 3.45 ms = 37.95 ms) = 7.85 ms; P2P = W(slow, L) - W(slow, 0) (L=200 us: 1.4 ms; 500 us:
    3.8 ms).  Before, the closed form m*tau_max + (sum - max) = 47.4 ms overstated it: at 200 us
    the slow stage took 9.25 ms, the whole gap, and the P2P 0; at 500 us 9.45 ms and 2.2 ms."""
    p, m, f, k = 4, 8, 1.6, 2
    sim = ps.simulate("1f1b", p, m, latency_ns=latency, slow_stage=2, slow_factor=f)
    w0 = ps.simulate("1f1b", p, m, latency_ns=0, slow_stage=2, slow_factor=f).makespan
    w_th = (m + p - 1) * (3 + f) / p * 3_000_000
    g = _report(ps.write(sim, tmp_path))["job"]["pipeline"]["gap"]
    assert g["slowest_stage"] == 2
    assert g["slow_stage_ns"] == pytest.approx(p * k * (w0 - w_th), abs=p * k * 2_000)
    assert g["p2p_ns"] == pytest.approx(p * k * (sim.makespan - w0), abs=p * k * 2_000)
    assert g["slow_stage_ns"] + g["p2p_ns"] + g["host_ns"] == g["gap_ns"]


def test_balancing_a_rank_of_several_stages_names_its_stages(tmp_path):
    """Interleaved 1F1B, p=4 m=8 v=2, rank 2 at 1.6x: rank 2 holds model stages 2 and 6 (stage
    r + k*p, looped placement), so the balancing option names that pair, not "stage 2" alone, and
    moves work to the other ranks; the 1F1B run of test_pipeline_suggestion (one stage per rank)
    keeps "stage 2" and no stages_held."""
    sim = ps.simulate("interleaved", 4, 8, v=2, slow_stage=2, slow_factor=1.6)
    d = _report(ps.write(sim, tmp_path))
    assert d["job"]["pipeline"]["virtual_stages"] == 2
    (sg,) = [s for s in d["suggestions"] if s["id"] == "pipeline_schedule"]
    (bal,) = [o for o in sg["evidence"]["options"] if o["change"] == "balance"]
    assert bal["stage"] == 2 and bal["stages_held"] == [2, 6]
    assert "the rank at position 2 (it holds stages 2 and 6)" in sg["detail"] and "to the other ranks" in sg["detail"]


def test_stages_held_by_placement():
    # V-shaped (ZB-V, DualPipeV, p=4, 8 stages): position r holds r and 2p-1-r; looped (v=3): r, r+p, r+2p
    from tracelens.analysis.suggest import _stages_held

    assert _stages_held({"virtual_stages": 2, "placement": "v_shape"}, 1, 4) == [1, 6]
    assert _stages_held({"virtual_stages": 2, "placement": "v_shape"}, 0, 4) == [0, 7]
    assert _stages_held({"virtual_stages": 3, "placement": "looped"}, 1, 4) == [1, 5, 9]
    assert _stages_held({"virtual_stages": 1}, 1, 4) is None
