"""The `sej-hub` console script: the hub daemon, or one pass with --once.

    sej-hub --config hub.toml [--once] [--log-level LEVEL] [--debug]
    python -m sej.apps.hub ...     (the same)

Logs go to stderr (logger "sej.hub"). Errors end as ONE line on stderr,
``sej-hub: error: ...``, and an exit code, as with the `sej` tool: 0 fine (the
daemon stopped by SIGTERM/SIGINT, or a pass without failures), 1 problems (a
client or a journal failed in --once, another hub holds the lock, I/O errors),
2 usage errors (bad options, a missing or invalid config file), 130 a --once
pass interrupted by a signal. With --debug an unexpected error shows its
traceback instead.

The helpers here (logging, signals, one pass, the lock, exiting) serve sej-hub-cron
(sej.apps.hub_cron) too. The hub itself is the library sej.hub.
"""

from __future__ import annotations

import concurrent.futures.thread
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import IO, NoReturn

import click

from .. import __version__
from ..errors import CorruptionWarning, LockedError
from ..hub.config import HubConfig, load_config
from ..hub.daemon import ClientReport, Hub, lock_hub, lock_path
from ..hub.location import transport_errors
from ..hub.metrics import MetricsServer
from ..lock import unlock_file
from .hub_files import config_option, print_option
from .notify import Notifier
from .shell import INTERRUPTED, OK, PROBLEMS, Failure, Program, debug_option, debugging

log = logging.getLogger("sej.hub")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_RECORD_KEYS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the record's own fields
    (client, journal, messages, bytes, seconds, hub_next, producer_next, ...), and a traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_KEYS and not key.startswith("_"):
                doc[key] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
        if record.exc_info:
            doc["traceback"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str, log_format: str = "text") -> None:
    """Log records of sej (and paramiko's warnings) to stderr at `level`, as text or one JSON object a line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    # paramiko says "Connected (version ...)" and "Authentication ... successful" at INFO on every connect.
    logging.getLogger("paramiko").setLevel(level if level == "DEBUG" else "WARNING")
    # Python warnings go through the log too (with log_format = "json", every line on stderr is one object);
    # recovery's CorruptionWarning is already logged by sej itself, as a warning of the logger "sej".
    warnings.filterwarnings("ignore", category=CorruptionWarning)
    logging.captureWarnings(True)


def quiet_prefetch_errors() -> None:
    """Log, in one line, the error paramiko's SFTP prefetch thread dies of when a connection drops.

    The read that started the prefetch fails with that error too and is reported per journal,
    so the thread's traceback on stderr would only repeat it. Any other uncaught error of a thread
    is logged (with its traceback) instead of printed raw.
    """

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else ""
        if "_prefetch_thread" in name and isinstance(args.exc_value, transport_errors()):
            log.debug("SFTP prefetch stopped: %s", args.exc_value)
            return
        if args.exc_type is SystemExit:
            return
        # Through the log (one JSON object with log_format = "json"), not Python's raw traceback on stderr.
        log.error("unexpected error in thread %s: %s", name or "?", args.exc_value or args.exc_type.__name__,
                  exc_info=args.exc_value)  # fmt: skip

    threading.excepthook = hook


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set `stop` while inside (from the main thread only)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the main thread never waits on `stop` itself, so this cannot deadlock

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def summarize(reports: list[ClientReport]) -> list[str]:
    """Every failure of a pass, one line each."""
    return [line for r in reports for line in r.failures()]


def run_pass(config: HubConfig, stop: threading.Event) -> list[ClientReport]:
    """One pass over every client, then close the connections."""
    with Hub(config) as hub:
        reports = hub.run_once(stop)
    copied = sum(r.messages for r in reports)
    failures = summarize(reports)
    log.info(
        "pass done: %d clients, %d messages (%d bytes) copied, %d failures",
        len(reports),
        copied,
        sum(r.bytes for r in reports),
        len(failures),
    )
    return reports


def hold_lock(config: HubConfig) -> IO[str]:
    """The hub root's lock, or a Failure naming it when another hub run holds it."""
    try:
        return lock_hub(config)
    except LockedError:
        raise Failure(f"another hub run holds the lock {lock_path(config)}", PROBLEMS) from None


def start(config_path: str, log_level: str | None) -> HubConfig:
    """Common start of sej-hub and sej-hub-cron: the config, then logging (DEBUG with --debug) in its format.

    A bad config raises InvalidArgumentError: exit 2, before anything else (systemd: before READY=1).
    """
    config = load_config(config_path)
    setup_logging((log_level or ("DEBUG" if debugging() else "INFO")).upper(), config.log_format)
    quiet_prefetch_errors()
    return config


