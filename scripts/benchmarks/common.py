"""What every benchmark shares: the messages, the sizes of full and quick runs, scratch and timing helpers."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is scripts/benchmarks/common.py)

perf_counter = time.perf_counter

KEY = b"key-0001"  # 8 bytes
VALUE_SIZE = 100
FRAME_SIZE = 26 + len(KEY) + VALUE_SIZE  # 134
RAW = struct.Struct(f">QqBb{len(KEY)}si{VALUE_SIZE}si")  # one whole frame, as sej writes it
HEAD = struct.Struct(">QqBb")
I32 = struct.Struct(">i")
TS = struct.Struct(">q")


@dataclass
class Config:
    quick: bool
    n_write: int  # messages per write-throughput run (benchmarks 1, 2)
    batch: int  # append_many batch size
    n_scan: int  # messages in the scanned journal (benchmark 3)
    reps: int  # repetitions of the throughput measurements (best is reported)
    fsync_seconds: float  # duration of each durable-append run (benchmark 4)
    fsync_reps: int  # repetitions of benchmark 4 (median is reported)
    follow_n: int  # measured messages of benchmark 5
    follow_warmup: int
    follow_interval: float
    big_bytes: int  # journal size of benchmark 6
    open_reps: int  # measured repetitions of benchmark 6 (median is reported)
    sqlite_reps: int  # repetitions of benchmark 7's throughput measurements (best is reported)
    sqlite_sync_reps: int  # repetitions of benchmark 7's durable appends (median is reported)
    keep: bool = False  # keep the scratch journals
    spark_rows: int = 4_000_000  # rows read by benchmark 12
    spark_reps: int = 5  # interleaved repetitions of benchmark 12 (best is reported)


FULL = Config(False, 300_000, 1000, 300_000, 15, 1.5, 5, 2000, 50, 0.001, 1 << 30, 9, 5, 3)
QUICK = Config(
    True, 30_000, 1000, 30_000, 3, 0.5, 1, 300, 20, 0.001, 64 << 20, 5, 3, 1, spark_rows=300_000, spark_reps=2
)


def values_for(n: int) -> list[bytes]:
    """n 100-byte values (1024 distinct random ones, cycled)."""
    pool = [os.urandom(VALUE_SIZE) for _ in range(1024)]
    return [pool[i & 1023] for i in range(n)]


SHAPES = ("uniform", "varied", "json")
"""The message shapes every throughput benchmark measures, side by side (see shape_messages)."""

SHAPE_NAMES = {
    "uniform": "uniform (100 B values, 8 B keys)",
    "varied": "varied (log-normal values, median 200 B, 10 B..16 KiB; keys 4..40 B)",
    "json": "JSON events (keys: user ids)",
}
SEED = 40
"""The seed of the varied and JSON shapes: every run writes the same messages."""

_POOL = 4096  # distinct messages per shape, cycled


def shape_messages(shape: str, n: int) -> tuple[list[bytes], list[bytes]]:
    """(keys, values) of n messages of one of SHAPES, from a fixed seed (4096 distinct ones, cycled).

    uniform: 100-byte random values, the 8-byte KEY. varied: value sizes log-normal (median 200 bytes,
    sigma 1, cut to 10 B..16 KiB), keys of 4..40 random bytes. json: one JSON object per event (a user,
    an event name, a page, a session and a few properties), keyed by its user id.
    """
    if shape == "uniform":
        return [KEY] * n, values_for(n)
    rng = random.Random(SEED)
    keys: list[bytes] = []
    values: list[bytes] = []
    if shape == "varied":
        blob = rng.randbytes(1 << 16)
        for _ in range(_POOL):
            size = min(16384, max(10, round(rng.lognormvariate(math.log(200), 1.0))))
            at = rng.randrange(0, len(blob) - size)
            values.append(blob[at : at + size])
            keys.append(rng.randbytes(rng.randint(4, 40)))
    elif shape == "json":
        events = ("page_view", "click", "add_to_cart", "purchase", "search", "login", "logout", "scroll")
        for i in range(_POOL):
            user = f"u{rng.randrange(10 ** rng.randint(3, 7))}"
            event: dict[str, object] = {
                "ts": 1_760_000_000_000 + i * 37,
                "user": user,
                "event": rng.choice(events),
                "page": "/"
                + "/".join(
                    rng.choice(("shop", "cart", "p", "docs", "help", "a", "blog")) for _ in range(rng.randint(1, 4))
                ),  # fmt: skip
                "session": rng.randbytes(8).hex(),
            }
            if rng.random() < 0.5:
                event["props"] = {f"k{j}": rng.choice((rng.randint(0, 10**6), rng.random(), "x" * rng.randint(1, 40)))
                                  for j in range(rng.randint(1, 8))}  # fmt: skip
            values.append(json.dumps(event, separators=(",", ":")).encode())
            keys.append(user.encode())
    else:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    return [keys[i % _POOL] for i in range(n)], [values[i % _POOL] for i in range(n)]


def shape_bytes(keys: list[bytes], values: list[bytes]) -> int:
    """The bytes of these messages' frames."""
    return 26 * len(values) + sum(map(len, keys)) + sum(map(len, values))


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def installed_env(scratch: Path, **more: str) -> dict[str, str]:
    """The environment of a sej process timed as a wheel install runs it: from compiled modules (pip compiles them
    when it installs; this machine sets PYTHONDONTWRITEBYTECODE, so a checkout would be compiled on every start),
    cached under `scratch`, not in the checkout, and compiled once here, not in a timed run."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(scratch / "pycache"), **more)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "sej")], env=env, check=True)
    subprocess.run([sys.executable, "-c", "import sej.apps.cli.copy, sej.hub.batch, sej.hub.location, sej.hub.ssh"],
                   env=env, check=True)  # fmt: skip
    return env


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sharded_keys(n: int) -> list[bytes]:
    rng = random.Random(8)
    pool = [rng.randbytes(len(KEY)) for _ in range(4096)]
    return [pool[i & 4095] for i in range(n)]
