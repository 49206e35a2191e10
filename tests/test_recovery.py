"""Startup recovery: torn, zero-filled and garbage tails are cut aside, never lost."""

from __future__ import annotations

import glob
import os
import struct
import warnings
from pathlib import Path

import pytest

import sej
from sej.message import encode


def build(jdir: str, n: int = 50, segment_size: int = 1 << 30) -> list[str]:
    with sej.Writer(jdir, segment_size=segment_size) as w:
        for i in range(n):
            w.append(b"value-%03d" % i, key=b"key", timestamp=1_000 + i)
    return [s.path for s in sej.list_segments(jdir)]


def values(jdir: str) -> list[bytes]:
    with sej.Scanner(jdir, "first", timeout=0) as s:
        return [m.value for m in s]


def quarantined(seg: str) -> list[str]:
    return sorted(glob.glob(seg + ".cut-*"))


def damage_cases() -> dict[str, bytes]:
    good_next = encode(50, 1050, 0, b"key", b"value-050")
    return {
        "torn frame": good_next[:-7],
        "torn header": good_next[:10],
        "zero-filled": b"\0" * 4096,
        "garbage": bytes(range(256)) * 3,
        "offset out of sequence": encode(77, 1, 0, b"", b"x"),
        "size field disagrees": good_next[:-4] + struct.pack(">i", 999),
        "negative key size": struct.pack(">QqBb", 50, 0, 0, -5) + b"\0" * 20,
    }


@pytest.mark.parametrize("case", list(damage_cases()))
def test_damaged_tail_is_cut_kept_and_writer_continues(jdir: str, case: str) -> None:
    (seg,) = build(jdir)
    good = open(seg, "rb").read()
    bad = damage_cases()[case]
    with open(seg, "ab") as f:
        f.write(bad)
    with pytest.warns(sej.CorruptionWarning) as rec:
        w = sej.Writer(jdir)
    with w:
        assert w.next_offset == 50
        cut = w.recovered
        assert cut is not None and cut.position == len(good) and cut.length == len(bad)
        assert cut.path == seg
        assert str(len(good)) in str(rec[0].message)
        w.append(b"value-050", key=b"key", timestamp=1_050)
    assert open(seg, "rb").read()[: len(good)] == good
    (q,) = quarantined(seg)
    assert q == cut.quarantine
    assert open(q, "rb").read() == bad, "the cut bytes are kept exactly"
    assert values(jdir) == [b"value-%03d" % i for i in range(51)]


@pytest.mark.parametrize("case", ["torn frame", "garbage"])
def test_strict_mode_refuses_and_changes_nothing(jdir: str, case: str) -> None:
    (seg,) = build(jdir)
    with open(seg, "ab") as f:
        f.write(damage_cases()[case])
    before = open(seg, "rb").read()
    with pytest.raises(sej.CorruptionError) as e:
        sej.Writer(jdir, strict=True)
    assert e.value.path == seg and e.value.length > 0
    assert open(seg, "rb").read() == before
    assert quarantined(seg) == []
    # The lock was released: a non-strict writer can now repair.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sej.CorruptionWarning)
        with sej.Writer(jdir) as w:
            assert w.next_offset == 50


def test_cut_in_the_middle_of_the_last_segment_drops_stale_index_entries(jdir: str) -> None:
    (seg,) = build(jdir, n=2000)  # about 44 KiB: several index entries
    size = os.path.getsize(seg)
    cut_at = size // 2 + 3  # mid-frame
    with open(seg, "r+b") as f:
        f.seek(cut_at)
        f.write(b"\xff" * (size - cut_at))  # same size, garbage from the middle on
    damaged = open(seg, "rb").read()
    with pytest.warns(sej.CorruptionWarning):
        w = sej.Writer(jdir)
    with w:
        n = w.next_offset
        cut = w.recovered
        assert cut is not None and 0 < n < 2000
        assert cut.position <= cut_at < cut.position + 40  # the start of the torn frame
        assert open(cut.quarantine, "rb").read() == damaged[cut.position :]
        for i in range(n, 2000):
            w.append(b"value-%03d" % i, key=b"key", timestamp=1_000 + i)
    assert open(seg, "rb").read()[: cut.position] == damaged[: cut.position]
    assert values(jdir) == [b"value-%03d" % i for i in range(2000)]
    # Seeks through the repaired index land exactly.
    for off in (0, n - 1, n, 1999):
        with sej.Scanner(jdir, off, timeout=0) as s:
            assert next(s).offset == off


