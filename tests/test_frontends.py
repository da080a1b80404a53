"""Every front end shows the same numbers and the warnings (issue 13, item 10): the GPU-time
waterfall in the JSON, text and HTML when the FLOPs are unknown, what an unknown MFU lacks, a
GPU named as itself, one waterfall layout for every renderer, proportional bar glyphs, whole
kernel tables, --compare across GPUs and without "-0.00%" changes, and no control character or
markup from a trace reaching a terminal or a page unescaped."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from html import unescape

import jsonschema
import orjson
import polars as pl
import pytest

from tests.conftest import ROOT, SAMPLE_TRACES, real_traces
from tracelens.analysis import Options, analyze
from tracelens.model import gpus
from tracelens.render import render, render_text
from tracelens.render import tables as views
from tracelens.render.compare import compare
from tracelens.render.html import render_html
from tracelens.store.job import load

SCHEMA = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())
JOB = SAMPLE_TRACES / "job_2ranks"
H100 = SAMPLE_TRACES / "h100_bert_small"


def deepseek_style(path, name="NVIDIA H800"):
    """One rank like DeepSeek's published traces: an H800, no record_shapes (so no FLOPs), GEMM,
    NCCL and a copy.  One step, CPU [0, 1000) µs; kernels launched at 10, 20, 30, 40 µs:

        GEMM         stream 7   [100, 500)
        all-reduce   stream 20  [400, 700)   overlaps the GEMM in [400, 500): exposed [500, 700) = 200
        elementwise  stream 7   [700, 800)
        memcpy DtoH  stream 7   [850, 900)   exposed 50

    The window runs from the first kernel (100) to the end of the last traced work, the copy at
    900 (the step's CPU span runs on to 1000 with nothing traced: that 100 µs is the untraced
    tail, outside the window): T = 800 µs.  compute = 400 + 100 = 500 (matmul 400, elementwise
    100); idle = 800 - 500 - 200 - 50 = 50: the gap [800, 850) ends at the copy, launched long
    before: launch latency 50."""
    def launch(ts, corr, nm="cudaLaunchKernel"):
        return {"ph": "X", "cat": "cuda_runtime", "name": nm, "pid": 1, "tid": 1, "ts": ts, "dur": 2, "args": {"correlation": corr}}

    def gpu(cat, nm, ts, dur, corr, stream):
        return {"ph": "X", "cat": cat, "name": nm, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "device": 0, "stream": stream}}

    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        launch(10, 1), gpu("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 100, 400, 1, 7),
        launch(20, 2), gpu("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 400, 300, 2, 20),
        launch(30, 3), gpu("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 700, 100, 3, 7),
        launch(40, 4, "cudaMemcpyAsync"), gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 850, 50, 4, 7),
    ]
    path.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": name, "numSms": 132}], "traceEvents": ev}))
    return path


US = 1000
T = 800 * US
EXPECTED_TIME_BARS = {  # key -> ns, in the waterfall's order
    "idle_data_loading": 0, "idle_host_launch": 0, "idle_sync": 0, "idle_launch_latency": 50 * US, "idle_other": 0,
    "pipeline_bubble": 0, "exposed_comm": 200 * US, "exposed_memcpy": 50 * US, "compute": 500 * US,
}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture
def no_flops(tmp_path):
    return deepseek_style(tmp_path / "rank-0.json")


def report_of(*paths, **opts) -> dict:
    return analyze(load([str(p) for p in paths], use_cache=False), Options(**opts)).to_dict()


def html_bars(html: str) -> list[tuple[str, float]]:
    return [(k, float(f)) for k, f in re.findall(r'class="bar" data-key="([^"]+)" data-fraction="([^"]+)"', html)]


# -- the GPU-time waterfall when the FLOPs are unknown -------------------------------------------

def test_json_text_and_html_carry_the_gpu_time_waterfall_when_flops_are_unknown(no_flops, tmp_path):
    d = report_of(no_flops)
    jsonschema.Draft202012Validator(SCHEMA).validate(d)
    assert d["job"]["mfu"] is None and d["ranks"][0]["mfu"]["value"] is None
    for where in (d["job"], d["ranks"][0], d["ranks"][0]["steps"][0]):
        bars = where["waterfall"]
        assert [(b["key"], b["ns"]) for b in bars] == list(EXPECTED_TIME_BARS.items())
        assert all(b["fraction"] == b["ns"] / T for b in bars)
        assert abs(sum(b["fraction"] for b in bars) - 1.0) < 1e-12
    assert d["job"]["waterfall_kind"] == "gpu_time"
    compute = d["job"]["waterfall"][-1]
    assert compute["label"] == "compute (FLOP efficiency unknown)"
    assert {p["key"]: p["ns"] for p in compute["parts"]} == {"matmul": 400 * US, "elementwise": 100 * US}
    assert sum(p["ns"] for p in d["job"]["waterfall"][6]["parts"]) == 200 * US  # exposed comm, by group
    # the text shows every bar with the JSON's share, in the JSON's order
    text = render_text(d)
    assert "GPU-time waterfall of the job (MFU unknown): it ends at the compute share, FLOP efficiency unknown:" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("  ") and ln.rstrip().endswith("%")]
    shown = {b["label"]: f"{100 * b['fraction']:.2f}%" for b in d["job"]["waterfall"]}
    wf_rows = [r for r in rows if r.strip().split("  ")[0] in shown]
    assert [r.strip().split("  ")[0] for r in wf_rows] == list(shown)
    assert all(r.rstrip().endswith(shown[r.strip().split("  ")[0]]) for r in wf_rows)
    # the HTML draws the same bars, with the same fractions
    html = render_html(d).decode()
    assert html_bars(html) == [(b["key"], b["fraction"]) for b in d["job"]["waterfall"]]
    assert 'data-kind="time"' in html
    # the gate still fails on the unknown MFU, waterfall or not
    r = cli("report", no_flops, "--no-cache", "--fail-under-mfu", "0.1", "-o", tmp_path / "r.json")
    assert r.returncode == 1 and "MFU is unknown" in r.stderr.splitlines()[-1]


def test_the_gpu_time_waterfall_of_a_real_trace_without_shapes_partitions_its_gpu_time():
    """HTA's A100 CNN DDP trace (NCCL all-reduces) was recorded without shapes: the GPU is known,
    the FLOPs are not.  Its JSON waterfall was empty and the TUI said "press G to set the GPU";
    now the waterfall is the GPU time's, every bar the report's own partition, and the hint asks
    for the FLOPs."""
    d = report_of(real_traces() / "hta/nccl_parser_config/nccl_data.json.gz")
    assert d["job"]["mfu"] is None and d["job"]["waterfall_kind"] == "gpu_time"
    h = views.headline(d)
    assert h["missing"] == ["flops"] and "shapes were not recorded" in h["why_unknown"] and "NVIDIA A100" in h["why_unknown"]
    assert "press F" in h["hint"] and "press G" not in h["hint"]
    r = d["ranks"][0]
    bars = {b["key"]: b["ns"] for b in r["waterfall"]}
    g, idle = r["gpu_time_ns"], r["idle_ns"]
    assert bars["compute"] == g["compute"] and bars["exposed_comm"] == g["exposed_comm"]
    assert bars["exposed_memcpy"] == g["exposed_memcpy"] and bars["pipeline_bubble"] == idle["pipeline_bubble"]
    assert sum(bars.values()) == r["window_ns"] == sum(g[k] for k in ("idle", "compute", "exposed_comm", "exposed_memcpy"))
    for b in r["waterfall"]:
        if b["parts"]:
            assert sum(p["ns"] for p in b["parts"]) == b["ns"]


# -- what an unknown MFU lacks, and the GPU named as itself ---------------------------------------

def test_unknown_mfu_names_what_is_missing(no_flops, tmp_path):
    d = report_of(no_flops)
    h = views.headline(d)
    # the GPU is known (an H800, with the H100 SXM's peaks): only the FLOPs are missing
    assert h["missing"] == ["flops"]
    assert "model FLOPs are missing" in h["why_unknown"] and "shapes were not recorded" in h["why_unknown"]
    assert "the GPU is known (NVIDIA H800, 989 TFLOP/s)" in h["why_unknown"]
    assert "press F" in h["hint"] and "press G" not in h["hint"]
    assert render_text(d).splitlines()[1].startswith(h["why_unknown"])
    assert re.sub(r"\s+", " ", h["why_unknown"].removeprefix("MFU unknown: ")) in unescape(render_html(d).decode())
    # an unknown GPU with countable shapes: only the peak is missing
    other = report_of(deepseek_style(tmp_path / "other.json", name="Quadro GP100"), model_flops_per_step=1e12)
    ho = views.headline(other)
    assert ho["missing"] == ["gpu"] and "Quadro GP100" in ho["why_unknown"] and "press G" in ho["hint"] and "press F" not in ho["hint"]
    # a CPU-only trace (real, from HTA's tests): no GPU time at all, and neither key would help
    cpu = report_of(real_traces() / "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    hc = views.headline(cpu)
    assert hc["missing"] == ["gpu_time"] and "no GPU activity" in hc["why_unknown"] and hc["hint"] == ""
    assert cpu["job"]["waterfall"] == [] and render_text(cpu).splitlines()[1].startswith(hc["why_unknown"])
    # given the FLOPs, the MFU is known (1e11 in the 800 µs window: 12.6%; 1e12 would be 126%, a usage error)
    given = report_of(no_flops, model_flops_per_step=1e11)
    assert given["job"]["mfu"] == pytest.approx(1e11 / (989.4e12 * T / 1e9)) and views.headline(given)["why_unknown"] is None
    assert given["job"]["waterfall_kind"] == "mfu" and given["job"]["waterfall"][-1]["key"] == "mfu"


@pytest.mark.parametrize("name,model,sibling", [
    ("NVIDIA H800", "NVIDIA H800", "NVIDIA H100 SXM"),
    ("NVIDIA H800 PCIe", "NVIDIA H800 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA A800-SXM4-80GB", "NVIDIA A800", "NVIDIA A100"),
    ("NVIDIA A800 40GB PCIe", "NVIDIA A800 40GB", "NVIDIA A100 40GB"),
])
def test_a_known_gpu_is_named_as_itself_with_its_siblings_peaks(name, model, sibling):
    spec, sib = gpus.lookup(name), gpus.lookup(sibling)
    assert spec.name == model and spec.peak_tflops == sib.peak_tflops and spec.mem_tbps == sib.mem_tbps
    assert any(sibling in n for n in spec.notes)
    # a MIG slice of one keeps both notes
    half = spec.sms // 2
    mig, _ = gpus.identify({"numSms": half}, name)
    assert mig.name == model and len(mig.notes) == 2 and mig.peak("bf16") == pytest.approx(spec.peak("bf16") * half / spec.sms)


def test_the_report_names_the_h800_and_says_whose_peaks(no_flops):
    d = report_of(no_flops, model_flops_per_step=1e11)
    m = d["ranks"][0]["mfu"]
    assert m["gpu_model"] == "NVIDIA H800" and m["peak_flops"] == pytest.approx(989.4e12)
    assert m["gpu_notes"] == ["peaks of the NVIDIA H100 SXM, the same chip"]
    line = render_text(d).splitlines()[1]
    assert line.startswith("MFU: ") and "of NVIDIA H800 dense peak (989 TFLOP/s; peaks of the NVIDIA H100 SXM" in line
    assert views.mfu_text(views.headline(d)) in unescape(render_html(d).decode())


# -- one waterfall layout, proportional glyphs ----------------------------------------------------

def layout_rows(bars) -> list[tuple[str, str, str]]:
    """(bar | part, label, share) of every row views.waterfall_layout gives, in order."""
    out = []
    for r in views.waterfall_layout(bars):
        out.append(("bar", r["label"], f"{100 * r['fraction']:.2f}%"))
        out += [("part", p["label"], f"{100 * p['fraction']:.2f}%") for p in r["parts"]]
    return [(k, lb, "0.00%" if pct == "-0.00%" else pct) for k, lb, pct in out]


def test_text_tui_and_html_show_the_same_bars_and_parts_in_the_same_order():
    """The two-rank sample job with an A100 (an MFU waterfall whose bars have up to 14 parts):
    the text report and the HTML page draw exactly views.waterfall_layout's rows (the TUI's
    chart draws them too: tests/test_tui.py)."""
    d = report_of(JOB, gpu="A100")
    bars, kind = views.waterfall(d)
    assert kind == "mfu"
    want = layout_rows(bars)
    assert any(len(b["parts"]) > views.PARTS_SHOWN + 1 for b in bars)  # some bar's parts are summed in one row
    for r, b in zip(views.waterfall_layout(bars), bars):  # the sub-rows of a bar sum to the bar
        assert len(r["parts"]) <= views.PARTS_SHOWN + 1
        if b["parts"]:
            assert sum(p["ns"] for p in r["parts"]) == b["ns"]
    # HTML: label and share of each row, in order
    html = unescape(render_html(d).decode())
    wf = html[html.index('id="waterfall"'):]
    wf = wf[:wf.index("<h2")]
    got = [("part" if cls == "part" else "bar", label, pct) for cls, label, pct in
           re.findall(r'<div class="label ?(part|final|)">([^<]*)</div><div class="track">.*?<div class="num[^"]*">([^<]*)</div>', wf, re.S)]
    assert got == [(k, lb[:70] if k == "part" else lb, pct) for k, lb, pct in want]
    # text: the same rows, labels cut to the column
    text = render_text(d)
    block = text[text.index("MFU loss waterfall of the job"):].split("\n\n")[0].splitlines()[1:]
    notes = [ln.strip() for ln in block if ln.startswith("      (")]  # a bar's one-line note, under its parts
    assert notes == [f"({b['note']})" for b in bars if b.get("note")] and notes
    block = [ln for ln in block if not ln.startswith("      (")]
    got = [("part", ln[6:40].rstrip(), ln.split()[-1]) if ln.startswith("      ") else ("bar", ln[2:40].rstrip(), ln.split()[-1])
           for ln in block]
    assert got == [(k, lb[:34 if k == "part" else 38].rstrip(), pct) for k, lb, pct in want]


def drawn_eighths(glyphs: str) -> int:
    """How many eighths of a cell a bar's glyphs cover (█ and ░ a whole cell, ▏..▉ 1..7)."""
    return sum(8 if ch in "█░" else " ▏▎▍▌▋▊▉".index(ch) for ch in glyphs)


