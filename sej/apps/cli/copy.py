"""`sej copy SRC DST`: one copy pass of every journal SRC has into the hub root DST."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from ...hub.location import TRANSPORTS, Origin, Sources, open_sources, parse_location
from ...hub.names import check_client_id
from ...layout import segment_dir
from ..shell import Failure, usage
from .progress import enabled

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ...hub.batch import JournalOutcome
    from ...hub.copy import Destinations
    from ...hub.copy_state import CopyState
    from ...hub.source import Source


def default_client_id(host: str | None) -> str:
    """The client directory prefix for a source host: its name with every other character as '-'."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", host)[:100] if host else "local"


@click.command("copy")
@click.argument("src")
@click.argument("dst")
@click.option("--client-id", help="Client directory prefix in DST (default: the source host name, or 'local').")
@click.option("--reader-name", default="hub", show_default=True, help="Reader offset committed on the source.")
@click.option("--identity", type=click.Path(dir_okay=False), help="SSH private key (default: ~/.ssh config or keys).")
@click.option("--known-hosts", type=click.Path(dir_okay=False), help="known_hosts file (default: ~/.ssh/known_hosts).")
@click.option("--accept-new-host-key", is_flag=True, help="Trust and record an unknown host key (never the default).")
@click.option("--workers", type=click.IntRange(1, 64), default=4, show_default=True, help="Journals copied at once.")
@click.option("--transport", type=click.Choice(TRANSPORTS), default="auto", show_default=True,
              help="ssh:// sources: `sej serve` on the source (serve), SFTP (sftp), or serve if the source has it.")
@click.option("--serve-command", default="sej", show_default=True,
              help="The sej program on the source, for a sej not on its PATH (e.g. /opt/app/venv/bin/sej).")
@click.option("--compress", is_flag=True, help="ssh:// sources: SSH's own zlib (as scp -C), for slow links.")
def copy_cmd(
    src: str,
    dst: str,
    client_id: str | None,
    reader_name: str,
    identity: str | None,
    known_hosts: str | None,
    accept_new_host_key: bool,
    workers: int,
    transport: str,
    serve_command: str,
    compress: bool,
) -> None:
    """Copy every journal of SRC that DST lacks, exactly once, then exit.

    SRC is a local journal or sharded root, or ssh://[user@]host[:port]/path
    (~/.ssh/config host entries apply), read through `sej serve` on the source
    when it has sej, else over SFTP (--transport). DST is the local hub root: each
    journal goes to DST/<client-id>.<journal>. The hub's position is committed on
    the source as the reader offset --reader-name after each durable write.

    What a run learned (each journal's end) is cached in $XDG_CACHE_HOME/sej/copy
    (default ~/.cache/sej/copy), so the next run checks an unchanged journal with
    two stats instead of listing it.
    """
    if parse_location(dst) is not None:
        raise usage(f"DST must be a local directory (the hub root), got {dst}")
    if client_id is not None:
        check_client_id(client_id)  # a bad one is a usage error, before anything is copied
    origin = Origin.parse(src, identity=identity, known_hosts=known_hosts, accept_new_host_key=accept_new_host_key,
                          transport=transport, serve_command=serve_command, compression=compress)  # fmt: skip
    if origin.is_local:
        if not os.path.isdir(src):
            raise usage(f"{src} does not exist or is not a directory")
        if not os.path.isdir(segment_dir(src)) and not any(
            os.path.isdir(os.path.join(src, n, "jnl")) for n in os.listdir(src)
        ):
            raise usage(f"{src} is neither a journal nor a root of journals")
    cid = client_id or default_client_id(origin.host)
    skipped: list[str] = []

    def on_skip(name: str, why: str) -> None:
        skipped.append(f"{name!r}: {why}")
        click.echo(f"sej: warning: {src}: skipping {name!r}: {why}", err=True)

    opening = _Opening(origin)  # the SSH handshake and the server's start, while the copy engine loads here
    destinations: Destinations | None = None
    try:
        from ...hub.copy import Destinations, open_journals
        from ...hub.copy_state import CopyState, state_file

        os.makedirs(dst, exist_ok=True)
        state = CopyState.load(state_file(os.path.realpath(src) if origin.is_local else src, dst, cid, reader_name))
        from ...hub import batch  # noqa: F401  # loaded here, meanwhile, not when the pass begins

        destinations = Destinations(open_journals())
        if state.tails and not opening.wait(FAR_AFTER):  # the hub journals the last run copied into, opened while a
            destinations.open_ahead(_hub_dirs(dst, cid, state, opening.done))  # far connection opens; the rest later
        with opening.sources() as sources:
            outcomes = _run(opening.make_source(sources), dst, cid, reader_name, workers, threading.Event(), on_skip,
                            state, destinations)  # fmt: skip
    finally:
        opening.close()
        if destinations is not None:
            destinations.close()
    if not outcomes:
        raise Failure(f"{src}: found no journal to copy" + (f" (skipped {'; '.join(skipped)})" if skipped else ""))
    failed = 0
    for o in outcomes:
        if o.error is None and o.result is not None:
            r = o.result
            click.echo(
                f"{o.journal} -> {r.destination}: {r.messages} messages, {r.bytes} bytes, next offset {r.next_offset}"
            )
        else:
            failed += 1
            click.echo(f"{o.journal}: error: {o.error}", err=True)
    if failed:
        raise Failure(f"{failed} of {len(outcomes)} journals could not be copied (see above)")


