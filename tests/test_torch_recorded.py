"""Traces recorded here with torch's profiler: two processes, gloo DDP, a DataLoader with one
worker process, record_shapes=True.  Both ranks load, with what the run really did."""

from __future__ import annotations

import orjson
import polars as pl
import pytest

from tracelens.model.schema import validate
from tracelens.store.job import load

pytestmark = pytest.mark.slow


def test_both_ranks_load(ddp_traces):
    trace = load(ddp_traces, use_cache=False, jobs=2)
    validate(trace.events().collect())
    assert [(m.rank, m.rank_source, m.world_size, m.backend) for m in trace.metas] == [
        (0, "distributedInfo", 2, "gloo"),
        (1, "distributedInfo", 2, "gloo"),
    ]
    ev = trace.events().collect()
    for rank in (0, 1):
        mine = ev.filter(pl.col("rank") == rank)
        steps = mine.filter(pl.col("kind") == "step").get_column("name").cast(pl.String).sort().to_list()
        assert steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
        # one DataLoader __next__ per step, through the worker process's iterator
        dl = mine.filter(pl.col("kind") == "dataloader").get_column("name").cast(pl.String).to_list()
        assert len(dl) == 3 and all("MultiProcessingDataLoaderIter" in n for n in dl)
        # DDP's gradient all-reduce, one per step, from the gloo annotations
        ar = mine.filter((pl.col("kind") == "collective") & (pl.col("collective") == "allreduce"))
        assert ar.height == 3
        # MLP 64->128->10: 64*128 + 128 + 128*10 + 10 = 9610 float parameters = 38440 bytes
        assert set(ar.get_column("bytes").to_list()) == {9610 * 4}


def test_shapes_recorded(ddp_traces):
    trace = load(ddp_traces[:1], use_cache=False)
    addmm = trace.events().collect().filter(pl.col("name") == "aten::addmm")
    assert addmm.height >= 3
    dims = [orjson.loads(a)["Input Dims"] for a in addmm.get_column("args").to_list()]
    # batch 32: the first layer is addmm(bias[128], x[32,64], W^T[64,128])
    assert [[128], [32, 64], [64, 128], [], []] in dims  # + beta, alpha scalars


def test_collectives_match_across_ranks(ddp_traces):
    trace = load(ddp_traces, use_cache=False)
    coll = trace.events().collect().filter(pl.col("kind") == "collective").select("rank", "seq", "collective", "bytes")
    r0 = coll.filter(pl.col("rank") == 0).drop("rank").sort(pl.col("seq"), pl.col("collective").cast(pl.String))
    r1 = coll.filter(pl.col("rank") == 1).drop("rank").sort(pl.col("seq"), pl.col("collective").cast(pl.String))
    assert r0.height > 0 and r0.equals(r1)
