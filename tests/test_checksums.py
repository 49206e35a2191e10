"""Checksums (sej.checksum): the grid's pure functions, the writer's sidecars through recovery, and
`Scanner(verify=True)` catching every flipped byte, on a journal and on a hub root."""

from __future__ import annotations

import logging
import os
import random
import shutil
import threading
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import sej
from sej.checksum import (
    BLOCK,
    HEADER,
    RECORD,
    Hasher,
    ReadCheck,
    Verifier,
    block_start,
    check_segment,
    parse_records,
)
from sej.errors import ChecksumError
from sej.layout import list_segments, sum_path
from testing.flips import copy_to_hub, count_kinds, flip, flips, fully_checked, write_journal
from testing.timing import scaled, wait_until

# -- the grid, pure ---------------------------------------------------------------------------------


def records_for(data: bytes, cuts: list[int]) -> bytes:
    """The records a writer makes appending `data` in pieces ending at `cuts`."""
    h, out, prev = Hasher(), b"", 0
    for c in [*sorted(set(cuts)), len(data)]:
        if prev < c <= len(data):
            out += h.update(data[prev:c])
            prev = c
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3 * BLOCK + 7), st.lists(st.integers(0, 3 * BLOCK + 7), max_size=12), st.data())
def test_records_cover_every_byte_and_catch_any_flip(n: int, cuts: list[int], draw: st.DataObject) -> None:
    data = random.Random(n).randbytes(n)
    recs, problem = parse_records(records_for(data, cuts), 0)
    assert problem is None and recs[-1].end == n
    # Every complete block has a record at its boundary, with the block's hash.
    ends = {r.end: r.digest for r in recs}
    for b in range(BLOCK, n + 1, BLOCK):
        assert ends[b] == xxhash.xxh3_64_intdigest(data[b - BLOCK : b])
    for r in recs:
        assert r.digest == xxhash.xxh3_64_intdigest(data[block_start(r.end) : r.end])
    v = Verifier()
    assert v.add(recs) is None and v.covered == n
    assert v.feed(data) is None
    # From any position, primed with its block's prefix, in any pieces.
    pos = draw.draw(st.integers(0, n))
    v = Verifier(pos, data[pos // BLOCK * BLOCK : pos])
    assert v.add(recs) is None
    step = draw.draw(st.integers(1, n))
    for i in range(pos, n, step):
        assert v.feed(data[i : i + step]) is None
    # Any flipped bit is caught, in the range that holds it.
    at = draw.draw(st.integers(0, n - 1))
    bad = bytearray(data)
    bad[at] ^= 1 << draw.draw(st.integers(0, 7))
    v = Verifier()
    v.add(recs)
    m = v.feed(bytes(bad))
    assert m is not None and m.start <= at < m.end


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3 * BLOCK + 7), st.lists(st.integers(0, 3 * BLOCK + 7), max_size=12), st.data())
def test_read_check_never_passes_a_flipped_byte(tmp_path_factory: pytest.TempPathFactory, n: int,
                                                cuts: list[int], draw: st.DataObject) -> None:  # fmt: skip
    """ReadCheck returns how far bytes are checked: never past a flipped byte, whatever the reader's steps."""
    data = random.Random(n).randbytes(n)
    d = tmp_path_factory.mktemp("rc")
    seg, sums = d / "seg", d / "sum"
    at = draw.draw(st.none() | st.integers(0, n - 1))
    bad = bytearray(data)
    if at is not None:
        bad[at] ^= 1 << draw.draw(st.integers(0, 7))
    seg.write_bytes(bad)
    sums.write_bytes(HEADER.pack(b"SEJSUM01", 5) + records_for(data, cuts))
    start = draw.draw(st.integers(0, n))
    with ReadCheck(str(seg), str(sums), 5) as rc, open(seg, "rb") as f:
        assert rc.sums is not None
        want = start
        try:
            for _ in range(n + 2):
                want = min(n, want + draw.draw(st.integers(1, 2 * BLOCK)))
                use_data = draw.draw(st.booleans())
                got = rc.check(f.fileno(), n, start, want, bytes(bad[start:want]) if use_data else None)
                assert got >= want  # every byte has a record
                assert at is None or got <= at or at < start - start % BLOCK, (got, at)
                if want == n:
                    break
        except ChecksumError as e:
            assert at is not None and e.start <= at < e.end, (e, at)
        else:
            assert at is None or at < start - start % BLOCK  # a flip before where reading began is not read


