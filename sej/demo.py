"""The main job on an embedded default: a producer process writes a journal, this process tails it.

    python -m sej.demo [--dir DIR] [--messages N] [--segment-size BYTES]

The producer appends JSON messages with keys and types and rolls segments over;
the consumer follows it with a Scanner, commits its reader offset as it goes,
and prints what it read.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time

from . import Offset, Scanner, Writer, list_segments, next_offset


def produce(dir: str, count: int, segment_size: int) -> None:
    with Writer(dir, segment_size=segment_size, durability="flush") as w:
        for i in range(count):
            value = json.dumps({"n": i, "sensor": f"s{i % 4}", "reading": round(20 + (i % 17) * 0.25, 2)})
            w.append(value.encode(), key=b"s%d" % (i % 4), type=i % 3)
            if i % 50 == 49:
                time.sleep(0.01)  # a producer that writes in bursts
        w.sync()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sej.demo", description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="journal directory (default: a new temporary one)")
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--segment-size", type=int, default=64 << 10)
    args = p.parse_args(argv)
    dir = args.dir or os.path.join(tempfile.mkdtemp(prefix="sej-demo-"), "journal")
    os.makedirs(dir, exist_ok=True)
    print(f"journal: {dir}")

    ctx = multiprocessing.get_context("spawn")
    producer = ctx.Process(target=produce, args=(dir, args.messages, args.segment_size))
    t0 = time.monotonic()
    producer.start()
    per_type = [0, 0, 0]
    read = 0
    with Offset(dir, "demo-consumer") as committed, Scanner(dir, committed.value, timeout=2.0) as scanner:
        for m in scanner:
            read += 1
            per_type[m.type] += 1
            if m.offset < 3 or m.offset % 500 == 0:
                print(f"  offset {m.offset:>6}  type {m.type}  key {m.key.decode():<3} {m.value.decode()}")
            if read % 256 == 0:
                committed.commit(scanner.offset)
            if read == args.messages:
                break
        committed.commit(scanner.offset)
        committed_at = committed.value
    producer.join(30)
    elapsed = time.monotonic() - t0
    segments = list_segments(dir)
    print(
        f"read {read} of {args.messages} messages in {elapsed:.2f} s from {len(segments)} segments; "
        f"per type {per_type}; reader offset committed at {committed_at}; journal next offset {next_offset(dir)}"
    )
    ok = producer.exitcode == 0 and read == args.messages == committed_at
    if not ok:
        print("demo FAILED: the consumer did not read every message", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
