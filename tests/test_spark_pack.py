"""Packing segment pieces into partitions (plan.pack), in batch and streaming, without Spark.

The readers' `partitions()` and `read()` run in this process, as Spark's Python workers run
them: every offset of every journal must be read exactly once across packed and split
partitions, whatever the bounds, the sizes and the packing options, and the rows must be
what `sej.Scanner` reads.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import sej  # noqa: E402
from sej.spark.batch import SejBatchReader  # noqa: E402
from sej.spark.plan import PackedPart, SegmentPart, pack  # noqa: E402
from sej.spark.read import read_partition  # noqa: E402
from sej.spark.stream import SejStreamReader  # noqa: E402

TS = 1_700_000_000 * 10**9


def rows_of(parts: list) -> list[tuple[str | None, str, int, int, bytes]]:  # type: ignore[type-arg]
    """(client, shard, offset, type, value) of every row the partitions read."""
    out = []
    for p in parts:
        for b in read_partition(p):
            cols = [b.column(c).to_pylist() for c in ("client", "shard", "offset", "type", "value")]
            out += list(zip(*cols))
    return out


def hub_root(root: str, journals: list[tuple[int, int]]) -> dict[str, list[sej.Message]]:
    """Journals `c<i>.ev.1.00<i%2>` with (messages, segment size) each; their messages by name."""
    out = {}
    for i, (n, seg_size) in enumerate(journals):
        name = f"c{i}.ev.1.00{i % 2}"
        with sej.Writer(os.path.join(root, name), segment_size=seg_size) as w:
            for k in range(n):
                w.append(b"v%d" % k * (1 + k % 7), type=k % 3, timestamp=TS + k * 1000)
        with sej.Scanner(os.path.join(root, name), "first", timeout=0) as s:
            out[name] = list(s)
    return out


journal_shapes = st.lists(st.tuples(st.integers(0, 60), st.sampled_from([1, 100, 400, 5000])), min_size=1, max_size=6)
packing = st.tuples(st.sampled_from([1, 150, 1000, 64 << 20]), st.sampled_from([0, 1, 200, 4 << 20]), st.integers(1, 5))


def packing_options(p: tuple[int, int, int]) -> dict[str, str]:
    return {"maxbytesperpartition": str(p[0]), "opencostinbytes": str(p[1]), "minpartitions": str(p[2])}


@settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(journal_shapes, packing, st.data())
def test_batch_reads_every_offset_once(shapes: list[tuple[int, int]], p: tuple[int, int, int], data) -> None:  # type: ignore[no-untyped-def]
    root = tempfile.mkdtemp()
    try:
        msgs = hub_root(root, shapes)
        options = {"path": root, **packing_options(p)}
        starting, ending = {}, {}
        for name, ms in msgs.items():  # bounds on some journals
            if ms and data.draw(st.booleans()):
                starting[name] = data.draw(st.sampled_from([-2, -1, ms[0].offset, ms[len(ms) // 2].offset]))
                ending[name] = data.draw(st.sampled_from([-1, ms[-1].offset + 1, ms[len(ms) // 3].offset]))
        if starting:
            options["startingoffsets"], options["endingoffsets"] = json.dumps(starting), json.dumps(ending)
        types = data.draw(st.sampled_from([None, "0", "1,2"]))
        if types is not None:
            options["type"] = types
        start_time = data.draw(st.sampled_from([None, TS + 5000]))
        if start_time is not None:
            options["starttime"] = str(start_time)
        parts = SejBatchReader(options).partitions()
        got = rows_of(parts)
        want = []
        for name, ms in msgs.items():
            client, shard = name.split(".", 1)
            lo = {-2: 0, -1: len(ms)}.get(starting.get(name, -2), starting.get(name, -2))
            hi = {-1: len(ms)}.get(ending.get(name, -1), ending.get(name, -1))
            for m in ms:
                if not lo <= m.offset < hi or (start_time is not None and m.timestamp < start_time):
                    continue
                if types is None or m.type in {int(t) for t in types.split(",")}:
                    want.append((client, shard, m.offset, m.type, m.value))
        assert Counter(got) == Counter(want)
        assert len(got) == len(set(got))  # nothing read twice
        # Packing never makes more partitions than pieces, and packs whenever pieces are small.
        pieces = [q for part in parts for q in (part.parts if isinstance(part, PackedPart) else (part,))]
        assert len(parts) <= len(pieces)
    finally:
        shutil.rmtree(root)


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(journal_shapes, packing, st.integers(0, 40), st.data())
def test_stream_micro_batches_read_every_offset_once(shapes: list[tuple[int, int]], p: tuple[int, int, int],
                                                     extra: int, data) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    root = tempfile.mkdtemp()
    try:
        msgs = hub_root(root, shapes)
        options = {"path": root, "maxrecordspertrigger": "17", **packing_options(p)}
        types = data.draw(st.sampled_from([None, "0", "1,2"]))
        if types is not None:
            options["type"] = types
        start_at = {}  # where each journal there at the start is read from
        bound = data.draw(st.sampled_from([None, "time", "offsets"]))
        if bound == "time":  # timestamps grow by 1000 ns per message: offset 5 on
            options["starttime"] = str(TS + 5000)
            start_at = {name: min(5, len(ms)) for name, ms in msgs.items()}
        elif bound == "offsets":
            start_at = {name: data.draw(st.integers(0, len(ms))) for name, ms in msgs.items()}
            options["startingoffsets"] = json.dumps(start_at)
        reader = SejStreamReader(options)
        start = reader.initialOffset()
        got = []
        for step in range(200):
            if step == 2:  # a journal appears between micro-batches, and one grows
                later = hub_root(os.path.join(root, "later"), [(extra, 300)])
                for name, ms in later.items():
                    os.rename(os.path.join(root, "later", name), os.path.join(root, "z" + name))
                    msgs["z" + name] = ms  # read from its first offset, whatever the start options
                os.rmdir(os.path.join(root, "later"))
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            got += rows_of(list(reader.partitions(start, end)))
            if end == start and step > 2:
                break
            start = end
        keep = None if types is None else {int(t) for t in types.split(",")}
        want = [
            (n.split(".", 1)[0], n.split(".", 1)[1], m.offset, m.type, m.value)
            for n, ms in msgs.items()
            for m in ms
            if m.offset >= start_at.get(n, 0) and (keep is None or m.type in keep)
        ]
        assert Counter(got) == Counter(want) and len(got) == len(set(got))
    finally:
        shutil.rmtree(root)


def piece(path: str, size: int, first: int = 0) -> SegmentPart:
    return SegmentPart(path=path, client=None, shard="s", first=first, start=0, end=size, lo=0, hi=1 << 62, types=None)


def test_pack_fills_partitions_as_spark_packs_small_files() -> None:
    small = [piece(f"/j{i}", 1000) for i in range(1000)]
    parts = pack(small, max_bytes=64 << 20, open_cost=4 << 20, min_partitions=2)
    # Pieces weigh ~4 MiB each (the open cost): 15 fit in a split of 64 MiB (min_partitions asks for less), so
    # Spark would make 67 partitions; rounded up to a multiple of min_partitions, 68, filled evenly.
    assert (64 << 20) // (1000 + (4 << 20)) == 15 and len(parts) == 68
    assert {len(q.parts) for q in parts} == {14, 15}  # type: ignore[union-attr]
    assert sorted(q.path for part in parts for q in part.parts) == sorted(p.path for p in small)  # type: ignore[union-attr]
    # Without an open cost, 25 MB of small pieces still spread over min_partitions tasks.
    parts = pack([piece(f"/j{i}", 25_000) for i in range(1000)], 64 << 20, 0, min_partitions=2)
    assert len(parts) == 2
    # A piece bigger than the split size is a partition of its own; pack never cuts one.
    big = piece("/big", 100 << 20)
    parts = pack([big, *small[:3]], 64 << 20, 0, 1)
    assert parts[0] is big and isinstance(parts[1], PackedPart) and len(parts) == 2
    assert pack([], 1, 0, 1) == []


def test_pack_balances_the_partitions_over_the_cores() -> None:
    """Five partitions' worth on 2 cores is 6 partitions of 5/6 each (2.5 rounds of work, not 3); no partition
    outweighs the split size, and every piece is in one."""
    pieces = [piece(f"/j{i}", 50_000 + 997 * (i % 50)) for i in range(1800)]
    split = 128 << 20
    parts = pack(pieces, split, 256 << 10, min_partitions=2)
    weights = [sum(q.end - q.start + (256 << 10) for q in part.parts) for part in parts]  # type: ignore[union-attr]
    assert sum(weights) // split + 1 == 5 and len(parts) == 6
    assert max(weights) <= split and max(weights) - min(weights) <= (256 << 10) + 50_000 + 997 * 49
    assert sorted(q.path for part in parts for q in part.parts) == sorted(p.path for p in pieces)  # type: ignore[union-attr]
    # A big piece stays whole and alone; the rest still spread evenly.
    parts = pack([piece("/big", 300 << 20), *pieces[:100]], split, 0, min_partitions=4)
    alone = [p for p in parts if not isinstance(p, PackedPart)]
    assert len(alone) == 1 and alone[0].path == "/big"
    paths = sorted(q.path for p in parts for q in getattr(p, "parts", (p,)))
    assert paths == sorted(["/big", *(p.path for p in pieces[:100])])


def test_pack_never_makes_more_partitions_than_spark_s_count_rounded_to_the_cores() -> None:
    """Pieces near half the split size fit in no balanced partition: Spark's own partitions are kept then (the
    balanced fill gave up to 1.6x as many, each a lone piece); a huge minPartitions asks for no more partitions
    than pieces."""
    rng = random.Random(5)
    for case in range(200):
        sizes = [
            rng.choice((rng.randrange(1, 60 << 20), rng.randrange(38 << 20, 50 << 20)))
            for _ in range(rng.randint(1, 300))
        ]
        mp = rng.choice((1, 2, 3, 8))
        pieces = [piece(f"/j{i}", s) for i, s in enumerate(sizes)]
        parts = pack(pieces, 128 << 20, 256 << 10, min_partitions=mp)
        weights = sorted((s + (256 << 10) for s in sizes), reverse=True)
        split = min(128 << 20, max(256 << 10, sum(weights) // mp))
        count, size = 1, 0
        for w in weights:
            if size and size + w > split:
                count, size = count + 1, 0
            size += w
        assert len(parts) <= min(len(sizes), -(-count // mp) * mp), case
        assert sorted(q.path for p in parts for q in getattr(p, "parts", (p,))) == sorted(p.path for p in pieces)
    assert len(pack([piece(f"/j{i}", 10) for i in range(10)], 128 << 20, 0, min_partitions=10**6)) == 10
