#!/usr/bin/env python3
"""Archive journals into Parquet for cron: the segments every reader has passed, exactly once.

    archive.py PATH DEST [--master URL] [--reader NAME] [--dry-run] [--debug]

PATH is a journal, a sharded root or a hub root; DEST the archive directory
(`client=<c>/shard=<s>/date=<UTC date>/<a>-<b>-<k>.parquet`). The run holds
`DEST/.archive.lck` (exclusive, non-blocking): when another run holds it, this one says
so on stderr and exits 0 without archiving (the run that holds it is doing the work).
Spark starts only when there is something to archive; --dry-run never starts it.
Prints one line per journal: the offsets archived and the row and file counts.

Exit codes: 0 done (or another run holds the lock), 1 problems (verification failed,
a reader offset locked or inconsistent, I/O or Spark errors), 2 usage errors (a missing
PATH, no journal in it, a bad DEST or reader name). Errors are one line,
`archive: error: ...`, without a traceback unless --debug. See docs/archive.md.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

try:
    import sej.spark.archive  # noqa: F401  (installed: pip install -e '.[spark]')
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sej.cmd.command import OneLineCommand
from sej.cmd.errors import OK
from sej.errors import LockedError
from sej.spark.archive import archive, describe, lock_path


@click.command(cls=OneLineCommand, name="archive", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path")
@click.argument("dest")
@click.option("--master", default=None, metavar="URL", help="Spark master (default: $SPARK_MASTER or local[2]).")
@click.option("--reader", default="archive", show_default=True, help="The reader name of the archive's offsets.")
@click.option("--dry-run", is_flag=True, help="Print what would be archived; write nothing, start no Spark.")
@click.option("--debug", is_flag=True, help="Show tracebacks of unexpected errors and Spark's log.")
def cli(path: str, dest: str, master: str | None, reader: str, dry_run: bool, debug: bool) -> int:
    """Archive the sealed segments of PATH that every reader has passed into Parquet under DEST."""
    OneLineCommand.debug = debug

    def start_spark() -> Any:
        from sej.spark import spark_session

        spark = spark_session("sej-archive", master)
        spark.sparkContext.setLogLevel("WARN" if debug else "ERROR")
        return spark

    try:
        report = archive(start_spark, path, dest, reader=reader, dry_run=dry_run)
    except LockedError as e:
        if e.path != lock_path(os.path.abspath(dest)):
            raise
        click.echo(f"archive: another run holds the lock {e.path}; nothing to do", err=True)
        return OK
    for j in report.journals:
        click.echo(describe(j, report.dry_run))
    verb = "would archive" if report.dry_run else "archived"
    click.echo(f"{verb} {report.rows} rows of {len(report.journals)} journals into {report.dest}")
    return OK


if __name__ == "__main__":
    cli.main(prog_name="archive")
