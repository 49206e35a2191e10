"""Planning Spark partitions: which byte ranges of which segments hold an offset range."""

from __future__ import annotations

import glob
import heapq
import os
import stat
from collections.abc import Sequence
from typing import NamedTuple

from pyspark.sql.datasource import InputPartition

from ..errors import InvalidArgumentError, UnsafeFileError
from ..fsutil import kind, open_file
from ..layout import Segment, index_path, list_segments, sum_path
from ..segment import seek_index
from ..shard.name import split_name
from ..shard.root import find_journals
from .options import MAX_BYTES_PER_PARTITION, OPEN_COST_IN_BYTES


class JournalSource(NamedTuple):
    """One journal under the loaded path that a read takes rows from.

    `name` is its name in the offset options: its directory's name under a root, "" for a lone
    journal (its directory's name when several paths are loaded), its path with includeRoot.
    `path` is its directory; `client`, `shard` and `root` are its rows' column values (`root`:
    the loaded path it was found under, None without includeRoot).
    """

    name: str
    path: str
    client: str | None
    shard: str
    root: str | None = None


def expand_paths(paths: Sequence[str]) -> list[str]:
    """The loaded paths: each path, or what a glob pattern matches (sorted), without repeats.

    A path that exists is taken as it is, even if it holds glob characters. A pattern that
    matches nothing is an error, as in Spark's file sources.
    """
    out: list[str] = []
    seen: set[str] = set()
    for p in paths:
        found = [p]
        if not os.path.lexists(p) and glob.has_magic(p):
            found = sorted(glob.glob(p))
            if not found:
                raise InvalidArgumentError(f"path {p!r} matches nothing")
        for f in found:
            real = os.path.realpath(f)
            if real not in seen:
                seen.add(real)
                out.append(f)
    return out


def find_sources(paths: str | Sequence[str], *, include_root: bool = False) -> list[JournalSource]:
    """The journals under `paths`: journals, sharded roots, hub roots, or glob patterns of them.

    A journal name found under two loaded paths is an error naming both, unless `include_root`:
    then journals are named by their paths and the root column tells them apart.
    """
    roots = expand_paths([paths] if isinstance(paths, str) else paths)
    several = len(roots) > 1
    out: list[JournalSource] = []
    where: dict[str, str] = {}
    for root in roots:
        for j in find_journals(root):
            base = os.path.basename(os.path.normpath(j.path))
            name = j.path if include_root else j.name or (base if several else "")
            if name in where and include_root:
                raise InvalidArgumentError(f"journal {j.path} is in two of the loaded paths; load it once")
            if name in where:
                raise InvalidArgumentError(
                    f"journal {name or base!r} is in two of the loaded paths: {where[name]} and {j.path}; "
                    "load each journal once, or set option includeRoot=true to read both "
                    "(the root column then tells them apart)"
                )
            where[name] = j.path
            client, shard = split_name(j.name or (base if several else ""))
            out.append(JournalSource(name, j.path, client, shard or base, root if include_root else None))
    return out


class SegmentPart(InputPartition):
    """Frames of one segment: byte range [start, end) starting at message `first`, kept if in [lo, hi).

    `upto`: the partition must reach this offset (or hi) or its segment is damaged.
    `missing_ok`: a segment deleted (by retention) before it is read yields nothing instead of failing.
    `sums`: the segment's checksum file, to check the bytes against before decoding them (option
    verifyChecksums); None: not checked. `segment_first`: the segment's first offset (the file's header).
    """

    def __init__(
        self,
        *,
        path: str,
        client: str | None,
        shard: str,
        root: str | None = None,
        first: int,
        start: int,
        end: int,
        lo: int,
        hi: int,
        types: tuple[int, ...] | None,
        upto: int | None = None,
        missing_ok: bool = False,
        sums: str | None = None,
        segment_first: int | None = None,
    ) -> None:
        super().__init__(path)
        self.path, self.client, self.shard, self.root = path, client, shard, root
        self.first, self.start, self.end = first, start, end
        self.lo, self.hi, self.types = lo, hi, types
        self.upto = hi if upto is None else min(hi, upto)
        self.missing_ok = missing_ok
        self.sums = sums
        self.segment_first = first if segment_first is None else segment_first


class PackedPart(InputPartition):
    """Several small pieces (SegmentParts, of any journals) that one task reads one after the other."""

    def __init__(self, parts: tuple[SegmentPart, ...]) -> None:
        super().__init__(len(parts))
        self.parts = parts