def test_only_the_last_segment_is_recovered_and_earlier_ones_stay(jdir: str) -> None:
    segs = build(jdir, n=60, segment_size=500)
    assert len(segs) > 2
    last = segs[-1]
    with open(last, "ab") as f:
        f.write(b"\0" * 100)
    with pytest.warns(sej.CorruptionWarning):
        sej.Writer(jdir, segment_size=500).close()
    assert [s.path for s in sej.list_segments(jdir)] == segs
    assert values(jdir) == [b"value-%03d" % i for i in range(60)]


def test_empty_last_segment_after_a_crash_during_rollover(jdir: str) -> None:
    segs = build(jdir, n=20, segment_size=300)
    with open(os.path.join(jdir, "jnl", "%016x.jnl" % 20), "wb"):
        pass  # what a crash right after creating the next segment leaves
    with sej.Writer(jdir, segment_size=300) as w:
        assert w.recovered is None
        assert w.append(b"x") == 20
    assert len(sej.list_segments(jdir)) >= len(segs)


def test_segment_whose_first_frame_is_bad_is_cut_whole(jdir: str) -> None:
    build(jdir, n=10, segment_size=200)
    last = sej.list_segments(jdir)[-1]
    with open(last.path, "r+b") as f:
        f.write(struct.pack(">Q", 12345))  # offset of its first frame no longer matches its name
        f.truncate(30)  # and no whole frame follows it
    whole = open(last.path, "rb").read()
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir, segment_size=200) as w:
        assert w.next_offset == last.first_offset
    (q,) = quarantined(last.path)
    assert open(q, "rb").read() == whole


def test_damaged_frame_followed_by_whole_frames_is_kept_not_cut(jdir: str) -> None:
    """Issue 10: damage in place is not a torn tail: the whole, acknowledged frames after it stay."""
    build(jdir, n=10, segment_size=200)
    last = sej.list_segments(jdir)[-1]
    with open(last.path, "r+b") as f:
        f.write(struct.pack(">Q", 12345))  # offset of its first frame no longer matches its name
    whole = open(last.path, "rb").read()
    assert sej.next_offset(jdir) == 10
    with pytest.warns(sej.CorruptionWarning, match="damaged frame"), sej.Writer(jdir, segment_size=200) as w:
        assert w.recovered is None
        assert w.next_offset == 10
        assert w.append(b"after") == 10
    assert open(last.path, "rb").read().startswith(whole)
    assert quarantined(last.path) == []
    with pytest.raises(sej.CorruptionError, match="found 12345, expected 6"), sej.Scanner(jdir, last.first_offset) as s:
        list(s)


def test_next_offset_helper_ignores_a_torn_tail_without_changing_it(jdir: str) -> None:
    (seg,) = build(jdir)
    with open(seg, "ab") as f:
        f.write(b"\1\2\3")
    size = os.path.getsize(seg)
    assert sej.next_offset(jdir) == 50
    assert [m.offset for m in sej.last_messages(jdir, 3)] == [47, 48, 49]
    assert os.path.getsize(seg) == size


def _straddling_value_sizes() -> list[int]:
    """Value sizes whose frames put some header across the walker's chunk boundary (sej.segment.CHUNK),
    one for each distinct place in the header (or the value size after it) that a size under 4000 cuts."""
    from sej.frames import HEADER_SIZE, OVERHEAD
    from sej.segment import CHUNK

    found: dict[int, int] = {}
    for v in range(40, 4000):
        cut = CHUNK % (v + OVERHEAD)  # where the chunk boundary falls in the frame that crosses it
        if 0 < cut < HEADER_SIZE + 4 and cut not in found:  # inside the header or the value size after it
            found[cut] = v
    return sorted(found.values())


@pytest.mark.parametrize("value_size", _straddling_value_sizes())
def test_a_writer_reopens_a_journal_whose_index_is_gone_when_a_header_straddles_a_chunk(
    tmp_path: Path, value_size: int
) -> None:
    """The index is never fsynced: after a power loss the writer walks the segment from its start, a chunk at
    a time (it failed with AssertionError when a chunk ended inside a frame's header)."""
    from sej.frames import OVERHEAD
    from sej.segment import CHUNK

    d = tmp_path / "j"
    n = CHUNK // (value_size + OVERHEAD) + 3
    with sej.Writer(d) as w:
        w.append_many([bytes([i % 251]) * value_size for i in range(n)])
    for f in (d / "idx").glob("*.idx"):
        f.unlink()
    with sej.Writer(d) as w:
        assert (w.next_offset, w.recovered) == (n, None)
    with sej.Scanner(d, 0, timeout=0) as s:
        assert [len(m.value) for m in s] == [value_size] * n
