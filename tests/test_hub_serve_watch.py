"""sej serve's watch (sej.hub.serve_watch.Pusher) with inotify: the directories that hold news, never ofs/."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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


@pytest.mark.parametrize("burst_ends", [True, False])
def test_a_whole_state_is_listed_after_the_burst_under_way_or_after_yield_at_most(tmp_path, monkeypatch,
                                                                                 burst_ends) -> None:  # fmt: skip
    """The refresh of the whole state (every 15 s) and a burst listed at once each went at half speed: the whole
    state's listing waits for the burst under way, and lists on after YIELD_AT_MOST when bursts never end."""
    import sej.hub.serve_server as server

    root = tmp_path / "root"
    produce(str(root), 20)
    journals = sorted(os.listdir(root))
    session = server.Session(str(root))
    session.version, session._asked = 3, str(root)
    list(session.state_frames(None))  # the first whole state: what the pushes add to
    for j in journals:
        with sej.Writer(str(root / j), durability="flush") as w:
            w.append(b"new")
    monkeypatch.setattr(server, "YIELD_AT_MOST", scaled(60) if burst_ends else 0.05)
    burst = session.state_frames(journals)
    first = next(burst)  # under way: suspended after its frame, as while the pusher sends it
    assert first
    whole: list[bytes] = []
    lister = threading.Thread(target=lambda: whole.extend(session.state_frames(None)))
    lister.start()
    try:
        if burst_ends:
            wait_until(lambda: session.yields > 0, scaled(10), "the whole state waiting for the burst")
            assert lister.is_alive() and not whole  # it waits in _yield until the burst ends (or a minute)
            assert next(burst, None) is None  # the burst ends
        lister.join(scaled(30))
        assert not lister.is_alive() and whole, "the whole state did not come"
        d = wire.Decoder()
        d.feed(whole[0])
        full, got, _gone, _skipped, _more, _pushed = wire.parse_state(d.next(), 3)
        assert full and sorted(got) == journals
    finally:
        burst.close()
        lister.join(scaled(30))


def test_a_refresh_of_the_whole_state_names_the_journals_it_changed_only(tmp_path) -> None:
    """The whole state asked for every 15 s catches what the watch missed: the hub's passes look at the journals whose
    listing it changed, not at every journal (a pass over every journal at each refresh took the hub's CPU from the
    pushed journals' passes), and at none when it changed nothing. The first whole state names every journal ([])."""
    from .test_hub_serve_protocol import serving

    root = tmp_path / "root"
    produce(str(root), 40)
    journals = sorted(os.listdir(root))
    j = journals[3]
    conn = serving(str(root))
    pushes: list[list[str]] = []
    try:
        conn.watch(pushes.append)
        wait_until(lambda: conn.state is not None, scaled(10), "the whole state")
        assert pushes == [[]]
        # A change the watch does not see: the segment written through a hard link in a directory not watched.
        seg = sej.list_segments(str(root / j))[-1].path
        side = tmp_path / "side"
        side.mkdir()
        os.link(seg, side / "link")
        with open(side / "link", "ab") as f:
            f.write(b"x" * 10)
        os.unlink(side / "link")
        for expected in ([[], [j]], [[], [j]]):  # then a refresh that changes nothing: no push at all
            at = conn.state_at
            conn.watch(pushes.append)  # what a pass does after STATE_TRUST / 2 (Connection.known)
            wait_until(lambda: conn.state_at > at, scaled(10), "a new whole state")  # noqa: B023
            assert pushes == expected, pushes
        assert conn.state is not None and conn.state[j][-1][2] == os.path.getsize(seg)
    finally:
        conn.close()


def _made_again_and_pushed(root: Path, j: str, pushes: _Pushes) -> None:
    """Journal `j` made again under `root`: its jnl/ is watched, and an append to it is pushed."""
    with sej.Writer(str(root / j), durability="flush") as w:
        w.append(b"first")
        wait_until(lambda: os.stat(root / j / "jnl").st_ino in _watched_inodes(), scaled(10),
                   "the new journal's jnl/ watched")  # fmt: skip
        with pushes.cond:
            pushes.names.clear()
        w.append(b"second")
        wait_until(lambda: pushes.named(j), scaled(10), "a push of the new journal's append")


def test_a_journal_moved_aside_and_made_again_is_watched_anew(tmp_path) -> None:
    """A watch follows its directory: a journal moved out of the root and made again under its name is watched anew
    (the root's listing finds another inode), and its appends are pushed."""
    root = tmp_path / "root"
    produce(str(root), 20)
    j = sorted(os.listdir(root))[0]
    pushes = _Pushes()
    pusher = Pusher(str(root), pushes.send)
    try:
        os.rename(root / j, tmp_path / "aside")
        _made_again_and_pushed(root, j, pushes)
    finally:
        pusher.close()


def test_a_journal_moved_aside_is_unwatched_and_watched_again_when_made_again_later(tmp_path) -> None:
    """The root listed while the journal is away (moved aside, not made again yet): its watches, which followed the
    moved directories, end then; made again later under its name, it is watched anew and its appends pushed."""
    root = tmp_path / "root"
    produce(str(root), 20)
    j = sorted(os.listdir(root))[0]
    old_jnl = os.stat(root / j / "jnl").st_ino
    pushes = _Pushes()
    pusher = Pusher(str(root), pushes.send)
    try:
        wait_until(lambda: old_jnl in _watched_inodes(), scaled(10), "the journal's jnl/ watched")
        os.rename(root / j, tmp_path / "aside")
        wait_until(lambda: old_jnl not in _watched_inodes(), scaled(10), "the moved journal's watches ended")
        _made_again_and_pushed(root, j, pushes)
    finally:
        pusher.close()
