"""fdatasync without a thread: Linux native AIO (`IOCB_CMD_FDSYNC`, Linux 4.18+), through ctypes.

The kernel runs the fsync on its own worker and signals an eventfd when it is done, so an
event loop can wait for it like for a socket: no Python thread has to take the GIL back
between the fsync and the loop (durable `append_async` is 6-17% faster so than through a
committer thread, docs/benchmarks.md §4). `AioSync.open()` returns None
where this is not available (another OS or architecture, a seccomp filter, an exhausted
`fs.aio-max-nr`, or `SEJ_AIO=0` in the environment, for a sandbox whose seccomp filter
kills a process that asks): callers then fsync in a thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
import threading
from typing import Any

# (io_setup, io_destroy, io_getevents, io_submit) by machine; elsewhere AioSync.open() returns None.
_SYSCALLS = {"x86_64": (206, 207, 208, 209), "aarch64": (0, 1, 4, 2)}
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_IOCB = struct.Struct("<QIIHhIQQqQII")  # struct iocb (linux/aio_abi.h), 64 bytes
_EVENT = struct.Struct("<QQqq")  # struct io_event: data, obj, res, res2
EVENTS = 16
"""At most this many fsyncs in flight per context (io_setup's nr_events)."""


class AioSync:
    """One AIO context and its eventfd: `submit(fd, token)` starts an fdatasync of `fd`,
    `reap()` returns the (token, errno or 0) of those that finished once `fileno()` is readable."""

    __slots__ = ("_ctx", "_efd", "_iocb", "_iocbs", "_events", "_zero", "_nr", "_syscall")

    @classmethod
    def open(cls) -> AioSync | None:
        """A new context, or None where native AIO fsync is not available."""
        nr = _SYSCALLS.get(platform.machine()) if sys.platform == "linux" else None
        # A 32-bit Python on a 64-bit kernel reports the kernel's machine but makes 32-bit system
        # calls, whose numbers differ: those numbers would be other calls (setgroups32...).
        if nr is None or ctypes.sizeof(ctypes.c_void_p) != 8 or not hasattr(os, "eventfd"):
            return None
        if os.environ.get("SEJ_AIO", "1").strip() == "0":
            return None
        try:
            return cls(nr)
        except OSError:
            return None

    def __init__(self, nr: tuple[int, int, int, int]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._nr = nr
        self._ctx = ctypes.c_ulong(0)
        self._check(self._syscall(ctypes.c_long(nr[0]), ctypes.c_long(EVENTS), ctypes.byref(self._ctx)))
        try:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:
            self._syscall(ctypes.c_long(nr[1]), self._ctx)
            raise
        self._iocb = ctypes.create_string_buffer(_IOCB.size)  # the kernel copies it at io_submit
        self._iocbs = (ctypes.c_void_p * 1)(ctypes.addressof(self._iocb))
        self._events = ctypes.create_string_buffer(_EVENT.size * EVENTS)
        self._zero = (ctypes.c_long * 2)(0, 0)  # timespec: reap without waiting

    def fileno(self) -> int:
        """The eventfd that becomes readable when a submitted fsync finished."""
        return self._efd

    def submit(self, fd: int, token: int) -> None:
        """Start an fdatasync of `fd` (covering every byte written to it before this call); OSError if refused."""
        _IOCB.pack_into(self._iocb, 0, token, 0, 0, _IOCB_CMD_FDSYNC, 0, fd, 0, 0, 0, 0, _IOCB_FLAG_RESFD, self._efd)
        self._check(self._syscall(ctypes.c_long(self._nr[3]), self._ctx, ctypes.c_long(1), self._iocbs), 1)

    def drain(self) -> None:
        """Reset the eventfd (it stays readable until then)."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass

    def reap(self) -> list[tuple[int, int]]:
        """(token, errno or 0) of every finished fsync not reaped yet; never blocks."""
        return self._getevents(0, self._zero)

    def wait(self, n: int) -> list[tuple[int, int]]:
        """As reap(), but first waits until at least `n` submitted fsyncs have finished."""
        out: list[tuple[int, int]] = []
        while len(out) < n:
            try:
                out += self._getevents(n - len(out), None)
            except InterruptedError:
                continue
        return out

    def _getevents(self, least: int, timeout: Any) -> list[tuple[int, int]]:
        n = self._check(
            self._syscall(
                ctypes.c_long(self._nr[2]),
                self._ctx,
                ctypes.c_long(least),
                ctypes.c_long(EVENTS),
                self._events,
                timeout,
            )  # fmt: skip
        )
        out = []
        for i in range(n):
            token, _obj, res, _res2 = _EVENT.unpack_from(self._events, i * _EVENT.size)
            out.append((token, -res if res < 0 else 0))
        return out

    def close(self) -> None:
        """Close the eventfd, and destroy the context in a thread of its own: io_destroy waits for an RCU
        grace period (about 30 ms), which no caller should. Idempotent."""
        if self._efd >= 0:
            os.close(self._efd)  # the kernel holds its own reference while fsyncs it signals still run
            self._efd = -1
            destroy, ctx = ctypes.c_long(self._nr[1]), self._ctx
            # An interpreter that is exiting starts no thread: Python 3.11 waits forever in Thread.start
            # (3.12 raises). An unclosed writer is closed just then, by its __del__: destroy it here.
            if not sys.is_finalizing():
                try:
                    threading.Thread(target=self._syscall, args=(destroy, ctx), name="sej-aio-destroy",
                                     daemon=True).start()  # fmt: skip
                    return
                except RuntimeError:  # no thread to be had (a thread limit, or shutdown began)
                    pass
            self._syscall(destroy, ctx)

    def __del__(self) -> None:
        if getattr(self, "_efd", -1) >= 0:
            self.close()

    def _check(self, r: int, want: int | None = None) -> int:
        if r < 0 or (want is not None and r != want):
            e = ctypes.get_errno() if r < 0 else 0
            if e == errno.EINTR:
                raise InterruptedError(e, os.strerror(e))
            raise OSError(e, os.strerror(e) if e else f"io_submit took {r} of 1")
        return r


__all__ = ["EVENTS", "AioSync"]
