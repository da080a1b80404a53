"""The analysis options live in the model layer (``tracelens.model.options``): the store's report
cache keys on them and the command line parses them without importing the analysis (polars)."""

from tracelens.model.options import Options, parse_steps  # noqa: F401 (re-exported)
