"""The rehearsal's fault schedule: what is broken when, drawn once from the seed (the same seed, the same faults)."""

from __future__ import annotations

import random
from dataclasses import dataclass

# One fault of each kind every PERIOD seconds of the faulty time on average, and at least MINIMUM of each
# (a 2-hour run: about 40 producer kills, 30 hub kills, 8 sshd outages, 15 cuts and 12 Spark driver kills).
PERIOD = {"producer_kill": 150.0, "hub_kill": 200.0, "sshd_outage": 800.0, "cut": 400.0, "spark_kill": 500.0}
MINIMUM = {"producer_kill": 2, "hub_kill": 2, "sshd_outage": 1, "cut": 1, "spark_kill": 1}


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the start
    kind: str  # a key of PERIOD
    target: int  # the producer's number (producer_kill), else 0
    down: float  # how long it stays broken: seconds before the restart (kills, outages)


def schedule(seed: int, duration: float, producers: int, warmup: float = 10.0) -> list[Fault]:
    """Faults between `warmup` and `duration`, in time order."""
    rng = random.Random(f"faults/{seed}")
    span = max(1.0, duration - warmup)
    out = []
    for kind, period in PERIOD.items():
        n = max(MINIMUM[kind], round(span / period))
        for _ in range(n):
            down = {"sshd_outage": rng.uniform(5, 40), "hub_kill": rng.uniform(0, 5),
                    "producer_kill": rng.uniform(0, 3)}.get(kind, 0.0)  # fmt: skip
            target = rng.randrange(producers) if kind == "producer_kill" else 0
            out.append(Fault(warmup + rng.uniform(0, span), kind, target, down))
    return sorted(out, key=lambda f: f.at)
