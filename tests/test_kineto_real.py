"""Every real trace in tests/data/traces/{hta,amd-tracelens,kineto-tbplugin} loads (or fails with
the documented "not a trace" error), and what we load agrees with a plain JSON scan of the file."""

from __future__ import annotations

import gzip
import re

import orjson
import polars as pl
import pytest
from tracelens.parsers.kineto import parse

from tests.conftest import real_trace_files, real_traces
from tracelens.model.errors import ParseError
from tracelens.model.schema import validate

FILES = real_trace_files("hta", "amd-tracelens", "kineto-tbplugin")
DEVICE_CATS = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"}


def _content(path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _scan(path) -> dict | None:
    """Independent count of what the file holds, from orjson's whole-file parse."""
    doc = orjson.loads(_content(path))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list) or not any(isinstance(e, dict) and "ph" in e for e in events):
        return None  # not a trace
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") != "Trace"]
    cat = lambda e: (e.get("cat") or "").lower()  # noqa: E731
    args = lambda e: e.get("args") or {}  # noqa: E731
    kernels = [e for e in xs if cat(e) == "kernel"]
    runtime_corr = {args(e).get("correlation") for e in xs if cat(e) in ("cuda_runtime", "cuda_driver", "runtime")}
    runtime_corr.discard(None)
    # collective records: record_param_comms (but c10d::wait's), and each backend annotation
    # (nccl:all_reduce on the host) that no such record on its thread overlaps
    records = [e for e in xs if e.get("name") == "record_param_comms" and args(e).get("Collective name") != "wait"]
    backend = [e for e in xs if cat(e) == "user_annotation" and re.match(r"(gloo|nccl|rccl|mpi|ucc|xccl):", str(e.get("name")))
               and str(e.get("name")).split(":", 1)[1] != "wait"]

    def overlaps(a, r):
        return a.get("pid") == r.get("pid") and a.get("tid") == r.get("tid") and r["ts"] <= a["ts"] + a.get("dur", 0) \
            and r["ts"] + r.get("dur", 0) >= a["ts"]

    uncovered = [a for a in backend if not any(overlaps(a, r) for r in records)]
    return {
        "rows": sum(1 for e in xs if cat(e) != "python_function"),
        "kernel": len(kernels),
        "memcpy": sum(1 for e in xs if cat(e) in ("gpu_memcpy", "memcpy")),
        "memset": sum(1 for e in xs if cat(e) in ("gpu_memset", "memset")),
        "steps": sum(1 for e in xs if cat(e) not in DEVICE_CATS and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))),
        "param_comms": len(records) + len(uncovered),
        "kernels_with_launch": sum(1 for e in kernels if args(e).get("correlation") in runtime_corr),
        "rank": (doc.get("distributedInfo") or {}).get("rank") if isinstance(doc, dict) else None,
    }


def test_the_real_traces_are_there():
    real_traces()
    assert len(FILES) >= 30


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_real_trace(path):
    expected = _scan(path)
    if expected is None:
        with pytest.raises(ParseError) as ei:
            parse(path)
        assert ei.value.problem.startswith("not a trace") and str(path) in str(ei.value)
        return
    df, meta = parse(path)
    validate(df)
    counts = dict(df.group_by("kind").len().iter_rows())
    assert df.height == expected["rows"]
    assert counts.get("kernel", 0) == expected["kernel"]
    assert counts.get("memcpy", 0) == expected["memcpy"]
    assert counts.get("memset", 0) == expected["memset"]
    assert counts.get("step", 0) == expected["steps"]
    if expected["param_comms"]:
        assert counts.get("collective", 0) + counts.get("p2p", 0) == expected["param_comms"]
    # every kernel whose launch is in the file is linked to it
    launches = df.filter(pl.col("kind").is_in(["runtime", "sync"])).get_column("correlation").drop_nulls()
    linked = df.filter((pl.col("kind") == "kernel") & pl.col("correlation").is_in(launches.implode()))
    assert linked.height == expected["kernels_with_launch"]
    if isinstance(expected["rank"], int):
        assert meta.rank == expected["rank"]
    # a kernel row always sits on a device and a stream, a host row on a thread
    assert df.filter(pl.col("kind") == "kernel").select(pl.col("device").is_null().sum(), pl.col("stream").is_null().sum()).row(0) == (0, 0)
    # times are on the file's own clock: the earliest start is the earliest ts in the file
    assert meta.format == "kineto" and meta.parser_version


