"""PyTorch Flight Recorder dumps (FORMATS.md 6) -> collective rows, one per recorded entry.

A dump is a pickle (``_dump_fr_trace``, the watchdog's ``TORCH_NCCL_DUMP_ON_TIMEOUT`` files) or
JSON (``_dump_fr_trace_json``) of ``{version, pg_config, pg_status, entries, ...}``, one file per
rank (the rank is the number the file name ends with: ``rank_3``, ``nccl_trace_rank_3``).  A
pickle is read by a restricted unpickler that admits only what such a dump holds: builtin
containers and scalars, built by pickle's own opcodes.  A pickle that names any class or function
(which is how a malicious pickle runs code, e.g. a ``__reduce__`` that calls ``os.system``) is
refused before anything of it runs.

Per entry: ``seq`` is ``collective_seq_id`` (``p2p_seq_id`` for point-to-point; ``seq_id`` in older
dumps, which have neither), the group the
process group's name (``group_desc`` its description), ``state`` the entry's, raised to
``completed`` where the group's ``pg_status`` says that sequence number completed (gloo leaves
entries ``scheduled``), ``count``/``out_count`` the elements of its input/output tensors,
``start_ns`` its enqueue time (``time_created_ns``), ``end_ns`` when the watchdog saw it complete.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import polars as pl

from tracelens.model.collectives import COLLECTIVE_ALIASES
from tracelens.model.errors import ParseError
from tracelens.model.nccl import NCCL_ROW_SCHEMA, NcclParse

NAME = "flight_recorder"
PARSER_VERSION = "1"
MAX_BYTES = 1 << 30  # a dump holds at most the ring buffer's entries
MAX_RANKS_TEXT = 1 << 24  # of a group's "ranks" string, read


class _Refused(Exception):
    pass


class _DumpUnpickler(pickle.Unpickler):
    """Builds builtin containers and scalars only: every class or function a pickle names is refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        raise _Refused("a persistent id")


def _oneline(e: Exception) -> str:
    return str(e).encode("unicode_escape").decode("ascii")[:80]


def load_pickle(data: bytes, path: str) -> object:
    try:
        return _DumpUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise ParseError(path, f"refused: the pickle names {e} (a Flight Recorder dump holds only builtin "
                               "containers and scalars; tracelens never runs a pickle's code)") from None
    except Exception as e:  # a cut or corrupt pickle: anything the unpickler raises
        raise ParseError(path, f"not a readable pickle ({type(e).__name__}: {_oneline(e)})") from None