@pytest.mark.parametrize("width", [10, 37, 40, 61, 120])
def test_bar_glyphs_are_proportional_wherever_the_bar_starts(width):
    """A bar's drawn length is its fraction in eighths of a cell (at least one): a 0.01% bar is
    never wider than a 0.36% one, whatever cell offsets they start at (before, a small bar that
    started late in a cell was drawn from the cell's start, up to a full cell wide)."""
    from tracelens.tui.widgets.waterfall import bar_text

    starts = [i / 997 for i in range(0, 997, 7)]
    small = [drawn_eighths(bar_text(s, 0.0001, width, "red").plain.lstrip(" ")) for s in starts]
    large = [drawn_eighths(bar_text(s, 0.0036, width, "red").plain.lstrip(" ")) for s in starts]
    assert max(small) <= min(large)
    fracs = [0.0001, 0.0036, 0.01, 0.05, 0.2, 0.5]
    for s in starts:
        sizes = [drawn_eighths(views.bar_cells(s, f, width)[1]) for f in fracs if s + f <= 1]
        assert sizes == sorted(sizes) and all(x >= 1 for x in sizes)
        lead, glyphs = views.bar_cells(s, 0.2, width)
        assert lead + len(glyphs) <= width
    # the text report draws the same glyphs
    from tracelens.render import waterfall_text

    bars = [{"key": "a", "label": "a", "ns": 1, "fraction": 0.9999 - 0.0036, "parts": []},
            {"key": "b", "label": "b", "ns": 1, "fraction": 0.0036, "parts": []},
            {"key": "mfu", "label": "MFU", "ns": 1, "fraction": 0.0001, "parts": []}]
    lines = waterfall_text(bars, width=40).splitlines()
    assert drawn_eighths(lines[2][41:81].strip()) <= drawn_eighths(lines[1][41:81].strip())


