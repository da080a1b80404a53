"""The collective rows of one rank (COLLECTIVE_SCHEMA) and the job reduce over them: interval
arithmetic against the plain-Python interval sets, hand-built ranks with the arithmetic in the
comments, invariants over random multi-rank jobs, and a stable order whatever the input's."""

from __future__ import annotations

import json
import random

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.analysis import intervals as iv
from tracelens.analysis.job import clocks, comm
from tracelens.analysis.job import collectives as coll
from tracelens.analysis.job import stragglers as strag
from tracelens.analysis.rank.collectives import collective_rows, step_starts
from tracelens.model.schema import COLLECTIVE_SCHEMA, conform
from tracelens.store.job import load


def events(rows: list[dict]) -> pl.DataFrame:
    """An event table (EVENT_SCHEMA) from a few hand-written rows."""
    return conform(pl.DataFrame(rows, infer_schema_length=None))


def kernel(ts, dur, kclass="comm", **kw) -> dict:
    return {"kind": "kernel", "name": "k", "ts_ns": ts, "dur_ns": dur, "kclass": kclass, "device": 0, **kw}


def union(pairs) -> pl.DataFrame:
    return pl.DataFrame({"s": [s for s, _ in pairs], "e": [e for _, e in pairs]}, schema={"s": pl.Int64, "e": pl.Int64})


# -- interval columns ------------------------------------------------------------------------


spans = st.lists(st.tuples(st.integers(-50, 400), st.integers(0, 80)), max_size=30)


@settings(max_examples=400, deadline=None)
@given(spans, st.lists(st.sampled_from(["a", "b", None]), min_size=30, max_size=30), spans, st.booleans())
def test_outside_by_is_each_groups_union_less_the_set(pairs, keys, within, huge):
    # huge: times near 2^62 (no intermediate may overflow)
    base = 2**62 if huge else 0
    df = pl.DataFrame({"k": keys[: len(pairs)], "s": [base + s for s, _ in pairs], "e": [base + s + d for s, d in pairs]},
                      schema={"k": pl.String, "s": pl.Int64, "e": pl.Int64})
    w = iv.normalize([(base + s, base + s + d) for s, d in within])
    got = dict(iv.outside_by(df.lazy(), ["k"], union(w)).collect().iter_rows())
    want = {}
    for k in set(keys[: len(pairs)]):
        mine = iv.normalize([(base + s, base + s + d) for (s, d), kk in zip(pairs, keys) if kk == k])
        if mine:  # a group of zero-length intervals only has no row
            want[k] = iv.length(iv.subtract(mine, w))
    assert got == want


@settings(max_examples=200, deadline=None)
@given(spans)
def test_union_frame_is_the_interval_set(pairs):
    df = pl.DataFrame({"ts_ns": [s for s, _ in pairs], "dur_ns": [d for _, d in pairs]}, schema={"ts_ns": pl.Int64, "dur_ns": pl.Int64})
    assert iv.union_of(df) == iv.normalize([(s, s + d) for s, d in pairs])


# -- one rank's rows -------------------------------------------------------------------------


def test_a_coalesced_collective_on_two_streams_is_one_row():
    # allreduce seq 4 of group "0": kernels [100, 160) on stream 20 and [140, 220) on stream 21
    # (union [100, 220) = 120), compute [150, 180) and [200, 400): exposed 120 - 30 - 20 = 70.
    # allgather seq 5: one kernel [500, 540), no compute under it: exposed 40.  A host record of
    # the all-reduce is ignored (the rank has GPU communication kernels)
    coll_args = {"group": "0", "group_desc": "default_pg", "group_size": 8, "collective": "allreduce", "seq": 4}
    ev = events([
        kernel(100, 60, stream=20, bytes=1000, **coll_args),
        kernel(140, 80, stream=21, bytes=3000, **coll_args),
        kernel(500, 40, stream=20, seq=5, collective="allgather", group="0", group_size=8),
        kernel(150, 30, kclass="gemm", stream=7), kernel(200, 200, kclass="gemm", stream=7),
        {"kind": "collective", "name": "record_param_comms", "ts_ns": 90, "dur_ns": 500, "tid": 1, **coll_args},
    ])
    compute = iv.union_frame(ev.filter(pl.col("kclass") == "gemm"))
    rows = collective_rows(ev, compute, 3, 7)
    assert rows.schema == pl.Schema(COLLECTIVE_SCHEMA)
    assert rows.select("file", "rank", "group", "group_desc", "seq", "collective", "start_ns", "end_ns", "bytes", "group_size",
                       "on_host", "exposed_ns", "n_parts").rows() == [
        (3, 7, "0", "default_pg", 4, "allreduce", 100, 220, 3000, 8, False, 70, 2),
        (3, 7, "0", None, 5, "allgather", 500, 540, None, 8, False, 40, 1),
    ]


