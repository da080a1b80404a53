"""Pipeline parallelism on the GPU traces large training runs leave (issue 18): NCCL SendRecv
kernels on their own stream, ``batch_isend_irecv`` (one ``nccl:coalesced`` SendRecv kernel per
batch of sends and recvs), Megatron's range names, tensor- and data-parallel all-reduce kernels
beside the P2P, only the pipeline's ranks of a larger job traced (``tests/pipesim.Layout``).  The
simulator's known answer: p, m, v, the schedule, each rank's stage and bubble (within 2 points)."""

from __future__ import annotations

import pytest

from tests import pipesim as ps
from tests.test_pipeline import _bars, _no_false_clock, _report


def _check(sim, lay, d, tol=0.02):
    pipe, want = d["job"]["pipeline"], sim.answer
    assert (pipe["stages"], pipe["microbatches"], pipe["virtual_stages"], pipe["schedule"]) == (sim.p, sim.m, sim.v, sim.schedule), \
        pipe["evidence"]
    assert pipe["bubble_fraction"] == pytest.approx(want["bubble_fraction"], abs=tol)
    stage_of = {lay.rank(r): r for r in range(sim.p)}  # stage-rank r of the pipeline is global rank r * dp * tp
    for r in d["ranks"]:
        got, exp = r["pipeline"], want["ranks"][stage_of[r["rank"]]]
        assert got["stage"] == exp["stage"], (r["rank"], pipe["evidence"])
        assert got["bubble_fraction"] == pytest.approx(exp["bubble_fraction"], abs=tol)
        # the waterfall's bubble bar is the pipeline measurement; the TP/DP all-reduces are never taken for P2P
        bars = _bars(r)
        assert sum(bars.values()) == r["window_ns"]
        assert bars["pipeline_bubble"] == got["bubble_ns"]
    # only the P2P process group's SendRecv kernels are pipeline P2P; nothing is said to be another collective
    assert not any("not pipeline P2P" in e for e in pipe["evidence"]), pipe["evidence"]


@pytest.mark.parametrize("coalesced_record", [False, True])
def test_batched_isend_irecv_is_p2p(tmp_path, coalesced_record):
    """Megatron's default P2P: the sends and recvs between two blocks are posted with no launch and
    run as one SendRecv kernel inside ``nccl:coalesced`` (with or without a ``coalesced`` record).
    Before the fix the kernel took the group's name "coalesced": a collective, counted as the
    stage's busy time (stage 0's bubble 0 instead of the simulator's 0.28, the job's 0.09) and the
    evidence said its SendRecv kernels were collectives."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="none", steps=2)
    lay = ps.Layout(batched=True, coalesced_record=coalesced_record)
    d = _report(ps.write(sim, tmp_path, layout=lay))
    _check(sim, lay, d)
    _no_false_clock(d)
    assert d["job"]["pipeline"]["confidence"] == "high"
    # the batch's kernel takes its members' process group (nccl:coalesced names none): no "group ?" row
    assert {(c["group"], c["collective"]) for c in d["communication"]["by_group"]} == {("pp", "sendrecv")}


def test_megatron_dp_tp_job(tmp_path):
    """4 pipeline ranks of a 64-rank job (dp 8, tp 2): batched P2P on the "pp" group, Megatron's ranges
    (``forward-compute``, ``backward-send-forward-recv``, ``forward-backward``), a TP all-reduce in
    every block and the DP gradient all-reduce in the last backward: the stages chain through the
    global ranks 0 -> 16 -> 32 -> 48, and the all-reduces are the stage's (exposed communication),
    not the bubble's."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="none", steps=2)
    lay = ps.Layout(dp=8, tp=2, batched=True, tp_allreduce=True, dp_allreduce=True, megatron_ranges=True)
    d = _report(ps.write(sim, tmp_path, layout=lay))
    _check(sim, lay, d)
    ev = " ".join(d["job"]["pipeline"]["evidence"])
    assert "0 -> 16 -> 32 -> 48" in ev and "4 of 64 ranks traced" in ev
    by = {(c["group"], c["collective"]): c["count"] for c in d["communication"]["by_group"]}
    # the P2P batches all on "pp"; each stage's TP all-reduces in its own group, one per block: (8 F + 8 B) x 2 steps = 32;
    # its DP all-reduce, one per step: 2
    assert by.pop(("pp", "sendrecv")) > 0
    assert by == {**{(f"tp{16 * s}", "allreduce"): 32 for s in range(4)}, **{(f"dp{s}", "allreduce"): 2 for s in range(4)}}
    for r in d["ranks"]:
        assert _bars(r)["exposed_comm"] > 0  # the TP all-reduce (carved out of the compute) is exposed, and no bubble
    _no_false_clock(d)  # one clock: no TP/DP all-reduce of one stage is matched with another stage's (their groups differ)
    # one suggestion for the bubble: the schedule's (28% measured), not also the rule's idle share of it (0.18 on rank 24)
    ids = [s["id"] for s in d["suggestions"]]
    assert "pipeline_schedule" in ids and "pipeline_bubble" not in ids, ids