# -- kernel tables --------------------------------------------------------------------------------

def test_kernel_tables_hold_every_kernel_and_the_title_the_true_total():
    """The sample job has 194 and 183 kernel names on its two ranks (counted here from the events):
    the TUI and the HTML showed the two ranks' 30 longest merged (a silent cut, and an undercount of
    any kernel outside a rank's 30).  Now job.kernels holds every name with its exact totals, each
    rank's table says of how many names it keeps the longest 30, and the title gives the total."""
    trace = load([str(JOB)], use_cache=False)
    k = trace.events().collect().filter(pl.col("kind") == "kernel")
    per_rank = dict(k.group_by("file").agg(pl.col("name").n_unique()).iter_rows())
    d = analyze(trace).to_dict()
    jsonschema.Draft202012Validator(SCHEMA).validate(d)
    for r in d["ranks"]:
        assert len(r["kernels"]) == 30 < r["kernels_total"]["names"] == per_rank[r["file"]]
        assert r["kernels_total"]["launches"] == k.filter(pl.col("file") == r["file"]).height
    by_name = dict(k.group_by(pl.col("name").cast(pl.String)).agg(pl.col("dur_ns").sum()).iter_rows())
    rows = views.kernel_rows(d)
    assert {x["name"]: x["total_ns"] for x in rows} == by_name  # every name, its exact time over both ranks
    assert sum(x["count"] for x in rows) == k.height and len(rows) == len(d["job"]["kernels"])
    assert [x["total_ns"] for x in rows] == sorted((x["total_ns"] for x in rows), reverse=True)
    title = views.kernel_table_title(d)
    assert title == f"kernels by name, all ranks: {len(by_name):,} names, {k.height:,} launches"
    # a report saved before job.kernels: the ranks' cut tables, and the title says so
    old = copy.deepcopy(d)
    del old["job"]["kernels"]
    assert f"(the longest 60 of {per_rank[0] + per_rank[1]:,} names kept on 2 rank(s)" in views.kernel_table_title(old)
    assert views.matmul_table_title(d) == (f"matmul ops by shape: {len(views.matmul_rows(d))} rows over all ranks, the longest per "
                                           f"rank of {sum(r['matmul_efficiency_total'] for r in d['ranks']):,}")


