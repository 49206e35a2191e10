"""Time in the tests: event-driven waits, and deadlines multiplied by one factor (helper module, not a test file).

The tests run on shared machines (CI, a laptop building something else), where a load average of 10 or more
on 2 cores is normal. So no test waits a fixed time for something to happen: it waits for the event itself
(a line from a child process, a file, a condition it polls). A deadline only bounds a wait so that a failure
ends the test instead of hanging it, and every deadline, as well as every bound on how long something may
take, is written as ``scaled(seconds)``: the seconds an idle machine needs with room to spare, multiplied by

    SEJ_TEST_TIMEOUT_SCALE   (default 10: enough for a load average of 10-13 on 2 cores)

A generous factor costs nothing when things work, since the waits end as soon as the event happens; it only
makes a real hang take longer to be reported. Set SEJ_TEST_TIMEOUT_SCALE=1 on an idle machine for the
tightest bounds.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

DEFAULT_SCALE = 10.0


def _scale() -> float:
    raw = os.environ.get("SEJ_TEST_TIMEOUT_SCALE", "").strip()
    if not raw:
        return DEFAULT_SCALE
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"SEJ_TEST_TIMEOUT_SCALE must be a number >= 1, got {raw!r}") from None
    if not value >= 1:
        raise ValueError(f"SEJ_TEST_TIMEOUT_SCALE must be a number >= 1, got {raw!r}")
    return value


SCALE = _scale()


def scaled(seconds: float) -> float:
    """`seconds` (enough on an idle machine) times SEJ_TEST_TIMEOUT_SCALE."""
    return seconds * SCALE


def wait_until(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll `cond` until it is true; AssertionError naming `what` after `timeout` seconds (pass scaled(...))."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _waiting_in(thread: threading.Thread, filename_suffix: str) -> bool:
    """True if `thread` is blocked in threading's wait(), called directly from a file whose name ends so.

    Directly: the first frame below threading's own is that file's (a Thread.start() or an Event.wait()
    deeper down, in a library that file calls, is not what is being waited for).
    """
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or frame.f_code.co_name != "wait" or not frame.f_code.co_filename.endswith("threading.py"):
        return False
    f = frame.f_back
    while f is not None and f.f_code.co_filename.endswith("threading.py"):
        f = f.f_back
    return f is not None and f.f_code.co_filename.replace(os.sep, "/").endswith(filename_suffix)


def wait_until_scanner_waits(thread: threading.Thread, timeout: float | None = None) -> None:
    """Wait until `thread` is blocked in a Scanner's wait for new data (not still reading or yielding).

    Used before changing a journal under a scanner "that is waiting": the event itself, instead of a sleep
    that is long enough on an idle machine only.
    """
    wait_until(
        lambda: _waiting_in(thread, "sej/scanner.py") or not thread.is_alive(),
        scaled(10) if timeout is None else timeout,
        "the scanner to wait for new data",
        interval=0.005,
    )
    assert thread.is_alive(), "the scanner thread ended instead of waiting for new data"
