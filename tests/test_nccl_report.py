"""``tracelens report`` on NCCL records alone (a directory of NCCL logs or Flight Recorder dumps):
the report dict v1 with ``job.nccl_diagnosis`` and ``job.nccl`` (valid against the schema), the
one-screen verdict in the text report; hang and mismatch verdicts from logs one file per rank or
all ranks in one; bad input (cut, interleaved, runs mixed) gives warnings, never a traceback;
hypothesis fuzz of both parsers (arbitrary bytes, mutated real samples)."""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

import jsonschema
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers import sniff
from parsers.nccl import flight_recorder as fr
from parsers.nccl import log
from tests.conftest import ROOT, real_traces
from tests.test_nccl_log import rank_lines
from tracelens import cli
from tracelens.analysis.job.hang import diagnose
from tracelens.model.errors import EXIT_OK, ParseError
from tracelens.model.nccl import NCCL_ROW_SCHEMA

NCCL = real_traces() / "nccl"
SCHEMA = json.loads((ROOT / "tracelens/model/report.schema.json").read_text())


def report(capsys, tmp_path, *paths, out="r.json"):
    o = tmp_path / out
    code = cli.main(["report", "--no-cache", *map(str, paths), "-o", str(o)])
    _, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err.strip().splitlines(), o


def per_rank_logs(d: Path, world: int = 4, **kw) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        lines = rank_lines(r, world, ops=4, skip_last=(r == kw.get("skip")))
        if r == kw.get("odd"):
            lines = [ln.replace("AllReduce: opCount 2 ", "AllGather: opCount 2 ") for ln in lines]
        (d / f"nccl.node01.{4000 + r}.log").write_text("\n".join(lines) + "\n")
    return d


def test_real_logs_and_dumps_directories(capsys, tmp_path):
    for src, fmt in ((NCCL / "logs", "nccl_log"), (NCCL / "flight_recorder", "flight_recorder")):
        code, err, o = report(capsys, tmp_path, src)
        assert code == EXIT_OK, err
        d = json.loads(o.read_text())
        jsonschema.Draft202012Validator(SCHEMA).validate(d)
        assert {i["format"] for i in d["inputs"]} == {fmt} and d["ranks"] == [] and d["job"]["ranks"] == 0
        assert d["job"]["nccl_diagnosis"]["verdict"] in ("ok", "hang", "incomplete_inputs")
    # the TensorFlow hang of NVIDIA/nccl#203: device 1 is at opCount 0x1d, device 0 still at 0x1c
    v = json.loads(report(capsys, tmp_path, NCCL / "logs" / "nccl-issue203_tensorflow_allreduce_coll_2gpu.log")[2].read_text())
    v = v["job"]["nccl_diagnosis"]
    assert v["verdict"] == "hang" and v["culprits"] == ["gpu1:13135[0]"] and "never entered seq 29" in v["summary"]
    wd = json.loads(report(capsys, tmp_path, NCCL / "logs")[2].read_text())["job"]["nccl_diagnosis"]["watchdog"]
    assert [(w["rank"], w["seq"], w["last_completed"]) for w in wd] == [(4, 27732, 27731)]
    code, err, o = report(capsys, tmp_path, NCCL / "flight_recorder", out="r.txt")
    text = o.read_text()
    assert code == EXIT_OK and text.splitlines()[1].startswith("NCCL verdict: consistent") and "Flight Recorder 2.10" in text


def test_hang_and_mismatch_verdicts_from_logs(capsys, tmp_path):
    code, err, o = report(capsys, tmp_path, per_rank_logs(tmp_path / "hang", skip=3))
    d = json.loads(o.read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(d)
    v = d["job"]["nccl_diagnosis"]
    assert code == EXIT_OK and v["verdict"] == "hang" and v["culprits"] == [3], v
    assert v["groups"][0]["behind"] == [{"member": 3, "rank": 3, "last_seq": 2}] and v["groups"][0]["waiting_for"]["seq"] == 3
    comms = d["job"]["nccl"]["communicators"]
    assert len(comms) == 4 and {c["comm_id"] for c in comms} == {"0x9ad9a6b1c2d3e4f5"}
    code, err, o = report(capsys, tmp_path, per_rank_logs(tmp_path / "odd", odd=2), out="r.txt")
    text = o.read_text()
    assert "NCCL verdict: MISMATCH: at seq 2" in text and "likely culprit(s): 2" in text and "(collective)" in text, text
    assert "communicators (4):" in text
    # the same job as one interleaved mpirun log
    lines = [f"[1,{r}]<stdout>:" + ln for r in range(4) for ln in rank_lines(r, 4, ops=4, skip_last=(r == 1))]
    one = tmp_path / "one" / "job.log"
    one.parent.mkdir()
    one.write_text("\n".join(lines[i] for i in sorted(range(len(lines)), key=lambda i: (i % 7, i))) + "\n")
    v = json.loads(report(capsys, tmp_path, one)[2].read_text())["job"]["nccl_diagnosis"]
    assert v["verdict"] == "hang" and v["culprits"] == [1]


def test_bad_input_gives_warnings_with_counts(capsys, tmp_path):
    d = per_rank_logs(tmp_path / "bad")
    f = d / "nccl.node01.4001.log"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 30])  # cut mid-line
    g = d / "nccl.node01.4002.log"
    lines = g.read_text().splitlines()
    g.write_text("\n".join(lines[:5] + [lines[5][:33] + lines[6], "!! unrelated output", "\x00\xff"] + lines[7:]) + "\n")
    (d / "README.md").write_text("notes\n")
    (d / "rank_0").write_bytes(b"\x80\x04\x95garbage entries")  # a cut pickle
    code, err, o = report(capsys, tmp_path, d)
    assert code == EXIT_OK, err
    text = "\n".join(err)
    assert "interleaved" in text and "neither NCCL's nor PyTorch's watchdog" in text and "rank_0: skipped (not a readable pickle" in text
    assert "1 file(s) beside the NCCL records are not traces" in text