# -- --compare ------------------------------------------------------------------------------------

def test_compare_warns_when_the_runs_are_on_different_gpus(no_flops, tmp_path):
    h100 = report_of(H100)
    h800 = report_of(no_flops)
    c = compare(h100, h800)
    assert c["warnings"] == ["the runs are on different GPUs (baseline: NVIDIA H100 SXM (989 TFLOP/s); now: NVIDIA H800 "
                             "(989 TFLOP/s)): step times and MFU compare different hardware"]
    assert c["waterfall_kind"] == "time"  # one side has no MFU: the GPU-time bars are compared
    assert all(b["key"] != "mfu" for b in c["waterfall"])
    text = render({**h800, "comparison": c}, "text").decode()
    assert "warning: the runs are on different GPUs" in text
    assert "the runs are on different GPUs" in unescape(render({**h800, "comparison": c}, "html").decode())
    assert compare(h100, copy.deepcopy(h100))["warnings"] == []
    # the same model read from the trace and given in a settings file: like for like
    a100 = report_of(JOB, gpu="A100")
    assert compare(a100, report_of(real_traces() / "hta/nccl_parser_config/nccl_data.json.gz"))["warnings"] == []
    # a run whose GPU is unknown is not "different", but it is said
    assert compare(report_of(JOB), a100)["warnings"] == ["the GPU of the baseline is unknown: they may not be on the same hardware"]
    # the same GPU with another peak (a MIG slice, a given peak): the MFUs are not comparable
    assert "different peaks" in compare(a100, report_of(JOB, gpu="A100", peak_tflops=150.0))["warnings"][0]
    assert compare(a100, report_of(JOB, peak_tflops=150.0))["warnings"] == [
        "the GPU of this run is unknown: they may not be on the same hardware"]


