"""Byte-exact compatibility with h12.io/sej, checked against hand-written vectors.

Every frame below is written out field by field from the format (spec and the Go
source, see docs/format.md), as literal hex; none is produced by sej's encoder.

    offset u64 | timestamp i64 | type u8 | key_size i8 | key | value_size i32 | value | size i32

all big-endian, `size` = the whole frame including itself = 26 + len(key) + len(value).

The journal at the bottom (`GO_JOURNAL`) is laid out as the Go writer lays it out
with SegmentSize 64: after each append, when the current file has reached >= 64
bytes, the file is closed and the next one, named %016x of the next offset, is
created at once (so a full journal ends with an empty segment).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import pytest

import sej

Fields = tuple[int, int | None, int, bytes, bytes]

# -- standalone frame vectors ---------------------------------------------------

# 127 key bytes 0x00..0x7e, written out.
KEY127_HEX = (
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f"
    "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e"
)

# (1) 8-byte key, short value, type 3, a real timestamp (2023-11-14T22:13:20.123456789Z).
V1_HEX = (
    "0000000000000007"  # offset 7
    "17979cfe3d85cd15"  # timestamp 1700000000123456789
    "03"  # type 3
    "08"  # key_size 8
    "757365722d303432"  # key "user-042"
    "00000005"  # value_size 5
    "68656c6c6f"  # value "hello"
    "00000027"  # size 39 = 26 + 8 + 5
)
V1 = (7, 1700000000123456789, 3, b"user-042", b"hello")

# (2) empty key.
V2_HEX = (
    "0000000000000008"  # offset 8
    "17979cfe3d85cd16"  # timestamp 1700000000123456790
    "00"  # type 0
    "00"  # key_size 0, no key bytes
    "00000006"  # value_size 6
    "776f726c6421"  # value "world!"
    "00000020"  # size 32 = 26 + 0 + 6
)
V2 = (8, 1700000000123456790, 0, b"", b"world!")

# (3) 127-byte key (the maximum an int8 key_size holds), empty value.
V3_HEX = (
    "0000000000000009"  # offset 9
    "17979cfe362a0000"  # timestamp 1700000000000000000
    "01"  # type 1
    "7f"  # key_size 127
    f"{KEY127_HEX}"  # key 0x00..0x7e
    "00000000"  # value_size 0, no value bytes
    "00000099"  # size 153 = 26 + 127 + 0
)
V3 = (9, 1700000000000000000, 1, bytes(range(127)), b"")

# (4) the no-timestamp sentinel: int64 minimum, -2**63, decoded as None.
V4_HEX = (
    "000000000000000a"  # offset 10
    "8000000000000000"  # timestamp -2**63 = none
    "02"  # type 2
    "01"  # key_size 1
    "6b"  # key "k"
    "00000001"  # value_size 1
    "76"  # value "v"
    "0000001c"  # size 28
)
V4 = (10, None, 2, b"k", b"v")

# (5) offset near 2**64-1, type 255, a negative timestamp (1 ns before the epoch).
V5_HEX = (
    "fffffffffffffffe"  # offset 2**64-2
    "ffffffffffffffff"  # timestamp -1 (signed: not the sentinel, not huge)
    "ff"  # type 255 (unsigned)
    "01"  # key_size 1
    "ff"  # key b"\xff"
    "00000002"  # value_size 2
    "00ff"  # value b"\x00\xff"
    "0000001d"  # size 29
)
V5 = (2**64 - 2, -1, 255, b"\xff", b"\x00\xff")

# (6) the largest offset, the smallest frame: empty key and value, timestamp 0 (the epoch), type 0x80.
V6_HEX = (
    "ffffffffffffffff"  # offset 2**64-1
    "0000000000000000"  # timestamp 0: the epoch itself, a real time, not "none"
    "80"  # type 128
    "00"  # key_size 0
    "00000000"  # value_size 0
    "0000001a"  # size 26
)
V6 = (2**64 - 1, 0, 128, b"", b"")

VECTORS = [
    pytest.param(V1_HEX, V1, id="key8-type3"),
    pytest.param(V2_HEX, V2, id="empty-key"),
    pytest.param(V3_HEX, V3, id="key127"),
    pytest.param(V4_HEX, V4, id="no-timestamp"),
    pytest.param(V5_HEX, V5, id="offset-2**64-2-type255"),
    pytest.param(V6_HEX, V6, id="offset-2**64-1-minimal"),
]


@pytest.mark.parametrize("hexstr, fields", VECTORS)
def test_encode_matches_vector(hexstr: str, fields: Fields) -> None:
    expected = bytes.fromhex(hexstr)
    assert sej.encode(*fields) == expected
    assert sej.encode_message(sej.Message(*fields)) == expected


@pytest.mark.parametrize("hexstr, fields", VECTORS)
def test_decode_matches_vector(hexstr: str, fields: Fields) -> None:
    frame = bytes.fromhex(hexstr)
    msg, end = sej.decode(frame)
    assert msg == sej.Message(*fields)
    assert end == len(frame)
    assert isinstance(msg.key, bytes) and isinstance(msg.value, bytes)
    # The frame ends with its own length, which is what reading backward relies on.
    assert int.from_bytes(frame[-4:], "big") == len(frame) == 26 + len(fields[3]) + len(fields[4])


def test_sentinel_constant_and_explicit_sentinel_encode_the_same() -> None:
    assert sej.NO_TIMESTAMP == -(2**63)
    assert sej.encode(10, sej.NO_TIMESTAMP, 2, b"k", b"v") == bytes.fromhex(V4_HEX)


def test_decode_at_positions_in_a_concatenation() -> None:
    hexes = [V1_HEX, V2_HEX, V3_HEX, V4_HEX, V5_HEX, V6_HEX]
    buf = bytes.fromhex("".join(hexes))
    pos = 0
    got = []
    while pos < len(buf):
        msg, pos = sej.decode(buf, pos)
        got.append(tuple(msg))
    assert got == [V1, V2, V3, V4, V5, V6]
    assert pos == len(buf)
    # `expect` checks the offset of the frame.
    assert sej.decode(buf, 0, expect=7)[0].offset == 7
    with pytest.raises(sej.FrameError):
        sej.decode(buf, 0, expect=8)


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"key": b"k" * 128}, id="key-128-bytes"),
        pytest.param({"type": 256}, id="type-256"),
        pytest.param({"type": -1}, id="type-negative"),
        pytest.param({"offset": -1}, id="offset-negative"),
        pytest.param({"offset": 2**64}, id="offset-2**64"),
        pytest.param({"timestamp": 2**63}, id="timestamp-over-int64"),
        pytest.param({"timestamp": -(2**63) - 1}, id="timestamp-under-int64"),
        pytest.param({"timestamp": 1.5}, id="timestamp-float"),
        pytest.param({"key": "text"}, id="key-str"),
        pytest.param({"key": 5}, id="key-int"),
        pytest.param({"value": "text"}, id="value-str"),
        pytest.param({"value": None}, id="value-none"),
        pytest.param({"value": [1, 2]}, id="value-list"),
    ],
)
def test_encode_rejects_bad_fields(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"offset": 1, "timestamp": 2, "type": 3, "key": b"k", "value": b"v"}
    fields.update(kwargs)
    with pytest.raises(sej.InvalidArgumentError):
        sej.encode(**fields)


def test_encode_accepts_the_limits() -> None:
    assert len(sej.encode(2**64 - 1, 2**63 - 1, 255, b"k" * 127, b"")) == 26 + 127
    assert len(sej.encode(0, -(2**63) + 1, 0, b"", b"")) == 26


@pytest.mark.parametrize("hexstr", [V1_HEX, V3_HEX, V5_HEX])
def test_every_truncation_is_a_frame_error(hexstr: str) -> None:
    frame = bytes.fromhex(hexstr)
    for n in range(len(frame)):
        with pytest.raises(sej.FrameError):
            sej.decode(frame[:n])


def _patched(hexstr: str, at: int, new: str) -> bytes:
    frame = bytearray(bytes.fromhex(hexstr))
    patch = bytes.fromhex(new)
    frame[at : at + len(patch)] = patch
    return bytes(frame)


@pytest.mark.parametrize(
    "frame",
    [
        # key_size is a signed int8: 0x80 is -128, never 128.
        pytest.param(_patched(V1_HEX, 17, "80"), id="key-size-0x80"),
        pytest.param(_patched(V1_HEX, 17, "ff"), id="key-size-minus-1"),
        # value_size is a signed int32.
        pytest.param(_patched(V1_HEX, 26, "ffffffff"), id="value-size-minus-1"),
        pytest.param(_patched(V1_HEX, 26, "80000000"), id="value-size-int32-min"),
        # size must equal the frame length exactly.
        pytest.param(_patched(V1_HEX, 35, "00000026"), id="size-one-short"),
        pytest.param(_patched(V1_HEX, 35, "00000028"), id="size-one-long"),
        pytest.param(_patched(V1_HEX, 35, "ffffffd9"), id="size-negative"),
        pytest.param(_patched(V1_HEX, 35, "00000000"), id="size-zero"),
        # A value_size that points past the real end makes `size` land on other bytes.
        pytest.param(_patched(V1_HEX, 26, "00000004"), id="value-size-shorter"),
    ],
)
def test_corrupt_frames_are_frame_errors(frame: bytes) -> None:
    with pytest.raises(sej.FrameError):
        sej.decode(frame)
    # Followed by more data, too: the error must not depend on the end of the buffer.
    with pytest.raises(sej.FrameError):
        sej.decode(frame + bytes(64))


def test_empty_and_short_buffers_are_frame_errors() -> None:
    for buf in (b"", b"\x00", bytes(25), bytearray(17), memoryview(bytes(18))):
        with pytest.raises(sej.FrameError):
            sej.decode(buf)


@pytest.mark.parametrize("buf", ["x" * 40, [0] * 40, None], ids=["str", "list", "none"])
def test_decode_rejects_non_bytes_input(buf: object) -> None:
    with pytest.raises(sej.InvalidArgumentError):
        sej.decode(buf)  # type: ignore[arg-type]


def test_decode_rejects_negative_position() -> None:
    with pytest.raises((sej.InvalidArgumentError, sej.FrameError)):
        sej.decode(bytes.fromhex(V1_HEX) * 2, -1)


def test_decode_position_past_the_end_is_an_error() -> None:
    with pytest.raises((sej.InvalidArgumentError, sej.FrameError)):
        sej.decode(bytes.fromhex(V1_HEX), 100)


# -- a journal directory as the Go writer leaves it ------------------------------------

SEGMENT_SIZE = 64

# Offset 0: 32 bytes.
J0_HEX = (
    "0000000000000000"  # offset 0
    "17c3795293954b87"  # timestamp 1712345678901234567
    "01"  # type 1
    "01"  # key_size 1
    "61"  # key "a"
    "00000005"  # value_size 5
    "6669727374"  # value "first"
    "00000020"  # size 32
)
# Offset 1: 32 bytes; the file is now 64 >= 64 bytes, so the writer moves on to ...02.jnl.
J1_HEX = (
    "0000000000000001"  # offset 1
    "17c3795293954b88"  # timestamp 1712345678901234568
    "02"  # type 2
    "00"  # key_size 0
    "00000006"  # value_size 6
    "7365636f6e64"  # value "second"
    "00000020"  # size 32
)
# Offset 2: 158 bytes, alone in ...02.jnl (over the segment size at once).
J2_HEX = (
    "0000000000000002"  # offset 2
    "17c3795293954b89"  # timestamp 1712345678901234569
    "03"  # type 3
    "7f"  # key_size 127
    f"{KEY127_HEX}"  # key 0x00..0x7e
    "00000005"  # value_size 5
    "7468697264"  # value "third"
    "0000009e"  # size 158 = 26 + 127 + 5
)
# Offset 3: no timestamp.
J3_HEX = (
    "0000000000000003"  # offset 3
    "8000000000000000"  # timestamp none
    "00"  # type 0
    "00"  # key_size 0
    "00000006"  # value_size 6
    "666f75727468"  # value "fourth"
    "00000020"  # size 32
)
# Offset 4: ...03.jnl reaches 64 bytes, so ...05.jnl is created, empty.
J4_HEX = (
    "0000000000000004"  # offset 4
    "17c3795293954b8b"  # timestamp 1712345678901234571
    "ff"  # type 255
    "01"  # key_size 1
    "6b"  # key "k"
    "00000005"  # value_size 5
    "6669667468"  # value "fifth"
    "00000020"  # size 32
)
# Offset 5: what appending one more message adds to ...05.jnl.
J5_HEX = (
    "0000000000000005"  # offset 5
    "17c3795293954b8c"  # timestamp 1712345678901234572
    "04"  # type 4
    "00"  # key_size 0
    "00000005"  # value_size 5
    "7369787468"  # value "sixth"
    "0000001f"  # size 31 = 26 + 0 + 5
)

# (offset, timestamp, type, key, value) of J0..J5.
MESSAGES = [
    (0, 1712345678901234567, 1, b"a", b"first"),
    (1, 1712345678901234568, 2, b"", b"second"),
    (2, 1712345678901234569, 3, bytes(range(127)), b"third"),
    (3, None, 0, b"", b"fourth"),
    (4, 1712345678901234571, 255, b"k", b"fifth"),
    (5, 1712345678901234572, 4, b"", b"sixth"),
]

# The worked example of docs/format.md: the first segment, two messages.
SEGMENT_0 = bytes.fromhex(J0_HEX + J1_HEX)

GO_JOURNAL = {
    "0000000000000000.jnl": SEGMENT_0,
    "0000000000000002.jnl": bytes.fromhex(J2_HEX),
    "0000000000000003.jnl": bytes.fromhex(J3_HEX + J4_HEX),
    "0000000000000005.jnl": b"",
}


def msgs(*offsets: int) -> list[sej.Message]:
    return [sej.Message(*MESSAGES[i]) for i in offsets]


def build_go_journal(root: Path) -> str:
    jnl = root / "jnl"
    jnl.mkdir(parents=True)
    for name, data in GO_JOURNAL.items():
        (jnl / name).write_bytes(data)
    return str(root)


def jnl_files(d: str) -> dict[str, bytes]:
    jnl = Path(d) / "jnl"
    return {p.name: p.read_bytes() for p in sorted(jnl.iterdir())}


def scan(d: str, offset: int | Literal["first", "last"]) -> list[sej.Message]:
    with sej.Scanner(d, offset, timeout=0) as s:
        got = list(s)
        assert s.offset == 5
    return got


def test_journal_vectors_decode_to_the_messages() -> None:
    for i, h in enumerate([J0_HEX, J1_HEX, J2_HEX, J3_HEX, J4_HEX, J5_HEX]):
        frame = bytes.fromhex(h)
        assert sej.decode(frame, expect=i) == (sej.Message(*MESSAGES[i]), len(frame))
        assert sej.encode(*MESSAGES[i]) == frame
    assert len(SEGMENT_0) == SEGMENT_SIZE


def test_scanner_reads_the_go_journal(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    assert scan(d, 0) == msgs(0, 1, 2, 3, 4)
    assert scan(d, "first") == msgs(0, 1, 2, 3, 4)


@pytest.mark.parametrize("start", [1, 2, 3, 4])
def test_scanner_starts_inside_the_go_journal(tmp_path: Path, start: int) -> None:
    d = build_go_journal(tmp_path / "j")
    assert scan(d, start) == msgs(*range(start, 5))


def test_scanner_at_the_end_of_the_go_journal(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    assert scan(d, 5) == []
    assert scan(d, "last") == []


def test_offsets_of_the_go_journal(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    assert sej.first_offset(d) == 0
    assert sej.next_offset(d) == 5
    assert [s.first_offset for s in sej.list_segments(d)] == [0, 2, 3, 5]


def test_last_messages_read_backward_across_segments(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    assert sej.last_messages(d, 0) == []
    assert sej.last_messages(d, 1) == msgs(4)
    assert sej.last_messages(d, 2) == msgs(3, 4)
    assert sej.last_messages(d, 3) == msgs(2, 3, 4)
    assert sej.last_messages(d, 4) == msgs(1, 2, 3, 4)
    assert sej.last_messages(d, 100) == msgs(0, 1, 2, 3, 4)


def test_go_journal_after_cleaning_old_segments(tmp_path: Path) -> None:
    """The Go `sej clean` command deletes the oldest segments: the journal then starts later."""
    d = build_go_journal(tmp_path / "j")
    os.remove(os.path.join(d, "jnl", "0000000000000000.jnl"))
    assert sej.first_offset(d) == 2
    assert sej.next_offset(d) == 5
    with sej.Scanner(d, "first", timeout=0) as s:
        assert list(s) == msgs(2, 3, 4)
    assert sej.last_messages(d, 100) == msgs(2, 3, 4)
    with pytest.raises(sej.OffsetOutOfRangeError):
        sej.Scanner(d, 1, timeout=0)


def write_messages(w: sej.Writer, indices: range) -> None:
    for i in indices:
        off, ts, typ, key, value = MESSAGES[i]
        got = w.append(value, key=key, type=typ, timestamp=sej.NO_TIMESTAMP if ts is None else ts)
        assert got == off


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="buffered"),
        pytest.param({"buffer_size": 0}, id="buffered-unbuffered"),
        pytest.param({"buffer_size": 40}, id="buffered-small-buffer"),
        pytest.param({"durability": "flush"}, id="flush"),
        pytest.param({"durability": "sync"}, id="sync"),
    ],
)
def test_writer_produces_the_go_segments(tmp_path: Path, options: dict[str, Any]) -> None:
    d = str(tmp_path / "py")
    with sej.Writer(d, segment_size=SEGMENT_SIZE, **options) as w:
        write_messages(w, range(5))
        assert w.next_offset == 5
    assert jnl_files(d) == GO_JOURNAL
    assert os.path.exists(os.path.join(d, "jnl.lck"))


def test_checksum_file_of_segment_0(tmp_path: Path) -> None:
    """The checksum file beside SEGMENT_0 is the one docs/format.md dumps, byte for byte."""
    import xxhash

    doc = (Path(__file__).resolve().parent.parent / "docs" / "format.md").read_text()
    dump = doc.split("<!-- checksum-example-begin -->")[1].split("```text")[1].split("```")[0]
    documented = bytes.fromhex("".join(line.split("|")[0].split(":")[1] for line in dump.strip().splitlines()))
    header = b"SEJSUM01" + bytes(8)
    whole = header + (64).to_bytes(8, "big") + xxhash.xxh3_64_digest(SEGMENT_0)
    assert documented == whole
    for durability, expected in [
        ("buffered", whole),
        ("flush", header + (32).to_bytes(8, "big") + xxhash.xxh3_64_digest(SEGMENT_0[:32])
         + (64).to_bytes(8, "big") + xxhash.xxh3_64_digest(SEGMENT_0)),
    ]:  # fmt: skip
        d = str(tmp_path / durability)
        with sej.Writer(d, segment_size=SEGMENT_SIZE, durability=durability) as w:
            write_messages(w, range(2))
        with open(os.path.join(d, "idx", "0000000000000000.sum"), "rb") as f:
            assert f.read() == expected, durability


def test_writer_creates_the_next_segment_at_rollover_not_at_next_append(tmp_path: Path) -> None:
    d = str(tmp_path / "py")
    with sej.Writer(d, segment_size=SEGMENT_SIZE, durability="flush") as w:
        write_messages(w, range(2))
        # Like Go: the append that fills the segment also creates the next file.
        assert jnl_files(d) == {"0000000000000000.jnl": SEGMENT_0, "0000000000000002.jnl": b""}


def test_new_writer_creates_segment_zero(tmp_path: Path) -> None:
    d = str(tmp_path / "py")
    sej.Writer(d, segment_size=SEGMENT_SIZE).close()
    assert jnl_files(d) == {"0000000000000000.jnl": b""}


def test_writer_continues_the_go_journal(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    with sej.Writer(d, segment_size=SEGMENT_SIZE) as w:
        assert w.recovered is None
        assert w.next_offset == 5
        write_messages(w, range(5, 6))
    expected = dict(GO_JOURNAL, **{"0000000000000005.jnl": bytes.fromhex(J5_HEX)})
    assert jnl_files(d) == expected
    assert scan_all(d) == msgs(0, 1, 2, 3, 4, 5)


def scan_all(d: str) -> list[sej.Message]:
    with sej.Scanner(d, "first", timeout=0) as s:
        return list(s)


def test_writer_reopened_in_pieces_produces_the_go_segments(tmp_path: Path) -> None:
    d = str(tmp_path / "py")
    for i in range(5):
        with sej.Writer(d, segment_size=SEGMENT_SIZE) as w:
            write_messages(w, range(i, i + 1))
    assert jnl_files(d) == GO_JOURNAL


def test_reopen_with_smaller_segment_size_appends_to_last_segment_like_go(tmp_path: Path) -> None:
    d = str(tmp_path / "py")
    with sej.Writer(d, segment_size=1000) as w:
        write_messages(w, range(2))  # 64 bytes in ...00.jnl
    with sej.Writer(d, segment_size=40) as w:
        write_messages(w, range(2, 3))
    # Go: offset 2 goes into ...00.jnl (now 222 bytes >= 40), then ...03.jnl is created.
    assert jnl_files(d) == {
        "0000000000000000.jnl": SEGMENT_0 + bytes.fromhex(J2_HEX),
        "0000000000000003.jnl": b"",
    }


# -- reader offsets ------------------------------------------------------------------------


def test_offset_file_is_8_bytes_big_endian(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    with sej.Offset(d, "reader1") as o:
        assert os.path.exists(os.path.join(d, "ofs", "reader1.lck"))
        o.commit(0x0102030405060708)
    assert Path(d, "ofs", "reader1.ofs").read_bytes() == bytes.fromhex("0102030405060708")


def test_offset_reads_a_go_offset_file(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    (Path(d) / "ofs").mkdir()
    (Path(d) / "ofs" / "reader2.ofs").write_bytes(bytes.fromhex("0000000000000003"))
    with sej.Offset(d, "reader2") as o:
        assert o.value == 3
    assert sej.list_readers(d) == ["reader2"]


def test_offset_reads_an_empty_go_offset_file_as_uncommitted(tmp_path: Path) -> None:
    d = build_go_journal(tmp_path / "j")
    (Path(d) / "ofs").mkdir()
    (Path(d) / "ofs" / "reader3.ofs").write_bytes(b"")
    with sej.Offset(d, "reader3") as o:
        assert o.value == 0
    with sej.Offset(d, "reader3", default="last") as o:
        assert o.value == 5


# -- docs/format.md ----------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "format.md"


def test_docs_worked_example_is_segment_0() -> None:
    """The annotated hex dump in docs/format.md is the bytes of SEGMENT_0, byte for byte."""
    text = DOC.read_text()
    block = re.search(r"<!-- worked-example-begin -->\s*```text\n(.*?)```", text, re.S)
    assert block, "docs/format.md has no worked example block"
    data = bytearray()
    for line in block.group(1).splitlines():
        m = re.match(r"\s*([0-9a-f]{4}):((?:\s[0-9a-f]{2})+)\s*(\|.*)?$", line)
        if m:
            assert int(m.group(1), 16) == len(data), f"position column is wrong at {line!r}"
            data += bytes.fromhex(m.group(2))
    assert bytes(data) == SEGMENT_0