def test_ns_resolution_timestamps_are_exact():
    path = real_traces() / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    text = _content(path).decode()
    # every "ts" written in the file, converted from its decimal text by integer arithmetic
    written = set()
    for whole, frac in re.findall(r'"ts": (\d+)\.(\d{3})', text):
        written.add(int(whole) * 1000 + int(frac))
    df, _ = parse(path)
    ours = set(df.get_column("ts_ns").to_list())
    assert len(ours) > 10_000
    assert ours <= written  # float64 would be off by up to 128 ns at this magnitude


def test_comm_kernels_carry_their_collective():
    """Older PyTorch puts the collective's args only on record_param_comms; they must reach the
    NCCL kernel it launched (through correlation -> launch -> the record on that thread)."""
    df, meta = parse(real_traces() / "hta/nccl_parser_config/nccl_data.json.gz")
    comm = df.filter(pl.col("kclass") == "comm")
    assert comm.height > 0
    assert comm.get_column("collective").null_count() == 0
    assert comm.get_column("group").null_count() == 0
    host = df.filter(pl.col("kind") == "collective")
    # the kernels' sizes are the recorded messages: In msg nelems x 4 bytes (Float)
    assert set(comm.get_column("bytes").to_list()) <= set(host.get_column("bytes").to_list())
    assert meta.attributes["seq_source"].startswith("derived")


def test_b200_allgather_args_on_kernel():
    df, meta = parse(real_traces() / "amd-tracelens/b200/eager_trace.json.gz")
    comm = df.filter(pl.col("kclass") == "comm")
    assert comm.height > 0
    # NCCL's AllGather (args on the kernel) and PyTorch's symmetric-memory multimem all-reduce
    # (no args; the collective comes from the kernel name)
    assert set(comm.get_column("collective").cast(pl.String).to_list()) == {"allgather", "allreduce"}
    assert meta.device_name == "NVIDIA B200" and meta.platform == "cuda" and meta.world_size == 8


def test_rocm_generic_rccl_kernel_is_comm():
    df, meta = parse(real_traces() / "amd-tracelens/mi300/resnet_act_checkpoint.json.gz")
    assert meta.platform == "rocm"
    comm = df.filter(pl.col("kclass") == "comm")
    assert comm.height > 0
    assert comm.get_column("name").cast(pl.String).str.contains("Generic").all()
    # RCCL's Generic kernel does not say what it does: the record_param_comms of its launch does.
    launches = df.filter(pl.col("kind") == "runtime").get_column("correlation").drop_nulls().implode()
    launched = comm.filter(pl.col("correlation").is_in(launches))
    assert launched.height >= 10
    assert launched.get_column("collective").null_count() == 0
    assert launched.get_column("group").null_count() == 0
    # kernels whose launch fell outside the profiling window stay unknown, not guessed
    assert comm.filter(~pl.col("correlation").is_in(launches)).get_column("collective").null_count() == comm.height - launched.height


def test_old_2021_schema():
    df, meta = parse(real_traces() / "kineto-tbplugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz")
    assert meta.trace_schema == "2021"
    k = df.filter(pl.col("kind") == "kernel")
    assert k.get_column("external_id").null_count() == 0  # from lower-case "external id"
    assert k.get_column("stream").unique().to_list() == [7]  # "stream 7" / args.stream
    assert df.filter(pl.col("kind") == "dataloader").height == 6
    assert meta.device_name == "Tesla V100-DGXS-32GB"


def test_ids_above_int64():
    df, _ = parse(real_traces() / "hta/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz")
    assert df.height == 2
    args = orjson.loads(df.filter(pl.col("kind") == "collective").get_column("args")[0])
    assert args["Comms Id"] == 10159970886766084423  # kept verbatim in args


def test_python_functions_are_dropped_unless_asked():
    path = real_traces() / "amd-tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
    df, _ = parse(path)
    assert df.filter(pl.col("kind") == "python").height == 0
    df2, _ = parse(path, keep_python=True)
    assert df2.filter(pl.col("kind") == "python").height == _scan_python(path)


def _scan_python(path) -> int:
    doc = orjson.loads(_content(path))
    return sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "python_function")
