"""Collectives across ranks: matching, clock alignment, wait vs transfer, stragglers."""

from __future__ import annotations

import json
import random

import polars as pl

from tests.conftest import real_traces
from tracelens.analysis import analyze
from tracelens.analysis.job.stragglers import _binom_sf
from tracelens.model.collectives import bus_factor
from tracelens.store.job import load


def collectives(a) -> list[pl.DataFrame]:
    """The analysis's collective table cut into its collectives (one frame of rank rows each), in table order."""
    return a.collectives.partition_by("cid", maintain_order=True)


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
    c = collectives(a)[0]
    assert c["complete"].all() and c["collective"][0] == "allreduce" and c["bytes"][0] == 4 << 20
    waits = dict(c.select("rank", "wait_ns").iter_rows())
    assert waits == {0: 200_000, 1: 200_000, 2: 0, 3: 200_000}
    # busbw = bytes x 2(n-1)/n / transfer time; transfer = 200 µs on every rank
    assert c["busbw_gbps"][0] == (4 << 20) * bus_factor("allreduce", 4) / 200_000


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
    assert (a.collectives["wait_ns"] == 0).all()
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
    both = [c for c in collectives(a) if c.height == 2]
    assert both and all(not c["complete"].any() and c["wait_ns"].is_null().all() for c in both)
    kinds = {g["collective"] for g in d["communication"]["by_group"]}
    assert {"alltoall", "allreduce"} <= kinds
    assert d["job"]["stragglers"] is None  # nobody named, nobody cleared: no wait was measured


def test_recorded_ddp_ranks(ddp_traces):
    a = analyze(load(ddp_traces, use_cache=False))
    d = a.to_dict()
    groups = {(g["group"], g["collective"]): g for g in d["communication"]["by_group"]}
    ar = groups[("0", "allreduce")]
    assert ar["count"] == 3 and ar["group_desc"] == "default_pg"
    assert ar["bytes"] == 3 * 9610 * 4 and ar["wait_ns"] is not None
    for c in collectives(a):
        assert c["complete"].all() and c.height == 2
        assert c["wait_ns"].min() == 0  # the last to arrive waits for nobody
        for r in c.iter_rows(named=True):
            assert 0 <= r["wait_ns"] <= r["dur_ns"]
    # every step of both ranks is CPU-only: no GPU time, a warning says so
    assert all(r["gpu_time_ns"] is None for r in d["ranks"])
    assert any("no GPU activity" in w for w in d["warnings"])


# ---------------------------------------------------------------------------------------------
# Communication facts (issue 13, item 7), checked against plain Python over the raw JSON.

_SIZE = {"unsigned char": 1, "signed char": 1, "int": 4, "long": 8, "float": 4}  # C type sizes, by hand


def _raw(path):
    import gzip

    return json.loads(gzip.open(path).read())["traceEvents"]


def _numel(dims):
    n = 1
    for x in dims:
        n *= x
    return n


def _raw_comm_kernels(path):
    """Every NCCL kernel of a raw trace with the host ops around its launch, by hand: the c10d op
    that encloses the launch, the record_param_comms that does, and the nccl:* annotation inside."""
    ev = [e for e in _raw(path) if e.get("ph") == "X"]
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    host = [e for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]

    def around(t, tid, pred):
        return [h for h in host if h["tid"] == tid and pred(h["name"]) and h["ts"] <= t <= h["ts"] + h["dur"]]

    out = []
    for k in ev:
        if k.get("cat") != "kernel" or not k["name"].startswith("nccl"):
            continue
        ln = launch[k["args"]["correlation"]]
        (op,) = around(ln["ts"], ln["tid"], lambda n: n.startswith("c10d::"))
        rec = around(ln["ts"], ln["tid"], lambda n: n == "record_param_comms")
        ann = around(ln["ts"], ln["tid"], lambda n: n.startswith("nccl:"))
        out.append({"ts_ns": round(k["ts"] * 1000), "dur_ns": round(k["dur"] * 1000), "op": op, "rec": rec[0] if rec else None,
                    "ann": ann[0] if ann else None})
    return out


