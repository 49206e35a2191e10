"""A kept SftpSource reuses its root listing while the root does not change (SftpSource.journals): a pass over
1,000 unchanged journals lists nothing. Over a real sshd; every answer is checked against the local listing of the
same root (LocalSource), which is the truth."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.hub import sftp_source as hub_source
from sej.hub.local_source import LocalSource
from sej.hub.sftp_source import SftpSource
from sej.hub.ssh import sftp_sources
from testing.timing import scaled

from .test_hub_ssh import connect_to

POLL = 0.05  # between two looks while waiting for the listing to settle (a condition, with a deadline)


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories SftpSource lists from now on."""
    listed: list[str] = []
    real = SftpSource._list_dir

    def counting(self, path, **kw):  # type: ignore[no-untyped-def]
        listed.append(path)
        return (yield from real(self, path, **kw))

    monkeypatch.setattr(SftpSource, "_list_dir", counting)
    return listed


@pytest.fixture
def remote(sshd, tmp_path: Path) -> Iterator[tuple[Path, SftpSource]]:  # type: ignore[no-untyped-def]
    """A producer root, and one SftpSource over it kept for the whole test (as the daemon keeps its lister)."""
    root = tmp_path / "src"
    root.mkdir()
    client = connect_to(sshd)
    source = sftp_sources(client, str(root), "test")()
    try:
        yield root, source
    finally:
        source.close()
        client.close()


def journal(root: Path, name: str) -> None:
    with sej.Writer(str(root / name)) as w:
        w.append(name.encode())


def truth(root: Path) -> tuple[list[str], dict[str, str]]:
    local = LocalSource(str(root))
    return local.journals(), local.skipped()


def look(root: Path, source: SftpSource) -> None:
    """One pass's look at the root: what the local listing says, names and skipped."""
    assert (source.journals(), source.skipped()) == truth(root)


def settle(root: Path, source: SftpSource, listed: list[str]) -> None:
    """Look until a look lists nothing (the listing is reused); every look is right meanwhile."""
    deadline = time.monotonic() + scaled(10) + hub_source.LISTING_SETTLED
    while True:
        before = len(listed)
        look(root, source)
        if len(listed) == before:
            return
        assert time.monotonic() < deadline, "the root listing was never reused"
        time.sleep(POLL)


def test_a_settled_listing_is_reused_and_every_change_to_the_root_is_seen_at_the_next_look(
    remote: tuple[Path, SftpSource], listings: list[str]
) -> None:
    root, source = remote
    for name in ("p.2.000", "p.2.001"):
        journal(root, name)
    (root / "not.a.journal").mkdir()  # skipped, and said why, whether listed or reused
    settle(root, source, listings)
    for _ in range(3):  # reused: no listing, no lstat of every jnl/
        before = len(listings)
        look(root, source)
        assert len(listings) == before
    # Changes right after a look, each seen at the next look; those after the first in the same second as it (the
    # root's mtime put back to that second's, as a change later in the same second leaves it).
    journal(root, "p.2.002")
    look(root, source)
    st = os.stat(root)
    shutil.rmtree(root / "p.2.000")
    os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))
    look(root, source)
    os.rename(root / "p.2.001", root / "p.2.003")
    os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))
    look(root, source)
    settle(root, source, listings)
    (root / "p.2.003").rename(root / "p.2.000")
    look(root, source)


def test_a_shard_directory_that_gets_its_jnl_later_is_seen_though_the_root_did_not_change(
    remote: tuple[Path, SftpSource], listings: list[str]
) -> None:
    """A shard being made (no jnl/ yet) is looked at again every pass: its jnl/ appears inside it, which leaves the
    root's mtime as it was. A jnl/ that is a file, or turns into one, is said so."""
    root, source = remote
    journal(root, "p.2.000")
    (root / "p.2.001").mkdir()
    (root / "p.2.002").mkdir()
    settle(root, source, listings)
    (root / "p.2.001" / "jnl").mkdir()
    (root / "p.2.002" / "jnl").write_bytes(b"")
    look(root, source)
    assert source.journals() == ["p.2.000", "p.2.001"]
    assert source.skipped()["p.2.002"] == "its jnl is a regular file, not a directory"


