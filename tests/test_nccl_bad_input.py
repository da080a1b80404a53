"""Bad NCCL input (issue 19 Must 6): dumps of different runs mixed in one directory (two inputs
claiming one rank, one group with two sizes, sequence ranges that cannot be of one run) are
warnings naming the files; an NCCL version outside 2.4..2.30 is a warning; fuzz on the log parser
(real lines interleaved mid-line, launchers' prefixes mixed) and on the Flight Recorder parser (a
real dump with a wrong type in each field of an entry and at the top): a result with counted
warnings, or a one-line TraceInputError, never another exception."""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.nccl import flight_recorder as fr
from parsers.nccl import log
from tests.conftest import real_traces
from tests.test_nccl_log import PREFIXES, rank_lines
from tests.test_nccl_report import _rows
from tracelens.analysis.job.hang import diagnose
from tracelens.analysis.nccl import analyze_nccl
from tracelens.model.errors import TraceInputError
from tracelens.model.nccl import NCCL_ROW_SCHEMA
from tracelens.store.nccl import nccl_only

FR = real_traces() / "nccl" / "flight_recorder"
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def test_two_dumps_claiming_one_rank_are_named(tmp_path):
    for run in ("run_a", "run_b"):
        (tmp_path / run).mkdir()
        shutil.copy(FR / "fr_gloo_rank_0.json", tmp_path / run / "rank_0")
    shutil.copy(FR / "fr_gloo_rank_1.json", tmp_path / "run_a" / "rank_1")
    d = analyze_nccl(*nccl_only([tmp_path]))
    said = [w for w in d["warnings"] if "is claimed by 2 inputs" in w]
    # rank 0 is in both of the real dump's groups ("0" and "1")
    assert len(said) == 2 and all(str(tmp_path / "run_a" / "rank_0") in w and str(tmp_path / "run_b" / "rank_0") in w for w in said)


def test_group_sizes_and_sequence_ranges_of_two_runs():
    # member 0 (file 0): seqs 1-3 of a group of 2; member 1 (file 1): seqs 10-12 of it, recorded as a group of 3
    rows = _rows([("0", "0", s, "allreduce", 4, "completed", 2) for s in (1, 2, 3)]
                 + [("1", "0", s, "allreduce", 4, "completed", 3) for s in (10, 11, 12)])
    w = diagnose(rows, ["a/rank_0", "b/rank_1"])["warnings"]
    assert "group 0 has 2 sizes in the inputs: 2 in a/rank_0; 3 in b/rank_1 — dumps or logs of different runs mixed together" in w
    assert any(x.startswith("group 0: member 1 (b/rank_1) holds seq 10..12, all after member 0's last one 3 (a/rank_0)") for x in w)
    # one run: overlapping ranges, one size: none of these
    ok = _rows([(m, "0", s, "allreduce", 4, "completed", 2) for m in "01" for s in (1, 2, 3)])
    assert diagnose(ok, ["a", "b"])["warnings"] == []


@pytest.mark.parametrize("version, unknown", [("2.21.5+cuda12.4", False), ("2.4.8", False), ("2.30.1", False), ("2.3.7", True),
                                              ("2.31.0", True), ("3.0.0", True)])
def test_unknown_nccl_version_is_a_warning(tmp_path, version, unknown):
    lines = rank_lines(0, world=1)
    lines[0] = f"NCCL version {version}"
    p = tmp_path / "x.log"
    p.write_text("\n".join(lines) + "\n")
    got = log.read(p)
    assert got.rows.height == 3 and got.facts["nccl_version"] == version
    assert any(f"NCCL version {version} is outside the versions" in w for w in got.warnings) == unknown


# --- fuzz ------------------------------------------------------------------------------------

LINES = [PREFIXES[k](r) + ln for r in range(3) for k in sorted(PREFIXES) for ln in rank_lines(r, world=3)[:14:3]]


def _log(text: bytes):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.log"
        p.write_bytes(text)
        got = log.read(p)
        assert dict(got.rows.schema) == NCCL_ROW_SCHEMA
        assert all(isinstance(w, str) and "\n" not in w for w in got.warnings)
        assert got.facts["lines"] >= got.facts["unknown_lines"] >= 0
        diagnose(got.rows)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(LINES), st.integers(0, 200), st.sampled_from(LINES)), min_size=1, max_size=40))
def test_fuzz_log_lines_interleaved_mid_line_with_prefixes_mixed(picks):
    # each line: another line's text run into it at some column (two ranks writing one file), prefixes of every launcher
    _log("\n".join(a[:cut] + b for a, cut, b in picks).encode())


WRONG = [None, "x", [[None]]]
BASE = json.loads((FR / "fr_gloo_rank_0.json").read_text())


def _dump(doc) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "rank_0"
        p.write_bytes(pickle.dumps(doc))
        try:
            got = fr.read(p)
        except TraceInputError as e:
            assert e.problem and "\n" not in str(e.problem)
            return
        assert dict(got.rows.schema) == NCCL_ROW_SCHEMA and all("\n" not in w for w in got.warnings)
        diagnose(got.rows)


def test_dump_with_a_wrong_type_in_every_field():
    # every key of an entry and of the document, each wrong value in turn (systematic: ~30 keys x 3 values)
    for key in sorted(BASE["entries"][0]):
        for bad in WRONG:
            doc = json.loads(json.dumps(BASE))
            doc["entries"][1][key] = bad
            _dump(doc)
    for key in sorted(BASE):
        for bad in WRONG:
            doc = json.loads(json.dumps(BASE))
            doc[key] = bad
            _dump(doc)


@pytest.mark.parametrize("bad", ["x", 2**70, 1.5, [1]])
def test_a_wrong_sequence_id_costs_that_entry_only(tmp_path, bad):
    doc = json.loads(json.dumps(BASE))
    doc["entries"][1]["collective_seq_id"] = bad
    p = tmp_path / "rank_0"
    p.write_bytes(pickle.dumps(doc))
    got = fr.read(p)
    # the real dump's 6 entries: seqs 1..5 of group 0, 1 of group 1; the second one (seq 2) lost, the others kept
    assert got.rows.height == len(BASE["entries"]) - 1 == 5 and "1 entr(ies) without a sequence id (skipped)" in got.warnings
    assert got.rows.filter(pl.col("group") == "0")["seq"].to_list() == [1, 3, 4, 5]
