"""Saved reports are untrusted input (issue 14, items 3 and 4): ``--load``, ``--compare`` and
``tracelens open`` validate a report against report.schema.json (tracelens.model.validator) before
rendering it; a malformed one is one line naming the file, the JSON path and the problem (exit 3,
a message in the TUI); sizes are bounded (the file and an HTML page's gzip payload); what reaches
HTML is escaped and the page's Content-Security-Policy runs only its own script; and no control
code from a report or a trace reaches the terminal."""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import json
import os
import random
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tracelens import cli
from tracelens.model.errors import TraceInputError
from tracelens.model.saved import check, load_saved, validator
from tracelens.model.validator import SchemaError, Validator
from tracelens.render import render
from tracelens.render.compare import compare
from tracelens.render.html import extract_report, render_html

GOLDEN = sorted((ROOT / "tests/golden").glob("*.json"))
SCHEMA = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())
XSS = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">'&</script><!--"
TERMINAL = "\x1b]0;pwned\x07\x1b[2J\x9b31m[bold red]x[/bold red]\u202e"
# what a terminal obeys: ESC, the other C0 controls but tab and newline, DEL and the C1 controls
OBEYED = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def golden(i: int = 0) -> dict:
    return orjson.loads(GOLDEN[i].read_bytes())


def with_comparison() -> dict:
    d = golden(2)
    d["comparison"] = compare(golden(0), d)
    return d


def _resolve(schema: dict) -> dict:
    while "$ref" in schema:
        node = SCHEMA
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        schema = node
    return schema


def _branch(schema: dict, x) -> dict:
    """The schema node that describes ``x`` (the anyOf branch it fits)."""
    schema = _resolve(schema)
    for sub in schema.get("anyOf", []):
        if validator()._first(sub, x, ()) is None:
            return _branch(sub, x)
    return schema


def every_string(d, value: str):
    """``d`` with every string the schema leaves free (not an enum, constant or pattern) replaced
    by ``value``, and the keys of its free-form maps (per-rank evidence, peaks by dtype) prefixed."""
    def walk(schema, x):
        schema = _branch(schema, x)
        if isinstance(x, str):
            return x if {"enum", "const", "pattern"} & set(schema) else value
        if isinstance(x, dict):
            props, extra = schema.get("properties", {}), schema.get("additionalProperties")
            if isinstance(extra, dict) and not props:
                return {value + k: walk(extra, v) for k, v in x.items()}
            fixed = {k for c in [schema, *schema.get("allOf", [])] for k in c.get("if", {}).get("properties", {})}  # a bar's key
            return {k: walk(props[k], v) if k in props and k not in fixed else v for k, v in x.items()}
        if isinstance(x, list) and isinstance(schema.get("items"), dict):
            return [walk(schema["items"], v) for v in x]
        return x

    out = walk(SCHEMA, d)
    assert validator().first_error(out) is None, validator().first_error(out)
    return out


def strip_optional(schema: dict, x):
    """``x`` with every property the schema does not require removed, recursively."""
    schema = _branch(schema, x)
    if isinstance(x, dict):
        props, req = schema.get("properties", {}), set(schema.get("required", ()))
        return {k: strip_optional(props[k], v) if k in props else v for k, v in x.items() if k in req or k not in props}
    if isinstance(x, list) and isinstance(schema.get("items"), dict):
        return [strip_optional(schema["items"], v) for v in x]
    return x


def renders(d: dict) -> None:
    """Every renderer, and a comparison either way, on a report that passed the validator."""
    for fmt in ("text", "html", "json"):
        render(d, fmt)
    for c in (compare(golden(1), d), compare(d, golden(0))):
        for fmt in ("text", "html"):
            render({**golden(2), "comparison": c}, fmt)


def page_of(payload: bytes) -> bytes:
    """An HTML page that embeds ``payload`` as tracelens does (plain JSON, "<" escaped)."""
    return (b"<!DOCTYPE html><html><body><script type='application/json' id='tracelens-report'>"
            + payload.replace(b"<", b"\\u003c") + b"</script></body></html>")


