"""`append_async` made durable by the event loop itself, through Linux native AIO (sej.aio, sej.acks.LoopAcks).

An ack comes only after a kernel fdatasync that began after the message's bytes were written:
checked on the system calls (strace), as tests/test_acks.py checks the committer thread.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sej
import sej.aio
from sej.aio import AioSync
from testing.timing import scaled

from .conftest import REPO

AIO_EXPECTED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def all_values(d: str | Path) -> list[bytes]:
    with sej.Scanner(d, 0, timeout=0) as s:
        return [m.value for m in s]


def eventfds() -> int:
    """Event fds this process holds (each AIO context has one), once garbage (of earlier tests) is collected."""
    gc.collect()
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventfd]"
        except OSError:
            pass
    return n


@pytest.fixture
def no_aio(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a system without native AIO: append_async goes through the committer thread."""
    monkeypatch.setattr(AioSync, "open", classmethod(lambda cls: None))


def test_aio_is_there_where_ci_runs() -> None:
    if not AIO_EXPECTED:
        pytest.skip("native AIO fsync is Linux on x86_64 or aarch64")
    aio = AioSync.open()
    assert aio is not None, "io_setup refused: append_async would fall back to its thread"
    aio.close()


@pytest.mark.parametrize("path", ["aio", "thread"])
def test_producers_get_their_offsets_and_share_fsyncs_with_sync_callers(
    tmp_path: Path, path: str, request: pytest.FixtureRequest
) -> None:
    if path == "thread":
        request.getfixturevalue("no_aio")
    elif not AIO_EXPECTED:
        pytest.skip("no native AIO here")
    d = tmp_path / "j"
    w = sej.Writer(d, segment_size=20_000)  # rolls over many times underway
    stop = threading.Event()
    syncs = [0]

    def syncer() -> None:  # a thread's sync() shares the writer's group commit with the loop's fsyncs
        while not stop.is_set():
            w.sync()
            syncs[0] += 1

    async def main() -> list[int]:
        async def producer(p: int) -> list[int]:
            return [await w.append_async(b"%d-%d" % (p, i)) for i in range(40)]

        batches = await asyncio.gather(*(producer(p) for p in range(32)))
        many = await w.append_many_async([b"m1", b"m2", b"m3"])
        return [o for b in batches for o in b] + list(many)

    t = threading.Thread(target=syncer)
    t.start()
    try:
        offsets = asyncio.run(asyncio.wait_for(main(), scaled(60)))
    finally:
        stop.set()
        t.join(scaled(30))
    assert (w._lacks is not None) == (path == "aio")
    # The loop's own fsyncs, and those of rounds it handed to the committer thread because a sync() was
    # fsyncing at that moment (two fsyncs of one file never run at once).
    fsyncs = sum(a.fsyncs for a in (w._lacks, w._acks) if a is not None)
    w.close()
    assert sorted(offsets) == list(range(32 * 40 + 3))
    assert 1 <= fsyncs < 32 * 40, "one fsync covered several producers' messages"
    assert syncs[0] >= 1
    assert sorted(all_values(d)) == sorted([b"%d-%d" % (p, i) for p in range(32) for i in range(40)]
                                           + [b"m1", b"m2", b"m3"])  # fmt: skip


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_sync_writer_hands_async_appends_to_the_os_once_per_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a default writer does: not one write per message, which halved append_async's rate in sync mode.
    A plain append in sync mode still writes through and fsyncs, after the acked messages before it."""
    from sej.appender import SegmentAppender

    writes: list[int] = []
    real = SegmentAppender.write

    def counted(self: SegmentAppender, data: bytes) -> None:
        writes.append(len(data))
        real(self, data)

    monkeypatch.setattr(SegmentAppender, "write", counted)
    d = tmp_path / "j"
    w = sej.Writer(d, durability="sync")

    async def main() -> list[int]:
        futs = [w.append_async(b"a%d" % i) for i in range(64)]  # one step of the loop: no round ran yet
        assert writes == [], "acked appends wait for their round"
        offsets = list(await asyncio.gather(*futs))
        assert len(writes) == 1, f"one write for the round, got {len(writes)}"
        assert w.append(b"plain") == 64  # written through and fsynced before it returns
        assert len(writes) == 2
        futs = [w.append_async(b"b%d" % i) for i in range(3)]
        assert w.append(b"plain2") == 68  # takes the acked messages before it along, in order
        return offsets + list(await asyncio.gather(*futs))

    offsets = asyncio.run(main())
    w.close()
    assert offsets == [*range(64), 65, 66, 67]
    assert all_values(d) == [b"a%d" % i for i in range(64)] + [b"plain"] + [b"b%d" % i for i in range(3)] + [
        b"plain2"
    ]


# -- on the system calls ------------------------------------------------------------------------------

CHILD = r"""
import asyncio, os, sys
import sej

