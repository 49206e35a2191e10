"""The one decoder for any shape: the fast loop over bytes (`frames._decode_run`) against the general
frame-by-frame path (`frames._decode_general`, what a bytearray or a cut buffer takes), on random shapes and
hostile bytes; and the chunked segment reader (`segment.Chunk`) under small batches."""

from __future__ import annotations

import os
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.frames import NO_TIMESTAMP, Message, ShardMessage, decode_batch
from sej.segment import Chunk, read_messages

HEAD = struct.Struct(">QqBb")
I32 = struct.Struct(">i")


def frame(off: int, ts: int, typ: int, key: bytes, value: bytes) -> bytes:
    return HEAD.pack(off, ts, typ, len(key)) + key + I32.pack(len(value)) + value + I32.pack(26 + len(key) + len(value))


messages = st.lists(
    st.tuples(
        st.one_of(st.just(NO_TIMESTAMP), st.integers(-(2**63), 2**63 - 1)),
        st.integers(0, 255),
        st.binary(max_size=127),
        st.one_of(st.binary(max_size=64), st.integers(0, 5000).map(lambda n: os.urandom(n))),
    ),
    max_size=12,
)
mutations = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4)


def both(buf: bytes, pos: int, expect: int, limit: int, journal: str | None) -> tuple[object, object]:
    """decode_batch on bytes (the fast loop) and on the same bytes as a bytearray (the general path)."""
    fast = decode_batch(buf, pos, len(buf), expect, limit, journal)
    general = decode_batch(bytearray(buf), pos, len(buf), expect, limit, journal)
    return fast, general


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    messages,
    mutations,
    st.integers(0, 64),
    st.integers(1, 20),
    st.one_of(st.none(), st.text(max_size=5)),
    st.integers(-2, 2),
)
def test_fast_loop_equals_general_path_on_any_shape_and_hostile_bytes(
    first: int,
    msgs: list,
    muts: list,
    cut: int,
    limit: int,
    journal: str | None,
    skew: int,  # type: ignore[type-arg]
) -> None:
    data = bytearray(b"".join(frame((first + i) % 2**64, *m) for i, m in enumerate(msgs)))
    for at, byte in muts:  # hostile bytes: any byte of any field, sizes included
        if data:
            data[at % len(data)] = byte
    buf = bytes(data[: max(0, len(data) - cut)])  # a torn tail
    expect = max(0, min(2**64 - 1, first + skew))
    fast, general = both(buf, 0, expect, limit, journal)
    assert fast == general
    msgs_out, pos, problem = fast  # type: ignore[misc]
    assert pos <= len(buf) and (problem is None or problem.position == pos)
    for m in msgs_out:
        assert type(m) is (Message if journal is None else ShardMessage)
        assert type(m.key) is bytes and type(m.value) is bytes


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300), st.integers(0, 2**64 - 1), st.integers(1, 5))
def test_fast_loop_equals_general_path_on_random_bytes(buf: bytes, pos: int, expect: int, limit: int) -> None:
    pos = min(pos, len(buf))
    fast, general = both(buf, pos, expect, limit, None)
    assert fast == general


def test_a_scanner_decoding_small_batches_reads_every_shape_whole(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Batches of a few messages decode from the chunk read last (each byte read once), across chunks
    (1 MiB) and frames bigger than one."""
    rng = __import__("random").Random(4)
    want = []
    with sej.Writer(tmp_path / "j") as w:
        for i in range(3000):
            size = rng.choice((0, 1, 20, 300, 5000, 70_000)) if i % 500 else 3 << 20
            key, value = os.urandom(rng.randint(0, 127)), os.urandom(size)
            w.append(value, key, type=i & 255)
            want.append((i, key, value))
    for batch in (1, 7, 256, 4096):
        with sej.Scanner(tmp_path / "j", 0, timeout=0, batch=batch) as s:
            got = [(m.offset, m.key, m.value) for m in s]
        assert got == want


def test_read_messages_decodes_from_its_chunk_then_reads_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with sej.Writer(tmp_path / "j") as w:
        w.append_many([bytes([i]) * 100 for i in range(100)], b"k")
    path = sej.list_segments(tmp_path / "j")[0].path
    size = os.path.getsize(path)
    chunk = Chunk()
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, offset, seen = 0, 0, []
        while pos < size:
            msgs, used, problem = read_messages(fd, pos, offset, size, 9, None, chunk)
            assert problem is None and 0 < len(msgs) <= 9
            assert chunk.at == 0 and len(chunk.data) == size  # one read, then batches from it
            seen += msgs
            pos, offset = pos + used, offset + len(msgs)
        assert [m.value for m in seen] == [bytes([i]) * 100 for i in range(100)]
        # A later read at the end: nothing new, no problem.
        assert read_messages(fd, pos, offset, size, 9, None, chunk) == ([], 0, None)
    finally:
        os.close(fd)
