"""`sej hub status HUB_ROOT`: each client's journals at the hub, from what is on disk.

The hub's next offsets come from its journals; the producers' next offsets (as the daemon's last
pass saw them), the last successful pass and the errors from the records sej-hub keeps in
`<hub_root>/.sej-hub/` (sej.hub.status). No daemon needs to run, and none is asked.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import click

from ...hub.status import ClientStatus, StatusRow, read_status
from ...layout import HUB_STATUS_DIR
from ..shell import Failure, usage
from .output import table

_CONTROL = dict.fromkeys([*range(32), *range(127, 160)], "?")


def _shown(text: str | None) -> str:
    """Text from a record (a file anyone with access to the hub root could write), safe on a terminal."""
    return "" if text is None else text.translate(_CONTROL)


def _ago(t: float | None, now: float) -> str:
    return "never" if t is None else f"{max(0.0, now - t):.1f}s ago"


def _copying(rec: ClientStatus, now: float) -> str:
    """How long ago the pass under way last wrote bytes at the hub, if one does."""
    return f", a pass under way wrote {_ago(rec.last_progress, now)}" if rec.in_pass and rec.last_progress else ""


def _num(v: int | None) -> object:
    return "?" if v is None else v


@click.group("hub", short_help="The hub's view of its clients (sej hub status).")
def hub() -> None:
    """Commands about a hub root (the copies sej-hub makes)."""


@hub.command("status", short_help="Each client's journals at the hub: offsets, lag, last good pass, errors.")
@click.argument("hub_root", type=click.Path(path_type=str))
@click.option("--client", "only", metavar="ID", help="Only this client.")
@click.option("--max-lag", type=click.IntRange(min=0), metavar="N",
              help="Exit 1 if a journal is more than N messages behind (or its lag is unknown).")  # fmt: skip
@click.option("--max-age", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Exit 1 if a client's last successful pass is older than this (before its first, counted "
                   "from the daemon's start; a pass under way that writes bytes counts as fresh, as for "
                   "/health).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {clients: [...], journals: [...]}.")
def status(hub_root: str, only: str | None, max_lag: int | None, max_age: float | None, as_json: bool) -> int:
    """Each client's journals at HUB_ROOT: the hub's next offset (from its journals),
    the producer's next offset and the lag as sej-hub's last pass saw them, the
    client's last successful pass and its errors (from the records sej-hub keeps in
    HUB_ROOT/.sej-hub/).

    The lag is how far behind the hub was when its last pass looked at the
    producer, before copying what it found (about one poll interval's messages
    while the producer writes; 0 once a pass finds nothing new). Exit codes: 0
    fine; 1 when a client or journal is failing, a record cannot be read, or a
    journal is behind more than --max-lag, or a client's last successful pass is
    older than --max-age (as for sej-hub's /health: before its first, counted
    from the daemon's start; a pass under way that keeps writing bytes at the
    hub counts as fresh), or when sej-hub keeps no client there; 2 usage errors
    (also: HUB_ROOT holds neither sej-hub's records nor journals, so it is no
    hub root).
    """
    if not os.path.isdir(hub_root):
        raise usage(f"{hub_root} {'is not a directory' if os.path.lexists(hub_root) else 'does not exist'}")
    now = time.time()
    st = read_status(hub_root)
    if not st.rows and not st.records and not st.problems:  # a monitoring check must not pass on the wrong path
        records = os.path.join(hub_root, HUB_STATUS_DIR)
        if not os.path.isdir(records):
            raise usage(f"{hub_root} is not a hub root: no records of sej-hub in {records}/ and no journals "
                        "(give the hub_root of sej-hub's configuration)")  # fmt: skip
        raise Failure(f"no client at {hub_root}: sej-hub keeps no record in {records}/ and there is no journal")
    rows = [r for r in st.rows if only is None or r.client_id == only]
    records = {cid: rec for cid, rec in st.records.items() if only is None or cid == only}
    if only is not None and not rows and not records:
        raise usage(f"no client {only!r} at {hub_root} (no record, no journal)")
    clients = sorted({r.client_id for r in rows} | set(records))
    bad: list[str] = list(st.problems)
    for cid in clients:
        rec = records.get(cid)
        if rec is None:
            if max_age is not None:
                bad.append(f"client {cid}: no record of a pass (is sej-hub running for {hub_root}?)")
        else:
            if rec.last_error is not None:
                bad.append(f"client {cid}: {rec.last_error}")
            if max_age is not None and rec.age(now) > max_age:  # /health's rule: a pass that copies is fresh
                last = (_ago(rec.last_success, now) if rec.last_success is not None
                        else f"never (sej-hub started {_ago(rec.since, now)})")  # fmt: skip
                bad.append(f"client {cid}: last successful pass {last}{_copying(rec, now)} (--max-age {max_age:g})")
    for r in rows:
        if r.error is not None and (records.get(r.client_id) is None or records[r.client_id].last_error != r.error):
            bad.append(f"client {r.client_id}, journal {r.journal}: {r.error}")
        if max_lag is not None and not r.gone and (r.lag is None or r.lag > max_lag):
            bad.append(f"client {r.client_id}, journal {r.journal}: lag {_num(r.lag)} (--max-lag {max_lag})")
    if as_json:
        click.echo(json.dumps({"clients": [_client_doc(cid, records.get(cid), now) for cid in clients],
                               "journals": [_row_doc(r) for r in rows], "problems": bad}))  # fmt: skip
    else:
        headers = ["CLIENT", "JOURNAL", "HUB NEXT", "PRODUCER NEXT", "LAG", "LAG BYTES", "LAST GOOD PASS", "ERROR"]
        lines = [[r.client_id, r.journal, _num(r.hub_next), "gone" if r.gone else _num(r.producer_next), _num(r.lag),
                  _num(r.lag_bytes), _ago(r.last_success, now), _shown(r.error)] for r in rows]  # fmt: skip
        click.echo(table(headers, lines))
        for cid in clients:
            click.echo(_client_line(cid, records.get(cid), now))
        for line in bad:
            click.echo(f"problem: {_shown(line)}", err=True)
    return 1 if bad else 0


def _client_line(cid: str, rec: ClientStatus | None, now: float) -> str:
    if rec is None:
        return f"client {cid}: no record (sej-hub has not run a pass for it here)"
    errors = ", ".join(f"{k} {n}" for k, n in sorted(rec.errors.items())) or "none"
    return (f"client {cid}: {_shown(rec.location)}, {_connection(rec, now)}, "
            f"last good pass {_ago(rec.last_success, now)}, {rec.passes} passes, errors: {errors}; "
            f"record written {_ago(rec.written, now)}")  # fmt: skip


def _connection(rec: ClientStatus, now: float) -> str:
    if rec.connected:
        return "connected"
    return "not connected" if rec.lost is None else f"not connected (connection lost {_ago(rec.lost, now)})"


def _client_doc(cid: str, rec: ClientStatus | None, now: float) -> dict[str, Any]:
    if rec is None:
        return {"client": cid, "record": False}
    return {
        "client": cid,
        "record": True,
        "location": rec.location,
        "connected": rec.connected,
        "lost": rec.lost,
        "passes": rec.passes,
        "last_success": rec.last_success,
        "seconds_since_success": None if rec.last_success is None else round(now - rec.last_success, 3),
        "in_pass": rec.in_pass,
        "last_progress": rec.last_progress,  # bytes last written at the hub by the pass under way
        "age": round(rec.age(now), 3),  # what --max-age and /health compare: the later of the two, or the start
        "last_pass_seconds": rec.last_pass_seconds,
        "errors": rec.errors,
        "last_error": rec.last_error,
        "written": rec.written,
    }


def _row_doc(r: StatusRow) -> dict[str, Any]:
    return {
        "client": r.client_id,
        "journal": r.journal,
        "path": r.path,
        "hub_next": r.hub_next,
        "producer_next": r.producer_next,
        "lag": r.lag,
        "lag_bytes": r.lag_bytes,
        "last_success": r.last_success,
        "error": r.error,
        "gone": r.gone,  # the producer no longer has this journal (the hub keeps its copy)
    }


__all__ = ["hub"]