async def main():
    w = sej.Writer(sys.argv[1], segment_size=5000, durability=sys.argv[2])
    async def producer(p):
        for i in range(40):
            off = await w.append_async(b"v" * 100)
            os.write(2, b"MARK acked %d\n" % off)
    await asyncio.gather(*(producer(p) for p in range(4)))
    w.close()

asyncio.run(main())
"""

FRAME = 100 + 26
LINE = re.compile(r"^(\d+)\s+(.*)$")


@pytest.mark.parametrize("durability", ["buffered", "sync"])
def test_an_async_ack_comes_only_after_a_kernel_fdatasync_that_began_after_its_bytes_were_written(
    tmp_path: Path, durability: str
) -> None:
    if not AIO_EXPECTED:
        pytest.skip("no native AIO here")
    if shutil.which("strace") is None and not os.environ.get("CI"):
        pytest.skip("needs strace (CI installs it)")
    log = tmp_path / "strace.log"
    subprocess.run(
        ["strace", "-f", "-qq", "-s", "100", "-o", str(log), "-e",
         "trace=openat,write,fdatasync,fsync,io_submit,io_getevents", sys.executable, "-c", CHILD, str(tmp_path / "j"),
         durability],
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=scaled(120),
    )  # fmt: skip
    paths: dict[int, str] = {}
    firsts: dict[str, int] = {}
    written: dict[str, int] = {}  # segment -> bytes written so far
    submitted: dict[int, tuple[str, int]] = {}  # aio_data -> (segment, its bytes written at io_submit)
    durable_msgs = 0
    acked: list[int] = []
    aio_fsyncs = 0
    for raw in log.read_text().splitlines():
        m = LINE.match(raw)
        assert m is not None and "unfinished" not in raw, f"one thread only: {raw}"
        text = m.group(2)
        call = re.match(r"^(\w+)\((.*)\)\s+=\s+(-?\d+)", text)
        if not call:
            continue
        name, args, ret = call.group(1), call.group(2), int(call.group(3))
        if name == "openat":
            o = re.match(r'^AT_FDCWD, "([^"]*)"', args)
            if o and ret >= 0:
                paths[ret] = o.group(1)
                if re.search(r"/jnl/[0-9a-f]{16}\.jnl$", o.group(1)):
                    firsts[o.group(1)] = int(o.group(1)[-20:-4], 16)
            continue
        if name == "io_submit":
            s = re.search(r"aio_data=0x([0-9a-f]+), aio_lio_opcode=IOCB_CMD_FDSYNC, aio_fildes=(\d+)", args)
            assert s is not None and ret == 1, text
            seg = paths[int(s.group(2))]
            submitted[int(s.group(1), 16)] = (seg, written.get(seg, 0))
            continue
        if name == "io_getevents":
            for data, res in re.findall(r"\{data=0x([0-9a-f]+), obj=0x[0-9a-f]+, res=(-?\d+)", args):
                assert int(res) == 0
                seg, began = submitted.pop(int(data, 16))
                durable_msgs = max(durable_msgs, firsts[seg] + began // FRAME)
                aio_fsyncs += 1
            continue
        fd = int(args.split(",")[0])
        path = paths.get(fd, "")
        if name == "write" and fd == 2 and "MARK acked" in args:
            off = int(args.split("MARK acked ")[1].split("\\n")[0])
            assert off < durable_msgs, f"offset {off} acknowledged, but only {durable_msgs} messages were fsynced"
            acked.append(off)
        elif name == "write" and path in firsts and ret > 0:
            written[path] = written.get(path, 0) + ret
        elif name in ("fdatasync", "fsync") and path in firsts and ret == 0:  # a rollover's fsync
            durable_msgs = max(durable_msgs, firsts[path] + written.get(path, 0) // FRAME)
    assert sorted(acked) == list(range(160))
    assert 1 <= aio_fsyncs < 160, "acks came from kernel fdatasyncs, each covering several messages"


# -- faults ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_refused_submit_moves_the_writer_to_its_thread_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's refusal (EAGAIN, as an exhausted fs.aio-max-nr gives it) is the one thing replaced."""
    real = AioSync.submit
    calls = [0]

    def refuse_third(self: AioSync, fd: int, token: int) -> None:
        calls[0] += 1
        if calls[0] >= 3:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        real(self, fd, token)

    monkeypatch.setattr(AioSync, "submit", refuse_third)
    before = eventfds()
    d = tmp_path / "j"

    async def main(w: sej.Writer) -> list[int]:
        async def producer(p: int) -> list[int]:
            return [await w.append_async(b"%d-%d" % (p, i)) for i in range(30)]

        batches = await asyncio.gather(*(producer(p) for p in range(8)))
        return [o for b in batches for o in b]

    with sej.Writer(d) as w:
        offsets = asyncio.run(asyncio.wait_for(main(w), scaled(60)))
        assert w._lacks is None and w._acks is not None, "the rest went through the committer thread"
    assert calls[0] == 3
    assert sorted(offsets) == list(range(240))
    assert len(all_values(d)) == 240
    assert eventfds() == before


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_failed_kernel_fdatasync_fails_the_futures_and_every_later_durable_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's answer (EIO, as a failing disk gives it) is the one thing replaced."""
    d = tmp_path / "j"
    w = sej.Writer(d)
    real = AioSync.reap
    broken = [False]

    def reap(self: AioSync) -> list[tuple[int, int]]:
        return [(token, errno.EIO if broken[0] else err) for token, err in real(self)]

    monkeypatch.setattr(AioSync, "reap", reap)

    async def main() -> None:
        assert await w.append_async(b"before") == 0
        broken[0] = True
        with pytest.raises(sej.SyncError) as e:
            await w.append_async(b"after")
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.EIO
        assert "fsync of" in str(e.value) and "jnl" in str(e.value)
        broken[0] = False  # the disk "recovers": the lost pages are not coming back
        with pytest.raises(sej.SyncError):
            await w.append_async(b"later")
        with pytest.raises(sej.SyncError):
            await w.append_many_async([b"x"])

    asyncio.run(asyncio.wait_for(main(), scaled(60)))
    with pytest.raises(sej.SyncError):
        w.sync()
    with pytest.raises(sej.SyncError):
        w.close()
    assert w.closed
    with sej.Writer(d) as again:
        assert again.next_offset >= 1


