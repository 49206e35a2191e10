"""The one decoder for any shape: the fast loop over bytes (`frames._decode_run`) against the general
frame-by-frame path (`frames._decode_general`, what a bytearray or a cut buffer takes), on random shapes and
hostile bytes; and the chunked segment reader (`segment.Chunk`) under small batches."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sej
from sej.errors import CorruptionError
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
    st.integers(0, 30),
    st.integers(0, 3),
)
def test_fast_loop_equals_general_path_on_any_shape_and_hostile_bytes(
    first: int,
    msgs: list,
    muts: list,
    cut: int,
    limit: int,
    journal: str | None,
    skew: int,  # type: ignore[type-arg]
    same: int,
    smaller: int,
) -> None:
    if msgs:  # a run of one size (whole-frame structs), then maybe smaller frames after it
        msgs = msgs[:1] * same + msgs + [(m[0], m[1], m[2][:1], m[3][:1]) for m in msgs[:smaller]]
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


# -- the columnar decoder (sej.columns) against the message decoder ------------------------------------------

pa = __import__("pytest").importorskip("pyarrow")


def column_rows(cols) -> list[tuple]:  # type: ignore[no-untyped-def,type-arg]
    if cols is None:
        return []
    return list(zip(*(c.to_pylist() for c in cols)))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    messages,
    mutations,
    st.integers(0, 64),
    st.integers(-2, 2),
    st.integers(0, 40),
    st.booleans(),
)
def test_decode_columns_equals_decode_batch_on_any_shape_and_hostile_bytes(
    first: int,
    msgs: list,
    muts: list,
    cut: int,
    skew: int,
    same: int,
    spare: bool,  # type: ignore[type-arg]
) -> None:
    from sej.columns import decode_columns

    msgs = msgs + [msgs[-1]] * same if msgs else msgs  # a run of one size, for the stride path
    data = bytearray(b"".join(frame(first + i, *m) for i, m in enumerate(msgs)))
    for at, byte in muts:
        if data:
            data[at % len(data)] = byte
    end = max(0, len(data) - cut)
    buf = bytearray(data) if spare else bytearray(data[:end])  # spare: stale bytes past `end`, as a reused buffer
    expect = max(0, first + skew)
    want, used, problem = decode_batch(bytes(data[:end]), 0, end, expect)
    if any(m.offset > 2**63 - 1 for m in want):  # unsigned in the frame; the offset column is a signed long
        with pytest.raises(CorruptionError, match="does not fit a signed 64-bit integer"):
            decode_columns(buf, 0, end, expect)
        return
    cols, got_used, got_problem = decode_columns(buf, 0, end, expect)
    assert column_rows(cols) == [(m.offset, NO_TIMESTAMP if m.timestamp is None else m.timestamp, m.type, m.key,
                                  m.value) for m in want]  # fmt: skip
    assert (got_used, got_problem) == (used, problem)


def test_read_table_of_a_hub_root_between_offsets_and_times_and_through_duckdb(tmp_path) -> None:  # type: ignore[no-untyped-def]
    duckdb = __import__("pytest").importorskip("duckdb")
    root = tmp_path / "hub"
    rows = {}
    for client, shard in (("c1", "ev.1.000"), ("c1", "ev.1.001"), ("c2", "ev.1.000")):
        with sej.Writer(root / f"{client}.{shard}", segment_size=4000) as w:  # several segments each
            for i in range(300):
                key, value = f"k{i % 7}".encode(), os.urandom(i % 300)
                w.append(value, key, type=i % 3, timestamp=1_000_000 * (i + 1))
                rows[(client, shard, i)] = (key, value)
    assert len(sej.list_segments(root / "c1.ev.1.000")) > 3
    tbl = sej.read_table(root)
    assert tbl.schema == sej.columns.ARROW_SCHEMA and tbl.num_rows == 900
    got = {(c, s, o): (k, v) for c, s, o, k, v in zip(*(tbl.column(n).to_pylist() for n in
                                                          ("client", "shard", "offset", "key", "value")))}  # fmt: skip
    assert got == rows
    assert tbl.column("timestamp").cast(pa.int64()).to_pylist()[:3] == [1000, 2000, 3000]  # microseconds
    part = sej.read_table(root / "c2.ev.1.000", 100, 250)
    assert part.column("offset").to_pylist() == list(range(100, 250)) and set(part.column("client").to_pylist()) == {
        None} and set(part.column("shard").to_pylist()) == {""}  # fmt: skip
    timed = sej.read_table(root, since=1_000_000 * 51, until=1_000_000 * 61)  # offsets 50..59 of each journal
    assert timed.num_rows == 30 and set(timed.column("offset").to_pylist()) == set(range(50, 60))
    assert sum(b.num_rows for b in sej.read_batches(root, 290)) == 30
    assert duckdb.sql(
        'select client, shard, count(*), max("offset"), sum(octet_length(value)) from tbl group by all order by all'
    ).fetchall() == [  # fmt: skip
        (c, s, 300, 299, sum(len(v) for (cc, ss, _), (_, v) in rows.items() if (cc, ss) == (c, s)))
        for c, s in (("c1", "ev.1.000"), ("c1", "ev.1.001"), ("c2", "ev.1.000"))
    ]


def test_read_table_checks_checksums_and_names_bad_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    with sej.Writer(tmp_path / "j") as w:
        w.append_many([b"x" * 100] * 100, b"k")
    with pytest.raises(sej.InvalidArgumentError, match="start must be an offset"):
        sej.read_table(tmp_path / "j", -1)
    with pytest.raises(sej.OffsetOutOfRangeError):
        sej.read_table(tmp_path / "j", 101)
    with pytest.raises(sej.InvalidArgumentError, match="verify must be a bool"):
        sej.read_table(tmp_path / "j", verify="yes")  # type: ignore[arg-type]
    seg = sej.list_segments(tmp_path / "j")[0].path
    with open(seg, "r+b") as f:  # a value byte changed: frames still valid, the checksum not
        f.seek(26 + 1 + 50)
        f.write(b"y")
    assert sej.read_table(tmp_path / "j", verify=False).num_rows == 100
    with pytest.raises(sej.ChecksumError):
        sej.read_table(tmp_path / "j")


def test_the_duckdb_lines_of_docs_arrow_md_run_as_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    __import__("pytest").importorskip("duckdb")
    import pathlib
    import re

    page = (pathlib.Path(__file__).parent.parent / "docs" / "arrow.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "import duckdb" in b)
    with sej.Writer(tmp_path / "hub" / "c1.ev.1.000") as w:
        w.append_many([b'{"event": "click"}'] * 5, keys=[b"u1", b"u2", b"u1", b"u3", b"u1"])
    scope: dict[str, object] = {"sej": sej}
    exec(block.replace('"/srv/hub"', repr(str(tmp_path / "hub"))), scope)  # noqa: S102 - the page's own lines
    tbl = scope["tbl"]  # noqa: F841 - DuckDB finds it by name
    assert scope["duckdb"].sql(  # type: ignore[attr-defined]
        'select client, shard, count(*), max("offset") from tbl group by all'
    ).fetchall() == [("c1", "ev.1.000", 5, 4)]
    assert scope["duckdb"].sql(  # type: ignore[attr-defined]
        "select decode(value)::json->>'event' as event, count(*) from tbl group by event"
    ).fetchall() == [("click", 5)]


def test_without_pyarrow_the_columnar_read_says_which_extra_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyarrow'] = None\n"  # as if pyarrow were not installed
        "import sej\n"
        "try:\n    sej.read_table('.')\nexcept ImportError as e:\n"
        "    import sej.errors; print(type(e).__name__, isinstance(e, sej.errors.SejError), e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("MissingExtraError True pyarrow is missing") and "'spark' extra" in out, out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([-(2**63), -1, -1000, -1001, 0, 999])),
                max_size=20), st.integers(0, 3))  # fmt: skip
def test_micros_rounds_down_and_makes_no_timestamp_null(ns: list[int], skip: int) -> None:
    from sej.columns import micros

    got = micros(pa.array(ns, pa.int64()).slice(min(skip, len(ns))))
    assert got.type == pa.timestamp("us", tz="UTC")
    assert got.cast(pa.int64()).to_pylist() == [None if v == -(2**63) else v // 1000 for v in ns[skip:]]
