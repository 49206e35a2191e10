"""The hub beside retention on the producer: a deleted last segment the hub had whole is not a stall (issue 37)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sej
from sej.offset import read_offset_file
from testing.timing import scaled

from .conftest import REPO

FULL = 54  # messages of 76 bytes that fill a 4 KiB segment: the writer rolls over after the 54th


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env,
                          timeout=scaled(60))  # fmt: skip


def append(journal: str, n: int, fill: bytes) -> None:
    with sej.Writer(journal, segment_size=4096) as w:
        for _ in range(n):
            w.append(fill * 50)


def copy_before_the_next_segment_is_visible(tmp_path: Path) -> tuple[str, str, str]:
    """A writer fills a 4 KiB segment and rolls over; `sej copy` runs before the new (empty) segment is
    visible, so the hub has all of the first segment and nothing after it."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    journal = os.path.join(src, "j")
    append(journal, FULL, b"x")
    segs = sej.list_segments(journal)
    assert [s.first_offset for s in segs] == [0, FULL] and os.path.getsize(segs[1].path) == 0
    hidden = str(tmp_path / "hidden")
    os.rename(segs[1].path, hidden)
    done = cli(tmp_path, "sej.apps.cli", "copy", src, hub)
    assert done.returncode == 0, done.stderr
    os.rename(hidden, segs[1].path)
    assert sorted(os.listdir(os.path.join(hub, "local.j", "jnl"))) == [os.path.basename(segs[0].path)]
    assert read_offset_file(os.path.join(journal, "ofs", "hub.ofs")) == FULL
    return src, hub, journal


def test_a_copy_continues_after_retention_deleted_the_hub_s_whole_last_segment(tmp_path) -> None:
    src, hub, journal = copy_before_the_next_segment_is_visible(tmp_path)
    append(journal, 1, b"y")
    kept = cli(tmp_path, "sej.apps.retention", src, "--max-messages", "1", "--require-reader", "hub")
    assert kept.returncode == 0, kept.stderr
    assert sej.first_offset(journal) == FULL  # the hub's last segment is gone; the next starts where the hub is
    for _ in range(2):  # it stalled on every later copy
        again = cli(tmp_path, "sej.apps.cli", "copy", src, hub)
        assert again.returncode == 0, again.stderr
    assert sej.next_offset(os.path.join(hub, "local.j")) == FULL + 1
    with sej.Scanner(os.path.join(hub, "local.j"), FULL, timeout=0) as s:
        assert [(m.offset, m.value) for m in s] == [(FULL, b"y" * 50)]
    assert read_offset_file(os.path.join(journal, "ofs", "hub.ofs")) == FULL + 1
    # And the hub's copy of the segment retention left is the producer's, byte for byte.
    name = os.path.basename(sej.list_segments(journal)[0].path)
    assert Path(hub, "local.j", "jnl", name).read_bytes() == Path(journal, "jnl", name).read_bytes()


def test_a_gap_after_the_hub_s_deleted_last_segment_is_reported_with_the_offsets_lost(tmp_path) -> None:
    src, hub, journal = copy_before_the_next_segment_is_visible(tmp_path)
    append(journal, FULL + 1, b"y")  # a whole second segment, and one message in a third
    segs = sej.list_segments(journal)
    assert [s.first_offset for s in segs] == [0, FULL, 2 * FULL]
    for s in segs[:2]:  # deleted under the hub, past its reader offset (not by sej-retention)
        os.remove(s.path)
    for _ in range(2):
        bad = cli(tmp_path, "sej.apps.cli", "copy", src, hub)
        assert bad.returncode == 1
        assert f"gap: offsets {FULL}..{2 * FULL - 1} are gone from the source" in bad.stderr, bad.stderr
    assert sej.next_offset(os.path.join(hub, "local.j")) == FULL  # nothing continued past the gap
    assert read_offset_file(os.path.join(journal, "ofs", "hub.ofs")) == FULL


def test_a_source_rewritten_with_other_segments_is_not_taken_for_retention(tmp_path) -> None:
    """The hub's last segment is gone from the source and a source segment starts at the hub's next offset,
    but an earlier source segment spans what the hub's last segment held: the journal was rewritten (here
    recreated with a larger segment size), not cut by retention, and the copy must not continue."""
    from sej.hub.copy import CopyError, copy_journal
    from sej.hub.local_source import LocalSource

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    journal = os.path.join(src, "j")
    with sej.Writer(journal, segment_size=32 * 76) as w:
        for _ in range(FULL):
            w.append(b"x" * 50)
    assert [s.first_offset for s in sej.list_segments(journal)] == [0, 32]
    assert copy_journal(LocalSource(src), "j", hub, "local", "hub").next_offset == FULL
    shutil.rmtree(journal)
    append(journal, FULL + 1, b"z")  # segments 0 (offsets 0..53) and 54, other bytes
    assert [s.first_offset for s in sej.list_segments(journal)] == [0, FULL]
    for _ in range(2):
        with pytest.raises(CopyError, match="no longer has 0000000000000020.jnl"):
            copy_journal(LocalSource(src), "j", hub, "local", "hub")
    assert sej.next_offset(os.path.join(hub, "local.j")) == FULL  # nothing of the rewritten journal copied
