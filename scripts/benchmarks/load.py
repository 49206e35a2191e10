"""The machine's load: how much CPU other processes took while a benchmark ran, and waiting for an idle machine."""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from .common import log, perf_counter


class Proc(NamedTuple):
    """One process, from /proc/PID/stat; CPU times in clock ticks (os.sysconf("SC_CLK_TCK") a second)."""

    ppid: int
    flags: int
    own: int  # utime + stime
    reaped: int  # cutime + cstime: of its children that ended and were waited for
    comm: str


def processes() -> dict[int, Proc]:
    """Every process in /proc by pid (those that end while it reads are left out)."""
    procs: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        v = raw[raw.rindex(")") + 2 :].split()  # the fields after "pid (comm)", which may hold spaces
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        procs[int(name)] = Proc(int(v[1]), int(v[6]), int(v[11]) + int(v[12]), int(v[13]) + int(v[14]), comm)
    return procs


def my_tree(procs: dict[int, Proc]) -> set[int]:
    """The pids of this process and of its descendants among `procs`."""
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, p in procs.items():
            if p.ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return mine


class CpuShare:
    """CPU time that other user processes (and the hypervisor, as steal) took while a benchmark ran.

    Sums utime+stime (+ reaped children) of every user-space process outside this
    process's tree, from /proc; kernel threads (the writeback our own I/O causes)
    are not counted.
    """

    PF_KTHREAD = 0x00200000

    def __init__(self) -> None:
        self.hz = os.sysconf("SC_CLK_TCK")
        self.ncpu = os.cpu_count() or 1

    @classmethod
    def _others(cls) -> int:
        procs = {pid: p for pid, p in processes().items() if not p.flags & cls.PF_KTHREAD}
        mine = my_tree(procs)
        return sum(p.own + p.reaped for pid, p in procs.items() if pid not in mine)

    @staticmethod
    def _steal() -> int:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) if len(v) > 8 else 0

    def __enter__(self) -> CpuShare:
        self.t0 = perf_counter()
        self.others0 = self._others()
        self.steal0 = self._steal()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = perf_counter() - self.t0
        self.other_s = max(0, self._others() - self.others0) / self.hz
        self.steal_s = max(0, self._steal() - self.steal0) / self.hz

    @property
    def other(self) -> float:
        return self.other_s / max(self.wall * self.ncpu, 1e-9)

    def text(self) -> str:
        steal = self.steal_s / max(self.wall * self.ncpu, 1e-9)
        return (
            f"other processes used {self.other:.0%} of the machine's CPU time meanwhile (hypervisor steal {steal:.0%})"
        )


class LoadTotal:
    """The sum of several CpuShare measurements."""

    def __init__(self) -> None:
        self.parts: list[CpuShare] = []

    def text(self) -> str:
        wall = sum(p.wall for p in self.parts)
        cap = max(wall * (os.cpu_count() or 1), 1e-9)
        other = sum(p.other_s for p in self.parts) / cap
        steal = sum(p.steal_s for p in self.parts) / cap
        return f"other processes used {other:.0%} of the machine's CPU time (hypervisor steal {steal:.0%})"


def wait_idle(limit: float) -> str:
    """Wait (up to `limit` s) until the machine is idle: under 10% CPU busy over one second."""
    if limit <= 0:
        return ""
    t0 = perf_counter()
    while True:
        with CpuShare() as c:
            time.sleep(1.0)
        if c.other < 0.10 or perf_counter() - t0 >= limit:
            break
    waited = perf_counter() - t0
    if c.other >= 0.10:
        log(f"  machine still busy after {waited:.0f} s ({c.other:.0%}); running anyway")
    return f"waited {waited:.0f} s for an idle machine" + ("" if c.other < 0.10 else " (still busy)")