def test_compare_never_shows_a_rounding_as_a_change():
    """A bar at -0.00001 (a signed FLOP-convention bar) in the baseline and +0.00001 now moved by
    0.002 points: it rounds to 0.00 and is no change ("same", no arrow, never '-0.00%')."""
    base = report_of(JOB, gpu="A100")
    new = copy.deepcopy(base)
    bars = {b["key"]: b for b in base["job"]["waterfall"]}
    assert "flop_convention" in bars
    bars["flop_convention"]["fraction"] = -0.00001
    {b["key"]: b for b in new["job"]["waterfall"]}["flop_convention"]["fraction"] = 0.00001
    new["job"]["mfu"] = base["job"]["mfu"] + 1e-9
    c = compare(base, new)
    text = render({**new, "comparison": c}, "text").decode()
    assert "-0.00" not in text and "(0.00 points, same)" in text
    html = render({**new, "comparison": c}, "html").decode()
    label = re.escape(bars["flop_convention"]["label"])  # named for what it holds ("precision and FLOP convention (signed)")
    row = re.search(rf"<tr><td>{label}</td>(.*?)</tr>", html).group(1)
    assert "-0.00" not in row and "▲" not in row and "▼" not in row and "muted" in row and "0.00 pts" in row


# -- nothing from a file reaches a terminal or a page unescaped -----------------------------------

