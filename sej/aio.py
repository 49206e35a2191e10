"""fdatasync without a thread: Linux native AIO (`IOCB_CMD_FDSYNC`, Linux 4.18+), through ctypes.

The kernel runs the fsync on its own worker and signals an eventfd when it is done, so an
event loop can wait for it like for a socket: no Python thread has to take the GIL back
between the fsync and the loop (on two cores that hand-off cost a fifth of the throughput
of durable `append_async`, see docs/benchmarks.md §4). `AioSync.open()` returns None
where this is not available (another OS or architecture, a seccomp filter, an exhausted
`fs.aio-max-nr`): callers then fsync in a thread.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

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
        if nr is None or not hasattr(os, "eventfd"):
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

    def reap(self) -> list[tuple[int, int]]:
        """(token, errno or 0) of every finished fsync not reaped yet; never blocks."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        n = self._check(
            self._syscall(
                ctypes.c_long(self._nr[2]), self._ctx, ctypes.c_long(0), ctypes.c_long(EVENTS), self._events, self._zero
            )  # fmt: skip
        )
        out = []
        for i in range(n):
            token, _obj, res, _res2 = _EVENT.unpack_from(self._events, i * _EVENT.size)
            out.append((token, -res if res < 0 else 0))
        return out

    def close(self) -> None:
        """Destroy the context (the kernel waits for fsyncs still running) and close the eventfd."""
        if self._efd >= 0:
            self._syscall(ctypes.c_long(self._nr[1]), self._ctx)
            os.close(self._efd)
            self._efd = -1

    def _check(self, r: int, want: int | None = None) -> int:
        if r < 0 or (want is not None and r != want):
            e = ctypes.get_errno() if r < 0 else 0
            raise OSError(e, os.strerror(e) if e else f"io_submit took {r} of 1")
        return r


__all__ = ["EVENTS", "AioSync"]
