"""Acknowledged appends: `Writer.submit`, `submit_many`, `append_async` and `on_delivery`.

A future resolves only once its message is fsynced: checked on the system calls themselves
(strace), as tests/test_durability_syscalls.py checks `sync()`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import Future, wait
from pathlib import Path

import pytest

import sej
import sej.commit
from testing.timing import scaled

from .conftest import REPO


def all_values(d: str) -> list[bytes]:
    with sej.Scanner(d, 0, timeout=0) as s:
        return [m.value for m in s]


def test_futures_resolve_with_offsets_and_every_message_is_there(jdir: str) -> None:
    delivered: list[tuple[BaseException | None, object]] = []
    with sej.Writer(jdir) as w:
        fs = [w.submit(b"v%d" % i, b"k", on_delivery=lambda e, o: delivered.append((e, o))) for i in range(500)]
        many = w.submit_many([b"m%d" % i for i in range(300)], b"k")
        done, not_done = wait([*fs, many], timeout=scaled(30))
        assert not not_done
        assert [f.result() for f in fs] == list(range(500))
        assert many.result() == range(500, 800)
        assert w._commit.durable >= os.path.getsize(sej.list_segments(jdir)[0].path)
    assert sorted(o for _, o in delivered) == list(range(500)) and all(e is None for e, _ in delivered)  # type: ignore[type-var]
    assert all_values(jdir) == [b"v%d" % i for i in range(500)] + [b"m%d" % i for i in range(300)]


def test_many_threads_share_fsyncs(jdir: str) -> None:
    n_threads, each = 32, 40
    got: list[int] = []
    lock = threading.Lock()

    def producer(t: int) -> None:
        for i in range(each):
            off = w.submit(b"%d-%d" % (t, i)).result(timeout=scaled(30))
            with lock:
                got.append(off)

    with sej.Writer(jdir, segment_size=20_000) as w:  # rolls over many times meanwhile
        threads = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(scaled(60))
        assert not any(t.is_alive() for t in threads)
        acks = w._acks
        assert acks is not None
    assert sorted(got) == list(range(n_threads * each))
    assert 1 <= acks.fsyncs <= n_threads * each
    assert sorted(all_values(jdir)) == sorted(b"%d-%d" % (t, i) for t in range(n_threads) for i in range(each))


def test_asyncio_producers(jdir: str) -> None:
    async def main(w: sej.Writer) -> list[int]:
        async def producer(p: int) -> list[int]:
            return [await w.append_async(b"%d-%d" % (p, i)) for i in range(25)]

        batches = await asyncio.gather(*(producer(p) for p in range(64)))
        many = await w.append_many_async([b"x", b"y"])
        return [o for b in batches for o in b] + list(many)

    with sej.Writer(jdir) as w:
        offsets = asyncio.run(asyncio.wait_for(main(w), scaled(60)))
    assert sorted(offsets) == list(range(64 * 25 + 2))
    assert len(all_values(jdir)) == 64 * 25 + 2


def test_close_resolves_pending_futures_and_later_submits_fail(jdir: str) -> None:
    w = sej.Writer(jdir)
    fs = [w.submit(b"%d" % i) for i in range(2000)]
    w.close()
    assert all(f.done() for f in fs), "close() returns with every future resolved"
    assert [f.result() for f in fs] == list(range(2000))
    with pytest.raises(sej.ClosedError):
        w.submit(b"late")
    assert len(all_values(jdir)) == 2000


def test_a_failed_fsync_fails_the_futures_and_every_later_durable_ack(
    jdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's answer to fdatasync is the one thing replaced here: EIO, as a failing disk gives it."""
    w = sej.Writer(jdir)
    ok = w.submit(b"before")
    assert ok.result(timeout=scaled(30)) == 0

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(sej.commit, "_fdatasync", eio)
    delivered: list[BaseException | None] = []
    bad = w.submit(b"after", on_delivery=lambda e, o: delivered.append(e))
    with pytest.raises(sej.SyncError) as e:
        bad.result(timeout=scaled(30))
    assert isinstance(e.value, OSError) and isinstance(e.value.__cause__, OSError)
    assert e.value.__cause__.errno == errno.EIO and "fsync of" in str(e.value)
    assert isinstance(delivered[0], sej.SyncError)
    monkeypatch.setattr(sej.commit, "_fdatasync", getattr(os, "fdatasync", os.fsync))  # the disk "recovers"
    with pytest.raises(sej.SyncError):
        w.submit(b"later").result(timeout=scaled(30))  # sticky: the lost pages are not coming back
    with pytest.raises(sej.SyncError):
        w.sync()
    with pytest.raises(sej.SyncError):
        w.close()
    assert w.closed
    with sej.Writer(jdir) as again:  # reopening works (recovery decides what is there)
        assert again.next_offset >= 1


