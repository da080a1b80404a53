"""Zero-bubble pipelines (issue 18, Must 1): the simulator's ZB-H1 schedule (tests/pipesim.py: the
backward split into input-grad B and weight-grad W blocks, the W filling 1F1B's cool-down), its
detection from torch's runtime action ranges (``PP:<stage>I<mb>`` / ``PP:<stage>W<mb>``), and its
theory fraction (p-1)/(3m+p-1)."""

from __future__ import annotations

import re

import orjson
import pytest

from tests import pipesim as ps
from tests.test_pipeline import _check_against, _no_false_clock, _report


@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 32), (4, 4), (4, 8), (8, 8), (8, 32)])
def test_zb_h1_simulator_meets_its_theory(p, m):
    # tf = 1 ms, tb = 2 ms split into B = W = 1 ms: ZB-H1's step is m*(F+B+W) + (p-1)*(F+B-W)
    # = 3m + p - 1 ms, its bubble (p-1)/(3m+p-1); 1F1B's (B+W as one block): (m+p-1)*3 ms.
    # p=2, m=4: 13 ms against 1F1B's 15 ms.
    sim = ps.simulate("zero_bubble", p, m, annotations="pp", steps=1)
    assert sim.makespan == (3 * m + p - 1) * 1_000_000
    assert sim.answer["bubble_fraction"] == pytest.approx((p - 1) / (3 * m + p - 1))
    assert sim.answer["theory_fraction"] == pytest.approx((p - 1) / (3 * m + p - 1))
    assert sim.makespan < ps.simulate("1f1b", p, m, steps=1).makespan == (m + p - 1) * 3_000_000


@pytest.mark.parametrize(("p", "m", "latency"), [(2, 4, 0), (4, 8, 20_000)])
def test_zb_h1_is_detected_with_its_theory(tmp_path, p, m, latency):
    sim = ps.simulate("zero_bubble", p, m, annotations="pp", latency_ns=latency, steps=2)
    d = _report(ps.write(sim, tmp_path))
    _check_against(sim, d)  # stages, m, v, schedule "zero_bubble", theory, bubble within 2 points, per rank
    pipe = d["job"]["pipeline"]
    assert pipe["theory_fraction"] == pytest.approx((p - 1) / (3 * m + p - 1))
    assert any("input-grad (I) and weight-grad (W)" in e for e in pipe["evidence"])
    assert any("ZB-H1" in e for e in pipe["evidence"])


def test_zb_theory_is_null_when_m_is_below_p(tmp_path):
    # m < p: ZB-H1's formula does not hold (the simulator's own bubble is above it): null, and said
    sim = ps.simulate("zero_bubble", 4, 2, annotations="pp", steps=2)
    assert sim.answer["bubble_fraction"] > (4 - 1) / (3 * 2 + 4 - 1)
    d = _report(ps.write(sim, tmp_path))
    pipe = d["job"]["pipeline"]
    assert pipe["schedule"] == "zero_bubble"
    assert pipe["theory_fraction"] is None
    assert any("none for m < p" in e for e in pipe["evidence"])


def test_v_shaped_stage_names(tmp_path):
    """ScheduleZBVZeroBubble (and DualPipeV) put stages r and 2p-1-r on rank r: the ranges
    ``PP:<stage>F<mb>``/``PP:<stage>I<mb>``/``PP:<stage>W<mb>`` (torch's ``_Action`` repr under
    ``PP:``) then name stages whose spacing differs per rank (p=4: 7, 5, 3, 1), and p was null
    before.  Here the simulator's interleaved run (v=2) is written with its stage numbers
    renamed to the V's (chunk 0 of rank r: r; chunk 1: 2p-1-r) and its backward as I + W
    halves: only the names are the V's (the P2P still goes round the ring), so what is pinned is
    the placement read from the names: p = 4, v = 2, rank r at stage r."""
    import json
    import re

    p = 4
    sim = ps.simulate("interleaved", p, 8, v=2, annotations="pp", steps=2)
    paths = ps.write(sim, tmp_path)
    for path in paths:
        doc = json.loads(path.read_text())
        for ev in doc["traceEvents"]:
            m = re.match(r"^PP:(\d+)([FB])(\d+)$", ev.get("name", ""))
            if m:
                g = int(m.group(1))
                c, r = divmod(g, p)
                v_stage = r if c == 0 else 2 * p - 1 - r
                ev["name"] = f"PP:{v_stage}{'I' if m.group(2) == 'B' else 'F'}{m.group(3)}"
        path.write_text(json.dumps(doc))
    d = _report(paths)
    pipe = d["job"]["pipeline"]
    assert (pipe["stages"], pipe["virtual_stages"], pipe["schedule"]) == (p, 2, "zero_bubble"), pipe["evidence"]
    assert {r["rank"]: r["pipeline"]["stage"] for r in d["ranks"]} == {r: r for r in range(p)}
    assert any("V-shaped placement" in e for e in pipe["evidence"])


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("zero_bubble", 2, 4, 1), ("zero_bubble", 4, 8, 1), ("interleaved", 4, 8, 2),
                                                      ("1f1b", 4, 8, 1), ("gpipe", 2, 4, 1)])
