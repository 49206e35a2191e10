"""sej.watch.DirWatch: exactly the directories added, through one inotify instance and no thread each."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sej.watch import DirWatch
from testing.timing import scaled, wait_until

pytestmark = pytest.mark.skipif(not DirWatch.available(), reason="no inotify through watchdog here")


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[bool] = []

    def __call__(self, created: bool) -> None:
        with self.lock:
            self.events.append(created)

    def take(self) -> list[bool]:
        with self.lock:
            out, self.events = self.events, []
        return out


def test_events_of_the_directory_and_not_of_those_below(tmp_path: Path) -> None:
    (tmp_path / "below").mkdir()
    seen, w = Seen(), DirWatch()
    try:
        assert w.add(str(tmp_path), seen)
        (tmp_path / "below" / "f").write_bytes(b"x")  # below: no event
        (tmp_path / "f").write_bytes(b"x")  # created (and modified)
        wait_until(lambda: seen.events, scaled(30), "the event of a file created")
        events = seen.take()
        assert events[0] is True  # the creation of f; nothing of below/f came before it
        with open(tmp_path / "f", "ab") as f:
            f.write(b"y")
        wait_until(lambda: seen.events, scaled(30), "the event of a file appended to")
        assert seen.take()[-1] is False  # a modification
        # A marker created last: once its event is in, every earlier one is too (one inotify queue).
        (tmp_path / "below" / "g").write_bytes(b"x")
        (tmp_path / "marker").write_bytes(b"")
        wait_until(lambda: seen.events, scaled(30), "the marker's event")
        assert seen.take() == [True]  # the marker's creation (empty: no modification), nothing from below
    finally:
        w.close()


def test_links_are_not_followed_and_a_removed_directory_is_watched_anew(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    seen, w = Seen(), DirWatch()
    try:
        assert not w.add(str(tmp_path / "link"), seen)
        assert not w.add(str(tmp_path / "missing"), seen)
        d = tmp_path / "d"
        d.mkdir()
        assert w.add(str(d), seen)
        d.rmdir()
        wait_until(lambda: seen.events, scaled(30), "the directory's removal")
        d.mkdir()
        seen.take()
        assert w.add(str(d), seen)  # the old watch is gone with the directory: this one is new
        (d / "f").write_bytes(b"")
        wait_until(lambda: seen.events, scaled(30), "an event in the new directory")
    finally:
        w.close()
