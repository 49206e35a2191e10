"""sej-hub over sej serve makes no pass every poll_interval while nothing is pushed (daemon.IDLE_EVERY): the pushed
state answers every call such a pass would make. A push still starts a pass at once, a deferred commit still comes
when due, and over SFTP the passes still come every poll_interval."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sej
from sej.hub import daemon
from sej.hub.config import loads_config
from sej.hub.daemon import ClientReport, Hub
from sej.offset import read_offset_file
from testing.timing import scaled, wait_until

from .test_hub_copy import assert_identical, produce
from .test_hub_serve import SERVE


class _Run:
    """A running Hub's passes: when each ended, and its report."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.passes: list[float] = []
        self.reports: list[ClientReport] = []


@contextmanager
def _running(sshd: Any, src: Path, hub: Path, transport: str, **top: float) -> Iterator[_Run]:
    """sej-hub's run_forever over `transport`."""
    extra = "".join(f"{k} = {v}\n" for k, v in top.items())
    config = loads_config(
        f'hub_root = "{hub}"\n{extra}[[client]]\nclient_id = "c1"\n'
        f'host = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\nidentity_file = "{sshd.identity}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nremote_root = "{src}"\ntransport = "{transport}"\n'
        f'serve_command = "{SERVE}"\n'
    )
    stop = threading.Event()
    with Hub(config, records=False) as h:
        run = _Run(h)

        def on_report(report: ClientReport) -> None:
            assert report.ok, report.failures()
            run.reports.append(report)
            run.passes.append(time.monotonic())

        t = threading.Thread(target=h.run_forever, args=(stop, on_report), daemon=True)
        t.start()
        try:
            yield run
        finally:
            stop.set()
            t.join(scaled(30))
    assert not t.is_alive()


def _at_hub(hub: Path, j: str) -> int:
    return sej.next_offset(str(hub / f"c1.{j}")) if os.path.isdir(hub / f"c1.{j}") else -1


def _passes_while_idle(passes: list[float], seconds: float) -> int:
    before = len(passes)
    time.sleep(seconds)  # the window the passes are counted in (not a wait for anything)
    return len(passes) - before


def test_no_pass_every_poll_while_nothing_is_pushed_and_a_push_still_starts_one(sshd, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(daemon, "IDLE_EVERY", 0.5)
    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 100)
    journals = sorted(os.listdir(src))
    with _running(sshd, src, hub, "serve", poll_interval=0.05, commit_interval=1.5) as run:
        passes = run.passes
        wait_until(lambda: all(_at_hub(hub, j) == sej.next_offset(str(src / j)) for j in journals), scaled(30),
                   "the first copy")  # fmt: skip
        # Every poll (0.05 s) would be 40 passes in 2 s; one each IDLE_EVERY is 4, and a deferred commit's.
        assert _passes_while_idle(passes, 2.0) <= 8
        for k, j in enumerate(journals):
            with sej.Writer(str(src / j), durability="flush") as w:
                w.append(b"pushed %d" % k)
            want = sej.next_offset(str(src / j))
            wait_until(lambda j=j, want=want: _at_hub(hub, j) == want, scaled(20), "the append at the hub")
        # Its commit was deferred (commit_interval): it comes when due, without a push.
        last = {j: sej.next_offset(str(src / j)) for j in journals}
        wait_until(lambda: all(read_offset_file(str(src / j / "ofs" / "hub.ofs")) == last[j] for j in journals),
                   scaled(20), "the deferred commits, made when due")  # fmt: skip
        seen = len(passes)
        wait_until(lambda: len(passes) > seen + 1, scaled(20), "idle passes, each IDLE_EVERY")
    assert_identical(str(src), str(hub))


def test_over_sftp_the_passes_still_come_every_poll(sshd, tmp_path, monkeypatch) -> None:
    """Nothing is pushed over SFTP: an idle pass is how an append is found."""
    monkeypatch.setattr(daemon, "IDLE_EVERY", 60.0)
    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 50)
    j = sorted(os.listdir(src))[0]
    with _running(sshd, src, hub, "sftp", poll_interval=0.05) as run:
        passes = run.passes
        wait_until(lambda: _at_hub(hub, j) == sej.next_offset(str(src / j)), scaled(30), "the first copy")
        seen = len(passes)
        wait_until(lambda: len(passes) > seen + 3, scaled(20), "passes every poll_interval")
        with sej.Writer(str(src / j), durability="flush") as w:
            w.append(b"polled")
        want = sej.next_offset(str(src / j))
        wait_until(lambda: _at_hub(hub, j) == want, scaled(20), "the append, found by a pass")


def test_a_push_starts_a_pass_over_the_journals_pushed_only(sshd, tmp_path, monkeypatch) -> None:
    """Between passes over every journal (FULL_EVERY), a pass a push started looks at the journals pushed since the
    last one: it copies them, drops a journal removed, and still commits the deferred offsets that come due meanwhile,
    of journals no longer pushed; the other journals stay known (and in the status)."""
    monkeypatch.setattr(daemon, "FULL_EVERY", 3600.0)
    monkeypatch.setattr(daemon, "IDLE_EVERY", 3600.0)
    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 300)
    journals = sorted(os.listdir(src))
    a, b, gone = journals[0], journals[1], journals[2]
    with _running(sshd, src, hub, "serve", poll_interval=0.05, commit_interval=1.0) as run:
        passes, reports, state = run.passes, run.reports, run.hub._clients[0].state
        wait_until(lambda: all(_at_hub(hub, j) == sej.next_offset(str(src / j)) for j in journals), scaled(30),
                   "the first copy")  # fmt: skip
        seen = len(passes)
        with sej.Writer(str(src / a), durability="flush") as w:  # its commit is deferred: committed a moment ago
            w.append(b"a")
        want_a = sej.next_offset(str(src / a))
        wait_until(lambda: _at_hub(hub, a) == want_a, scaled(20), "a's append at the hub")
        k = 0

        def committed_a() -> bool:
            nonlocal k
            k += 1
            with sej.Writer(str(src / b), durability="flush") as w:  # b is pushed and copied all along
                w.append(b"b %d" % k)
            return read_offset_file(str(src / a / "ofs" / "hub.ofs")) == want_a

        wait_until(committed_a, scaled(30), "a's deferred commit, made by a pass over b")
        shutil.rmtree(src / gone)
        wait_until(lambda: any(r.named and not any(o.journal == gone for o in r.outcomes) for r in reports[seen:])
                   and gone not in state.tails, scaled(20), "the removed journal forgotten")  # fmt: skip
        named = [r for r in reports[seen:] if r.named]
        assert named and all(len(r.outcomes) <= 3 for r in named), [len(r.outcomes) for r in named]
        assert not any(r.complete for r in named)
        want_b = sej.next_offset(str(src / b))
        wait_until(lambda: _at_hub(hub, b) == want_b, scaled(20), "b's last append at the hub")
    assert_identical(str(src), str(hub))
