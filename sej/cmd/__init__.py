"""The `sej` command-line tool: inspect, scan, tail, verify and maintain journals.

    sej [--debug] COMMAND ...

`sej.cmd.main:main` is the console script; `python -m sej.cmd` runs the same.
See docs/cli.md for every command, its options and exit codes.
"""

from __future__ import annotations

from .main import cli, main

__all__ = ["cli", "main"]