# -- on the system calls ------------------------------------------------------------------------------

CHILD = r"""
import os, sys, threading
import sej

d = sys.argv[1]
w = sej.Writer(d, segment_size=5000, durability=sys.argv[2])

def acked(err, off):
    assert err is None, err
    os.write(2, b"MARK acked %d\n" % off)

def producer(t):
    for i in range(40):
        w.submit(b"v" * 100, on_delivery=acked).result()

threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
w.close()
"""

FRAME = 100 + 26  # every message above: a 100-byte value, no key

LINE = re.compile(r"^(\d+)\s+(.*)$")


@pytest.mark.parametrize("durability", ["buffered", "sync"])
def test_an_ack_comes_only_after_an_fsync_that_began_after_its_bytes_were_written(
    tmp_path: Path, durability: str
) -> None:
    if shutil.which("strace") is None and not os.environ.get("CI"):
        pytest.skip("needs strace (CI installs it)")
    log = tmp_path / "strace.log"
    d = tmp_path / "j"
    subprocess.run(
        ["strace", "-f", "-qq", "-s", "100", "-o", str(log), "-e", "trace=openat,write,fdatasync,fsync",
         sys.executable, "-c", CHILD, str(d), durability],
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, timeout=scaled(120),
    )  # fmt: skip
    # Replay the trace: bytes written to segments (in order: each segment holds offsets from its name on),
    # fsyncs (what was written when each one began counts once it returned), and acks.
    paths: dict[int, str] = {}
    written: dict[str, int] = {}  # segment -> bytes written
    began: dict[str, dict[str, int]] = {}  # pid -> the segment bytes written when its fsync began
    durable_msgs = 0  # messages known durable: whole segments before, and bytes fsynced in the last
    firsts: dict[str, int] = {}
    acked: list[int] = []
    pending_call: dict[str, str] = {}  # pid -> unfinished call text
    for raw in log.read_text().splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        pid, text = m.groups()
        if text.endswith("<unfinished ...>"):
            pending_call[pid] = text[: -len("<unfinished ...>")]
            if text.startswith(("fdatasync(", "fsync(")):
                began[pid] = dict(written)
            continue
        if text.startswith("<... "):
            text = pending_call.pop(pid, "") + text.split("resumed>", 1)[1]
        elif text.startswith(("fdatasync(", "fsync(")):
            began[pid] = dict(written)
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
        fd = int(args.split(",")[0])
        path = paths.get(fd, "")
        if name == "write" and fd == 2 and "MARK acked" in args:
            off = int(args.split("MARK acked ")[1].split("\\n")[0])
            assert off < durable_msgs, f"offset {off} acknowledged, but only {durable_msgs} messages were fsynced"
            acked.append(off)
        elif name == "write" and path in firsts and ret > 0:
            written[path] = written.get(path, 0) + ret
        elif name in ("fdatasync", "fsync") and path in firsts and ret == 0:
            synced = began.get(pid, written).get(path, 0)
            durable_msgs = max(durable_msgs, firsts[path] + synced // FRAME)
    assert sorted(acked) == list(range(160))


def test_acks_thread_does_not_keep_a_dropped_writer_alive(jdir: str) -> None:
    import gc
    import warnings

    w = sej.Writer(jdir)
    f: Future[int] = w.submit(b"x")
    f.result(timeout=scaled(30))
    thread = w._acks._thread  # type: ignore[union-attr]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del w
        gc.collect()
    thread.join(scaled(30))
    assert not thread.is_alive()
    with sej.Writer(jdir) as again:  # the lock was released by the collected writer's close
        assert again.next_offset == 1


@pytest.mark.parametrize("raised", [SystemExit(0), KeyboardInterrupt()])
def test_a_callback_that_raises_systemexit_leaves_the_other_futures_and_the_thread_alive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, raised: BaseException
) -> None:
    """concurrent.futures catches only Exception from done-callbacks: anything else used to end the
    committer thread with the rest of its batch unresolved, and every later future with it."""

    def stop(err: BaseException | None, off: object) -> None:
        raise raised

    with sej.Writer(tmp_path / "j") as w:
        f1 = w.submit(b"one", on_delivery=stop)
        seen = threading.Event()
        f1.add_done_callback(lambda _: seen.set())  # the caller's own, after on_delivery's
        f2 = w.submit(b"two")  # likely in f1's batch, resolved after f1's callbacks
        assert f1.result(timeout=scaled(30)) == 0
        assert seen.wait(scaled(30)), "the future's later callbacks were skipped"
        assert f2.result(timeout=scaled(30)) == 1
        assert w.submit(b"three").result(timeout=scaled(30)) == 2  # the thread lives on
    assert "on_delivery callback" in caplog.text and type(raised).__name__ in caplog.text  # logged, not lost

    me = threading.current_thread()

    def caller_stops(_: object) -> None:
        if threading.current_thread() is not me:  # run here at once if f1 was resolved already
            raise raised

    with sej.Writer(tmp_path / "k") as w:  # the caller's own done-callback, which sej does not wrap
        f1 = w.submit(b"one")
        f1.add_done_callback(caller_stops)
        f2 = w.submit(b"two")
        assert f1.result(timeout=scaled(30)) == 0
        assert f2.result(timeout=scaled(30)) == 1
        assert w.submit(b"three").result(timeout=scaled(30)) == 2
    assert "a done-callback of an acknowledgement future raised" in caplog.text


