"""The error shell of every program: `sej`, `sej-hub`, `sej-hub-cron`, `sej-pipeline`, `sej-retention`, `sej-archive`.

Every error ends as ONE line on stderr, ``PROG: error: ...``, and an exit code:
0 fine, 1 problems found (corruption, a held lock, verify problems, I/O errors),
2 usage errors (bad options, a missing path, a path that is not a journal, a bad
time string), 130 interrupted (Ctrl-C). A closed stdout pipe (``sej scan DIR | head``)
ends the program quietly with exit 0.

A program is a click command of class `Program` (or a group of class `ProgramGroup`)
with `debug_option()`: ``--debug`` lets an unexpected error show its traceback instead.
The flag travels in the click context (``ctx.meta``), shared by a group and its
subcommands; `debugging()` reads it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from ..errors import InvalidArgumentError, LockedError, OffsetOutOfRangeError, SejError
from .entry import interrupted

OK = 0
PROBLEMS = 1
USAGE = 2
INTERRUPTED = 130

DEBUG = "sej.debug"
"""The key of the --debug flag in ``click.Context.meta``."""

F = TypeVar("F", bound=Callable[..., Any])


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


def _remember_debug(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    ctx.meta[DEBUG] = bool(value)
    return bool(value)


def debug_option(help: str = "Show tracebacks of unexpected errors.") -> Callable[[F], F]:
    """The --debug flag of a program: kept in the click context (see debugging), not passed to the command."""
    return click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_remember_debug,
                        help=help)  # fmt: skip


def debugging(ctx: click.Context | None = None) -> bool:
    """Whether --debug was given to the program running now (or to the one of `ctx`)."""
    ctx = ctx if ctx is not None else click.get_current_context(silent=True)
    return ctx is not None and bool(ctx.meta.get(DEBUG, False))


def translate(e: BaseException, prog: str) -> Failure:
    """The one-line error and exit code for an exception a command raised."""
    if isinstance(e, (InvalidArgumentError, OffsetOutOfRangeError)):
        return Failure(str(e), USAGE)
    if isinstance(e, LockedError):
        return Failure(f"{e} (another process is using it)", PROBLEMS)
    if isinstance(e, SejError):
        return Failure(str(e), PROBLEMS)
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return Failure(f"{where}{e.strerror or e}", PROBLEMS)
    return Failure(f"internal error: {type(e).__name__}: {e} (run '{prog} --debug ...' to see the traceback)")


def error_line(prog: str, message: str) -> None:
    """Print `<prog>: error: message` on stderr as one line, after what was printed on stdout before."""
    one = " ".join(str(message).split())
    flush_stdout()  # what was printed before the error comes first on a terminal
    try:
        click.echo(f"{prog}: error: {one}", err=True)
    except (BrokenPipeError, ValueError):
        pass


_NULL_HANDLER = logging.NullHandler()


def quiet_library_logs(quiet: bool) -> None:
    """Keep the library's log records (recovery's warning), paramiko's (its transport thread logs the
    error a connection died of, with a traceback) and watchdog's (an error when a watch is removed while
    its thread reads, harmless: on exit of `sej scan -f`) off stderr: the commands report for themselves."""
    for name in ("sej", "paramiko", "watchdog"):
        logger = logging.getLogger(name)
        if quiet and _NULL_HANDLER not in logger.handlers:
            logger.addHandler(_NULL_HANDLER)
        elif not quiet and _NULL_HANDLER in logger.handlers:
            logger.removeHandler(_NULL_HANDLER)


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so flushing at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (tests): nothing will flush to a closed pipe


def flush_stdout() -> None:
    """Flush stdout; a closed pipe is silenced, not an error."""
    for stream in (sys.stdout, getattr(sys.stdout, "buffer", None)):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            _silence_stdout()
        except (OSError, ValueError):
            pass


class _Shell(click.Command):
    """Turns every error of a command (and, for a group, of its subcommands) into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            _silence_stdout()
            return OK
        except Exception as e:
            if interrupted():
                # Ctrl-C came: this error is its doing (CPython's import, interrupted while it builds the
                # message of an ImportError, raises "TypeError: expected a message argument" instead).
                raise KeyboardInterrupt from e
            if debugging(ctx):
                raise
            raise translate(e, ctx.find_root().command_path) from e

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the program; its exit code: sys.exit with it, or (standalone_mode=False) return it."""
        prog = prog_name or self.name or "sej"
        try:
            rv = super().main(args, prog, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else OK
        except click.exceptions.NoArgsIsHelpError as e:
            assert e.ctx is not None
            click.echo(e.ctx.get_help())
            error_line(prog, "no command given")
            code = USAGE
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None and not isinstance(e, Usage) else ""
            error_line(prog, e.format_message() + hint)
            code = USAGE
        except click.ClickException as e:
            error_line(prog, e.format_message())
            code = e.exit_code
        except click.Abort:
            code = INTERRUPTED
        flush_stdout()
        if standalone_mode:
            sys.exit(code)
        return code


class Program(_Shell):
    """A click command that is a whole program: errors end as one line on stderr and an exit code."""


class ProgramGroup(_Shell, click.Group):
    """A click group that is a whole program (`sej`): errors of its subcommands end as one line too."""


__all__ = [
    "INTERRUPTED",
    "OK",
    "PROBLEMS",
    "USAGE",
    "Failure",
    "Program",
    "ProgramGroup",
    "Usage",
    "debug_option",
    "debugging",
    "error_line",
    "flush_stdout",
    "quiet_library_logs",
    "translate",
    "usage",
]
