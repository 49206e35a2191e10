"""A click command for standalone programs (sej-hub, the cron scripts): every error is one line.

Errors end as ``<prog>: error: ...`` on stderr and an exit code (0 fine, 1 problems,
2 usage, 130 interrupted). Setting ``OneLineCommand.debug`` (from a ``--debug`` option)
lets unexpected errors show their traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from ..errors import InvalidArgumentError, SejError
from .errors import INTERRUPTED, OK, PROBLEMS, USAGE, Failure, Usage


def translate(e: BaseException, prog: str) -> Failure:
    """The one-line error and exit code for an exception."""
    if isinstance(e, InvalidArgumentError):
        return Failure(str(e), USAGE)
    if isinstance(e, SejError):
        return Failure(str(e), PROBLEMS)
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return Failure(f"{where}{e.strerror or e}", PROBLEMS)
    return Failure(f"internal error: {type(e).__name__}: {e} (run '{prog} --debug ...' to see the traceback)")


def error_line(prog: str, message: str) -> None:
    """Print `<prog>: error: message` on stderr as one line."""
    one = " ".join(str(message).split())
    try:
        click.echo(f"{prog}: error: {one}", err=True)
    except (BrokenPipeError, ValueError):
        pass


class OneLineCommand(click.Command):
    """A click command whose errors end as one line on stderr and an exit code."""

    debug = False

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as e:
            if OneLineCommand.debug:
                raise
            raise translate(e, ctx.command_path) from e

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        OneLineCommand.debug = False
        prog = prog_name or self.name or "sej"
        try:
            rv = super().main(args, prog, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else OK
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None and not isinstance(e, Usage) else ""
            error_line(prog, e.format_message() + hint)
            code = USAGE
        except click.ClickException as e:
            error_line(prog, e.format_message())
            code = e.exit_code
        except click.Abort:
            code = INTERRUPTED
        if standalone_mode:
            sys.exit(code)
        return code


__all__ = ["OneLineCommand", "error_line", "translate"]