def test_collective_facts_of_the_sampled_job_from_the_raw_json():
    """hta/trace_filter: every kernel is ncclKernel_SendRecv; the host op around its launch says what
    it is.  The two all-gathers per rank are launched inside c10d::_allgather_base_ /
    nccl:_all_gather_base with no record_param_comms: all-gathers, not "sendrecv".  Bytes, by hand:
    an all-to-all's from its record_param_comms Input Dims x the size of its Input type; an
    all-reduce's record holds a TensorList, its nccl:all_reduce annotation the flat float tensor; an
    all-gather moves the c10d op's output (its first tensor, the larger one)."""
    folder = real_traces() / "hta/trace_filter"
    t = load([folder], use_cache=False)
    kinds = {"c10d::_allgather_base_": "allgather", "c10d::alltoall_base_": "alltoall", "c10d::allreduce_": "allreduce"}
    for f, meta in enumerate(t.metas):
        raw = _raw_comm_kernels(meta.path)
        want = {}
        for k in raw:
            coll = kinds[k["op"]["name"]]
            if coll == "alltoall":
                a = k["rec"]["args"]
                nbytes = _numel(a["Input Dims"][0]) * _SIZE[a["Input type"][0]]
            elif coll == "allreduce":
                a = k["ann"]["args"]
                nbytes = _numel(a["Input Dims"][0]) * _SIZE[a["Input type"][0]]
            else:
                a = k["op"]["args"]
                nbytes = max(_numel(d) * _SIZE[ty] for d, ty in zip(a["Input Dims"][:2], a["Input type"][:2]))
            want[(k["ts_ns"], k["dur_ns"])] = (coll, nbytes)
        assert sorted(c for c, _ in want.values()) == ["allgather"] * 2 + ["allreduce"] * 4 + ["alltoall"] * 4
        got = t.events().collect().filter((pl.col("file") == f) & (pl.col("kclass") == "comm")).select(
            "ts_ns", "dur_ns", pl.col("collective").cast(pl.String), "bytes")
        assert {(r[0], r[1]): (r[2], r[3]) for r in got.iter_rows()} == want
    d = analyze(t).to_dict()
    kinds_seen = {g["collective"] for g in d["communication"]["by_group"]}
    assert kinds_seen == {"allgather", "allreduce", "alltoall"}  # no "sendrecv", no "?"


def test_derived_matches_that_do_not_overlap_are_refused():
    """hta/trace_filter carries no sequence numbers: they are derived from each rank's order, and
    the two sampled ranks did not run their collectives in the same order.  A match is accepted
    only when the ranks' kernels overlap, after the clock alignment the report states, by at least
    half the shorter one; the others are refused, their wait is unknown and nobody is called a
    straggler (or cleared of being one)."""
    folder = real_traces() / "hta/trace_filter"
    a = analyze(load([folder], use_cache=False))
    d = a.to_dict()
    off = {r["rank"]: r["clock_offset_ns"] for r in d["ranks"]}
    # the four collectives both ranks ran together end within 0.4 ms of each other on the raw
    # clocks: the ranks share a clock (within that), so the stated offset must be small
    assert abs(off[1] - off[0]) < 400_000
    raw = {r: {(k["ts_ns"], k["dur_ns"]) for k in _raw_comm_kernels(folder / f"sampled_rank-{r}.json.gz")} for r in (0, 1)}
    both = [c for c in collectives(a) if c.height == 2]
    refused = accepted = 0
    for c in both:
        ranks = c.to_dicts()
        spans = [(r["start_ns"] + off[r["rank"]], r["start_ns"] + r["dur_ns"] + off[r["rank"]]) for r in ranks]
        for r in ranks:
            assert (r["start_ns"], r["dur_ns"]) in raw[r["rank"]]  # the kernel times are the raw file's
        overlap = min(e for _, e in spans) - max(s for s, _ in spans)
        shortest = min(e - s for s, e in spans)
        assert ranks[0]["consistent"] == (overlap >= shortest / 2)
        end_gap = abs(spans[0][1] - spans[1][1])
        if ranks[0]["consistent"]:
            accepted += 1
            assert end_gap < 1_000_000  # a real collective ends on every rank at about once
        else:
            refused += 1
            assert end_gap > 10_000_000  # 15-300 ms apart: different collectives
        assert c["wait_ns"].is_null().all()  # 2 of 128 ranks: nobody knows who waited
    assert accepted == 4 and refused >= 4
    m = d["communication"]["matching"]
    assert m["seq_source"] == "derived" and m["matched"] == len(both) and m["refused"] == refused
    assert any("do not overlap" in w and f"{refused} of {len(both)}" in w for w in d["warnings"])
    sc = d["job"]["straggler_check"]
    assert d["job"]["stragglers"] is None and sc["known"] is False and sc["collectives"] == 0
    assert "2 of the job's 128 ranks" in sc["reason"] and "do not overlap" in sc["reason"]
    # no group name anywhere in these traces: the table says why it shows none
    assert "Process Group Name" in d["communication"]["group_unknown"]


