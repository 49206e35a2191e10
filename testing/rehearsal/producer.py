"""A rehearsal producer: `ShardedWriter`s under one root, appends of varied sizes in bursts, every ack logged.

Run as `python -m testing.rehearsal.producer ROOT NAME INCARNATION SEED START ACKS [OPTIONS as JSON]`.
Producer NAME owns the prefixes NAME-0, NAME-1, ...; a new one opens every `grow_every` seconds from
START (new journals appearing) up to `prefixes`; every third prefix is idle, appending one message a
minute or so. A burst is appended, `sync()`ed, then logged to ACKS, one line per message:
`<journal> <offset> <id> <acked, time.time()>`: only then is it acknowledged (a line a kill cut short is
ended by the next incarnation, and acknowledges nothing). A message's value starts
with its id, `NAME.INCARNATION.SEQ|`, unique across restarts (the incarnation is the harness's count).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time

import sej
from sej.shard.name import format_shard

SIZE_MEDIAN = 200  # log-normal message sizes: median 200 bytes, 10 bytes to 16 KiB
SIZE_SIGMA = 1.0


# Printable payloads (JSON-like text), sliced from one random block: cheap, and the id stays readable.
_TEXT = bytes(random.Random(0).choices(b'abcdefghijklmnopqrstuvwxyz0123456789 {}:,"', k=1 << 16))


def value_size(rng: random.Random) -> int:
    return max(10, min(16384, int(rng.lognormvariate(math.log(SIZE_MEDIAN), SIZE_SIGMA))))


def main(argv: list[str]) -> None:
    root, name, incarnation, seed, start, acks = argv[:6]
    opts = json.loads(argv[6]) if len(argv) > 6 else {}
    rate = float(opts.get("rate", 40.0))  # messages per second for each busy prefix, on average
    prefixes, grow_every = int(opts.get("prefixes", 4)), float(opts.get("grow_every", 60.0))
    segment_size, shard_bit = int(opts.get("segment_size", 16384)), int(opts.get("shard_bit", 1))
    rng = random.Random(f"{seed}/{name}/{incarnation}")
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    fd = os.open(acks, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    end = os.fstat(fd).st_size
    if end and os.pread(fd, 1, end - 1) != b"\n":
        # A SIGKILL can cut a write short (the kernel checks for it between pages): the last incarnation's last
        # line is torn. It ends here, so that this incarnation's first line is a line of its own.
        os.write(fd, b"\n")
    writers: dict[str, sej.ShardedWriter] = {}
    idle_next: dict[str, float] = {}
    seq = 0
    try:
        while not stopping:
            active = min(prefixes, 1 + int(max(0.0, time.time() - float(start)) / grow_every))
            for k in range(active):
                prefix = f"{name}-{k}"
                if prefix not in writers:
                    writers[prefix] = sej.ShardedWriter(root, prefix, shard_bit=shard_bit, segment_size=segment_size)
            busy = [p for i, p in enumerate(sorted(writers)) if i % 3 != 2]
            idle = [p for p in writers if p not in busy]
            now = time.time()
            targets = list(busy)
            for p in idle:  # idle journals: a message now and then (long stretches without any)
                if now >= idle_next.setdefault(p, now + rng.uniform(30, 90)):
                    targets.append(p)
                    idle_next[p] = now + rng.uniform(30, 90)
            lines = []
            for p in targets:
                w = writers[p]
                n = 1 if p in idle else (rng.randrange(20, 200) if rng.random() < 0.1 else rng.randrange(1, 8))
                for _ in range(n):
                    seq += 1
                    mid = f"{name}.{incarnation}.{seq}"
                    key = b"k%d" % rng.randrange(1 << rng.randrange(1, 12))  # keys of varied length
                    size, at = value_size(rng), rng.randrange(1 << 15)
                    value = mid.encode() + b"|" + _TEXT[at : at + size]
                    shard, offset = w.append(value, key=key, type=rng.randrange(4))
                    lines.append((format_shard(p, shard_bit, shard), offset, mid))
            for p in targets:
                writers[p].sync()  # acknowledged: durable on the producer
            acked = time.time()
            os.write(fd, "".join(f"{s} {o} {m} {acked:.6f}\n" for s, o, m in lines).encode())
            per_round = max(1, sum(1 for _ in busy)) * 4.5  # the mean of the burst sizes above
            time.sleep(rng.expovariate(rate / per_round) if rate > 0 else 1.0)  # paced, not a sync
    finally:
        for w in writers.values():
            w.close()
        os.close(fd)


if __name__ == "__main__":
    main(sys.argv[1:])
