#!/usr/bin/env python3
"""One hub pass for cron: copy every client of a hub.toml once, never two runs at a time.

    hub-cron.py --config /etc/sej/hub.toml [--max-time SECONDS] [--log-level LEVEL] [--debug]

The run holds `<hub_root>/.hub.lck` (exclusive, non-blocking, the same lock the
sej-hub daemon holds). When another run (or the daemon) holds it, this one logs
"another run holds the lock" and exits 0 without copying: the run that holds it
is doing the work. A pass longer than --max-time stops after its current chunks
(each ends with an fsync; the next run continues where it stopped). SIGTERM and
SIGINT stop it the same way.

Exit codes: 0 the pass had no failures (or another run holds the lock),
1 a client or a journal failed, 2 usage errors (a missing or invalid config),
130 stopped by a signal. See docs/hub.md and scripts/hub.crontab.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import click

try:
    import sej.hub.main  # noqa: F401  (installed: pip install -e .)
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sej.cmd.command import OneLineCommand
from sej.cmd.errors import INTERRUPTED, OK, Failure
from sej.errors import LockedError
from sej.hub.daemon import lock_hub, lock_path
from sej.hub.main import LEVELS, exit_process, run_pass, start, stop_on_signals, summarize
from sej.lock import unlock_file

log = logging.getLogger("sej.hub")

DEFAULT_MAX_TIME = 3300.0
"""Seconds: a pass stops after 55 minutes, before an hourly cron would start the next one."""


@click.command(cls=OneLineCommand, name="hub-cron", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, metavar="FILE", help="The hub.toml file.")
@click.option(
    "--max-time",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_MAX_TIME,
    show_default=True,
    help="Stop the pass after this many seconds (after the current chunks).",
)
@click.option("--log-level", type=click.Choice(LEVELS, case_sensitive=False), default=None, help="Default INFO.")
@click.option("--debug", is_flag=True, help="Show tracebacks of unexpected errors; log at DEBUG.")
def cron(config_path: str, max_time: float, log_level: str | None, debug: bool) -> int:
    """One copy pass over every client of FILE, under the hub root's lock."""
    config = start(config_path, log_level, debug)
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


if __name__ == "__main__":
    exit_process(cron.main(prog_name="hub-cron", standalone_mode=False))