class _Opening:
    """open_sources(origin) in a thread of its own, started at once: at a distance, the SSH handshake, the channel's
    opening and the start of `sej serve` are round trips and the producer's work (0.7-1 s at +50 ms), during which
    this process loads the copy engine and the state. A daemon thread: Ctrl-C does not wait for a connect to end."""

    def __init__(self, origin: Origin) -> None:
        self._got: list[Sources] = []
        self._first: list[Source] = []  # the pass's first Source (its lister: over SFTP, a channel), made here too
        self._failed: list[BaseException] = []
        self._closed = False
        self._lock = threading.Lock()
        if origin.is_local:
            self._got.append(open_sources(origin))
            self._thread: threading.Thread | None = None
            return
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._open, args=(origin,), name="sej-copy-connect", daemon=True)
        self._thread.start()

    def _open(self, origin: Origin) -> None:
        try:
            got = open_sources(origin)
        except BaseException as e:  # raised in the caller's thread by sources()
            self._failed.append(e)
            return
        try:
            self._first.append(got())
        except Exception:  # noqa: S110 - the pass makes its own, and reports what this one raised
            pass
        with self._lock:
            closed = self._closed
            if not closed:
                self._got.append(got)
        if closed:  # the command failed meanwhile
            got.close()

    def wait(self, seconds: float) -> bool:
        """Whether the Sources are open (or failed to) `seconds` after opening them began, waiting until then."""
        if self._thread is not None:
            self._thread.join(max(0.0, self._started + seconds - time.monotonic()))
        return self.done()

    def done(self) -> bool:
        """Whether the Sources are open, or failed to open (sources() raises why)."""
        return self._thread is None or not self._thread.is_alive()

    def sources(self) -> Sources:
        """The Sources, once open (the caller closes them); what opening them raised."""
        if self._thread is not None:
            self._thread.join()
        if self._failed:
            raise self._failed[0]
        with self._lock:
            return self._got.pop()

    def make_source(self, sources: Sources) -> Callable[[], Source]:
        """copy_all's `make_source`: the Source made with the connection first, then new ones."""

        def make() -> Source:
            return self._first.pop() if self._first else sources()

        return make

    def close(self) -> None:
        """Close the Sources if opened, or when they are (not waiting for them)."""
        with self._lock:
            self._closed = True
            got, self._got = self._got, []
        for sources in got:
            sources.close()


FAR_AFTER = 0.3
"""Seconds after which a connection still opening is a far one (on this machine's loopback, paramiko's handshake
and an SFTP channel take 0.15-0.25 s; at +50 ms of round trip, with sej serve's start, 0.7-1 s): only then are the
hub journals opened ahead, in the time left. Nearby that would only contend with the handshake: an idle pass over
1,000 journals took 0.08 s longer with them opened ahead, and an incremental one gained nothing."""


def _hub_dirs(dst: str, cid: str, state: CopyState, stop: Callable[[], bool]) -> Iterator[str]:
    """The hub's journal directories of the journals `state` knows, until `stop()`."""
    from ...errors import InvalidArgumentError
    from ...hub.names import destination_name

    for journal in state.tails:
        if stop():
            return
        try:
            yield os.path.join(dst, destination_name(cid, journal))
        except InvalidArgumentError:
            continue  # the pass reports it


def _run(
    make_source: Callable[[], Source],
    dst: str,
    cid: str,
    reader_name: str,
    workers: int,
    stop: threading.Event,
    on_skip: Callable[[str, str], None],
    state: CopyState,
    destinations: Destinations,
) -> list[JournalOutcome]:
    from ...hub.batch import copy_all

    if not enabled():
        return copy_all(make_source, dst, cid, reader_name, workers, stop, on_skip=on_skip, state=state,
                        destinations=destinations)  # fmt: skip
    with click.progressbar(length=0, label="copying", file=sys.stderr, show_pos=True) as bar:
        lock = threading.Lock()

        def on_bytes(n: int) -> None:
            with lock:
                bar.length = (bar.length or 0) + n
                bar.update(n)

        return copy_all(make_source, dst, cid, reader_name, workers, stop, on_bytes, on_skip, state, destinations)
