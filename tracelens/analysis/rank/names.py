"""A rank's distinct event names, and the name tests run on them.

The ``name`` column is Categorical: casting it to String copies every row's name, and a regex
over that copy costs milliseconds per test on a 35 MB trace.  A rank has a few hundred distinct
names, so each pattern is matched once per distinct name and the rows are tested with ``is_in``
on the Categorical (which compares categories).  Same rows as ``name.cast(String).str.contains``:
a null name matches nothing either way."""

from __future__ import annotations

import polars as pl


class Names:
    """The distinct names of ``frame``'s ``name`` column (computed once), and expressions testing
    a row's name against a regex through them."""

    def __init__(self, frame: pl.DataFrame):
        self.distinct = frame.get_column("name").unique().cast(pl.String).drop_nulls()
        self._found: dict[str, pl.Series] = {}

    def matching(self, pattern: str) -> pl.Series:
        """The distinct names that ``pattern`` (a regex, as ``str.contains``) finds, as a String Series."""
        if pattern not in self._found:
            self._found[pattern] = self.distinct.filter(self.distinct.str.contains(pattern))
        return self._found[pattern]

    def prefetch(self, patterns) -> None:
        """``matching`` of each of ``patterns`` at once, in one query over the distinct names (a
        query per pattern costs more in polars' fixed overhead than the regexes cost): the
        per-rank analysis asks for a dozen or two patterns, each once."""
        todo = list(dict.fromkeys(p for p in patterns if p not in self._found))
        if not todo:
            return
        n = pl.col("name")
        found = self.distinct.alias("name").to_frame().select(
            *(n.filter(n.str.contains(p)).implode().alias(str(i)) for i, p in enumerate(todo)))
        for i, p in enumerate(todo):
            self._found[p] = found.get_column(str(i))[0].alias(self.distinct.name)

    def like(self, pattern: str, column: str = "name") -> pl.Expr:
        """Whether ``column`` (a name column, Categorical or String) is one that ``pattern`` finds."""
        return pl.col(column).is_in(self.matching(pattern).implode())


def of(frame: pl.DataFrame, names: Names | None) -> Names:
    """``names`` when the caller has them (the rank's, once per rank), else ``frame``'s."""
    return names if names is not None else Names(frame)
