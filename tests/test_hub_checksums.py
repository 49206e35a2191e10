"""The hub verifies end to end: copied bytes are checked against the producer's checksums before they are
written, nothing is committed past a mismatch, and the hub root carries checksums of its own."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

import sej
from sej.checksum import check_segment
from sej.hub.copy import CopyError, copy_journal
from sej.hub.local_source import LocalSource
from sej.hub.sftp_source import SftpSource
from sej.layout import list_segments, sum_path
from testing.flips import count_kinds, flips, fully_checked, write_journal

from .test_hub_ssh import connect_to


def copy(source: object, hub: str) -> object:
    return copy_journal(source, "ev", hub, "c1", "hub")  # type: ignore[arg-type]


def prefix_of(hub_dir: str, src_dir: str) -> None:
    """Every segment the hub has is a byte prefix of the producer's."""
    for seg in list_segments(hub_dir):
        mine = Path(seg.path).read_bytes()
        theirs = Path(src_dir, "jnl", os.path.basename(seg.path)).read_bytes()
        assert theirs.startswith(mine), seg.path


def check_flips(source: object, src_dir: str, scratch: Path, count: int, seed: int) -> dict[str, int]:
    caught: dict[str, int] = {}
    for i, f in enumerate(flips(src_dir, count, seed)):
        hub = str(scratch / f"hub{i}")
        try:
            with pytest.raises(CopyError) as e:
                copy(source, hub)
            msg = str(e.value)
            name = os.path.basename(f.path)[:16]
            assert "client c1" in msg and "journal ev" in msg and f"{name}.jnl" in msg, (f, msg)
            # Nothing committed on the producer, nothing of the damaged bytes written at the hub.
            assert not os.path.exists(os.path.join(src_dir, "ofs", "hub.ofs")), f
            hub_dir = os.path.join(hub, "c1.ev")
            f.undo()  # compare with the clean producer
            prefix_of(hub_dir, src_dir)
            if f.kind != "sums":
                assert "bytes " in msg, msg
                held = os.path.join(hub_dir, "jnl", f"{name}.jnl")
                assert not os.path.exists(held) or os.path.getsize(held) <= f.pos, (f, msg)
            count_kinds(caught, f)
        finally:
            shutil.rmtree(hub, ignore_errors=True)
    return caught


@pytest.mark.slow
def test_every_flipped_byte_stops_the_copy_before_it(tmp_path: Path) -> None:
    root = tmp_path / "producer"
    write_journal(str(root / "ev"))
    source = LocalSource(str(root))
    try:
        caught = check_flips(source, str(root / "ev"), tmp_path, 1000, seed=21)
        assert sum(caught.values()) == 1000 and len(caught) == 4, caught
        # restored: the copy goes through, and the hub root is checksummed
        hub = str(tmp_path / "hub")
        copy(source, hub)
    finally:
        source.close()
    fully_checked(os.path.join(hub, "c1.ev"))