def _noseq_job(tmp_path, colls, n_ranks=2, group_size=False):
    """Traces of older PyTorch: a record_param_comms per collective (Collective name, sizes, no
    Seq, no process group unless ``group_size``) around the launch of an NCCL kernel that carries no
    args.  ``colls[r]`` is rank r's list of (start_us, end_us) of its all-reduces; every rank has
    a 100 µs GEMM in each gap so that the GPU is busy."""
    paths = []
    for r in range(n_ranks):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": colls[r][-1][1] + 1000}]
        for i, (s, e) in enumerate(colls[r]):
            corr = 1000 + i
            args = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20}
            if group_size:
                args.update({"Process Group Name": "0", "Group size": n_ranks})
            ev += [
                {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": s - 30, "dur": 20, "args": args},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": s - 25, "dur": 5,
                 "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                 "pid": 0, "tid": 20, "ts": s, "dur": e - s, "args": {"device": 0, "stream": 20, "correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": e + 10, "dur": 100,
                 "args": {"device": 0, "stream": 7}},
            ]
        p = tmp_path / f"rank-{r}.json"
        p.write_text(json.dumps({"distributedInfo": {"backend": "nccl", "rank": r, "world_size": n_ranks}, "traceEvents": ev}))
        paths.append(p)
    return analyze(load(paths, use_cache=False, jobs=1))


def _irregular(n, seed=3):
    """n collectives at irregular times: gaps of 300-3000 µs, 200-800 µs long (µs)."""
    rng = random.Random(seed)
    t, out = 1000, []
    for _ in range(n):
        dur = rng.randint(200, 800)
        out.append((t, t + dur))
        t += dur + rng.randint(300, 3000)
    return out


def test_derived_order_that_holds_gives_measured_waits(tmp_path):
    # all the job's ranks, no sequence numbers, no group names: the derived order holds (every
    # rank ran the same all-reduces), the matches overlap, and since every rank of the world is
    # here every member of every group is: rank 1 arrives 150 µs late at each of 24 all-reduces,
    # rank 0 waits those 150 µs, and rank 1 is named (2 ranks: chance of arriving last 1/2)
    base = _irregular(24)
    late = [(s + 150, e) for s, e in base]
    a = _noseq_job(tmp_path, [base, late])
    d = a.to_dict()
    assert d["communication"]["matching"] == {"seq_source": "derived", "matched": 24, "refused": 0, "complete": 24}
    for c in collectives(a):
        assert c["complete"].all() and c["consistent"].all()
        assert dict(c.select("rank", "wait_ns").iter_rows()) == {0: 150_000, 1: 0}
    (s,) = a.stragglers
    assert s.rank == 1 and s.last_in == 24 and s.of == 24 and s.excess_ns == 24 * 150_000
    assert d["job"]["straggler_check"]["known"] is True and d["job"]["straggler_check"]["collectives"] == 24
    assert not any("do not overlap" in w for w in d["warnings"])