HOSTILE = "k\x1b[2J\x1b]0;owned\x07\x9b31m\u202e\r\nwarning: fake<i id=x>\"'&\x00"


def hostile(d, payload=HOSTILE):
    """The report with every string value replaced by ``payload`` (as a saved report may hold)."""
    if isinstance(d, dict):
        return {k: hostile(v, payload) for k, v in d.items()}
    if isinstance(d, list):
        return [hostile(v, payload) for v in d]
    return payload if isinstance(d, str) else d


def test_printable_strips_escape_sequences_and_control_characters():
    assert views.printable("plain name<4>") == "plain name<4>"
    out = views.printable(HOSTILE)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f\u202e]", out)
    assert "owned" not in out and "2J" not in out  # whole sequences go, not just their ESC
    assert out.startswith("k\ufffd") and "warning: fake<i id=x>" in out


def test_text_report_of_a_hostile_report_prints_no_control_character():
    d = hostile(report_of(JOB, gpu="A100"))
    d["comparison"] = hostile(compare(report_of(H100), report_of(JOB, gpu="A100")))
    out = render_text(d)
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", out)
    # no line was injected: every warning is one line
    assert sum(1 for ln in out.splitlines() if ln.startswith("warning: ")) == len(d["warnings"])


def test_html_of_a_hostile_report_escapes_every_string():
    d = report_of(JOB, gpu="A100")
    d["comparison"] = compare(report_of(H100), d)
    d["warnings"].append("a warning")
    bad = hostile(d)
    for r in bad["ranks"]:  # numbers a saved report may hold as strings
        r["rank"] = HOSTILE
    for s in bad["suggestions"]:
        if s["evidence"].get("where"):
            s["evidence"]["where"]["rank"] = HOSTILE
    html = render(bad, "html").decode()
    assert "What changed against the baseline" in html
    shown = html[:html.index("<script type='application/")]  # the page; the embedded JSON keeps the strings as they are
    assert "<i id=x>" not in html and "\x1b" not in html and not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", shown)
    assert html.count("fake&lt;i id=x&gt;&quot;&#x27;&amp;") > 100  # shown, escaped, everywhere it was
    assert orjson.loads(render(bad, "json"))["warnings"][0] == HOSTILE


