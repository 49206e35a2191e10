"""sej serve's watch (sej.hub.serve_watch.Pusher) with inotify: the directories that hold news, never ofs/."""

from __future__ import annotations

import os
import threading

import pytest

import sej
from sej.hub import serve_protocol as wire
from sej.hub.local_source import LocalSource
from sej.hub.serve_watch import Pusher
from sej.watch import DirWatch
from testing.timing import scaled, wait_until

from .test_hub_copy import produce

pytestmark = pytest.mark.skipif(not DirWatch.available(), reason="no inotify through watchdog here")


def _watched_inodes() -> set[int]:
    """The inodes this process's inotify instances watch, as the kernel lists them (/proc/self/fdinfo)."""
    inodes: set[int] = set()
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("inotify wd:"):
                        inodes.add(int(line.split("ino:")[1].split()[0], 16))
        except OSError:
            continue
    return inodes


class _Pushes:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.names: list[list[str]] = []

    def send(self, data: bytes) -> None:
        d = wire.Decoder()
        d.feed(data)
        for _ in range(1 << 10):
            msg = d.next()
            if msg is None:
                return
            with self.cond:
                self.names.append(list(wire.parse_changed(msg)))
                self.cond.notify_all()

    def named(self, journal: str) -> bool:
        with self.cond:
            return any(journal in n for n in self.names)


def test_the_hubs_commits_are_not_watched_and_new_journals_are(tmp_path) -> None:
    """ofs/ is never watched (the hub's commits, a thousand after a pass over a thousand journals, made the kernel
    report events that watchdog's thread handled one by one before the appends' own), jnl/ and idx/ are; a journal
    made after the watch began, and its jnl/ made after its directory, are watched before a push lists them."""
    root = tmp_path / "root"
    produce(str(root), 40)
    journals = sorted(os.listdir(root))
    source = LocalSource(str(root))
    for j in journals:  # the hub's first commits: ofs/ made, a temp file renamed over hub.ofs
        source.commit_offset(j, "hub", 1, False)
    pushes = _Pushes()
    pusher = Pusher(str(root), pushes.send)  # names only (version 1): each burst a CHANGED
    try:
        watched = _watched_inodes()
        for j in journals:
            for sub in ("jnl", "idx"):
                assert os.stat(root / j / sub).st_ino in watched, (j, sub)
            assert os.stat(root / j / "ofs").st_ino not in watched, j
        for j in journals:  # commits again: in place this time; no news either way
            source.commit_offset(j, "hub", 2, False)
        new = root / "p.9.000"
        os.mkdir(new)  # a journal made in two steps: its directory, then (after the push of the root) its files
        wait_until(lambda: os.stat(new).st_ino in _watched_inodes(), scaled(10), "the new journal's directory watched")
        with sej.Writer(str(new), durability="flush") as w:
            w.append(b"first")
            wait_until(lambda: os.stat(new / "jnl").st_ino in _watched_inodes(), scaled(10), "its jnl/ watched")
            with pushes.cond:
                pushes.names.clear()
            w.append(b"second")  # an append alone: the push names the new journal
            wait_until(lambda: pushes.named("p.9.000"), scaled(10), "a push of the new journal's append")
        with pushes.cond:
            assert all(not set(n) & set(journals) for n in pushes.names), pushes.names  # the commits were no news
    finally:
        pusher.close()