def test_parse_records_refuses_records_off_the_grid() -> None:
    def rec(*ends: int) -> bytes:
        return b"".join(RECORD.pack(e, 0) for e in ends)

    assert parse_records(rec(10, 20, BLOCK, BLOCK + 5), 0)[1] is None
    for bad in [(0,), (10, 10), (20, 10), (BLOCK + 1,), (10, BLOCK + 1), (BLOCK, 2 * BLOCK + 1)]:
        recs, problem = parse_records(rec(*bad), 0)
        assert problem is not None and "cannot follow" in problem, bad
    # a torn record is not one
    assert parse_records(rec(10) + b"\0" * 7, 0) == ([(10, 0)], None)


# -- journals -----------------------------------------------------------------------------------------


def test_writer_sidecars_cover_every_byte(jdir: str) -> None:
    write_journal(jdir)
    segs = list_segments(jdir)
    assert len(segs) >= 3
    fully_checked(jdir)
    for seg in segs:
        with open(sum_path(jdir, seg.first_offset), "rb") as f:
            raw = f.read()
        assert raw[:16] == HEADER.pack(b"SEJSUM01", seg.first_offset) and (len(raw) - 16) % 16 == 0


def scan_all(dir: str, offset: int = 0, verify: bool = True) -> list[sej.Message]:
    with sej.Scanner(dir, offset, timeout=0, verify=verify) as s:
        return list(s)


def test_scanner_verify_reads_exactly_what_was_written(jdir: str) -> None:
    msgs = write_journal(jdir)
    got = scan_all(jdir)
    assert [(m.key, m.value) for m in got] == msgs
    for start in (1, 700, 1999, len(msgs) - 1, len(msgs)):
        assert [(m.key, m.value) for m in scan_all(jdir, start)] == msgs[start:]


def test_scanner_verify_follows_a_live_writer(jdir: str) -> None:
    """A tailing verified scanner gets every message; the writer records checksums right after each write."""
    n = 3000
    rng = random.Random(3)
    values = [rng.randbytes(rng.randrange(400)) for _ in range(n)]
    got: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        with sej.Scanner(jdir, 0, timeout=scaled(30), verify=True) as s:
            for m in s:
                got.append(m.value)
                if len(got) == n:
                    break
        done.set()

    with sej.Writer(jdir, segment_size=96 << 10) as w:
        w.append(values[0])
        w.flush()
        t = threading.Thread(target=read, daemon=True)
        t.start()
        for i, v in enumerate(values[1:], 1):
            w.append(v)
            if i % 37 == 0:
                w.flush()
        w.flush()
        assert done.wait(scaled(60)), f"the scanner got {len(got)} of {n}"
    t.join(scaled(10))
    assert got == values


def check_flips_caught_by_scanner(dir: str, msgs: list[tuple[bytes, bytes]], count: int, seed: int) -> dict[str, int]:
    caught: dict[str, int] = {}
    for f in flips(dir, count, seed):
        seg = f.segment
        got: list[sej.Message] = []
        with pytest.raises(sej.CorruptionError) as e, sej.Scanner(dir, seg.first_offset, 0, verify=True) as s:
            for m in s:
                got.append(m)
        # Nothing damaged was yielded: every message before the error is the one written.
        assert [(m.key, m.value) for m in got] == msgs[seg.first_offset : seg.first_offset + len(got)], f
        err = e.value
        assert err.path == seg.path, (f, err)
        if isinstance(err, sej.ChecksumError) and f.kind != "sums":
            assert err.start <= f.pos < err.end and err.offsets is not None, (f, err)
        count_kinds(caught, f)
    return caught