# -- lifetime ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["aio", "thread"])
def test_close_on_the_loop_resolves_pending_and_in_flight_futures(
    tmp_path: Path, path: str, request: pytest.FixtureRequest
) -> None:
    if path == "thread":
        request.getfixturevalue("no_aio")
    before = eventfds()
    d = tmp_path / "j"

    async def main() -> list[int]:
        w = sej.Writer(d)
        first = [w.append_async(b"%d" % i) for i in range(50)]
        await asyncio.sleep(0)  # the loop hands these to the OS and starts their fsync
        second = [w.append_async(b"%d" % i) for i in range(50, 100)]
        w.close()  # on the loop's thread, with one fsync in flight and messages pending
        with pytest.raises(sej.ClosedError):
            w.append_async(b"late")
        return list(await asyncio.wait_for(asyncio.gather(*first, *second), scaled(30)))

    assert asyncio.run(main()) == list(range(100))
    assert all_values(d) == [b"%d" % i for i in range(100)]
    assert eventfds() == before


def test_close_from_another_thread_while_producers_run(tmp_path: Path) -> None:
    before = eventfds()
    d = tmp_path / "j"
    w = sej.Writer(d)
    acked: list[int] = []
    closed = threading.Event()

    async def producer(p: int) -> None:
        i = 0
        while True:
            try:
                fut = w.append_async(b"%d-%d" % (p, i))
            except sej.ClosedError:
                return
            acked.append(await fut)  # every future handed out resolves, also across close()
            i += 1
            if len(acked) >= 500 and not closed.is_set():
                closed.set()

    async def main() -> None:
        closer = threading.Thread(target=lambda: (closed.wait(scaled(60)), w.close()))
        closer.start()
        await asyncio.wait_for(asyncio.gather(*(producer(p) for p in range(16))), scaled(60))
        closer.join(scaled(30))

    asyncio.run(main())
    assert w.closed
    assert sorted(acked) == list(range(len(acked)))
    assert len(all_values(d)) == len(acked)
    assert eventfds() == before