def test_replay_order_meets_the_closed_forms(tmp_path, schedule, p, m, v):
    """The ranks' own action orders (PP: ranges of the simulator's runs), replayed at F = I = W = 1
    and a full B = 2 with instant P2P, give each schedule's closed-form bubble: ZB-H1's
    (p-1)/(3m+p-1) (p=2 m=4: 1/13, a step of 3m+p-1 = 13 units), interleaved (p-1)/(vm+p-1) (3/19),
    1F1B and GPipe (p-1)/(m+p-1) (3/11, 1/5): what makes the replay the theory of the runtime's
    other schedules (ZB-V, DualPipeV, interleaved ZB) whose closed form the report does not take
    on trust."""
    from tracelens.analysis import analyze
    from tracelens.analysis.job.pipeline import replay_order
    from tracelens.store.job import load

    sim = ps.simulate(schedule, p, m, v=v, annotations="pp", steps=2) if v > 1 else ps.simulate(schedule, p, m, annotations="pp", steps=2)
    a = analyze(load(ps.write(sim, tmp_path), use_cache=False))
    orders = {r.rank: r.pipeline["action_order"] for r in a.ranks}
    # F, I and W (zero bubble) or F and a full B per micro-batch and chunk: 3 units of work per micro-batch either way
    assert all(len(o) == (3 if schedule == "zero_bubble" else 2) * m * v for o in orders.values())
    got = replay_order(orders, p * v)
    assert got["bubble_fraction"] == pytest.approx(sim.answer["theory_fraction"])
    if schedule == "zero_bubble":
        assert got["step"] == 3 * m + p - 1
    # a rank's order missing: the stages it holds never run, nothing replays
    assert replay_order({r: o for r, o in orders.items() if r != p - 1}, p * v) is None


_PP_ACT = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")
_PP_PAIR = re.compile(r"^PP:\((\d+)F(\d+);(\d+)([BI])(\d+)\)OVERLAP_F_B$")
_P2P_OP = re.compile(r"^(c10d::|record_param_comms$|nccl:|gloo:|mpi:|ucc:)")
_MATMUL = re.compile(r"^aten::(mm|addmm|linear|matmul)$")  # (the stages' compute ops: an MLP's)


def _union_us(spans):
    tot, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            tot += e - s
            end = e
        elif e > end:
            tot += e - end
            end = e
    return tot


