"""tracelens: where the GPU time of a training job went."""

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
