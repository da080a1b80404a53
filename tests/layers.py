"""An import-linter contract type: the layers contract, also seeing imports of ``tracelens.parsers``.

The parsers live in the repository's top-level ``parsers/`` folder and are imported as
``tracelens.parsers`` (tracelens/__init__.py maps the name in a checkout; the wheel installs the
folder there).  grimp builds its graph from the folders on disk, where ``tracelens/parsers`` does
not exist, so it drops those imports.  This contract adds them back as imports of ``parsers``
(read from each module's source with ``ast``) before the layers are checked, so that a model
module that imports a parser fails the build like any other upward import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from importlinter.contracts.layers import LayersContract

ROOT = Path(__file__).resolve().parents[1]
ALIAS = "tracelens.parsers"


def _source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def parser_imports(module: str, graph_modules: set[str]) -> set[str]:
    """The ``parsers`` modules that ``module`` imports under the name ``tracelens.parsers``."""
    path = _source(module)
    if path is None:
        return set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n == ALIAS or n.startswith(ALIAS + "."):
                target = "parsers" + n[len(ALIAS):]
                while target not in graph_modules and "." in target:  # "from tracelens.parsers import sniff"
                    target = target.rsplit(".", 1)[0]
                found.add(target)
    return found


class LayersWithParsers(LayersContract):
    def check(self, graph, verbose):
        modules = set(graph.modules)
        for m in sorted(modules):
            if m.startswith("tracelens"):
                for target in parser_imports(m, modules):
                    graph.add_import(importer=m, imported=target, line_number=0, line_contents=f"import {ALIAS} (as {target})")
        return super().check(graph, verbose)
