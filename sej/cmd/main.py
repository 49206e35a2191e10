"""The `sej` click group and its error handling.

Every error ends as ONE line on stderr, ``sej: error: ...``, and an exit code:
0 fine, 1 problems found (corruption, a held lock, verify problems, I/O errors),
2 usage errors (bad options, a missing path, a path that is not a journal, a bad
time string), 130 interrupted (Ctrl-C; `tail -f` exits 0 on it). With the group
option ``--debug`` an unexpected error shows its traceback instead. A closed
stdout pipe (``sej scan DIR | head``) ends the command quietly with exit 0.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from .. import __version__
from ..errors import InvalidArgumentError, LockedError, OffsetOutOfRangeError, SejError
from .copy import copy_cmd
from .errors import INTERRUPTED, OK, PROBLEMS, USAGE, Failure, Usage
from .maintenance import old, stat, verify
from .messages import count, scan, tail
from .readers import offset_cmd, reset
from .segments import dump, file_cmd


class _State:
    debug = False


STATE = _State()


def error_line(message: str) -> None:
    """Print `sej: error: message` on stderr as one line."""
    one = " ".join(str(message).split())
    _flush_stdout(0)  # what was printed before the error comes first on a terminal
    try:
        click.echo(f"sej: error: {one}", err=True)
    except (BrokenPipeError, ValueError):
        pass


def translate(e: BaseException) -> Failure:
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
    return Failure(f"internal error: {type(e).__name__}: {e} (run 'sej --debug ...' to see the traceback)", PROBLEMS)


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so flushing at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (tests): nothing will flush to a closed pipe


_NULL_HANDLER = logging.NullHandler()


def quiet_library_logs(quiet: bool) -> None:
    """Keep the library's log records (recovery's warning) and paramiko's (its transport thread logs the
    error a connection died of, with a traceback) off stderr: the commands report for themselves."""
    for name in ("sej", "paramiko"):
        logger = logging.getLogger(name)
        if quiet and _NULL_HANDLER not in logger.handlers:
            logger.addHandler(_NULL_HANDLER)
        elif not quiet and _NULL_HANDLER in logger.handlers:
            logger.removeHandler(_NULL_HANDLER)


class SejGroup(click.Group):
    """A click group that turns every error into one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            _silence_stdout()
            return OK
        except Exception as e:
            if STATE.debug:
                raise
            raise translate(e) from e

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        STATE.debug = False
        try:
            rv = super().main(args, prog_name or "sej", complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else OK
        except click.exceptions.NoArgsIsHelpError as e:
            assert e.ctx is not None
            click.echo(e.ctx.get_help())
            error_line("no command given")
            code = USAGE
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None and not isinstance(e, Usage) else ""
            error_line(e.format_message() + hint)
            code = USAGE
        except click.ClickException as e:
            error_line(e.format_message())
            code = e.exit_code
        except click.Abort:
            code = INTERRUPTED
        code = _flush_stdout(code)
        if standalone_mode:
            sys.exit(code)
        return code


def _flush_stdout(code: int) -> int:
    for stream in (sys.stdout, getattr(sys.stdout, "buffer", None)):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:
            _silence_stdout()
        except (OSError, ValueError):
            pass
    return code


@click.group(cls=SejGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks of unexpected errors.")
@click.version_option(__version__, prog_name="sej")
def cli(debug: bool) -> None:
    """Inspect and maintain sej journals (byte-compatible with h12.io/sej).

    DIR is a journal directory (holding jnl/), a sharded root of
    <prefix>.<bit>.<index>/ journals, or a hub root of <client>.<shard>/
    journals. Exit codes: 0 fine, 1 problems found, 2 usage errors.
    """
    STATE.debug = debug
    quiet_library_logs(not debug)


for command in (dump, file_cmd, scan, count, tail, offset_cmd, reset, old, verify, stat, copy_cmd):
    cli.add_command(command)


def main() -> None:
    """The console script `sej`."""
    cli.main(prog_name="sej")