def load_cli(capsys, path: Path, *extra: str) -> tuple[int, str, str]:
    code = cli.main(["report", "--load", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


# -- the validator ------------------------------------------------------------------------

def test_every_report_tracelens_writes_validates():
    """The golden reports, with a comparison too, and the minimal report the schema allows (every
    optional key removed) validate with tracelens' own validator and with jsonschema; the real
    traces' reports are checked in tests/test_html.py::test_report_of_every_shared_trace_validates."""
    for d in [golden(i) for i in range(len(GOLDEN))] + [with_comparison()]:
        assert validator().first_error(d) is None
        jsonschema.Draft202012Validator(SCHEMA).validate(d)
        minimal = strip_optional(SCHEMA, d)
        assert validator().first_error(minimal) is None and len(orjson.dumps(minimal)) < len(orjson.dumps(d))
        renders(minimal)


def test_validator_checks_types_not_just_keys():
    v = Validator({"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": ["number", "null"]},
                                                    "a": {"type": "array", "items": {"enum": ["p", None]}}},
                   "required": ["n"], "additionalProperties": False})
    assert v.first_error({"n": 1, "x": None, "a": ["p", None]}) is None
    assert v.first_error({"n": True}) == ("$.n", "expected integer, got true")
    assert v.first_error({"n": 1.0}) == ("$.n", "expected integer, got a number (1.0)")  # stricter than the standard
    assert v.first_error({"n": 1, "x": float("nan")}) == ("$.x", "expected number or null, got a non-finite number (nan)")
    assert v.first_error({"n": 1, "a": ["p", 1]})[0] == "$.a[1]"
    assert v.first_error({"n": 1, "z": 0}) == ("$", "unexpected key 'z'")
    assert v.first_error({}) == ("$", "missing key 'n'")
    assert v.first_error([]) == ("$", "expected object, got an array")


def test_validator_refuses_a_schema_it_cannot_check():
    with pytest.raises(SchemaError, match="uniqueItems"):
        Validator({"type": "array", "uniqueItems": True})
    with pytest.raises(SchemaError, match="points nowhere"):
        Validator({"$ref": "#/$defs/missing"})


def _mutate(d: dict, rng: random.Random) -> dict:
    """One random change somewhere in a report: a key removed, a value of another type, or a
    value of the same type but out of range (0, negative, huge, empty, repeated)."""
    pool = [None, True, False, 0, -1, 2**63 - 1, 1e308, -1e308, 5e-324, 0.5, "", XSS, TERMINAL, [], {}, [1], [None],
            {"a": 1}, [[[]]], "x" * 3000]
    nodes = []

    def walk(x, at):
        nodes.append(at)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, (*at, k))
        elif isinstance(x, list):
            for i, v in enumerate(x[:3]):
                walk(v, (*at, i))

    walk(d, ())
    at = rng.choice(nodes[1:])
    parent = d
    for p in at[:-1]:
        parent = parent[p]
    key, v = at[-1], parent[at[-1]]
    op = rng.random()
    if op < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif op < 0.55:
        if type(v) is int:
            parent[key] = rng.choice([0, -1, 1, 2**63, -(2**63), 10**18, v * 1000])
        elif type(v) is float:
            parent[key] = rng.choice([0.0, -1.0, 1e308, -1e308, 5e-324, 1.5, 100.0, -0.0])
        elif isinstance(v, str):
            parent[key] = rng.choice(["", "x" * 5000, XSS, TERMINAL, "ProfilerStep#", "[red]"])
        elif isinstance(v, list):
            parent[key] = rng.choice([[], v * 3, v[:1], list(reversed(v))])
        elif isinstance(v, dict):
            parent[key] = {k: v[k] for k in list(v)[: rng.randrange(len(v) + 1)]}
        else:
            parent[key] = copy.deepcopy(rng.choice(pool))
    else:
        parent[key] = copy.deepcopy(rng.choice(pool))
    return d


BASES = [golden(i) for i in range(len(GOLDEN))] + [with_comparison()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(0, len(BASES) - 1), st.integers(1, 3))
def test_a_mutated_report_renders_or_is_refused_in_one_line(rng, base, n):
    """Whatever one to three random changes do to a valid report: either it fails validation
    with the project's own one-line error, or every renderer (and --compare either way) works."""
    d = copy.deepcopy(BASES[base])
    for _ in range(n):
        _mutate(d, rng)
    d = orjson.loads(json.dumps(d))  # as read from a file: NaN and big integers as orjson has them
    try:
        check("crafted.json", d)
    except TraceInputError as e:
        assert str(e).startswith("crafted.json: ") and "\n" not in str(e)
        return
    renders(d)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.randoms(use_true_random=False), st.integers(0, len(BASES) - 1))
