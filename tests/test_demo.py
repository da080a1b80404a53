"""The first ten minutes of a new user: ``tracelens demo`` (the TUI or, without a terminal, the
text report and an HTML page) on the bundled two-rank A100 job, whose GPU is named in its
``tracelens.toml``; and job settings files in general (found, checked, overridden, shown)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.conftest import ROOT, SAMPLE_TRACES
from tests.test_html import cli, embedded
from tracelens import demo
from tracelens.analysis import Options, analyze
from tracelens.cli import main
from tracelens.store.job import load

JOB = SAMPLE_TRACES / "job_2ranks"
A100_BF16_DENSE = 312e12  # MFU.md's peak table: A100 SXM/PCIe, bf16 dense


def test_the_demo_job_has_a_real_mfu_from_its_settings_file():
    d = analyze(load([str(JOB)]), demo.options(str(JOB))).to_dict()
    job = d["job"]
    assert job["ranks"] == 2 and job["mfu"] is not None
    # MFU by its definition, from the report's own parts: model FLOPs / (peak x window), all ranks
    flops = sum(r["mfu"]["model_flops"] for r in d["ranks"])
    seconds = sum(r["window_ns"] for r in d["ranks"]) / 1e9
    assert job["mfu"] == pytest.approx(flops / (A100_BF16_DENSE * seconds), rel=1e-12)
    for r in d["ranks"]:
        assert r["mfu"]["flops_source"] == "shapes"  # counted from the recorded shapes, not given
        assert r["mfu"]["gpu_model"] == "NVIDIA A100" and r["mfu"]["gpu_source"].endswith("job_2ranks/tracelens.toml")
    # the same numbers as --gpu A100 on the command line, which only the source tells apart
    flag = analyze(load([str(JOB)]), Options(gpu="A100", given=(("gpu", "--gpu"),))).to_dict()
    assert flag["job"]["mfu"] == job["mfu"] and flag["job"]["waterfall"] == job["waterfall"]
    assert flag["ranks"][0]["mfu"]["gpu_source"] == "--gpu"
    # a full waterfall: several non-zero loss bars, summing with the MFU bar to 1; suggestions
    losses = [b for b in job["waterfall"] if b["key"] != "mfu" and b["fraction"] > 0.005]
    assert len(losses) >= 5
    assert sum(b["fraction"] for b in job["waterfall"]) == pytest.approx(1.0, abs=1e-9)
    assert len(d["suggestions"]) >= 3


def test_demo_without_a_terminal_prints_the_report_and_writes_the_html(tmp_path, capsys):
    out = tmp_path / "demo.html"
    assert main(["demo", "-o", str(out)]) == 0  # pytest's stdin is no terminal
    text = capsys.readouterr().out
    page = embedded(out.read_text(encoding="utf-8"))
    assert text.startswith("tracelens ") and "MFU loss waterfall" in text and "suggestions" in text
    assert f"MFU: {100 * page['job']['mfu']:.2f}% of NVIDIA A100 dense peak" in text
    assert "GPU given in " in text and "tracelens.toml" in text
    assert "NVIDIA A100 (given)" in text  # the rank table does not pass the GPU off as read from the trace
    assert str(out) in text  # it says where the page is
    html = out.read_text(encoding="utf-8")
    assert "GPU given in " in html


def test_demo_tui_first_screen_shows_mfu_waterfall_and_suggestions():
    from tests.test_tui import settle, snapshot
    from tracelens.tui import make_app
    from tracelens.tui.widgets.waterfall import WaterfallChart

    job = "sample_traces/job_2ranks"

    async def go():
        import os

        cwd = os.getcwd()
        os.chdir(ROOT)  # the path on screen is the one a user in the checkout would type
        try:
            app = make_app([job], options=demo.options(job))
            app.animation_level = "none"
            async with app.run_test(size=(120, 40)) as pilot:
                await settle(app, pilot)
                assert app.error is None
                mfu = app.report["job"]["mfu"]
                headline = str(app.query_one("#headline").render())
                assert f"MFU {100 * mfu:.2f}%" in headline and "GPU given in sample_traces/job_2ranks/tracelens.toml" in headline
                assert "NVIDIA A100 (given)" in headline
                bars = app.query_one(WaterfallChart).bars
                assert bars == app.report["job"]["waterfall"] and bars[-1]["key"] == "mfu"
                assert str(app.query_one("#top-suggestions").render()).strip()
                snapshot(app, "overview_demo")
        finally:
            os.chdir(cwd)

    asyncio.run(go())


def test_settings_file_found_beside_files_and_overridden_by_flags(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json.gz").write_bytes((JOB / f"rank-{r}.json.gz").read_bytes())
    (tmp_path / "tracelens.toml").write_text('gpu = "H100 SXM"\n')
    r = cli("report", tmp_path / "rank-0.json.gz", tmp_path / "rank-1.json.gz", "-o", tmp_path / "a.json")
    assert r.returncode == 0, r.stderr
    a = orjson.loads((tmp_path / "a.json").read_bytes())
    assert a["ranks"][0]["mfu"]["gpu_model"] == "NVIDIA H100 SXM"
    assert a["ranks"][0]["mfu"]["gpu_source"] == str(tmp_path / "tracelens.toml")
    r = cli("report", tmp_path, "--gpu", "A100", "-o", tmp_path / "b.json")  # the flag wins
    b = orjson.loads((tmp_path / "b.json").read_bytes())
    assert b["ranks"][0]["mfu"]["gpu_model"] == "NVIDIA A100" and b["ranks"][0]["mfu"]["gpu_source"] == "--gpu"
    r = cli("report", tmp_path, "--config", "none", "-o", tmp_path / "c.json")
    c = orjson.loads((tmp_path / "c.json").read_bytes())
    assert c["job"]["mfu"] is None and c["ranks"][0]["mfu"]["gpu_source"] is None


@pytest.mark.parametrize(
    "content, expect",
    [
        ('gpu = 3\n', "job setting 'gpu' must be str"),
        ('gpu = "A100"\nnum_gpus = 8\n', "unknown job setting 'num_gpus'"),
        ('gpu = "A100\n', "not valid TOML"),
        ("peak_tflops = -5\n", "must be positive"),
        ("peak_tflops = nan\n", "must be positive"),
        ("peak_tflops = inf\n", "must be positive"),
        ("layers = true\n", "must be int"),
        ('gpu = "  "\n', "is empty"),
        (b"gpu = \"\xff\"\n", "not UTF-8"),
        ("# " + "x" * 70_000 + "\n", "larger than 64 KB"),
    ],
)
def test_bad_settings_file_is_one_line_naming_it_and_writes_nothing(tmp_path, content, expect):
    cfg = tmp_path / "tracelens.toml"
    cfg.write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "rank-0.json.gz").write_bytes((JOB / "rank-0.json.gz").read_bytes())
    out = tmp_path / "r.json"
    r = cli("report", tmp_path, "-o", out)
    assert r.returncode == 2  # a usage error, like the flag of the same name and not out.exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tracelens: error: {cfg}: ") and expect in lines[0], r.stderr


def test_a_gpu_the_peak_table_lacks_is_a_warning_naming_the_settings_file(tmp_path):
    (tmp_path / "rank-0.json.gz").write_bytes((JOB / "rank-0.json.gz").read_bytes())
    (tmp_path / "tracelens.toml").write_text('gpu = "Z9000"\n')
    r = cli("report", tmp_path, "-o", tmp_path / "r.json")
    assert r.returncode == 0
    d = orjson.loads((tmp_path / "r.json").read_bytes())
    assert d["job"]["mfu"] is None
    assert any(f"gpu in {tmp_path / 'tracelens.toml'} 'Z9000' is not in tracelens' peak table" in w for w in d["warnings"])
