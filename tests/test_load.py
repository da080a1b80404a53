"""The loader: ranks, duplicates, parallel parsing, the Parquet cache, and the CLI around it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import polars as pl
import pytest
from tracelens.parsers import kineto as kineto_parser

from tests.conftest import ROOT, real_traces
from tracelens.model.schema import EVENT_SCHEMA, KINDS, SchemaError, conform, validate
from tracelens.store.job import load
from tracelens.store.ranks import rank_from_name


def tiny(path, rank=None, n=3):
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(n)]}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 4}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "name,rank",
    [("rank-3.json", 3), ("rank3.json.gz", 3), ("trace_rank_12.pt.trace.json", 12), ("worker_5.json", 5), ("trace.json", None),
     # explicit rank patterns, anywhere in the name, in any case
     ("RANK_7.json", 7), ("bs_32_rank0.json.gz", 0), ("sampled_rank-1.json.gz", 1),
     ("rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34),
     ("rank5.1623143089861.pt.trace.json", 5),
     # "_N" only where the rest of the stem is a profiler's own name for a trace
     ("trace_3.json", 3), ("kineto_trace_2.json.gz", 2), ("profile_11.pt.trace.json.gz", 11),
     ("worker_4.1623143089861.pt.trace.json", 4),
     # not ranks: a setting in the name, a pid (torch's <host>_<pid>.<ms>.pt.trace.json, Kineto's libkineto_activities_<pid>),
     # a local rank, a count of ranks, a word that ends in "rank", a model name with a number
     ("resnet50_num_workers_4.json.gz", None), ("gpu-node07_41230.1623143089861.pt.trace.json", None),
     ("myhost_4123.pt.trace.json", None), ("libkineto_activities_812.json", None), ("local_rank_1.json", None),
     ("localrank3.json", None), ("ranks_8.json", None), ("nranks8.json", None), ("frank2.json", None), ("bert_2.json", None),
     ("step_based_trace_2543932.json.gz", None), ("Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", None)],
)
def test_rank_from_name(tmp_path, name, rank):
    assert rank_from_name(tmp_path / name) == rank


def test_a_number_that_is_the_files_pid_is_not_a_rank(tmp_path):
    # trace_251.json could be rank 251 or a process id (dynolog/Kineto on-demand traces append the
    # pid to the name; containers give small pids): when the file's own events run in pid 251,
    # it is the pid.  An explicit rank pattern is believed whatever the pid.
    assert rank_from_name(tmp_path / "trace_251.json", pids={251}) is None
    assert rank_from_name(tmp_path / "trace_251.json", pids={7}) == 251
    assert rank_from_name(tmp_path / "rank_251.json", pids={251}) == 251
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 251, "tid": 251, "ts": 1, "dur": 1}]}
    (tmp_path / "trace_251.json").write_text(json.dumps(doc))
    (t,) = load([tmp_path / "trace_251.json"], use_cache=False).metas
    assert (t.rank, t.rank_source) == (0, "order")


def test_rank_sources(tmp_path):
    tiny(tmp_path / "a.json", rank=2)
    tiny(tmp_path / "rank-1.json")
    tiny(tmp_path / "z.json")
    t = load([tmp_path], use_cache=False)
    got = {m.path.rsplit("/", 1)[1]: (m.rank, m.rank_source) for m in t.metas}
    # distributedInfo first, then the file name; the rest take the lowest free rank in file order
    assert got == {"a.json": (2, "distributedInfo"), "rank-1.json": (1, "filename"), "z.json": (0, "order")}
    assert sorted(t.events().collect().get_column("rank").unique().to_list()) == [0, 1, 2]
    assert any("file order" in w for w in t.all_warnings)


def test_duplicate_ranks_are_kept(tmp_path):
    tiny(tmp_path / "x.json", rank=0, n=3)
    tiny(tmp_path / "y.json", rank=0, n=5)
    t = load([tmp_path], use_cache=False)
    assert t.events().collect().height == 8
    assert dict(t.events().collect().group_by("file").len().sort("file").iter_rows()) == {0: 3, 1: 5}
    assert any("rank 0 is claimed by 2 files" in w for w in t.warnings)


def test_parallel_equals_sequential():
    d = real_traces() / "hta/trace_filter"
    seq = load([d], use_cache=False, jobs=1)
    par = load([d], use_cache=False, jobs=2)
    assert par.events().collect().equals(seq.events().collect())
    assert [m.rank for m in par.metas] == [0, 1]


def test_cache_roundtrip_and_hits(tmp_path, monkeypatch, _isolated_cache):
    src = real_traces() / "hta/trace_filter/sampled_rank-0.json.gz"
    f = tmp_path / "r0.json.gz"
    shutil.copy(src, f)
    first = load([f])
    entries = sorted(p.name for p in _isolated_cache.glob("*.parquet"))
    assert len(entries) == 1 and not list(_isolated_cache.rglob("*.tmp"))

    def boom(*a, **k):
        raise AssertionError("parsed again instead of using the cache")

    monkeypatch.setattr(kineto_parser, "parse", boom)
    second = load([f])
    assert second.events().collect().equals(first.events().collect())
    assert second.metas[0].to_dict() == first.metas[0].to_dict()
    # the key is the content: the same bytes under another name hit too
    g = tmp_path / "copy.json.gz"
    shutil.copy(f, g)
    assert load([g]).metas[0].path == str(g)
    monkeypatch.undo()
    # --no-cache parses again
    assert load([f], use_cache=False).events().collect().equals(first.events().collect())


def test_validate_rejects_broken_frames():
    good = conform(pl.DataFrame({"ts_ns": [1], "dur_ns": [2], "kind": ["cpu_op"], "name": ["x"], "tid": [1], "rank": [0]}))
    validate(good)
    with pytest.raises(SchemaError, match="negative"):
        validate(good.with_columns(pl.lit(-1, pl.Int64).alias("dur_ns")))
    with pytest.raises(SchemaError, match="dtype"):
        validate(good.with_columns(pl.col("ts_ns").cast(pl.Float64)))
    with pytest.raises(SchemaError, match="columns"):
        validate(good.drop("args"))
    with pytest.raises(SchemaError, match="device"):
        validate(good.with_columns(pl.lit("kernel").cast(EVENT_SCHEMA["kind"]).alias("kind"), pl.lit("gemm").cast(pl.Categorical).alias("kclass")))


def run(*args):
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def test_cli_info_text_and_json():
    d = real_traces() / "hta/trace_filter"
    r = run("info", d)
    assert r.returncode == 0, r.stderr
    assert "rank        1/128 (from distributedInfo)" in r.stdout and "ProfilerStep#551" not in r.stderr
    j = run("info", "--json", d)
    info = json.loads(j.stdout)
    f0 = info["files"][0]
    assert list(f0["counts"]) == list(KINDS)
    assert f0["rank"] == 0 and f0["world_size"] == 128 and f0["steps"] == [551, 552]
    assert f0["events"] == sum(f0["counts"].values())
    assert f0["span"]["dur_ns"] > 0
    # without a terminal, the bare form prints the text report (with one, it opens the UI)
    bare = run(d)
    assert bare.returncode == 0 and bare.stdout == run("report", d).stdout and "GPU time, all ranks" in bare.stdout


def test_help_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from tracelens.cli import main\n"
        "rc = main(['--help'])\n"
        "heavy = [m for m in ('polars', 'textual', 'msgspec', 'torch') if m in sys.modules]\n"
        "print(rc, heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().splitlines()[-1] == "0 []"


def test_headless_never_imports_textual(tmp_path):
    """info, report (text and JSON) and every headless module leave Textual (and rich) unloaded;
    the same check sees it loaded once the UI package is imported (so it can fail)."""
    job = str(real_traces() / "hta/trace_filter")
    code = (
        "import sys, importlib\n"
        "from tracelens.cli import main\n"
        f"main(['info', '--json', {job!r}])\n"
        f"main(['report', {job!r}, '-o', {str(tmp_path / 'r.json')!r}])\n"
        f"main(['report', {job!r}, '-o', {str(tmp_path / 'r.txt')!r}])\n"
        "for m in ('tracelens.analysis', 'tracelens.render', 'tracelens.render.tables', 'tracelens.analysis.timeline', 'tracelens.analysis.suggest',\n"
        "          'tracelens.analysis.waterfall', 'tracelens.analysis.rank.kernels', 'tracelens.analysis.job.comm', 'tracelens.parsers.kineto'):\n"
        "    importlib.import_module(m)\n"
        "print('textual' in sys.modules, 'rich' in sys.modules, file=sys.stderr)\n"
        "import tracelens.tui.app\n"
        "print('textual' in sys.modules, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stderr.strip().splitlines()[-2:] == ["False False", "True"], r.stderr


def test_info_on_nsys_exports_identifies_their_gpus():
    """`tracelens info` on Nsight Systems exports: their GPUs from TARGET_INFO_GPU, matched to peaks."""
    nsys = real_traces() / "nsys"
    r = run("info", "--json", nsys / "nvfuser_test_matmul_h200_nsys2024.6.2.sqlite", nsys / "generated_nsys2022.4.2.1_cpu_nvtx_osrt_demo.sqlite")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [len(n["gpus"]) for n in out["nsys"]] == [1, 0] and [f["format"] for f in out["files"]] == ["nsys", "nsys"]
    g = out["nsys"][0]["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["gpu_model"] == "NVIDIA H200 SXM" and g["peak_flops"]["bf16"] == 989.4e12
    text = run("info", nsys / "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite").stdout
    assert "NVIDIA A100-SXM4-40GB, 108 SMs" in text and "-> NVIDIA A100 40GB: 312 TFLOP/s dense" in text


def _separate(t) -> list[str]:
    return [w for w in t.warnings if "separate runs" in w]


def test_two_single_gpu_runs_in_one_folder_are_not_a_job(tmp_path):
    # The TensorBoard plugin's two ResNet-50 runs (num_workers 0 and 4): one V100 each, no
    # distributedInfo, recorded on 2021-06-08 and 2021-06-09, 19.4 h apart.  Before: loaded as a
    # 2-rank job with no word about it.
    base = real_traces() / "kineto-tbplugin/samples"
    t = load([base / "resnet50_num_workers_0", base / "resnet50_num_workers_4"], use_cache=False)
    assert [m.rank for m in t.metas] == [0, 1]
    (w,) = _separate(t)
    assert "no file has distributedInfo" in w and "19.4 h apart" in w and "2021-06-08" in w and "2021-06-09" in w
    assert "different GPUs" not in w  # both are Tesla V100-DGXS-32GB
    assert t.separate_runs


def test_separate_runs_on_different_gpus_recorded_months_apart():
    # The H100 BERT inference trace (2025-07-18) and the MI210 GPU-only trace (2025-10): neither
    # has distributedInfo; different GPU models and times.
    a = real_traces() / "amd-tracelens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
    b = real_traces() / "amd-tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz"
    (w,) = _separate(load([a, b], use_cache=False))
    assert "different GPUs (NVIDIA H100 80GB HBM3, AMD Instinct MI210)" in w and "apart" in w


def test_ranks_of_one_job_are_not_called_separate_runs(tmp_path):
    # distributedInfo in the files: a job, whatever the rest
    assert not _separate(load([real_traces() / "hta/trace_filter"], use_cache=False))
    # no distributedInfo, one GPU model, recorded at the same time (epoch µs, overlapping): a job
    # traced without distributedInfo (on-demand tracing), not separate runs
    t0 = 1_700_000_000_000_000  # µs since the epoch, 2023-11-14
    for r in (0, 1):
        doc = {"deviceProperties": [{"id": r, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10 + r, "tid": 10 + r, "ts": t0 + 3 * r, "dur": 50},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": r, "tid": 7, "ts": t0 + 10 + r, "dur": 20,
             "args": {"device": r, "stream": 7}}]}
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(doc))
    t = load([tmp_path], use_cache=False)
    assert not _separate(t) and not t.separate_runs


def test_same_time_but_different_gpus_is_evidence_too(tmp_path):
    # Without distributedInfo, an H100 trace and an A100 trace recorded at the same moment: the
    # warning names the GPUs and nothing about the times (they overlap).
    t0 = 1_700_000_000_000_000
    for i, gpu in enumerate(("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")):
        doc = {"deviceProperties": [{"id": 0, "name": gpu}], "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t0 + i, "dur": 20,
             "args": {"device": 0, "stream": 7}}]}
        (tmp_path / f"run{i}.json").write_text(json.dumps(doc))
    (w,) = _separate(load([tmp_path], use_cache=False))
    assert "different GPUs (NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB)" in w and "apart" not in w


def test_one_file_with_distributed_info_does_not_make_a_job_of_another_run():
    # rank 0 of a 128-rank job (distributedInfo, recorded 2023-04-28) beside an nsys export of an
    # unrelated H200 run (2024-12-11, no rank): once believed one 2-rank job because one file
    # said it was a rank; now the times are evidence as without distributedInfo
    a = real_traces() / "hta/trace_filter/sampled_rank-0.json.gz"
    b = real_traces() / "nsys/nvfuser_test_matmul_h200_nsys2024.6.2.sqlite"
    (w,) = _separate(load([a, b], use_cache=False))
    assert "only 1 of them has distributedInfo" in w and "2023-04-28" in w and "2024-12-11" in w and "592.0 days apart" in w


def test_separate_runs_reach_the_report():
    base = real_traces() / "kineto-tbplugin/samples"
    from tracelens.analysis import analyze

    d = analyze(load([base / "resnet50_num_workers_0", base / "resnet50_num_workers_4"], use_cache=False)).to_dict()
    assert d["job"]["separate_runs"] is True
    assert any("separate runs" in w for w in d["warnings"])
    # separate runs share no clock: before, their step starts "aligned" them 19.4 h apart with a warning
    assert d["job"]["clock_alignment"] == "none" and [r["clock_offset_ns"] for r in d["ranks"]] == [0, 0]
    assert not any("clock differs" in w or "could not be aligned" in w for w in d["warnings"])
    one = analyze(load([base / "resnet50_num_workers_0"], use_cache=False)).to_dict()
    assert one["job"]["separate_runs"] is False


def test_odd_device_names_cost_nothing(tmp_path):
    # a hostile deviceProperties name (a number, a list) costs the name (a warning), not the file
    for i, name in enumerate((123, ["x", 1])):
        doc = {"deviceProperties": [{"id": 0, "name": name}], "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"device": 0, "stream": 7}}]}
        (tmp_path / f"run{i}.json").write_text(json.dumps(doc))
    t = load([tmp_path], use_cache=False)
    assert len(t.metas) == 2 and all(m.device_name is None for m in t.metas)
    assert sum("is not text" in w for w in t.all_warnings) == 2
