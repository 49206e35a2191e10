"""Bit flips in checksummed journals: the journals, the positions and the flip loop shared by the detection tests.

Each reader of checksums (`Scanner(verify=True)`, `sej verify`, the hub's copy, the Spark source) is tested
the same way: a journal written with flushes at random points (so partial checksum records exist), one bit
flipped at a time at positions spread over keys, values, frame headers and checksum files, and the reader
run once per flip. `flips` yields each flip applied and undoes it afterwards.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import sej
from sej.checksum import check_segment
from sej.layout import list_segments, sum_path

KINDS = ("key", "value", "header", "sums")
"""Where flips land: message keys, values, frame headers (offset, timestamp, type, sizes) and checksum files."""


def write_journal(dir: str, n: int = 2500, seed: int = 7, segment_size: int = 160 << 10) -> list[tuple[bytes, bytes]]:
    """Messages of 0..600 bytes with flushes at random points (partial records); returns (key, value)s."""
    rng = random.Random(seed)
    msgs = []
    with sej.Writer(dir, segment_size=segment_size) as w:
        for i in range(n):
            key, value = b"k%d" % i, rng.randbytes(rng.randrange(600))
            w.append(value, key=key, timestamp=i)
            msgs.append((key, value))
            if rng.random() < 0.02:
                w.flush()
    return msgs


def copy_to_hub(producer: Path, hub: Path, journal: str = "ev", client: str = "c1") -> str:
    """Copy the journal `producer/journal` into the hub root `hub` (the local transport); its hub directory."""
    from sej.hub.copy import copy_journal
    from sej.hub.local_source import LocalSource

    hub.mkdir(exist_ok=True)
    source = LocalSource(str(producer))
    try:
        copy_journal(source, journal, str(hub), client, "hub")
    finally:
        source.close()
    return str(hub / f"{client}.{journal}")


def fully_checked(dir: str) -> None:
    """Assert that every byte of every segment of the journal is covered by a checksum that matches."""
    for seg in list_segments(dir):
        r = check_segment(seg.path, sum_path(dir, seg.first_offset), seg.first_offset)
        assert r.has_sums and r.checked == r.size and not r.errors, r


def flip_positions(dir: str, rng: random.Random, count: int) -> list[tuple[str, int, str]]:
    """(file, position, kind) over keys, values, frame headers and checksum files, `count` of them in turn."""
    spots: dict[str, list[tuple[str, int]]] = {k: [] for k in KINDS}
    for seg in list_segments(dir):
        data = Path(seg.path).read_bytes()
        pos = 0
        while pos < len(data):
            ks = data[pos + 17]
            vs = int.from_bytes(data[pos + 18 + ks : pos + 22 + ks], "big")
            total = 26 + ks + vs
            spots["header"] += [(seg.path, pos + i) for i in range(18)]
            spots["key"] += [(seg.path, pos + 18 + i) for i in range(ks)]
            spots["value"] += [(seg.path, pos + 22 + ks + i) for i in range(vs)]
            spots["header"] += [(seg.path, pos + 18 + ks + i) for i in range(4)]
            spots["header"] += [(seg.path, pos + total - 4 + i) for i in range(4)]
            pos += total
        spath = sum_path(dir, seg.first_offset)
        spots["sums"] += [(spath, i) for i in range(os.path.getsize(spath))]
    out = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        path, pos = rng.choice(spots[kind])
        out.append((path, pos, kind))
    return out


def flip(path: str, pos: int, bit: int) -> None:
    """Invert one bit of a file in place (twice restores it)."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ (1 << bit)]))


def segment_of(dir: str, path: str) -> sej.Segment:
    """The segment of a journal that a segment file or a checksum file belongs to."""
    name = os.path.basename(path)[:16]
    return next(s for s in list_segments(dir) if os.path.basename(s.path)[:16] == name)


class Flip:
    """One flipped bit: `path`, `pos` and `kind` (one of KINDS), in the segment `segment`."""

    def __init__(self, dir: str, path: str, pos: int, kind: str, bit: int) -> None:
        self.path, self.pos, self.kind, self.bit = path, pos, kind, bit
        self.segment = segment_of(dir, path)
        self.applied = False

    def apply(self) -> None:
        if not self.applied:
            flip(self.path, self.pos, self.bit)
            self.applied = True

    def undo(self) -> None:
        if self.applied:
            flip(self.path, self.pos, self.bit)
            self.applied = False

    def __repr__(self) -> str:
        return f"Flip({self.kind} {self.path} byte {self.pos} bit {self.bit})"


def flips(dir: str, count: int, seed: int) -> Iterator[Flip]:
    """`count` flips in the journal `dir`, each applied while the loop body runs and undone after."""
    rng = random.Random(seed)
    for path, pos, kind in flip_positions(dir, rng, count):
        f = Flip(dir, path, pos, kind, rng.randrange(8))
        f.apply()
        try:
            yield f
        finally:
            f.undo()


def count_kinds(caught: dict[str, int], f: Flip) -> None:
    caught[f.kind] = caught.get(f.kind, 0) + 1


__all__ = ["KINDS", "Flip", "copy_to_hub", "count_kinds", "flip", "flip_positions", "flips", "fully_checked",
           "segment_of", "write_journal"]  # fmt: skip
