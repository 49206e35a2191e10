"""The daemon's kept SFTP channels (sej.hub.location.Sources.kept): the same channels every pass, each keeping
its journals' last segment and checksum file open, so that a grown journal is read with READs alone. Over a real
sshd; what the producer's sftp-servers hold open is read from /proc, not from the hub's own bookkeeping."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sej
from sej.hub import CopyState, copy_all, sftp_handles
from sej.hub import location as hub_location
from sej.hub.location import KeptOf as Keeper
from sej.hub.location import Sources
from sej.hub.sftp_source import SftpSource
from sej.hub.source import SourceError
from sej.hub.ssh import sftp_sources
from sej.offset import read_offset_file
from testing.sshd import descendants

from .test_hub_copy import assert_identical, produce
from .test_hub_copy import journal_files as journal_files_of
from .test_hub_ssh import connect_to

if TYPE_CHECKING:
    import paramiko

BIG = 1 << 20  # segment size: one segment per journal


def counting_sources(client, src: str) -> tuple[Sources, list[SftpSource]]:  # type: ignore[no-untyped-def]
    """Sources over `client`, and the SftpSources (channels) they make, as they make them."""
    make, made = sftp_sources(client, src, "test"), []

    def counting_make() -> SftpSource:
        made.append(make())
        return made[-1]

    return Sources("test", counting_make, client), made


def held_open(sshd, under: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The files under `under` that the sshd's processes (its sftp-servers) hold open ("(deleted)" kept)."""
    found = []
    for pid in descendants(sshd.pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone meanwhile
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(under + os.sep):
                found.append(target)
    return found


def open_paths(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The paths SftpSource opens from now on (SSH_FXP_OPEN)."""
    opened: list[str] = []
    real = SftpSource._open

    def counting(self, path, flags):  # type: ignore[no-untyped-def]
        opened.append(path)
        return (yield from real(self, path, flags))

    monkeypatch.setattr(SftpSource, "_open", counting)
    return opened


def journal_files(opened: list[str]) -> list[str]:
    return [p for p in opened if p.endswith((".jnl", ".sum"))]


def age_kept(source: SftpSource) -> None:
    """Make every file `source` keeps open old, as KEEP_SECONDS later."""
    for key, k in list(source._handles.kept.items()):
        source._handles.kept[key] = k._replace(until=0.0)


def shard_root(root: Path, count: int = 300) -> Callable[[int], None]:
    """A producer root of `count` shards of one message each; returns what appends one more to each."""
    from sej.shard.name import format_shard

    names = [format_shard("p", 9, i) for i in range(count)]

    def append_to_each(seed: int) -> None:
        for name in names:
            with sej.Writer(str(root / name), segment_size=BIG) as w:
                w.append(b"%s-%d" % (name.encode(), seed))

    append_to_each(0)
    return append_to_each


@contextmanager
def sshd_allowing(files: int) -> Iterator[paramiko.SSHClient]:
    """A connection to a new sshd whose sessions (its sftp-servers) may open `files` files at most."""
    import resource

    from testing.sshd import Sshd, sshd_available

    if sshd_available() is not None and not os.environ.get("CI"):
        pytest.skip(str(sshd_available()))
    with Sshd() as server:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (files, files))  # its sessions inherit it
        client = connect_to(server)
        try:
            yield client
        finally:
            client.close()


def test_kept_channels_read_grown_journals_through_the_files_they_keep_open_and_let_deleted_ones_go(
    sshd, tmp_path, monkeypatch
) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    journals = sorted(os.listdir(src))
    client = connect_to(sshd)
    sources, made = counting_sources(client, src)
    keeper, state = Keeper(sources), CopyState()
    try:
        opened = open_paths(monkeypatch)
        out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
        assert all(o.error is None for o in out) and len(out) == len(journals), out
        assert_identical(src, hub)
        first = journal_files(opened)
        assert sorted(first) == sorted(set(first)), "each file opened once"
        assert {os.path.basename(os.path.dirname(os.path.dirname(p))) for p in first} == set(journals)
        ofs = [os.path.join(src, j, "ofs", "hub.ofs") for j in journals]
        held = held_open(sshd, src)
        assert sorted(held) == sorted(first + ofs), "the sftp-servers hold each segment, checksum and offset file open"
        inodes = [os.stat(p).st_ino for p in ofs]
        channels = [sources.kept(k) for k in range(3)]

        for seed in (1, 2):  # every journal grows: read, checked and copied without an open
            opened.clear()
            produce(src, 100, segment_size=BIG, seed=seed)
            out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
            assert all(o.error is None for o in out) and all(o.result and o.result.messages for o in out), out
            assert_identical(src, hub)
            assert opened == [], "no segment, checksum or (commit temp) file opened"
            assert sorted(held_open(sshd, src)) == sorted(first + ofs)
            # Each commit overwrote the offset file the last one created, in place (a rename makes a new inode).
            assert [read_offset_file(p) for p in ofs] == [sej.next_offset(os.path.join(src, j)) for j in journals]
            assert [os.stat(p).st_ino for p in ofs] == inodes
        assert [sources.kept(k) for k in range(3)] == channels, "the same channels every pass"
        assert len(made) == 3 and {id(m) for m in made} == {id(c) for c in channels}, "no channel opened per pass"

        # A journal removed on the producer: the pass that no longer finds it closes its files, so the
        # producer's disk space comes back.
        gone = journals[0]
        shutil.rmtree(os.path.join(src, gone))
        out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
        assert all(o.error is None for o in out) and sorted(o.journal for o in out) == journals[1:]
        left = held_open(sshd, src)
        assert left and not [p for p in left if f"{os.sep}{gone}{os.sep}" in p or p.endswith("(deleted)")], left
    finally:
        sources.close()


def test_files_replaced_under_kept_handles_are_read_from_their_paths_again(sshd, tmp_path, monkeypatch) -> None:
    """A kept handle reads the file it opened. If a producer puts another file at the path (a restored backup, a
    tool's rewrite), the hub notices: a segment read shorter than the path's lstat, or a copy that stalls for
    lack of checksums, lets the handle go and the path is opened again; nothing wrong is copied meanwhile."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    journals = sorted(os.listdir(src))
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()
    try:
        assert all(o.error is None for o in copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper))
        seg_of, sum_of = journals[0], journals[1]
        (seg,) = sej.list_segments(os.path.join(src, seg_of))
        sums = [os.path.join(src, sum_of, "idx", f) for f in os.listdir(os.path.join(src, sum_of, "idx"))
                if f.endswith(".sum")]  # fmt: skip
        assert len(sums) == 1
        for path in (seg.path, sums[0]):  # the same bytes in a new file (a new inode) at the path
            shutil.copyfile(path, path + ".new")
            os.replace(path + ".new", path)
        produce(src, 100, segment_size=BIG, seed=1)  # the writers open the new files and append to them
        opened = open_paths(monkeypatch)
        out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
        assert all(o.error is None for o in out), out
        # The segment read short through its old handle: opened again in the same pass, and copied whole.
        assert journal_files_of(os.path.join(src, seg_of)) == journal_files_of(os.path.join(hub, f"c1.{seg_of}"))
        # The old checksum file covers none of the new bytes: nothing of them is copied unchecked; the stalled
        # journal's handles are let go at the end of the pass, and the next pass checks and copies them.
        assert journal_files_of(os.path.join(hub, f"c1.{sum_of}")) != journal_files_of(os.path.join(src, sum_of))
        out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
        assert all(o.error is None for o in out), out
        assert_identical(src, hub)
        assert seg.path in opened and sums[0] in opened, opened
        assert not [p for p in held_open(sshd, src) if p.endswith("(deleted)")]
    finally:
        sources.close()


def test_kept_handles_stay_within_the_cap(sshd, tmp_path, monkeypatch) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    monkeypatch.setattr(hub_location, "KEEP_HANDLES", 3)
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()
    try:
        for seed in range(3):
            produce(src, 50, segment_size=BIG, seed=seed)
            out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
            assert all(o.error is None for o in out), out
            assert_identical(src, hub)
            held = held_open(sshd, src)
            assert 0 < len(held) <= 3, held  # 4 journals, 2 files each, one kept channel that reads
    finally:
        sources.close()


def test_a_channel_serving_more_files_than_it_keeps_reads_the_ones_it_keeps_through_their_handles(
    sshd, tmp_path, monkeypatch
) -> None:
    """Passes read the journals in turn: a channel that closed its least recently read file to keep the next one
    would keep none of the files the next pass reads first. The files kept stay kept (until KEEP_SECONDS)."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    journals = sorted(os.listdir(src))
    files = 2 * len(journals)  # a segment and a checksum file each (and an offset file each, once committed)
    monkeypatch.setattr(hub_location, "KEEP_HANDLES", 3)
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()
    try:
        opened = open_paths(monkeypatch)
        held = []
        for seed in range(3):
            opened.clear()
            produce(src, 50, segment_size=BIG, seed=seed)
            out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
            assert all(o.error is None for o in out) and all(o.result and o.result.messages for o in out), out
            assert_identical(src, hub)
            held.append(sorted(held_open(sshd, src)))
            kept_files = [p for p in held[-1] if p.endswith((".jnl", ".sum"))]
            assert len(held[-1]) == 3
            if seed:  # the files kept were read through their handles; only the others were opened
                assert len(journal_files(opened)) == files - len(kept_files), (opened, held)
        assert held[0] == held[1] == held[2], "the same files kept every pass"
    finally:
        sources.close()


def test_a_kept_channel_that_broke_is_replaced(sshd, tmp_path) -> None:
    src = str(tmp_path / "src")
    produce(src, 50, segment_size=BIG)
    journal = sorted(os.listdir(src))[0]
    (seg,) = sej.list_segments(os.path.join(src, journal))
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    try:
        first = sources.kept(0)
        assert sources.kept(0) is first
        assert isinstance(first, SftpSource) and first._handles.most > 0, "OpenSSH states its handle limit"
        first.sftp.get_channel().close()  # the channel ends under it (as when its sftp-server dies)
        with pytest.raises(SourceError):
            first.read(journal, os.path.basename(seg.path), 0, 10)
        second = sources.kept(0)
        assert second is not first
        assert second.read(journal, os.path.basename(seg.path), 0, 10) == open(seg.path, "rb").read(10)
    finally:
        sources.close()


def test_a_handle_let_go_while_another_operation_reads_it_is_closed_once_afterwards(sshd, tmp_path) -> None:
    """One call reads a journal's checksum file through its kept handle (in several rounds) while another of its
    operations moves the journal on to its next segment's file, letting that handle go. The handle is closed with
    the next call, once: closed twice, the second CLOSE would shut whatever file the server opened under the
    freed name since (it reuses them), and a journal would then be read through another one's file."""
    from sej.layout import segment_name, sum_name

    src = str(tmp_path / "src")
    produce(src, 20, segment_size=BIG)
    j, k = sorted(os.listdir(src))[:2]
    for journal in (j, k):  # checksum files of our own making: only their bytes matter here
        for f in os.listdir(os.path.join(src, journal, "idx")):
            os.unlink(os.path.join(src, journal, "idx", f))
    first, second, other = (os.path.join(src, j, "idx", sum_name(0)), os.path.join(src, j, "idx", sum_name(1000)),
                            os.path.join(src, k, "idx", sum_name(0)))  # fmt: skip
    Path(first).write_bytes(b"A" * 100)
    Path(second).write_bytes(b"B" * 50)
    Path(other).write_bytes(b"K" * 50)
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    try:
        kept = sources.kept(0)
        assert kept.read_sums(j, segment_name(0), 0) == b"A" * 100
        assert kept.read_sums(k, segment_name(0), 0) == b"K" * 50
        with open(first, "ab") as f:  # more than one READ's worth: the kept read takes several rounds
            f.write(b"a" * (600 << 10))
        kept.forget({k})  # something to close with the next call
        got = kept.many([("read_sums", j, segment_name(0), 100), ("read_sums", j, segment_name(1000), 0)])
        # From byte 100 on, after the file's 16-byte header; compared by length and content, not by pytest's diff.
        assert [len(g) for g in got] == [16 + (600 << 10), 50]
        assert got[0] == b"A" * 16 + b"a" * (600 << 10) and got[1] == b"B" * 50
        assert kept.read_sums(j, segment_name(1000), 0) == b"B" * 50  # closes what the call before let go
        (seg,) = sej.list_segments(os.path.join(src, k))
        # Other files opened (and kept) now get the names the server freed (it reuses them, last closed first).
        assert kept.many([("read", k, os.path.basename(seg.path), 0, 10)]) == [Path(seg.path).read_bytes()[:10]]
        assert kept.read_sums(k, segment_name(0), 0) == b"K" * 50
        assert kept.read_sums(j, segment_name(1000), 0) == b"B" * 50, "each journal read through its own file"
        held = held_open(sshd, src)
        assert sorted(held) == sorted([second, other, seg.path]), held  # no handle lost, none doubled
    finally:
        sources.close()


def test_kept_files_are_let_go_on_rollover_and_on_a_failed_copy(sshd, tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 200, segment_size=BIG)
    journals = sorted(os.listdir(src))
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()

    def copy() -> list:  # type: ignore[type-arg]
        return copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)

    try:
        assert all(o.error is None for o in copy())
        # Rollover: a journal whose writer moved on to a new segment keeps that one's files open, not the old.
        rolled = journals[0]
        with sej.Writer(os.path.join(src, rolled), segment_size=1) as w:  # every append starts a segment
            w.append(b"x")
            w.append(b"y")
        assert all(o.error is None for o in copy())
        assert_identical(src, hub)
        segments = [s for s in sej.list_segments(os.path.join(src, rolled)) if os.path.getsize(s.path)]
        assert len(segments) >= 2, "rolled over"
        last = os.path.basename(segments[-1].path)  # the last one read (a writer's next segment may be empty)
        mine = [p for p in held_open(sshd, src) if f"{os.sep}{rolled}{os.sep}" in p]
        assert sorted(os.path.basename(p) for p in mine) == [last, last[:16] + ".sum", "hub.ofs"], (last, mine)

        # A failed copy: the producer's segment no longer matches what the hub has (its bytes rewritten).
        failed = journals[1]
        (seg,) = sej.list_segments(os.path.join(src, failed))
        data = bytearray(Path(seg.path).read_bytes())
        data[-5] ^= 0xFF
        Path(seg.path).write_bytes(bytes(data))  # in place: the kept handle sees it
        with sej.Writer(os.path.join(src, failed), segment_size=BIG) as w:
            w.append(b"more")
        out = {o.journal: o for o in copy()}
        assert out[failed].error is not None, out[failed]
        assert not [p for p in held_open(sshd, src) if f"{os.sep}{failed}{os.sep}" in p], "its files let go"
    finally:
        sources.close()


def test_kept_files_are_closed_at_the_end_of_the_pass_in_which_they_reach_their_age(
    sshd, tmp_path, monkeypatch
) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    monkeypatch.setattr(sftp_handles, "KEEP_SECONDS", 0.0)  # every file kept is old at the end of its pass
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()
    try:
        for seed in range(2):
            produce(src, 100, segment_size=BIG, seed=seed)
            out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
            assert all(o.error is None for o in out) and all(o.result and o.result.messages for o in out), out
            assert_identical(src, hub)
            assert held_open(sshd, src) == []
    finally:
        sources.close()


def test_copies_that_read_for_themselves_borrow_the_kept_channels(sshd, tmp_path, monkeypatch) -> None:
    """Copies that read what the pass did not read ahead (here: everything) use the kept channels, idle while the
    pass copies: no channel is opened for them, and the journals' homes spread over the workers' channels."""
    from sej.hub import batch as hub_batch

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    monkeypatch.setattr(hub_batch, "PREFETCH_PER_JOURNAL", 0)  # no read-ahead: each copy reads for itself
    client = connect_to(sshd)
    sources, made = counting_sources(client, src)
    keeper, state = Keeper(sources), CopyState()
    reads: list[tuple[int, str]] = []
    real_read = SftpSource.read

    def counting_read(self, journal, name, pos, size):  # type: ignore[no-untyped-def]
        reads.append((id(self), journal))
        return real_read(self, journal, name, pos, size)

    monkeypatch.setattr(SftpSource, "read", counting_read)
    try:
        for seed in range(2):
            produce(src, 60, segment_size=BIG, seed=seed)
            out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
            assert all(o.error is None for o in out), out
            assert_identical(src, hub)
        assert len(made) == 3, "the 2 workers' channels and the lister's"
        assert reads and {r for r, _j in reads} <= {id(sources.kept(k)) for k in range(2)}
        homes = {hub_batch._home(j, 2) for j in os.listdir(src)}
        assert homes == {0, 1}, "4 shards over 2 channels: 2 each"
    finally:
        sources.close()


def test_a_producer_with_few_open_files_gets_every_copy_and_commit(tmp_path) -> None:
    """The files a pass holds open on a producer (kept ones, and those its operations open at once) stay within
    what the sftp-server may open: with 256 open files allowed, 300 journals copy and commit on every pass."""
    root, hub = tmp_path / "src", str(tmp_path / "hub")
    append_to_each = shard_root(root)
    with sshd_allowing(256) as client:
        sources = Sources("test", sftp_sources(client, str(root), "test"), client)
        keeper, state = Keeper(sources), CopyState()
        try:
            limit = sources.kept(0)._pipe.one(sources.kept(0)._handle_limit())
            assert limit is not None and limit <= 256
            assert sources.kept(0)._handles.most == limit // 2
            for seed in range(1, 4):
                append_to_each(seed)
                out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
                assert [o for o in out if o.error is not None] == []
                assert_identical(str(root), hub)
        finally:
            sources.close()


def test_an_offset_file_replaced_under_its_kept_handle_is_written_by_its_path_again_once_the_handle_is_old(
    sshd, tmp_path, monkeypatch
) -> None:
    """A commit through a kept handle writes the file the hub created. If the producer puts another file at
    `ofs/hub.ofs` (a restored backup, a tool's rewrite), the hub's commits reach it again once the handle is
    KEEP_SECONDS old: the old file is let go, and the commit replaces the name (temp file and rename) as the
    first one did. A symlink put there is never written through, kept handle or not."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 50, segment_size=BIG)
    journal = sorted(os.listdir(src))[0]
    ofs = os.path.join(src, journal, "ofs", "hub.ofs")
    monkeypatch.setattr(sftp_handles, "KEEP_SECONDS", 3600.0)
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()

    def copy() -> None:
        out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
        assert all(o.error is None for o in out), out
        assert_identical(src, hub)

    try:
        copy()
        assert read_offset_file(ofs) == sej.next_offset(os.path.join(src, journal))
        sej.offset.write_offset_file(ofs, 1)  # a new file at the path (temp file and rename)
        produce(src, 10, segment_size=BIG, seed=1)
        copy()
        assert read_offset_file(ofs) == 1, "written through the kept handle: the old file, not the one there now"
        age_kept(sources.kept(0))  # type: ignore[arg-type]
        produce(src, 10, segment_size=BIG, seed=2)
        copy()
        assert read_offset_file(ofs) == sej.next_offset(os.path.join(src, journal)), "the file at the path again"

        os.remove(ofs)
        os.symlink(os.path.join(src, journal, "jnl"), ofs)  # a symlink there: never written through
        produce(src, 10, segment_size=BIG, seed=3)
        out = {o.journal: o for o in copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)}
        assert os.path.islink(ofs)
        age_kept(sources.kept(0))  # type: ignore[arg-type]
        produce(src, 10, segment_size=BIG, seed=4)
        out = {o.journal: o for o in copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)}
        assert out[journal].error is not None and "symlink" in str(out[journal].error), out[journal]
        assert os.path.islink(ofs)
    finally:
        sources.close()


def test_a_kept_checksum_file_header_is_read_once_through_its_handle(sshd, tmp_path, monkeypatch) -> None:
    """A grown journal's checksum file is read from the last pass's record on, with its 16-byte header: through a
    kept handle the header is read once, then remembered with the handle (a header is written once), so later
    passes send one READ for the checksum records alone."""
    from paramiko.sftp import CMD_READ

    from sej.hub import pipeline as hub_pipeline

    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300, segment_size=BIG)
    journals = sorted(os.listdir(src))
    header_reads: list[bytes] = []
    real_send = hub_pipeline.Pipeline._send

    def send(self):  # type: ignore[no-untyped-def]
        n = min(len(self._unsent), self.window - len(self._in_flight))
        for _k, _slot, (t, *args) in list(self._unsent)[:n]:
            if t == CMD_READ and int(args[1]) == 0 and args[2] == 16:  # a checksum file's header
                header_reads.append(args[0])
        return real_send(self)

    monkeypatch.setattr(hub_pipeline.Pipeline, "_send", send)
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()
    try:
        per_pass = []
        for seed in range(4):
            produce(src, 50, segment_size=BIG, seed=seed)
            header_reads.clear()
            out = copy_all(sources, hub, "c1", "hub", workers=2, state=state, kept=keeper)
            assert all(o.error is None for o in out) and all(o.result and o.result.messages for o in out), out
            assert_identical(src, hub)
            per_pass.append(len(header_reads))
        # The first pass opens the files (read from 0); the second reads each header through its kept handle once.
        assert per_pass == [0, len(journals), 0, 0], per_pass
    finally:
        sources.close()


def test_a_pass_without_kept_channels_stays_within_the_files_a_producer_allows(tmp_path) -> None:
    """`sej copy`'s channels keep nothing, but each one's operations hold files open at once: as many as the
    server allows, at most. With 64 open files allowed, an initial copy of 300 journals gets every one."""
    root, hub = tmp_path / "src", str(tmp_path / "hub")
    shard_root(root)
    with sshd_allowing(64) as client:
        make = sftp_sources(client, str(root), "test")
        probe = make()
        assert probe._limit is not None and probe._limit <= 64 and probe._pipe.max_ops <= probe._limit // 2
        probe.close()
        out = copy_all(make, hub, "c1", "hub", workers=2)
        assert [o for o in out if o.error is not None] == [] and len(out) == 300
        assert_identical(str(root), hub)


def failed_opens(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The OPENs of SftpSource that the server refuses from now on (path: error)."""
    failed: list[str] = []
    real = SftpSource._open

    def counting(self, path, flags):  # type: ignore[no-untyped-def]
        try:
            return (yield from real(self, path, flags))
        except OSError as e:
            failed.append(f"{path}: {e}")
            raise

    monkeypatch.setattr(SftpSource, "_open", counting)
    return failed


@pytest.mark.parametrize("aged", [False, True])
def test_a_pass_never_opens_more_files_than_the_producer_allows(tmp_path, monkeypatch, aged: bool) -> None:
    """With 256 open files allowed and 300 journals (900 files to keep, far more than fit): no OPEN is refused.
    A file that cannot be kept is closed by the operation that opened it, not with the next call; files let go
    (aged: all of them reach KEEP_SECONDS as the pass reads them) still count until closed, and are closed
    before the next call's operations open more. (Found by review: 694 and 472 refused OPENs before.)"""
    failed = failed_opens(monkeypatch)
    root, hub = tmp_path / "src", str(tmp_path / "hub")
    append_to_each = shard_root(root)
    with sshd_allowing(256) as client:
        sources = Sources("test", sftp_sources(client, str(root), "test"), client)
        keeper, state = Keeper(sources), CopyState()
        try:
            for seed in range(1, 4):
                append_to_each(seed)
                if aged:
                    age_kept(sources.kept(0))  # type: ignore[arg-type]
                out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
                assert [o for o in out if o.error is not None] == []
                assert_identical(str(root), hub)
                assert failed == [], f"{len(failed)} OPENs refused, e.g. {failed[:2]}"
        finally:
            sources.close()


def test_a_hard_link_to_the_kept_offset_file_sees_commits_only_until_the_handle_is_old(sshd, tmp_path) -> None:
    """A commit through the kept handle writes the offset file the hub created, in place. Another name made for
    it on the producer (a `cp -al` backup) is that same file, and sees those commits until the handle is
    KEEP_SECONDS old; the next commit then replaces the name (temp file and rename), and the other name keeps the
    value it had. (A local commit never writes a file with other names; over SFTP the link count is not known.)"""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 50, segment_size=BIG)
    journal = sorted(os.listdir(src))[0]
    ofs = os.path.join(src, journal, "ofs", "hub.ofs")
    backup = str(tmp_path / "backup-hub.ofs")
    client = connect_to(sshd)
    sources = Sources("test", sftp_sources(client, src, "test"), client)
    keeper, state = Keeper(sources), CopyState()

    def copy() -> None:
        out = copy_all(sources, hub, "c1", "hub", workers=1, state=state, kept=keeper)
        assert all(o.error is None for o in out), out
        assert_identical(src, hub)

    try:
        copy()
        os.link(ofs, backup)
        produce(src, 10, segment_size=BIG, seed=1)
        copy()
        seen = read_offset_file(backup)
        assert seen == read_offset_file(ofs) == sej.next_offset(os.path.join(src, journal)), "the same file"
        age_kept(sources.kept(0))  # type: ignore[arg-type]
        for seed in (2, 3):
            produce(src, 10, segment_size=BIG, seed=seed)
            copy()
            assert read_offset_file(ofs) == sej.next_offset(os.path.join(src, journal))
            assert read_offset_file(backup) == seen, "the other name is left alone from then on"
        assert os.stat(ofs).st_nlink == 1 and os.stat(backup).st_nlink == 1
    finally:
        sources.close()
