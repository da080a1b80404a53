"""A JSON Schema validator for the subset of draft 2020-12 that ``report.schema.json`` uses.

A saved report is untrusted input (``--load``, ``--compare``, ``tracelens open X.json``): it is
checked against the schema, types and not just keys, before any renderer reads it.  The
keywords below are the whole subset; a schema using another one is refused when the validator
is built, so a keyword can never be ignored silently.  Stricter than the standard in one way:
an ``integer`` is a JSON number written without a fraction or exponent (``5``, not ``5.0``),
because the renderers do integer arithmetic on those fields; and a ``number`` is finite.

``Validator(schema).first_error(value)`` is None or ``(path, problem)``, the path written as
``$.ranks[0].device.name``; only the first problem is reported.
"""

from __future__ import annotations

import math
import re
from typing import Any

CHECKED = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "dependentRequired",
    "items", "minItems", "maxItems", "contains", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "pattern", "maxLength", "anyOf", "allOf", "if", "then", "else", "$ref",
}
ANNOTATIONS = {"$schema", "$id", "$defs", "$comment", "title", "description"}
_JSON_TYPE = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


class SchemaError(ValueError):
    """The schema itself uses something this validator does not check."""


def _is(x: Any, t: str) -> bool:
    if t == "integer":
        return type(x) is int
    if t == "number":
        return type(x) is int or (type(x) is float and math.isfinite(x))
    return _JSON_TYPE.get(type(x)) == t


def _eq(a: Any, b: Any) -> bool:
    """JSON equality: true and 1 differ, 1 and 1.0 do not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return type(a) in (int, float) and type(b) in (int, float) and a == b or type(a) is type(b) and a == b


def describe(x: Any) -> str:
    """What a value is, shortly: ``a string ("abc…")``, ``null``, ``an object``."""
    if x is None:
        return "null"
    if isinstance(x, (dict, list)):
        return "an object" if isinstance(x, dict) else "an array"
    if isinstance(x, str):
        return f"a string ({x[:40]!r}{'…' if len(x) > 40 else ''})"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float) and not math.isfinite(x):
        return f"a non-finite number ({x})"
    return f"a number ({x!r})"


def path_text(parts: tuple) -> str:
    """``('ranks', 0, 'device')`` as ``$.ranks[0].device``."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else f"[{p!r}]"
    return out


