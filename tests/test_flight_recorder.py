"""Flight Recorder dumps (parsers/nccl/flight_recorder.py) and the hang/mismatch diagnosis
(tracelens/analysis/job/hang.py) on real dumps: torch on gloo, 2-3 ranks in subprocesses
(tests/fr_recorder.py), dumped the way users take them, a clean run, a real mismatch (one rank
all-gathers, or reduces another size), a real hang (one rank never enters); compared with
PyTorch's own analyser (torch.distributed.flight_recorder) on the same dumps."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import polars as pl
import pytest

from parsers.nccl import flight_recorder as fr
from tests.conftest import real_traces
from tracelens.analysis.job.hang import diagnose
from tracelens.model.errors import ParseError
from tracelens.model.nccl import NCCL_ROW_SCHEMA

torch = pytest.importorskip("torch")
SAMPLES = real_traces() / "nccl" / "flight_recorder"


# ``dumps``: tests/conftest.py (session scope: the NCCL views' tests read the same recording)


def rows_of(d):
    return pl.concat([fr.read(f, file=i).rows for i, f in enumerate(sorted(d.iterdir()))])


def test_shared_samples_json():
    a, b = (fr.read(SAMPLES / f"fr_gloo_rank_{r}.json", file=r) for r in (0, 1))
    assert dict(a.rows.schema) == NCCL_ROW_SCHEMA and a.warnings == []
    assert a.facts["fr_version"] == "2.10" and a.facts["process_groups"] == ["0", "1"] and a.facts["states"] == {"completed": 6}
    r = a.rows
    assert r["rank"].to_list() == [0] * 6 and r.filter(pl.col("group") == "0")["seq"].to_list() == [1, 2, 3, 4, 5]
    assert r.filter(pl.col("group") == "0")["collective"].to_list() == ["allreduce", "allreduce", "allgather", "broadcast", "barrier"]
    assert {"group_desc": "dp_subgroup", "dtype": "BFloat16", "count": 7}.items() <= r.filter(pl.col("group") == "1").row(0, named=True).items()
    assert diagnose(pl.concat([a.rows, b.rows]))["verdict"] == "ok"


def test_real_pickle_dumps_states_frames_and_clean_verdict(dumps):
    got = [fr.read(f, file=i) for i, f in enumerate(sorted(dumps["ok"].iterdir()))]
    assert [g.rows["rank"][0] for g in got] == [0, 1] and all(g.facts["has_frames"] for g in got)
    r = got[0].rows
    assert set(r["state"]) == {"completed"}  # gloo leaves entries scheduled: pg_status says they completed
    frames = json.loads(r["frames"][0])
    assert {"name", "filename", "line"} <= set(frames[0]) and any(f["filename"].endswith("fr_recorder.py") for f in frames)
    d = diagnose(rows_of(dumps["ok"]))
    assert d["verdict"] == "ok" and d["culprits"] == [] and d["groups_checked"] == 2


def test_real_hang_names_the_rank_that_never_entered(dumps):
    for which in ("hang", "json"):
        d = diagnose(rows_of(dumps[which]))
        assert d["verdict"] == "hang" and d["culprits"] == [1], d
        g = d["groups"][0]
        assert g["group"] == "0" and g["behind"] == [{"member": 1, "rank": 1, "last_seq": 4}]
        assert g["waiting_for"]["seq"] == 5 and g["waiting_for"]["members_in_it"] == [0]
        assert "rank 1 never entered seq 5" in d["summary"]
    frames = diagnose(rows_of(dumps["hang"]))["frames"]
    assert frames[0]["frames"][0]["filename"].endswith("fr_recorder.py")  # the caller's frame, torch's own skipped


@pytest.mark.parametrize("which, field, call", [("mismatch", "collective", "gloo:all_gather count 4 Float"),
                                                ("size", "count", "gloo:all_reduce count 2 Float")])
def test_real_mismatch_names_the_odd_rank_and_its_stack(dumps, which, field, call):
    d = diagnose(rows_of(dumps[which]))
    assert d["verdict"] == "mismatch" and d["culprits"] == [2], d
    m = d["first_mismatch"]
    assert m["seq"] == 5 and m["group"] == "0" and m["fields"] == [field] and m["majority"]
    odd = [c for c in m["calls"] if c["members"] == [2]][0]
    assert odd["call"] == call and odd["frames"][0]["filename"].endswith("fr_recorder.py")
    assert "rank 2 differ(s) from the others" in d["summary"]


def _torch_analyser(src, tmp_path, world):
    """Run torch's own analyser on a copy of the dumps with the process groups' config filled in
    (gloo leaves ``pg_config`` empty, which torch's analyser cannot read; an NCCL job's dump has it)."""
    dst = tmp_path / src.name
    dst.mkdir()
    for f in src.iterdir():
        d = fr.load_pickle(f.read_bytes(), str(f))
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))},
                          "1": {"name": "1", "desc": "dp_subgroup", "ranks": str(list(range(0, world, 2)) if world > 2 else [0, 1])}}
        (dst / f.name).write_bytes(pickle.dumps(d))
    r = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dst), "--prefix", "rank_"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return r.stdout + r.stderr


def test_verdicts_agree_with_torchs_analyser(dumps, tmp_path):
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    out = _torch_analyser(dumps["hang"], tmp_path, 2)
    assert "Not all ranks joining collective, sequence number: 5" in out and "missing ranks: {1}" in out, out
    assert diagnose(rows_of(dumps["hang"]))["culprits"] == [1]
    for which, kind in (("mismatch", "COLLECTIVE_TYPE_MISMATCH"), ("size", "SIZE_OR_SYNTAX_MISMATCH")):
        out = _torch_analyser(dumps[which], tmp_path, 3)
        assert "sequence number: 5 has errors" in out and kind in out, out
        # torch blames the ranks that differ from the entry it read first (here rank 2's): 0 and 1;
        # tracelens the rank outside the majority.  Both point at the same collective and field.
        blamed = {int(x) for x in __import__("re").findall(r"Culprit rank (\d+)", out)}
        assert blamed | set(diagnose(rows_of(dumps[which]))["culprits"]) == {0, 1, 2}
    assert "has errors" not in _torch_analyser(dumps["ok"], tmp_path, 2)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    for i, payload in enumerate([_Evil(marker), {"entries": [_Evil(marker)], "version": "2.10"}]):
        f = tmp_path / f"rank_{i}"
        f.write_bytes(pickle.dumps(payload))
        with pytest.raises(ParseError) as e:
            fr.read(f)
        msg = str(e.value)
        assert "refused: the pickle names" in msg and "system" in msg and "\n" not in msg
    assert not marker.exists()
    f = tmp_path / "rank_9"
    f.write_bytes(pickle.dumps({"weights": [1, 2]}))
    with pytest.raises(ParseError, match="not a Flight Recorder dump"):
        fr.read(f)
    f.write_bytes(pickle.dumps({"entries": [], "version": "2.10"})[:-5])
    with pytest.raises(ParseError, match="not a readable pickle"):
        fr.read(f)
