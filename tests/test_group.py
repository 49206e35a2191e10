"""sej.shard.group: live members through their locks, and fair shares."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import sej
from sej.errors import InvalidArgumentError
from sej.shard.group import Membership, group_dir, share
from testing.timing import scaled

from .conftest import popen_python


@given(st.integers(0, 5000), st.integers(1, 64))
def test_shares_add_up_and_differ_by_at_most_one(journals: int, count: int) -> None:
    members = sorted(f"m{i:03d}" for i in range(count))
    shares = [share(journals, members, m) for m in members]
    assert sum(shares) == journals
    assert max(shares) - min(shares) <= 1


JOIN = r"""
import sys
from sej.shard.group import Membership
m = Membership(sys.argv[1], "r")
print(m.id, flush=True)
sys.stdin.read()
"""


def test_a_killed_member_is_dead_to_the_others_and_its_file_removed(tmp_path: Path) -> None:
    me = Membership(str(tmp_path), "r")
    p = popen_python(JOIN, str(tmp_path), stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    try:
        assert p.stdout is not None
        other = p.stdout.readline().strip()
        assert me.members() == sorted([me.id, other])
        p.send_signal(signal.SIGKILL)
        p.wait(scaled(30))
    finally:
        if p.poll() is None:
            p.kill()
    assert me.members() == [me.id]
    assert os.listdir(group_dir(str(tmp_path), "r")) == [os.path.basename(me.path)]
    me.close()
    assert os.listdir(group_dir(str(tmp_path), "r")) == []


def test_joining_files_links_and_strays_are_not_members(tmp_path: Path) -> None:
    me = Membership(str(tmp_path), "r")
    d = Path(group_dir(str(tmp_path), "r"))
    (d / ".host-1-abcd.tmp").write_text("")  # a member still joining: locked under this name, then renamed
    (d / "notes.txt").write_text("")
    os.mkfifo(d / "fifo.member")  # never opened (it would block)
    os.symlink(tmp_path / "elsewhere", d / "link.member")  # never followed
    os.mkdir(d / "dir.member")
    assert me.members() == [me.id]
    assert not (tmp_path / "elsewhere").exists()
    me.close()


def test_a_group_needs_a_reader_and_starts_at_the_committed_offsets(tmp_path: Path) -> None:
    with sej.Writer(tmp_path / "j") as w:
        w.append(b"x")
    for kw in ({"reader": None}, {"reader": "r", "start": "first"}):
        try:
            sej.Consumer(tmp_path, group=True, **kw)  # type: ignore[arg-type]
        except InvalidArgumentError as e:
            assert "group" in str(e)
        else:
            raise AssertionError(f"{kw} accepted")