def test_the_validator_is_at_least_as_strict_as_jsonschema(rng, base):
    """On mutated reports: what jsonschema refuses, tracelens' validator refuses; what it lets
    through, jsonschema lets through, or it is a whole number written as a float (stricter)."""
    d = orjson.loads(json.dumps(_mutate(copy.deepcopy(BASES[base]), rng)))
    ours = validator().first_error(d)
    theirs = jsonschema.Draft202012Validator(SCHEMA).is_valid(d)
    if ours is None:
        assert theirs
    elif theirs:
        assert "expected integer" in ours[1] and "got a number" in ours[1], ours


# -- the hostile-case table ----------------------------------------------------------------

def _set(path: tuple, value):
    def f(d):
        node = d
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
        return d
    return f


def _del(path: tuple):
    def f(d):
        node = d
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
        return d
    return f


def _raw(text: bytes):
    return lambda d: text


def _nan(d):  # NaN in the JSON text: orjson refuses it, as JSON does
    return orjson.dumps(d).replace(b'"mfu":' + orjson.dumps(d["job"]["mfu"]), b'"mfu":NaN', 1)


def _deep(d):
    return orjson.dumps(d).replace(b'"warnings":[', b'"warnings":[' + b"[" * 3000 + b"]" * 3000 + b",", 1)


def _nested(levels: int):
    """A list ``levels`` deep under a free-form key of ``$.suggestions[0].evidence`` (the schema
    allows any extra key there): the report as a whole is 4 + ``levels`` deep."""
    def change(d):
        inner = "leaf"
        for _ in range(levels):
            inner = [inner]
        d["suggestions"][0]["evidence"]["extra"] = inner
        return d
    return change