def test_interleaved_ring_of_a_data_parallel_job(tmp_path):
    """Interleaved 1F1B (v=2) on the pipeline ranks 0, 2, 4, 6 of an 8-rank job (dp 2), batched
    P2P and Megatron ranges: every rank sends and receives both ways, so the stages come from going
    round the ring of downstream peers from the rank whose forwards start unfed.  Before, they were
    the global ranks modulo the ranks traced (0 -> 0, 2 -> 2, 4 -> 0, 6 -> 2, sorted: 0, 4, 2, 6),
    so ranks 2 and 4 swapped stages."""
    sim = ps.simulate("interleaved", 4, 8, v=2, latency_ns=20_000, annotations="none", steps=2)
    lay = ps.Layout(dp=2, batched=True, megatron_ranges=True, tp_allreduce=True)
    d = _report(ps.write(sim, tmp_path, layout=lay))
    _check(sim, lay, d)
    assert any("the P2P peers go round 0 -> 2 -> 4 -> 6" in e for e in d["job"]["pipeline"]["evidence"])


@pytest.mark.parametrize("annotations", ["torch", "pp"])
def test_glue_outside_the_action_ranges_is_no_micro_batch(tmp_path, annotations):
    """A grad-norm kernel launched after the step's last ``Forward i`` / ``PP:<s>B<mb>`` range,
    outside every range (clip_grad_norm_ between the schedule and the optimizer): before, it was a
    forward block of its own with no micro-batch index, so m came from the forward blocks per step:
    9 (theory 0.25) with confidence high; now the glue is no block and m = 8 from the indices."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations=annotations, steps=2)
    lay = ps.Layout(glue=True)
    d = _report(ps.write(sim, tmp_path, layout=lay))
    _check(sim, lay, d)
    assert d["job"]["pipeline"]["theory_fraction"] == pytest.approx(sim.answer["theory_fraction"])


@pytest.mark.parametrize(("schedule", "annotations"), [("1f1b", "none"), ("gpipe", "none"), ("gpipe", "torch")])
def test_no_profiler_steps(tmp_path, schedule, annotations):
    """No ProfilerStep spans: the whole trace (2 iterations here) is one step.  Before, m was the
    forward blocks of both iterations (16, theory 0.158 beside the simulator's 0.273) and GPipe's
    'F8 B8 F8 B8' was called 1F1B; now, without micro-batch indices, m and the theory are null with
    the reason, GPipe repeated is GPipe, and with the indices (``Forward i``) m = 8 and the theory
    stand.  The bubble (measured over the whole window) is the simulator's either way."""
    sim = ps.simulate(schedule, 4, 8, latency_ns=20_000, annotations=annotations, steps=2)
    d = _report(ps.write(sim, tmp_path, layout=ps.Layout(profiler_steps=False)))
    pipe = d["job"]["pipeline"]
    assert pipe["stages"] == 4 and pipe["schedule"] == schedule, pipe["evidence"]
    assert pipe["bubble_fraction"] == pytest.approx(sim.answer["bubble_fraction"], abs=0.02)
    assert [r["pipeline"]["stage"] for r in d["ranks"]] == [0, 1, 2, 3]
    # the iterations are told from the repeated F/B order (or the indices restarting): m = 8 and the theory stand (before the
    # iterations were told, m and the theory were null without micro-batch indices)
    assert pipe["microbatches"] == 8 and pipe["theory_fraction"] == pytest.approx(sim.answer["theory_fraction"]), pipe["evidence"]
    assert any("holds 2 iteration(s)" in e for e in pipe["evidence"]), pipe["evidence"]
    # the views show the one (numberless) step's blocks: both iterations' 2 x (8 F + 8 B) per stage (before: no view at all)
    import re

    from tracelens.render import tables as views
    from tracelens.render.html import render_html

    lanes = views.pipeline_lanes(d)
    assert [ln["stage"] for ln in lanes] == [0, 1, 2, 3] and all(len(ln["blocks"]) == 32 and ln["step"] is None for ln in lanes)
    page = render_html(d).decode()
    assert len(re.findall(r'<g class="pp-lane" data-rank="\d+" data-stage="\d"', page)) == 4


def test_only_the_last_stage(tmp_path):
    """The last stage's trace alone (rank 24 of 32, batched P2P): its bubble is measured, its stage
    number and p are null (p - 1 needs p), and the evidence says it is the last stage and that p is
    at least 2 (it receives from rank 16).  Before: 'the traced ranks do not chain into one
    pipeline' and 'p is at least 1'."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="none", steps=2)
    paths = ps.write(sim, tmp_path, layout=ps.Layout(dp=8, batched=True))
    d = _report([paths[3]])
    pipe, (r,) = d["job"]["pipeline"], d["ranks"]
    assert pipe["stages"] is None and pipe["theory_fraction"] is None and r["pipeline"]["stage"] is None
    assert pipe["schedule"] == "1f1b" and pipe["microbatches"] == 8  # its own blocks alternate, 8 forwards a step
    assert r["pipeline"]["bubble_fraction"] == pytest.approx(sim.answer["ranks"][3]["bubble_fraction"], abs=0.02)
    ev = " ".join(pipe["evidence"])
    assert "last stage: rank 24" in ev and "p is at least 2 and at most 32" in ev


def test_deepspeed_python_function_ranges(tmp_path):
    """DeepSpeed's pipeline engine profiled with with_stack: each micro-batch's forward and backward
    is a Python function event (``engine.py(..): _exec_forward_pass`` / ``_exec_backward_pass``),
    around it the modules' own ``module.py(..): forward`` (nested, one per layer: no marker, or
    every layer would split the blocks).  Before, these names labelled nothing (the blocks came from
    the autograd ops alone); now they are marker ranges, the labels and the counts as the simulator's."""
    import json

    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="torch", steps=2)
    paths = ps.write(sim, tmp_path)
    for p in paths:
        d = json.loads(p.read_text())
        extra = []
        for e in d["traceEvents"]:
            name = e.get("name", "")
            if name.startswith(("Forward ", "Backward ")):
                kind = "forward" if name.startswith("Forward") else "backward"
                e.update(cat="python_function", name=f"deepspeed/runtime/pipe/engine.py(7{len(kind)}0): _exec_{kind}_pass")
                if kind == "forward":  # a module's forward inside it, over its first half
                    extra.append(dict(e, name="torch/nn/modules/module.py(1520): forward", ts=e["ts"] + 0.5, dur=e["dur"] / 2))
        d["traceEvents"] += extra
        p.write_text(json.dumps(d))
    from tracelens.analysis import analyze
    from tracelens.store.job import load

    d = analyze(load(paths, use_cache=False, keep_python=True)).to_dict()  # (Python functions are dropped unless kept)
    _check(sim, ps.Layout(), d)
    assert any("marker ranges" in e for e in d["job"]["pipeline"]["evidence"])


