"""Sharding: shard names, routing, ShardedWriter, and reading a sharded root."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import xxhash

import sej
from sej.shard import (
    ShardedWriter,
    ShardName,
    ShardWatch,
    find_journals,
    format_shard,
    list_shards,
    merged_scan,
    parse_shard,
)
from testing.timing import scaled

from .conftest import popen_python, run_python

# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "a", "Z-9_x", "-", "_" * 200])
def test_names_round_trip_over_every_bit_and_edge_index(prefix: str) -> None:
    for bit in range(1, 11):
        for index in sorted({0, 1, (1 << bit) // 2, (1 << bit) - 2, (1 << bit) - 1}):
            name = format_shard(prefix, bit, index)
            assert parse_shard(name) == ShardName(prefix, bit, index)
            assert str(parse_shard(name)) == name
            assert name == (f"{prefix}." if prefix else "") + f"{bit:x}.{index:03x}"


def test_bit_zero_is_the_plain_journal() -> None:
    assert format_shard("events", 0, 0) == "events"
    assert parse_shard("events") == ShardName("events", 0, 0)
    with pytest.raises(sej.InvalidArgumentError, match="non-empty prefix"):
        format_shard("", 0, 0)


@pytest.mark.parametrize(
    "name",
    [
        "p.3.008",  # index not below 2**3
        "p.1.002",
        "p.a.400",  # index beyond 3ff
        "P.A.000",  # upper-case bit
        "p.3.00A",  # upper-case index
        "p.3.07",  # two digits
        "p.3.0007",
        "p.0.000",  # bit 0 has no index part
        "p.b.000",  # bit above a
        "p..3.007",
        ".3.007",  # empty prefix keeps no dot
        "a.b.3.007",  # extra dots
        "p.3.007.",
        "p/3.007",
        "p 3.007",
        "",
        "..",
        "../x",
        "x\0",
        "é.3.007",
        "a" * 201,
        "a" * 201 + ".3.007",  # a sharded name's prefix has the same limit
    ],
)
def test_malformed_names_are_rejected(name: str) -> None:
    with pytest.raises(sej.InvalidArgumentError) as e:
        parse_shard(name)
    assert repr(name)[:40] in str(e.value) or "shard name" in str(e.value)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("p.x", 3, 0), "prefix"),
        (("p", 11, 0), "shard bit"),
        (("p", -1, 0), "shard bit"),
        (("p", 3, 8), "shard index"),
        (("p", 3, -1), "shard index"),
        (("p", True, 0), "shard bit"),
        ((None, 3, 0), "prefix"),
    ],
)
def test_format_rejects_bad_parts(args: tuple, needle: str) -> None:
    with pytest.raises(sej.InvalidArgumentError, match=needle):
        format_shard(*args)


# -- routing ----------------------------------------------------------------------------------


def test_default_routing_is_xxh3_of_the_key_and_stable_across_processes(tmp_path) -> None:
    keys = [os.urandom(random.randrange(0, 40)) for _ in range(200)]
    w = ShardedWriter(str(tmp_path), "p", shard_bit=7)
    here = [w.shard_of(k) for k in keys]
    assert here == [xxhash.xxh3_64_intdigest(k) & 127 for k in keys]
    code = (
        "import sys, sej\n"
        "w = sej.ShardedWriter(sys.argv[1], 'p', shard_bit=7)\n"
        "keys = [bytes.fromhex(h) for h in sys.argv[2].split(',')]\n"
        "print(','.join(str(w.shard_of(k)) for k in keys))\n"
    )
    out = run_python(code, str(tmp_path), ",".join(k.hex() for k in keys))
    assert out.returncode == 0, out.stderr
    assert [int(x) for x in out.stdout.strip().split(",")] == here


@pytest.mark.parametrize("bit, per_shard", [(4, 20_000), (8, 4_000)])
def test_random_keys_fill_shards_evenly(tmp_path, bit: int, per_shard: int) -> None:
    rng = random.Random(bit)
    w = ShardedWriter(str(tmp_path), shard_bit=bit)
    counts = [0] * (1 << bit)
    for _ in range(per_shard << bit):
        counts[w.shard_of(rng.randbytes(8))] += 1
    # Binomial spread: 5 standard deviations is 3.5% at 20,000 per shard and 7.9% at 4,000.
    limit = 5 / per_shard**0.5
    assert max(abs(c - per_shard) / per_shard for c in counts) < limit


def test_custom_hash_and_bad_hash(tmp_path) -> None:
    with ShardedWriter(str(tmp_path), "c", shard_bit=2, hash=lambda k: len(k)) as w:
        assert [w.append(b"v", key=b"x" * n)[0] for n in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(sej.InvalidArgumentError, match="hash must be"):
        ShardedWriter(str(tmp_path), shard_bit=2, hash=42)  # type: ignore[arg-type]
    w = ShardedWriter(str(tmp_path), "d", shard_bit=2, hash=lambda k: "nope")  # type: ignore[arg-type,return-value]
    with pytest.raises(sej.InvalidArgumentError, match="cannot route key"):
        w.append(b"v", key=b"k")


# -- ShardedWriter ------------------------------------------------------------------------------


def test_append_routes_by_key_and_opens_shards_lazily(tmp_path) -> None:
    root = str(tmp_path)
    with ShardedWriter(root, "ev", shard_bit=4) as w:
        assert os.listdir(root) == []
        placed = {}
        for i in range(50):
            key = b"user-%d" % (i % 5)
            shard, offset = w.append(b"m%d" % i, key=key, type=1, timestamp=1000 + i)
            assert shard == w.shard_of(key)
            placed.setdefault(shard, []).append((offset, b"m%d" % i))
        assert len(w.open_shards) == len(placed) <= 5
    assert sorted(os.listdir(root)) == sorted(format_shard("ev", 4, s) for s in placed)
    for shard, expect in placed.items():
        with sej.Scanner(os.path.join(root, format_shard("ev", 4, shard)), 0, timeout=0) as s:
            assert [(m.offset, m.value) for m in s] == expect


def test_append_many_routes_like_append(tmp_path) -> None:
    keys = [b"k%d" % (i % 13) for i in range(300)]
    values = [b"v%d" % i for i in range(300)]
    with ShardedWriter(str(tmp_path / "a"), shard_bit=3) as a, ShardedWriter(str(tmp_path / "b"), shard_bit=3) as b:
        one = [a.append(v, key=k, timestamp=7) for v, k in zip(values, keys)]
        many = b.append_many(values, keys, timestamp=7)
    assert one == many
    for shard in list_shards(str(tmp_path / "a")):
        other = os.path.join(str(tmp_path / "b"), os.path.basename(shard.path))
        for x, y in zip(sej.list_segments(shard.path), sej.list_segments(other)):
            assert open(x.path, "rb").read() == open(y.path, "rb").read()


def _durable(w: ShardedWriter, shard: int) -> bool:
    """Every byte the shard's writer has written is covered by a finished fsync."""
    sw = w.open_shards[shard]
    return sw._commit.durable >= sw._written


