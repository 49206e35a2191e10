"""Fuzz tests (hypothesis): the codec, mutated segment files, forged index files, and the CLI.

Every property is checked against a reference reader written from docs/format.md
(tests/fuzz_model.py), never against the library's own reading of the files:

1. Codec: `decode`, `decode_batch` and `check_frame` on arbitrary and on mutated frames agree
   with the reference; `encode` round-trips every valid field and refuses every invalid one with
   `InvalidArgumentError`.
2. Segments: a journal written by `Writer`, then segment files mutated (bit flips, size fields,
   truncation, inserted or deleted bytes, removed files; also under a live writer). Every reader
   returns consecutive messages the files really hold, or raises a `SejError`: never another
   exception, never a hang, never a message from the middle of a value; it ends without an error
   only where a correct reader may (the end of the last segment, or an honest torn tail there).
   Opening a Writer cuts nothing that is valid from the segment's start, and keeps every byte it
   cuts in the quarantine file.
3. Index files: forged or damaged sparse index entries (offsets, positions, max_ts, entries
   pointing at frames embedded in values, bad headers, missing files) change no reader's answer:
   seeks by offset and time, `next_offset`, `last_messages` and writer recovery give exactly the
   messages of the segments, also after the writer has appended more.
4. CLI: `sej scan/count/verify/dump/stat/tail/file` on mutated journals exit 0, 1 or 2 with one
   `sej: error:` line and no traceback, and agree with each other and with the reference.

Budget: small by default (CI); ``SEJ_FUZZ=long`` runs about a million cases over the file;
``SEJ_FUZZ_EXAMPLES=N`` runs N per test. ``SEJ_FUZZ_COLLECT=FILE`` records failures as JSON lines
and keeps going (no shrinking) instead of stopping at the first; ``SEJ_FUZZ_LOG=FILE`` logs
progress counts. No example database (runs are reproducible: CI derandomizes), no deadlines.
"""

from __future__ import annotations

import array
import json
import os
import re
import shutil
import struct
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

import sej
import sej.index
from sej.apps.cli.main import cli
from sej.message import MAX_OFFSET, NO_TIMESTAMP, Message, check_frame, decode, decode_batch, encode

from .fuzz_model import (
    COLLECTOR,
    LONG,
    OK,
    Analysis,
    FuzzFailure,
    Hang,
    Model,
    bounded,
    budget,
    call,
    check_sequence,
    describe_journal,
    example_of,
    fail,
    forget_frames,
    ref_frame,
    ref_walk,
    short,
    true_offset_at_time,
)

# No .hypothesis/ in the work tree: no example database (settings below), and the failure patches
# hypothesis writes go to a temporary directory.
set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), f"sej-hypothesis-{os.getuid()}"))

INT64_MAX = 2**63 - 1
T0 = 1_700_000_000_000_000_000


def sums_disagree(dir: str) -> bool:
    """The reference for checksum files, from docs/format.md: does any segment's checksum file disagree with it?"""
    import xxhash

    block = 65536
    jdir, idir = os.path.join(dir, "jnl"), os.path.join(dir, "idx")
    for name in sorted(os.listdir(jdir)):
        if not re.fullmatch(r"[0-9a-f]{16}\.jnl", name) or not os.path.isfile(os.path.join(jdir, name)):
            continue
        spath = os.path.join(idir, name[:16] + ".sum")
        if not os.path.lexists(spath):
            continue  # unchecked
        if os.path.islink(spath) or not os.path.isfile(spath):
            return True
        with open(os.path.join(jdir, name), "rb") as f:
            data = f.read()
        with open(spath, "rb") as f:
            raw = f.read()
        head = b"SEJSUM01" + bytes.fromhex(name[:16])
        if len(raw) < 16:
            if data or not head.startswith(raw):
                return True
            continue
        if raw[:16] != head:
            return True
        prev = 0
        for i in range(16, len(raw) - 15, 16):
            end, digest = struct.unpack_from(">QQ", raw, i)
            start = (end - 1) // block * block if end else 0
            if end <= prev or not (start == prev or (prev % block and start == (prev - 1) // block * block)):
                return True
            if end > len(data) or xxhash.xxh3_64_intdigest(data[start:end]) != digest:
                return True
            prev = end
    return False


def fuzz_settings(ci: int, long: int):  # type: ignore[no-untyped-def]
    return settings(
        max_examples=budget(ci, long),
        deadline=None,
        database=None,
        derandomize=not LONG and not os.environ.get("SEJ_FUZZ_EXAMPLES"),
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


@pytest.fixture(autouse=True, scope="module")
def _progress_log() -> Iterator[None]:
    yield
    COLLECTOR.flush()


FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextmanager
def tmpdir(memory: bool = True) -> Iterator[str]:
    """A fresh directory for one example: in /dev/shm when there is one (tens of thousands of small
    files are created per minute; a disk makes that the bottleneck), else the temp dir.
    SEJ_FUZZ_TMP overrides the place."""
    base = os.environ.get("SEJ_FUZZ_TMP") or (FAST_TMP if memory else None)
    d = tempfile.mkdtemp(prefix="sej-fuzz-", dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def index_interval(n: int) -> Iterator[None]:
    """Sparse index entries every `n` bytes instead of 4096 (more entries in small journals)."""
    old = sej.index.INTERVAL
    sej.index.INTERVAL = n
    try:
        yield
    finally:
        sej.index.INTERVAL = old


# =================================================================================================
# 1. The codec
# =================================================================================================

offsets = st.one_of(st.integers(0, 40), st.integers(0, MAX_OFFSET), st.sampled_from([MAX_OFFSET, 2**63, 2**32]))
timestamps = st.one_of(
    st.integers(-40, 40).map(lambda d: T0 + d * 1000),
    st.sampled_from([NO_TIMESTAMP, NO_TIMESTAMP + 1, -1, 0, INT64_MAX]),
)
keys = st.one_of(st.just(b""), st.binary(max_size=8), st.binary(min_size=120, max_size=127))
small_values = st.one_of(
    st.binary(max_size=24), st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 300), st.integers(0, 255))
)
frame_fields = st.tuples(timestamps, st.integers(0, 255), keys, small_values)


def frames_bytes(first: int, fields: list[tuple[int, int, bytes, bytes]]) -> bytes:
    first = min(first, MAX_OFFSET + 1 - len(fields))
    return b"".join(encode(first + i, ts, typ, k, v) for i, (ts, typ, k, v) in enumerate(fields))


def check_codec_at(
    buf: bytes, pos: int, end: int, expect: int | None, limit: int, what: str, later: list[FuzzFailure]
) -> None:
    """check_frame, decode_batch and decode on buf[pos:end] against the reference reader.

    Failures that do not make the other checks meaningless are appended to `later`, to be raised
    after them (so that one known problem does not hide the others).
    """
    window = buf[:end]
    ref = ref_frame(window, pos, expect)
    decidable = end - pos >= 18  # fewer bytes: sej calls them incomplete whatever they hold (noted, not failed)
    r, err = call("check_frame", check_frame, buf, pos, end, expect)
    if err is not None:
        raise fail("codec:check_frame-raised", f"{what}: check_frame raised {err!r}")
    if ref[0] == OK:
        if r != ref[1]:
            raise fail("codec:check_frame", f"{what}: check_frame gave {r!r}, the frame ends at {ref[1]}")
    else:
        if isinstance(r, int) or r.position != pos:
            raise fail("codec:check_frame", f"{what}: check_frame gave {r!r}, expected a problem at {pos}: {ref[0]}")
        want_incomplete = ref[0] == "incomplete"
        if r.incomplete != want_incomplete and decidable:
            raise fail("codec:incomplete-vs-corrupt", f"{what}: check_frame says incomplete={r.incomplete}, "
                       f"the bytes are {ref[0]}: {r!r}")  # fmt: skip

    # decode_batch: the same frames as the reference walk, then the same problem.
    msgs, err = call("decode_batch", decode_batch, buf, pos, end, expect, limit)
    if err is not None:
        raise fail("codec:decode_batch-raised", f"{what}: decode_batch raised {err!r}")
    got, used, problem = msgs
    if expect is None:
        # No offset check: walk with each frame's own offset.
        ref_frames = []
        p = pos
        while p < end and len(ref_frames) < limit:
            st_, e, m = ref_frame(window, p, None)
            if st_ != OK:
                break
            ref_frames.append((p, e, m))
            p = e
        ref_end = p
        ref_status = "clean" if p == end else ref_frame(window, p, None)[0]
        if len(ref_frames) == limit and p < end:
            ref_status = "limit"
    else:
        w = ref_walk(window, pos, expect, limit)
        ref_frames, ref_end = w.frames, w.end
        ref_status = "clean" if w.end == end else ("incomplete" if w.status == "torn" else "corrupt")
        if len(ref_frames) == limit and w.end < end:
            ref_status = "limit"
    want = [m for _p, _e, m in ref_frames]
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise fail("codec:decode_batch", f"{what}: decode_batch gave {len(got)} messages, the reference "
                   f"{len(want)}; first difference at #{i}: {short(got[i] if i < len(got) else None)} vs "
                   f"{short(want[i] if i < len(want) else None)}")  # fmt: skip
    if used != ref_end:
        raise fail("codec:decode_batch", f"{what}: decode_batch stopped at {used}, the reference at {ref_end}")
    if ref_status in ("clean", "limit"):
        if problem is not None:
            raise fail("codec:decode_batch", f"{what}: decode_batch reports {problem!r} at a clean stop")
    else:
        if problem is None or problem.position != ref_end:
            raise fail("codec:decode_batch", f"{what}: decode_batch problem {problem!r}, the reference: "
                       f"{ref_status} at {ref_end}")  # fmt: skip
        if problem.incomplete != (ref_status == "incomplete") and end - ref_end >= 18:
            raise fail("codec:incomplete-vs-corrupt", f"{what}: decode_batch says {problem!r}, the bytes are "
                       f"{ref_status}")  # fmt: skip
    for (p, e, _m), m in zip(ref_frames, got):
        if encode(m.offset, m.timestamp, m.type, m.key, m.value) != window[p:e]:
            raise fail("codec:roundtrip", f"{what}: {short(m)} does not encode back to its bytes")

    # decode: one frame, to the end of the buffer.
    if end == len(buf):
        for b in (buf, memoryview(buf), bytearray(buf)):
            res, err = call("decode", decode, b, pos, expect)
            if ref[0] == OK:
                if err is not None or res != (ref[2], ref[1]):
                    raise fail("codec:decode", f"{what}: decode({type(b).__name__}) gave {res!r} / {err!r}, "
                               f"expected {short(ref[2])} ending at {ref[1]}")  # fmt: skip
                if (type(res[0].key) is not bytes or type(res[0].value) is not bytes) and not later:
                    later.append(
                        fail(
                            "codec:decode-types",
                            f"{what}: decode({type(b).__name__}) gave a key of "
                            f"type {type(res[0].key).__name__}, value {type(res[0].value).__name__}",
                        )
                    )
            elif not isinstance(err, sej.FrameError):
                raise fail("codec:decode", f"{what}: decode gave {res!r} / {err!r} on {ref[0]} bytes")


@fuzz_settings(ci=1500, long=250_000)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda a, f, b: a + f + b,
            st.binary(max_size=30),
            st.builds(frames_bytes, offsets, st.lists(frame_fields, max_size=4)),
            st.binary(max_size=30),
        ),
    ),  # fmt: skip
    st.integers(0, 300),
    st.integers(0, 300),
    st.one_of(st.none(), offsets, st.just("from-buffer")),
    st.integers(1, 6),
)
def test_codec_on_arbitrary_bytes(buf: bytes, pos: int, cut: int, expect: object, limit: int) -> None:
    with example_of("codec_arbitrary", (buf, pos, cut, expect, limit)):
        pos = pos % (len(buf) + 1)
        end = pos + cut % (len(buf) - pos + 1)
        if expect == "from-buffer":  # the offset the bytes at pos carry, so that frames can decode
            expect = struct.unpack_from(">Q", buf, pos)[0] if len(buf) - pos >= 8 else 0
        later: list[FuzzFailure] = []
        what = f"buf={buf.hex()} pos={pos} end={end} expect={expect}"
        check_codec_at(buf, pos, end, expect, limit, what, later)  # type: ignore[arg-type]
        if later:
            raise later[0]


MUTATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 4000), st.integers(1, 255)),
        st.tuples(st.just("set32"), st.integers(0, 4000),
                  st.sampled_from([0, 1, -1, 26, 27, 0x7FFFFFFF, -(2**31), 0x7FFFF000, 0x7FFFF001, 127, 128])),
        st.tuples(st.just("truncate"), st.integers(0, 4000)),
        st.tuples(st.just("insert"), st.integers(0, 4000), st.binary(min_size=1, max_size=30)),
        st.tuples(st.just("delete"), st.integers(0, 4000), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=3,
)  # fmt: skip


def mutate_bytes(data: bytes, muts: list[tuple]) -> tuple[bytes, int]:  # type: ignore[type-arg]
    """Apply mutations; return the bytes and the first position any of them touched."""
    b = bytearray(data)
    first = len(b)
    for m in muts:
        pos = m[1] % (len(b) + 1)
        first = min(first, pos)
        if m[0] == "flip" and pos < len(b):
            b[pos] ^= m[2]
        elif m[0] == "set32":
            b[pos : pos + 4] = struct.pack(">i", m[2])[: max(0, min(4, len(b) - pos))]
        elif m[0] == "truncate":
            del b[pos:]
        elif m[0] == "insert":
            b[pos:pos] = m[2]
        elif m[0] == "delete":
            del b[pos : pos + m[2]]
    return bytes(b), first


@fuzz_settings(ci=800, long=250_000)
@given(offsets, st.lists(frame_fields, min_size=1, max_size=6), MUTATIONS, st.integers(1, 8))
def test_codec_on_mutated_frames(first: int, fields: list, muts: list, limit: int) -> None:  # type: ignore[type-arg]
    first = min(first, MAX_OFFSET - len(fields))
    with example_of("codec_mutated", (first, fields, muts, limit)):
        data = frames_bytes(first, fields)
        bad, touched = mutate_bytes(data, muts)
        what = f"frames at {first} mutated by {muts}: {bad.hex()}"
        later: list[FuzzFailure] = []
        check_codec_at(bad, 0, len(bad), first, limit, what, later)
        # Frames wholly before the first mutated byte decode exactly as written.
        msgs, _, _ = decode_batch(bad, 0, len(bad), first)
        p = 0
        for i, (ts, typ, k, v) in enumerate(fields):
            size = 26 + len(k) + len(v)
            if p + size > touched:
                break
            want = Message(first + i, None if ts == NO_TIMESTAMP else ts, typ, k, v)
            if i >= len(msgs) or msgs[i] != want:
                raise fail("codec:intact-prefix", f"{what}: frame {i} (untouched) decoded as "
                           f"{short(msgs[i]) if i < len(msgs) else 'nothing'}")  # fmt: skip
            p += size
        if later:
            raise later[0]


def _field_ok(name: str, v: object) -> bool:
    if name in ("offset", "type", "timestamp"):
        if name == "timestamp" and v is None:
            return True
        if not isinstance(v, int) or isinstance(v, bool):
            return False
        lo, hi = {"offset": (0, MAX_OFFSET), "type": (0, 255), "timestamp": (-(2**63), INT64_MAX)}[name]
        return lo <= v <= hi
    if not isinstance(v, (bytes, bytearray, memoryview)):
        return False
    nbytes = memoryview(v).nbytes
    if isinstance(v, memoryview) and (v.itemsize != 1 or not v.contiguous):
        return "odd-memoryview"  # type: ignore[return-value]
    return name == "value" or nbytes <= 127


def _odd_views() -> st.SearchStrategy[memoryview]:
    return st.sampled_from(["H", "I", "d"]).flatmap(
        lambda code: st.lists(st.integers(0, 255), max_size=5).map(lambda xs: memoryview(array.array(code, xs)))
    ) | st.binary(min_size=2, max_size=12).map(lambda b: memoryview(b)[::2])