def test_one_writer_across_successive_event_loops(tmp_path: Path) -> None:
    before = eventfds()
    d = tmp_path / "j"
    with sej.Writer(d) as w:
        for run in range(3):

            async def main(run: int = run) -> list[int]:
                return list(await asyncio.gather(*(w.append_async(b"%d-%d" % (run, i)) for i in range(20))))

            assert asyncio.run(main()) == list(range(run * 20, run * 20 + 20))
            assert eventfds() <= before + 1, "the context of an ended loop is not kept"
    assert eventfds() == before
    assert len(all_values(d)) == 60


def test_a_cancelled_await_still_writes_its_message(tmp_path: Path) -> None:
    d = tmp_path / "j"

    async def main(w: sej.Writer) -> int:
        fut = w.append_async(b"cancelled")
        fut.cancel()
        return await w.append_async(b"next")

    with sej.Writer(d) as w:
        assert asyncio.run(main(w)) == 1
    assert all_values(d) == [b"cancelled", b"next"]


def test_a_dropped_writer_is_collected_and_closed_while_its_loop_runs(tmp_path: Path) -> None:
    before = eventfds()
    d = tmp_path / "j"

    async def main() -> None:
        w = sej.Writer(d)
        assert await w.append_async(b"x") == 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del w
            gc.collect()
        await asyncio.sleep(0)  # the loop drops its watch of the collected writer's eventfd
        with sej.Writer(d) as again:  # the lock was released by the collected writer's close
            assert again.next_offset == 1

    asyncio.run(asyncio.wait_for(main(), scaled(30)))
    assert eventfds() == before


# -- any interleaving -----------------------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("async"), st.integers(1, 40)),  # that many append_async, not awaited yet
        st.tuples(st.just("many"), st.integers(1, 30)),  # one append_many_async
        st.tuples(st.just("sync"), st.just(0)),  # sync() from another thread meanwhile
        st.tuples(st.just("cancel"), st.integers(0, 1000)),  # cancel one outstanding await
        st.tuples(st.just("yield"), st.integers(0, 3)),  # let the loop run (kick, eventfd)
        st.tuples(st.just("await"), st.just(0)),  # wait for everything outstanding
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS, path=st.sampled_from(["aio", "thread"]))
def test_any_interleaving_resolves_every_await_with_its_own_message(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], path: str
) -> None:
    if path == "aio" and not AIO_EXPECTED:
        return
    d = tmp_path_factory.mktemp("j")
    before = eventfds()
    expected: list[bytes] = []  # every value in the order its offset was given
    checks: list[tuple[asyncio.Future[object], list[bytes]]] = []  # each await and the values it covers

    async def main(w: sej.Writer) -> None:
        outstanding: list[asyncio.Future[object]] = []
        for op, n in ops:
            if op == "async":
                for _ in range(n):
                    v = b"a%d" % len(expected)
                    expected.append(v)
                    f = w.append_async(v)
                    outstanding.append(f)
                    checks.append((f, [v]))
            elif op == "many":
                vs = [b"m%d" % (len(expected) + i) for i in range(n)]
                expected.extend(vs)
                f = asyncio.ensure_future(w.append_many_async(vs))
                await asyncio.sleep(0)  # the coroutine appends now, so that expected keeps offset order
                outstanding.append(f)
                checks.append((f, vs))
            elif op == "sync":
                await asyncio.to_thread(w.sync)
            elif op == "cancel" and outstanding:
                outstanding[n % len(outstanding)].cancel()
            elif op == "yield":
                for _ in range(n):
                    await asyncio.sleep(0)
            elif op == "await":
                await asyncio.gather(*outstanding, return_exceptions=True)
                outstanding.clear()
        await asyncio.gather(*outstanding, return_exceptions=True)

    if path == "thread":
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(AioSync, "open", classmethod(lambda cls: None))
            with sej.Writer(d, segment_size=2000) as w:
                asyncio.run(asyncio.wait_for(main(w), scaled(60)))
    else:
        with sej.Writer(d, segment_size=2000) as w:
            asyncio.run(asyncio.wait_for(main(w), scaled(60)))
    with sej.Scanner(d, 0, timeout=0) as s:
        got = {m.offset: m.value for m in s}
    assert [got[i] for i in range(len(got))] == expected
    for f, vs in checks:
        if f.cancelled():
            continue  # the message is written all the same (checked above)
        r = f.result()
        offsets = list(r) if isinstance(r, range) else [r]
        assert [got[o] for o in offsets] == vs
    assert eventfds() == before


class NoWatchLoop(asyncio.SelectorEventLoop):
    """An event loop that cannot watch a descriptor (as Windows' proactor loop cannot)."""

    def add_reader(self, fd: object, callback: object, *args: object) -> None:
        raise NotImplementedError