class Validator:
    def __init__(self, schema: dict[str, Any]):
        self.root = schema
        self._patterns: dict[str, re.Pattern] = {}
        self._check_schema(schema, "#")

    def _check_schema(self, s: Any, where: str) -> None:
        if isinstance(s, bool):
            return
        if not isinstance(s, dict):
            raise SchemaError(f"{where}: a schema must be an object or a boolean")
        unknown = set(s) - CHECKED - ANNOTATIONS
        if unknown:
            raise SchemaError(f"{where}: keyword(s) {', '.join(sorted(unknown))} not supported by tracelens.model.validator")
        if "$ref" in s:
            self._resolve(s["$ref"])
        if "pattern" in s:
            self._patterns[s["pattern"]] = re.compile(s["pattern"])
        for key in ("items", "additionalProperties", "contains", "if", "then", "else"):
            if key in s:
                self._check_schema(s[key], f"{where}/{key}")
        for key in ("properties", "$defs"):
            for name, sub in s.get(key, {}).items():
                self._check_schema(sub, f"{where}/{key}/{name}")
        for key in ("anyOf", "allOf"):
            for i, sub in enumerate(s.get(key, [])):
                self._check_schema(sub, f"{where}/{key}/{i}")

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#/"):
            raise SchemaError(f"$ref {ref!r}: only references inside the schema (#/...) are supported")
        node = self.root
        for part in ref[2:].split("/"):
            if not isinstance(node, dict) or part not in node:
                raise SchemaError(f"$ref {ref!r} points nowhere")
            node = node[part]
        return node

    def first_error(self, value: Any) -> tuple[str, str] | None:
        err = self._first(self.root, value, ())
        return None if err is None else (path_text(err[0]), err[1])

    def _first(self, s: Any, x: Any, at: tuple) -> tuple[tuple, str] | None:  # noqa: C901 (one branch per keyword)
        if s is True:
            return None
        if s is False:
            return at, "not allowed here"
        if "$ref" in s:
            err = self._first(self._resolve(s["$ref"]), x, at)
            if err:
                return err
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            if not any(_is(x, t) for t in types):
                return at, f"expected {' or '.join(types)}, got {describe(x)}"
        if "const" in s and not _eq(x, s["const"]):
            return at, f"expected {s['const']!r}, got {describe(x)}"
        if "enum" in s and not any(_eq(x, e) for e in s["enum"]):
            return at, f"expected one of {', '.join('null' if e is None else repr(e) for e in s['enum'])}; got {describe(x)}"
        if isinstance(x, dict):
            for key in s.get("required", ()):
                if key not in x:
                    return at, f"missing key {key!r}"
            for key, needs in s.get("dependentRequired", {}).items():
                missing = [n for n in needs if n not in x] if key in x else []
                if missing:
                    return at, f"missing key {missing[0]!r} (needed with {key!r})"
            props = s.get("properties", {})
            extra = s.get("additionalProperties", True)
            for key, v in x.items():
                if key in props:
                    err = self._first(props[key], v, (*at, key))
                elif extra is False:
                    return at, f"unexpected key {key!r}"
                else:
                    err = self._first(extra, v, (*at, key))
                if err:
                    return err
        if isinstance(x, list):
            if len(x) < s.get("minItems", 0):
                return at, f"expected at least {s['minItems']} item(s), got {len(x)}"
            if "maxItems" in s and len(x) > s["maxItems"]:
                return at, f"expected at most {s['maxItems']} item(s), got {len(x)}"
            if "items" in s:
                for i, v in enumerate(x):
                    err = self._first(s["items"], v, (*at, i))
                    if err:
                        return err
            if "contains" in s and not any(self._first(s["contains"], v, (*at, i)) is None for i, v in enumerate(x)):
                return at, "no item of the kind this array must hold"
        if _is(x, "number"):
            if "minimum" in s and x < s["minimum"]:
                return at, f"expected a number >= {s['minimum']}, got {x!r}"
            if "maximum" in s and x > s["maximum"]:
                return at, f"expected a number <= {s['maximum']}, got {x!r}"
            if "exclusiveMinimum" in s and x <= s["exclusiveMinimum"]:
                return at, f"expected a number > {s['exclusiveMinimum']}, got {x!r}"
            if "exclusiveMaximum" in s and x >= s["exclusiveMaximum"]:
                return at, f"expected a number < {s['exclusiveMaximum']}, got {x!r}"
        if isinstance(x, str):
            if "maxLength" in s and len(x) > s["maxLength"]:
                return at, f"expected a string of at most {s['maxLength']} characters, got {len(x)}"
            if "pattern" in s and not self._patterns[s["pattern"]].search(x):
                return at, f"expected a string matching {s['pattern']!r}, got {describe(x)}"
        for sub in s.get("allOf", ()):
            err = self._first(sub, x, at)
            if err:
                return err
        if "anyOf" in s:
            errs = []
            for sub in s["anyOf"]:
                err = self._first(sub, x, at)
                if err is None:
                    break
                errs.append(err)
            else:
                return self._any_of_error(s["anyOf"], errs, x, at)
        if "if" in s:
            branch = s.get("then") if self._first(s["if"], x, at) is None else s.get("else")
            if branch is not None:
                err = self._first(branch, x, at)
                if err:
                    return err
        return None

    @staticmethod
    def _any_of_error(subs: list, errs: list, x: Any, at: tuple) -> tuple[tuple, str]:
        """The problem to name when no branch of an anyOf fits: a branch of the value's own type
        failed deeper (that one), or the value has none of the branches' types (all of them)."""
        deeper = [e for e in errs if len(e[0]) > len(at) or not e[1].startswith("expected ")]
        if deeper:
            return max(deeper, key=lambda e: len(e[0]))
        types = [t for sub in subs if isinstance(sub, dict) for t in (sub["type"] if isinstance(sub.get("type"), list)
                                                                     else [sub.get("type", "object" if "$ref" in sub else "?")])]
        if "?" in types:
            return errs[0]
        return at, f"expected {' or '.join(dict.fromkeys(types))}, got {describe(x)}"
