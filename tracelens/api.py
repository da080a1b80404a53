"""The public Python API: ``tracelens.open_job``, ``tracelens.analyze`` (and ``tracelens.render``,
the callable package ``tracelens.render``).  ``tracelens/__init__.py`` imports this module when
one of them is first used, so ``import tracelens`` stays free of polars and Textual."""

from __future__ import annotations


def open_job(paths, options=None, **kw):
    """Open a job: ``paths`` is a trace file, a directory of per-rank traces, or a list of them
    (a str or a Path is one path).  Keywords go to the loader: ``use_cache`` (default True: the
    parse cache, ``$TRACELENS_CACHE_DIR``), ``keep_python``, ``jobs``, ``strict``, ``prefer`` ("kineto" or "nsys": the source of a rank recorded both ways).  ``options``
    (a ``tracelens.Options``, or a dict of its fields) is kept on the job as the default of
    ``analyze``.  Raises ``tracelens.model.errors.TraceInputError`` (naming the file) when an
    input cannot be used."""
    from tracelens.store.job import load

    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    if options is not None and "prefer" not in kw:  # the source of a rank recorded both ways is chosen at the load
        kw["prefer"] = _as_options(options).prefer
    job = load(list(paths), **kw)
    if options is not None:
        job.options = _as_options(options)
    return job


def analyze(job, options=None):
    """The analysis of an opened job (``open_job``): an ``Analysis``, whose ``to_dict()`` is the
    versioned report.  ``options``: a ``tracelens.Options`` or a dict of its fields (steps, gpu,
    peak_tflops, model_flops_per_step, ...); default: the options given to ``open_job``."""
    from tracelens.analysis import analyze as _analyze

    if options is None:
        options = job.options
    return _analyze(job, _as_options(options) if options is not None else None)


def _as_options(options):
    from tracelens.model.options import Options

    if isinstance(options, Options):
        return options
    if isinstance(options, dict):
        return Options(**options)
    raise TypeError(f"options: a tracelens.Options or a dict of its fields, not {type(options).__name__}")