DEEP_AT = "nested deeper than 32 levels (at $.suggestions[0].evidence.extra[0]…)"
REFUSED = [  # (id, change, what the one-line error says)
    ("top_level_array", _raw(b'[{"schema_version": 1}]'), "not a tracelens"),
    ("top_level_string", _raw(b'"schema_version"'), "not a tracelens"),
    ("nan_in_text", _nan, "not a valid JSON report"),
    ("infinity_in_text", lambda d: orjson.dumps(d).replace(b'"ranks":', b'"ranks":1e999,"x":', 1), "not a valid JSON report"),
    ("truncated", lambda d: orjson.dumps(d)[:5000], "not a valid JSON report"),
    ("nested_3000_deep", _deep, "not a valid JSON report"),
    ("evidence_nested_300", _nested(300), DEEP_AT),
    ("evidence_nested_one_past_the_bound", _nested(29), DEEP_AT),
    ("evidence_dicts_nested_300", lambda d: _set(("suggestions", 0, "evidence", "x"), json.loads('{"a":' * 300 + "1" + "}" * 300))(d),
     "nested deeper than 32 levels (at $.suggestions[0].evidence.x.a…)"),
    ("schema_version_2", _set(("schema_version",), 2), "schema_version 2"),
    ("tool_name_other", _set(("tool", "name"), "other"), "not a tracelens report"),
    ("mfu_string", _set(("job", "mfu"), "high"), "$.job.mfu: expected number or null, got a string ('high')"),
    ("mfu_bool", _set(("job", "mfu"), True), "$.job.mfu: expected number or null, got true"),
    ("rank_xss_string", _set(("ranks", 0, "rank"), XSS), "$.ranks[0].rank: expected integer, got a string"),
    ("rank_float", _set(("ranks", 0, "rank"), 0.5), "$.ranks[0].rank: expected integer"),
    ("rank_huge_float", _set(("ranks", 0, "window_ns"), 1e30), "$.ranks[0].window_ns: expected integer"),
    ("window_negative", _set(("ranks", 0, "window_ns"), -5), "$.ranks[0].window_ns: expected a number >= 0"),
    ("device_name_object", _set(("ranks", 0, "device", "name"), {"nested": {"x": 1}}), "$.ranks[0].device.name: expected string or null"),
    ("step_not_object", _set(("ranks", 0, "steps", 0), "step"), "$.ranks[0].steps[0]: expected object, got a string"),
    ("ranks_nested_twice", lambda d: {**d, "ranks": [d["ranks"]]}, "$.ranks[0]: expected object, got an array"),
    ("ranks_object", _set(("ranks",), {"0": {}}), "$.ranks: expected array, got an object"),
    ("missing_step_time", _del(("job", "step_time_ns")), "$.job: missing key 'step_time_ns'"),
    ("missing_ranks", _del(("ranks",)), "$: missing key 'ranks'"),
    ("missing_kernel_name", _del(("ranks", 0, "kernels", 0, "name")), "$.ranks[0].kernels[0]: missing key 'name'"),
    ("extra_top_key", _set(("surprise",), 1), "$: unexpected key 'surprise'"),
    ("warning_number", _set(("warnings",), [5]), "$.warnings[0]: expected string, got a number (5)"),
    ("waterfall_kind_bogus", _set(("job", "waterfall_kind"), "bogus"), "$.job.waterfall_kind: expected one of 'mfu', 'gpu_time'"),
    ("gpu_time_list", _set(("job", "gpu_time_ns"), [1, 2]), "$.job.gpu_time_ns: expected object or null, got an array"),
    ("gpu_time_idle_string", _set(("job", "gpu_time_ns", "idle"), "0"), "$.job.gpu_time_ns.idle: expected integer"),
    ("bar_fraction_null", _set(("job", "waterfall", 0, "fraction"), None), "$.job.waterfall[0].fraction: expected number, got null"),
    ("timeline_bins_zero", _set(("timeline", "bins"), 0), "$.timeline.bins: expected a number >= 1"),
    ("inputs_size_string", _set(("inputs", 0, "size_bytes"), "big"), "$.inputs[0].size_bytes: expected integer or null"),
    ("evidence_measure_alone", lambda d: _set(("suggestions", 0, "evidence"), {"measure": "x"})(d), "missing key 'worst' (needed with 'measure')"),
    ("comparison_mfu_list", lambda d: _set(("comparison", "mfu"), [])({**d, "comparison": with_comparison()["comparison"]}),
     "$.comparison.mfu: expected object, got an array"),
    ("comparison_free_form", _set(("comparison",), {"anything": 1}), "$.comparison: missing key 'base'"),
    ("per_rank_string_value", lambda d: _set(("suggestions", 0, "evidence", "per_rank"), {"0": "x"})(d),
     "$.suggestions[0].evidence.per_rank['0']: expected number"),
]
LOADED = [  # (id, change): valid reports, however odd, that must render
    ("sorted_keys", lambda d: json.loads(json.dumps(d, sort_keys=True))),
    ("xss_in_every_string", lambda d: every_string(d, XSS)),
    ("terminal_codes_in_every_string", lambda d: every_string(d, TERMINAL)),
    ("huge_numbers", lambda d: _set(("job", "waterfall", 0, "fraction"), 1e308)(_set(("job", "mfu"), 1e308)(d))),
    ("tiny_numbers", lambda d: _set(("ranks", 0, "device", "peak_bandwidth"), 5e-324)(d)),
    ("no_ranks", lambda d: {**d, "ranks": [], "job": {**d["job"], "ranks": 0}}),
    ("only_required_keys", lambda d: strip_optional(SCHEMA, d)),
    ("long_strings", lambda d: every_string(d, "k" * 20_000)),  # every free string 20k characters (100k: 8 s a case)
    ("evidence_nested_to_the_bound", _nested(28)),  # 32 levels in all: the deepest allowed
]