def test_a_cpu_only_rank_uses_its_host_records():
    # no communication kernel: the gloo records are the spans, on the host; unknown group and type are ""
    ev = events([{"kind": "collective", "name": "record_param_comms", "ts_ns": 10, "dur_ns": 90, "tid": 1, "seq": 0},
                 {"kind": "p2p", "name": "record_param_comms", "ts_ns": 200, "dur_ns": 50, "tid": 1, "seq": 1, "collective": "send"},
                 {"kind": "collective", "name": "no_seq", "ts_ns": 300, "dur_ns": 50, "tid": 1}])
    rows = collective_rows(ev, iv.union_frame(ev.head(0)), 0, 0)
    assert rows.select("group", "seq", "collective", "start_ns", "end_ns", "on_host", "exposed_ns").rows() == [
        ("", 0, "", 10, 100, True, 90), ("", 1, "send", 200, 250, True, 50)]


def test_no_collectives_no_rows():
    ev = events([kernel(0, 10, kclass="gemm", stream=7)])
    assert collective_rows(ev, iv.union_frame(ev), 0, 0).height == 0
    assert step_starts(ev, 0).height == 0


# -- the reduce ------------------------------------------------------------------------------


def random_job(rng: random.Random, n_ranks: int, n_coll: int):
    """The rows and step starts of n_ranks ranks running n_coll collectives (some coalesced into
    two kernels, some missing on a rank), each rank with its own clock offset and compute."""
    rows, starts = [], []
    for r in range(n_ranks):
        skew = rng.randint(-5000, 5000)
        evs, t = [], 0
        for i in range(n_coll):
            t += rng.randint(50, 400)
            if rng.random() < 0.1:
                continue  # not on this rank
            args = {"group": rng.choice(["0", "1"]) if i % 5 == 0 else "0", "seq": i, "collective": rng.choice(["allreduce", "broadcast"]),
                    "group_size": n_ranks, "bytes": rng.choice([None, 4096])}
            s = t + skew + rng.randint(0, 60)
            evs.append(kernel(s, rng.randint(0, 120), stream=20, **args))
            if rng.random() < 0.3:
                evs.append(kernel(s + rng.randint(0, 50), rng.randint(1, 80), stream=21, **args))
            if rng.random() < 0.5:
                evs.append(kernel(s + rng.randint(-30, 30), rng.randint(1, 100), kclass="gemm", stream=7))
        evs.append({"kind": "step", "name": "ProfilerStep#1", "ts_ns": skew, "dur_ns": t, "tid": 1})
        ev = events(evs)
        mine = collective_rows(ev, iv.union_frame(ev.filter(pl.col("kclass") == "gemm")), r, r)
        # the exposed time, independently: per collective, its kernels' interval set less the compute's
        compute = iv.normalize([(e["ts_ns"], e["ts_ns"] + e["dur_ns"]) for e in evs if e.get("kclass") == "gemm"])
        want: dict[tuple, list] = {}
        for e in evs:
            if e.get("kclass") == "comm":
                want.setdefault((e["group"], e["seq"], e["collective"]), []).append((e["ts_ns"], e["ts_ns"] + e["dur_ns"]))
        assert {(g, q, c): x for g, q, c, x in mine.select("group", "seq", "collective", "exposed_ns").iter_rows()} == {
            k: iv.length(iv.subtract(iv.normalize(v), compute)) for k, v in want.items()}
        rows.append(mine)
        starts.append(step_starts(ev, r))
    return pl.concat(rows), pl.concat(starts)


def communication(rows: pl.DataFrame, starts: pl.DataFrame, n_ranks: int) -> dict:
    """The report's communication facts from the rows alone, as analyze() computes them."""
    align = clocks.align_clocks(rows, starts, n_ranks)
    table = coll.collective_table(rows, align, frozenset(), n_ranks)
    return {
        "offsets": align.offsets, "method": align.method,
        "by_group": coll.by_group(table), "slowest": coll.slowest(table),
        "stragglers": strag.stragglers(table, n_ranks), "check": strag.straggler_check(table, n_ranks, n_ranks),
        "notes": comm.report_notes(table, ()), "warnings": comm.matching_warnings(table, align, []),
        "table": table.rows(),
    }


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(0, 25))
def test_rows_and_table_invariants(seed, n_ranks, n_coll):
    rng = random.Random(seed)
    rows, starts = random_job(rng, n_ranks, n_coll)
    # each rank's exposed time is part of its span; a row's span is its kernels' hull
    assert rows.filter((pl.col("exposed_ns") < 0) | (pl.col("exposed_ns") > pl.col("end_ns") - pl.col("start_ns"))).height == 0
    want = communication(rows, starts, n_ranks)
    table = coll.collective_table(rows, clocks.align_clocks(rows, starts, n_ranks), frozenset(), n_ranks)
    assert table.height == rows.height
    assert table.filter((pl.col("wait_ns") < 0) | (pl.col("wait_ns") > pl.col("dur_ns"))).height == 0
    # a measured collective: its last arrival waits for nobody
    measured = table.filter(pl.col("wait_ns").is_not_null()).group_by("cid").agg(pl.col("wait_ns").min())
    assert (measured["wait_ns"] == 0).all()
    # the same rows in another order: the same table, the same report facts
    shuffled = rows.sample(fraction=1.0, shuffle=True, seed=seed % 1000)
    assert communication(shuffled, starts.reverse(), n_ranks) == want


