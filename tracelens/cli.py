"""Command line: ``tracelens info|report|open|export PATH...``.

Imports stay lazy: ``tracelens --help`` loads neither polars nor Textual, and the headless
commands never import Textual.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from tracelens import __version__
from tracelens.model.errors import EXIT_BAD_INPUT, EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

COMMANDS = ("info", "report", "open", "demo", "export", "export-trace")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: "tracelens report: error: argument --jobs: invalid int value:
    'x' (tracelens report --help)", exit 2, instead of the usage block and the error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common(p: argparse.ArgumentParser, nargs: str = "+") -> None:
    p.add_argument("paths", nargs=nargs, metavar="PATH", help="trace files or directories of per-rank traces (.json, .json.gz, nsys .sqlite exports)")
    p.add_argument("--no-cache", action="store_true", help="parse again instead of reading the Parquet cache")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="parse N files in parallel (default: one per core)")
    p.add_argument("--keep-python", action="store_true", help="keep python_function events (dropped by default)")
    p.add_argument("--strict", action="store_true",
                   help="a file or subdirectory of a job directory that cannot be read is an error (default: a warning, skipped)")
    _prefer(p)


def _prefer(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefer", choices=("kineto", "nsys"), default=None,
                   help="a rank recorded both as a Kineto trace and an nsys export: take its events from this one "
                        "(default: kineto, which has op shapes and FLOPs)")


def _analysis_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", metavar="A:B", help="only ProfilerStep numbers A..B (N, A:B, :B, A:)")
    p.add_argument("--step-range", metavar="REGEX", help="use host ranges whose name matches REGEX as the steps")
    p.add_argument("--data-range", metavar="REGEX", help="host ranges whose name matches REGEX load data (besides DataLoader __next__)")
    p.add_argument("--include-warmup", action="store_true", help="count the first step in the totals too")
    p.add_argument("--critical-path", action="store_true",
                   help="each step's critical path: the chain of waits that set its time, by category (cpu, launch overhead, "
                        "compute, exposed comm, sync, ...) and its longest events, and each suggestion's fix replayed on the "
                        "step's dependency graph (predicted step time next to the upper bound; off by default: it costs "
                        "several times the rest of the analysis)")
    p.add_argument("--gpu", metavar="NAME", help="take peaks from this GPU (e.g. 'H100 SXM', 'MI300X') instead of the trace's")
    p.add_argument("--peak-tflops", type=float, metavar="X", help="reference dense peak in TFLOP/s for MFU")
    p.add_argument("--model-flops-per-step", type=float, metavar="F", help="model FLOPs of one step per GPU (else counted from shapes)")
    p.add_argument("--params", type=float, metavar="N", help="non-embedding parameters: model FLOPs = 6·N·T (with --tokens-per-step)")
    p.add_argument("--tokens-per-step", type=float, metavar="T", help="tokens one GPU processes per step")
    p.add_argument("--seq-len", type=int, metavar="S", help="with --layers and --hidden: add the attention term 12·L·h·S·T")
    p.add_argument("--layers", type=int, metavar="L")
    p.add_argument("--hidden", type=int, metavar="H")
    p.add_argument("--config", metavar="FILE",
                   help="job settings (gpu, FLOPs, ...) in TOML; default: tracelens.toml beside the traces; 'none' ignores it")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tracelens",
        description="Where did the GPU time go? Reads PyTorch profiler (Kineto) traces, one file per rank.",
        epilog="exit codes:\n" + "".join(f"  {code:<4} {meaning}\n" for code, meaning in EXIT_CODES)
        + "\ncache: $TRACELENS_CACHE_DIR (default ~/.cache/tracelens).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tracelens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser("info", help="what each trace file holds: rank, device, event counts, span, steps")
    _common(p_info)
    p_info.add_argument("--json", action="store_true", help="print the same as JSON")
    p_rep = sub.add_parser("report", help="where the GPU time went: MFU and its loss waterfall, steps, idle, communication, suggestions")
    _common(p_rep, nargs="*")
    p_rep.add_argument("-o", "--output", metavar="FILE",
                       help="write the report here: .json (the versioned contract), .html (one self-contained page) or .txt; default: text on stdout")
    p_rep.add_argument("--load", metavar="REPORT", help="re-render a saved report, .json or .html (no traces needed)")
    p_rep.add_argument("--compare", metavar="BASELINE", help="compare with a baseline: a saved report (.json, .html), or its traces (file or directory)")
    p_rep.add_argument("--nccl", action="append", metavar="PATH", default=None,
                       help="NCCL records of this job (logs, Flight Recorder dumps, nccl-tests, Inspector, profiler plugin; "
                            "a file or directory, repeatable): algorithm/protocol, achievable busbw, hang verdict")
    p_rep.add_argument("--fail-under-mfu", type=float, metavar="X", help="exit 1 when the job's MFU is below X (a fraction: 0.35), or unknown")
    p_rep.add_argument("--fail-over-step-ms", type=float, metavar="Y", help="exit 1 when the mean step time is above Y ms, or unknown")
    _analysis_options(p_rep)
    p_open = sub.add_parser("open", help="the terminal UI: the MFU waterfall, suggestions and every drill-down (default when a terminal is attached)")
    _common(p_open)
    _analysis_options(p_open)
    p_exp = sub.add_parser("export", help="the event table as Parquet for notebooks: one file per rank in a directory")
    p_exp.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories of per-rank traces (.json, .json.gz, nsys .sqlite exports)")
    p_exp.add_argument("-o", "--output", metavar="DIR", required=True,
                       help="a new or empty directory (or an earlier export, replaced) for rank-R.parquet files and "
                            "tracelens-export.json; FILE.parquet: one rank's table")
    p_exp.add_argument("--rank", type=int, action="append", metavar="R", help="only rank R (repeat for several)")
    p_exp.add_argument("--no-cache", action="store_true", help="parse again instead of reading the Parquet cache")
    p_exp.add_argument("--keep-python", action="store_true", help="keep python_function events (dropped by default)")
    p_exp.add_argument("--strict", action="store_true",
                       help="a file or subdirectory of a job directory that cannot be read is an error (default: a warning, skipped)")
    _prefer(p_exp)
    p_tr = sub.add_parser("export-trace", help="the job as one Perfetto / chrome://tracing trace, every rank, with the critical path overlaid")
    _common(p_tr)
    p_tr.add_argument("-o", "--output", metavar="FILE", required=True, help="the trace to write: .json, or .json.gz (gzip)")
    p_tr.add_argument("--align-clocks", action="store_true",
                      help="shift each rank by the job's clock alignment (shared collectives end together) so that ranks line up; "
                           "default: each file's times as recorded")
    p_tr.add_argument("--steps", metavar="A:B", help="only ProfilerStep numbers A..B (N, A:B, :B, A:)")
    p_tr.add_argument("--step-range", metavar="REGEX", help="use host ranges whose name matches REGEX as the steps")
    p_demo = sub.add_parser("demo", help="the bundled sample job: the terminal UI, or (no terminal) its text report and an HTML page")
    p_demo.add_argument("-o", "--output", metavar="FILE.html", default="tracelens-demo.html",
                        help="where the HTML report goes without a terminal (default: ./tracelens-demo.html)")
    p_demo.add_argument("--no-tui", action="store_true", help="the text report and the HTML page even with a terminal attached")
    return parser


def _has_terminal() -> bool:
    """Whether the terminal UI can run here: keys come from stdin and the screen goes to stdout
    (without both, the UI would wait for keys that never come)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _looks_like_a_command(word: str) -> bool:
    """A first argument that is no path and reads as a command name (``tracelens compare a b``):
    a usage error, not 'compare: no such file' (a missing trace keeps its exit 3: it has a dot
    or a slash)."""
    return word.replace("-", "").isalpha() and not os.path.exists(word)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # ``tracelens PATH...``: the terminal UI when a terminal is attached, else the text report
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        if _looks_like_a_command(argv[0]):
            print(f"tracelens: error: '{_clean(argv[0])}' is neither a command ({', '.join(COMMANDS)}) nor a trace path"
                  + (" (two runs: tracelens report NEW --compare BASELINE)" if argv[0] in ("compare", "diff") else "")
                  + " (see tracelens --help)", file=sys.stderr)
            return EXIT_USAGE
        argv = ["open" if _has_terminal() else "report", *argv]
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        print(f"tracelens: error: --jobs {args.jobs}: give at least 1 (the number of files parsed in parallel)", file=sys.stderr)
        return EXIT_USAGE
    gc_was_on = gc.isenabled()
    if args.command in ("info", "report"):
        # a batch run that ends in a second: the cycle collector would only rescan the objects
        # of the imports and the analysis (~110 collections, ~9 ms on a 35 MB trace); memory
        # is freed by reference counting as usual
        gc.disable()
    try:
        if args.command == "info":
            return _cmd_info(args)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "open":
            return _cmd_open(args)
        if args.command == "export":
            return _cmd_export(args)
        if args.command == "export-trace":
            return _cmd_export_trace(args)
        if args.command == "demo":
            from tracelens.demo import run

            return run(args.output, tui=not args.no_tui and _has_terminal())
    except KeyboardInterrupt:
        print("tracelens: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tracelens report ... | head`: the reader left; stop quietly, like other tools
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141
    except Exception as e:  # one line, never a traceback (TRACELENS_DEBUG=1 shows it)
        from tracelens.model.errors import OutputError, TraceInputError, UsageError

        if os.environ.get("TRACELENS_DEBUG"):
            raise
        if isinstance(e, (TraceInputError, OutputError)):  # exit 3 (an input) or 5 (the output)
            print(f"tracelens: error: {_clean(e)}", file=sys.stderr)
            return e.exit_code
        if isinstance(e, UsageError):  # a flag or a job setting (jobconfig.SettingsError names its file)
            print(f"tracelens: error: {_clean(e)}", file=sys.stderr)
            return EXIT_USAGE
        print(f"tracelens: internal error: {type(e).__name__}: {_clean(e)} (set TRACELENS_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if gc_was_on:
            gc.enable()
    return EXIT_USAGE


def _clean(text: object) -> str:
    """A message for the terminal: what came from a file carries no control codes (views.printable)."""
    from tracelens.model.printable import printable

    return printable(str(text))


def _cmd_info(args: argparse.Namespace) -> int:
    from tracelens.analysis.info import nsys_summary, render_text, summarize
    from tracelens.render.tables import printable_report
    from tracelens.store.job import load

    rest = list(args.paths)
    summary = {"files": [], "warnings": []}
    trace = None
    if rest:
        trace = load(rest, use_cache=not args.no_cache, keep_python=args.keep_python, jobs=args.jobs, strict=args.strict,
                     prefer=args.prefer)
        summary = summarize(trace)
    # the nsys exports of the job (given, or found in a directory): what each holds, besides its events
    summary["nsys"] = [nsys_summary(m.path) for m in (trace.metas if trace else []) if m.format == "nsys"]
    if args.json:
        import orjson

        from tracelens.render.tables import printable_json

        sys.stdout.buffer.write(printable_json(orjson.dumps(summary, option=orjson.OPT_INDENT_2)) + b"\n")
    else:
        if rest:
            sys.stdout.write(render_text(printable_report(summary)))
    for w in trace.all_warnings if trace else []:
        print(f"tracelens: warning: {_clean(w)}", file=sys.stderr)
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from tracelens.export.parquet import export

    done = export(args.paths, args.output, ranks=args.rank, use_cache=not args.no_cache, keep_python=args.keep_python,
                  strict=args.strict, prefer=args.prefer)
    what = f"{len(done.files)} file(s)" if not args.output.lower().endswith(".parquet") else "1 rank"
    print(f"tracelens: wrote {what}, {done.rows:,} events, to {_clean(done.out)}")
    for w in done.warnings:
        print(f"tracelens: warning: {_clean(w)}", file=sys.stderr)
    return EXIT_OK


def _cmd_export_trace(args: argparse.Namespace) -> int:
    import re

    from tracelens.export.perfetto import export_trace
    from tracelens.model.options import Options, parse_steps

    try:
        steps = parse_steps(args.steps) if args.steps else None
        _refuse_empty(args)
        if args.step_range:
            re.compile(args.step_range)
    except (ValueError, re.error) as e:
        print(f"tracelens: error: {_clean(e)}", file=sys.stderr)
        return EXIT_USAGE
    done = export_trace(args.paths, args.output, align_clocks=args.align_clocks, options=Options(steps=steps, step_range=args.step_range),
                        use_cache=not args.no_cache, keep_python=args.keep_python, strict=args.strict, prefer=args.prefer, jobs=args.jobs)
    print(f"tracelens: wrote {done.ranks} rank(s), {done.events:,} events, {done.segments:,} critical-path slices and "
          f"{done.flows:,} arrows{f' ({done.cross_flows:,} between ranks)' if done.cross_flows else ''} to {_clean(done.out)}")
    for w in done.warnings:
        print(f"tracelens: warning: {_clean(w)}", file=sys.stderr)
    return EXIT_OK


# the options that shape an analysis of traces (the flags as the user spells them)
ANALYSIS_FLAGS = ("steps", "step_range", "data_range", "include_warmup", "critical_path", "gpu", "peak_tflops",
                  "model_flops_per_step", "params", "tokens_per_step", "seq_len", "layers", "hidden", "prefer",
                  "keep_python", "config")  # not --no-cache, --jobs, --strict: how traces are read, harmless


def _unused_by_load(args: argparse.Namespace) -> list[str]:
    """The options given with ``--load`` that nothing would use (they were once ignored without a
    word: ``--load r.json --gpu H100`` showed the saved MFU as if the GPU had been applied).  With
    ``--compare`` of traces the analysis options shape the baseline, so only ``--nccl`` is unused."""
    keys = ("nccl",) if args.compare else ("nccl", *ANALYSIS_FLAGS)
    return ["--" + k.replace("_", "-") for k in keys if getattr(args, k, None) not in (None, False, [], ())]


def _cmd_report(args: argparse.Namespace) -> int:
    import math
    import re

    from tracelens.render import format_for, render
    from tracelens.store.atomic import check_output, write_output

    fmt = format_for(args.output)
    problem = None
    if not fmt:
        problem = f"{args.output}: unknown report format (use .json, .html or .txt)"
    elif bool(args.paths) == bool(args.load):
        problem = "give trace paths or --load REPORT.json (one of the two)"
    elif args.load and _unused_by_load(args):
        unused = _unused_by_load(args)
        problem = (f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply to --load: a saved report is shown "
                   "as it was analysed (analyse its traces again to change that)")
    elif args.fail_under_mfu is not None and not 0 <= args.fail_under_mfu <= 1:
        problem = f"--fail-under-mfu {args.fail_under_mfu:g}: give the MFU as a fraction between 0 and 1 (0.35 for 35%)"
    elif args.fail_over_step_ms is not None and not (math.isfinite(args.fail_over_step_ms) and args.fail_over_step_ms > 0):
        problem = f"--fail-over-step-ms {args.fail_over_step_ms:g}: give the step time in milliseconds, a positive number"
    if args.output and not problem:
        from tracelens.store.atomic import overwritten_input

        same = overwritten_input(args.output, _inputs(args, _is_saved_report(args.output)))
        if same:
            problem = f"-o {args.output} is one of the inputs ({same}): write the report to another file"
    if problem:
        print(f"tracelens: error: {_clean(problem)}", file=sys.stderr)
        return EXIT_USAGE
    if not args.load:
        _apply_job_settings(args)
    try:
        steps = _check_options(args)
    except (ValueError, re.error) as e:
        print(f"tracelens: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        check_output(args.output)  # before the analysis: a report that cannot be saved fails at once
    if args.load:
        d = _saved_report(args.load, required=True)
    else:
        d = _analyze_paths(args.paths, args, steps, nccl=tuple(args.nccl or ()))
    if args.compare:
        from tracelens.render.compare import compare

        base = _saved_report(args.compare) if args.compare.lower().endswith((".json", ".html", ".htm")) else None
        if base is None:
            base = _analyze_paths([args.compare], args, steps)
        d["comparison"] = compare(base, d)
    data = render(d, fmt)
    if args.output:
        write_output(args.output, data)
    else:
        sys.stdout.buffer.write(data)
    if not args.load:
        for w in d["warnings"]:
            print(f"tracelens: warning: {_clean(w)}", file=sys.stderr)
    reasons = _gate(d, args.fail_under_mfu, args.fail_over_step_ms)
    if reasons:
        from tracelens.model.errors import EXIT_GATE

        print(f"tracelens: gate failed: {'; '.join(reasons)}", file=sys.stderr)
        return EXIT_GATE
    return EXIT_OK


def _is_saved_report(path: str) -> bool:
    from tracelens.model.saved import looks_like_report

    try:
        with open(path, "rb") as fh:
            return looks_like_report(fh.read(4096))
    except OSError:
        return False


def _inputs(args: argparse.Namespace, output_is_a_report: bool):
    """(what, path) for every file ``report`` reads: the traces (those found in a directory too),
    the saved report, the baseline (a report, or its traces), the job's settings file.  When the
    output file is a saved report, the files found in directories are left out: a report found
    there is skipped as input, so writing over the last run's report in the job's directory is fine."""
    from pathlib import Path

    for p in args.paths:
        yield from _traces(p, "the trace", output_is_a_report)
    if args.load:
        yield f"the saved report {args.load}", args.load
    if args.compare:
        yield from _traces(args.compare, "the baseline", output_is_a_report)
    if not args.load:
        from tracelens.store import jobconfig

        config = args.config if args.config and args.config.lower() != "none" else None
        toml = Path(config) if config else None if args.config else jobconfig.find(args.paths)
        if toml is not None:
            yield f"the job settings {toml}", toml


def _traces(path: str, what: str, skip_found: bool):
    """(what, file) for a trace file, or each trace file a directory holds, as the job finds them
    (none when ``skip_found``)."""
    if not os.path.isdir(path):
        yield f"{what} {path}", path
        return
    if skip_found:
        return
    from tracelens.model.errors import TraceInputError
    from tracelens.store.discover import discover

    try:
        files, _, _ = discover([path])
    except TraceInputError:  # the analysis says why
        return
    for f in files:
        yield f"{what} {f}", f


def _analyze_paths(paths: list[str], args: argparse.Namespace, steps, nccl: tuple[str, ...] = ()) -> dict:
    """The report of the job in ``paths``: from the report cache when the job and the options are
    unchanged (neither polars nor the analysis is imported then), else loaded and analysed."""
    from tracelens.store.nccl import nccl_only
    from tracelens.store.reports import cached_report

    alone = nccl_only(paths)
    if alone is not None:  # NCCL logs / Flight Recorder dumps alone: their collectives and the hang verdict
        from tracelens.analysis.nccl import analyze_nccl

        return analyze_nccl(*alone, strict=args.strict)
    values = _option_values(args, steps)

    def analyse() -> tuple[dict, bool]:
        from tracelens.analysis import analyze, summarize_on_parse
        from tracelens.model.errors import UsageError
        from tracelens.model.options import Options
        from tracelens.store.job import load

        options = Options(**values, nccl=nccl)  # each rank analysed as its file is parsed; only the report is kept
        trace = load(paths, use_cache=not args.no_cache, keep_python=args.keep_python, jobs=args.jobs, strict=args.strict,
                     prefer=values["prefer"], after_parse=summarize_on_parse(options), keep_events=False)
        a = analyze(trace, options)
        bad = next((r.mfu_error for r in a.ranks if r.mfu_error), None)
        if bad:  # an MFU above 100% from a number the user gave is a mistake in it, not a result (never cached)
            raise UsageError(bad)
        return a.to_dict(), not trace.cache_warnings

    # with --nccl not from the report cache (the NCCL files are read each time; the parse cache still serves)
    d, _ = cached_report(paths, analyse, options=values, keep_python=args.keep_python, strict=args.strict,
                         use_cache=not args.no_cache and not nccl)
    return d


def _gate(d: dict, min_mfu: float | None, max_step_ms: float | None) -> list[str]:
    """The reasons a CI gate fails (empty: it passes).  An unknown value fails the gate that
    asks for it: a gate must never pass by not measuring."""
    reasons = []
    if min_mfu is not None:
        mfu = d["job"]["mfu"]
        if mfu is None:
            reasons.append(f"MFU is unknown (needed >= {100 * min_mfu:.2f}%; see the warnings)")
        elif mfu < min_mfu:
            reasons.append(f"MFU {100 * mfu:.2f}% is under {100 * min_mfu:.2f}%")
    if max_step_ms is not None:
        mean = d["job"]["step_time_ns"]["mean"]
        if mean is None:
            reasons.append(f"step time is unknown (needed <= {max_step_ms:g} ms)")
        elif mean / 1e6 > max_step_ms:
            reasons.append(f"mean step time {mean / 1e6:.2f} ms is over {max_step_ms:g} ms")
    return reasons


def _option_values(args: argparse.Namespace, steps: tuple[int, int] | None) -> dict:
    """The analysis options (``tracelens.analysis.Options``' fields) the command line and the job's
    settings give: plain values, so that the report cache's key needs no analysis import."""
    return dict(
        steps=steps, step_range=args.step_range, data_range=args.data_range, include_warmup=args.include_warmup,
        critical_path=getattr(args, "critical_path", False), gpu=args.gpu, peak_tflops=args.peak_tflops, model_flops_per_step=args.model_flops_per_step,
        params=args.params, tokens_per_step=args.tokens_per_step, seq_len=args.seq_len, layers=args.layers, hidden=args.hidden,
        prefer=getattr(args, "prefer", None), given=getattr(args, "given", ()),
    )


def _options(args: argparse.Namespace, steps: tuple[int, int] | None):
    from tracelens.model.options import Options

    return Options(**_option_values(args, steps))


def _apply_job_settings(args: argparse.Namespace) -> None:
    """Fill the options the command line left unset from the job's settings file (``--config``,
    else ``tracelens.toml`` beside the traces), and note where each given option came from."""
    from tracelens.store import jobconfig

    values, args.given = jobconfig.resolve(args.paths, {k: getattr(args, k, None) for k in jobconfig.KEYS}, args.config)
    for key, value in values.items():
        setattr(args, key, value)


def _refuse_empty(args: argparse.Namespace, where=lambda k: "--" + k.replace("_", "-")) -> None:
    """ValueError on an empty --gpu, --step-range or --data-range: an empty value (``--gpu "$GPU"``
    with GPU unset) was once taken for no option, without a word."""
    for key in ("step_range", "data_range", "gpu"):
        v = getattr(args, key, None)
        if v is not None and not v.strip():
            raise ValueError(f"{where(key)} is empty: give a value, or leave the option out")


def _check_options(args: argparse.Namespace) -> tuple[int, int] | None:
    """--steps parsed and the regexes compiled; the numbers that MFU is built on finite and
    positive, and given together where they only mean something together; ValueError/re.error
    on a bad one.  (An MFU above 100% from them is caught once the analysis has run.)"""
    import math
    import re

    from tracelens.store.jobconfig import POSITIVE

    steps = None
    if args.steps:
        from tracelens.model.options import parse_steps  # (dataclasses: ~8 ms that a cached report does without)

        steps = parse_steps(args.steps)
    given = dict(getattr(args, "given", ()))
    where = lambda k: given.get(k, "--" + k.replace("_", "-"))  # noqa: E731
    _refuse_empty(args, where)
    for rx in (args.step_range, args.data_range):
        if rx:
            re.compile(rx)
    for key in POSITIVE:
        v = getattr(args, key, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{where(key)} {v:g}: must be a positive number")
    if args.model_flops_per_step is not None and args.params is not None:
        flag_flops, flag_params = where("model_flops_per_step").startswith("--"), where("params").startswith("--")
        if flag_flops == flag_params:
            raise ValueError(f"give the model FLOPs one way: {where('model_flops_per_step')} or {where('params')} with "
                             f"{where('tokens_per_step')}, not both")
        if flag_params:  # a flag wins over the job's settings file
            args.model_flops_per_step = None
        else:
            args.params = args.tokens_per_step = args.seq_len = args.layers = args.hidden = None
    if (args.params is None) != (args.tokens_per_step is None):
        have, need = ("params", "tokens_per_step") if args.params is not None else ("tokens_per_step", "params")
        raise ValueError(f"{where(have)} needs {where(need)} too (model FLOPs = 6·N·T per step)")
    shape = [k for k in ("seq_len", "layers", "hidden") if getattr(args, k, None) is not None]
    if shape and (len(shape) < 3 or args.params is None):
        raise ValueError("--seq-len, --layers and --hidden go together, with --params and --tokens-per-step "
                         f"(the attention term 12·L·h·S·T); given: {', '.join(where(k) for k in shape)}")
    return steps


def _cmd_open(args: argparse.Namespace) -> int:
    """The terminal UI.  A saved JSON report opens without its traces (no timeline)."""
    import re

    _apply_job_settings(args)  # unused when PATH is a saved report
    try:
        steps = _check_options(args)
    except (ValueError, re.error) as e:
        print(f"tracelens: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not _has_terminal():
        print("tracelens: error: open needs a terminal (stdin and stdout); without one: tracelens report PATH "
              "[-o report.html]", file=sys.stderr)
        return EXIT_USAGE
    from tracelens.model.errors import TraceInputError

    report = error = job = None
    if len(args.paths) == 1 and args.paths[0].lower().endswith((".json", ".html", ".htm")):
        try:
            report = _saved_report(args.paths[0])
        except TraceInputError as e:  # a damaged or malformed saved report: said in the app, then on stderr (exit 3)
            error = f"cannot open {e}"
    if error is None and report is None:
        from tracelens.tui.loading import JobLoad

        # the load (the report cache, else the parse cache and the analysis) runs while Textual is imported
        job = JobLoad(args.paths, options=_options(args, steps), use_cache=not args.no_cache, jobs=args.jobs,
                      strict=args.strict).start()
    from tracelens.tui import make_app

    if error is not None:
        app = make_app(error=error)
    elif report is not None:
        app = make_app(report=report)
    else:
        app = make_app(args.paths, options=job.options, use_cache=not args.no_cache, jobs=args.jobs, strict=args.strict,
                       job_load=job)
    app.run()
    if app.error:
        print(f"tracelens: error: {_clean(app.error)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def _saved_report(path: str, required: bool = False) -> dict | None:
    """The report in ``path`` when it is a tracelens report (JSON, or the JSON inside a tracelens
    HTML page), validated against its schema (tracelens.model.saved); None when it is not a report (a
    trace); with ``required``, anything but a valid report is bad input."""
    from tracelens.model.saved import load_saved

    return load_saved(path, required)