def test_flipped_bytes_over_a_real_sshd(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    from sej.hub.ssh import sftp_sources

    root = tmp_path / "producer"
    write_journal(str(root / "ev"))
    client = connect_to(sshd)
    try:
        source = sftp_sources(client, str(root), "test")()
        try:
            caught = check_flips(source, str(root / "ev"), tmp_path, 12, seed=22)
            assert sum(caught.values()) == 12, caught
        finally:
            source.close()
    finally:
        client.close()


def test_a_go_journal_copies_unchecked_and_the_hub_root_gets_checksums(tmp_path: Path) -> None:
    root = tmp_path / "producer"
    msgs = write_journal(str(root / "ev"), n=1200)
    for seg in list_segments(str(root / "ev")):
        os.remove(sum_path(str(root / "ev"), seg.first_offset))
    hub = str(tmp_path / "hub")
    source = LocalSource(str(root))
    try:
        r = copy(source, hub)
    finally:
        source.close()
    assert r.messages == len(msgs)  # type: ignore[attr-defined]
    fully_checked(os.path.join(hub, "c1.ev"))


def test_incremental_copies_of_a_live_journal_stay_exact_and_checksummed(tmp_path: Path) -> None:
    """A writer appends (with flushes mid-block) between passes; each pass checks only the new bytes."""
    root = tmp_path / "producer"
    d = str(root / "ev")
    hub = str(tmp_path / "hub")
    rng = random.Random(4)
    root.mkdir()
    source = LocalSource(str(root))
    try:
        with sej.Writer(d, segment_size=200 << 10) as w:
            for _ in range(25):
                for _ in range(rng.randrange(1, 300)):
                    w.append(rng.randbytes(rng.randrange(700)))
                    if rng.random() < 0.05:
                        w.flush()
                w.flush()
                r = copy(source, hub)
                assert r.next_offset == w.next_offset  # type: ignore[attr-defined]
                prefix_of(os.path.join(hub, "c1.ev"), d)
        copy(source, hub)
    finally:
        source.close()
    hub_dir = os.path.join(hub, "c1.ev")
    for seg in list_segments(d):
        assert Path(seg.path).read_bytes() == Path(hub_dir, "jnl", os.path.basename(seg.path)).read_bytes()
    fully_checked(hub_dir)
    for seg in list_segments(hub_dir):
        assert not check_segment(seg.path, sum_path(hub_dir, seg.first_offset), seg.first_offset).errors


def test_bytes_not_yet_covered_wait_for_the_next_pass(tmp_path: Path) -> None:
    """In the producer's last segment, bytes past its last checksum record (a writer killed between the two
    writes) are not copied until they are covered."""
    root = tmp_path / "producer"
    d = str(root / "ev")
    write_journal(d, n=300)
    seg = list_segments(d)[-1]
    spath = sum_path(d, seg.first_offset)
    full = Path(spath).read_bytes()
    Path(spath).write_bytes(full[:-16])  # the last record not written yet
    hub = str(tmp_path / "hub")
    source = LocalSource(str(root))
    try:
        r = copy(source, hub)
        held = Path(hub, "c1.ev", "jnl", os.path.basename(seg.path))
        assert held.stat().st_size < seg_size(seg)
        Path(spath).write_bytes(full)
        r = copy(source, hub)
        assert held.read_bytes() == Path(seg.path).read_bytes()
        assert r.next_offset == 300  # type: ignore[attr-defined]
    finally:
        source.close()


def seg_size(seg: sej.Segment) -> int:
    return os.path.getsize(seg.path)


def test_a_pass_checks_against_checksum_files_read_ahead_over_a_real_sshd(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    """A pass of sej copy / sej-hub (copy_all) reads each journal's checksum files ahead with its new bytes,
    in one pipelined round, not one round trip per journal: the check holds the same. Each flipped byte stops
    that journal's copy before it, with nothing committed, while the other journal is copied whole."""
    from sej.hub.batch import copy_all
    from sej.hub.ssh import sftp_sources

    root = tmp_path / "producer"
    write_journal(str(root / "ev"))
    write_journal(str(root / "ok"), n=300, seed=8)
    client = connect_to(sshd)
    try:
        make = sftp_sources(client, str(root), "test")
        for i, f in enumerate(flips(str(root / "ev"), 8, seed=23)):
            hub = tmp_path / f"hub{i}"
            try:
                outcomes = {o.journal: o for o in copy_all(make, str(hub), "c1", "hub", workers=4)}
                assert isinstance(outcomes["ev"].error, CopyError), (f, outcomes["ev"])
                assert "journal ev" in str(outcomes["ev"].error), f
                assert outcomes["ok"].error is None and outcomes["ok"].result is not None
                assert not os.path.exists(root / "ev" / "ofs" / "hub.ofs"), f
                f.undo()
                prefix_of(str(hub / "c1.ev"), str(root / "ev"))
            finally:
                shutil.rmtree(hub, ignore_errors=True)
        hub = tmp_path / "hub"
        one_by_one: list[str] = []  # checksum files read by a copy itself, a round trip each
        real = SftpSource.read_sums
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(SftpSource, "read_sums",
                       lambda self, j, name, skip=0: one_by_one.append(name) or real(self, j, name, skip))  # fmt: skip
            outcomes = {o.journal: o for o in copy_all(make, str(hub), "c1", "hub", workers=4)}
        assert all(o.error is None for o in outcomes.values()), outcomes
        assert one_by_one == [], "checksum files read one by one instead of ahead"
        fully_checked(str(hub / "c1.ev"))
        assert sej.next_offset(str(hub / "c1.ev")) == sej.next_offset(str(root / "ev"))
    finally:
        client.close()


# -- a pass reads the producer's checksum file from where the last one stopped (sej.hub.copy.SumsMark) --


class SumsReads(LocalSource):
    """A LocalSource that records each read of a checksum file: (skip, bytes returned)."""

    def __init__(self, root: str, reads: list[tuple[int, int | None]]) -> None:
        super().__init__(root)
        self.reads = reads

    def read_sums(self, journal: str, name: str, skip: int = 0) -> bytes | None:
        got = super().read_sums(journal, name, skip)
        self.reads.append((skip, None if got is None else len(got)))
        return got


def one_message_per_flush(w: sej.Writer, n: int, tag: str) -> None:
    for i in range(n):
        w.append(f"{tag}-{i}".encode())
        w.flush()  # a checksum record each


def test_a_pass_reads_only_what_follows_its_last_read_of_a_checksum_file(tmp_path: Path) -> None:
    """A writer flushing each message adds a record per message; a pass over a few new messages reads the
    header and the records after the last pass's, whatever the file's length (the cache file between passes
    carries the mark, as between `sej copy` runs)."""
    from sej.hub import CopyState, copy_all

    root, hub, path = tmp_path / "producer", str(tmp_path / "hub"), str(tmp_path / "state.json")
    reads: list[tuple[int, int | None]] = []
    d = root / "ev"
    with sej.Writer(str(d)) as w:
        one_message_per_flush(w, 3000, "a")
        sums = Path(sum_path(str(d), 0))
        (o,) = copy_all(lambda: SumsReads(str(root), reads), hub, "c1", "hub", state=CopyState(path))
        assert o.error is None and o.result is not None and o.result.sums is not None
        assert reads == [(0, sums.stat().st_size)] and sums.stat().st_size >= 16 + 3000 * 16
        for r in range(6):
            reads.clear()
            one_message_per_flush(w, 7, f"r{r}")
            (o,) = copy_all(lambda: SumsReads(str(root), reads), hub, "c1", "hub", state=CopyState.load(path))
            assert o.error is None and o.result is not None and o.result.messages == 7, o
            # The header, the anchor record and the 7 new ones: not the 3,000 before them.
            assert [(skip > 16, n) for skip, n in reads] == [(True, 16 + 16 + 7 * 16)], reads
    hub_dir = os.path.join(hub, "c1.ev")
    assert Path(list_segments(str(d))[0].path).read_bytes() == Path(list_segments(hub_dir)[0].path).read_bytes()
    fully_checked(hub_dir)


def test_a_mark_whose_anchor_changed_or_that_the_hub_no_longer_reaches_reads_the_whole_file(tmp_path: Path) -> None:
    """The mark is a cache, checked before use: the producer's file no longer holding the anchor record, or the
    hub's copy cut back below it (a torn tail recovery cut aside), reads the file whole, as without a mark."""
    from sej.hub import CopyState, copy_all

    root, hub = tmp_path / "producer", str(tmp_path / "hub")
    d = root / "ev"
    reads: list[tuple[int, int | None]] = []
    state = CopyState()

    def copy_pass() -> object:
        (o,) = copy_all(lambda: SumsReads(str(root), reads), hub, "c1", "hub", state=state)
        return o

    with sej.Writer(str(d)) as w:
        one_message_per_flush(w, 500, "a")
        copy_pass()
        # The hub's copy cut back: its last segment loses part of its last frame (a torn tail).
        seg = Path(list_segments(os.path.join(hub, "c1.ev"))[0].path)
        with open(seg, "r+b") as f:
            f.truncate(seg.stat().st_size - 3)
        one_message_per_flush(w, 5, "b")
        reads.clear()
        with pytest.warns(sej.CorruptionWarning, match="incomplete frame"):  # the hub's torn tail, cut aside
            o = copy_pass()
        assert o.error is None and o.result is not None and o.result.messages == 6, o  # the cut one, again
        assert [skip for skip, _n in reads] == [0], reads
        prefix_of(os.path.join(hub, "c1.ev"), str(d))
        # The producer's checksum file changed where the mark's anchor is: read whole, and checked as ever.
        mark = state.sums["ev"]
        sums = Path(sum_path(str(d), 0))
        raw = bytearray(sums.read_bytes())
        raw[mark.offset - 1] ^= 1  # the anchor's digest
        sums.write_bytes(bytes(raw))
        one_message_per_flush(w, 5, "c")
        reads.clear()
        o = copy_pass()
    assert [skip > 16 for skip, _n in reads] == [True, False], reads  # the anchor is not there: read whole
    assert isinstance(o.error, CopyError) and "checksum mismatch" in str(o.error), o  # type: ignore[attr-defined]
    prefix_of(os.path.join(hub, "c1.ev"), str(d))


def test_a_checksum_file_read_from_a_mark_over_a_real_sshd(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    """SftpSource.read_sums with `skip`: the header and the bytes from `skip` on, in one round of requests;
    past the end, the header alone; and a pass after a pass copies exactly, over SFTP."""
    from sej.hub import CopyState, copy_all
    from sej.hub.ssh import sftp_sources

    root, hub = tmp_path / "producer", str(tmp_path / "hub")
    d = root / "ev"
    client = connect_to(sshd)
    state = CopyState()
    try:
        make = sftp_sources(client, str(root), "test")
        with sej.Writer(str(d)) as w:
            one_message_per_flush(w, 20000, "a")  # a checksum file of 320 KB: more than one SFTP read
            raw = Path(sum_path(str(d), 0)).read_bytes()
            src = make()
            try:
                for skip in (0, 16, 32, 48 + 16 * 1000, len(raw) - 16, len(raw), len(raw) + 160):
                    want = raw if skip <= 16 else raw[:16] + raw[skip:]
                    assert src.read_sums("ev", list_segments(str(d))[0].path.rsplit("/", 1)[1], skip) == want, skip
            finally:
                src.close()
            copy_all(make, hub, "c1", "hub", state=state)
            for r in range(3):
                one_message_per_flush(w, 11, f"r{r}")
                (o,) = copy_all(make, hub, "c1", "hub", state=state)
                assert o.error is None and o.result is not None and o.result.messages == 11, o
                assert o.result.sums is not None and o.result.sums.end == o.result.size
    finally:
        client.close()
    hub_dir = os.path.join(hub, "c1.ev")
    assert Path(list_segments(str(d))[0].path).read_bytes() == Path(list_segments(hub_dir)[0].path).read_bytes()
    fully_checked(hub_dir)


def test_an_invalid_record_read_from_a_mark_is_named_by_its_number_in_the_file(tmp_path: Path) -> None:
    """The error names the record as a whole-file read does, not by its place after the mark's anchor."""
    from sej.hub import CopyState, copy_all

    root = tmp_path / "producer"
    d = root / "ev"
    errors = []
    with sej.Writer(str(d)) as w:
        one_message_per_flush(w, 1000, "a")  # records 0..999
        state = CopyState()
        copy_all(lambda: LocalSource(str(root)), str(tmp_path / "hub"), "c1", "hub", state=state)
        assert state.sums["ev"].offset == 16 + 1000 * 16
        one_message_per_flush(w, 5, "b")  # records 1000..1004
    spath = sum_path(str(d), 0)
    raw = bytearray(Path(spath).read_bytes())
    raw[16 + 1002 * 16 : 16 + 1002 * 16 + 8] = (5).to_bytes(8, "big")  # record 1002 ends before record 1001
    Path(spath).write_bytes(bytes(raw))
    for hub, st in (("hub", state), ("whole", CopyState())):
        (o,) = copy_all(lambda: LocalSource(str(root)), str(tmp_path / hub), "c1", "hub", state=st)
        assert isinstance(o.error, CopyError), o
        errors.append(str(o.error))
    assert all("checksum record 1002 ends at byte 5" in e for e in errors), errors


def test_a_finished_segment_whose_last_checksums_were_lost_is_copied_not_probed_forever(tmp_path: Path) -> None:
    """The hub's last segment has bytes no checksum covers (records lost), and the writer has rolled over: a
    probed pass copies what is covered, then finds no next segment by the name the hub expects; the journal is
    listed then, and the finished segment copied to its end, as a pass without a state does (never a pass
    after pass that copies nothing and says nothing)."""
    from sej.hub import CopyState, copy_all

    root, hub = tmp_path / "producer", str(tmp_path / "hub")
    d = root / "ev"
    state = CopyState()
    with sej.Writer(str(d), segment_size=2000) as w:
        one_message_per_flush(w, 20, "a")
        copy_all(lambda: LocalSource(str(root)), hub, "c1", "hub", state=state)
        while len(list_segments(str(d))) < 2:
            one_message_per_flush(w, 1, "b")
        one_message_per_flush(w, 3, "c")
    first = list_segments(str(d))[0]
    spath = sum_path(str(d), first.first_offset)
    with open(spath, "r+b") as f:  # the finished segment's last three records lost
        f.truncate(os.path.getsize(spath) - 3 * 16)
    for _ in range(2):
        (o,) = copy_all(lambda: LocalSource(str(root)), hub, "c1", "hub", state=state)
        assert o.error is None, o
    hub_dir = os.path.join(hub, "c1.ev")
    assert sej.next_offset(hub_dir) == sej.next_offset(str(d))
    for seg in list_segments(str(d)):
        assert Path(seg.path).read_bytes() == Path(hub_dir, "jnl", os.path.basename(seg.path)).read_bytes()


def test_a_last_segment_whose_end_stays_without_checksums_is_listed_once_not_every_pass(tmp_path: Path) -> None:
    """A writer killed between writing a message and its checksum record leaves bytes no record covers until the
    next writer seals them: the hub copies nothing of them, and lists the journal once to see whether a later
    segment ends it, not on every pass while nothing changes."""
    from sej.hub import CopyState, copy_all

    root, hub = tmp_path / "producer", str(tmp_path / "hub")
    d = root / "ev"
    listed: list[str] = []

    class Listing(LocalSource):
        def segments(self, journal: str) -> list:  # type: ignore[type-arg]
            listed.append(journal)
            return super().segments(journal)

    state = CopyState()
    with sej.Writer(str(d)) as w:
        one_message_per_flush(w, 20, "a")
        copy_all(lambda: Listing(str(root)), hub, "c1", "hub", state=state)
        one_message_per_flush(w, 1, "b")
    spath = sum_path(str(d), 0)
    os.truncate(spath, os.path.getsize(spath) - 16)  # the last message's record never written
    held = Path(hub, "c1.ev", "jnl", "0000000000000000.jnl")
    size = held.stat().st_size
    counts = []
    for _ in range(4):
        listed.clear()
        (o,) = copy_all(lambda: Listing(str(root)), hub, "c1", "hub", state=state)
        assert o.error is None and o.result is not None and o.result.messages == 0, o
        counts.append(len(listed))
    assert counts == [1, 0, 0, 0], counts
    assert held.stat().st_size == size  # nothing unchecked copied
    with sej.Writer(str(d)):  # the next writer seals the bytes: then they are copied
        pass
    (o,) = copy_all(lambda: Listing(str(root)), hub, "c1", "hub", state=state)
    assert o.error is None and o.result is not None and o.result.messages == 1, o
