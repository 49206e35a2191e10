"""Progress bars for long work, on stderr and only when stderr is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click


def enabled(needs_stdout_redirected: bool = False) -> bool:
    """Whether to draw a bar: stderr is a terminal (and, for commands printing lines, stdout is not)."""
    try:
        if not sys.stderr.isatty():
            return False
        return not (needs_stdout_redirected and sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(length: int, label: str, *, needs_stdout_redirected: bool = False) -> Iterator[Callable[[int], None]]:
    """Yields `update(n)`: a click progress bar of `length` steps on stderr, or a no-op when quiet."""
    if length <= 0 or not enabled(needs_stdout_redirected):
        yield _nothing
        return
    with click.progressbar(length=length, label=label, file=sys.stderr, show_pos=False) as bar:
        yield bar.update


def _nothing(n: int) -> None:
    pass
