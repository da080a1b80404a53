"""Record a PyTorch profiler trace the way tracelens needs it, from inside the training script.

::

    import tracelens.torch

    with tracelens.torch.profile("traces/", steps=6) as prof:   # the torch profiler itself
        for batch in loader:
            train_step(batch)
            prof.step()

:func:`profile` builds a ``torch.profiler.profile`` with what the analysis needs:

- activities CPU and CUDA (CUDA only when ``torch.cuda.is_available()``; ROCm builds report
  their GPU as CUDA too), so kernels, launches and copies are in the trace;
- ``record_shapes=True``: model FLOPs are counted from the ops' input shapes;
  ``with_stack=False`` (stacks make traces several times bigger and the analysis does not use them);
- the schedule ``torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1)``: the
  first step (allocator and cuDNN warm-up, compilation) is skipped, the second runs the profiler
  without recording (its own start-up cost), then ``steps`` steps are recorded (default 6:
  the analysis leaves the first recorded step out as warm-up, so 5 are measured).  Call
  ``prof.step()`` once per training step;
- the ``distributedInfo`` metadata (backend, rank, world size) by which the ranks' files are
  joined into one job.  torch adds it when ``torch.distributed`` is initialised as the
  recording starts; when it was initialised later, the handler adds it to the file it writes;
- :func:`trace_handler` as ``on_trace_ready``: one gzip file per rank and cycle, written
  atomically (temporary name, then rename), and one summary line on stdout per cycle.

Files.  The rank is ``torch.distributed.get_rank()`` when the default group is initialised,
else the ``RANK`` environment variable, else 0.  With ``repeat=1`` (the default) each rank
writes ``out_dir/rank-N.json.gz``, so ``out_dir`` is one job: ``tracelens out_dir``.  With
``repeat`` other than 1 (0: keep cycling until the profiler stops) every cycle ``k`` (1, 2, ...)
gets its own folder, ``out_dir/cycle-k/rank-N.json.gz``; each ``cycle-k`` folder is one job
(``tracelens out_dir/cycle-2``; ``tracelens out_dir`` would load every cycle as the same ranks).

The summary line, after each cycle (``summary=False`` turns it off; it costs a load and an
analysis of the file just written, on the training process, about a second for a small trace)::

    tracelens: rank 0 cycle 1: MFU 31.2% of H100 SXM (model FLOPs from shapes); biggest losses: idle: host launch overhead 20.1%, exposed communication 12.0%, non-matmul kernels 8.3%  -> traces/rank-0.json.gz
    tracelens: rank 0 cycle 1: MFU unknown: the trace has no GPU events (CPU-only profile)  -> traces/rank-0.json.gz

The summary never stops the training job: when the analysis fails, one warning line goes to
stderr and the trace file is kept.  A failure to write the trace itself (a full disk) is raised,
as torch's own handlers do.

Keyword arguments for the analysis (``gpu="H100 SXM"``, ``model_flops_per_step=...``,
``peak_tflops=``, ``params=``, ``tokens_per_step=``, ...) are the fields of
:class:`tracelens.analysis.Options` (the CLI's options of the same names), all but ``steps``.

PyTorch is imported only when :func:`profile` or :func:`trace_handler` is called; without it
they raise an ImportError that says ``pip install 'tracelens-mfu[torch]'``.  The CLI never
imports this module.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

__all__ = ["profile", "trace_handler", "summarize", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'tracelens-mfu[torch]'"
TOP_LOSSES = 3  # bars named in the summary line
_HEAD_BYTES = 1 << 20  # where Kineto writes its metadata, before "traceEvents"
_GZIP_LEVEL = 6  # ~as small as 9 and several times faster on traces of hundreds of MB


def _import_torch():
    try:
        import torch
        import torch.profiler
    except ImportError as e:
        raise ImportError(f"tracelens.torch records traces with PyTorch, which is not installed: {INSTALL_HINT}") from e
    return torch


def _analysis_options(analysis: Mapping[str, Any]):
    """``tracelens.analysis.Options`` from the keyword arguments; TypeError on an unknown one,
    at once (not at the end of the first cycle)."""
    from tracelens.analysis import Options

    allowed = sorted(f.name for f in fields(Options) if f.name != "steps")
    bad = sorted(set(analysis) - set(allowed))
    if bad:
        raise TypeError(f"unknown analysis option(s) {', '.join(bad)}; known: {', '.join(allowed)}")
    return Options(**analysis)


def profile(
    out_dir: str | os.PathLike[str],
    steps: int = 6,
    *,
    wait: int = 1,
    warmup: int = 1,
    repeat: int = 1,
    skip_first: int = 0,
    summary: bool = True,
    activities: list[Any] | None = None,
    profiler_kwargs: Mapping[str, Any] | None = None,
    **analysis: Any,
):
    """A ``torch.profiler.profile`` (use it in ``with``; call ``prof.step()`` every step) that
    records ``steps`` steps after ``wait`` skipped and ``warmup`` warm-up steps, ``repeat`` times
    (0: until it stops), and writes ``out_dir/rank-N.json.gz`` (see the module's docstring for
    the files of repeated cycles) with a one-line summary per cycle.

    ``activities`` overrides the CPU (+ CUDA when available) default; ``profiler_kwargs`` are
    passed on to ``torch.profiler.profile`` (``profile_memory=True``, ``with_modules=True``,
    ``experimental_config=...``) and win over the defaults here.  Other keyword arguments go to
    the analysis behind the summary line (``gpu=``, ``model_flops_per_step=``, ...).
    """
    checks = (("steps", steps, 1), ("wait", wait, 0), ("warmup", warmup, 0), ("repeat", repeat, 0), ("skip_first", skip_first, 0))
    for name, value, least in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")
    torch = _import_torch()
    handler = trace_handler(out_dir, summary=summary, cycle_dirs=repeat != 1, **analysis)
    if activities is None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():  # also True on ROCm builds, whose GPU activity is "CUDA"
            activities.append(torch.profiler.ProfilerActivity.CUDA)
    kwargs: dict[str, Any] = {
        "activities": activities,
        "schedule": torch.profiler.schedule(wait=wait, warmup=warmup, active=steps, repeat=repeat, skip_first=skip_first),
        "on_trace_ready": handler,
        "record_shapes": True,
        "with_stack": False,
    }
    kwargs.update(profiler_kwargs or {})
    return torch.profiler.profile(**kwargs)


def trace_handler(
    out_dir: str | os.PathLike[str],
    *,
    summary: bool = True,
    cycle_dirs: bool = False,
    rank: int | None = None,
    **analysis: Any,
) -> Callable[[Any], None]:
    """An ``on_trace_ready`` handler for your own ``torch.profiler.profile(...)``: writes each
    cycle's trace as gzip (atomically) and, with ``summary``, prints one line about it.

    Cycle 1 goes to ``out_dir/rank-N.json.gz``.  A later cycle ``k`` (a repeating schedule) goes
    to ``out_dir/cycle-k/rank-N.json.gz``, never over an earlier file; with ``cycle_dirs=True``
    every cycle, the first too, goes to its ``cycle-k`` folder.  ``rank`` fixes N (default: the
    torch.distributed rank, else ``RANK``, else 0).  Other keyword arguments go to the analysis.
    """
    _import_torch()
    options = _analysis_options(analysis)
    out = Path(out_dir)
    cycle = 0

    def handler(prof: Any) -> None:
        nonlocal cycle
        cycle += 1
        r = rank if rank is not None else _rank(prof)
        folder = out / f"cycle-{cycle}" if (cycle_dirs or cycle > 1) else out
        dest = folder / f"rank-{r}.json.gz"
        _export(prof, dest)
        if summary:
            _print_summary(dest, r, cycle, options)

    return handler


def summarize(path: str | os.PathLike[str], *, rank: int | None = None, cycle: int | None = None, **analysis: Any) -> str:
    """The summary line of one trace file (what the handler prints); raises when it cannot be
    analysed."""
    return _summary_line(Path(path), rank, cycle, _analysis_options(analysis))


# ---------------------------------------------------------------------------------------------


def _rank(prof: Any) -> int:
    """torch.distributed's rank, else the one torch recorded in the trace (the group may be
    gone by the time the last cycle ends), else RANK, else 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-torn-down group: fall through
        pass
    recorded = getattr(prof, "_trace_metadata", None)  # private; what add_metadata_json stored
    if isinstance(recorded, dict) and "distributedInfo" in recorded:
        try:
            return int(json.loads(recorded["distributedInfo"])["rank"])
        except Exception:
            pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _distributed_info(prof: Any) -> dict[str, Any] | None:
    """What torch writes as ``distributedInfo`` when the default group is up now; else None."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        get = getattr(prof, "_get_distributed_info", None)  # torch's own (backend, rank, world_size, pg_config ...)
        if get is not None:
            try:
                info = get()
                if info:
                    return info
            except Exception:
                pass
        return {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    except Exception:
        return None


def _with_distributed_info(head: bytes, info: dict[str, Any] | None) -> bytes:
    """The start of a Kineto JSON file with ``"distributedInfo"`` added as its first key when
    the metadata (everything before ``"traceEvents"``) lacks it and ``info`` is known."""
    if info is None:
        return head
    events_at = head.find(b'"traceEvents"')
    if events_at < 0 or b'"distributedInfo"' in head[:events_at]:
        return head
    brace = head.find(b"{")
    if brace < 0 or brace > events_at:
        return head
    entry = b'\n  "distributedInfo": ' + json.dumps(info, default=str).encode() + b","
    return head[: brace + 1] + entry + head[brace + 1 :]


def _export(prof: Any, dest: Path) -> None:
    """``prof``'s trace as gzip at ``dest``: exported as plain JSON beside it (a hidden name
    the loader skips), distributedInfo added if torch left it out, compressed to a temporary
    name and renamed onto ``dest``."""
    from tracelens.store.atomic import write_with

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, raw = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)  # a name without .gz: plain JSON (torch would gzip in /tmp at level 9)
        info = _distributed_info(prof)

        def write(tmp: str) -> None:
            with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=_GZIP_LEVEL) as dst:
                dst.write(_with_distributed_info(src.read(_HEAD_BYTES), info))
                shutil.copyfileobj(src, dst, 1 << 20)

        write_with(dest, write)
    finally:
        try:
            os.unlink(raw)
        except OSError:
            pass


def _print_summary(path: Path, rank: int, cycle: int, options: Any) -> None:
    from tracelens.model.printable import printable

    try:
        line = _summary_line(path, rank, cycle, options)
    except Exception as e:  # never the training job's problem
        msg = printable(" ".join(f"{type(e).__name__}: {e}".split()))
        print(f"tracelens: warning: rank {rank} cycle {cycle}: no summary ({msg}); the trace is written: {path}",
              file=sys.stderr, flush=True)
        return
    print(printable(line), flush=True)  # names and paths from the trace: no control codes on the terminal


def _summary_line(path: Path, rank: int | None, cycle: int | None, options: Any) -> str:
    from tracelens.analysis import analyze
    from tracelens.store.job import load

    trace = load([path], use_cache=False, jobs=1)
    d = analyze(trace, options).to_dict()
    return _format_line(d, path, rank, cycle, trace.all_warnings)


def _why_unknown(warnings: list[str], path: Path) -> str:
    """Why MFU is unknown, from the warnings (the file's name taken off): the one that says
    "MFU unknown", else one about missing GPU events, else all of them."""
    own = f"{path}: "
    plain = list(dict.fromkeys(w[len(own):] if w.startswith(own) else w for w in warnings))
    for w in plain:
        if w.startswith("MFU unknown"):
            return w[len("MFU unknown"):].lstrip(" :") or "see the warnings"
    for w in plain:
        if "MFU unknown" in w:
            return w
    for w in plain:
        if "no GPU" in w:
            return w
    return "; ".join(plain) or "see the warnings"


def _format_line(d: dict[str, Any], path: Path, rank: int | None, cycle: int | None, load_warnings: list[str] = ()) -> str:
    from tracelens.render.tables import headline

    if rank is None and d["ranks"]:
        rank = d["ranks"][0]["rank"]
    who = " ".join(p for p in (f"rank {rank}" if rank is not None else "", f"cycle {cycle}" if cycle is not None else "") if p)
    mfu = d["job"]["mfu"]
    if mfu is None:
        body = f"MFU unknown: {_why_unknown(list(load_warnings) + list(d['warnings']), path)}"
    else:
        h = headline(d)
        src = f" (model FLOPs from {h['flops_source']})" if h["flops_source"] else ""
        body = f"MFU {100 * mfu:.{1 if mfu >= 0.01 else 2}f}% of {h['gpu_model'] or 'the reference peak'}{src}"
        bars = [b for b in (d["job"].get("waterfall") or []) if b["key"] != "mfu" and b["fraction"] > 0]
        bars.sort(key=lambda b: -b["fraction"])
        if bars:
            body += "; biggest losses: " + ", ".join(f"{b['label']} {100 * b['fraction']:.1f}%" for b in bars[:TOP_LOSSES])
    prefix = f"tracelens: {who}: " if who else "tracelens: "
    return f"{prefix}{' '.join(body.split())}  -> {path}"