@pytest.mark.parametrize("container", ["json", "html"])
@pytest.mark.parametrize("case,change,problem", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_malformed_report_is_one_line_naming_the_file_and_the_path(tmp_path, capsys, container, case, change, problem):
    base = golden(1)  # resnet50: suggestions, a timeline and a step with evidence
    data = change(copy.deepcopy(base))
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    path = tmp_path / f"crafted.{container}"
    path.write_bytes(raw if container == "json" else page_of(raw))
    out_file = tmp_path / "out.html"
    code, out, err = load_cli(capsys, path, "-o", str(out_file))
    assert code == 3 and out == "" and not out_file.exists()
    assert err.startswith(f"tracelens: error: {path}: ") and err.count("\n") == 1, err
    if container == "html" and problem == "not a valid JSON report":
        problem = "the report embedded in this page is damaged"
    assert problem in err
    assert not OBEYED.search(err)
    # --compare trusts it no more than --load
    if problem not in ("not a tracelens report", "not a tracelens"):
        assert cli.main(["report", "--load", str(GOLDEN[0]), "--compare", str(path)]) == 3
        assert problem in capsys.readouterr().err


@pytest.mark.parametrize("container", ["json", "html"])
@pytest.mark.parametrize("case,change", LOADED, ids=[c[0] for c in LOADED])
def test_an_odd_but_valid_report_loads_and_renders(tmp_path, capsys, container, case, change):
    d = change(copy.deepcopy(golden(1)))
    raw = json.dumps(d).encode()
    path = tmp_path / f"crafted.{container}"
    path.write_bytes(raw if container == "json" else page_of(raw))
    for fmt in ("txt", "html", "json"):
        code, out, err = load_cli(capsys, path, "-o", str(tmp_path / f"out.{fmt}"))
        assert code == 0 and err == "", err
    code, out, err = load_cli(capsys, path)
    assert code == 0 and out.startswith("tracelens ") and not OBEYED.search(out)
    assert cli.main(["report", "--load", str(GOLDEN[0]), "--compare", str(path), "-o", str(tmp_path / "c.html")]) == 0
    html = (tmp_path / "out.html").read_text()
    assert XSS not in html.split("id='tracelens-report'")[0] and "<img" not in html


def test_a_report_nested_past_the_bound_is_refused_by_every_command(tmp_path, capsys, monkeypatch):
    """A list 300 deep in a suggestion's evidence (valid for the schema, which leaves evidence
    open) once reached the JSON writer and the text renderer (exit 4, a RecursionError): every
    output, --compare and the TUI refuse it as a malformed report, before rendering."""
    from tracelens import tui

    path = tmp_path / "deep.json"
    path.write_text(json.dumps(_nested(300)(golden(1))))
    for out in ("x.html", "x.txt", "x.json", None):
        code, stdout, err = load_cli(capsys, path, *(("-o", str(tmp_path / out)) if out else ()))
        assert code == 3 and stdout == "" and err == f"tracelens: error: {path}: not a valid tracelens report: {DEEP_AT}\n"
    assert not list(tmp_path.glob("x.*"))
    assert cli.main(["report", "--load", str(GOLDEN[0]), "--compare", str(path), "-o", str(tmp_path / "c.txt")]) == 3
    assert DEEP_AT in capsys.readouterr().err and not (tmp_path / "c.txt").exists()
    built = _open_in_a_stand_in_app(monkeypatch, tui, path)
    assert built["error"] == f"cannot open {path}: not a valid tracelens report: {DEEP_AT}"
    assert capsys.readouterr().err.count("\n") == 1


def _open_in_a_stand_in_app(monkeypatch, tui, path) -> dict:
    """``tracelens open path`` with an app that records what it was built with instead of
    running: asserts exit 3, returns the app's keyword arguments."""
    built = {}

    class Fake:
        def __init__(self, **kw):
            built.update(kw)
            self.error = kw.get("error")

        def run(self):
            pass

    monkeypatch.setattr(tui, "make_app", lambda *a, **kw: Fake(**kw))
    monkeypatch.setattr(cli, "_has_terminal", lambda: True)  # pytest's stdin is none: open would refuse
    assert cli.main(["open", str(path)]) == 3
    return built


def _depth(x) -> int:  # the reference: recursive, on values small enough for it
    return 1 + max(map(_depth, x.values() if isinstance(x, dict) else x), default=0) if isinstance(x, (dict, list)) else 0


_JSON_TREES = st.recursive(st.none() | st.integers() | st.text(max_size=3),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=2), kids, max_size=3),
                           max_leaves=40)


@settings(max_examples=150, deadline=None)
@given(_JSON_TREES, st.integers(1, 12))
def test_the_depth_bound_is_exactly_the_depth(tree, limit):
    from tracelens.model.saved import too_deep

    assert (too_deep(tree, limit) is None) == (_depth(tree) <= limit)


def test_the_depth_is_measured_without_recursion():
    from tracelens.model.saved import too_deep

    deep = []
    for _ in range(200_000):  # far past the interpreter's recursion limit
        deep = [deep]
    assert too_deep(deep, 32) == "$[0][0][0][0][0]…"
    assert too_deep({"a": [[]]}, 3) is None and too_deep({"a": [[]]}, 2) == "$.a[0]"


