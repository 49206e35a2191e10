"""What the rehearsal watches while it runs: the producers' acks, append-to-hub latencies, the daemon's resources."""

from __future__ import annotations

import os
import re
import time
from array import array
from collections import deque
from dataclasses import dataclass, field

import sej
from sej.errors import SejError

ACK_LINE = re.compile(r"(\S+) (\d+) (\S+) (\d+\.\d{6})")
"""A whole line of a producer's ack log (`producer.py`)."""


class Acks:
    """Every acknowledged message, read from the producers' ack logs as they grow (whole lines only)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._pos: dict[str, int] = {}
        self._rest: dict[str, bytes] = {}
        self.acked: dict[str, tuple[str, int, float]] = {}  # id -> (journal, offset, acked at)
        self.torn = 0  # ack lines a kill cut short (no ack)

    def read(self) -> list[tuple[str, int, str, float]]:
        """The lines appended since the last call: (journal, offset, id, acked at)."""
        new = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            with open(path, "rb") as f:
                f.seek(self._pos.get(name, 0))
                data = self._rest.pop(name, b"") + f.read()
                self._pos[name] = f.tell()
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                self._rest[name] = data[cut:]  # a line being written
            for line in data[:cut].decode(errors="replace").splitlines():
                m = ACK_LINE.fullmatch(line)
                if m is None:  # a line a SIGKILL cut short, ended by the producer's next incarnation: no ack
                    self.torn += 1
                    continue
                journal, offset, mid, at = m.group(1), int(m.group(2)), m.group(3), float(m.group(4))
                new.append((journal, offset, mid, at))
                self.acked[mid] = (journal, offset, at)
        return new


@dataclass
class Latency:
    """Append-to-hub latency: from a message's ack to the poll that finds it in the hub's copy."""

    hub_root: str
    client: str
    pending: dict[str, deque[tuple[int, float]]] = field(default_factory=dict)
    seconds: array = field(default_factory=lambda: array("d"))  # type: ignore[type-arg]
    _turn: int = 0

    def add(self, acked: list[tuple[str, int, str, float]]) -> None:
        for journal, offset, _mid, at in acked:
            self.pending.setdefault(journal, deque()).append((offset, at))

    def poll(self, most: int = 64) -> None:
        """Look at the hub's copies of at most `most` journals with messages on their way, round robin (a look
        costs about 0.5 ms: hundreds at every tick would take a core). The latency measured is the time to
        the look that finds a message, so it is late by up to len(pending) / most looks."""
        waiting_on = [j for j, w in self.pending.items() if w]
        if not waiting_on:
            return
        start = self._turn % len(waiting_on)
        self._turn += most
        for journal in (waiting_on[start:] + waiting_on[:start])[:most]:
            waiting = self.pending[journal]
            try:
                have = sej.next_offset(os.path.join(self.hub_root, f"{self.client}.{journal}"))
            except (SejError, OSError):
                continue  # not at the hub yet
            now = time.time()
            while waiting and waiting[0][0] < have:
                self.seconds.append(now - waiting.popleft()[1])

    def behind(self) -> int:
        return sum(len(w) for w in self.pending.values())


def process_resources(pid: int) -> dict[str, int] | None:
    """RSS (KiB), open files, threads and inotify watches of a process; None once it is gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = os.listdir(f"/proc/{pid}/fd")
        watches = 0
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    watches += sum(1 for line in f if line.startswith("inotify wd:"))
            except OSError:
                pass  # closed meanwhile
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_kib": int(fields["VmRSS"].split()[0]),
        "files": len(fds),
        "threads": int(fields["Threads"]),
        "watches": watches,
    }


def hub_journals(hub_root: str) -> int:
    return sum(1 for d in os.listdir(hub_root) if not d.startswith(".")) if os.path.isdir(hub_root) else 0
