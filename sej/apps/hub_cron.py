"""`sej-hub-cron`: one hub pass for cron, copying every client of a hub.toml once, never two runs at a time.

    sej-hub-cron --config /etc/sej/hub.toml [--max-time SECONDS] [--log-level LEVEL] [--debug]
    python -m sej.apps.hub_cron ...     (the same)

The run holds `<hub_root>/.hub.lck` (exclusive, non-blocking, the same lock the
sej-hub daemon holds). When another run (or the daemon) holds it, this one logs
"another run holds the lock" and exits 0 without copying: the run that holds it
is doing the work. A pass longer than --max-time stops after its current chunks
(each ends with an fsync; the next run continues where it stopped). SIGTERM and
SIGINT stop it the same way.

Exit codes: 0 the pass had no failures (or another run holds the lock),
1 a client or a journal failed, 2 usage errors (a missing or invalid config),
130 stopped by a signal. See docs/hub.md and `sej-hub --print crontab`.
"""

from __future__ import annotations

import logging
import threading

import click

from .. import __version__
from ..errors import LockedError
from ..hub.daemon import lock_hub, lock_path
from ..lock import unlock_file
from .hub import LEVELS, exit_process, run_pass, start, stop_on_signals, summarize
from .shell import INTERRUPTED, OK, Failure, Program, debug_option

PROG = "sej-hub-cron"

log = logging.getLogger("sej.hub")

DEFAULT_MAX_TIME = 3300.0
"""Seconds: a pass stops after 55 minutes, before an hourly cron would start the next one."""


@click.command(cls=Program, name=PROG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE", help="The hub.toml file.")
@click.option(
    "--max-time",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_MAX_TIME,
    show_default=True,
    help="Stop the pass after this many seconds (after the current chunks).",
)
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None, help="Default INFO.")
@debug_option("Show tracebacks of unexpected errors; log at DEBUG.")
@click.version_option(__version__, prog_name=PROG)
def cron(config_path: str, max_time: float, log_level: str | None) -> int:
    """One copy pass over every client of FILE, under the hub root's lock."""
    config = start(config_path, log_level)
    try:
        lock = lock_hub(config)
    except LockedError:
        log.info("another run holds the lock %s; nothing to do", lock_path(config))
        return OK
    stop = threading.Event()
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        stop.set()

    timer = threading.Timer(max_time, expire)
    timer.daemon = True
    try:
        with stop_on_signals(stop):
            timer.start()
            reports = run_pass(config, stop)
    finally:
        timer.cancel()
        unlock_file(lock)
    failures = summarize(reports)
    if failures:
        raise Failure(f"{len(failures)} failures in {sum(1 for r in reports if not r.ok)} of {len(reports)} clients")
    if stop.is_set():
        if timed_out.is_set():
            log.warning("--max-time %gs reached: the pass stopped early; the next run continues", max_time)
            return OK
        raise Failure("interrupted: the pass stopped early (the next run continues)", INTERRUPTED)
    return OK


def main() -> None:
    """The console script `sej-hub-cron`."""
    exit_process(cron.main(prog_name=PROG, standalone_mode=False))


if __name__ == "__main__":
    main()