def test_sorted_keys_render_identically(tmp_path, capsys):
    """``jq -S``: every object's keys sorted; the text and the HTML are byte for byte the same, the
    JSON the same data (the waterfall of each rank, the per-rank evidence: order from lists and values)."""
    for i in range(len(GOLDEN)):
        d = golden(i)
        srt = tmp_path / f"sorted{i}.json"
        srt.write_text(json.dumps(d, sort_keys=True))
        for fmt in ("txt", "html", "json"):
            assert cli.main(["report", "--load", str(GOLDEN[i]), "-o", str(tmp_path / f"a.{fmt}")]) == 0
            assert cli.main(["report", "--load", str(srt), "-o", str(tmp_path / f"b.{fmt}")]) == 0
            a, b = (tmp_path / f"a.{fmt}").read_bytes(), (tmp_path / f"b.{fmt}").read_bytes()
            assert (orjson.loads(a) == orjson.loads(b)) if fmt == "json" else a == b, (GOLDEN[i].name, fmt)


# -- bounded sizes -------------------------------------------------------------------------

def gz_page(payload: bytes) -> bytes:
    packed = base64.b64encode(gzip.compress(payload, compresslevel=9)).decode()
    return f"<html><script type='application/gzip+base64' id='tracelens-report-gz'>{packed}</script></html>".encode()


