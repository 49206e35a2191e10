"""The tool's own exceptions and exit codes.

Exit codes: 0 fine, 1 problems found (corruption, a held lock, verify problems,
I/O errors), 2 usage errors (bad options, a missing path, a path that is not a
journal, a bad time string).
"""

from __future__ import annotations

import click

OK = 0
PROBLEMS = 1
USAGE = 2
INTERRUPTED = 130


class Failure(click.ClickException):
    """A one-line error with an exit code (1 unless told otherwise)."""

    def __init__(self, message: str, exit_code: int = PROBLEMS) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Usage(click.UsageError):
    """A usage error found by a command itself (a missing path, not a journal): exit 2, no --help hint."""


def usage(message: str) -> Usage:
    """A usage error (exit 2) to raise: a bad argument, a missing path, not a journal."""
    return Usage(message)