def test_on_delivery_may_call_the_writer_when_its_messages_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure found while handing messages to the OS (here: the lock file deleted) is delivered without
    the writer's lock held: a callback that retries, as Kafka producers' do, used to deadlock the writer."""
    import sej.writer

    monkeypatch.setattr(sej.writer, "LOCK_CHECK_INTERVAL", 0.0)  # every write checks the lock
    d = tmp_path / "j"
    w = sej.Writer(d)
    assert w.submit(b"ok").result(timeout=scaled(30)) == 0
    retries: list[Future[int]] = []
    retried = threading.Event()

    def retry(err: BaseException | None, offset: object) -> None:
        assert err is not None
        retries.append(w.submit(b"retry"))
        retried.set()

    (d / "jnl.lck").unlink()
    f = w.submit(b"x", on_delivery=retry)
    with pytest.raises(sej.LockLostError):
        f.result(timeout=scaled(30))
    assert retried.wait(scaled(30)), "the callback's submit never returned"
    with pytest.raises(sej.LockLostError):
        retries[0].result(timeout=scaled(30))
    appended = threading.Event()

    def append_elsewhere() -> None:
        try:
            w.append(b"y")
        except sej.SejError:
            pass
        appended.set()

    threading.Thread(target=append_elsewhere, daemon=True).start()
    assert appended.wait(scaled(30)), "the writer stayed locked"
    with pytest.raises(sej.LockLostError):
        w.close()