@fuzz_settings(ci=800, long=100_000)
@given(
    st.one_of(offsets, st.integers(-3, -1), st.integers(2**64, 2**64 + 3), st.booleans(), st.none(),
              st.text(max_size=2)),
    st.one_of(st.none(), timestamps, st.integers(2**63, 2**63 + 2), st.integers(-(2**63) - 2, -(2**63) - 1),
              st.booleans(), st.floats(allow_nan=False, max_value=1e9, min_value=-1e9)),
    st.one_of(st.integers(-2, 258), st.booleans()),
    st.one_of(keys, keys.map(bytearray), keys.map(memoryview), st.binary(min_size=128, max_size=140),
              st.text(max_size=3), st.none(), _odd_views()),
    st.one_of(small_values, small_values.map(bytearray), small_values.map(memoryview), st.text(max_size=3),
              st.integers(0, 3), _odd_views()),
)  # fmt: skip
def test_codec_encode_accepts_valid_fields_and_refuses_the_rest(off, ts, typ, key, value) -> None:  # type: ignore[no-untyped-def]
    with example_of("codec_encode", (off, ts, typ, key, value)):
        oks = {n: _field_ok(n, v) for n, v in
               (("offset", off), ("timestamp", ts), ("type", typ), ("key", key), ("value", value))}  # fmt: skip
        odd = [n for n, v in oks.items() if v == "odd-memoryview"]
        frame, err = call("encode", encode, off, ts, typ, key, value)
        what = f"encode({off!r}, {ts!r}, {typ!r}, {key!r}, {value!r})"
        if any(isinstance(v, bool) for v in (off, ts, typ)):
            # A bool is an int to struct: encode may take it as 0/1 (the Writer does too) or refuse it.
            off, ts, typ = (int(v) if isinstance(v, bool) else v for v in (off, ts, typ))
            oks = {n: _field_ok(n, v) for n, v in
                   (("offset", off), ("timestamp", ts), ("type", typ), ("key", key), ("value", value))}  # fmt: skip
            if err is not None and isinstance(err, sej.InvalidArgumentError):
                return
        if odd:
            # A memoryview of items wider than a byte, or not contiguous: either refused with
            # InvalidArgumentError, or encoded as its bytes (len() of such a view counts items).
            if err is None:
                k, v = memoryview(key).tobytes(), memoryview(value).tobytes()  # type: ignore[arg-type]
                ok = decode(frame)[0] if ref_frame(frame, 0, None)[0] == OK else None
                if ok is None or ok.key != k or ok.value != v or len(k) > 127:
                    raise fail(
                        "codec:encode-odd-memoryview",
                        f"{what} returned an invalid frame {frame.hex()} (ref: {ref_frame(frame, 0, None)[0]})",
                    )
            elif not isinstance(err, sej.InvalidArgumentError):
                raise fail("codec:encode-odd-memoryview", f"{what} raised {err!r}")
            return
        if all(oks.values()):
            if err is not None:
                raise fail("codec:encode-refused-valid", f"{what} raised {err!r}")
            want = Message(off, None if ts in (None, NO_TIMESTAMP) else ts, typ, bytes(key), bytes(value))
            got = decode(frame)
            if got != (want, len(frame)) or len(frame) != 26 + len(key) + len(value):
                raise fail("codec:encode-roundtrip", f"{what} decodes to {got!r}")
        elif not isinstance(err, sej.InvalidArgumentError):
            raise fail("codec:encode-accepted-invalid", f"{what} gave {frame!r} / {err!r}, invalid fields: "
                       f"{[n for n, v in oks.items() if not v]}")  # fmt: skip


# =================================================================================================
# Journals
# =================================================================================================


@dataclass
class JournalSpec:
    start: int
    segment_size: int
    interval: int
    buffer_size: int
    chunks: list[int] | None  # append_many chunk sizes, or None for one append per message
    msgs: list[tuple[int, int, bytes, object]]  # (timestamp, type, key, value or ("embed", ...))


@dataclass
class Built:
    dir: str
    spec: JournalSpec
    messages: list[Message]
    embeds: list[tuple[int, int]] = field(default_factory=list)  # (message index, position in its value)
    model: Model | None = None


def embed_values(deltas: st.SearchStrategy[int]) -> st.SearchStrategy[tuple]:  # type: ignore[type-arg]
    """A value holding a whole valid frame: ("embed", prefix, offset delta, inner value, suffix)."""
    return st.tuples(st.just("embed"), st.binary(max_size=6), deltas, st.binary(max_size=10), st.binary(max_size=6))


def journal_specs(
    max_msgs: int = 30, embed: bool = False, embed_deltas: st.SearchStrategy[int] | None = None,
    sizes: tuple[int, ...] = (1, 60, 200, 700, 3000, 1 << 20), intervals: tuple[int, ...] = (4096, 64, 256),
) -> st.SearchStrategy[JournalSpec]:  # fmt: skip
    values = small_values
    if embed:
        values = st.one_of(small_values, embed_values(st.integers(-2, 0) if embed_deltas is None else embed_deltas))
    return st.builds(
        JournalSpec,
        st.sampled_from([0, 0, 7, 2**32, 2**63, MAX_OFFSET - 200]),
        st.one_of(st.sampled_from(sizes), st.integers(1, 5000)),
        st.sampled_from(intervals),
        st.sampled_from([1 << 16, 0, 100]),
        st.one_of(st.none(), st.lists(st.integers(1, 6), min_size=1, max_size=8)),
        st.lists(st.tuples(timestamps, st.integers(0, 3), keys, values), max_size=max_msgs),
    )


def materialize(spec: JournalSpec) -> tuple[list[tuple[int, int, bytes, bytes]], list[tuple[int, int]]]:
    """The messages' fields (embedded frames built with their final offsets) and where the embeds sit."""
    out = []
    embeds = []
    for i, (ts, typ, key, v) in enumerate(spec.msgs):
        if isinstance(v, tuple):
            _, pre, delta, inner, post = v
            off = min(max(spec.start + i + delta, 0), MAX_OFFSET)
            v = pre + encode(off, ts, typ, key[:5], inner) + post
            embeds.append((i, len(pre)))
        out.append((ts, typ, key, v))
    return out, embeds


def build(dir: str, spec: JournalSpec) -> Built:
    fields, embeds = materialize(spec)
    if spec.chunks:  # append_many gives a whole chunk the type and timestamp of its first message
        i = c = 0
        while i < len(fields):
            n = spec.chunks[c % len(spec.chunks)]
            ts, typ = fields[i][0], fields[i][1]
            for j in range(i, min(i + n, len(fields))):
                fields[j] = (ts, typ, fields[j][2], fields[j][3])
            i += n
            c += 1
    msgs = [Message(spec.start + i, None if ts == NO_TIMESTAMP else ts, typ, k, v)
            for i, (ts, typ, k, v) in enumerate(fields)]  # fmt: skip
    w = sej.Writer(dir, segment_size=spec.segment_size, start_offset=spec.start, buffer_size=spec.buffer_size)
    try:
        if spec.chunks:
            i = c = 0
            while i < len(fields):
                chunk = fields[i : i + spec.chunks[c % len(spec.chunks)]]
                w.append_many([f[3] for f in chunk], keys=[f[2] for f in chunk], type=chunk[0][1],
                              timestamp=chunk[0][0])  # fmt: skip
                i += len(chunk)
                c += 1
        else:
            for ts, typ, k, v in fields:
                w.append(v, key=k, type=typ, timestamp=ts)
    finally:
        w.close()
    b = Built(dir, spec, msgs, embeds)
    b.model = Model(dir)
    an = b.model.analyse()
    if not an.clean or msgs != an.P:
        raise fail("writer", f"the journal written by Writer reads back as {len(an.P)} messages "
                   f"({an.chain_problem}), {len(msgs)} were appended")  # fmt: skip
    return b


def embed_positions(b: Built) -> list[tuple[str, int, int]]:
    """(segment name, byte position, offset) of every frame embedded in a value."""
    assert b.model is not None
    where = {g.msg.offset: (name, g) for name, s in b.model.segs.items() for g in s.genuine}
    out = []
    for i, inner in b.embeds:
        m = b.messages[i]
        if m.offset not in where:
            continue
        name, g = where[m.offset]
        pos = g.start + 22 + len(m.key) + inner
        off = struct.unpack_from(">Q", m.value, inner)[0]
        out.append((name, pos, off))
    return out


# -- index snapshots ---------------------------------------------------------------------------


IdxSnapshot = dict[str, tuple[bytes, tuple[int, int, int]]]


