"""A benchmark's result (its section of the report) and the formatting of its table cells."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Row:
    label: str
    measured: str
    baseline: str = "—"
    ratio: str = "—"
    target: str = "—"
    result: str = "info"


@dataclass
class Result:
    key: str
    title: str
    what: list[str]
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    summary: Row | None = None  # the row that carries the target
    more: list[tuple[str, Row]] = field(default_factory=list)  # further summary rows: (what, row), in order

    def summaries(self) -> list[tuple[str, Row]]:
        """The summary table's rows of this benchmark: (first cell, row)."""
        first = [(self.title, self.summary)] if self.summary is not None else []
        return first + [(f"{self.title}: {what}", row) for what, row in self.more]


def rate(n: float) -> str:
    return f"{n:,.0f} msg/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def ratio(r: float) -> str:
    return f"{r:.3f}x"


def verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**MISS**"


def medians(n: int, ours_t: list[float], raw_t: list[float]) -> str:
    """A second view, less sensitive to one lucky run: the medians and their ratio."""
    mo, mr = n / statistics.median(ours_t), n / statistics.median(raw_t)
    return f"Medians of the same runs: sej {rate(mo)}, raw {rate(mr)}, ratio {ratio(mo / mr)}."


def fmt_list(ts: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in ts)