def test_an_html_bomb_fails_before_its_payload_is_inflated(tmp_path, monkeypatch, capsys):
    """32 MiB of JSON whitespace in 32 KiB of gzip, under a 1 MiB limit: refused in one line, and
    the inflation stops at the limit (the peak of Python memory stays a few MiB, not 32)."""
    monkeypatch.setenv("TRACELENS_MAX_REPORT_BYTES", str(2**20))
    bomb = tmp_path / "bomb.html"
    bomb.write_bytes(gz_page(b"[" + b" " * (32 * 2**20) + b"]"))
    assert bomb.stat().st_size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(TraceInputError, match="expands past 1 MiB, the limit for a saved report"):
            load_saved(str(bomb), required=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak
    code, out, err = load_cli(capsys, bomb)
    assert code == 3 and err.count("\n") == 1 and "TRACELENS_MAX_REPORT_BYTES" in err


def test_a_report_file_past_the_limit_is_refused_without_reading_it_all(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACELENS_MAX_REPORT_BYTES", str(2**20))
    d = golden(0)
    d["warnings"] = ["w" * 1000] * 3000  # a valid report of 3 MB
    for name, raw in (("big.json", orjson.dumps(d)), ("big.html", render_html(d))):
        path = tmp_path / name
        path.write_bytes(raw)
        code, out, err = load_cli(capsys, path)
        assert code == 3 and f"{path}: " in err and ("larger than 1 MiB" in err or "expands past 1 MiB" in err), err
    monkeypatch.delenv("TRACELENS_MAX_REPORT_BYTES")
    assert load_cli(capsys, tmp_path / "big.json")[0] == 0 and load_cli(capsys, tmp_path / "big.html")[0] == 0


@pytest.mark.parametrize("page,problem", [
    (b"<script type='application/gzip+base64' id='tracelens-report-gz'>H4sI!!!!</script>", "bad base64"),
    (b"<script type='application/gzip+base64' id='tracelens-report-gz'>" + base64.b64encode(b"not gzip") + b"</script>", "bad gzip"),
    (b"<script type='application/gzip+base64' id='tracelens-report-gz'>" + base64.b64encode(gzip.compress(json.dumps(list(range(3000))).encode())[:2000])
     + b"</script>", "ends early"),
    (b"<script type='application/json' id='tracelens-report'>{\"schema_version\": 1", "not closed"),
    (b"<html>no report here</html>", "no tracelens report embedded"),
], ids=["base64", "gzip", "gzip_cut", "unclosed", "none"])
def test_a_damaged_html_report_is_one_line(tmp_path, capsys, page, problem):
    path = tmp_path / "damaged.html"
    path.write_bytes(page)
    code, out, err = load_cli(capsys, path)
    assert code == 3 and problem in err and err.count("\n") == 1, err


# -- HTML: escaped at the point of output, and a policy that runs only the page's own script --

def test_strings_from_a_report_reach_html_only_escaped():
    """XSS in every string the schema allows, and a rank that is a string (the renderer is not
    trusted to have a validated report): nothing of it appears as markup."""
    d = every_string(with_comparison(), XSS)
    d["ranks"][0]["rank"] = XSS  # past validation on purpose
    html = render_html(d, d["comparison"]).decode()
    page = re.sub(r"<script type='application/[^']+' id='tracelens-report[^']*'>.*?</script>", "", html, flags=re.S)
    assert "<img" not in html and "</script><!--" not in html
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the data block and the page's own script
    assert "onerror=&quot;document" in page
    assert extract_report(html)["ranks"][0]["rank"] == XSS


def test_embedded_json_cannot_close_its_script():
    d = golden(0)
    d["warnings"] = ["</script><script>alert(1)</script>", "<!-- <script>", "line\u2028sep\u2029", "&amp;"]
    html = render_html(d).decode()
    data = html.split("id='tracelens-report'>")[1].split("</script>")[0]
    assert "<" not in data and ">" not in data and "\u2028" not in data and "\u2029" not in data and "&" not in data
    assert extract_report(html)["warnings"] == d["warnings"]


def test_the_page_declares_a_policy_with_the_hashes_of_its_own_script_and_styles():
    import hashlib

    html = render_html(golden(1)).decode()
    csp = re.search(r"<meta http-equiv='Content-Security-Policy' content=\"([^\"]+)\">", html).group(1)
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'" and "unsafe-eval" not in csp and "http" not in csp
    h = lambda s: "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"  # noqa: E731
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert len(scripts) == 1 and directives["script-src"] == h(scripts[0])
    assert len(styles) == 2 and set(directives["style-src-elem"].split()) == {h(s) for s in styles}  # the page's and the timeline's
    assert directives["style-src"] == directives["style-src-elem"] and directives["style-src-attr"] == "'unsafe-inline'"
    assert html.index("Content-Security-Policy") < html.index("<style>")


CHROMIUM = __import__("shutil").which("chromium") or __import__("shutil").which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="no chromium on this machine")
def test_no_injected_script_runs_in_chromium(tmp_path):
    """A crafted report (XSS in every string, a rank that is markup) rendered, and, as if an escape
    were missed, raw markup put into the page: Chromium runs the page's own script (data-ready)
    and none of the injected ones (no data-pwned)."""
    from tests.test_html import open_in_chromium

    d = every_string(with_comparison(), XSS)
    d["ranks"][0]["rank"] = XSS
    crafted = tmp_path / "crafted.html"
    crafted.write_bytes(render_html(d, d["comparison"]))
    injected = tmp_path / "injected.html"
    raw = render_html(golden(1)).decode()
    evil = ("<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
            "<script>document.body.setAttribute('data-pwned','2')</script>"
            "<svg><script>document.body.setAttribute('data-pwned','3')</script></svg>"
            "<style>body{background:url(http://example.invalid/x)}</style>")
    injected.write_text(raw.replace("<h1>", evil + "<h1>", 1))
    for page in (crafted, injected):
        dom, log = open_in_chromium(CHROMIUM, page, tmp_path / f"{page.stem}.png")
        body = re.search(r"<body([^>]*)>", dom)
        assert body, log[-500:]
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
        assert attrs.get("data-ready") == "1", (page.name, log[-1000:])
        assert "data-pwned" not in attrs, (page.name, attrs)
    assert "Content Security Policy" in log  # the injected page's markup was refused by the policy, not ignored


# -- the terminal --------------------------------------------------------------------------

def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tracelens", *map(str, args)], capture_output=True, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def _clean_bytes(b: bytes) -> bool:
    """No ESC byte, and no C1 control (U+0080-U+009F) in the decoded text."""
    return b"\x1b" not in b and not re.search(r"[\x80-\x9f]", b.decode("utf-8", "replace")) and b"\x07" not in b


def test_a_crafted_report_sends_no_control_code_to_the_terminal(tmp_path):
    d = every_string(with_comparison(), TERMINAL)
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(d))
    runs = [_run("report", "--load", path), _run("report", "--load", GOLDEN[0], "--compare", path),
            _run("report", "--load", path, "--compare", GOLDEN[2])]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert _clean_bytes(r.stdout) and _clean_bytes(r.stderr)
    assert "[bold red]x[/bold red]" in runs[0].stdout.decode()  # shown as it is, with U+FFFD for each control sequence
    assert "\ufffd" in runs[0].stdout.decode()
    # the JSON report a user may cat: the same strings, escaped
    assert _run("report", "--load", path, "-o", tmp_path / "again.json").returncode == 0
    again = (tmp_path / "again.json").read_bytes()
    assert _clean_bytes(again) and orjson.loads(again) == orjson.loads(render(d, "json"))
    # a malformed one names the bad value in its error, made printable
    d["job"]["mfu"] = TERMINAL
    path.write_text(json.dumps(d))
    r = _run("report", "--load", path)
    assert r.returncode == 3 and _clean_bytes(r.stderr) and r.stderr.count(b"\n") == 1


