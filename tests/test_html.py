"""Headless post-mortems: the HTML report (self-contained, opened in a real headless Chromium),
the JSON Schema of the report on every shared trace, --load, --compare and the CI gates."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema  # a test dependency: missing, the suite fails instead of skipping
import orjson
import pytest

from tests.conftest import ROOT, SAMPLE_TRACES, holds_trace_events, real_trace_files, real_traces
from tracelens.analysis import analyze
from tracelens.model.errors import TraceInputError
from tracelens.render import render
from tracelens.render.compare import compare
from tracelens.render.html import EMBED_PLAIN_MAX, extract_report, render_html
from tracelens.store.job import load

SCHEMA = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())
H100 = SAMPLE_TRACES / "h100_bert_small"
JOB = SAMPLE_TRACES / "job_2ranks"


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def report_of(*paths) -> dict:
    return analyze(load([str(p) for p in paths])).to_dict()


def validate(d: dict) -> None:
    """Valid for jsonschema and for tracelens' own validator (what --load and --compare check)."""
    from tracelens.model.saved import validator

    jsonschema.Draft202012Validator(SCHEMA).validate(d)
    assert validator().first_error(d) is None, validator().first_error(d)


def test_schema_is_a_valid_schema_and_can_fail():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    d = report_of(H100)
    validate(d)
    bad = copy.deepcopy(d)
    bad["job"]["mfu"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    extra = copy.deepcopy(d)
    extra["ranks"][0]["surprise"] = 1  # an undocumented key is drift: the schema says so
    with pytest.raises(jsonschema.ValidationError):
        validate(extra)


@pytest.mark.parametrize("path", real_trace_files("hta", "amd-tracelens", "kineto-tbplugin"), ids=lambda p: p.name)
def test_report_of_every_shared_trace_validates(path):
    try:
        trace = load([path])
    except TraceInputError as e:  # an execution trace or a capture log among the real files: refused, and rightly
        assert "not a trace" in e.problem and not holds_trace_events(path)
        return
    d = analyze(trace).to_dict()
    validate(d)
    validate(orjson.loads(render(d, "json")))


def test_multi_rank_and_comparison_reports_validate():
    d = report_of(real_traces() / "hta/trace_filter")
    d["comparison"] = compare(report_of(H100), d)
    validate(d)


def embedded(html: str) -> dict:
    d = extract_report(html)
    assert d is not None, "no embedded report"
    return d


def test_html_is_self_contained_and_embeds_the_json_report():
    d = report_of(H100)
    html = render_html(d).decode()
    # no network at view time: nothing is fetched (no URL at all, no src/href to elsewhere)
    assert not re.search(r"https?://|//cdn|<link |src=", html), "the page references something outside itself"
    assert embedded(html) == orjson.loads(render(d, "json"))
    # readable without JavaScript: the headline and the waterfall are in the HTML itself
    assert f"{100 * d['job']['mfu']:.2f}%" in html
    fracs = [float(x) for x in re.findall(r'class="bar" data-key="[^"]+" data-fraction="([^"]+)"', html)]
    assert len(fracs) == len(d["job"]["waterfall"]) and abs(sum(fracs) - 1.0) < 1e-9
    assert len(html.encode()) < 1_000_000  # small enough to mail (this one: ~60 KB)


def test_html_escapes_names_from_the_trace():
    d = report_of(H100)
    d["ranks"][0]["kernels"][0]["name"] = "<script>alert(1)</script>"
    d["warnings"].append("</script><b>x</b>")
    html = render_html(d).decode()
    assert "<script>alert(1)" not in html and "</script><b>" not in html
    assert embedded(html)["warnings"][-1] == "</script><b>x</b>"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            raise RuntimeError("chromium is missing (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine")
    return CHROMIUM


def open_in_chromium(browser: str, html_path: Path, shot: Path) -> tuple[str, str]:
    """(DOM after the page's scripts ran, Chromium's log) and a screenshot; offline, no sandbox."""
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              "--virtual-time-budget=10000",  # let the page's promises (decompressing a large embedded report) settle
              "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", f"--user-data-dir={shot.parent / 'profile'}"]
    dom = subprocess.run(common + ["--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120)
    subprocess.run(common + [f"--screenshot={shot}", "--window-size=1280,2000", "--hide-scrollbars", html_path.as_uri()],
                   capture_output=True, text=True, timeout=120)
    return dom.stdout, dom.stderr


def big_report() -> dict:
    """A 48-rank report (the H100 rank repeated): its JSON is past EMBED_PLAIN_MAX."""
    d = report_of(H100)
    d["ranks"] = [{**copy.deepcopy(d["ranks"][0]), "rank": i, "file": i} for i in range(48)]
    d["job"]["ranks"] = 48
    assert len(orjson.dumps(d)) > EMBED_PLAIN_MAX
    return d


def test_large_reports_embed_compressed_json_that_round_trips(tmp_path):
    d = big_report()
    html = render_html(d).decode()
    assert "id='tracelens-report-gz'" in html and "id='tracelens-report'>" not in html
    assert extract_report(html) == orjson.loads(orjson.dumps(d))
    assert len(html.encode()) < len(orjson.dumps(d))  # the page is smaller than its JSON alone
    page = tmp_path / "big.html"
    page.write_text(html)
    # --load and --compare take an HTML report as well
    r = cli("report", "--load", page)
    assert r.returncode == 0 and "48 rank(s)" in r.stdout
    damaged = tmp_path / "damaged.html"
    damaged.write_text(html.replace("id='tracelens-report-gz'>H4sI", "id='tracelens-report-gz'>XXXX"))
    r = cli("report", "--load", damaged)
    assert r.returncode == 3 and "damaged" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("job", [H100, "hta/trace_filter", "hta/nccl_parser_config/nccl_data.json.gz", "big"],
                         ids=["single_gpu", "two_ranks", "no_shapes_gpu_time_waterfall", "48_ranks_compressed"])
def test_html_in_headless_chromium(chromium, tmp_path, job):
    out = tmp_path / "report.html"
    if job == "big":
        out.write_bytes(render_html(big_report()))
    else:
        path = job if isinstance(job, Path) else real_traces() / job
        r = cli("report", path, "-o", out)
        assert r.returncode == 0, r.stderr
    dom, log = open_in_chromium(chromium, out, tmp_path / "shot.png")
    body = re.search(r"<body([^>]*)>", dom)
    assert body, f"chromium rendered nothing: {log[-500:]}"
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("data-ready") == "1" and attrs.get("data-js-errors") == "0", log[-1000:]
    assert abs(float(attrs["data-waterfall-sum"]) - 1.0) < 1e-6  # the bars on the page sum to 100%
    assert int(attrs["data-ranks"]) == len(embedded(out.read_text())["ranks"])
    assert 'id="waterfall"' in dom and dom.count('class="bar"') >= 9
    console = [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console
    shot = tmp_path / "shot.png"
    assert shot.exists() and shot.stat().st_size > 20_000
    keep = os.environ.get("TRACELENS_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"report_{Path(str(job)).name}.png")


def test_load_rerenders_a_saved_report_without_traces(tmp_path):
    js = tmp_path / "job.json"
    assert cli("report", JOB, "-o", js).returncode == 0
    direct = cli("report", JOB)
    again = cli("report", "--load", js)
    assert again.returncode == 0 and again.stdout == direct.stdout
    h1, h2 = tmp_path / "a.html", tmp_path / "b.html"
    assert cli("report", JOB, "-o", h1).returncode == 0 and cli("report", "--load", js, "-o", h2).returncode == 0
    assert h1.read_bytes() == h2.read_bytes()
    assert oct(h2.stat().st_mode & 0o777) != "0o600"  # a report to share is not private to its writer
    # not a report: exit 3, one line naming the file, nothing written
    bad = tmp_path / "x.html"
    r = cli("report", "--load", SAMPLE_TRACES / "job_2ranks/rank-0.json.gz", "-o", bad)
    assert r.returncode == 3 and "rank-0.json.gz" in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not bad.exists()
    # paths and --load together, or neither: usage
    assert cli("report", JOB, "--load", js).returncode == 2 and cli("report").returncode == 2


def test_compare_same_run_changes_nothing():
    d = report_of(JOB)
    c = compare(d, d)
    assert c["step_time_ns"]["mean"]["delta"] == 0 and all(b["delta"] == 0 for b in c["waterfall"])
    assert all(k["delta_ns"] == 0 for k in c["kernels"])


def test_compare_with_a_run_without_gpu_activity_compares_no_bars():
    """A CPU-only trace (no GPU-time waterfall) against a GPU job: its bars were once taken as 0,
    every bar of the job 'moved' (compute 19% -> -, '-19 points, worse'); now no bar is compared
    and a warning says why; the step times are still compared."""
    from tests.conftest import real_traces

    cpu = report_of(real_traces() / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    gpu = report_of(JOB)
    assert not cpu["job"]["waterfall"] and gpu["job"]["waterfall"]
    for base, new, who in ((gpu, cpu, "new run"), (cpu, gpu, "baseline")):
        c = compare(base, new)
        assert c["waterfall"] == [] and c["step_time_ns"]["mean"]["delta"] is not None
        assert f"the {who} has no GPU-time waterfall (no GPU activity in its window): the waterfall bars are not compared" in c["warnings"]
        d = {**new, "comparison": c}
        validate(d)
        text = render(d, "text").decode()
        assert "waterfall bars (share of the window" not in text and "the waterfall bars are not compared" in text
        render(d, "html")


def test_compare_finds_the_kernel_that_changed():
    base = report_of(JOB)
    new = copy.deepcopy(base)
    # one kernel takes 4 ms more on every rank: per rank-step, 4 ms x 2 ranks / (2 ranks x 1 kept step) = +4 ms
    name = new["ranks"][0]["kernels"][3]["name"]
    for r in new["ranks"]:
        for k in r["kernels"]:
            if k["name"] == name:
                k["total_ns"] += 4_000_000
    ranks_with_it = sum(1 for r in new["ranks"] for k in r["kernels"] if k["name"] == name)
    for k in new["job"]["kernels"]:  # the job's table (every name, merged over the ranks) says the same
        if k["name"] == name:
            k["total_ns"] += 4_000_000 * ranks_with_it
    c = compare(base, new)
    top = c["kernels"][0]
    assert top["key"] == name and top["delta_ns"] == pytest.approx(4_000_000 * sum(
        1 for r in new["ranks"] for k in r["kernels"] if k["name"] == name) / c["new"]["rank_steps"])
    text = render({**new, "comparison": c}, "text").decode()
    assert "kernels that changed most" in text and name[:40] in text


def test_compare_runs_with_different_rank_counts(tmp_path):
    base_json = tmp_path / "base.json"
    assert cli("report", H100, "-o", base_json).returncode == 0
    out = tmp_path / "diff.html"
    r = cli("report", JOB, "--config", "none", "--compare", base_json, "-o", out)  # without its tracelens.toml: no GPU
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "What changed against the baseline" in html and "compare-waterfall" in html
    d = embedded(html)
    assert d["comparison"]["base"]["ranks"] == 1 and d["comparison"]["new"]["ranks"] == 2
    assert d["comparison"]["waterfall_kind"] == "time"  # the 2-rank job has no MFU: GPU-time bars are compared
    # traces as the baseline work too
    r = cli("report", JOB, "--compare", H100, "-o", tmp_path / "diff.json")
    assert r.returncode == 0 and json.loads((tmp_path / "diff.json").read_text())["comparison"]["base"]["ranks"] == 1


def test_gates(tmp_path):
    mfu = report_of(H100)["job"]["mfu"]  # 0.21% (a small inference trace)
    out = tmp_path / "r.json"
    r = cli("report", H100, "--fail-under-mfu", "0.35", "-o", out)
    assert r.returncode == 1 and out.exists()  # the report is written; the gate is a verdict on it
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"tracelens: gate failed: MFU {100 * mfu:.2f}% is under 35.00%"
    assert cli("report", H100, "--fail-under-mfu", "0.001", "-o", out).returncode == 0
    assert cli("report", H100, "--fail-over-step-ms", "1", "-o", out).returncode == 1
    assert cli("report", H100, "--fail-over-step-ms", "1000", "-o", out).returncode == 0
    # an unknown MFU cannot pass a gate that asks for it
    r = cli("report", JOB, "--config", "none", "--fail-under-mfu", "0.1", "-o", out)  # no GPU without its settings
    assert r.returncode == 1 and "MFU is unknown" in r.stderr.strip().splitlines()[-1]
    # a percentage given as 35 is a usage error, not a silent pass
    assert cli("report", H100, "--fail-under-mfu", "35").returncode == 2


@pytest.mark.parametrize("path", real_trace_files("hta", "amd-tracelens", "kineto-tbplugin"), ids=lambda p: p.name)
def test_html_and_text_render_every_shared_trace(path):
    """Every renderer on every shared trace (CPU-only, GPU-only, no shapes, unknown GPU, ...): a page
    with the embedded report, and a text summary."""
    try:
        d = analyze(load([path])).to_dict()
    except TraceInputError as e:
        assert "not a trace" in e.problem and not holds_trace_events(path)
        return
    html = render_html(d).decode()
    assert embedded(html) == orjson.loads(render(d, "json"))
    assert render(d, "text").decode().startswith("tracelens ")


def test_compare_does_not_invent_new_or_gone_kernels_beyond_the_top_n():
    """The report's job.kernels has every kernel name, so a comparison of two reports knows every
    change.  A report saved before job.kernels existed has only each rank's longest names: a kernel
    missing from it may only be below that cut, so its change is unknown ('outside_top'), not
    counted from 0 (the rank's kernels_total says the table was cut; without it, a table of the old
    cut's 30 rows counts as cut)."""
    base = report_of(JOB)
    assert all(len(r["kernels"]) == 30 < r["kernels_total"]["names"] for r in base["ranks"])  # 194 and 183 names
    assert all(k["status"] != "outside_top" for k in compare(base, copy.deepcopy(base), top=1000)["kernels"])
    renamed = copy.deepcopy(base)
    renamed["job"]["kernels"][-1]["name"] = "renamed_kernel"
    st = {k["key"]: k["status"] for k in compare(base, renamed, top=1000)["kernels"]}
    assert st["renamed_kernel"] == "new" and st[base["job"]["kernels"][-1]["name"]] == "gone"  # known: both runs are whole
    cut = copy.deepcopy(base)
    del cut["job"]["kernels"]  # as saved before job.kernels
    legacy = copy.deepcopy(cut)
    for r in legacy["ranks"]:
        del r["kernels_total"]
    for old in (cut, legacy):
        new = copy.deepcopy(old)
        for r in new["ranks"]:
            r["kernels"][-1]["name"] = "renamed_kernel"
        c = compare(old, new)
        status = {k["key"]: k["status"] for k in c["kernels"] + [x for x in compare(old, new, top=1000)["kernels"]]}
        assert status["renamed_kernel"] == "outside_top"
        assert status[old["ranks"][0]["kernels"][-1]["name"]] == "outside_top"
        assert all(k["delta_ns"] is None for k in c["kernels"] if k["status"] == "outside_top")
        assert "renamed_kernel" not in render({**new, "comparison": c}, "text").decode()
