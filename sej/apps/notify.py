"""systemd's notify protocol (sd_notify(3)), spoken directly: one datagram per state, a few lines.

Not the `sdnotify` package: the protocol is a single sendto() of "KEY=VALUE" lines to the
AF_UNIX datagram socket named by $NOTIFY_SOCKET ('@' for Linux's abstract namespace), and a
dependency for that would be one more thing to install and trust. Without $NOTIFY_SOCKET (not
under systemd, or Type=simple), every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    """Tells systemd READY=1, STATUS=..., STOPPING=1, and WATCHDOG=1 at half of WatchdogSec."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.interval: float | None = None  # seconds between WATCHDOG=1 pings; None: no watchdog
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.interval = int(usec) / 2e6  # half the timeout, as sd_watchdog_enabled(3) advises
        self._next_ping = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *states: str) -> bool:
        """Send "KEY=VALUE" states in one datagram; False if there is no socket or it failed."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto("\n".join(states).encode(), self.address)
            return True
        except OSError:
            return False  # systemd gone, or not ours: the service works on without it

    def ready(self, status: str = "") -> None:
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def ping(self, alive: bool = True, status: str = "") -> None:
        """WATCHDOG=1 when due (every `interval`) and `alive`; a hub that is not alive lets systemd restart it."""
        if self.interval is None or not alive:
            return
        now = time.monotonic()
        if now >= self._next_ping:
            self._next_ping = now + self.interval
            self.send("WATCHDOG=1", *([f"STATUS={status}"] if status else []))


__all__ = ["Notifier"]
