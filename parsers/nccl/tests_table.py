"""nccl-tests output (``all_reduce_perf`` ...; FORMATS.md 4) -> a bandwidth table (``BANDWIDTH_SCHEMA``).

Each data row ``size count type redop [root] | time algbw busbw #wrong | time algbw busbw #wrong``
gives two measurements (out-of-place, in-place).  The variants: no ``root`` column (nccl-tests
before NCCL 2.4), a float ``error`` column instead of the integer ``#wrong`` (before 2.13: its
``wrong`` is null), ``N/A`` (``-c 0``), trailing extra columns, and ``mpirun --tag-output``'s
``[0]`` / ``[1,0]<stdout>:`` before any field.  The header gives the test's ranks (its ``# Rank N``
lines) and the footer the ``Avg bus bandwidth``; a table without its header (an excerpt) has its
ranks inferred from its own busbw / algbw ratio (said in the facts).  NCCL INFO lines in between
are counted, other lines counted as unknown.  Read in bounded batches of lines, regex passes
over each (no Python per line).
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from tracelens.model.nccl import BANDWIDTH_SCHEMA, FULL_BUFFER, NCCL_TYPE_TOKENS, NcclParse, busbw_factor, empty_rows

NAME = "nccl_tests"
PARSER_VERSION = "1"

_TAG = r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>:)?"
_NUM = r"(?:[0-9.]+(?:[eE][-+]?\d+)?|N/A|nan|inf)"
_ROW = (rf"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>[A-Za-z0-9_]+)\s+(?P<redop>[A-Za-z_]+)\s+(?:(?P<root>-?\d+)\s+)?"
        rf"(?P<t1>{_NUM})\s+(?P<a1>{_NUM})\s+(?P<b1>{_NUM})\s+(?P<w1>{_NUM})\s+"
        rf"(?P<t2>{_NUM})\s+(?P<a2>{_NUM})\s+(?P<b2>{_NUM})\s+(?P<w2>{_NUM})(?:\s+\S+)*\s*$")
_RANK = r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+device\s+\d+"
_TEST = r"(?:Collective test (?:starting|concluded):\s*|^#?\s*)(?P<test>[a-z_]+_perf)\b"
_AVG = r"Avg bus bandwidth\s*:\s*(?P<avg>[0-9.eE+-]+)"
_NCCL = r"\bNCCL (?:INFO|WARN|TRACE|ERROR|ABORT)\b|NCCL version"
# nccl-tests' binaries -> the collective they time
TESTS = {
    "all_reduce_perf": "allreduce", "all_gather_perf": "allgather", "reduce_scatter_perf": "reducescatter",
    "broadcast_perf": "broadcast", "reduce_perf": "reduce", "alltoall_perf": "alltoall", "sendrecv_perf": "sendrecv",
    "gather_perf": "gather", "scatter_perf": "scatter", "hypercube_perf": "hypercube",
}


def read(path: str | Path, file: int = 0) -> NcclParse:
    """Read one nccl-tests output.  Never raises for its content."""
    from .log import _batches, _lines

    path = Path(path)
    rows: list[pl.DataFrame] = []
    ranks: set[int] = set()
    tests: list[str] = []
    avgs: list[float] = []
    counts = {"lines": 0, "rows": 0, "nccl_lines": 0, "header_lines": 0, "unknown_lines": 0}
    offset = 0
    cut = None
    for chunk, problem in _batches(path):
        cut = problem or cut
        lines = _lines(chunk, offset)
        offset += lines.height
        lines = lines.with_columns(pl.col("line").fill_null("").str.replace_all(_TAG, " ").alias("line"))
        g = lines.with_columns(pl.col("line").str.extract_groups(_ROW).alias("g")).unnest("g")
        is_row = pl.col("size").is_not_null()
        is_nccl = pl.col("line").str.contains(_NCCL)
        is_head = pl.col("line").str.strip_chars_start().str.starts_with("#") | pl.col("line").str.contains(
            r"^\s*(?:\(B\)|size\s+count|out-of-place|in-place|\s*$)")
        c = g.select(pl.len().alias("lines"), is_row.sum().alias("rows"), (~is_row & is_nccl).sum().alias("nccl_lines"),
                     (~is_row & ~is_nccl & is_head).sum().alias("header_lines"),
                     (~is_row & ~is_nccl & ~is_head).sum().alias("unknown_lines")).row(0, named=True)
        for k in counts:
            counts[k] += int(c[k] or 0)
        head = g.filter(~is_row)
        ranks.update(int(r) for r in head["line"].str.extract(_RANK, 1).drop_nulls().unique().to_list())
        tests.extend(head["line"].str.extract(_TEST, 1).drop_nulls().unique(maintain_order=True).to_list())
        avgs.extend(float(v) for v in head["line"].str.extract(_AVG, 1).drop_nulls().to_list())
        rows.append(g.filter(is_row).drop("line"))
    data = pl.concat(rows) if rows else pl.DataFrame()
    named = [t for t in TESTS if re.search(rf"(?:^|[^a-z]){t}", path.name)]
    test = tests[0] if tests else (named[0] if named else None)
    collective = TESTS.get(test or "", None)
    warnings: list[str] = []
    facts: dict = {"test": test, "lines": counts["lines"], "rows": counts["rows"], "nccl_lines": counts["nccl_lines"],
                   "unknown_lines": counts["unknown_lines"], "avg_busbw_gbps": avgs[-1] if avgs else None}
    nranks = len(ranks) or None
    bw = _blocks(data, str(path), test, collective) if data.height else pl.DataFrame(schema=BANDWIDTH_SCHEMA)
    if nranks is None and bw.height and collective:
        nranks = _infer_nranks(bw, collective)
        facts["nranks_source"] = "inferred from the table's busbw / algbw" if nranks else None
        if nranks:
            warnings.append(f"no '# Rank' header lines: {nranks} ranks inferred from the table's own busbw / algbw")
    elif nranks:
        facts["nranks_source"] = "header"
    facts["nranks"] = nranks
    facts["error_column"] = bool(data.height and data["w1"].str.contains(r"[.eE]").any())
    bw = bw.with_columns(pl.lit(nranks, pl.Int32).alias("nranks")).select(list(BANDWIDTH_SCHEMA))
    bad = _impossible(data) if data.height else 0
    if bad:
        warnings.append(f"{bad} time or bandwidth value(s) of the table are not finite or are negative (inf, nan, -1): left out (null)")
    if collective is None:
        warnings.append("the test (all_reduce_perf ...) is not named in the output or the file name: its collective is unknown")
    if counts["unknown_lines"]:
        warnings.append(f"{counts['unknown_lines']} line(s) are not nccl-tests' nor NCCL's (skipped)")
    if not counts["rows"]:
        warnings.append("no nccl-tests result rows")
    if cut:
        warnings.append(f"the output is cut short ({cut})")
    return NcclParse(str(path), NAME, empty_rows(), facts=facts, warnings=warnings, bandwidth=bw)


def _num(c: str) -> pl.Expr:
    # a time or bandwidth that cannot be true (inf, nan, negative: "1e309", "nan" in a cut or edited table) is null
    v = pl.col(c).cast(pl.Float64, strict=False)
    return pl.when(v.is_finite() & (v >= 0)).then(v)


def _impossible(data: pl.DataFrame) -> int:
    # the table's numbers that _num makes null although they read as numbers
    cols = [c for k in ("1", "2") for c in (f"t{k}", f"a{k}", f"b{k}")]
    v = [pl.col(c).cast(pl.Float64, strict=False) for c in cols]
    return int(data.select(pl.sum_horizontal((x.is_not_null() & ~(x.is_finite() & (x >= 0))).cast(pl.Int64) for x in v).sum()).item() or 0)


def _blocks(data: pl.DataFrame, path: str, test: str | None, collective: str | None) -> pl.DataFrame:
    base = [pl.lit(path).alias("path"), pl.lit(test, pl.String).alias("test"), pl.lit(collective, pl.String).alias("collective"),
            pl.lit(None, pl.Int32).alias("nranks"), pl.col("size").cast(pl.Int64).alias("bytes"),
            pl.col("count").cast(pl.Int64).alias("count"),
            pl.col("type").replace_strict(NCCL_TYPE_TOKENS, default=pl.col("type")).alias("dtype"),
            pl.col("redop").alias("redop"), pl.col("root").cast(pl.Int32, strict=False).alias("root")]
    out = []
    for k, inplace in (("1", False), ("2", True)):
        # an integer #wrong; the old float max-error column and N/A give null
        wrong = pl.when(pl.col(f"w{k}").str.contains(r"^\d+$")).then(pl.col(f"w{k}").cast(pl.Int64, strict=False))
        out.append(data.select(*base, pl.lit(inplace).alias("in_place"), _num(f"t{k}").alias("time_us"),
                               _num(f"a{k}").alias("algbw_gbps"), _num(f"b{k}").alias("busbw_gbps"), wrong.alias("wrong")))
    return pl.concat(out).select([pl.col(k).cast(t) for k, t in BANDWIDTH_SCHEMA.items()])


def _infer_nranks(bw: pl.DataFrame, collective: str) -> int | None:
    """n from the median busbw / algbw of the rows whose algbw has 3 significant digits (>= 1 GB/s):
    2(n-1)/n for AllReduce, (n-1)/n for the full-buffer collectives; None for factor-1 collectives."""
    good = bw.filter(pl.col("algbw_gbps") >= 1.0)
    if not good.height:
        return None
    f = good.select((pl.col("busbw_gbps") / pl.col("algbw_gbps")).median()).item()
    if f is None:
        return None
    if collective == "allreduce" and 1.0 <= f < 2.0:
        n = max(2, round(2 / (2 - f)))
    elif collective in FULL_BUFFER and 0.5 <= f < 1.0:
        n = max(2, round(1 / (1 - f)))
    else:
        return None
    # only when n's factor gives every such row's printed busbw within the rounding of the printed algbw
    factor = busbw_factor(collective, n) or 0.0
    off = good.select(((pl.col("algbw_gbps") * factor - pl.col("busbw_gbps")).abs()
                       > 0.006 * factor + 0.006 + 0.002 * pl.col("busbw_gbps")).any()).item()
    return None if off else n
