"""`sej-archive`, for cron: archive journals into Parquet, the segments every reader has passed, exactly once.

    sej-archive PATH DEST [--master URL] [--reader NAME] [--dry-run] [--debug]
    python -m sej.apps.archive ...     (the same)

PATH is a journal, a sharded root or a hub root; DEST the archive directory
(`client=<c>/shard=<s>/date=<UTC date>/<a>-<b>-<k>.parquet`). The run holds
`DEST/.archive.lck` (exclusive, non-blocking): when another run holds it, this one says
so on stderr and exits 0 without archiving (the run that holds it is doing the work).
Spark starts only when there is something to archive; --dry-run never starts it.
Prints one line per journal: the offsets archived and the row and file counts.

Exit codes: 0 done (or another run holds the lock), 1 problems (verification failed,
a reader offset locked or inconsistent, I/O or Spark errors), 2 usage errors (a missing
PATH, no journal in it, a bad DEST or reader name). Errors are one line,
`sej-archive: error: ...`, without a traceback unless --debug. See docs/archive.md. It needs
PySpark (sej's `spark` extra), imported only when the command runs: --help works without it.
"""

from __future__ import annotations

import os
from typing import Any

import click

from .. import __version__
from ..errors import LockedError
from .shell import OK, Failure, Program, debug_option, debugging

PROG = "sej-archive"


@click.command(cls=Program, name=PROG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path")
@click.argument("dest")
@click.option("--master", default=None, metavar="URL", help="Spark master (default: $SPARK_MASTER or local[2]).")
@click.option("--reader", default="archive", show_default=True, help="The reader name of the archive's offsets.")
@click.option("--dry-run", is_flag=True, help="Print what would be archived; write nothing, start no Spark.")
@debug_option("Show tracebacks of unexpected errors and Spark's log.")
@click.version_option(__version__, prog_name=PROG)
def cli(path: str, dest: str, master: str | None, reader: str, dry_run: bool) -> int:
    """Archive the sealed segments of PATH that every reader has passed into Parquet under DEST."""
    try:
        from ..spark import spark_session
        from ..spark.archive import archive, describe, lock_path
    except ModuleNotFoundError as e:
        raise Failure(f"{e}: install sej with its 'spark' extra (pip install '.[spark]' in a checkout)") from None
    debug = debugging()

    def start_spark() -> Any:
        spark = spark_session("sej-archive", master)
        spark.sparkContext.setLogLevel("WARN" if debug else "ERROR")
        return spark

    try:
        report = archive(start_spark, path, dest, reader=reader, dry_run=dry_run)
    except LockedError as e:
        if e.path != lock_path(os.path.abspath(dest)):
            raise
        click.echo(f"{PROG}: another run holds the lock {e.path}; nothing to do", err=True)
        return OK
    for j in report.journals:
        click.echo(describe(j, report.dry_run))
    verb = "would archive" if report.dry_run else "archived"
    click.echo(f"{verb} {report.rows} rows of {len(report.journals)} journals into {report.dest}")
    return OK


def main() -> None:
    """The console script `sej-archive`."""
    cli.main(prog_name=PROG)


if __name__ == "__main__":
    main()