def test_the_cli_prints_no_control_character_from_a_trace(tmp_path):
    """A device named with an OSC title sequence and an ANSI clear: the GPU is unknown, so its name
    is in a warning (stderr), the rank table (stdout) and the info summary; none carries a control."""
    evil = "Evil\x1b]0;pwned\x07GPU\x1b[2J"
    p = deepseek_style(tmp_path / "rank-0.json", name=evil)
    controls = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
    for args in (("report", p, "--no-cache"), ("info", p, "--no-cache")):
        r = cli(*args)
        assert r.returncode == 0, r.stderr
        assert "Evil\ufffdGPU\ufffd" in r.stdout + r.stderr
        assert not controls.search(r.stdout) and not controls.search(r.stderr)


@pytest.mark.parametrize("which", ["mfu", "no_flops"])
def test_text_and_html_show_the_reports_headline_numbers(which, no_flops):
    """The JSON's numbers, formatted once (views / units), appear in the text and the HTML alike:
    the MFU or what it lacks, each rank's MFU, the step-time statistics, the GPU-time shares and
    the warnings count (the TUI: tests/test_tui.py)."""
    from tracelens.model.units import fmt_ns, fmt_pct

    d = report_of(JOB, gpu="A100") if which == "mfu" else report_of(no_flops)
    text, html = render_text(d), re.sub(r"\s+", " ", unescape(render_html(d).decode()))
    h = views.headline(d)
    want = [f"{100 * d['job']['mfu']:.2f}%", views.mfu_text(h)] if d["job"]["mfu"] is not None else [
        h["why_unknown"].removeprefix("MFU unknown: ")]
    st = d["job"]["step_time_ns"]
    want += [fmt_ns(st["mean"]), f"p50 {fmt_ns(st['p50'])}", f"max {fmt_ns(st['max'])}"]
    want += [fmt_pct(r["mfu"]["value"], 2) for r in d["ranks"] if r["mfu"]["value"] is not None]
    g = d["job"]["gpu_time_ns"]
    w = sum(g[k] for k in ("idle", "compute", "exposed_comm", "exposed_memcpy"))
    want += [f"compute {fmt_pct(g['compute'] / w)}", f"exposed comm {fmt_pct(g['exposed_comm'] / w)}"]
    for x in want:
        assert x in text.replace("  ", " "), x
        assert x in html, x
    assert views.step_stats(d)["mean"] == st["mean"]
    if d["warnings"]:
        assert f"{len(d['warnings'])} warning(s)" in text and f"{len(d['warnings'])} warning(s)" in html


def test_the_schema_holds_the_gpu_time_waterfall_to_its_shape(no_flops):
    """The schema validates the GPU-time waterfall and refuses one that ends nowhere (no mfu or
    compute bar) or a negative part; the sum to 1 is checked above (a schema cannot add)."""
    d = report_of(no_flops)
    v = jsonschema.Draft202012Validator(SCHEMA)
    v.validate(d)
    bad = copy.deepcopy(d)
    bad["job"]["waterfall"] = bad["job"]["waterfall"][:-1]
    assert not v.is_valid(bad)
    bad = copy.deepcopy(d)
    bad["job"]["waterfall"][-1]["parts"][0]["ns"] = -1
    assert not v.is_valid(bad)
    bad = copy.deepcopy(d)
    bad["job"]["waterfall_kind"] = "time"
    assert not v.is_valid(bad)
