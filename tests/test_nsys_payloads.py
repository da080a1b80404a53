"""NCCL's typed NVTX payloads in nsys exports (FORMATS.md 1.6): the communicator, size and ranks of
each collective, so that collectives are matched across ranks per communicator.

No real export with NCCL payloads is available here: the exports are built by
tests/nsys_build.py with the layout FORMATS.md 1.6 documents (``binaryData``: a 32-byte header,
then the struct at the offsets NVTX_PAYLOAD_SCHEMA_ENTRIES gives; the reduction operation an enum
named in NVTX_PAYLOAD_ENUM_ENTRIES)."""

from __future__ import annotations

import json

import polars as pl
from tracelens.parsers import nsys

from tests.nsys_build import several_ranks
from tracelens.analysis import analyze
from tracelens.store.job import load

A, B = 0xF00000000000000A, 0x1234  # two communicators (A's id above 2^63: SQLite could not hold it as an integer)
PROCS = [(301, [0]), (302, [1])]


def _collectives(df):
    return df.filter(pl.col("kind") == "collective").sort("ts_ns")


def test_payloads_give_communicator_size_and_ranks(tmp_path):
    path = several_ranks(tmp_path / "p.sqlite", PROCS, comms={301: [A, B], 302: [B, A]})
    for part, order in zip(nsys.parts(path), ([A, B], [B, A])):
        df, meta = nsys.parse(path, part=part)
        c = _collectives(df)
        assert c.get_column("group").cast(pl.String).to_list() == [str(g) for g in order] * 3
        assert c.get_column("bytes").to_list() == [4096, 4096, 8192, 8192, 12288, 12288]
        assert set(c.get_column("group_size")) == {2} and {json.loads(a)["reduction_op"] for a in c.get_column("args")} == {"Sum"}
        # the order per communicator and type: 0, 1, 2 on each communicator
        assert c.group_by("group", maintain_order=True).agg("seq").get_column("seq").to_list() == [[0, 1, 2], [0, 1, 2]]
        # the kernels take their record's communicator and number
        k = df.filter(pl.col("kclass") == "comm").sort("ts_ns")
        assert k.select("group", "seq").rows() == c.select("group", "seq").rows()
        assert "communicator" in meta.attributes["seq_source"] and not any("payload" in w for w in meta.warnings)


def test_matched_across_ranks_per_communicator(tmp_path):
    """Rank 0 calls communicator A then B each step, rank 1 B then A: with payloads each collective
    meets its own communicator's on the other rank; by order alone they would cross."""
    path = several_ranks(tmp_path / "p.sqlite", PROCS, comms={301: [A, B], 302: [B, A]})
    table = analyze(load([path], use_cache=False)).collectives
    assert table.height == 12 and set(table.get_column("group")) == {str(A), str(B)}
    per = table.group_by("group", "seq").agg(pl.col("rank").sort(), pl.col("bytes").n_unique().alias("sizes"))
    assert per.height == 6 and per.get_column("rank").to_list() == [[0, 1]] * 6 and set(per.get_column("sizes")) == {1}


def test_without_payloads_the_order_within_the_type_and_a_warning(tmp_path):
    path = several_ranks(tmp_path / "n.sqlite", PROCS)
    df, meta = nsys.parse(path, part=0)
    c = _collectives(df)
    assert c.get_column("group").null_count() == c.height and c.get_column("seq").to_list() == [0, 1, 2]
    assert meta.attributes["seq_source"].startswith("derived: order within the collective type")
    assert sum("carry no payloads" in w for w in meta.warnings) == 1


def test_a_blob_that_does_not_fit_is_skipped_and_counted(tmp_path):
    from tests.nsys_build import nccl_blob

    def blob(comm, nbytes, redop, nranks):  # the second step's payloads cut short
        b = nccl_blob(comm, nbytes, redop, nranks)
        return b[:30] if nbytes == 8192 else b

    path = several_ranks(tmp_path / "b.sqlite", PROCS, comms={301: [A], 302: [A]}, blob=blob)
    df, meta = nsys.parse(path, part=0)
    c = _collectives(df)
    assert c.get_column("group").cast(pl.String).to_list() == [str(A), None, str(A)]
    said = [w for w in meta.warnings if "do not fit their schema" in w]
    assert said == ["1 of the 3 NCCL NVTX payloads do not fit their schema (an undescribed schema, or a blob too short for "
                    "its fields): skipped, those collectives matched by order"]
