"""sej serve's pushes list each journal and read its new bytes with its directories opened once (serve_server._Held):
the same bytes as the files hold, every check LocalSource's own, and nothing left open."""

from __future__ import annotations

import os
from typing import Any

import sej
from sej.hub import serve_protocol as wire
from sej.hub.local_source import LocalSource
from sej.hub.serve_server import Session

from .test_hub_copy import produce


def _push(session: Session, names: list[str]) -> tuple[dict[str, Any], list[str], list[wire.Pushed]]:
    """What the STATE frames of a push of `names` say: the entries, the journals gone, the bytes pushed."""
    entries: dict[str, Any] = {}
    gone: list[str] = []
    pushed: list[wire.Pushed] = []
    for frame in session.state_frames(names):
        d = wire.Decoder()
        d.feed(frame)
        full, got, g, _skipped, _more, p = wire.parse_state(d.next(), 3)
        assert not full
        entries.update(got)
        gone += g
        pushed += p
    return entries, gone, pushed


def _session(root: str) -> Session:
    session = Session(root)
    session.version, session._asked = 3, root
    return session


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_push_carries_what_the_files_hold_and_leaves_nothing_open(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 200, segment_size=1 << 20)
    journals = sorted(os.listdir(root))
    session = _session(str(root))
    fds = _open_fds()
    entries, gone, pushed = _push(session, [*journals, "p-gone"])
    assert not gone and sorted(entries) == sorted([*journals, "p-gone"])
    assert entries["p-gone"] is None  # LocalSource's missing journal: the hub asks, and hears the error itself
    for j in journals:
        (seg,) = sej.list_segments(str(root / j))
        name = os.path.basename(seg.path)
        mine = [p for p in pushed if p[0] == j]
        assert [(p[1], p[2], p[4]) for p in mine] == [(name, 0, 0)], mine
        assert mine[0][3] == (root / j / "jnl" / name).read_bytes()
        sums = root / j / "idx" / (name[: -len(".jnl")] + ".sum")
        assert mine[0][5] == (sums.read_bytes() if sums.exists() else None)
    # The next push of one journal carries only what it gained since (from its old end).
    j = journals[0]
    (seg,) = sej.list_segments(str(root / j))
    old = os.path.getsize(seg.path)
    with sej.Writer(str(root / j), durability="flush") as w:
        w.append(b"more")
    _entries, _gone, pushed = _push(session, [j])
    ((_j, name, start, data, _skip, _sums, _check),) = pushed
    assert start == old and data == (root / j / "jnl" / name).read_bytes()[old:]
    assert _open_fds() == fds


class _Plain:
    """A LocalSource's calls, each opening its own directories (the server's path for sources but LocalSource)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def test_a_push_says_what_each_call_opening_its_own_directories_says(tmp_path) -> None:
    root = tmp_path / "root"
    produce(str(root), 300, segment_size=2000)
    journals = sorted(os.listdir(root))
    os.rename(root / journals[1] / "idx", tmp_path / "idx")
    os.symlink(tmp_path / "idx", root / journals[1] / "idx")
    held, plain = _session(str(root)), _session(str(root))
    plain._watch_source = _Plain(LocalSource(str(root)))
    for k in range(3):
        assert _push(held, journals) == _push(plain, journals)
        for j in journals[k:]:
            with sej.Writer(str(root / j), durability="flush", segment_size=2000) as w:
                w.append(b"x" * 700 * k)


def test_a_hostile_journal_is_left_to_the_hubs_reads_and_the_others_are_pushed(tmp_path) -> None:
    """A journal whose jnl/ is a symlink (to another journal's) is listed as None and pushes nothing; one whose idx/
    is a symlink is listed but pushes nothing (the hub's reads hear why); the journals around them are pushed."""
    root = tmp_path / "root"
    produce(str(root), 100, segment_size=1 << 20)
    a, b, c, d = sorted(os.listdir(root))[:4]
    os.rename(root / b / "jnl", tmp_path / "b-jnl")
    os.symlink(root / a / "jnl", root / b / "jnl")
    os.rename(root / c / "idx", tmp_path / "c-idx")
    os.symlink(tmp_path / "c-idx", root / c / "idx")
    session = _session(str(root))
    fds = _open_fds()
    entries, gone, pushed = _push(session, [a, b, c, d])
    assert not gone and entries[b] is None and entries[c] is not None
    assert sorted({p[0] for p in pushed}) == [a, d]
    assert _open_fds() == fds