def test_no_straggler_is_said_only_when_waits_were_measured(tmp_path):
    base = _irregular(24, seed=5)
    rng = random.Random(11)
    jitter = [[(s + rng.randint(0, 20), e) for s, e in base] for _ in range(2)]
    d = _noseq_job(tmp_path, jitter).to_dict()
    assert d["job"]["stragglers"] == []
    sc = d["job"]["straggler_check"]
    assert sc["known"] is True and sc["collectives"] == 24 and sc["reason"] is None
    from tracelens.render import render_text

    assert "straggler ranks: none (" in render_text(d)


def test_a_shifted_derived_order_is_refused_not_believed(tmp_path):
    # rank 1's trace starts one all-reduce later than rank 0's (its profiler window opened after
    # the first one): counting in per-rank order pairs rank 0's i-th with rank 1's (i+1)-th.  At
    # irregular times no clock offset makes those pairs overlap: every match is refused, no wait
    # is made up, and the straggler verdict is "unknown", with the reason
    base = _irregular(24, seed=7)
    a = _noseq_job(tmp_path, [base, base[1:]], group_size=True)
    d = a.to_dict()
    both = [c for c in collectives(a) if c.height == 2]
    assert len(both) == 23
    assert sum(not c["consistent"][0] for c in both) >= 20
    for c in both:
        if not c["consistent"][0]:
            assert c["wait_ns"].is_null().all()
    m = d["communication"]["matching"]
    assert m["refused"] == sum(not c["consistent"][0] for c in both)
    assert any("do not overlap" in w for w in d["warnings"])
    assert d["job"]["stragglers"] is None
    sc = d["job"]["straggler_check"]
    assert sc["known"] is False and "do not overlap" in sc["reason"]
    from tracelens.render import render_text

    text = render_text(d)
    assert "straggler ranks: unknown (" in text and "straggler ranks: none" not in text


def test_expert_parallel_kernels_get_a_collective_type(tmp_path):
    # DeepEP's kernels carry no collective record: their names say which phase of the MoE
    # all-to-all they are (layout computation is not communication)
    names = {
        "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int)": "notify",
        "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*)": "dispatch",
        "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int)": "notify",
        "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*)": "combine",
        "void deep_ep::internode_ll::dispatch<true, false, 7168>(void*, float*, int*, long*, void*)": "dispatch",
        "void deep_ep::internode_ll::combine<false, 7168, 9>(void*, void*, int*, void*)": "combine",
    }
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000}]
    t = 100
    for rep in range(3):
        for n in [*names, "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)"]:
            ev.append({"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 20, "ts": t, "dur": 50, "args": {"device": 0, "stream": 20}})
            t += 100
    p = tmp_path / "ep.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    tr = load([p], use_cache=False, jobs=1)
    got = dict(tr.events().collect().filter(pl.col("kind") == "kernel").select(pl.col("name").cast(pl.String), pl.col("collective").cast(pl.String),
                                                                    pl.col("kclass").cast(pl.String)).unique().select("name", pl.struct("collective", "kclass")).iter_rows())
    for n, coll in names.items():
        assert got[n] == {"collective": coll, "kclass": "comm"}, n
    assert got["void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)"]["kclass"] != "comm"
    by = {g["collective"]: g for g in analyze(tr).to_dict()["communication"]["by_group"]}
    assert set(by) == {"notify", "dispatch", "combine"}
    assert by["dispatch"]["count"] == 6 and by["notify"]["count"] == 6 and by["combine"]["count"] == 6


def test_c_type_names_have_sizes():
    from tracelens.model.collectives import dtype_bytes

    assert [dtype_bytes(x) for x in ("unsigned char", "signed char", "long int", "unsigned int", "c10::Half", "TensorList", "Scalar")] \
        == [1, 1, 8, 4, 2, None, None]


def test_group_named_from_pg_config_by_id_or_ranks(tmp_path):
    # records that name no group but carry PyTorch 2.0's Process Group ID (the group's uid in
    # pg_config) or the group's ranks: the group is the one pg_config entry they point at; ranks
    # that two groups share say nothing
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "uid": 0, "pg_size": 4, "ranks": [0, 1, 2, 3]},
           {"pg_name": "5", "pg_desc": "tp", "uid": 5, "pg_size": 2, "ranks": [0, 1]},
           {"pg_name": "6", "pg_desc": "dp", "uid": 6, "pg_size": 2, "ranks": [0, 2]},
           {"pg_name": "7", "pg_desc": "dp_copy", "uid": 7, "pg_size": 2, "ranks": [0, 2]}]
    recs = [({"Process Group ID": 5}, "5"), ({"Process Group Ranks": "[0, 1, 2, 3]"}, "0"), ({"Process Group Ranks": "[0, 2]"}, None),
            ({"Process Group ID": 99}, None)]
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000}]
    for i, (a, _) in enumerate(recs):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 100 + 1000 * i, "dur": 20,
                   "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 10, "Out msg nelems": 10, **a}})
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 4, "pg_config": pgs}, "traceEvents": ev}))
    t = load([p], use_cache=False, jobs=1)
    got = t.events().collect().filter(pl.col("kind") == "collective").sort("ts_ns").select(pl.col("group").cast(pl.String), "group_size")
    assert got.get_column("group").to_list() == [g for _, g in recs]
    assert got.get_column("group_size").to_list() == [2, 4, None, None]