@pytest.mark.slow
def test_scanner_verify_catches_every_flipped_byte(tmp_path: Path) -> None:
    d = str(tmp_path / "journal")
    msgs = write_journal(d)
    caught = check_flips_caught_by_scanner(d, msgs, 1000, seed=11)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught
    assert scan_all(d) and [(m.key, m.value) for m in scan_all(d)] == msgs  # restored


@pytest.mark.slow
def test_scanner_verify_catches_every_flipped_byte_on_a_hub_root(tmp_path: Path) -> None:
    msgs = write_journal(str(tmp_path / "producer" / "ev"))
    d = copy_to_hub(tmp_path / "producer", tmp_path / "hub")
    fully_checked(d)
    caught = check_flips_caught_by_scanner(d, msgs, 1000, seed=12)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught


# -- recovery keeps checksums consistent ----------------------------------------------------------------


def last_sums(dir: str) -> tuple[sej.Segment, str]:
    seg = list_segments(dir)[-1]
    return seg, sum_path(dir, seg.first_offset)


def test_a_tail_cut_by_recovery_drops_its_checksums(jdir: str) -> None:
    msgs = write_journal(jdir, n=400)
    seg, spath = last_sums(jdir)
    size = os.path.getsize(seg.path)
    with open(seg.path, "ab") as f:
        f.write(b"\x00" * 40)  # a torn frame
    with open(spath, "ab") as f:  # checksums of the torn bytes, and a torn record
        f.write(
            Hasher(size, Path(seg.path).read_bytes()[size // BLOCK * BLOCK : size]).update(b"\x00" * 40) + b"\1" * 5
        )
    with pytest.warns(sej.CorruptionWarning):
        w = sej.Writer(jdir, segment_size=160 << 10)
    with w:
        assert w.recovered is not None and os.path.getsize(seg.path) == size
        recs, problem = parse_records(Path(spath).read_bytes()[16:], 0)
        assert problem is None and recs[-1].end == size and (os.path.getsize(spath) - 16) % 16 == 0
        w.append(b"after")
    fully_checked(jdir)
    assert [m.value for m in scan_all(jdir)] == [v for _, v in msgs] + [b"after"]


def test_bytes_written_before_a_crash_are_sealed_from_the_disk(jdir: str, caplog: pytest.LogCaptureFixture) -> None:
    """A writer killed between writing bytes and their checksums: the next one seals the gap."""
    write_journal(jdir, n=400)
    seg, spath = last_sums(jdir)
    with open(spath, "r+b") as f:
        f.truncate(os.path.getsize(spath) - 2 * RECORD.size)
    assert check_segment(seg.path, spath, seg.first_offset).checked < os.path.getsize(seg.path)
    with caplog.at_level(logging.INFO, logger="sej.checksum"), sej.Writer(jdir, segment_size=160 << 10) as w:
        w.append(b"more")
    assert "sealing bytes" in caplog.text
    fully_checked(jdir)


def test_an_open_block_that_disagrees_is_left_for_verify(jdir: str, caplog: pytest.LogCaptureFixture) -> None:
    """Damage in the open block found at startup: the writer goes on, the segment stays unchecked from there,
    and the mismatch stays visible (nothing rewrites it)."""
    write_journal(jdir, n=400)
    with sej.Writer(jdir, segment_size=160 << 10) as w:
        w.append(b"v" * 100)
    seg, spath = last_sums(jdir)
    size = os.path.getsize(seg.path)
    flip(seg.path, size - 10, 0)  # in the last message's value: the frame stays whole
    before = Path(spath).read_bytes()
    with caplog.at_level(logging.WARNING, logger="sej.checksum"), sej.Writer(jdir, segment_size=160 << 10) as w:
        assert w.recovered is None
        w.append(b"more")
    assert "disagree with their checksum" in caplog.text
    assert Path(spath).read_bytes() == before
    r = check_segment(seg.path, spath, seg.first_offset)
    assert len(r.errors) == 1 and r.errors[0].start <= size - 10 < r.errors[0].end == r.checked
    assert r.checked < r.size  # "more" was appended unchecked
    with pytest.raises(sej.ChecksumError):
        scan_all(jdir)


def test_go_journals_without_checksums_read_and_get_them_from_the_next_segment(jdir: str) -> None:
    msgs = write_journal(jdir, n=1200)
    segs = list_segments(jdir)
    for seg in segs:
        os.remove(sum_path(jdir, seg.first_offset))
    assert [(m.key, m.value) for m in scan_all(jdir)] == msgs
    for seg in segs:
        r = check_segment(seg.path, sum_path(jdir, seg.first_offset), seg.first_offset)
        assert not r.has_sums and r.checked == 0 and not r.errors
    with sej.Writer(jdir, segment_size=160 << 10) as w:
        for i in range(600):
            w.append(b"%0400d" % i)
    later = list_segments(jdir)[len(segs) :]
    assert later
    assert not os.path.exists(sum_path(jdir, segs[-1].first_offset))  # appended to, still unchecked
    for seg in later:
        r = check_segment(seg.path, sum_path(jdir, seg.first_offset), seg.first_offset)
        assert r.has_sums and r.checked == r.size and not r.errors
    assert len(scan_all(jdir)) == 1800


def test_invalid_or_unsafe_checksum_files_raise(jdir: str) -> None:
    write_journal(jdir, n=800)
    seg = list_segments(jdir)[1]
    spath = sum_path(jdir, seg.first_offset)
    shutil.copy(spath, spath + ".bak")
    with open(spath, "r+b") as f:
        f.write(b"SEJSUM02")
    with pytest.raises(sej.ChecksumError, match="magic"):
        scan_all(jdir)
    os.replace(spath + ".bak", spath)
    target = spath + ".real"
    os.rename(spath, target)
    os.symlink(target, spath)
    with pytest.raises(sej.UnsafeFileError):
        scan_all(jdir)
    os.remove(spath)
    os.mkfifo(spath)
    with pytest.raises(sej.UnsafeFileError):
        scan_all(jdir)


def test_scanner_verify_argument_is_checked(jdir: str) -> None:
    write_journal(jdir, n=10)
    with pytest.raises(sej.InvalidArgumentError, match="verify"):
        sej.Scanner(jdir, verify="yes")  # type: ignore[arg-type]


# -- long sidecars: a record per flush; the writer reads the end, a reader starts at its position --------------


def flushed_one_by_one(jdir: str, n: int, tag: bytes = b"m") -> None:
    with sej.Writer(jdir) as w:
        for i in range(n):
            w.append(tag + b"%d" % i)
            w.flush()  # a record each


def test_a_writer_reopens_a_long_sidecar_reading_only_its_end(jdir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """20,000 records (five times TAIL_RECORDS): reopening reads the header and the last TAIL_RECORDS + 1."""
    import sej.checksum as checksum

    flushed_one_by_one(jdir, 20_000)
    read: list[int] = []
    real = checksum.pread_full
    monkeypatch.setattr(checksum, "pread_full", lambda fd, n, pos: read.append(n) or real(fd, n, pos))
    with sej.Writer(jdir) as w:
        assert w.recovered is None
        w.append(b"after")
    assert read == [(checksum.TAIL_RECORDS + 1) * RECORD.size], read
    fully_checked(jdir)
    assert scan_all(jdir)[-1].value == b"after"


def test_recovery_that_cuts_many_records_drops_them_all_reading_back_from_the_end(jdir: str) -> None:
    """A tail cut far back (past several TAIL_RECORDS of records): every record past the new end is dropped, the
    checksums go on from there, and what was kept reads back checked."""
    flushed_one_by_one(jdir, 20_000)
    seg, spath = last_sums(jdir)
    size = os.path.getsize(seg.path)
    with open(seg.path, "r+b") as f:
        f.truncate(size // 3 + 5)  # mid-frame, about 13,000 records before the end
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir) as w:
        cut = os.path.getsize(seg.path)
        assert w.recovered is not None and cut <= size // 3 + 5
        recs, problem = parse_records(Path(spath).read_bytes()[HEADER.size :], 0)
        assert problem is None and recs[-1].end == cut and os.path.getsize(spath) == HEADER.size + 16 * len(recs)
        w.append(b"after")
    fully_checked(jdir)
    got = scan_all(jdir)
    assert got[-1].value == b"after" and [m.value for m in got[:-1]] == [b"m%d" % i for i in range(len(got) - 1)]


@pytest.mark.parametrize("records_from_end, unchecked", [(100, True), (19_950, False)])
def test_damage_in_a_long_sidecar_is_caught_at_startup_near_its_end_and_by_verify_further_back(
    jdir: str, caplog: pytest.LogCaptureFixture, records_from_end: int, unchecked: bool
) -> None:
    """The records the writer reads at startup are validated as before: a broken one leaves the segment unchecked
    (a warning). A broken record further back, under bytes already recorded, is not read at startup: the writer
    goes on recording, and `sej verify` (check_segment) still reports the damage."""
    flushed_one_by_one(jdir, 20_000)
    seg, spath = last_sums(jdir)
    damaged = (os.path.getsize(spath) - HEADER.size) // RECORD.size - records_from_end  # its number in the file
    flip(spath, os.path.getsize(spath) - records_from_end * RECORD.size, 7)  # it ends off the grid
    with caplog.at_level(logging.WARNING, logger="sej.checksum"), sej.Writer(jdir) as w:
        w.append(b"x")
    assert ("stays unchecked" in caplog.text) == unchecked, caplog.text
    if unchecked:
        assert f"checksum record {damaged} ends at byte" in caplog.text, caplog.text
    r = check_segment(seg.path, spath, seg.first_offset)
    assert r.errors, r  # the damaged record is reported either way
    last_end = RECORD.unpack(Path(spath).read_bytes()[-RECORD.size :])[0]
    assert (last_end == os.path.getsize(seg.path)) != unchecked  # "x" was recorded unless the segment stayed unchecked


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3 * BLOCK + 7), st.lists(st.integers(0, 3 * BLOCK + 7), max_size=40), st.data())
def test_read_check_from_any_position_never_passes_a_flipped_byte_whatever_the_records_damage(
    tmp_path_factory: pytest.TempPathFactory, n: int, cuts: list[int], draw: st.DataObject
) -> None:
    """A reader starts at the records after its position (SumReader.skip_to, a binary search): with records
    damaged anywhere (which may mislead the search), it still never reports a flipped byte as checked."""
    data = random.Random(n).randbytes(n)
    d = tmp_path_factory.mktemp("rcd")
    seg, sums = d / "seg", d / "sum"
    at = draw.draw(st.none() | st.integers(0, n - 1))
    bad = bytearray(data)
    if at is not None:
        bad[at] ^= 1 << draw.draw(st.integers(0, 7))
    seg.write_bytes(bad)
    records = bytearray(records_for(data, cuts))
    for _ in range(draw.draw(st.integers(0, 3))):
        if records:
            i = draw.draw(st.integers(0, len(records) - 1))
            records[i] = draw.draw(st.integers(0, 255))
    zeroed = draw.draw(st.integers(0, 3))  # a crash's zero-filled records at the end, in place of the last ones
    if zeroed and draw.draw(st.booleans()):
        records[-RECORD.size * zeroed :] = bytes(min(len(records), RECORD.size * zeroed))
    else:
        records += bytes(RECORD.size * zeroed)
    sums.write_bytes(HEADER.pack(b"SEJSUM01", 5) + bytes(records))
    start = draw.draw(st.integers(0, n))
    with ReadCheck(str(seg), str(sums), 5) as rc, open(seg, "rb") as f:
        want = start
        try:
            for _ in range(n + 2):
                want = min(n, want + draw.draw(st.integers(1, 2 * BLOCK)))
                got = rc.check(f.fileno(), n, start, want)
                assert at is None or got <= at or at < start - start % BLOCK, (got, at)
                if want == n or got < want:
                    break
        except ChecksumError:
            pass


def test_zeroed_records_at_the_end_of_a_sidecar_fail_a_reader_from_any_position(jdir: str) -> None:
    """A crash can leave zero-filled records at a sidecar's end: a reader starting inside the segment must not
    take them for records before its position (a binary search would land past them) and read on unchecked."""
    with sej.Writer(jdir, segment_size=200_000) as w:
        for i in range(3000):
            w.append(b"msg-%06d" % i + b"x" * 40)
            w.flush()
    seg, spath = list_segments(jdir)[0], sum_path(jdir, 0)
    last = list_segments(jdir)[1].first_offset - 1
    with open(spath, "ab") as f:
        f.write(bytes(16 * 256))
    data = Path(seg.path).read_bytes()
    flip(seg.path, data.find(b"msg-%06d" % (last - 3)) + 12, 0)
    for start in (0, last - 40, last - 3):
        with pytest.raises(ChecksumError):
            scan_all(jdir, start)


def test_a_writer_validates_the_record_it_keeps_when_recovery_cut_past_every_record_it_read(
    jdir: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every record of the sidecar's last TAIL_RECORDS ends past the recovered size: the one before them, kept as
    the last, is validated against the one before it too (two records swapped there: the segment stays unchecked,
    as a whole read found)."""
    import sej.checksum as checksum

    monkeypatch.setattr(checksum, "TAIL_RECORDS", 8)
    flushed_one_by_one(jdir, 200)
    seg, spath = last_sums(jdir)
    raw = bytearray(Path(spath).read_bytes())
    count = (len(raw) - HEADER.size) // RECORD.size
    lo = count - 8
    a = raw[HEADER.size + (lo - 2) * 16 : HEADER.size + (lo - 1) * 16]
    b = raw[HEADER.size + (lo - 1) * 16 : HEADER.size + lo * 16]
    raw[HEADER.size + (lo - 2) * 16 : HEADER.size + lo * 16] = b + a  # the record before them swapped with its own
    Path(spath).write_bytes(bytes(raw))
    os.truncate(seg.path, RECORD.unpack(b)[0])  # cut where the swapped record ended: a frame's end
    with caplog.at_level(logging.WARNING, logger="sej.checksum"), sej.Writer(jdir) as w:
        w.append(b"x")
    assert "stays unchecked" in caplog.text, caplog.text
    assert Path(spath).read_bytes() == bytes(raw)  # left for sej verify


def test_a_verified_scanner_that_saw_bytes_before_their_checksums_wakes_when_these_come(
    jdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer writes a segment's bytes, then their checksums (idx/). A scanner that read between the
    two must be woken by the checksums, not by the next write to jnl/, which may never come. Only a pause
    is inserted here: between the writer's two writes, until the scanner waits."""
    import sej.checksum
    import sej.scanner

    waiting = threading.Event()
    release = threading.Event()
    real_wait, real_add = sej.scanner._wait, sej.checksum.SumFile.add

    def wait(event: threading.Event, deadline: float | None) -> None:
        waiting.set()
        real_wait(event, deadline)

    def add(self: sej.checksum.SumFile, data: bytes) -> None:
        if threading.current_thread() is writer_thread:
            assert release.wait(scaled(30))
        real_add(self, data)

    with sej.Writer(jdir) as w:
        w.append(b"first")
        w.flush()
        got: list[bytes] = []
        done = threading.Event()

        def read() -> None:
            with sej.Scanner(jdir, 0, timeout=None, verify=True) as s:
                for m in s:
                    got.append(m.value)
                    if len(got) == 2:
                        break
            done.set()

        monkeypatch.setattr(sej.scanner, "_wait", wait)
        monkeypatch.setattr(sej.checksum.SumFile, "add", add)
        writer_thread = threading.Thread(target=lambda: (w.append(b"second"), w.flush()))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_until(lambda: got == [b"first"] and waiting.is_set(), scaled(30), "the scanner to wait after the first")
        waiting.clear()
        writer_thread.start()  # writes the segment's bytes, then pauses before their checksums
        assert waiting.wait(scaled(30)), "the scanner saw the unchecked bytes and waits"
        release.set()  # the checksums: no more bytes follow in jnl/
        writer_thread.join(scaled(30))
        assert done.wait(scaled(30)), f"the scanner got {got}"
    assert got == [b"first", b"second"]
