"""Collectives across ranks: matching, clock alignment, wait vs transfer, stragglers."""

from __future__ import annotations

import json
import random

from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.collectives import bus_factor
from tracelens.comm import _binom_sf
from tracelens.load import load


def job(tmp_path, n_ranks, arrival, n_coll=30, skew_us=None):
    """n_ranks traces; collective i starts on rank r at 1000*i + arrival(r, i) µs and ends on
    every rank at 1000*i + 500 µs (a collective ends everywhere at once), plus skew_us[r] of
    clock offset on rank r's clock."""
    skew_us = skew_us or [0] * n_ranks
    paths = []
    for r in range(n_ranks):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": skew_us[r], "dur": 1000 * n_coll}]
        for i in range(n_coll):
            start = 1000 * i + arrival(r, i) + skew_us[r]
            end = 1000 * i + 500 + skew_us[r]
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
                       "ts": start, "dur": end - start,
                       "args": {"device": 0, "stream": 20, "Collective name": "allreduce", "Process Group Name": "0",
                                "Group size": n_ranks, "Seq": i, "dtype": "Float", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20}})
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "pid": 0, "tid": 7, "ts": 1000 * i + 600 + skew_us[r], "dur": 300,
                       "args": {"device": 0, "stream": 7}})
        p = tmp_path / f"rank-{r}.json"
        p.write_text(json.dumps({"distributedInfo": {"rank": r, "world_size": n_ranks}, "traceEvents": ev}))
        paths.append(p)
    return analyze(load(paths, use_cache=False, jobs=1))


def test_a_late_rank_is_named(tmp_path):
    # rank 2 arrives 200 µs after the others (which arrive at +100 µs) at every collective
    a = job(tmp_path, 4, lambda r, i: 300 if r == 2 else 100)
    (s,) = a.stragglers
    assert s.rank == 2 and s.last_in == 30 and s.of == 30
    assert s.excess_ns == 30 * 200_000  # 200 µs per collective beyond the next-latest arrival
    c = a.collectives[0]
    assert c.complete and c.collective == "allreduce" and c.bytes == 4 << 20
    waits = {r.rank: r.wait_ns for r in c.ranks}
    assert waits == {0: 200_000, 1: 200_000, 2: 0, 3: 200_000}
    # busbw = bytes x 2(n-1)/n / transfer time; transfer = 200 µs on every rank
    r0 = c.ranks[0]
    assert r0.busbw_gbps == (4 << 20) * bus_factor("allreduce", 4) / 200_000


def test_alike_ranks_name_nobody(tmp_path):
    rng = random.Random(7)
    table = {(r, i): rng.randint(90, 110) for r in range(4) for i in range(30)}
    a = job(tmp_path, 4, lambda r, i: table[(r, i)])
    assert a.stragglers == ()
    assert a.to_dict()["job"]["stragglers"] == []


def test_clock_skew_is_measured_not_applied(tmp_path):
    # rank 1's clock runs 5 ms ahead: collective ends line up after -5 ms
    a = job(tmp_path, 2, lambda r, i: 100, skew_us=[0, 5000])
    assert [r.clock_offset_ns for r in a.ranks] == [0, -5_000_000]
    assert all(r.wait_ns == 0 for c in a.collectives for r in c.ranks)
    assert a.ranks[1].window_start_ns > a.ranks[0].window_start_ns  # times stay on each rank's clock


def test_binomial_tail():
    assert _binom_sf(0, 10, 0.5) == 1.0
    assert abs(_binom_sf(10, 10, 0.5) - 0.5**10) < 1e-15
    assert abs(_binom_sf(1, 1, 0.25) - 0.25) < 1e-15


def test_two_sampled_ranks_of_a_real_job():
    a = analyze(load([real_traces() / "hta/trace_filter"], use_cache=False))
    d = a.to_dict()
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["job"]["clock_alignment"] == "collective ends"
    # 2 of 128 ranks: collectives match across the two, but nobody can say who waited
    both = [c for c in a.collectives if len(c.ranks) == 2]
    assert both and all(not c.complete and all(r.wait_ns is None for r in c.ranks) for c in both)
    kinds = {g["collective"] for g in d["communication"]["by_group"]}
    assert {"alltoall", "allreduce"} <= kinds
    assert d["job"]["stragglers"] == []


def test_recorded_ddp_ranks(ddp_traces):
    a = analyze(load(ddp_traces, use_cache=False))
    d = a.to_dict()
    groups = {(g["group"], g["collective"]): g for g in d["communication"]["by_group"]}
    ar = groups[("0", "allreduce")]
    assert ar["count"] == 3 and ar["group_desc"] == "default_pg"
    assert ar["bytes"] == 3 * 9610 * 4 and ar["wait_ns"] is not None
    for c in a.collectives:
        assert c.complete and len(c.ranks) == 2
        assert min(r.wait_ns for r in c.ranks) == 0  # the last to arrive waits for nobody
        for r in c.ranks:
            assert 0 <= r.wait_ns <= r.dur_ns
    # every step of both ranks is CPU-only: no GPU time, a warning says so
    assert all(r["gpu_time_ns"] is None for r in d["ranks"])
    assert any("no GPU activity" in w for w in d["warnings"])