def test_submit_and_append_async_route_like_append_and_resolve_once_fsynced(tmp_path) -> None:
    keys = [b"k%d" % (i % 11) for i in range(120)]
    values = [b"v%d" % i for i in range(120)]
    delivered: list[tuple[object, object]] = []
    with ShardedWriter(str(tmp_path / "a"), shard_bit=3) as a, ShardedWriter(str(tmp_path / "s"), shard_bit=3) as w:
        plain = [a.append(v, key=k, timestamp=7) for v, k in zip(values, keys)]
        futures = [w.submit(v, k, timestamp=7, on_delivery=lambda e, r: delivered.append((e, r)))
                   for v, k in zip(values[:60], keys[:60])]  # fmt: skip
        assert not any(f.cancel() for f in futures)  # as Writer.submit's: the messages are written regardless
        submitted = [f.result(timeout=scaled(30)) for f in futures]
        assert all(_durable(w, shard) for shard, _ in submitted)

        async def produce() -> list[tuple[int, int]]:
            futs = [w.append_async(v, k, timestamp=7) for v, k in zip(values[60:], keys[60:])]
            done = await asyncio.gather(*futs)
            assert all(_durable(w, shard) for shard, _ in done)
            return done

        awaited = asyncio.run(asyncio.wait_for(produce(), scaled(30)))
    assert submitted + awaited == plain  # same shards, same offsets, in the same order
    assert sorted(r for _, r in delivered) == sorted(submitted) and all(e is None for e, _ in delivered)
    for shard in list_shards(str(tmp_path / "a")):
        other = os.path.join(str(tmp_path / "s"), os.path.basename(shard.path))
        for x, y in zip(sej.list_segments(shard.path), sej.list_segments(other), strict=True):
            assert open(x.path, "rb").read() == open(y.path, "rb").read()