def _raw_step(path, step):
    """Plain Python over the raw trace: step ``step``'s window, the union of its CPU ops but the
    P2P ones (the stage's busy time), and its compute actions from the PP: ranges."""
    ev = [e for e in orjson.loads(path.read_bytes())["traceEvents"] if e.get("ph") == "X"]
    st = next(e for e in ev if e["name"] == f"ProfilerStep#{step}")
    ws, we = st["ts"], st["ts"] + st["dur"]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e["dur"] > 0 and not _P2P_OP.match(e["name"])]
    busy = _union_us([(max(e["ts"], ws), min(e["ts"] + e["dur"], we)) for e in ops if e["ts"] < we and e["ts"] + e["dur"] > ws])
    acts = []  # (kind, stage, mb, the span of its matmuls in ns: None without one)
    for e in sorted((e for e in ev if ws <= e["ts"] < we and e["name"].startswith("PP:")), key=lambda e: e["ts"]):
        mms = [o for o in ops if o["tid"] == e["tid"] and e["ts"] <= o["ts"] < e["ts"] + e["dur"] and _MATMUL.match(o["name"])]
        span = (max(o["ts"] + o["dur"] for o in mms) - min(o["ts"] for o in mms)) * 1000 if mms else None
        if a := _PP_ACT.match(e["name"]):
            acts.append((a[2], int(a[1]), int(a[3]), span))
        elif a := _PP_PAIR.match(e["name"]):  # the overlapped pair: its forward, then its backward (both compute)
            acts += [("F", int(a[1]), int(a[2]), 1.0), (a[4], int(a[3]), int(a[5]), 1.0)]
    return (we - ws) * 1000, busy * 1000, acts


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "interleaved_zb"])
def test_real_zero_bubble_pipeline(zb_pipeline_traces, schedule):
    """Real runs of torch's zero-bubble schedules (tests/pipe_recorder.py: 2 ranks, 2 stages each, 4
    micro-batches): p, m, v, the placement, the schedule and its variant from the PP: ranges, the
    theory from the ranks' own orders, and every rank's bubble recomputed here from the raw
    trace (window less the union of its non-P2P CPU ops)."""
    d = _report(zb_pipeline_traces[schedule])
    # one host's clock: the step starts (apart by the schedule: the V's rank 0 ends each step with the last stage's W) set
    # no offset the P2P pairs contradict (before: "clock differs by -1.414 ms" on ZB-V, -6.158 ms on DualPipeV).  Where the
    # pairs' range holds 0 the offset is 0; once in some ten DualPipeV runs it did not (the range started 80 us above 0:
    # a pair the k-th-send-to-k-th-recv rule got wrong, not found again): within the warning's 1 ms, not pinned at 0
    assert all(abs(r["clock_offset_ns"]) < 1_000_000 for r in d["ranks"])
    _no_false_clock(d)
    pipe = d["job"]["pipeline"]
    vshape = schedule in ("zbv", "dualpipev")
    assert (pipe["stages"], pipe["microbatches"], pipe["virtual_stages"], pipe["schedule"]) == (2, 4, 2, "zero_bubble"), pipe["evidence"]
    assert pipe["placement"] == ("v_shape" if vshape else "looped")
    assert pipe["variant"] == {"zbv": "zb_v", "dualpipev": "dualpipe_v", "interleaved_zb": "interleaved_zb"}[schedule]
    assert pipe["confidence"] == "high"
    from tracelens.render.tables import pipeline_summary_lines

    assert pipeline_summary_lines(d)[0].startswith(f"pipeline: zero_bubble ({pipe['variant']}, {'V-shaped' if vshape else 'looped'}), p=2")
    # each rank runs 2 stages x 4 micro-batches x (F, I, W) of one unit (DualPipeV's full B: I + W) = 24 units; the
    # orders replay to a 25-unit step (the second stage's first forward waits one unit for the first's):
    # (p-1)/(3vm+p-1) = 1/25, half ZB-H1's 1/13 with one stage per rank
    assert pipe["theory_fraction"] == pytest.approx(1 / 25)
    assert any("own action order" in e for e in pipe["evidence"])
    if vshape:
        assert any("V-shaped placement" in e for e in pipe["evidence"])
    held = {0: [0, 3], 1: [1, 2]} if vshape else {0: [0, 2], 1: [1, 3]}  # rank r: r and 2p-1-r, or r and r+p
    tot_b = tot_w = 0
    work = []
    for r in d["ranks"]:
        pr = r["pipeline"]
        assert (pr["stage"], pr["stages_held"]) == (r["rank"], held[r["rank"]])
        assert pr["steps"]
        for s in pr["steps"]:
            window, busy, acts = _raw_step(zb_pipeline_traces[schedule][r["rank"]], s["step"])
            # the raw trace's own stages and micro-batches, from the PP: names alone
            assert sorted({g for _, g, _, _ in acts}) == held[r["rank"]]
            assert sorted({i for k, _, i, _ in acts if k == "F"}) == [0, 1, 2, 3]
            assert [k for k, *_ in acts].count("F") == 8 == s["forward_blocks"]
            # every backward action with compute is a block (a first stage's I computes nothing: its input needs no grad)
            assert s["backward_blocks"] == sum(1 for k, *_, mm in acts if k != "F" and mm is not None) >= (8 if vshape else 12)
            if schedule != "dualpipev" and len(pr["steps"]) == 1:
                # each stage's compute per action (the span of its matmuls), recomputed here: the report's action_ns
                want = {}
                for k, g, _, span in acts:
                    if span is not None:
                        want.setdefault(f"{k}{g}", []).append(span)
                assert pr["action_ns"] == {k: pytest.approx(sum(x) / len(x), abs=2) for k, x in want.items()}
                # the first stage's I actions compute nothing (its input needs no grad): no block, no time
                assert "I0" not in pr["action_ns"] and ([k for k, g, *_ in acts if g == 0].count("I") == 4) == (r["rank"] == 0)
            if schedule == "dualpipev":
                assert sum(1 for k, *_ in acts if k == "B") >= 2  # the overlapped pairs' and the plain full backwards
            else:
                assert [k for k, *_ in acts].count("I") == 8 == [k for k, *_ in acts].count("W")
            # the bubble consistent with the stage's compute: window less its busy CPU ops (P2P left out), recomputed here
            assert s["window_ns"] == pytest.approx(window, abs=2)
            assert s["busy_ns"] == pytest.approx(busy, abs=200)  # (the parser's ns against float µs: under a ns per op)
            assert s["bubble_ns"] == s["window_ns"] - s["busy_ns"]
            assert s["warmup_ns"] + s["cooldown_ns"] + s["steady_ns"] == s["bubble_ns"]
            assert 0 <= s["exposed_p2p_ns"] <= s["bubble_ns"]
            tot_b, tot_w = tot_b + s["bubble_ns"], tot_w + s["window_ns"]
            work.append(sum(pr["action_ns"].get(f"{k}{g}", 0) for k, g, *_ in acts))  # the rank's actions at their block times
    assert pipe["bubble_fraction"] == pytest.approx(tot_b / tot_w)
    # the orders replayed at those block times with instant P2P: the compute alone needs less than the measured step
    # (here ~100 ms of ~175 ms: the rest is blocking gloo P2P and host), and at least the busiest rank's blocks
    rep = pipe["order_replay"]
    assert rep["measured_step_ns"] == pytest.approx(tot_w / len(d["ranks"]))
    assert rep["action_ns"] == {k: v for r in d["ranks"] for k, v in r["pipeline"]["action_ns"].items()}
    assert max(work) <= rep["step_ns"] < rep["measured_step_ns"]
    # the gap to the theory, attributed as for 1F1B: the theory's step at the ranks' mean compute is busy / (1 - 1/25)
    g = pipe["gap"]
    per_step = [r["pipeline"]["busy_ns"] / len(r["pipeline"]["steps"]) for r in d["ranks"]]
    assert g["stage_compute_ns"] == [pytest.approx(b, abs=1) for b in per_step]
    assert g["slowest_stage"] == max(range(2), key=lambda st: per_step[st])
    w_th = sum(per_step) / 2 / (1 - 1 / 25)
    assert g["theory_bubble_ns"] == pytest.approx(sum(w_th - b for b in per_step), abs=2)
    assert g["slow_stage_ns"] + g["p2p_ns"] + g["host_ns"] == g["gap_ns"] == pytest.approx(pipe["bubble_ns"] - g["theory_bubble_ns"], abs=2)
    assert min(g["slow_stage_ns"], g["p2p_ns"], g["host_ns"]) >= 0
    # a real run on 2 shared cores (blocking gloo P2P, ms each) sits far above the theory; below the window
    assert pipe["theory_fraction"] < pipe["bubble_fraction"] < 1