def _stat_key(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def idx_snapshot(dir: str) -> IdxSnapshot:
    d = os.path.join(dir, "idx")
    out = {}
    if os.path.isdir(d):
        for n in os.listdir(d):
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[n] = (f.read(), _stat_key(p))
    return out


def idx_restore(dir: str, snap: IdxSnapshot) -> None:
    """Put the index files back as they were (readers rebuild and save indexes of finished segments)."""
    d = os.path.join(dir, "idx")
    os.makedirs(d, exist_ok=True)
    for n in os.listdir(d):
        if n not in snap:
            os.remove(os.path.join(d, n))
    for n, (data, key) in list(snap.items()):
        p = os.path.join(d, n)
        try:
            if _stat_key(p) == key:
                continue  # untouched (sej replaces index files, so a rewrite changes the inode)
        except FileNotFoundError:
            pass
        with open(p, "wb") as f:
            f.write(data)
        snap[n] = (data, _stat_key(p))


def quarantine_files(dir: str) -> set[str]:
    return {n for n in os.listdir(os.path.join(dir, "jnl")) if ".cut-" in n}


# -- reading everything ---------------------------------------------------------------------------


def scan(dir: str, k: int, batch: int, cap: int) -> tuple[list[Message], sej.SejError | None]:
    got: list[Message] = []

    def run() -> None:
        with sej.Scanner(dir, k, timeout=0, batch=batch) as s:
            for m in s:
                got.append(m)
                if len(got) > cap:
                    raise fail("invented:Scanner", f"Scanner({k}) returned more than the {cap} frames the files hold")

    _, err = call(f"Scanner({k}, batch={batch})", run)
    return got, err


def scan_at_time(dir: str, t: int, cap: int) -> tuple[int | None, list[Message], sej.SejError | None]:
    got: list[Message] = []
    start: list[int] = []

    def run() -> None:
        with sej.Scanner.at_time(dir, t, timeout=0) as s:
            start.append(s.offset)
            for m in s:
                got.append(m)
                if len(got) > cap:
                    raise fail("invented:Scanner.at_time", f"Scanner.at_time({t}) returned more than {cap} messages")

    _, err = call(f"Scanner.at_time({t})", run)
    return (start[0] if start else None), got, err


def check_scan_result(an: Analysis, k: int, got: list[Message], err: object, what: str, exact: bool) -> None:
    check_sequence(an, got, k, what)
    if err is None and an.segments and k + len(got) not in an.ends_ok:
        raise fail(f"silent-stop:{what.split('(')[0]}",
                   f"{what} returned {len(got)} messages and stopped at offset {k + len(got)} without an error; "
                   f"a correct reader may stop only at {sorted(an.ends_ok)} ({an.chain_problem})")  # fmt: skip
    if exact and an.clean and an.first <= k <= an.next:
        if err is not None:
            raise fail(f"raised-on-valid:{what.split('(')[0]}", f"{what} raised {err!r} on a valid journal")
        if got != an.P[k - an.first :]:
            raise fail(f"wrong-data:{what.split('(')[0]}", f"{what} returned {len(got)} messages, "
                       f"expected {an.next - k}")  # fmt: skip


def offsets_to_try(an: Analysis, draw, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    hi = max([an.next, *an.V.keys()], default=an.first) + 2
    cands = [an.first, an.next, *(o for o in an.V if o % 7 == 0)]
    out = [an.first, an.next]
    for _ in range(n):
        out.append(draw(st.one_of(st.sampled_from(cands), st.integers(max(0, an.first - 1), min(hi, MAX_OFFSET)))))
    return out


def times_to_try(an: Analysis, msgs: list[Message], draw, n: int) -> list[int]:  # type: ignore[no-untyped-def]
    ts = sorted({m.timestamp for m in msgs if m.timestamp is not None})
    cands = [NO_TIMESTAMP, INT64_MAX, T0, *ts, *(t + 1 for t in ts if t < INT64_MAX)]
    return [draw(st.sampled_from(cands)) for _ in range(n)]


def check_readers(  # type: ignore[no-untyped-def]
    an: Analysis,
    dir: str,
    draw,
    idx: IdxSnapshot,
    exact: bool,
    live_next: int | None = None,
    written: list[Message] | None = None,
) -> int | None:
    """Every reader on the journal as it is; returns what next_offset said (None if it raised).

    `written`: the messages as the writer wrote (and indexed) them. A timestamp changed in place
    afterwards is data corruption that no structure shows (only checksums would, issue 14): the
    index's max_ts still describes the old one, so a time seek may go by either (docs/format.md).
    """
    orig_ts = {m.offset: m.timestamp for m in written or []}

    def as_written(ms: list[Message]) -> list[Message]:
        return [m._replace(timestamp=orig_ts.get(m.offset, m.timestamp)) for m in ms]

    def skipped_by(o: int, t: int) -> list[Message]:
        def late(ts: int | None) -> bool:
            return ts is not None and ts >= t

        return [m for m in an.P if m.offset < o and late(m.timestamp) and late(orig_ts.get(m.offset, m.timestamp))]

    cap = sum(len(w.frames) for ws in an.walks.values() for w in ws) + 5
    first = an.segments[0].first if an.segments else 0
    idx_restore(dir, idx)
    r, err = call("first_offset", sej.first_offset, dir)
    if err is not None or r != first:
        raise fail("first_offset", f"first_offset gave {r!r} / {err!r}, the first segment starts at {first}")

    idx_restore(dir, idx)
    nxt, err = call("next_offset", sej.next_offset, dir)
    ends = {z for _q, z in an.last_ends}
    if live_next is not None and err is None and nxt != live_next:
        raise fail("next-offset-lie:live", f"next_offset gave {nxt} while the live writer's next offset is "
                   f"{live_next} ({an.chain_problem})")  # fmt: skip
    if exact and an.clean and (err is not None or nxt != an.next):
        raise fail("next_offset", f"next_offset gave {nxt!r} / {err!r} on a valid journal whose next offset is "
                   f"{an.next}")  # fmt: skip
    if err is None and an.segments and nxt not in ends:
        raise fail("next_offset", f"next_offset gave {nxt}, but no walk of the last segment ends there: "
                   f"{sorted(ends)}")  # fmt: skip

    for k in offsets_to_try(an, draw, 3):
        batch = draw(st.sampled_from([4096, 1, 2]))
        idx_restore(dir, idx)
        got, err = scan(dir, k, batch, cap)
        check_scan_result(an, k, got, err, f"Scanner({k}, batch={batch})", exact)

    for n in sorted({1, 3, len(an.P) + 2}):
        idx_restore(dir, idx)
        lm, err = call(f"last_messages({n})", sej.last_messages, dir, n)
        if lm:
            check_sequence(an, lm, lm[0].offset, f"last_messages({n})")
            if len(lm) > n:
                raise fail("last_messages", f"last_messages({n}) returned {len(lm)} messages")
            if lm[-1].offset + 1 not in ends:
                raise fail("last_messages", f"last_messages({n}) ends at {lm[-1].offset}, no walk of the last "
                           f"segment ends there: {sorted(ends)}")  # fmt: skip
            if live_next is not None and lm[-1].offset + 1 != live_next:
                raise fail("last-messages-lie:live", f"last_messages({n}) ends at {lm[-1].offset}, the live writer "
                           f"is at {live_next}")  # fmt: skip
        if exact and an.clean and (err is not None or lm != an.P[max(0, len(an.P) - n) :]):
            raise fail("last_messages", f"last_messages({n}) gave {len(lm or [])} messages / {err!r} on a valid "
                       f"journal of {len(an.P)}")  # fmt: skip

    msgs = [m for ms in an.V.values() for m in ms]
    for t in times_to_try(an, msgs, draw, 2):
        idx_restore(dir, idx)
        o, err = call(f"offset_at_time({t})", sej.offset_at_time, dir, t)
        if exact and an.clean:
            want = true_offset_at_time(an.P, an.next, t)
            if err is not None or o not in (want, true_offset_at_time(as_written(an.P), an.next, t)):
                raise fail("time-seek:offset_at_time", f"offset_at_time({t}) gave {o!r} / {err!r}, the first message "
                           f"at or after it is {want}")  # fmt: skip
        elif o is not None:
            skipped = skipped_by(o, t)
            if skipped:
                raise fail("time-seek:offset_at_time", f"offset_at_time({t}) gave {o}, skipping {short(skipped[0])}")
        idx_restore(dir, idx)
        start, got, err = scan_at_time(dir, t, cap)
        if start is not None:
            check_scan_result(an, start, got, err, f"Scanner.at_time({t})", exact)
            skipped = skipped_by(start, t)
            if skipped:
                raise fail("time-seek:Scanner.at_time", f"Scanner.at_time({t}) starts at {start}, skipping "
                           f"{short(skipped[0])}")  # fmt: skip
            if exact and an.clean:
                want = true_offset_at_time(an.P, an.next, t)
                if start not in (want, true_offset_at_time(as_written(an.P), an.next, t)):
                    raise fail("time-seek:Scanner.at_time", f"Scanner.at_time({t}) starts at {start}, the first "
                               f"message at or after it is {want}")  # fmt: skip
    idx_restore(dir, idx)
    return nxt


def check_recovery(b: Built, an: Analysis, readonly_next: int | None, draw, exact: bool) -> None:  # type: ignore[no-untyped-def]
    """Open a Writer (strict, then not): what it cuts and where it opens; then append and read back."""
    model = b.model
    assert model is not None
    dir = b.dir
    snap = model.snapshot()
    names = model.names()
    q0 = quarantine_files(dir)
    seg_size = b.spec.segment_size

    def files_now() -> dict[str, bytes]:
        out = {}
        for n in sorted(os.listdir(model.jdir)):
            if n.endswith(".jnl"):
                with open(os.path.join(model.jdir, n), "rb") as f:
                    out[n] = f.read()
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w, err = call("Writer(strict=True)", sej.Writer, dir, segment_size=seg_size, strict=True)
        if w is not None:
            call("Writer.close", w.close)
    refused = err is not None
    if err is not None and not isinstance(err, sej.CorruptionError):
        raise fail("recovery:strict", f"Writer(strict=True) raised {err!r}")
    now = files_now()
    if not snap and w is not None:  # no segments: the writer starts the journal with an empty one
        now = {n: d for n, d in now.items() if d}
    if now != snap or quarantine_files(dir) != q0:
        raise fail("recovery:strict-changed", f"Writer(strict=True) changed the segments (refused={refused})")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, err = call("Writer", sej.Writer, dir, segment_size=seg_size)
    if err is not None:
        raise fail("recovery:raised", f"Writer() raised {err!r} ({an.chain_problem}); {describe_journal(dir)}")
    try:
        rec = w.recovered
        cws = [c for c in caught if issubclass(c.category, sej.CorruptionWarning)]
        in_place = any("left in place" in str(c.message) for c in cws)
        now = files_now()
        new_q = quarantine_files(dir) - q0
        last = names[-1] if names else None
        for n in names[:-1]:
            if now.get(n) != snap[n]:
                raise fail("recovery:changed-other-segment", f"opening the writer changed {n}, not the last segment")
        if rec is None:
            if refused:
                raise fail("recovery:strict-disagrees", "Writer(strict=True) refused, Writer() cut nothing")
            # Damage in place (whole frames after a bad one) is warned about and left as it is (docs/format.md).
            cut_warnings = [c for c in cws if "left in place" not in str(c.message)]
            if cut_warnings or new_q:
                raise fail(
                    "recovery:unreported-cut", f"warnings {cut_warnings} / quarantine files {new_q} without a cut"
                )
            if last is not None and now.get(last) != snap[last]:
                raise fail("recovery:unreported-cut", f"{last} changed without a reported cut")
            if last is not None and (len(snap[last]), w.next_offset) not in an.last_ends:
                raise fail("recovery:opened-at", f"the writer opened at {w.next_offset} without cutting; walks of "
                           f"{last} end at {sorted(an.last_ends)} (size {len(snap[last])})")  # fmt: skip
        else:
            c = rec.position
            if not refused:
                raise fail("recovery:strict-disagrees", f"Writer(strict=True) opened, Writer() cut at {c}")
            if last is None or rec.path != model.path(last):
                raise fail("recovery:cut-path", f"the cut is in {rec.path}, the last segment is {last}")
            if rec.quarantine is None or new_q != {os.path.basename(rec.quarantine)}:
                raise fail("recovery:quarantine", f"quarantine {rec.quarantine}, new files {new_q}")
            if not re.fullmatch(re.escape(last) + rf"\.cut-{c}-\d+", os.path.basename(rec.quarantine)):
                raise fail("recovery:quarantine-name", f"badly named quarantine file {rec.quarantine}")
            with open(rec.quarantine, "rb") as f:
                cut = f.read()
            if cut != snap[last][c:] or rec.length != len(cut) or not cut:
                raise fail("recovery:lost-bytes", f"the quarantine file holds {len(cut)} bytes, the cut was "
                           f"{len(snap[last]) - c} bytes from {c} (equal: {cut == snap[last][c:]})")  # fmt: skip
            if now.get(last) != snap[last][:c]:
                raise fail("recovery:lost-bytes", f"{last} after the cut is not the first {c} bytes it had")
            if len(cws) != 1:
                raise fail("recovery:warning", f"{len(cws)} CorruptionWarnings for one cut")
            if c < an.last_e0:
                raise fail("recovery:cut-valid-data", f"recovery cut {last} at byte {c}, but its frames are valid "
                           f"from byte 0 up to {an.last_e0}: valid messages went to quarantine; "
                           f"{describe_journal(dir)}")  # fmt: skip
            if (c, w.next_offset) not in an.last_ends:
                raise fail("recovery:opened-at", f"cut at {c} and opened at {w.next_offset}; walks of {last} "
                           f"end at {sorted(an.last_ends)}")  # fmt: skip
        if readonly_next is not None and readonly_next != w.next_offset:
            raise fail("next-offset-vs-writer", f"next_offset() said {readonly_next}, the writer opened at "
                       f"{w.next_offset} ({an.chain_problem}); {describe_journal(dir)}")  # fmt: skip
        if exact and an.clean and w.next_offset != an.next:
            raise fail("recovery:opened-at", f"the writer opened at {w.next_offset} on a valid journal of next "
                       f"offset {an.next}")  # fmt: skip
        # Append one message: it is the last one, and next_offset follows it.
        x_off = w.next_offset
        if x_off >= MAX_OFFSET:
            return
        ts = draw(timestamps)
        _, err = call("Writer.append", w.append, b"after recovery", key=b"x", type=9, timestamp=ts)
        if err is not None:
            raise fail("recovery:append", f"append after recovery raised {err!r}")
    finally:
        call("Writer.close", w.close)
    x = Message(x_off, None if ts == NO_TIMESTAMP else ts, 9, b"x", b"after recovery")
    lm, err = call("last_messages(1)", sej.last_messages, dir, 1)
    # With damage left in place, reading backward across it fails with the typed error (docs/format.md).
    damaged = in_place and isinstance(err, sej.CorruptionError)
    if not damaged and (err is not None or lm != [x]):
        raise fail("after-recovery:last_messages", f"after appending {short(x)}, last_messages(1) gave "
                   f"{[short(m) for m in lm or []]} / {err!r}")  # fmt: skip
    nxt, err = call("next_offset", sej.next_offset, dir)
    if err is not None or nxt != x_off + 1:
        raise fail("after-recovery:next_offset", f"after appending offset {x_off}, next_offset gave {nxt!r} / {err!r}")


# =================================================================================================
# 2. Mutated segment files
# =================================================================================================

FIELD_VALUES = [0, 1, -1, 17, 25, 26, 27, 127, 128, 255, 4096, 0x7FFFFFFF, -(2**31), 0x7FFFF000, 0x7FFFF001, 0x7FFFFF66]
FIELDS = {  # name: (offset in the frame or a callable, struct)
    "offset": ">Q", "timestamp": ">q", "type": ">B", "key_size": ">b", "value_size": ">i", "size": ">i",
}  # fmt: skip
seg_sel = st.one_of(st.just(-1), st.integers(0, 8))
payloads = st.one_of(
    st.tuples(st.just("bytes"), st.binary(min_size=1, max_size=60)),
    st.tuples(st.just("zeros"), st.integers(1, 300)),
    st.tuples(st.just("copy"), st.integers(0, 100)),
    st.tuples(st.just("frame"), st.integers(-2, 2), st.binary(max_size=20)),
)
field_values = st.one_of(
    st.tuples(st.just("abs"), st.sampled_from(FIELD_VALUES)),
    st.tuples(st.just("rel"), st.integers(-40, 40)),
    st.tuples(st.just("rel"), st.integers(-(2**31), 2**31)),
)
in_place_mutations = st.one_of(
    st.tuples(st.just("flip"), seg_sel, st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("field"), seg_sel, st.integers(0, 1000), st.sampled_from(list(FIELDS)), field_values),
    st.tuples(st.just("overwrite"), seg_sel, st.integers(0, 1 << 16), st.binary(min_size=1, max_size=40)),
)
segment_mutations = st.one_of(
    in_place_mutations,
    st.tuples(st.just("truncate"), seg_sel, st.integers(0, 1 << 16)),
    st.tuples(st.just("insert"), seg_sel, st.integers(0, 1 << 16), payloads),
    st.tuples(st.just("delete"), seg_sel, st.integers(0, 1 << 16), st.integers(1, 300)),
    st.tuples(st.just("append"), seg_sel, payloads),
    st.tuples(st.just("remove"), seg_sel),
)


def pick(names: list[str], sel: int) -> str:
    return names[-1] if sel < 0 else names[sel % len(names)]


def payload_bytes(model: Model, name: str, pos: int, p: tuple) -> bytes:  # type: ignore[type-arg]
    seg = model.segs[name]
    if p[0] == "bytes":
        return p[1]  # type: ignore[no-any-return]
    if p[0] == "zeros":
        return bytes(p[1])
    if p[0] == "copy":
        if not seg.genuine:
            return encode(seg.first, T0, 0, b"", b"copy")
        g = seg.genuine[p[1] % len(seg.genuine)]
        return bytes(seg.data[g.start : g.end])
    after = [g.msg.offset for g in seg.genuine if g.start >= pos]
    before = [g.msg.offset + 1 for g in seg.genuine if g.end <= pos]
    off = after[0] if after else (before[-1] if before else seg.first)
    return encode(max(0, min(off + p[1], MAX_OFFSET)), T0, 0, b"", p[2])


def apply_segment_mutation(model: Model, mut: tuple) -> str:  # type: ignore[type-arg]
    names = model.names()
    if not names:
        return "nothing (no segments)"
    kind, sel = mut[0], mut[1]
    name = pick(names, sel)
    seg = model.segs[name]
    size = len(seg.data)
    if kind == "flip":
        if not size:
            return f"flip: {name} is empty"
        pos = mut[2] % size
        model.splice(name, pos, pos + 1, bytes([seg.data[pos] ^ mut[3]]))
        return f"flip {name}[{pos}] ^= {mut[3]:#x}"
    if kind == "field":
        if not seg.genuine:
            return f"field: {name} has no intact frame"
        g = seg.genuine[mut[2] % len(seg.genuine)]
        ks = seg.data[g.start + 17]
        at = {"offset": 0, "timestamp": 8, "type": 16, "key_size": 17, "value_size": 18 + ks,
              "size": g.end - g.start - 4}  # fmt: skip
        fmt = FIELDS[mut[3]]
        s = struct.Struct(fmt)
        cur = s.unpack_from(seg.data, g.start + at[mut[3]])[0]
        v = mut[4][1] if mut[4][0] == "abs" else cur + mut[4][1]
        bits = s.size * 8
        v %= 1 << bits
        if fmt[1].islower():  # signed
            v = v - (1 << bits) if v >= 1 << (bits - 1) else v
        pos = g.start + at[mut[3]]
        model.splice(name, pos, pos + s.size, s.pack(v))
        return f"{mut[3]} of frame {g.msg.offset} in {name} (byte {g.start}): {cur} -> {v}"
    if kind == "overwrite":
        if not size:
            return f"overwrite: {name} is empty"
        pos = mut[2] % size
        data = mut[3][: size - pos]
        model.splice(name, pos, pos + len(data), data)
        return f"overwrite {name}[{pos}:{pos + len(data)}] with {data.hex()}"
    if kind == "truncate":
        pos = mut[2] % (size + 1)
        model.splice(name, pos, size, b"")
        return f"truncate {name} to {pos} of {size} bytes"
    if kind == "insert":
        pos = mut[2] % (size + 1)
        data = payload_bytes(model, name, pos, mut[3])
        model.splice(name, pos, pos, data)
        return f"insert {len(data)} bytes at {name}[{pos}]: {data[:40].hex()}"
    if kind == "delete":
        pos = mut[2] % (size + 1)
        model.splice(name, pos, pos + mut[3], b"")
        return f"delete {name}[{pos}:{pos + mut[3]}]"
    if kind == "append":
        data = payload_bytes(model, name, size, mut[2])
        model.splice(name, size, size, data)
        return f"append {len(data)} bytes to {name}: {data[:40].hex()}"
    if kind == "remove":
        model.remove(name)
        return f"remove {name}"
    raise AssertionError(kind)


@fuzz_settings(ci=250, long=130_000)
@given(
    journal_specs(max_msgs=30, embed=True),
    st.lists(segment_mutations, min_size=1, max_size=3),
    st.sampled_from(["none", "none", "live"]),
    st.data(),
)
def test_mutated_segments(spec: JournalSpec, muts: list, live: str, data: st.DataObject) -> None:  # type: ignore[type-arg]
    with example_of("segments", (spec, muts, live)), tmpdir() as d, index_interval(spec.interval):
        b = build(os.path.join(d, "j"), spec)
        model = b.model
        assert model is not None
        writer = None
        live_next = None
        if live == "live":
            # A writer holds the journal open while its flushed bytes are damaged, then appends more.
            writer = sej.Writer(b.dir, segment_size=spec.segment_size, durability="flush")
            muts = [m for m in muts if m[0] in ("flip", "field", "overwrite")] or [("flip", -1, 0, 1)]
        try:
            done = [apply_segment_mutation(model, m) for m in muts]
            if writer is not None:
                before = {n: len(s.data) for n, s in model.segs.items()}
                expect = writer.next_offset
                extra = data.draw(st.lists(st.tuples(timestamps, keys, small_values), min_size=1, max_size=6))
                for ts, k, v in extra:
                    if writer.next_offset >= MAX_OFFSET:
                        break
                    writer.append(v, key=k, timestamp=ts)
                writer.flush()
                live_next = writer.next_offset
                for n in sorted(os.listdir(model.jdir)):
                    if n.endswith(".jnl") and (n not in before or os.path.getsize(model.path(n)) > before[n]):
                        model.extend_from_disk(n, expect)
            model.check_disk()
            an = model.analyse()
            note(f"mutations: {done}; live: {live_next}; reference: clean={an.clean} ({an.chain_problem}), "
                 f"P={len(an.P)}, ends_ok={sorted(an.ends_ok)}; {describe_journal(b.dir)}")  # fmt: skip
            idx = idx_snapshot(b.dir)
            ro_next = check_readers(an, b.dir, data.draw, idx, exact=True, live_next=live_next, written=b.messages)
        finally:
            if writer is not None:
                writer.close()
        check_recovery(b, an, ro_next if live_next is None else None, data.draw, exact=True)


@fuzz_settings(ci=2, long=12)
@given(
    st.sampled_from(["last", "middle"]),
    st.sampled_from([0x7FFFF001, 0x7FFFF100, 0x7FFFFF66]),
    st.integers(0, 3),
    st.sampled_from(["wrong-size", "beyond-file"]),
)
def test_huge_frame_claims_in_sparse_segments_end(where: str, vs: int, nmsgs: int, how: str) -> None:
    """A frame header claiming > 0x7ffff000 bytes (more than one pread returns) in a sparse > 2 GiB file.

    Readers must end (an error, or a torn tail's silent stop), not read the same 2 GiB forever.
    """
    with example_of("huge", (where, vs, nmsgs, how)), tmpdir(memory=False) as d:
        j = os.path.join(d, "j")
        with sej.Writer(j, segment_size=1 << 40) as w:
            for i in range(nmsgs):
                w.append(b"m%d" % i, timestamp=T0 + i)
        seg = sej.list_segments(j)[-1].path
        pos = os.path.getsize(seg)
        total = 26 + vs
        with open(seg, "r+b") as f:
            f.seek(pos)
            f.write(struct.pack(">QqBbi", nmsgs, T0, 0, 0, vs))
            # wrong-size: the whole frame is there (sparse zeros) but its size field is 0;
            # beyond-file: the file ends 1 MiB before the frame would.
            f.truncate(pos + total + 100 if how == "wrong-size" else pos + total - (1 << 20))
        if where == "middle":
            with open(os.path.join(j, "jnl", f"{nmsgs + 1:016x}.jnl"), "wb") as f:
                f.write(encode(nmsgs + 1, T0, 0, b"", b"next segment"))
        want = [Message(i, T0 + i, 0, b"", b"m%d" % i) for i in range(nmsgs)]
        got: list[Message] = []

        def run() -> None:
            with sej.Scanner(j, 0, timeout=0) as s:
                for m in s:
                    got.append(m)
                    if len(got) > nmsgs + 2:
                        raise fail("invented:Scanner", f"more than {nmsgs} messages: {short(m)}")

        H = 120  # seconds: one read of a 2 GiB hole takes a while
        _, err = call("Scanner(0)", run, _seconds=H)
        if got != want[: len(got)]:
            raise fail("wrong-data:Scanner", f"{[short(m) for m in got]}")
        if err is None and (where == "middle" or how == "wrong-size"):
            raise fail("silent-stop:Scanner", f"the scan of a {where} segment with a {how} 2 GiB frame "
                       f"ended without an error after {len(got)} messages")  # fmt: skip
        nxt, err = call("next_offset", sej.next_offset, j, _seconds=H)
        if err is None and nxt != (nmsgs + 2 if where == "middle" else nmsgs):
            raise fail("next_offset", f"next_offset gave {nxt}")
        call("offset_at_time", sej.offset_at_time, j, T0 + 5, _seconds=H)
        call("last_messages", sej.last_messages, j, 2, _seconds=H)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w2, err = call("Writer(strict=True)", sej.Writer, j, strict=True, _seconds=H)
        if w2 is not None:
            w2.close()
        for cmd in (["verify", j], ["count", j], ["dump", seg]):
            run_cli(*cmd, seconds=H)


# =================================================================================================
# 3. Forged and damaged index files
# =================================================================================================

u64_values = st.one_of(
    st.tuples(st.just("abs"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("rel"), st.integers(-3 * 4096, 3 * 4096)),
    st.tuples(st.just("rel"), st.integers(-3, 3)),
    st.tuples(st.just("frame"), st.integers(0, 1000)),  # the same field of another, real frame
    st.tuples(st.just("abs"), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**63 + 1])),
)
index_mutations = st.one_of(
    st.tuples(st.just("flip"), seg_sel, st.integers(0, 1 << 12), st.integers(1, 255)),
    st.tuples(st.just("truncate"), seg_sel, st.integers(0, 1 << 12)),
    st.tuples(st.just("entry"), seg_sel, st.integers(-1, 50), st.sampled_from(["offset", "position", "max_ts"]),
              u64_values),
    st.tuples(st.just("embedded"), seg_sel, st.integers(-2, 50), st.integers(0, 100),
              st.sampled_from(["true", "low", "high", "first"])),
    st.tuples(st.just("add"), seg_sel, st.integers(0, 1000), st.sampled_from(["true", "low", "high", "zero"]),
              st.booleans()),
    st.tuples(st.just("swap"), seg_sel, st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("dup"), seg_sel, st.integers(0, 50)),
    st.tuples(st.just("drop"), seg_sel, st.integers(0, 50)),
    st.tuples(st.just("header"), seg_sel, st.sampled_from(["magic", "first+1", "first-1", "short", "empty"])),
    st.tuples(st.just("remove"), seg_sel),
    st.tuples(st.just("other"), seg_sel, st.integers(0, 8)),
    st.tuples(st.just("garbage"), seg_sel, st.binary(max_size=100)),
)  # fmt: skip
ENTRY = struct.Struct(">QQQ")
FIELD_NO = {"offset": 0, "position": 1, "max_ts": 2}


def true_entries(model: Model, name: str) -> list[tuple[int, int, int]]:
    """(offset, position, max_ts as u64) of every frame of a segment."""
    out = []
    mx = NO_TIMESTAMP
    for g in model.segs[name].genuine:
        ts = NO_TIMESTAMP if g.msg.timestamp is None else g.msg.timestamp
        mx = max(mx, ts)
        out.append((g.msg.offset, g.start, mx % 2**64))
    return out


def apply_index_mutation(b: Built, mut: tuple) -> str:  # type: ignore[type-arg]
    model = b.model
    assert model is not None
    names = model.names()
    if not names:
        return "nothing"
    name = pick(names, mut[1])
    seg = model.segs[name]
    path = os.path.join(b.dir, "idx", name[:16] + ".idx")
    try:
        with open(path, "rb") as f:
            raw = bytearray(f.read())
    except FileNotFoundError:
        raw = bytearray(b"SEJIDX01" + struct.pack(">Q", seg.first))
    head, body = raw[:16], raw[16:]
    ents = [list(ENTRY.unpack_from(body, i)) for i in range(0, len(body) - len(body) % 24, 24)]
    tail = body[len(ents) * 24 :]
    real = true_entries(model, name)
    kind = mut[0]
    note = ""
    if kind == "flip":
        if raw:
            p = mut[2] % len(raw)
            raw[p] ^= mut[3]
            note = f"flip byte {p}"
    elif kind == "truncate":
        p = mut[2] % (len(raw) + 1)
        del raw[p:]
        note = f"truncate to {p}"
    elif kind == "garbage":
        raw = bytearray(mut[2])
        note = f"replace with {mut[2].hex()}"
    elif kind == "remove":
        raw = None  # type: ignore[assignment]
        note = "remove"
    elif kind == "header":
        h = mut[2]
        if h == "magic":
            if head:  # a file truncated to nothing has no magic to break
                head[0] ^= 1
        elif h == "first+1":
            head[8:16] = struct.pack(">Q", (seg.first + 1) % 2**64)
        elif h == "first-1":
            head[8:16] = struct.pack(">Q", (seg.first - 1) % 2**64)
        elif h == "short":
            head = head[:11]
            ents, tail = [], b""
        else:
            head, ents, tail = bytearray(), [], b""
        note = f"header {h}"
    elif kind == "other":
        other = pick(names, mut[2])
        try:
            with open(os.path.join(b.dir, "idx", other[:16] + ".idx"), "rb") as f:
                raw = bytearray(f.read())
        except FileNotFoundError:
            raw = bytearray()
        note = f"replaced by the index of {other}"
    else:
        if kind == "entry":
            if not ents:
                ents.append(list(real[0]) if real else [seg.first, 0, NO_TIMESTAMP % 2**64])
            i = len(ents) - 1 if mut[2] < 0 else mut[2] % len(ents)
            f = FIELD_NO[mut[3]]
            how, v = mut[4]
            if how == "abs":
                new = v
            elif how == "rel":
                cur = ents[i][f] - (2**64 if f == 2 and ents[i][f] >= 2**63 else 0)
                new = cur + v
            else:
                new = real[v % len(real)][f] if real else 0
            old = ents[i][f]
            ents[i][f] = new % 2**64
            note = f"entry {i} {mut[3]}: {old} -> {ents[i][f]}"
        elif kind == "embedded":
            emb = [e for e in embed_positions(b) if e[0] == name]
            if not emb:
                return f"embedded: no embedded frame in {name}"
            _, pos, off = emb[mut[3] % len(emb)]
            before = [r for r in real if r[1] < pos]
            ts = {"true": before[-1][2] if before else NO_TIMESTAMP % 2**64, "low": NO_TIMESTAMP % 2**64,
                  "high": INT64_MAX, "first": real[0][2] if real else 0}[mut[4]]  # fmt: skip
            entry = [off, pos, ts % 2**64]
            if mut[2] == -2 or not ents:
                ents.append(entry)
                where = "appended"
            elif mut[2] == -1:  # in order: after the entries before it
                k = sum(1 for e in ents if e[1] < pos)
                ents.insert(k, entry)
                where = f"inserted at {k}"
            else:
                k = mut[2] % len(ents)
                ents[k] = entry
                where = f"replacing entry {k}"
            note = f"embedded frame (offset {off}, byte {pos}, max_ts {ts}) {where}"
        elif kind == "add":
            if not real:
                return f"add: {name} has no frames"
            o, p, ts = real[mut[2] % len(real)]
            ts = {"true": ts, "low": NO_TIMESTAMP % 2**64, "high": INT64_MAX, "zero": 0}[mut[3]]
            e = [o, p, ts]
            if mut[4]:
                ents.append(e)
            else:
                ents.insert(sum(1 for x in ents if x[1] < p), e)
            note = f"add entry {e}"
        elif kind in ("swap", "dup", "drop"):
            if not ents:
                return f"{kind}: no entries"
            i = mut[2] % len(ents)
            if kind == "swap":
                j = mut[3] % len(ents)
                ents[i], ents[j] = ents[j], ents[i]
            elif kind == "dup":
                ents.insert(i, list(ents[i]))
            else:
                del ents[i]
            note = f"{kind} entry {i}"
        raw = head + b"".join(ENTRY.pack(*e) for e in ents) + tail
    if raw is None:
        if os.path.exists(path):
            os.remove(path)
    else:
        with open(path, "wb") as f:
            f.write(raw)
    return f"{name[:16]}.idx: {note}"


@fuzz_settings(ci=250, long=130_000)
@given(
    journal_specs(max_msgs=40, embed=True, embed_deltas=st.integers(-3, 3), sizes=(400, 1200, 3000, 1 << 20),
                  intervals=(64, 128, 256, 4096)),
    st.lists(index_mutations, min_size=1, max_size=4),
    st.data(),
)  # fmt: skip
def test_forged_index_files(spec: JournalSpec, muts: list, data: st.DataObject) -> None:  # type: ignore[type-arg]
    with example_of("index", (spec, muts)), tmpdir() as d, index_interval(spec.interval):
        b = build(os.path.join(d, "j"), spec)
        model = b.model
        assert model is not None
        done = [apply_index_mutation(b, m) for m in muts]
        an = model.analyse()
        assert an.clean
        note(f"index mutations: {done}; {describe_journal(b.dir)}")
        idx = idx_snapshot(b.dir)
        ro_next = check_readers(an, b.dir, data.draw, idx, exact=True)
        if quarantine_files(b.dir) or model.snapshot() != {n: open(model.path(n), "rb").read() for n in model.names()}:
            raise fail("index:readers-changed-segments", "a reader changed a segment file")
        # The writer opens exactly at the end, cuts nothing, then appends more (its index grows
        # from the entries it trusted): every reader is still exact.
        idx_restore(b.dir, idx)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            w, err = call("Writer", sej.Writer, b.dir, segment_size=spec.segment_size)
        if err is not None:
            raise fail("index:recovery-raised", f"Writer() raised {err!r}")
        try:
            if w.recovered is not None or quarantine_files(b.dir):
                raise fail("index:recovery-cut", f"the writer cut valid data because of the index: {w.recovered}")
            if any(issubclass(c.category, sej.CorruptionWarning) for c in caught):
                raise fail("index:recovery-cut", "CorruptionWarning on a valid journal")
            if w.next_offset != an.next:
                raise fail("index:recovery-opened-at", f"the writer opened at {w.next_offset}, expected {an.next}")
            extra = data.draw(st.lists(st.tuples(timestamps, small_values), max_size=12))
            for ts, v in extra:
                if w.next_offset >= MAX_OFFSET:
                    break
                w.append(v, timestamp=ts)
        finally:
            call("Writer.close", w.close)
        if model.snapshot() != {n: open(model.path(n), "rb").read()[: len(model.segs[n].data)] for n in model.names()}:
            raise fail("index:recovery-cut", "opening the writer changed bytes of the segments")
        model.reload()
        an2 = model.analyse()
        if not an2.clean or an2.P[: len(an.P)] != an.P or len(an2.P) != len(an.P) + len(extra):
            raise fail("index:append-after", f"after appending {len(extra)} messages the journal holds "
                       f"{len(an2.P)} ({an2.chain_problem}), expected {len(an.P) + len(extra)}")  # fmt: skip
        check_readers(an2, b.dir, data.draw, idx_snapshot(b.dir), exact=True)
        del ro_next


# =================================================================================================
# 4. The CLI on mutated journals
# =================================================================================================

RUNNER = CliRunner()


@dataclass
class CliResult:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str


def run_cli(*args: str, seconds: float | None = None) -> CliResult:
    name = args[0] + ("".join(" " + a for a in args[2:]) if len(args) > 2 else "")
    problem = None
    try:
        with bounded(f"sej {name}", seconds):
            r = RUNNER.invoke(cli, list(args))
    except Hang as e:  # not an Exception: CliRunner lets it through
        problem = (f"hang:sej {args[0]}", str(e))
        forget_frames(e)
    except Exception as e:  # CliRunner catches the command's exceptions: this is the runner itself
        problem = (f"cli-untyped:{args[0]}", f"sej {' '.join(args)} raised {type(e).__name__}: {e}")
        forget_frames(e)
    if problem is not None:
        raise fail(*problem)
    if r.exception is not None:
        forget_frames(r.exception)
    out, err = r.stdout, r.stderr
    what = f"sej {' '.join(args)}"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise fail(f"cli-untyped:{args[0]}", f"{what}: {type(r.exception).__name__}: {r.exception}")
    if r.exit_code not in (0, 1, 2):
        raise fail(f"cli-exit:{args[0]}", f"{what} exited {r.exit_code}; stderr {err!r}")
    if "Traceback" in out or "Traceback" in err:
        raise fail(f"cli-traceback:{args[0]}", f"{what} printed a traceback: {err[-2000:]}")
    lines = err.splitlines()
    if r.exit_code != 0:
        if len(lines) != 1 or not lines[0].startswith("sej: error: "):
            raise fail(f"cli-stderr:{args[0]}", f"{what} exited {r.exit_code} with stderr {err!r}")
    elif err:
        raise fail(f"cli-stderr:{args[0]}", f"{what} exited 0 with stderr {err!r}")
    if "internal error" in err:
        raise fail(f"cli-internal-error:{args[0]}", f"{what}: {err.strip()}")
    return CliResult(tuple(args), r.exit_code, out, err)


def json_lines(r: CliResult) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def value_of(obj: dict) -> bytes:  # type: ignore[type-arg]
    import base64

    v = obj["value"]
    return base64.b64decode(v) if obj.get("value_encoding") == "base64" else v.encode("utf-8")


def check_counts_agree(scan_r: CliResult, count_rs: list[CliResult], what: str) -> int | None:
    """scan fails => count fails; scan succeeds => count gives the number of lines scan printed."""
    n = len(json_lines(scan_r)) if scan_r.code == 0 else None
    for c in count_rs:
        if scan_r.code != 0 and c.code == 0:
            raise fail("cli-disagree:count-succeeds-when-scan-fails",
                       f"{what}: `sej {' '.join(scan_r.args)}` failed ({scan_r.stderr.strip()}) but "
                       f"`sej {' '.join(c.args)}` printed {c.stdout.strip()} and exited 0")  # fmt: skip
        if scan_r.code == 0 and (c.code != 0 or c.stdout.strip() != str(n)):
            raise fail("cli-disagree:count", f"{what}: scan printed {n} messages, `sej {' '.join(c.args)}` "
                       f"exited {c.code} with {c.stdout.strip()!r} {c.stderr.strip()!r}")  # fmt: skip
    return n


@fuzz_settings(ci=150, long=130_000)
@given(
    journal_specs(max_msgs=25, embed=True),
    st.lists(segment_mutations, max_size=2),
    st.lists(index_mutations, max_size=2),
    st.data(),
)
def test_cli_on_mutated_journals(spec: JournalSpec, smuts: list, imuts: list, data: st.DataObject) -> None:  # type: ignore[type-arg]
    with example_of("cli", (spec, smuts, imuts)), tmpdir() as d, index_interval(spec.interval):
        b = build(os.path.join(d, "j"), spec)
        model = b.model
        assert model is not None
        done = [apply_segment_mutation(model, m) for m in smuts] + [apply_index_mutation(b, m) for m in imuts]
        an = model.analyse()
        j = b.dir
        note(f"mutations: {done}; reference: clean={an.clean} ({an.chain_problem}), P={len(an.P)}; "
             f"{describe_journal(j)}")  # fmt: skip
        idx = idx_snapshot(j)

        def cmd(*args: str) -> CliResult:
            idx_restore(j, idx)
            return run_cli(*args)

        sc = cmd("scan", j)
        if sc.code == 0:
            objs = json_lines(sc)
            got = [Message(o["offset"], o["timestamp"], o["type"], b"", value_of(o)) for o in objs]
            if [m.offset for m in got] != list(range(an.first, an.first + len(got))):
                raise fail("cli-scan:order", f"scan printed offsets {[m.offset for m in got][:20]}")
            for m in got:
                if not any(m.value == x.value and m.timestamp == x.timestamp for x in an.V.get(m.offset, ())):
                    raise fail("cli-scan:wrong-data", f"scan printed {short(m)}, not a message of the journal")
            if an.clean and len(got) != len(an.P):
                raise fail("cli-scan:count", f"scan printed {len(got)} messages of a valid journal of {len(an.P)}")
        elif an.clean and an.segments:
            raise fail("cli-scan:raised-on-valid", f"scan failed on a valid journal: {sc.stderr.strip()}")
        n = check_counts_agree(sc, [cmd("count", j), cmd("scan", j, "--count")], "whole journal")

        ts = [m.timestamp for ms in an.V.values() for m in ms if m.timestamp is not None]
        t = str(data.draw(st.sampled_from(ts))) if ts else str(T0)
        sct = cmd("scan", j, "--start", t)
        check_counts_agree(sct, [cmd("count", j, "--start", t)], f"--start {t}")
        k = str(data.draw(st.integers(an.first, max(an.first, an.next))))
        scf = cmd("scan", j, "--from", k)
        check_counts_agree(scf, [cmd("count", j, "--from", k)], f"--from {k}")

        ver = cmd("verify", j)
        problems = not an.clean or any(w[0].status != "clean" for w in an.walks.values()) or sums_disagree(j)
        if (ver.code == 0) == problems:
            found = f"problems: {an.chain_problem}" if problems else "none"
            raise fail("cli-verify", f"verify exited {ver.code}, the reference finds {found}: {ver.stdout[-500:]!r}")
        st_r = cmd("stat", j, "--json")
        dumps = []
        for seg in an.segments:
            dr = cmd("dump", model.path(seg.name))
            w0 = an.walks[seg.name][0]
            if (dr.code == 0) != (w0.status == "clean"):
                raise fail("cli-dump", f"dump {seg.name} exited {dr.code}, the segment is {w0.status} at byte {w0.end}")
            if len(json_lines(dr)) != len(w0.frames):
                raise fail("cli-dump", f"dump {seg.name} printed {len(json_lines(dr))} messages before stopping, "
                           f"the segment holds {len(w0.frames)} valid ones from its start")  # fmt: skip
            dumps.append(len(w0.frames))
            cmd("file", model.path(seg.name))
        cmd("tail", j, "-n", "3")
        if ver.code == 0:
            if sc.code != 0 or st_r.code != 0:
                raise fail("cli-disagree:verify", f"verify passed but scan exited {sc.code}, stat {st_r.code}")
            doc = json.loads(st_r.stdout)
            if doc["messages"] != n or sum(dumps) != n:
                raise fail("cli-disagree:verify", f"verify passed; scan printed {n}, stat says {doc['messages']}, "
                           f"the dumps {sum(dumps)}")  # fmt: skip

        # verify --repair cuts the last segment's bad tail exactly as the writer would, keeping the bytes.
        snap = model.snapshot()
        q0 = quarantine_files(j)
        idx_restore(j, idx)
        rep = run_cli("verify", j, "--repair")
        new_q = quarantine_files(j) - q0
        names = model.names()
        for name in names:
            with open(model.path(name), "rb") as f:
                now = f.read()
            if now == snap[name]:
                continue
            if name != names[-1]:
                raise fail("cli-repair", f"verify --repair changed {name}, not the last segment")
            qs = [q for q in new_q if q.startswith(name + ".cut-")]
            if len(qs) != 1:
                raise fail("cli-repair", f"verify --repair cut {name} and left quarantine files {new_q}")
            c = int(qs[0].split(".cut-")[1].split("-")[0])
            with open(os.path.join(j, "jnl", qs[0]), "rb") as f:
                cut = f.read()
            if now != snap[name][:c] or cut != snap[name][c:]:
                raise fail("cli-repair:lost-bytes", f"verify --repair cut {name} at {c} without keeping the bytes")
            if c < an.last_e0:
                raise fail("cli-repair:cut-valid-data", f"verify --repair cut {name} at {c}, but it is valid "
                           f"from byte 0 to {an.last_e0}")  # fmt: skip
        del rep
