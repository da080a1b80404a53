"""Hand-built tiny traces for exact arithmetic: each expected number is explained next to it."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracelens.parsers.kineto import _as_int, _int_col, decimal_us_to_ns, parse

from tracelens.model.kclass import classify
from tracelens.model.schema import validate


def write(tmp_path, doc, name="t.json", gz=False):
    data = json.dumps(doc).encode()
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def X(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_launch_links_and_units(tmp_path):
    # One op (External id 7) launches one kernel (correlation 42).  ts in µs floats:
    # 10.5 µs -> 10_500 ns; 0.0015 µs rounds to 2 ns.
    doc = {
        "distributedInfo": {"rank": 2, "world_size": 4, "backend": "nccl"},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "traceEvents": [
            X("cpu_op", "aten::mm", 10.5, 5.0, **{"External id": 7, "Input Dims": [[2, 3], [3, 4]]}),
            X("cuda_runtime", "cudaLaunchKernel", 11.0, 2.0, correlation=42, **{"External id": 7}),
            X("kernel", "sm90_xmma_gemm_bf16bf16", 20.0, 0.0015, pid=0, tid=7, device=0, stream=7, correlation=42, **{"External id": 7}),
        ],
    }
    df, meta = parse(write(tmp_path, doc))
    validate(df)
    assert meta.rank == 2 and meta.world_size == 4 and meta.device_name == "NVIDIA H100 80GB HBM3"
    rows = {r["kind"]: r for r in df.iter_rows(named=True)}
    assert rows["cpu_op"]["ts_ns"] == 10_500 and rows["cpu_op"]["dur_ns"] == 5_000
    k = rows["kernel"]
    assert (k["ts_ns"], k["dur_ns"], k["device"], k["stream"], k["pid"], k["tid"]) == (20_000, 2, 0, 7, None, None)
    assert k["correlation"] == rows["runtime"]["correlation"] == 42
    assert k["external_id"] == rows["cpu_op"]["external_id"] == 7
    assert k["kclass"] == "gemm"
    assert json.loads(rows["cpu_op"]["args"])["Input Dims"] == [[2, 3], [3, 4]]


def test_2021_schema_and_flows(tmp_path):
    # Capitalised categories, lower-case "external id", string tids; the kernel has no
    # correlation arg, so the ac2g-style flow (s at the launch, f at the kernel, id 5) gives it.
    doc = {
        "traceEvents": [
            X("Operator", "aten::relu", 100, 10, tid="1", **{"external id": 3}),
            X("Runtime", "cudaLaunchKernel", 101, 2, tid="1", **{"external id": 3}),
            {"ph": "s", "id": 5, "pid": 1, "tid": 1, "ts": 101, "cat": "async", "name": "launch"},
            {"ph": "X", "cat": "Kernel", "name": "void at::native::vectorized_elementwise_kernel<4>", "pid": 0, "tid": "stream 7", "ts": 120, "dur": 3},
            {"ph": "f", "id": 5, "pid": 0, "tid": "stream 7", "ts": 120, "cat": "async", "name": "launch", "bp": "e"},
        ]
    }
    df, meta = parse(write(tmp_path, doc))
    validate(df)
    assert meta.trace_schema == "2021"
    k = df.filter(pl.col("kind") == "kernel").row(0, named=True)
    r = df.filter(pl.col("kind") == "runtime").row(0, named=True)
    assert k["stream"] == 7 and k["device"] == 0 and k["kclass"] == "elementwise"
    assert k["correlation"] == r["correlation"] == 5
    assert r["tid"] == 1 and r["external_id"] == 3


def test_ids_above_int64_wrap_consistently(tmp_path):
    # 2**63 + 5 does not fit int64; it wraps to -(2**63) + 5 on both sides of the link.
    big = (1 << 63) + 5
    doc = {"traceEvents": [
        X("cuda_runtime", "cudaLaunchKernel", 1, 1, correlation=big),
        X("kernel", "ncclKernel_AllReduce", 2, 1, pid=0, tid=3, device=0, stream=3, correlation=big),
    ]}
    df, _ = parse(write(tmp_path, doc))
    assert set(df.get_column("correlation").to_list()) == {big - (1 << 64)}


def test_collective_args_and_bytes(tmp_path):
    # record_param_comms: all_gather of 1024 BFloat16 elements per rank into 8192 -> the
    # nccl-tests "size" is the larger buffer: 8192 x 2 bytes = 16384.  The kernel carries no
    # args; it gets them from the record on the launching thread.
    doc = {"traceEvents": [
        X("cpu_op", "record_param_comms", 10, 1, **{"Collective name": "_allgather_base", "dtype": "BFloat16",
          "In msg nelems": 1024, "Out msg nelems": 8192, "Group size": 8, "Process Group Name": "3",
          "Process Group Description": "tp"}),
        X("cuda_runtime", "cudaLaunchKernel", 12, 1, correlation=9),
        X("kernel", "ncclDevKernel_AllGather_RING_LL", 30, 10, pid=0, tid=20, device=0, stream=20, correlation=9),
    ]}
    df, meta = parse(write(tmp_path, doc))
    validate(df)
    host = df.filter(pl.col("kind") == "collective").row(0, named=True)
    k = df.filter(pl.col("kind") == "kernel").row(0, named=True)
    for row in (host, k):
        assert (row["collective"], row["group"], row["group_desc"], row["group_size"], row["bytes"], row["seq"]) == (
            "allgather", "3", "tp", 8, 16384, 0)
    assert k["kclass"] == "comm"


def test_sequence_numbers_from_the_trace_win(tmp_path):
    doc = {"traceEvents": [
        X("cpu_op", "record_param_comms", 10 * i, 1, **{"Collective name": "allreduce", "Process Group Name": "0", "Seq": 40 + i})
        for i in range(3)
    ]}
    df, meta = parse(write(tmp_path, doc))
    assert df.get_column("seq").to_list() == [40, 41, 42]
    assert meta.attributes["seq_source"] == "trace"


def test_steps_dataloader_sync_kinds(tmp_path):
    doc = {"traceEvents": [
        X("user_annotation", "ProfilerStep#3", 0, 100),
        X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 1, 10),
        X("cuda_runtime", "cudaStreamSynchronize", 20, 5),
        X("cuda_runtime", "hipDeviceSynchronize", 30, 5),
        X("gpu_user_annotation", "ProfilerStep#3", 5, 90, pid=0, tid=7),
        X("python_function", "train.py(10): step", 0, 100),
    ]}
    df, _ = parse(write(tmp_path, doc))
    kinds = [(r["kind"], r["device"]) for r in df.sort("ts_ns", "name").iter_rows(named=True)]
    assert kinds == [("step", None), ("dataloader", None), ("annotation", 0), ("sync", None), ("sync", None)]


def test_bare_array_form_and_gzip(tmp_path):
    p = write(tmp_path, [X("cpu_op", "aten::add", 1, 1)], gz=True)
    df, meta = parse(p)
    assert df.height == 1 and meta.uncompressed_bytes > 0


def test_info_log_after_events_is_not_mistaken_for_the_end(tmp_path):
    # Kineto writes "INFO": ["...cpp:914] [Profiler = X] ..."] after traceEvents: its brackets
    # and its own closing ']' must not be taken for the end of the events.
    doc = {"traceEvents": [X("cpu_op", "a", 1, 1), X("cpu_op", "b", 2, 1)],
           "INFO": ["INFO:x.cpp:914] [Profiler = Y] z", "Traces Recorded: [1]"], "traceName": "t"}
    df, meta = parse(write(tmp_path, doc))
    assert df.get_column("name").cast(pl.String).to_list() == ["a", "b"]
    assert meta.attributes["traceName"] == "t"


def test_many_chunks_give_the_same_table(tmp_path, monkeypatch):
    import tracelens.parsers.kineto as k

    events = [X("cpu_op", f"op}}, {{{i}", i, 1, **{"nested": [{"a": "}, {"}, {"b": i}]}) for i in range(400)]
    p = write(tmp_path, {"traceEvents": events})
    whole, _ = parse(p)
    monkeypatch.setattr(k, "CHUNK_BYTES", 97)  # boundaries land inside strings and nested objects
    chunked, _ = parse(p)
    assert chunked.equals(whole) and whole.height == 400


@pytest.mark.parametrize(
    "text,ns",
    [("1712195495519689.047", 1712195495519689047), ("12", 12000), ("0.0004", 0), ("0.0005", 1),
     ("-3.25", -3250), ("7.", 7000), ("1e3", 1000000), ("null", None)],
)
def test_decimal_us_to_ns(text, ns):
    assert decimal_us_to_ns(pl.Series([text])).to_list() == [ns]


_US_TEXT = st.one_of(
    st.from_regex(r"-?[0-9]{1,20}\.[0-9]{3}", fullmatch=True),  # the fast path's shape, overflow included
    st.from_regex(r"[-+]?[0-9]{0,19}\.?[0-9]{0,5}(e-?[0-9])?", fullmatch=True),
    st.text(alphabet="0123456789.-+e \u0663", max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_US_TEXT | st.none(), min_size=1, max_size=20))
def test_decimal_us_to_ns_fast_path_agrees_with_the_arithmetic(texts):
    """The three-decimal fast path (dot removed, one cast) gives what the general arithmetic gives
    (``_decimal_us_to_ns``) on any text, rows that miss it included, in their places."""
    from parsers.kineto.decode import _decimal_us_to_ns

    s = pl.Series("ts", texts, dtype=pl.String)
    assert decimal_us_to_ns(s).to_list() == _decimal_us_to_ns(s).to_list()


@pytest.mark.parametrize(
    "name,cls",
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "comm"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("void deep_ep::intranode::dispatch<8>", "comm"),  # DeepEP: communication, not compute
        ("void ep::internode::combine<4>", "comm"),
        ("void vllm::cross_device_reduce_1stage<half, 8>", "comm"),
        ("flash::FlashAttnFwdSm90<cutlass::bfloat16_t>", "attention"),
        ("cutlass::device_kernel<flash::enable_sm90<flash::FlashAttnBwdPostprocessConvertdQ>>", "attention"),
        ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32", "conv"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "gemm"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm"),
        ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("void at::native::vectorized_layer_norm_kernel<float>", "norm"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4>", "softmax_reduce"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("triton_poi_fused_add_mul_0", "elementwise"),
        # "lambda" in a templated name is not the LAMB optimizer
        ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
         "c10::BFloat16, c10::BFloat16, c10::BFloat16, MulFunctor<float> > >(at::TensorIteratorBase&)::{lambda(int)#1}>", "elementwise"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", "copy"),
        ("Memcpy HtoD (Pageable -> Device)", "memcpy"),
        ("__amd_rocclr_fillBuffer", "memset"),
        ("some_unknown_kernel", "other"),
    ],
)
def test_kernel_classes(name, cls):
    assert classify(name) == cls


def test_args_with_invalid_utf8(tmp_path):
    # A string cut mid-character (bytes no JSON writer should emit, but traces carry them): the
    # events load, the bad byte reads as U+FFFD in the args text, the fields still read.
    good = X("cpu_op", "aten::mm", 1.0, 1.0, **{"External id": 1, "Input type": ["ok"]})
    bad = X("cpu_op", "aten::add", 3.0, 1.0, **{"External id": 2, "Input type": ["BADBYTE"]})
    raw = json.dumps({"traceEvents": [good, bad]}).encode().replace(b"BADBYTE", b"caf\xc3")
    p = tmp_path / "t.json"
    p.write_bytes(raw)
    df, meta = parse(p)
    df = df.sort("ts_ns")
    assert df.get_column("external_id").to_list() == [1, 2] and not meta.truncated
    args = df.get_column("args").to_list()
    assert json.loads(args[0])["Input type"] == ["ok"]
    assert json.loads(args[1])["Input type"] == ["caf\ufffd"]


def test_args_kept_are_those_an_analysis_reads(tmp_path):
    # A host op keeps the args keys FLOPs and the collective linking read (shapes, types, concrete
    # inputs, sequence number, process group), compact, in that order; a collective's record keeps
    # all of its args; GPU rows and runtime calls keep none (their fields are columns already).
    pretty = {"Call stack": "a.py(1): f;b.py(2): g", "Input Strides": [[4, 1], [4, 1]], "Sequence number": 12,
              "Input Dims": [[2, 4], [4, 3]], "Concrete Inputs": ["", ""], "Input type": ["float", "float"], "Ev Idx": 3}
    rec = {"Collective name": "allreduce", "Comms Id": 7, "Process Group Ranks": "[0, 1]", "In msg nelems": 8, "dtype": "Float"}
    doc = {"traceEvents": [
        X("cpu_op", "aten::mm", 1.0, 5.0, **{"External id": 1, **pretty}),
        X("user_annotation", "nccl:all_reduce", 7.0, 1.0, **{"Input Dims": [[8]], "Input type": ["float"], "note": "x"}),
        X("cpu_op", "record_param_comms", 6.0, 3.0, **rec),
        X("cuda_runtime", "cudaLaunchKernel", 2.0, 1.0, correlation=9, **{"External id": 1}),
        X("kernel", "gemm", 10.0, 1.0, pid=0, tid=7, device=0, stream=7, correlation=9, grid=[1, 1, 1]),
        X("gpu_user_annotation", "g", 10.0, 1.0, pid=0, tid=7, device=0, stream=7, note="y"),
        X("cpu_op", "aten::empty", 8.0, 1.0, **{"External id": 2, "Record function id": 0}),
    ]}
    # written pretty-printed, as some profilers do: the kept text has no whitespace between tokens
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc, indent=4))
    df, _ = parse(p)
    args = dict(df.select(pl.col("name").cast(pl.String), "args").iter_rows())
    assert args["aten::mm"] == ('{"Input Dims":[[2,4],[4,3]],"Input type":["float","float"],'
                                '"Concrete Inputs":["",""],"Sequence number":12}')
    assert args["nccl:all_reduce"] == '{"Input Dims":[[8]],"Input type":["float"]}'
    assert json.loads(args["record_param_comms"]) == rec  # every key, as recorded
    assert args["aten::empty"] == "{}"
    assert args["cudaLaunchKernel"] is None and args["gemm"] is None and args["g"] is None


_ID = st.one_of(  # what msgspec hands over for an id field (it rejects booleans there)
    st.none(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.sampled_from([10**19, 1e19, 1.0, 2.5, -7.0, float(1 << 63)]),  # equal to some ints as dict keys
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["25738", "stream 7", "Spans", "-3", " 12 ", ""]),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ID, max_size=40))
def test_id_columns_convert_value_by_value(values):
    """An id column (pid, tid, stream, External id, ...) holds each value's own conversion,
    whatever else the column holds: the fast paths (one Int64 pass; one conversion per distinct
    value when ids come as text) must agree with converting every value on its own."""
    assert _int_col(values).to_list() == [_as_int(v) for v in values]