@pytest.mark.parametrize(("kw", "part"), [({"slow_stage": 1}, "slow_stage_ns"), ({"latency_ns": 200_000}, "p2p_ns"), ({}, None)])
def test_zero_bubble_gap_attributed(tmp_path, kw, part):
    """ZB-H1 p=4 m=8 (F = I = W = 1 ms): the gap to the theory goes where the simulator put it.
    Stage 1 at 1.5x: the orders replayed at the measured block times take the simulator's own
    38 ms (27 ms at equal stages: 3m + p - 1), and all of the gap is the slow stage's; 200 us P2P
    latency: all of it P2P; neither: no gap.  Before, a zero-bubble job had no gap at all."""
    sim = ps.simulate("zero_bubble", 4, 8, annotations="pp", steps=2, **kw)
    d = _report(ps.write(sim, tmp_path))
    pipe = d["job"]["pipeline"]
    g, rep = pipe["gap"], pipe["order_replay"]
    assert pipe["variant"] == "zb_h1" and pipe["placement"] is None
    assert rep["step_ns"] == (sim.makespan if "latency_ns" not in kw else 27_000_000)
    assert g["slow_stage_ns"] + g["p2p_ns"] + g["host_ns"] == g["gap_ns"]
    if part is None:
        assert g["gap_ns"] == 0
    else:
        assert g["gap_ns"] > 0 and g[part] == g["gap_ns"]
    if "slow_stage" in kw:
        assert g["slowest_stage"] == 1 and g["slowest_stage_excess"] == pytest.approx(1.5 / 1.125 - 1)  # 1.5 over the mean 1.125


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "interleaved_zb"])
def test_torch_orders_replay_to_the_closed_form(zb_orders, schedule):
    """torch's own orders (p = 2, two stages per rank, built not run) replayed at F = I = W:
    (p-1)/(3vm+p-1) from m = 2p on, which ``theory`` uses (the suggestions' m'); below it ZB-V
    leaves more (m = 2: 1/7 where the form says 1/13; at p = 4 measured the same way: m = 4 0.200
    against 0.111, m = 5 0.118 against 0.091, m >= 6 the form), DualPipeV refuses m < 2p, and
    interleaved ZB meets it from m = p."""
    from tracelens.analysis.job.pipeline import replay_order, theory

    p, v = 2, 2
    for m, orders in zb_orders[schedule].items():
        if isinstance(orders, str):
            assert schedule == "dualpipev" and m < 2 * p and "microbatches" in orders
            continue
        got = replay_order(orders, p * v)["bubble_fraction"]
        form = (p - 1) / (3 * v * m + p - 1)
        if m >= 2 * p:
            assert got == pytest.approx(form) == pytest.approx(theory("zero_bubble", p, m, v))
        elif schedule == "interleaved_zb":
            assert got == pytest.approx(form) and theory("zero_bubble", p, m, v) is None  # (None: not told apart from the V here)
        elif m == 2:
            assert got == pytest.approx(1 / 7) and got > form


