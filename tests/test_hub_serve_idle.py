"""sej-hub over sej serve makes no pass every poll_interval while nothing is pushed (daemon.IDLE_EVERY): the pushed
state answers every call such a pass would make. A push still starts a pass at once, a deferred commit still comes
when due, and over SFTP the passes still come every poll_interval."""

from __future__ import annotations

import os
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


@contextmanager
def _running(sshd: Any, src: Path, hub: Path, transport: str, **top: float) -> Iterator[list[float]]:
    """sej-hub's run_forever over `transport`; the times its passes ended."""
    extra = "".join(f"{k} = {v}\n" for k, v in top.items())
    config = loads_config(
        f'hub_root = "{hub}"\n{extra}[[client]]\nclient_id = "c1"\n'
        f'host = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\nidentity_file = "{sshd.identity}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nremote_root = "{src}"\ntransport = "{transport}"\n'
        f'serve_command = "{SERVE}"\n'
    )
    passes: list[float] = []

    def on_report(report: ClientReport) -> None:
        assert report.ok, report.failures()
        passes.append(time.monotonic())

    stop = threading.Event()
    with Hub(config, records=False) as h:
        t = threading.Thread(target=h.run_forever, args=(stop, on_report), daemon=True)
        t.start()
        try:
            yield passes
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
    with _running(sshd, src, hub, "serve", poll_interval=0.05, commit_interval=1.5) as passes:
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
    with _running(sshd, src, hub, "sftp", poll_interval=0.05) as passes:
        wait_until(lambda: _at_hub(hub, j) == sej.next_offset(str(src / j)), scaled(30), "the first copy")
        seen = len(passes)
        wait_until(lambda: len(passes) > seen + 3, scaled(20), "passes every poll_interval")
        with sej.Writer(str(src / j), durability="flush") as w:
            w.append(b"polled")
        want = sej.next_offset(str(src / j))
        wait_until(lambda: _at_hub(hub, j) == want, scaled(20), "the append, found by a pass")