def test_sharded_acks_carry_a_failed_fsync_and_survive_a_cancelled_await(tmp_path, monkeypatch) -> None:
    import errno

    import sej.commit
    from sej.aio import AioSync

    monkeypatch.setattr(AioSync, "open", classmethod(lambda cls: None))  # fsyncs in the writer's thread

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with ShardedWriter(str(tmp_path / "c"), shard_bit=2) as w:

        async def cancel_one() -> tuple[int, int]:
            fut = w.append_async(b"kept", b"key")
            fut.cancel()
            return await w.append_async(b"after", b"key")

        shard, offset = asyncio.run(asyncio.wait_for(cancel_one(), scaled(30)))
        assert offset == 1
        with sej.Scanner(w.shard_dir(shard), 0, timeout=0) as s:
            assert [m.value for m in s] == [b"kept", b"after"]
    monkeypatch.setattr(sej.commit, "_fdatasync", eio)
    got: list[tuple[object, object]] = []
    w = ShardedWriter(str(tmp_path / "f"), shard_bit=2)
    f = w.submit(b"lost", b"key", on_delivery=lambda e, r: got.append((e, r)))
    with pytest.raises(sej.SyncError):
        f.result(timeout=scaled(30))
    assert len(got) == 1 and isinstance(got[0][0], sej.SyncError) and got[0][1] is None
    with pytest.raises(sej.SyncError):
        w.close()
    with pytest.raises(sej.ClosedError):
        w.submit(b"x", b"key")


def test_writer_options_apply_to_every_shard_and_are_checked_first(tmp_path) -> None:
    with ShardedWriter(str(tmp_path), "s", shard_bit=1, segment_size=500, durability="flush") as w:
        for i in range(200):
            w.append(b"x" * 40, key=b"%d" % i)
        for shard_writer in w.open_shards.values():
            assert shard_writer.durability == "flush" and shard_writer.segment_size == 500
    for shard in list_shards(str(tmp_path)):
        assert len(sej.list_segments(shard.path)) > 3
    with pytest.raises(sej.InvalidArgumentError, match="durability"):
        ShardedWriter(str(tmp_path), shard_bit=1, durability="maybe")
    with pytest.raises(sej.InvalidArgumentError, match="unknown Writer option 'segment'"):
        ShardedWriter(str(tmp_path), shard_bit=1, segment=5)
    with pytest.raises(sej.InvalidArgumentError, match="shard bit"):
        ShardedWriter(str(tmp_path), shard_bit=11)
    with pytest.raises(sej.InvalidArgumentError, match="prefix"):
        ShardedWriter(str(tmp_path), "a.b", shard_bit=1)


def test_flush_sync_close_act_on_all_open_shards(tmp_path) -> None:
    root = str(tmp_path)
    size_of = (
        "import os,sys\n"
        "print(sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(sys.argv[1]) "
        "for f in fs if f.endswith('.jnl')))"
    )
    w = ShardedWriter(root, "f", shard_bit=3)
    for i in range(64):
        w.append(b"y" * 10, key=b"%d" % i)
    assert len(w.open_shards) == 8
    assert int(run_python(size_of, root).stdout) == 0
    w.flush()
    assert int(run_python(size_of, root).stdout) == sum(26 + len(b"%d" % i) + 10 for i in range(64))
    w.sync()
    w.close()
    w.close()
    with pytest.raises(sej.ClosedError):
        w.append(b"z", key=b"0")
    for shard in list_shards(root):
        sej.Writer(shard.path).close()  # every shard's lock was released


def test_shard_bit_zero_writes_the_plain_journal(tmp_path) -> None:
    with ShardedWriter(str(tmp_path), "plain", shard_bit=0) as w:
        assert w.append(b"a", key=b"anything") == (0, 0)
    assert os.listdir(str(tmp_path)) == ["plain"]
    with sej.Scanner(str(tmp_path / "plain"), 0, timeout=0) as s:
        assert [m.value for m in s] == [b"a"]


SHARDED_PRODUCER = r"""
import sys, sej
root, n = sys.argv[1], int(sys.argv[2])
with sej.ShardedWriter(root, "p", shard_bit=3, segment_size=2000, durability="flush") as w:
    for i in range(n):
        w.append(b"value-%d" % i, key=b"key-%d" % i, timestamp=1_000_000 + i)
"""


