"""The `sej` command-line tool: inspect, scan, tail, verify and maintain journals.

    sej [--debug] COMMAND ...

`sej.apps.cli.main:main` is the console script; `python -m sej.apps.cli` runs the same.
See docs/cli.md for every command, its options and exit codes.
"""