def test_dumps_of_two_runs_mixed_are_said(tmp_path):
    a = fr.read(NCCL / "flight_recorder" / "fr_gloo_rank_0.json", file=0).rows
    b = fr.read(NCCL / "flight_recorder" / "fr_gloo_rank_0.json", file=1).rows  # another input claims rank 0
    v = diagnose(pl.concat([a, b]))
    assert any("come from two inputs" in w for w in v["warnings"])


def test_sniff_names_both_formats(tmp_path):
    assert sniff(NCCL / "flight_recorder" / "fr_gloo_rank_0.json") == "flight_recorder"
    assert all(sniff(p) == "nccl_log" for p in (NCCL / "logs").glob("*.log"))
    p = tmp_path / "rank_1"
    p.write_bytes(pickle.dumps(json.loads((NCCL / "flight_recorder" / "fr_gloo_rank_1.json").read_bytes())))
    assert sniff(p) == "flight_recorder"


# ---------------------------------------------------------------------------------------------
# fuzz: any bytes give rows of the schema (logs) or rows / a ParseError (dumps), never another exception

SEED_LOG = b"".join(p.read_bytes() for p in sorted((NCCL / "logs").glob("*.log")))[:6000]
SEED_FR = (NCCL / "flight_recorder" / "fr_gloo_rank_0.json").read_bytes()
SEED_PKL = pickle.dumps(json.loads(SEED_FR))


def _mutate(seed: bytes, cuts: list[tuple[int, int, bytes]]) -> bytes:
    b = bytearray(seed)
    for at, n, ins in cuts:
        at %= max(len(b), 1)
        b[at:at + n] = ins
    return bytes(b)


MUT = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40), st.binary(max_size=20)), max_size=6)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _log(data: bytes):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.log"
        p.write_bytes(data)
        got = log.read(p)
        assert dict(got.rows.schema) == NCCL_ROW_SCHEMA and isinstance(got.facts["unknown_lines"], int)
        diagnose(got.rows)


def _dump(data: bytes):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "rank_0"
        p.write_bytes(data)
        try:
            got = fr.read(p)
        except ParseError as e:
            assert e.problem and "\n" not in e.problem
            return
        assert dict(got.rows.schema) == NCCL_ROW_SCHEMA
        diagnose(got.rows)


@FUZZ
@given(st.binary(max_size=3000))
def test_fuzz_log_arbitrary_bytes(data):
    _log(data)


@FUZZ
@given(MUT)
def test_fuzz_log_mutated_real(cuts):
    _log(_mutate(SEED_LOG, cuts))


@FUZZ
@given(st.binary(max_size=2000))
def test_fuzz_dump_arbitrary_bytes(data):
    _dump(data)
    _dump(b"\x80\x04" + data)


@FUZZ
@given(MUT)
def test_fuzz_dump_mutated_real(cuts):
    _dump(_mutate(SEED_FR, cuts))
    _dump(_mutate(SEED_PKL, cuts))


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                        ["entries", "version", "pg_config", "pg_status", "collective_seq_id", "profiling_name", "input_sizes",
                         "state", "frames", "process_group", "pg_id", "is_p2p", "time_created_ns", "ranks"]), c, max_size=6),
                    max_leaves=30))
def test_fuzz_dump_shapes(doc):
    base = json.loads(SEED_FR)
    if isinstance(doc, dict):
        base.update(doc)
    else:
        base["entries"] = [doc] + base["entries"][:2]
    _dump(pickle.dumps(base))


def _rows(recs):
    """NCCL rows from (member, group, seq, collective, count, state, group_size) tuples."""
    given = [{"file": int(m), "rank": int(m), "group": g, "seq": s, "collective": c, "count": n, "dtype": "Float", "state": st_,
              "group_size": size, "source": "flight_recorder", "member": m, "order": s, "n_parts": 1}
             for m, g, s, c, n, st_, size in recs]
    return pl.DataFrame([{k: r.get(k) for k in NCCL_ROW_SCHEMA} for r in given], schema=NCCL_ROW_SCHEMA)


def test_verdicts_on_rows():
    done = [(m, "0", s, "allreduce", 4, "completed", 3) for m in "012" for s in (1, 2)]
    stuck = [(m, "0", 3, "allreduce", 4, "started", 3) for m in "012"]
    v = diagnose(_rows(done + stuck))
    assert v["verdict"] == "incomplete" and v["culprits"] == [] and v["groups"][0]["not_completed"] == {"seq": 3, "members": [0, 1, 2]}
    v = diagnose(_rows([r for r in done if r[0] != "2"]))
    assert v["verdict"] == "incomplete_inputs" and v["groups"][0]["missing_members"] == 1
    # ring buffers that kept different windows: only the seqs every member holds are compared
    wrapped = [r for r in done if not (r[0] == "1" and r[2] == 1)] + [("0", "0", 0, "allgather", 9, "completed", 3)]
    assert diagnose(_rows(wrapped))["verdict"] == "ok"
    assert diagnose(_rows([]))["verdict"] == "no_collectives"