def test_sharded_writer_in_one_process_scanners_of_every_shard_in_another(tmp_path) -> None:
    root = str(tmp_path)
    n = 4000
    expected: dict[str, list[bytes]] = {}
    router = ShardedWriter(root, "p", shard_bit=3)
    for i in range(n):
        expected.setdefault(format_shard("p", 3, router.shard_of(b"key-%d" % i)), []).append(b"value-%d" % i)
    for name in expected:
        os.makedirs(os.path.join(root, name))  # scanners start before the writer exists
    scanners = {name: sej.Scanner(os.path.join(root, name), 0, timeout=scaled(10)) for name in expected}
    producer = popen_python(SHARDED_PRODUCER, root, str(n), stderr=subprocess.PIPE)
    try:
        got: dict[str, list[bytes]] = {}
        for name, s in scanners.items():
            for m in s:
                got.setdefault(name, []).append(m.value)
                if len(got[name]) == len(expected[name]):
                    break
        assert producer.wait(scaled(60)) == 0, producer.stderr.read() if producer.stderr else ""
    finally:
        producer.kill()
        for s in scanners.values():
            s.close()
    assert got == expected
    assert sum(len(v) for v in got.values()) == n
    assert all(len(sej.list_segments(os.path.join(root, name))) > 1 for name in expected)


# -- reading a root -----------------------------------------------------------------------------


def test_list_shards_and_find_journals(tmp_path) -> None:
    root = str(tmp_path)
    with ShardedWriter(root, "a", shard_bit=2) as w:
        for i in range(40):
            w.append(b"v", key=b"%d" % i)
    with ShardedWriter(root, shard_bit=1) as w:
        for i in range(10):
            w.append(b"v", key=b"%d" % i)
    os.makedirs(os.path.join(root, "not.a.shard.name"))
    os.makedirs(os.path.join(root, "a.2.004"))  # index out of range: not a shard
    open(os.path.join(root, "a.2.003.txt"), "w").close()
    assert [str(s.name) for s in list_shards(root)] == ["1.000", "1.001", "a.2.000", "a.2.001", "a.2.002", "a.2.003"]
    assert [str(s.name) for s in list_shards(root, prefix="a")] == ["a.2.000", "a.2.001", "a.2.002", "a.2.003"]
    assert [j.name for j in find_journals(root)] == ["1.000", "1.001", "a.2.000", "a.2.001", "a.2.002", "a.2.003"]
    one = list_shards(root)[0].path
    assert [j.name for j in find_journals(one)] == [""]
    with pytest.raises(sej.InvalidArgumentError, match="not a directory"):
        list_shards(os.path.join(root, "a.2.003.txt"))
    with pytest.raises(sej.InvalidArgumentError, match="not a directory"):
        find_journals(os.path.join(root, "missing"))


def test_shard_watch_notices_new_shards(tmp_path) -> None:
    root = str(tmp_path)
    with ShardedWriter(root, "w", shard_bit=4, hash=lambda k: int(k)) as w:
        w.append(b"v", key=b"0")
        with ShardWatch(root) as watch:
            assert [str(s.name) for s in watch.new()] == ["w.4.000"]
            assert watch.new() == []
            w.append(b"v", key=b"5")
            deadline = time.monotonic() + scaled(5)
            found: list[str] = []
            while not found and time.monotonic() < deadline:
                watch.wait(1.0)
                found = [str(s.name) for s in watch.new()]
            assert found == ["w.4.005"]


def test_merged_scan_orders_shards_by_timestamp(tmp_path) -> None:
    root = str(tmp_path)
    rng = random.Random(3)
    with ShardedWriter(root, "m", shard_bit=3) as w:
        w.append(b"none", key=b"x", timestamp=sej.NO_TIMESTAMP)  # sorts as the oldest
        for i in range(500):
            w.append(b"%d" % i, key=rng.randbytes(4), timestamp=10_000 + i)
    merged = list(merged_scan(root))
    assert len(merged) == 501
    assert merged[0].message.value == b"none"
    assert [int(x.message.value) for x in merged[1:]] == list(range(500))
    assert {x.journal for x in merged} == {j.name for j in find_journals(root)}


def test_links_under_a_root_are_not_journals(tmp_path: Path) -> None:
    """A link to a journal directory, or a jnl/ that is a link, is never followed into."""
    elsewhere = tmp_path / "elsewhere"
    with sej.Writer(elsewhere / "j") as w:
        w.append(b"secret")
    root = tmp_path / "root"
    with sej.Writer(root / "ev.1.000") as w:
        w.append(b"x")
    os.symlink(elsewhere / "j", root / "ev.1.001")
    (root / "ev.1.002").mkdir()
    os.symlink(elsewhere / "j" / "jnl", root / "ev.1.002" / "jnl")
    assert [j.name for j in sej.shard.find_journals(root)] == ["ev.1.000"]
    with sej.Consumer(root, None, follow=False) as c:
        assert [m.message.value for m in c] == [b"x"]