def serve_forever(config: HubConfig, stop: threading.Event) -> None:
    """The daemon: metrics endpoint (if configured), systemd notifications, passes until `stop`."""
    notifier = Notifier()
    hub = Hub(config)
    server = None
    try:
        if config.metrics_listen is not None:
            host, port = config.metrics_listen
            try:
                server = MetricsServer(hub.status, host, port, config.health_age)
            except OSError as e:
                raise Failure(f"metrics_listen = {host}:{port}: cannot listen there: {e.strerror or e}") from None
            except ModuleNotFoundError as e:
                raise Failure(f"metrics_listen needs {e.name}, which comes with the hub extra (docs/hub.md)") from None
            log.info("metrics on http://%s:%d/metrics and /health", *server.address[:2],
                     extra={"metrics_address": f"{server.address[0]}:{server.address[1]}"})  # fmt: skip

        def status() -> str:
            stale = hub.status.stale(config.health_age)
            n = len(config.clients)
            return f"{n} clients, all copied within {config.health_age:g}s" if not stale else (
                f"{n} clients; no successful pass within {config.health_age:g}s: "
                + ", ".join(cid for cid, _ in stale))  # fmt: skip

        def ready() -> None:
            notifier.ready(f"{len(config.clients)} clients, first connections attempted")
            log.debug("ready (first connection attempts made)")

        def tick() -> None:
            notifier.ping(hub.alive(), status())

        # Without systemd's watchdog (WATCHDOG_USEC), nothing to do between passes.
        hub.run_forever(stop, on_ready=ready, on_tick=tick if notifier.interval is not None else None)
    finally:
        notifier.stopping()
        if server is not None:
            server.close()


@click.command(cls=Program, name="sej-hub", context_settings={"help_option_names": ["-h", "--help"]})
@config_option()
@print_option()
@click.option("--once", is_flag=True, help="One pass over every client, then exit (1 if anything failed).")
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default=None,
    help="Log level on stderr (default INFO, or DEBUG with --debug).",
)
@debug_option("Show tracebacks of unexpected errors; log at DEBUG.")
@click.version_option(__version__, prog_name="sej-hub")
def cli(config_path: str, once: bool, log_level: str | None) -> int:
    """Copy producers' journals into the hub root, exactly once: the sej hub daemon.

    Reads FILE (hub.toml: hub_root, hub_name, poll_interval, commit_interval,
    workers, backoff_max, metrics_listen, health_max_age, log_format and
    [[client]] entries). Without --once it runs until SIGTERM or SIGINT, which let the
    current chunks finish; with metrics_listen it serves /metrics (Prometheus)
    and /health; under systemd (Type=notify) it sends READY=1 once the first
    connections were attempted, and WATCHDOG=1 while its passes make progress.
    Exit codes: 0 fine, 1 problems, 2 usage errors (a bad config: before
    READY=1).
    """
    config = start(config_path, log_level)
    stop = threading.Event()
    lock = hold_lock(config)
    try:
        with stop_on_signals(stop):
            if not once:
                serve_forever(config, stop)
                return OK
            reports = run_pass(config, stop)
    finally:
        unlock_file(lock)
    failures = summarize(reports)
    if failures:
        clients = sum(1 for r in reports if not r.ok)
        raise Failure(f"{len(failures)} failures in {clients} of {len(reports)} clients (see the log above)")
    if stop.is_set():
        raise Failure("interrupted: the pass stopped early (the next one continues)", INTERRUPTED)
    return OK


def exit_process(code: int) -> NoReturn:
    """Exit with `code`, also when a pass was abandoned in a call that never returns.

    Python's exit joins every non-daemon thread and every executor worker (the copy engine's): one
    stuck in the kernel (a hung network filesystem) would keep the process alive for good,
    whatever signal asked it to stop. Then the logs and streams are flushed and the process
    ends with os._exit. What such a thread was copying is safe to drop: the hub's offset on the
    source moves only after the copied bytes are fsynced, and the next copy cuts a torn tail aside.
    """
    deadline = time.monotonic() + EXIT_WAIT
    joined_at_exit = getattr(concurrent.futures.thread, "_threads_queues", {})  # executor workers, daemon or not
    stuck = []
    for t in threading.enumerate():
        if t is threading.current_thread() or (t.daemon and t not in joined_at_exit):
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            stuck.append(t.name)
    if not stuck:
        sys.exit(code)
    log.warning("exiting with %d threads still stuck in calls that did not return: %s", len(stuck), ", ".join(stuck))
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


EXIT_WAIT = 1.0
"""Seconds exit_process waits for threads still running before it stops waiting for them."""


def main() -> None:
    """The console script `sej-hub`."""
    exit_process(cli.main(prog_name="sej-hub", standalone_mode=False))


if __name__ == "__main__":
    main()