def pack(
    parts: list[SegmentPart], max_bytes: int, open_cost: int = OPEN_COST_IN_BYTES, min_partitions: int = 1
) -> list[SegmentPart | PackedPart]:
    """Spark's packing of small files, for segment pieces: few tasks for many small journals, balanced over cores.

    Each piece weighs its bytes plus `open_cost`. The split size is `max_bytes`, lowered so that the
    pieces fill at least `min_partitions` partitions when there is enough to read (as Spark lowers
    it to the bytes per core). As many partitions as pieces, biggest first, fill up to the split size
    (Spark's count), rounded up to a multiple of `min_partitions` (at most one per piece), are then
    filled evenly: each piece, biggest first, goes to the lightest partition, so that every core gets
    the same share (5 full partitions on 2 cores run in 3 rounds; 6 of 5/6 each, in 2.5). Should a
    piece fit in none under the split size (pieces near half of it), Spark's own partitions are kept.
    A piece is never cut here (plan_range cut big segments at index entries already), so every offset
    is in exactly one partition.
    """
    if not parts:
        return []
    pieces = sorted(zip([p.end - p.start + open_cost for p in parts], parts, strict=True), key=lambda wp: -wp[0])
    split = min(max_bytes, max(open_cost, sum(w for w, _ in pieces) // max(1, min_partitions)))
    spark: list[list[SegmentPart]] = [[]]  # Spark's partitions: next fit, biggest first
    size = 0
    for w, p in pieces:
        if size and size + w > split:
            spark.append([])
            size = 0
        spark[-1].append(p)
        size += w
    step = max(1, min_partitions)
    count = min(len(pieces), -(-len(spark) // step) * step)
    bins: list[list[SegmentPart]] = [[] for _ in range(count)]
    lightest = [(0, i) for i in range(count)]  # a heap of (weight, bin)
    for w, p in pieces:
        load, i = lightest[0]
        if load and load + w > split:  # fits in none (pieces near half the split): Spark's partitions, then
            bins = spark
            break
        bins[i].append(p)
        heapq.heapreplace(lightest, (load + w, i))
    return [b[0] if len(b) == 1 else PackedPart(tuple(b)) for b in bins if b]


def plan_range(
    src: JournalSource,
    lo: int,
    hi: int,
    *,
    types: tuple[int, ...] | None = None,
    max_bytes: int = MAX_BYTES_PER_PARTITION,
    segments: list[Segment] | None = None,
    missing_ok: bool = False,
    verify: bool = False,
) -> list[SegmentPart]:
    """Partitions reading offsets [lo, hi) of one journal, a segment or an index-cut piece of one each.

    With `verify`, each partition checks its bytes against the segment's checksums.
    """
    if lo >= hi:
        return []
    if segments is None:
        segments = list_segments(src.path)
    parts: list[SegmentPart] = []
    for i, seg in enumerate(segments):
        seg_end = segments[i + 1].first_offset if i + 1 < len(segments) else hi
        if seg_end <= lo or seg.first_offset >= hi:
            continue
        try:
            cuts = _cuts(src.path, seg, i == len(segments) - 1, max_bytes)
        except FileNotFoundError:
            if missing_ok:
                continue
            raise
        for k, (pos, first, end) in enumerate(cuts):
            nxt_first = cuts[k + 1][1] if k + 1 < len(cuts) else None
            if nxt_first is not None and nxt_first <= lo:
                continue
            if first >= hi:
                break
            upto = nxt_first if nxt_first is not None else seg_end  # a sealed piece holds everything up to here
            parts.append(SegmentPart(path=seg.path, client=src.client, shard=src.shard, root=src.root,
                                     first=first, start=pos, end=end, lo=lo, hi=hi, types=types, upto=upto,
                                     missing_ok=missing_ok, segment_first=seg.first_offset,
                                     sums=sum_path(src.path, seg.first_offset) if verify else None))  # fmt: skip
    return parts


def _cuts(jpath: str, seg: Segment, is_last: bool, max_bytes: int) -> list[tuple[int, int, int]]:
    """(start byte, first offset, end byte) pieces of a segment, cut at index entries every ~max_bytes."""
    st = os.lstat(seg.path)  # the size of a small segment needs no open
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(seg.path, kind(st.st_mode))
    if st.st_size <= max_bytes:
        return [(0, seg.first_offset, st.st_size)]
    with open_file(seg.path) as f:
        size = os.fstat(f.fileno()).st_size
        index = seek_index(index_path(jpath, seg.first_offset), seg, f.fileno(), size, is_last)
    cuts = [(0, seg.first_offset)]
    for k in range(len(index)):
        e = index[k]
        if e.position - cuts[-1][0] >= max_bytes:
            cuts.append((e.position, e.offset))
    return [(pos, first, cuts[k + 1][0] if k + 1 < len(cuts) else size) for k, (pos, first) in enumerate(cuts)]


__all__ = [
    "MAX_BYTES_PER_PARTITION",
    "OPEN_COST_IN_BYTES",
    "JournalSource",
    "PackedPart",
    "SegmentPart",
    "expand_paths",
    "find_sources",
    "pack",
    "plan_range",
    "split_name",
]
