"""The errors tracelens reports to users, and the exit codes the CLI maps them to."""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE = 1  # a CI gate (--fail-under-mfu ...) failed
EXIT_USAGE = 2  # bad command line
EXIT_BAD_INPUT = 3  # an input cannot be read as a trace


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


class UsageError(Exception):
    """What the user gave cannot be right (e.g. model FLOPs that make the MFU exceed 100%): the
    command stops with one line and exit code 2, writing nothing."""

    exit_code = EXIT_USAGE
