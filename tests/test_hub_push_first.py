"""sej-hub's passes do not make a pushed journal wait for the work on the others: when a pass over every journal
is due (daemon.FULL_EVERY), the journals just pushed are copied first, in a pass of their own, and the pass over
every journal follows at once; and run_forever settles the heap (daemon.HEAP_SETTLE_EVERY), so that the collector's
full collections of the long-lived state do not pause the passes every few seconds."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import sej
from sej.hub import daemon
from sej.hub.daemon import ClientReport, Hub
from testing.timing import scaled, wait_until

from .test_hub_copy import assert_identical, produce
from .test_hub_daemon import local_config
from .test_hub_serve_idle import _at_hub, _running


def test_a_push_goes_before_the_pass_over_every_journal_that_follows_it_at_once(sshd, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(daemon, "FULL_EVERY", 0.0)  # every push finds a pass over every journal due
    monkeypatch.setattr(daemon, "IDLE_EVERY", 3600.0)
    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 200)
    journals = sorted(os.listdir(src))
    with _running(sshd, src, hub, "serve", poll_interval=3600.0) as run:
        reports = run.reports
        wait_until(lambda: all(_at_hub(hub, j) == sej.next_offset(str(src / j)) for j in journals), scaled(30),
                   "the first copy")  # fmt: skip
        client = run.hub._clients[0]

        def idle() -> bool:
            """No pass under way, owed or pushed for (the whole state's first push names none: a pass over every
            journal), and the pushed state trusted: the next pass is the append's."""
            busy = client._pass
            settled = getattr(client.remote, "_make", None)
            return ((busy is None or not busy.is_alive()) and not client.full_owed and client.last_ok
                    and client._named == set() and not client.pushed.is_set()
                    and settled is not None and settled.settled_for() > 0)  # fmt: skip

        def copier(j: str, seen: int) -> int | None:
            """The index of the report after `seen` that copied an append of `j`."""
            return next(
                (
                    k
                    for k in range(seen, len(reports))
                    if any(o.journal == j and o.result is not None and o.result.messages for o in reports[k].outcomes)
                ),
                None,
            )

        for j in journals[:3]:
            with sej.Writer(str(src / j), durability="flush") as w:  # opening it may be pushed: passed first
                wait_until(idle, scaled(20), "the hub idle")
                seen = len(reports)
                w.append(b"pushed")
                w.flush()
                want = sej.next_offset(str(src / j))
                wait_until(lambda seen=seen, j=j: copier(j, seen) is not None, scaled(20), "the append's pass")
                k = copier(j, seen)
                assert k is not None and _at_hub(hub, j) == want
                assert reports[k].named and not reports[k].complete and len(reports[k].outcomes) < len(journals), (
                    "the pushed journal was copied by the pass over every journal",
                    [(r.named, r.complete, len(r.outcomes), r.messages) for r in reports[seen:]],
                )
                # The next pass comes at once, not after poll_interval (an hour): the pass over every journal owed.
                wait_until(lambda k=k: any(r.complete for r in reports[k + 1 :]), scaled(20),
                           "the pass over every journal, right after")  # fmt: skip
    assert_identical(str(src), str(hub))


def test_run_forever_settles_the_heap_after_a_complete_pass_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    src = tmp_path / "src"
    produce(str(src), 4)
    config = local_config(tmp_path, {"edge": src}, poll_interval=0.05)
    assert gc.get_freeze_count() == 0
    stop = threading.Event()
    reports: list[ClientReport] = []
    frozen: list[int] = []

    def on_report(report: ClientReport) -> None:
        frozen.append(gc.get_freeze_count())
        reports.append(report)  # last: the test waits on it

    with Hub(config, records=False) as h:
        t = threading.Thread(target=h.run_forever, args=(stop, on_report), daemon=True)
        t.start()
        try:
            wait_until(lambda: len(reports) >= 2, scaled(20), "two passes")
            assert reports[0].complete and reports[0].ok
            assert frozen[1] > 0, "the heap was not settled after the first complete pass"
        finally:
            stop.set()
            t.join(scaled(10))
        assert not t.is_alive()
    assert gc.get_freeze_count() == 0, "run_forever left the collector frozen"
    assert all(sej.next_offset(str(Path(config.hub_root) / f"edge.{j}")) == sej.next_offset(str(src / j))
               for j in os.listdir(src))  # fmt: skip
