"""The errors tracelens reports to users, and the exit codes the CLI maps them to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1  # a CI gate (--fail-under-mfu ...) failed
EXIT_USAGE = 2  # bad command line
EXIT_BAD_INPUT = 3  # an input cannot be read as a trace
EXIT_INTERNAL = 4  # a bug in tracelens (TRACELENS_DEBUG=1 shows the traceback)
EXIT_OUTPUT = 5  # the output file cannot be written (read-only place, a directory, disk full)
EXIT_INTERRUPTED = 130  # Ctrl-C
# the table `tracelens --help` and the README print: one meaning per code
EXIT_CODES = (
    (EXIT_OK, "ok"),
    (EXIT_GATE, "a gate failed (--fail-under-mfu, --fail-over-step-ms)"),
    (EXIT_USAGE, "usage: a bad option, on the command line or in the job's tracelens.toml"),
    (EXIT_BAD_INPUT, "bad input: a trace or saved report that cannot be read"),
    (EXIT_INTERNAL, "internal error (a bug; TRACELENS_DEBUG=1 shows the traceback)"),
    (EXIT_OUTPUT, "the output cannot be written (-o into a read-only or missing directory, onto a directory, disk full)"),
    (EXIT_INTERRUPTED, "interrupted"),
)


class TraceInputError(Exception):
    """An input file (or directory) cannot be used; the message names the file and the problem."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # keep (path, problem) across process boundaries
        return (type(self), (self.path, self.problem))


class UnreadableError(TraceInputError):
    """The operating system will not let tracelens read a file or directory (permissions, I/O)."""


class ParseError(TraceInputError):
    """A file's bytes are not a readable trace of the format it was taken for."""


class UnsupportedFormat(ParseError):
    """A file tracelens recognises (an NCCL log, a Flight Recorder dump, an Nsight Systems
    export) but does not analyse: the message names the format and what to do instead.  Inside
    a job directory such a file is skipped with a warning, like any file that is not a trace."""


class NotATrace(ParseError):
    """A readable file that holds no trace although its name or first bytes looked like one (an
    SQLite database that is not an Nsight Systems export).  Inside a job directory it is skipped
    with a warning, like JSON that is not a trace."""


class OutputError(Exception):
    """The output file cannot be written; the message names the file and the problem.  Nothing
    is left behind: no partial file, no temporary one."""

    exit_code = EXIT_OUTPUT

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UsageError(Exception):
    """What the user gave cannot be right (e.g. model FLOPs that make the MFU exceed 100%): the
    command stops with one line and exit code 2, writing nothing."""

    exit_code = EXIT_USAGE