def test_a_root_whose_mtime_hides_a_change_is_listed_again_within_the_max_age(
    remote: tuple[Path, SftpSource], listings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer (or a clock stepped back) may put the root's mtime back after a change: the listing is then
    reused at most LISTING_MAX_AGE, never for good."""
    monkeypatch.setattr(hub_source, "LISTING_MAX_AGE", 2 * hub_source.LISTING_SETTLED)
    root, source = remote
    journal(root, "p.1.000")
    settle(root, source, listings)
    st_root = os.stat(root)
    journal(root, "p.1.001")
    os.utime(root, ns=(st_root.st_atime_ns, st_root.st_mtime_ns))
    assert source.journals() == ["p.1.000"]  # hidden, for now
    deadline = time.monotonic() + scaled(10) + hub_source.LISTING_MAX_AGE
    while source.journals() != ["p.1.000", "p.1.001"]:
        assert time.monotonic() < deadline, "the hidden journal was never found"
        time.sleep(POLL)


def test_a_journal_that_loses_its_jnl_fails_one_pass_at_most_then_the_root_is_listed_again(
    sshd,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """A journal's jnl/ removed or replaced by a file leaves the root's mtime as it was; the pass that finds the
    journal failing forgets it, and with it the listing: the next pass lists the root and says why it skips it."""
    from sej.hub import CopyState, copy_all
    from sej.hub.location import Sources

    from .test_hub_kept import Keeper

    root, hub = tmp_path / "src", tmp_path / "hub"
    for name in ("p.2.000", "p.2.001", "p.2.002"):
        journal(root, name)
    client = connect_to(sshd)
    sources, state = Sources("test", sftp_sources(client, str(root), "test"), client), CopyState()
    try:

        def one_pass() -> dict[str, object]:
            out = copy_all(sources, str(hub), "c1", "hub", state=state, kept=Keeper(sources))
            return {o.journal: o.error for o in out}

        deadline = time.monotonic() + scaled(10) + hub_source.LISTING_SETTLED
        while True:  # until the listing is reused
            lister = sources.kept(4)
            before = lister._listing  # type: ignore[attr-defined]
            assert set(one_pass()) == {"p.2.000", "p.2.001", "p.2.002"}
            if before is not None and lister._listing is before:  # type: ignore[attr-defined]
                break
            assert time.monotonic() < deadline, "the root listing was never reused"
            time.sleep(POLL)
        st = os.stat(root)
        shutil.rmtree(root / "p.2.001" / "jnl")
        (root / "p.2.002" / "jnl").rename(root / "p.2.002" / "old")
        (root / "p.2.002" / "jnl").write_bytes(b"")
        os.utime(root, ns=(st.st_atime_ns, st.st_mtime_ns))
        failed = {j for j, e in one_pass().items() if e is not None}
        assert failed <= {"p.2.001", "p.2.002"}
        assert one_pass() == {"p.2.000": None}
        assert lister.skipped() == {"p.2.002": "its jnl is a regular file, not a directory"}
    finally:
        sources.close()


def test_a_root_symlink_pointed_at_another_directory_of_the_same_mtime_is_listed_again(
    sshd,
    tmp_path: Path,
    listings: list[str],  # type: ignore[no-untyped-def]
) -> None:
    """A configured root that is a symlink, pointed elsewhere: the target's mtime may be the old one's (made in the
    same second, or copied with its times), so where the root leads is compared too."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    journal(a, "p.1.000")
    journal(b, "p.1.000")
    journal(b, "p.1.001")
    link = tmp_path / "root"
    link.symlink_to(a)
    st = os.stat(a)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    client = connect_to(sshd)
    source = sftp_sources(client, str(link), "test")()
    try:
        settle(link, source, listings)
        tmp = tmp_path / "root.new"
        tmp.symlink_to(b)
        os.replace(tmp, link)
        look(link, source)
        assert source.journals() == ["p.1.000", "p.1.001"]
    finally:
        source.close()
        client.close()


OPS = st.sampled_from(["journal", "shard", "jnl", "jnl-file", "remove", "rename", "settle"])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 3)), min_size=1, max_size=8))
def test_every_look_at_a_changing_root_is_the_local_listing(
    sshd,  # type: ignore[no-untyped-def]
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, int]],
) -> None:
    """Random changes to a root (journals made, removed and renamed, shards being made, jnl/ made a directory or a
    file), each followed by one look of a kept SftpSource, sometimes after its listing has settled: every look gives
    what the local listing gives."""
    root = tmp_path_factory.mktemp("src")
    client = connect_to(sshd)
    source = sftp_sources(client, str(root), "test")()
    listed: list[str] = []
    real = SftpSource._list_dir

    def counting(self, path, **kw):  # type: ignore[no-untyped-def]
        listed.append(path)
        return (yield from real(self, path, **kw))

    SftpSource._list_dir = counting  # type: ignore[method-assign]  # hypothesis: no monkeypatch fixture per example
    try:
        for op, k in ops:
            name = root / f"p.2.00{k}"
            if op == "journal" and not name.exists():
                journal(root, name.name)
            elif op == "shard" and not name.exists():
                name.mkdir()
            elif op in ("jnl", "jnl-file") and name.is_dir() and not (name / "jnl").exists():
                (name / "jnl").mkdir() if op == "jnl" else (name / "jnl").write_bytes(b"")
            elif op == "remove" and name.exists():
                shutil.rmtree(name)
            elif op == "rename" and name.exists() and not (root / f"p.2.00{(k + 1) % 4}").exists():
                name.rename(root / f"p.2.00{(k + 1) % 4}")
            elif op == "settle":
                settle(root, source, listed)
            look(root, source)
    finally:
        SftpSource._list_dir = real  # type: ignore[method-assign]
        source.close()
        client.close()
