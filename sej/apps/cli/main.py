"""The `sej` click group: every command of the tool.

Errors end as one line, ``sej: error: ...``, with the exit codes of every program
(sej.apps.shell): 0 fine, 1 problems found, 2 usage errors, 130 interrupted (Ctrl-C;
`tail -f` exits 0 on it). With the group option ``--debug`` an unexpected error shows
its traceback instead. A closed stdout pipe (``sej scan DIR | head``) ends the command
quietly with exit 0.
"""

from __future__ import annotations

import importlib

import click

from ... import __version__
from ..shell import ProgramGroup, debug_option, debugging, quiet_library_logs

COMMANDS = {
    "copy": "copy:copy_cmd",
    "count": "messages:count",
    "dump": "segments:dump",
    "file": "segments:file_cmd",
    "hub": "hubstatus:hub",
    "offset": "readers:offset_cmd",
    "old": "maintenance:old",
    "reset": "readers:reset",
    "scan": "messages:scan",
    "serve": "serve:serve_cmd",
    "stat": "maintenance:stat",
    "tail": "messages:tail",
    "verify": "maintenance:verify",
}
"""Every command: its module and name in sej.apps.cli. A module is imported when one of its commands
runs (or `sej --help` lists them all), so `sej --version` and `sej scan` import no more than they use."""


class SejGroup(ProgramGroup):
    """The `sej` group: its commands are loaded by name (COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, name = where.split(":")
        command: click.Command = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        return command


@click.group(cls=SejGroup, name="sej", context_settings={"help_option_names": ["-h", "--help"]})
@debug_option()
@click.version_option(__version__, prog_name="sej")
def cli() -> None:
    """Inspect and maintain sej journals (byte-compatible with h12.io/sej).

    DIR is a journal directory (holding jnl/), a sharded root of
    <prefix>.<bit>.<index>/ journals, or a hub root of <client>.<shard>/
    journals. Exit codes: 0 fine, 1 problems found, 2 usage errors.
    """
    quiet_library_logs(not debugging())


def main() -> None:
    """The console script `sej`."""
    cli.main(prog_name="sej")