def test_data_parallel_pipelines_traced_whole(tmp_path):
    """Every rank of a dp=2 x p=4 job (two pipelines: 0 -> 2 -> 4 -> 6 and 1 -> 3 -> 5 -> 7, a slow
    stage 1 in both).  Before: two first stages, so 'the traced ranks do not chain into one
    pipeline', p null and 'p is at least 8 and at most 8' (false: p = 4), stages null past stage
    0.  Now each pipeline chains, p = 4 with confidence high, and the gap to the theory sums over
    every rank (its parts add up to the job's bubble less the theory's)."""
    sim = ps.simulate("1f1b", 4, 8, latency_ns=20_000, annotations="none", steps=2, slow_stage=1, slow_factor=1.4)
    paths = [*ps.write(sim, tmp_path / "a", layout=ps.Layout(dp=2, batched=True, dp_allreduce=True)),
             *ps.write(sim, tmp_path / "b", layout=ps.Layout(dp=2, batched=True, dp_allreduce=True, replica=1))]
    d = _report(paths)
    pipe = d["job"]["pipeline"]
    assert (pipe["stages"], pipe["microbatches"], pipe["schedule"], pipe["confidence"]) == (4, 8, "1f1b", "high"), pipe["evidence"]
    assert any("0 -> 2 -> 4 -> 6; 1 -> 3 -> 5 -> 7 (2 pipelines of 4 stages" in e for e in pipe["evidence"])
    assert pipe["bubble_fraction"] == pytest.approx(sim.answer["bubble_fraction"], abs=0.02)
    for r in d["ranks"]:  # global rank 2s + replica is stage s
        assert r["pipeline"]["stage"] == r["rank"] // 2
        assert r["pipeline"]["bubble_fraction"] == pytest.approx(sim.answer["ranks"][r["rank"] // 2]["bubble_fraction"], abs=0.02)
    g = pipe["gap"]
    assert g["slowest_stage"] == 1 and g["slow_stage_ns"] > 0
    assert g["slow_stage_ns"] + g["p2p_ns"] + g["host_ns"] == g["gap_ns"] == pytest.approx(pipe["bubble_ns"] - g["theory_bubble_ns"], abs=2)
    assert pipe["replay"]["stage_ns"][1][0] == pytest.approx(1.4 * pipe["replay"]["stage_ns"][0][0], rel=0.01)


def test_batched_p2p_bytes_are_the_members(tmp_path):
    """A ``batch_isend_irecv`` batch (one ``nccl:coalesced`` SendRecv kernel) takes its members'
    bytes: the sends and recvs posted on its thread since the previous batch, each ``In msg
    nelems`` x 2 (bf16).  Before, the batch's bytes were null.  The expected list is read from the
    raw file: per ``nccl:coalesced`` range, the records between it and the one before it."""
    import json

    from tracelens.analysis import analyze
    from tracelens.store.job import load

    sim = ps.simulate("1f1b", 2, 4, latency_ns=20_000, annotations="none", steps=1)
    paths = ps.write(sim, tmp_path, layout=ps.Layout(batched=True))
    a = analyze(load(paths, use_cache=False))
    for f, path in enumerate(paths):
        evs = sorted(json.loads(path.read_text())["traceEvents"], key=lambda e: e["ts"])
        want, acc = [], 0
        for e in evs:
            if e.get("name") == "record_param_comms" and e["args"]["Collective name"] in ("send", "recv"):
                acc += e["args"]["In msg nelems"] * 2
            elif e.get("name") == "nccl:coalesced":
                want.append(acc)
                acc = 0
        got = a.collectives.filter((a.collectives["file"] == f) & (a.collectives["collective"] == "sendrecv")).sort("start_ns")
        assert got.get_column("bytes").to_list() == want and all(w > 0 for w in want)


@pytest.mark.parametrize(("schedule", "annotations"), [("1f1b", "none"), ("gpipe", "none"), ("1f1b", "torch"), ("interleaved", "pp")])
def test_no_profiler_steps_idle_between_iterations_is_not_steady(tmp_path, schedule, annotations):
    """No ProfilerStep spans, 2 iterations in the one step: the idle between them (one's cool-down
    and the next one's warm-up) is ``between_iterations_ns``, not steady bubble.  Before, stage 1
    of 1F1B p=4 m=8 had steady 15.6 ms where the simulator's 2 iterations hold 2 x 6.28 ms: the
    3.04 ms between them (its 2.02 ms cool-down + 1.02 ms warm-up) counted as steady.  Expected
    from the simulator's known answer per step: steady = 2 x steady, between = warm-up + cool-down
    (within 2 us).  The last stage of 1F1B without indices runs F B F B ...: its
    iterations, steady and between are unknown (null), the evidence says so."""
    sim = ps.simulate(schedule, 4, 8, latency_ns=20_000, annotations=annotations, steps=2)
    d = _report(ps.write(sim, tmp_path, layout=ps.Layout(profiler_steps=False)))
    ev = " ".join(d["job"]["pipeline"]["evidence"])
    assert "holds 2 iteration(s)" in ev
    for r in d["ranks"]:
        got, want = r["pipeline"], sim.answer["ranks"][r["rank"]]
        if schedule == "1f1b" and annotations == "none" and r["rank"] == 3:
            assert got["steady_ns"] is None and got["between_iterations_ns"] is None
            assert "rank 3: a strict F/B alternation" in ev
            continue
        assert got["steady_ns"] == pytest.approx(2 * want["steady_ns"], abs=2_000)
        assert got["between_iterations_ns"] == pytest.approx(want["warmup_ns"] + want["cooldown_ns"], abs=2_000)
        assert got["warmup_ns"] + got["cooldown_ns"] + got["steady_ns"] + got["between_iterations_ns"] == got["bubble_ns"]


def test_views_label_the_gap_between_iterations(tmp_path):
    """No ProfilerStep spans, GPipe p=4 m=8 run twice in the one step: the views' gap before the
    second iteration's first block is "between iterations", not "between micro-batches".  Each
    stage's gap there is its cool-down and the next iteration's warm-up, the simulator's known
    answer (stage 1: 2.02 + 1.02 = 3.04 ms; stage 0 starts the next iteration at once: no gap).
    The lane's between-iterations bubble is exactly the rank's ``between_iterations_ns``, and the
    text, the TUI's bubble rows and the HTML name it."""
    from html import unescape

    from tracelens.render import tables as views
    from tracelens.render.html import render_html
    from tracelens.tui.panes import pipeline_bubble_rows

    sim = ps.simulate("gpipe", 4, 8, latency_ns=20_000, annotations="none", steps=2)
    d = _report(ps.write(sim, tmp_path, layout=ps.Layout(profiler_steps=False)))
    lanes = views.pipeline_lanes(d)
    assert len(lanes) == 4
    by_rank = {r["rank"]: r["pipeline"] for r in d["ranks"]}
    for ln in lanes:
        pr = by_rank[ln["rank"]]
        between = [x for x in ln["bubbles"] if x["kind"] == "between_iterations"]
        assert sum(x["e"] - x["s"] for x in between) == pr["between_iterations_ns"]
        assert len(between) == (0 if ln["stage"] == 0 else 1)  # 2 iterations: one boundary
        assert len(pr["view"]["iteration_starts_ns"]) == 1
        if between:  # the gap ends where the second iteration's first forward starts
            assert between[0]["e"] == pr["view"]["iteration_starts_ns"][0]
            want = sim.answer["ranks"][ln["rank"]]
            assert pr["between_iterations_ns"] == pytest.approx(want["warmup_ns"] + want["cooldown_ns"], abs=2_000)
    rows = pipeline_bubble_rows(lanes)
    assert sum(1 for r in rows if r["phase"] == "between iterations") == 3
    text = "\n".join(views.pipeline_summary_lines(d))
    assert "between iterations 3.04 ms" in text
    assert "between iterations bubble" in unescape(render_html(d).decode())