def test_every_front_end_says_unknown_when_waits_were_not_measured():
    # the sample job (2 of 128 ranks): text, HTML and the TUI's overview all say "unknown" and
    # why, none of them "no straggler"; the communication notes say how collectives were matched
    from html import escape

    from tracelens.render import render_text
    from tracelens.render.html import render_html
    from tracelens.tui.panes import OverviewPane

    d = analyze(load([real_traces() / "hta/trace_filter"], use_cache=False)).to_dict()
    reason = d["job"]["straggler_check"]["reason"]
    text = render_text(d)
    page = render_html(d).decode()
    tui = OverviewPane(d)._ranks_line().plain
    for out, want in ((text, reason), (page, escape(reason)), (" ".join(tui.split()), reason)):
        assert f"straggler ranks: unknown ({want})" in out
        assert "no straggler" not in out and "straggler ranks: none" not in out
    assert "6 refused" in text or f"{d['communication']['matching']['refused']} refused" in text
    assert escape(d["communication"]["group_unknown"]) in page


def test_a_kernel_after_a_record_is_not_taken_for_it(tmp_path):
    # an NCCL all-reduce launched inside its record_param_comms, then 2 ms later on the same thread
    # a DeepEP dispatch kernel with no record of its own: the dispatch must not inherit the
    # all-reduce's record (type, sequence number, bytes) -- it would merge into that collective
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000},
          {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 100, "dur": 20,
           "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Out msg nelems": 256, "Seq": 7,
                    "Process Group Name": "0", "Group size": 2}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 105, "dur": 5, "args": {"correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20, "ts": 200, "dur": 50,
           "args": {"device": 0, "stream": 20, "correlation": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2100, "dur": 5, "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*)", "pid": 0, "tid": 21, "ts": 2200,
           "dur": 80, "args": {"device": 0, "stream": 21, "correlation": 2}}]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    t = load([p], use_cache=False, jobs=1)
    k = t.events().collect().filter(pl.col("kind") == "kernel").sort("ts_ns").select(pl.col("collective").cast(pl.String), "seq", "bytes")
    assert k.row(0) == ("allreduce", 7, 1024)
    assert k.row(1)[0] == "dispatch" and k.row(1)[1] != 7 and k.row(1)[2] is None
    assert t.metas[0].attributes["seq_source"].startswith("mixed")