def _load(path: Path) -> dict:
    with open(path, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ParseError(str(path), "larger than any Flight Recorder dump (1 GiB)")
    if data[:1] == b"\x80":
        doc = load_pickle(data, str(path))
    else:
        import orjson

        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise ParseError(str(path), f"not valid JSON ({_oneline(e)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise ParseError(str(path), "not a Flight Recorder dump (no 'entries' list)")
    return doc


_ENTRY_SCHEMA = {
    "record_id": pl.Int64, "pg_id": pl.Int64, "process_group": pl.List(pl.String), "collective_seq_id": pl.Int64, "seq_id": pl.Int64,
    "p2p_seq_id": pl.Int64, "op_id": pl.Int64, "profiling_name": pl.String, "time_created_ns": pl.Int64,
    "time_discovered_started_ns": pl.Int64, "time_discovered_completed_ns": pl.Int64, "duration_ms": pl.Float64,
    "input_sizes": pl.List(pl.List(pl.Int64)), "output_sizes": pl.List(pl.List(pl.Int64)),
    "input_dtypes": pl.List(pl.String), "output_dtypes": pl.List(pl.String), "state": pl.String, "is_p2p": pl.Boolean,
    "frames": pl.List(pl.Struct({"name": pl.String, "filename": pl.String, "line": pl.Int64})),
}
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")


def _clean(entries: list) -> tuple[list[dict], int]:
    """Entries that are dicts, each value of the type its column takes (else None); how many were dropped.
    One pass over the entries (a ring buffer: bounded by TORCH_FR_BUFFER_SIZE)."""
    kept = [e for e in entries if isinstance(e, dict)]
    return kept, len(entries) - len(kept)


_INT_KEYS = tuple(k for k, t in _ENTRY_SCHEMA.items() if t == pl.Int64)


def _int_or_none(v):
    return v if type(v) is int and -(2**63) <= v < 2**63 else None


def _frame(entries: list[dict]) -> pl.DataFrame:
    # an integer field of another type or out of range: that value null, not the column (polars' non-strict
    # conversion nulls a whole column for one string in it); one pass, the entries are a bounded ring buffer
    entries = [e if all(_int_or_none(e.get(k)) is not None or e.get(k) is None for k in _INT_KEYS)
               else {**e, **{k: _int_or_none(e.get(k)) for k in _INT_KEYS}} for e in entries]
    try:
        return pl.from_dicts(entries, schema=_ENTRY_SCHEMA, strict=False)
    except Exception:  # values of unexpected shapes: the columns that do convert, one at a time
        cols = {}
        for k, t in _ENTRY_SCHEMA.items():
            try:
                cols[k] = pl.from_dicts([{k: e.get(k)} for e in entries], schema={k: t}, strict=False)[k]
            except Exception:
                cols[k] = pl.Series(k, [None] * len(entries), dtype=t)
        return pl.DataFrame(cols)


def _elements(col: str) -> pl.Expr:
    return pl.col(col).list.eval(pl.element().list.eval(pl.element().cum_prod()).list.last().fill_null(1)).list.sum()


def read(path: str | Path, file: int = 0, rank: int | None = None) -> NcclParse:
    path = Path(path)
    doc = _load(path)
    warnings: list[str] = []
    version = str(doc.get("version", ""))
    if not version.startswith("2."):
        warnings.append(f"Flight Recorder format version {version or '(none)'} is not a 2.x one: read as 2.x")
    entries, dropped = _clean(doc["entries"])
    if dropped:
        warnings.append(f"{dropped} entr(ies) are not records (skipped)")
    if rank is None:
        m = _RANK_IN_NAME.search(path.name)
        rank = int(m.group(1)) if m and len(m.group(1)) < 9 else None
    if rank is None:
        warnings.append("the file name ends with no rank number: rank unknown (file order used)")
    pg_sizes: dict[str, int] = {}
    pg_desc: dict[str, str] = {}
    pg_ranks: dict[str, list[int]] = {}  # the global ranks of each group (pg_config's "ranks": "[0, 2]")
    cfg = doc.get("pg_config")
    if isinstance(cfg, dict):
        for key, pg in cfg.items():  # one per process group this rank belongs to
            if isinstance(pg, dict):
                ranks = str(pg.get("ranks", ""))
                listed = [int(x) for x in re.findall(r"-?\d+", ranks[:MAX_RANKS_TEXT]) if len(x) < 10]
                n = len(listed)
                name = str(pg.get("name", key))
                if n and name:
                    pg_sizes[name] = n
                    pg_ranks[name] = listed
                if name and pg.get("desc"):
                    pg_desc[name] = str(pg["desc"])
    status_rows = []
    status = doc.get("pg_status")
    if isinstance(status, dict):
        for pg_id, st in status.items():
            if isinstance(st, dict):
                status_rows.append({"pg_id": str(pg_id), "done": str(st.get("last_completed_collective", "")),
                                    "started": str(st.get("last_started_collective", ""))})
    status_df = pl.DataFrame(status_rows, schema={"pg_id": pl.String, "done": pl.String, "started": pl.String}).with_columns(
        pl.col("pg_id").cast(pl.Int64, strict=False), pl.col("done").cast(pl.Int64, strict=False),
        pl.col("started").cast(pl.Int64, strict=False)).unique("pg_id")
    df = _frame(entries)
    name = pl.col("profiling_name").fill_null("")
    base = name.str.replace(r"^\w+:", "").str.replace(r"\s.*$", "").str.to_lowercase()
    collective = base.replace_strict(COLLECTIVE_ALIASES, default=base.str.replace_all("_", ""), return_dtype=pl.String)
    p2p = pl.col("is_p2p").fill_null(False) | collective.is_in(["send", "recv"])
    # dumps older than collective_seq_id / p2p_seq_id number every entry with ``seq_id``
    cseq = pl.coalesce("collective_seq_id", "seq_id")
    seq = pl.when(p2p).then(pl.coalesce("p2p_seq_id", "seq_id")).otherwise(cseq)
    state = (pl.when(~p2p & pl.col("done").is_not_null() & (cseq <= pl.col("done"))).then(pl.lit("completed"))
             .when(~p2p & pl.col("started").is_not_null() & (cseq <= pl.col("started"))
                   & (pl.col("state").fill_null("scheduled") == "scheduled")).then(pl.lit("started"))
             .otherwise(pl.col("state").fill_null("scheduled")))
    group = pl.col("process_group").list.get(0, null_on_oob=True).fill_null(pl.col("pg_id").cast(pl.String)).fill_null("")
    peer = name.str.extract(r"(\d+)\s*(?:->|<-)\s*(\d+)", 2).cast(pl.Int32, strict=False)
    rows = (
        df.lazy()
        .join(status_df.lazy(), on="pg_id", how="left")
        .with_columns(group.alias("group"))
        .select(
            pl.lit(file, pl.Int32).alias("file"),
            pl.lit(rank, pl.Int32).alias("rank"),
            "group",
            pl.col("process_group").list.get(1, null_on_oob=True)
              .fill_null(pl.col("group").replace_strict(pg_desc, default=None, return_dtype=pl.String)).alias("group_desc"),
            seq.alias("seq"),
            collective.alias("collective"),
            pl.col("time_created_ns").alias("start_ns"),
            pl.when(pl.col("time_discovered_completed_ns") > 0).then(pl.col("time_discovered_completed_ns")).alias("end_ns"),
            pl.lit(None, pl.Int64).alias("bytes"),
            pl.col("group").replace_strict(pg_sizes, default=None, return_dtype=pl.Int32).alias("group_size"),
            pl.lit(True).alias("on_host"),
            pl.lit(None, pl.Int64).alias("exposed_ns"),
            pl.lit(1, pl.Int32).alias("n_parts"),
            pl.lit(NAME).alias("source"),
            pl.lit(None if rank is None else str(rank), pl.String).alias("member"),
            pl.col("profiling_name").alias("op_name"),
            _elements("input_sizes").alias("count"),
            _elements("output_sizes").alias("out_count"),
            pl.col("input_dtypes").list.first().alias("dtype"),
            pl.when(p2p).then(peer).alias("root"),
            pl.lit(None, pl.String).alias("redop"),
            state.alias("state"),
            pl.col("p2p_seq_id").alias("p2p_seq"),
            pl.col("pg_id").cast(pl.String).alias("comm"),
            pl.lit(None, pl.String).alias("host"),
            pl.lit(None, pl.Int64).alias("pid"),
            pl.col("record_id").alias("order"),
            pl.when(pl.col("frames").list.len() > 0).then(
                pl.struct("frames").struct.json_encode().str.strip_prefix('{"frames":').str.strip_suffix("}")).alias("frames"),
        )
        .select([pl.col(k).cast(t) for k, t in NCCL_ROW_SCHEMA.items()])
        .collect()
    )
    bad = rows.select(pl.col("seq").is_null().sum()).item()
    if bad:
        warnings.append(f"{bad} entr(ies) without a sequence id (skipped)")
        rows = rows.filter(pl.col("seq").is_not_null())
    rows = rows.sort("group", "seq", "order", nulls_last=True)
    facts = {
        "fr_version": version or None, "comm_lib_version": str(doc.get("comm_lib_version") or "") or None,
        "entries": len(entries), "process_groups": sorted(rows["group"].unique().to_list()),
        "pg_status": status_df.sort("pg_id").to_dicts(),
        "states": dict(rows.group_by("state").len().sort("state").iter_rows()),
        "has_frames": bool(rows["frames"].is_not_null().any()),
        "rank": rank, "pg_ranks": pg_ranks,
        # the ring buffer kept every entry since the first (record ids from 0): a group this rank has no entry of,
        # it never called (a dump that wrapped, or of active entries only, may have dropped them)
        "from_start": df.height == 0 or df.select(pl.col("record_id").min() == 0).item() is True,
    }
    return NcclParse(str(path), NAME, rows, facts=facts, warnings=warnings)
