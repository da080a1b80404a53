"""tracelens: where the GPU time of a training job went.

The Python API (lazy: ``import tracelens`` imports neither polars nor Textual; each function
imports what it needs when first called)::

    import tracelens

    job = tracelens.open_job(["runs/job42/"])        # a Job: the parsed ranks (through the parse cache)
    analysis = tracelens.analyze(job)                 # an Analysis: plain frozen data
    report = analysis.to_dict()                       # the versioned report dict (DESIGN.md 5)
    html = tracelens.render(analysis, "html")         # bytes: "html", "json" or "text"
    events = job.events(rank=0, window=(t0, t1))      # a polars.LazyFrame of one rank's events
"""

from __future__ import annotations

import sys as _sys
from importlib.machinery import PathFinder as _PathFinder
from pathlib import Path as _Path

__version__ = "0.1.0"

_HERE = _Path(__file__).resolve().parent


class _SourceTreeParsers:
    """``tracelens.parsers`` in a source checkout.

    The repository keeps the parsers in its top-level ``parsers/`` folder (the design card's
    layout) and the wheel installs that folder as ``tracelens/parsers/``, so the distribution
    claims no generic top-level name.  Code imports them as ``tracelens.parsers`` either way;
    in a checkout, where ``tracelens/parsers/`` does not exist, this finder maps that one name
    onto the folder beside the package (it is consulted after the normal path search)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "tracelens.parsers":
            return None
        return _PathFinder.find_spec(name, [str(_HERE.parent)])


if not (_HERE / "parsers").is_dir() and (_HERE.parent / "parsers" / "__init__.py").is_file():
    _sys.meta_path.append(_SourceTreeParsers)


__all__ = ["__version__", "open_job", "analyze", "render", "Options"]
# the public API, imported when first used (tracelens.api; tracelens.render is the callable package)
_API = {"open_job": "tracelens.api", "analyze": "tracelens.api", "render": "tracelens.render", "Options": "tracelens.model.options"}


def __getattr__(name: str):
    if name in _API:
        import importlib

        module = importlib.import_module(_API[name])
        return module if name == "render" else getattr(module, name)
    raise AttributeError(f"module 'tracelens' has no attribute {name!r}")
