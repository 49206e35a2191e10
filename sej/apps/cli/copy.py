"""`sej copy SRC DST`: one copy pass of every journal SRC has into the hub root DST."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable

import click

from ...hub.batch import JournalOutcome, copy_all
from ...hub.copy_state import CopyState, state_file
from ...hub.location import TRANSPORTS, Origin, open_sources, parse_location
from ...hub.names import check_client_id
from ...hub.source import Source
from ...layout import segment_dir
from ..shell import Failure, usage
from .progress import enabled


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

    with open_sources(origin) as sources:
        os.makedirs(dst, exist_ok=True)
        state = CopyState.load(state_file(os.path.realpath(src) if origin.is_local else src, dst, cid, reader_name))
        outcomes = _run(sources, dst, cid, reader_name, workers, threading.Event(), on_skip, state)
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


def _run(
    make_source: Callable[[], Source],
    dst: str,
    cid: str,
    reader_name: str,
    workers: int,
    stop: threading.Event,
    on_skip: Callable[[str, str], None],
    state: CopyState,
) -> list[JournalOutcome]:
    if not enabled():
        return copy_all(make_source, dst, cid, reader_name, workers, stop, on_skip=on_skip, state=state)
    with click.progressbar(length=0, label="copying", file=sys.stderr, show_pos=True) as bar:
        lock = threading.Lock()

        def on_bytes(n: int) -> None:
            with lock:
                bar.length = (bar.length or 0) + n
                bar.update(n)

        return copy_all(make_source, dst, cid, reader_name, workers, stop, on_bytes, on_skip, state)