def test_a_crafted_trace_sends_no_control_code_to_the_terminal(tmp_path):
    """Op, kernel and device names with OSC, CSI and C1 codes: info (text and JSON) and the text
    report (and its warnings on stderr) show them as text."""
    from tests.test_frontends import deepseek_style

    p = deepseek_style(tmp_path / "rank-0.json", name="NVIDIA H800" + TERMINAL)
    doc = orjson.loads(p.read_bytes())
    for e in doc["traceEvents"]:
        if isinstance(e.get("name"), str) and not e["name"].startswith("ProfilerStep"):
            e["name"] = e["name"] + TERMINAL
    p.write_bytes(orjson.dumps(doc))
    runs = [_run("info", p, "--no-cache"), _run("info", "--json", p, "--no-cache"), _run("report", p, "--no-cache"),
            _run("report", p, "--no-cache", "--gpu", "H800" + TERMINAL)]
    for r in runs[:3]:
        assert r.returncode == 0, r.stderr
    for r in runs:
        assert _clean_bytes(r.stdout) and _clean_bytes(r.stderr), (r.stdout[-300:], r.stderr[-300:])
    assert "NVIDIA H800\ufffd" in runs[0].stdout.decode() and "\ufffd" in runs[2].stdout.decode()


# -- the TUI -------------------------------------------------------------------------------

def test_a_malformed_saved_report_is_a_message_in_the_tui(tmp_path, monkeypatch, capsys):
    """``tracelens open crafted.json``: the app starts and says why it cannot show it; on quit,
    the same line on stderr and exit 3 (never a traceback, never exit 0)."""
    from tracelens import tui

    d = golden(0)
    d["ranks"][0]["device"] = {"name": ["not", "a", "string"]}
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(d))
    built = _open_in_a_stand_in_app(monkeypatch, tui, path)
    err = capsys.readouterr().err
    assert built["error"].startswith(f"cannot open {path}: not a valid tracelens report: $.ranks[0].device")
    assert err.count("\n") == 1 and "$.ranks[0].device" in err

    async def go():
        app = tui.make_app(error=built["error"] + TERMINAL)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            shown = str(app.query_one("#error").render())
            assert "$.ranks[0].device" in shown and "press q to quit" in shown and not OBEYED.search(shown)
            assert "[bold red]x[/bold red]" in shown
            await pilot.press("q")

    monkeypatch.undo()
    asyncio.run(go())


def test_a_crafted_saved_report_shows_markup_and_codes_as_text_in_the_tui(tmp_path):
    """Rich markup and terminal codes in every string of a saved report: every view renders, the
    brackets are shown as they are, no control code is in the screen."""
    from tracelens.tui import make_app

    d = every_string(golden(1), TERMINAL)
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(d))
    report = load_saved(str(path), required=True)

    async def go():
        app = make_app(report=report)
        async with app.run_test(size=(140, 40)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.error is None
            for key in "12345678":
                await pilot.press(key)
                await pilot.pause()
            svg = app.export_screenshot()
            assert not OBEYED.search(svg)
            detail = str(app.query_one("#warning-detail").render())  # the warnings view: the text, not its markup
            assert "[bold red]x[/bold red]" in detail and not OBEYED.search(detail)

    asyncio.run(go())


def test_a_report_is_told_from_a_trace_by_its_first_key():
    """--compare and open take a .json that is a report or a trace; a report starts with one of its
    top-level keys (as written, or sorted by jq -S), a Kineto trace with none of them."""
    from tracelens.model.saved import REPORT_KEYS, looks_like_report

    assert set(REPORT_KEYS) == set(SCHEMA["properties"])
    assert looks_like_report(GOLDEN[0].read_bytes()[:4096])
    assert looks_like_report(json.dumps(golden(0), sort_keys=True).encode()[:4096])
    assert looks_like_report(b"\xef\xbb\xbf \n {\n \"comparison\": {")
    for trace in (b'{"schemaVersion": 1, "traceEvents": []}', b'[{"ph": "X"}]', b'{"traceEvents": []}', b"\x1f\x8b\x08"):
        assert not looks_like_report(trace)