def test_hostile_action_names_do_not_crash(tmp_path):
    """PP: names with numbers past Int64, overlapped pairs of three sub-actions or none: read as
    no stage or micro-batch (null), never a crash (before: polars' strict cast raised on
    ``PP:99999999999999999999F0``).  The simulator's ZB-H1 run with rank 0's ranges so renamed
    keeps its P2P-chained stages (rank 0 first, p = 2)."""
    import json

    sim = ps.simulate("zero_bubble", 2, 4, annotations="pp", steps=2)
    paths = ps.write(sim, tmp_path)
    doc = json.loads(paths[0].read_text())
    bad = ["PP:99999999999999999999F0", "PP:(99999999999999999999F1;0B2)OVERLAP_F_B", "PP:(0F1;0B2;0W3)OVERLAP_F_B", "PP:()OVERLAP_F_B"]
    k = 0
    for ev in doc["traceEvents"]:
        if re.match(r"^PP:\d+[FIW]\d+$", ev.get("name", "")):
            ev["name"] = bad[k % len(bad)]
            k += 1
    assert k
    paths[0].write_text(json.dumps(doc))
    d = _report(paths)
    pipe = d["job"]["pipeline"]
    assert pipe is not None and d["ranks"][0]["pipeline"]["stage"] in (0, None)
