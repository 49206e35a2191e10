"""ShardedWriter: a thin layer that routes each message to one of 2**bit journals by its key."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import xxhash

from ..acks import Delivery, _deliver
from ..errors import ClosedError, InvalidArgumentError
from ..fsutil import allow_open_files
from ..layout import journal_path
from ..writer import Writer, check_options
from .name import check_bit, check_prefix, format_shard

HashFunction = Callable[[bytes], int]


def default_hash(key: bytes) -> int:
    """xxh3_64 of the key: the default routing hash."""
    return xxhash.xxh3_64_intdigest(key)


ShardOffset = tuple[int, int]
"""Where a sharded append went: (shard index, offset in that shard)."""


def _settle_routed(out: Future[ShardOffset] | asyncio.Future[ShardOffset], index: int, done: Any) -> None:
    """Resolve `out` with (index, the shard's offset), or its error, once the shard's future `done` is."""
    if out.done():  # an awaiting task was cancelled: the message is durable all the same
        return
    if done.cancelled():
        out.cancel()
    elif (e := done.exception()) is not None:
        out.set_exception(e)
    else:
        out.set_result((index, done.result()))


class ShardedWriter:
    """Appends to `<root>/<prefix>.<bit>.<index>/` journals, one per shard, chosen by hash(key).

    Each message goes to shard ``hash(key) & (2**shard_bit - 1)``. Shard writers open
    lazily, on first use, with `writer_options` (the plain Writer's options, such as
    `segment_size` and `durability`); `flush`, `sync` and `close` act on every open
    shard. Shard bit 0 writes the single plain journal `<root>/<prefix>`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        prefix: str = "",
        *,
        shard_bit: int,
        hash: HashFunction | None = None,
        **writer_options: Any,
    ) -> None:
        self.root = journal_path(root)
        self.prefix = check_prefix(prefix)
        self.shard_bit = check_bit(shard_bit)
        if shard_bit == 0 and not prefix:
            raise InvalidArgumentError("shard_bit 0 (one plain journal) needs a non-empty prefix to name it")
        if hash is not None and not callable(hash):
            raise InvalidArgumentError(f"hash must be a function of the key bytes, got {hash!r}")
        check_options(**writer_options)
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise InvalidArgumentError(f"sharded root {self.root} exists and is not a directory")
        self._hash: HashFunction = hash or xxhash.xxh3_64_intdigest  # same as default_hash, one call less
        allow_open_files(2 * (1 << shard_bit) + 64)
        self._mask = (1 << shard_bit) - 1
        self._options = writer_options
        self._writers: list[Writer | None] = [None] * (1 << shard_bit)
        self._open_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # a child forked since opens no shard and closes none (see Writer._disown)

    def shard_of(self, key: bytes) -> int:
        """The shard index a message with this key goes to."""
        h = self._hash(key)
        if not isinstance(h, int):
            raise InvalidArgumentError(f"the hash function returned {h!r} for key {key!r}, not an int")
        return h & self._mask

    def shard_dir(self, index: int) -> str:
        """The journal directory of shard `index`."""
        return os.path.join(self.root, format_shard(self.prefix, self.shard_bit, index))

    def writer(self, index: int) -> Writer:
        """The Writer of shard `index`, opened on first use."""
        w = self._writers[index]
        if w is not None:
            return w
        if os.getpid() != self._pid:  # its shard locks would lock the parent out of them
            raise ClosedError(f"sharded writer of {self.root} belongs to process {self._pid}, which this process "
                              "was forked from: open a ShardedWriter in this process instead")  # fmt: skip
        with self._open_lock:
            if self._closed:
                raise ClosedError(f"sharded writer of {self.root} is closed")
            w = self._writers[index]
            if w is None:
                w = self._writers[index] = Writer(self.shard_dir(index), **self._options)
        return w

    def append(self, value: bytes, key: bytes = b"", type: int = 0, timestamp: int | None = None) -> ShardOffset:
        """Append one message to the shard its key routes to; return (shard, offset).

        The shard's Writer checks the message (a plain tuple: this is the hot path).
        """
        try:
            index = self._hash(key) & self._mask
        except Exception as e:
            raise InvalidArgumentError(f"cannot route key {key!r}: {e}") from None
        w = self._writers[index] or self.writer(index)
        return index, w.append(value, key, type, timestamp)

    def submit(
        self,
        value: bytes,
        key: bytes = b"",
        type: int = 0,
        timestamp: int | None = None,
        *,
        on_delivery: Delivery | None = None,
    ) -> Future[ShardOffset]:
        """`Writer.submit` on the key's shard: a Future of (shard, offset), resolved once the message is fsynced.

        `on_delivery(error, (shard, offset))` is called then, as by `Writer.submit`.
        """
        index, w = self._route(key)
        out: Future[ShardOffset] = Future()
        out.set_running_or_notify_cancel()  # as Writer.submit's: the message is written whatever happens
        w.submit(value, key, type, timestamp).add_done_callback(lambda f: _settle_routed(out, index, f))
        if on_delivery is not None:
            out.add_done_callback(lambda f: _deliver(f, on_delivery))
        return out

    def append_async(
        self, value: bytes, key: bytes = b"", type: int = 0, timestamp: int | None = None
    ) -> asyncio.Future[ShardOffset]:
        """`Writer.append_async` on the key's shard: appended now; an asyncio future of (shard, offset), done
        once the message is fsynced. Each shard fsyncs on its own: one fsync per shard covers its messages."""
        index, w = self._route(key)
        inner = w.append_async(value, key, type, timestamp)
        out: asyncio.Future[ShardOffset] = inner.get_loop().create_future()
        inner.add_done_callback(lambda f: _settle_routed(out, index, f))
        return out

    def _route(self, key: bytes) -> tuple[int, Writer]:
        try:
            index = self._hash(key) & self._mask
        except Exception as e:
            raise InvalidArgumentError(f"cannot route key {key!r}: {e}") from None
        return index, self._writers[index] or self.writer(index)

    def append_many(
        self,
        values: Iterable[bytes],
        keys: Iterable[bytes],
        type: int = 0,
        timestamp: int | None = None,
    ) -> list[ShardOffset]:
        """Append many messages, each routed by its key; one batch per shard touched."""
        vals: Sequence[bytes] = values if isinstance(values, (list, tuple)) else list(values)
        ks: Sequence[bytes] = keys if isinstance(keys, (list, tuple)) else list(keys)
        if len(vals) != len(ks):
            raise InvalidArgumentError(f"keys has {len(ks)} items but values has {len(vals)}")
        groups: dict[int, list[int]] = {}
        shard_of = self.shard_of
        for i, k in enumerate(ks):
            if not isinstance(k, (bytes, bytearray)):
                raise InvalidArgumentError(f"key must be bytes, got {type(k).__name__} at position {i}")
            groups.setdefault(shard_of(k), []).append(i)
        out: list[ShardOffset] = [(0, 0)] * len(vals)
        for index, positions in groups.items():
            offsets = self.writer(index).append_many(
                [vals[i] for i in positions], keys=[ks[i] for i in positions], type=type, timestamp=timestamp
            )
            for i, off in zip(positions, offsets):
                out[i] = (index, off)
        return out

    @property
    def open_shards(self) -> dict[int, Writer]:
        """The shard writers opened so far, by index."""
        return {i: w for i, w in enumerate(self._writers) if w is not None}

    def flush(self) -> None:
        for w in self.open_shards.values():
            w.flush()

    def sync(self) -> None:
        for w in self.open_shards.values():
            w.sync()

    def close(self) -> None:
        """Close every open shard (each flushes and fsyncs). Idempotent."""
        if os.getpid() != self._pid:  # the shards are the parent's; a parent's thread may have held the lock
            self._closed = True
            return
        with self._open_lock:
            self._closed = True
        errors = []
        for w in self.open_shards.values():
            try:
                w.close()
            except Exception as e:  # close the others anyway, then report
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedWriter({self.root!r}, prefix={self.prefix!r}, shard_bit={self.shard_bit})"