def test_a_loop_that_cannot_watch_the_eventfd_gets_the_committer_thread(tmp_path: Path) -> None:
    before = eventfds()
    d = tmp_path / "j"

    async def main(w: sej.Writer) -> list[int]:
        return list(await asyncio.gather(*(w.append_async(b"%d" % i) for i in range(30))))

    with sej.Writer(d) as w, asyncio.Runner(loop_factory=NoWatchLoop) as runner:
        assert runner.run(asyncio.wait_for(main(w), scaled(30))) == list(range(30))
        assert w._lacks is None and w._acks is not None
    assert all_values(d) == [b"%d" % i for i in range(30)]
    assert eventfds() == before


# -- from the review of the loop's own fsync ------------------------------------------------------------


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_sync_called_in_a_coroutine_while_the_loops_fsync_is_in_flight_returns(tmp_path: Path) -> None:
    """That fsync leads the group commit; sync() on the loop's own thread must not wait for the loop."""
    d = tmp_path / "j"

    async def main(w: sej.Writer) -> int:
        await w.append_async(b"warm")
        fut = w.append_async(b"x")
        await asyncio.sleep(0)  # the loop starts its fsync
        assert w._lacks is not None and w._lacks._inflight, "an fsync in flight"
        w.sync()  # blocking, on the loop's thread: it ends that fsync itself
        assert not w._lacks._inflight
        with sej.Writer(tmp_path / "other", durability="sync") as other:
            other.append(b"sync mode, on the loop's thread")
        return await fut

    with sej.Writer(d) as w:
        assert asyncio.run(asyncio.wait_for(main(w), scaled(30))) == 1


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_no_two_fsyncs_of_the_journal_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel reports a write-back error to one of two concurrent fsyncs of a file only: the loop's
    fsync, threads' sync() and rollovers (threads appending past segment_size) take turns."""
    d = tmp_path / "j"
    w = sej.Writer(d, segment_size=5000)
    overlaps: list[str] = []
    active = [0]
    calls = {"thread": 0, "rollover": 0}
    guard = threading.Lock()
    real_fdatasync, real_fsync = sej.commit._fdatasync, os.fsync

    def watched(kind: str, real: Callable[[int], None], fd: int) -> None:
        with guard:
            la = w._lacks
            if active[0] or (la is not None and la._inflight):
                overlaps.append(kind)
            active[0] += 1
            calls[kind] += 1
        try:
            real(fd)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(sej.commit, "_fdatasync", lambda fd: watched("thread", real_fdatasync, fd))
    monkeypatch.setattr(os, "fsync", lambda fd: watched("rollover", real_fsync, fd))
    stop = threading.Event()

    def syncer() -> None:
        while not stop.is_set():
            w.sync()

    def appender() -> None:
        while not stop.is_set():
            w.append(b"t" * 200)

    async def main() -> None:
        async def producer(p: int) -> None:
            for i in range(60):
                await w.append_async(b"%d-%d" % (p, i))

        await asyncio.gather(*(producer(p) for p in range(16)))

    threads = [threading.Thread(target=f) for f in (syncer, syncer, appender)]
    for t in threads:
        t.start()
    try:
        asyncio.run(asyncio.wait_for(main(), scaled(60)))
    finally:
        stop.set()
        for t in threads:
            t.join(scaled(30))
    assert w._lacks is not None and w._lacks.fsyncs >= 1, "the loop fsynced"
    assert calls["thread"] >= 1 and calls["rollover"] >= 1, calls
    w.close()
    assert overlaps == []
    assert sum(v.startswith(b"t") for v in all_values(d)) == w.next_offset - 16 * 60


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_rollover_waits_for_the_loops_fsync_in_flight_and_takes_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's answer to the loop's fsync (EIO) is the one thing replaced: the rollover's own fsync,
    which would otherwise run alongside and succeed, must not let a sync() succeed."""
    real_reap, real_wait = AioSync.reap, AioSync.wait
    monkeypatch.setattr(AioSync, "reap", lambda self: [(t, errno.EIO) for t, _ in real_reap(self)])
    monkeypatch.setattr(AioSync, "wait", lambda self, n: [(t, errno.EIO) for t, _ in real_wait(self, n)])
    w = sej.Writer(tmp_path / "j", segment_size=4096)

    async def main() -> None:
        fut = w.append_async(b"a" * 100)
        await asyncio.sleep(0)  # the loop's fsync of segment 0 is in flight
        assert w._lacks is not None and w._lacks._inflight
        with pytest.raises(sej.SyncError):
            w.append(b"b" * 5000)  # rolls over: ends the loop's fsync first, and fails with it
        with pytest.raises(sej.SyncError):
            w.sync()
        with pytest.raises(sej.SyncError):
            await fut

    asyncio.run(asyncio.wait_for(main(), scaled(30)))
    with pytest.raises(sej.SyncError):
        w.close()


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_rollovers_failed_fsync_fails_every_later_durable_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's answer to the rollover's fsync (EIO) is the one thing replaced."""
    d = tmp_path / "j"
    w = sej.Writer(d, segment_size=2000)

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    async def main() -> None:
        assert await w.append_async(b"first") == 0
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", eio)
            with pytest.raises(sej.SyncError) as e:
                for _ in range(100):  # one of these rolls over
                    await w.append_async(b"x" * 100)
        assert e.value.__cause__ is not None and e.value.__cause__.errno == errno.EIO  # type: ignore[attr-defined]
        with pytest.raises(sej.SyncError):
            await w.append_async(b"after")  # a later fsync's success would acknowledge lost bytes

    asyncio.run(asyncio.wait_for(main(), scaled(30)))
    with pytest.raises(sej.SyncError):
        w.sync()
    with pytest.raises(sej.SyncError):
        w.close()


