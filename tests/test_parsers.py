"""The parser registry: ``sniff`` names a file's format, ``parser_for`` gives the parser of that
format (a module with NAME, PARSER_VERSION and parse) or says why the format is not analysed;
``parse_file`` goes through it."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from tracelens.parsers import PARSERS, parser_for, sniff

from tests.conftest import real_traces
from tracelens.model.errors import UnsupportedFormat
from tracelens.model.schema import EVENT_SCHEMA

KERNEL = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0, "dur": 5.0, "args": {"device": 0, "stream": 7}}


def test_every_registered_parser_fits_the_protocol():
    for fmt in PARSERS:
        p = parser_for(fmt)
        assert p.NAME == fmt
        assert isinstance(p.PARSER_VERSION, str) and p.PARSER_VERSION
        assert callable(p.parse)


def test_a_kineto_trace_is_sniffed_and_parsed_by_its_parser(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [KERNEL]}).encode()))
    fmt = sniff(path)
    assert fmt == "kineto"
    df, meta = parser_for(fmt).parse(path, keep_python=False, progress=None)
    assert dict(df.schema) == dict(EVENT_SCHEMA)
    assert df.select("kind", "ts_ns", "dur_ns").rows() == [("kernel", 10_000, 5_000)]
    assert meta.format == "kineto" and meta.parser_version == parser_for("kineto").PARSER_VERSION


def test_nsys_is_parsed():
    sqlite = sorted((real_traces() / "nsys").glob("*.sqlite"))[0]
    assert sniff(sqlite) == "nsys"
    parser = parser_for("nsys", sqlite)
    assert parser.NAME == "nsys" and parser.PARSER_VERSION
    df, meta = parser.parse(sqlite)
    assert dict(df.schema) == dict(EVENT_SCHEMA) and meta.format == "nsys" and meta.source == "nsys"


def test_an_unknown_format_is_refused_by_name():
    with pytest.raises(UnsupportedFormat, match="otf2 files are not supported yet"):
        parser_for("otf2")
    with pytest.raises(UnsupportedFormat, match="nccl-tests outputs, which are read on their own"):
        parser_for("nccl_tests")
    with pytest.raises(UnsupportedFormat, match="NCCL logs, which are read on their own"):
        parser_for("nccl_log")  # no event table: read into collective rows (collective_parser_for)


def test_parse_file_uses_the_registry(tmp_path, monkeypatch):
    from tracelens.store.job import parse_file

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [KERNEL]}))
    kineto = parser_for("kineto")
    real, seen = kineto.parse, []

    def fake(p, *, keep_python=False, progress=None):
        seen.append(p)
        return real(p, keep_python=keep_python, progress=progress)

    monkeypatch.setattr(kineto, "parse", fake)
    df, _ = parse_file(path, use_cache=False)
    assert seen == [path] and df.height == 1 and df.get_column("kind").cast(pl.String).to_list() == ["kernel"]
