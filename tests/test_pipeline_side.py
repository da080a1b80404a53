"""P2P on another process group than the pipeline's (issue 18): context-parallel ring attention
(a send to the next and a recv from the previous CP rank inside every block, the same way in the
backward) and an MoE token exchange done with ``batch_isend_irecv`` (send/recv with every other
expert-parallel rank inside every block).  The pipeline's group alone is taken for the stages'
hand-offs; a job whose only P2P is such a ring or exchange has no pipeline; where the two cannot
be told apart the confidence is low and the evidence says why.  The simulator's known answer (p,
m, v, schedule, each stage's bubble) is ``tests/pipesim``'s, unchanged by the in-block exchanges
(their kernels run inside the block's compute)."""

from __future__ import annotations

import pytest

from tests import pipesim as ps
from tests.test_pipeline import _report
from tests.test_pipeline_gpu import _check


@pytest.mark.parametrize("group_desc", [True, False])
@pytest.mark.parametrize("schedule,p,m,kw", [
    ("1f1b", 4, 8, {"cp": 4, "batched": True}),
    ("gpipe", 4, 4, {"cp": 3}),
    ("1f1b", 2, 8, {"cp": 2, "batched": True}),  # a 2-rank ring beside a one-way pipeline group
    ("gpipe", 2, 4, {"dp": 4, "moe_ep": 4, "batched": True}),
    ("interleaved", 4, 8, {"cp": 4, "batched": True, "megatron_ranges": True}),
    ("1f1b", 4, 8, {"dp": 2, "moe_ep": 2, "cp": 2, "tp": 2, "tp_allreduce": True}),
])
def test_side_p2p_is_not_the_pipeline(tmp_path, schedule, p, m, kw, group_desc):
    """Before: every rank sent and received both ways, so the ranks were taken for a ring of
    virtual stages (1F1B p=4 m=8 with CP 4 reported "interleaved", v=2) and the in-block P2P cut
    each micro-batch into two blocks."""
    sim = ps.simulate(schedule, p, m, latency_ns=20_000, annotations="none", steps=2)
    lay = ps.Layout(group_desc=group_desc, **kw)
    d = _report(ps.write(sim, tmp_path, layout=lay))
    _check(sim, lay, d)
    ev = " ".join(d["job"]["pipeline"]["evidence"])
    assert "P2P set aside as no pipeline hand-off" in ev
    assert ("ring: context-parallel" in ev or "2-rank ring" in ev) if kw.get("cp", 1) > 1 else "MoE all-to-all" in ev
    assert "not sure" not in ev, ev


@pytest.mark.parametrize("kw", [{"cp": 4}, {"cp": 3, "batched": True}, {"dp": 4, "moe_ep": 4}, {"dp": 3, "moe_ep": 3, "batched": True}])
def test_ring_or_exchange_alone_is_no_pipeline(tmp_path, kw):
    """A job without pipeline parallelism (p=1) whose only P2P is a CP ring or an MoE exchange:
    no stages, no schedule, no bubble.  Before: a 1F1B pipeline of at least 3 stages with m=16."""
    sim = ps.simulate("1f1b", 1, 8, annotations="none", steps=2)
    d = _report(ps.write(sim, tmp_path, layout=ps.Layout(**kw)))
    pipe = d["job"]["pipeline"]
    assert (pipe["stages"], pipe["microbatches"], pipe["schedule"], pipe["confidence"], pipe["bubble_fraction"]) == (None,) * 5
    assert "no pipeline hand-off" in pipe["evidence"][0]
    # the rank's pipeline entry: no stage, and no idle taken for bubble (the ring's P2P ends no gap as a pipeline's would)
    assert d["ranks"][0]["pipeline"]["stage"] is None and d["ranks"][0]["pipeline"]["bubble_ns"] == 0


def test_two_rank_ring_alone_is_not_sure(tmp_path):
    """A 2-rank CP ring (one peer, both ways, in forward and backward) with no pipeline and no
    group description: it looks like a 2-stage interleaved pipeline; whatever is claimed is
    claimed with low confidence, the evidence saying why."""
    sim = ps.simulate("1f1b", 1, 8, annotations="none", steps=2)
    d = _report(ps.write(sim, tmp_path, layout=ps.Layout(cp=2, group_desc=False)))
    pipe = d["job"]["pipeline"]
    assert pipe["confidence"] in (None, "low")
    assert any("2-rank context-parallel ring" in e for e in pipe["evidence"]) or pipe["stages"] is None, pipe["evidence"]


def test_two_stage_interleaved_beside_two_rank_ring(tmp_path):
    """Interleaved p=2 beside a 2-rank CP ring: both groups have one peer both ways.  With the
    groups' descriptions ("pp", "cp0") the pipeline's is told and the answer is exact; without
    them it cannot be told: low confidence and the evidence says so."""
    sim = ps.simulate("interleaved", 2, 4, latency_ns=20_000, annotations="none", steps=2)
    lay = ps.Layout(cp=2, batched=True)
    d = _report(ps.write(sim, tmp_path / "a", layout=lay))
    _check(sim, lay, d)
    assert not any("not sure" in e for e in d["job"]["pipeline"]["evidence"])
    d = _report(ps.write(sim, tmp_path / "b", layout=ps.Layout(cp=2, batched=True, group_desc=False)))
    pipe = d["job"]["pipeline"]
    assert pipe["confidence"] == "low"
    assert any("not sure" in e for e in pipe["evidence"]), pipe["evidence"]