async def one(w: sej.Writer) -> int:
    return await w.append_async(b"x")


def test_close_after_run_until_complete_leaves_nothing_open(tmp_path: Path) -> None:
    """The loop is stopped (not running, not closed) when the writer closes."""
    before = eventfds()
    for i in range(5):
        loop = asyncio.new_event_loop()
        w = sej.Writer(tmp_path / f"j{i}")
        assert loop.run_until_complete(one(w)) == 0
        w.close()
        assert eventfds() == before, "closed at once, not left to a loop that may never run again"
        loop.close()
    assert eventfds() == before


@pytest.mark.skipif(not AIO_EXPECTED, reason="no native AIO here")
def test_a_writer_keeps_its_aio_context_across_event_loops(tmp_path: Path) -> None:
    """Destroying a context waits for an RCU grace period (about 30 ms): it happens once, at close."""
    with sej.Writer(tmp_path / "j") as w:
        contexts = []
        for _ in range(3):
            asyncio.run(one(w))
            contexts.append(w._aio)
        assert contexts[0] is not None and all(c is contexts[0] for c in contexts)
    assert w._aio is None


def test_sej_aio_0_turns_native_aio_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEJ_AIO", "0")
    assert AioSync.open() is None
    with sej.Writer(tmp_path / "j") as w:
        assert asyncio.run(one(w)) == 0
        assert w._lacks is None and w._acks is not None


UNCLOSED_AT_EXIT = r"""
import asyncio, gc, sys
import sej

async def main(w):
    first = await w.append_async(b"durable", b"k")
    if sys.argv[3] == "in-flight":
        w.append_async(b"in flight", b"k")  # never awaited: its fsync is in flight when the loop ends
    return first

w = sej.Writer(sys.argv[1])
assert asyncio.run(main(w)) == 0
if sys.argv[2] == "cycle":  # collected by the collector, its weak references dead before its __del__ runs
    box = [w]
    box.append(box)
    del box, w
    if sys.argv[3] == "in-flight":
        gc.collect()  # mid-program
print("exiting", flush=True)
"""


@pytest.mark.parametrize("held", ["global", "cycle"])
@pytest.mark.parametrize("last", ["acked", "in-flight"])
def test_a_process_that_never_closes_its_writer_exits(tmp_path: Path, held: str, last: str) -> None:
    """The writer's __del__ closes it while the interpreter is finalizing, when no thread can start any more
    (Python 3.11 then waits forever in Thread.start): the AIO context is destroyed in the caller there. With
    an fsync still in flight, its lead of the group commit is ended although the writer's weak reference is
    dead by then (close spun forever at 100% CPU)."""
    d = tmp_path / "j"
    try:
        p = subprocess.run(
            [sys.executable, "-W", "ignore::ResourceWarning", "-c", UNCLOSED_AT_EXIT, str(d), held, last],
            capture_output=True, text=True, timeout=scaled(30), cwd=REPO,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process hung: {e.stdout!r} {e.stderr!r}")
    assert (p.returncode, p.stdout, p.stderr) == (0, "exiting\n", "")
    assert all_values(d) == [b"durable"] + ([b"in flight"] if last == "in-flight" else [])
