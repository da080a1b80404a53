"""Zero-bubble pipelines (issue 18, Must 1): the simulator's ZB-H1 schedule (tests/pipesim.py: the
backward split into input-grad B and weight-grad W blocks, the W filling 1F1B's cool-down), its
detection from torch's runtime action ranges (``PP:<stage>I<mb>`` / ``PP:<stage>W<mb>``), and its
theory fraction (p-1)/(3m+p-1)."""

from __future__ import annotations

import pytest

from tests import pipesim as ps
from tests.test_pipeline import _check_against, _report


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
