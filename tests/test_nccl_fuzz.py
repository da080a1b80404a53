"""The NCCL profiler plugin, Inspector and nccl-tests readers never crash (issue 19, Must 6: fuzz
tests for every parser; the log and Flight Recorder readers have theirs in test_nccl_report.py).

On any bytes, on the real samples cut, spliced and mutated, and on lines built from each format's
own tokens, a reader either gives an ``NcclParse`` whose tables have their schemas, or raises a
one-line ``ParseError`` naming the file; then the standalone NCCL report of that file (diagnosis,
bandwidth table, achievable-bandwidth lookup) and its text and HTML renderings run without error,
and no bandwidth the report shows is NaN or infinite (orjson would write those as null; the
table must hold numbers or nulls, not ``inf``)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracelens.parsers import collective_parser_for

from tests.conftest import real_traces
from tracelens.model.errors import ParseError
from tracelens.model.nccl import BANDWIDTH_SCHEMA, NCCL_ROW_SCHEMA

NCCL = real_traces() / "nccl"
SAMPLES = {
    "nccl_plugin": sorted((NCCL / "profiler_plugin").glob("*.txt")),
    "nccl_inspector": sorted((NCCL / "inspector").glob("*.jsonl")),
    "nccl_tests": sorted((NCCL / "nccl-tests").glob("*.txt")),
}
FUZZ = settings(max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
MUT = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40), st.binary(max_size=20)), max_size=6)


def _fmt_names() -> dict[str, str]:
    from tracelens.parsers import COLLECTIVE_PARSERS

    # the registry's format names for the three readers (whatever they are called there)
    out = {}
    for fmt, mod in COLLECTIVE_PARSERS.items():
        for short in ("plugin", "inspector", "tests_table"):
            if mod.endswith("." + short):
                out[short] = fmt
    return out


FORMATS = _fmt_names()
READERS = {"nccl_plugin": FORMATS["plugin"], "nccl_inspector": FORMATS["inspector"], "nccl_tests": FORMATS["tests_table"]}


def _finite(x) -> bool:
    return x is None or not isinstance(x, float) or math.isfinite(x)


def _check(fmt: str, data: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"in{suffix}"
        p.write_bytes(data)
        try:
            got = collective_parser_for(fmt).read(p)
        except ParseError as e:
            assert e.path == str(p) and e.problem and "\n" not in e.problem
            return
        # the rows' schema, then the extra columns a format adds (its algorithm, bandwidths, ...)
        assert list(got.rows.columns[: len(NCCL_ROW_SCHEMA)]) == list(NCCL_ROW_SCHEMA)
        assert {k: got.rows.schema[k] for k in NCCL_ROW_SCHEMA} == NCCL_ROW_SCHEMA
        assert dict(got.bandwidth.schema) == BANDWIDTH_SCHEMA
        orjson.dumps(got.facts)  # plain JSON values
        assert all(isinstance(w, str) for w in got.warnings)
        # the standalone report of this one file, rendered
        from tracelens.analysis.nccl import analyze_nccl
        from tracelens.analysis.nccl_merge import _reference, achievable
        from tracelens.render import render

        ref = _reference([got])
        for coll in ref["collective"].unique().to_list():
            for size in (1.0, 4096.0, 1e12):
                a = achievable(ref, coll, None, size)
                assert a is None or _finite(a[0])
        try:
            a = analyze_nccl([(p, fmt)], [])
        except ParseError as e:  # nothing readable in the file: the report refuses it in one line
            assert e.problem and "\n" not in e.problem
            return
        d = a  # the report (a dict)
        for row in d.get("nccl", {}).get("bandwidth", []):
            assert all(_finite(row.get(k)) for k in ("time_us", "algbw_gbps", "busbw_gbps")), row
        for kind in ("json", "text", "html"):
            assert render(d, kind)


def _mutate(seed: bytes, cuts) -> bytes:
    b = bytearray(seed)
    for at, n, ins in cuts:
        at %= max(len(b), 1)
        b[at:at + n] = ins
    return bytes(b)


def test_every_reader_has_a_real_sample():
    assert all(SAMPLES.values()), SAMPLES  # the mutated-real fuzz below needs a seed per format
    assert set(READERS.values()) <= set(FORMATS.values())


@FUZZ
@given(st.sampled_from(sorted(READERS)), st.binary(max_size=2000))
def test_arbitrary_bytes(kind, data):
    _check(READERS[kind], data, SAMPLES[kind][0].suffix)


@FUZZ
@given(st.sampled_from(sorted(READERS)), st.integers(0, 10), MUT)
def test_mutated_real_samples(kind, which, cuts):
    seeds = SAMPLES[kind]
    seed = seeds[which % len(seeds)].read_bytes()
    _check(READERS[kind], _mutate(seed, cuts), seeds[0].suffix)


# lines made of each format's own tokens, in any order: numbers of every shape (huge, negative,
# hex, NaN/inf spellings), the header words, separators
_NUM = st.sampled_from(["0", "-1", "8", "1e308", "1e309", "nan", "inf", "-inf", "0x1f", "99999999999999999999999", "2e-07",
                        "N/A", "", "0.00", "3.5"])
_WORD = st.sampled_from(["float", "sum", "all_reduce_perf", "#", "size", "count", "type", "redop", "root", "time", "algbw",
                         "busbw", "error", "#wrong", "in-place", "out-of-place", "Avg", "bus", "bandwidth", ":", "[1,0]<stdout>:",
                         "Out", "of", "bounds", "values", "OK", "int8", "half", "bfloat16", "max", "-1", "nThread", "nGpus"])
_LINE = st.lists(st.one_of(_NUM, _WORD), max_size=14).map(lambda t: "  ".join(t))


@FUZZ
@given(st.lists(_LINE, max_size=30), st.integers(0, 2))
def test_nccl_tests_tables_of_odd_tokens(lines, keep_header):
    head = SAMPLES["nccl_tests"][0].read_text().splitlines()[: 4 * keep_header]
    _check(READERS["nccl_tests"], "\n".join(head + lines).encode(), ".txt")


_JVAL = st.recursive(st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=12)


@FUZZ
@given(st.lists(st.fixed_dictionaries({}, optional={
    "header": st.fixed_dictionaries({}, optional={"id": _JVAL, "rank": _JVAL, "n_ranks": _JVAL, "nnodes": _JVAL}),
    "metadata": st.dictionaries(st.sampled_from(["inspector_output_format_version", "hostname", "pid", "dump_timestamp_us"]), _JVAL),
    "coll_perf": st.dictionaries(st.sampled_from(["coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us",
                                                  "coll_timing_source", "coll_algobw_gbs", "coll_busbw_gbs"]), _JVAL),
}), max_size=8))
def test_inspector_records_of_odd_values(records):
    import json

    text = "\n".join(json.dumps(r, allow_nan=True) for r in records)
    _check(READERS["nccl_inspector"], text.encode(), ".jsonl")


_PVAL = st.one_of(_NUM, st.sampled_from(["ncclFloat32", "0x262ca50", '"x"', "{}", "[]", "null", "true"]))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["Group API", "KernelLaunch", "Send", "Recv", "AllReduce", "ProxyOp", "ProxyStep", ""]),
                          st.sampled_from(["GROUP_API", "KERNEL_LAUNCH", "P2P_API", "P2P", "COLL", "COLL_API", "PROXY", "x"]),
                          st.sampled_from(["b", "e", "X", "i", ""]), _PVAL, _PVAL, _PVAL, st.sampled_from(["count", "datatype", "Stream", "seq"])),
                max_size=20), st.booleans())
def test_plugin_events_of_odd_values(events, close):
    lines = [f'{{"name": "{n}", "cat": "{c}", "ph": "{ph}", "id": {i}, "pid": 1, "tid": 1, "ts": {ts}, "args": {{"{k}": {v}}}}},'
             for n, c, ph, i, ts, v, k in events]
    text = "[\n" + "\n".join(lines) + ("\n{}]" if close else "")
    _check(READERS["nccl_plugin"], text.encode(), ".txt")


def test_a_table_row_with_impossible_numbers_keeps_them_null(tmp_path):
    """nccl-tests row ``8 2 float sum 37.08 0.00 0.00 2e-07 36.40 0.00 0.00 2e-07`` (issue 392's first)
    with its out-of-place time made ``1e309`` (a float overflow: inf), its algbw ``inf`` and its
    in-place algbw ``nan``: those three are null (they read as inf/inf/NaN before: an impossible
    bandwidth in the table), the other numbers stay, and a warning counts the three."""
    src = NCCL / "nccl-tests" / "nccl-issue392_all_reduce_perf_nccl2.7.8_error_column.txt"
    text = src.read_text().splitlines()
    first = next(ln for ln in text if " float " in ln).split()
    assert first[4:7] == ["37.08", "0.00", "0.00"] and first[8:11] == ["36.40", "0.00", "0.00"]
    first[4], first[5], first[9] = "1e309", "inf", "nan"
    p = tmp_path / "all_reduce_perf.txt"
    p.write_text("\n".join([ln for ln in text if " float " not in ln] + ["   ".join(first)]) + "\n")
    got = collective_parser_for(READERS["nccl_tests"]).read(p)
    assert got.bandwidth.select("in_place", "time_us", "algbw_gbps", "busbw_gbps").sort("in_place").to_dicts() == [
        {"in_place": False, "time_us": None, "algbw_gbps": None, "busbw_gbps": 0.0},
        {"in_place": True, "time_us": 36.4, "algbw_gbps": None, "busbw_gbps": 0.0}]
    assert any(w.startswith("3 time or bandwidth value(s)") for w in got.warnings), got.warnings


def test_inspector_times_past_an_int64_or_not_finite_do_not_raise(tmp_path):
    """Inspector records with an exec time of 1e309 (inf) and 1e20 us (1e23 ns: past an Int64), a
    busbw of -1: each raised InvalidOperationError (a strict cast of the duration) before.  Now the
    impossible values are null (two counted: inf and -1; 1e20 us is a finite time, kept in the
    bandwidth table, with no ns duration), the other fields are kept."""
    rec = ('{"header":{"id":"0xad","rank":1,"n_ranks":3,"nnodes":3},"metadata":{"inspector_output_format_version":"v4.0",'
           '"hostname":"h","pid":48},"coll_perf":{"coll":"AllReduce","coll_sn":%d,"coll_msg_size_bytes":100,'
           '"coll_exec_time_us":%s,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":0.4,"coll_busbw_gbs":%s}}')
    p = tmp_path / "insp.jsonl"
    p.write_text("\n".join([rec % (1, "1e309", "0.5"), rec % (2, "1e20", "0.5"), rec % (3, "5663.0", "-1")]) + "\n")
    got = collective_parser_for(READERS["nccl_inspector"]).read(p)
    assert got.bandwidth.select("time_us", "busbw_gbps").to_dicts() == [
        {"time_us": None, "busbw_gbps": 0.5}, {"time_us": 1e20, "busbw_gbps": 0.5}, {"time_us": 5663.0, "busbw_gbps": None}]
    assert got.rows["dur_ns"].to_list() == [None, None, 5_663_000]
    assert got.rows["seq"].to_list() == [1, 2, 3]
    assert any(w.startswith("2 time or bandwidth value(s)") for w in got.warnings), got.warnings


def test_plugin_time_that_overflows_is_null_not_an_error(tmp_path):
    """The real plugin sample with one begin time made ``1e309`` (inf): its ns raised
    InvalidOperationError (a strict cast) before.  Now that time is null and every row of the sample
    is still read (the same count as the unchanged sample's)."""
    src = SAMPLES["nccl_plugin"][0]
    text = src.read_text()
    at = text.index('"ts": ', text.index('"ph": "b"', text.index('"cat": "P2P"')))  # the first P2P begin's time
    end = text.index(",", at)
    p = tmp_path / "plugin.txt"
    p.write_text(text[:at] + '"ts": 1e309' + text[end:])
    plain = collective_parser_for(READERS["nccl_plugin"]).read(src)
    got = collective_parser_for(READERS["nccl_plugin"]).read(p)
    assert got.rows.height == plain.rows.height > 0
    assert got.rows["start_ns"].null_count() == plain.rows["start_ns"].null_count() + 1
