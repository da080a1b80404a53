"""A job's own settings, ``tracelens.toml`` in the folder of its traces.

Traces often lack what MFU needs: many carry no ``deviceProperties`` (the GPU is unknown to
any tool reading them), and a model's FLOPs may be known better to its authors than from the
recorded shapes.  Instead of repeating ``--gpu A100`` on every command, a job folder can say
it once, with the evidence in a comment::

    # kernels are cutlass_80_* (sm_80): an A100; the traces carry no deviceProperties
    gpu = "A100"

Every report says where such a value came from (``mfu.gpu_source``, and on screen "GPU given
in .../tracelens.toml"), so a number built on it is never passed off as read from the trace.
A flag given on the command line wins over the file.  The file is looked up in the directory
given (``tracelens report runs/job42/``), or beside the files given when they all lie in one
folder; ``--config FILE`` names one elsewhere, ``--config none`` ignores it.
"""

from __future__ import annotations

import math
from pathlib import Path

from tracelens.model.errors import UsageError


class SettingsError(UsageError):
    """A job settings file that cannot be used (unreadable, not TOML, an unknown key, a value of
    the wrong type or out of range): a usage error like the flag of the same name (exit 2), whose
    one line names the file and the key."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


FILENAME = "tracelens.toml"
MAX_BYTES = 64 * 1024  # a settings file, not data: anything larger is refused unread

# key -> (accepted types, meaning); the keys are the analysis options of the same name
KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "gpu": ((str,), "the GPU's name in the peak table (e.g. 'H100 SXM', 'A100', 'MI300X')"),
    "peak_tflops": ((int, float), "reference dense peak in TFLOP/s"),
    "model_flops_per_step": ((int, float), "model FLOPs of one step per GPU"),
    "params": ((int, float), "non-embedding parameters (model FLOPs = 6·N·T)"),
    "tokens_per_step": ((int, float), "tokens one GPU processes per step"),
    "seq_len": ((int,), "sequence length (attention term, with layers and hidden)"),
    "layers": ((int,), "transformer layers"),
    "hidden": ((int,), "hidden size"),
    "step_range": ((str,), "regex: host ranges to use as steps"),
    "data_range": ((str,), "regex: host ranges that load data"),
    "prefer": ((str,), "the source of a rank recorded both ways: 'kineto' (default: op shapes, FLOPs) or 'nsys'"),
}
CHOICES = {"prefer": ("kineto", "nsys")}  # the settings that take one of a few words
# the settings (and the CLI's flags of the same names) that must be finite and positive
POSITIVE = ("peak_tflops", "model_flops_per_step", "params", "tokens_per_step", "seq_len", "layers", "hidden")


def find(paths: list[str]) -> Path | None:
    """The settings file of the job named by ``paths``: in the one directory given, or beside
    the files given when they all lie in one folder; None when there is none."""
    if not paths:
        return None
    try:
        folders = {Path(p) if Path(p).is_dir() else Path(p).parent for p in paths}
        if len(folders) != 1:
            return None
        candidate = folders.pop() / FILENAME
        return candidate if candidate.is_file() else None
    except OSError:  # a path that cannot be reached: loading it says so
        return None


def read(path: str | Path) -> dict[str, object]:
    """The settings in ``path``, checked: SettingsError naming the file and the key on an
    unreadable file, bad TOML, an unknown key or a value of the wrong type."""
    import tomllib  # here: ~5 ms that a job without a settings file does without

    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise SettingsError(str(path), f"cannot read the job settings ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise SettingsError(str(path), f"job settings file larger than {MAX_BYTES // 1024} KB")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SettingsError(str(path), "job settings are not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(str(path), f"job settings are not valid TOML ({e})") from None
    out: dict[str, object] = {}
    for key, value in data.items():
        if key not in KEYS:
            known = ", ".join(KEYS)
            raise SettingsError(str(path), f"unknown job setting {key!r} (known: {known})")
        types, meaning = KEYS[key]
        if isinstance(value, bool) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise SettingsError(str(path), f"job setting {key!r} must be {want} ({meaning}), not {type(value).__name__}")
        if key in POSITIVE and not (math.isfinite(value) and value > 0):
            raise SettingsError(str(path), f"job setting {key!r} must be positive, not {value!r}")
        if isinstance(value, str) and not value.strip():
            raise SettingsError(str(path), f"job setting {key!r} is empty")
        if key in CHOICES and value not in CHOICES[key]:
            raise SettingsError(str(path), f"job setting {key!r} must be one of {', '.join(map(repr, CHOICES[key]))}, not {value!r}")
        out[key] = float(value) if float in types else value
    return out


def resolve(paths: list[str], flags: dict[str, object], config: str | None = None) -> tuple[dict[str, object], tuple[tuple[str, str], ...]]:
    """The analysis options of a job: ``flags`` (the command line's values, None where unset)
    filled from the settings file (``config``; None: ``tracelens.toml`` beside ``paths``;
    "none": no file), and where each given option came from, as ``(key, "--flag" or path)``."""
    values = {k: v for k, v in flags.items() if v is not None}
    given = {k: "--" + k.replace("_", "-") for k in values}
    if config is not None and config.lower() == "none":
        path = None
    elif config is not None:
        path = Path(config)
    else:
        path = find(paths)
    if path is not None:
        for key, value in read(path).items():
            if key not in values:
                values[key] = value
                given[key] = str(path)
    return values, tuple(sorted(given.items()))
