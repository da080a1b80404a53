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
from tracelens.load import load, rank_from_name
from tracelens.schema import EVENT_SCHEMA, KINDS, SchemaError, conform, validate


def tiny(path, rank=None, n=3):
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(n)]}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 4}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "name,rank",
    [("rank-3.json", 3), ("rank3.json.gz", 3), ("trace_rank_12.pt.trace.json", 12), ("worker_5.json", 5), ("trace.json", None)],
)
def test_rank_from_name(tmp_path, name, rank):
    assert rank_from_name(tmp_path / name) == rank


def test_rank_sources(tmp_path):
    tiny(tmp_path / "a.json", rank=2)
    tiny(tmp_path / "rank-1.json")
    tiny(tmp_path / "z.json")
    t = load([tmp_path], use_cache=False)
    got = {m.path.rsplit("/", 1)[1]: (m.rank, m.rank_source) for m in t.metas}
    # distributedInfo first, then the file name; the rest take the lowest free rank in file order
    assert got == {"a.json": (2, "distributedInfo"), "rank-1.json": (1, "filename"), "z.json": (0, "order")}
    assert sorted(t.events.get_column("rank").unique().to_list()) == [0, 1, 2]
    assert any("file order" in w for w in t.all_warnings)


def test_duplicate_ranks_are_kept(tmp_path):
    tiny(tmp_path / "x.json", rank=0, n=3)
    tiny(tmp_path / "y.json", rank=0, n=5)
    t = load([tmp_path], use_cache=False)
    assert t.events.height == 8
    assert dict(t.events.group_by("file").len().sort("file").iter_rows()) == {0: 3, 1: 5}
    assert any("rank 0 is claimed by 2 files" in w for w in t.warnings)


def test_parallel_equals_sequential():
    d = real_traces() / "hta/trace_filter"
    seq = load([d], use_cache=False, jobs=1)
    par = load([d], use_cache=False, jobs=2)
    assert par.events.equals(seq.events)
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
    assert second.events.equals(first.events)
    assert second.metas[0].to_dict() == first.metas[0].to_dict()
    # the key is the content: the same bytes under another name hit too
    g = tmp_path / "copy.json.gz"
    shutil.copy(f, g)
    assert load([g]).metas[0].path == str(g)
    monkeypatch.undo()
    # --no-cache parses again
    assert load([f], use_cache=False).events.equals(first.events)


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
        "for m in ('tracelens.analysis', 'tracelens.report', 'tracelens.views', 'tracelens.timeline', 'tracelens.suggest',\n"
        "          'tracelens.waterfall', 'tracelens.kernels', 'tracelens.comm', 'tracelens.parsers.kineto'):\n"
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
    assert [len(n["gpus"]) for n in out["nsys"]] == [1, 0] and out["files"] == []
    g = out["nsys"][0]["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["gpu_model"] == "NVIDIA H200 SXM" and g["peak_flops"]["bf16"] == 989.4e12
    text = run("info", nsys / "pipit_saxpy-mpi-cuda_nsys2022.2.1_perlmutter0.sqlite").stdout
    assert "NVIDIA A100-SXM4-40GB, 108 SMs" in text and "-> NVIDIA A100 40GB: 312 TFLOP/s dense" in text