def test_two_collectives_sharing_a_group_and_seq_keep_their_order():
    # two collectives of one (group, seq) on two ranks, different types: the table orders them by
    # type ("" first), each rank's rows by file, whatever order the rows come in
    rows = pl.DataFrame([
        {"file": f, "rank": f, "group": "0", "group_desc": None, "seq": 1, "collective": c, "start_ns": s, "end_ns": s + 10,
         "bytes": None, "group_size": 2, "on_host": False, "exposed_ns": 5, "n_parts": 1}
        for f, c, s in [(1, "allreduce", 0), (0, "", 3), (0, "allreduce", 1), (1, "", 2)]
    ], schema=COLLECTIVE_SCHEMA)
    align = clocks.ClockAlignment({0: 0, 1: 0}, "none", {0: 0, 1: 0})
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        t = coll.collective_table(rows[order], align, frozenset(), 2)
        assert t.select("cid", "collective", "file", "wait_ns").rows() == [(0, None, 0, 0), (0, None, 1, 1), (1, "allreduce", 0, 0),
                                                                          (1, "allreduce", 1, 1)]


def test_clocks_fall_back_to_step_starts():
    # no collectives at all: rank 1's steps start 3 ms later on its clock (offset -3 ms); rank 2's
    # step names match none of rank 0's: it keeps its own clock
    starts = pl.DataFrame({"file": [0, 0, 1, 1, 2], "name": ["s1", "s2", "s1", "s2", "x"], "start_ns": [0, 10_000_000, 3_000_000, 13_000_000, 5]},
                          schema={"file": pl.Int32, "name": pl.String, "start_ns": pl.Int64})
    a = clocks.align_clocks(pl.DataFrame(schema=COLLECTIVE_SCHEMA), starts, 3)
    assert a.offsets == {0: 0, 1: -3_000_000, 2: 0} and a.method == "step starts"


def test_reports_are_identical_run_to_run(tmp_path):
    # a real two-rank job analysed twice, and a four-rank one whose files are given in another order
    a = analyze(load([real_traces() / "hta/trace_filter"], use_cache=False)).to_dict()
    b = analyze(load([real_traces() / "hta/trace_filter"], use_cache=False)).to_dict()
    assert json.dumps(a) == json.dumps(b)
    paths = []
    for r in range(4):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 20_000}]
        for i in range(12):
            for part in range(2):  # two collectives share each (group, seq): an all-reduce and a broadcast
                start = 1000 * i + (r * 17 + i * 5) % 40 + 400 * part
                ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if not part else "ncclDevKernel_Broadcast_RING_LL",
                           "pid": 0, "tid": 20, "ts": start, "dur": 1000 * i + 300 + 400 * part - start,
                           "args": {"device": 0, "stream": 20, "Collective name": "broadcast" if part else "allreduce", "Process Group Name": "0",
                                    "Group size": 4, "Seq": i, "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256}})
        p = tmp_path / f"rank-{r}.json"
        p.write_text(json.dumps({"distributedInfo": {"rank": r, "world_size": 4}, "traceEvents": ev}))
        paths.append(p)
    one = analyze(load(paths, use_cache=False, jobs=1)).to_dict()
    assert json.dumps(one) == json.dumps(analyze(load(paths, use_cache=False, jobs=1)).to_dict())
    # the files in the other order: the same collectives, totals and stragglers; each collective's
    # ranks come in file order, as the report's ranks do
    two = analyze(load(paths[::-1], use_cache=False, jobs=1)).to_dict()
    c1, c2 = one["communication"], two["communication"]
    assert c1["by_group"] == c2["by_group"] and len(c1["slowest"]) == 20
    for x, y in zip(c1["slowest"], c2["slowest"]):
        assert {k: v for k, v in x.items() if k != "ranks"} == {k: v for k, v in y.items() if k != "ranks"}
        assert x["ranks"] == y["ranks"][::-1]
    assert one["job"]["stragglers"] == two["job"]["stragglers"]
