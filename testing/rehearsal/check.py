"""The rehearsal's invariants, each a function that returns what it found wrong (an empty list: it holds)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import pyarrow.parquet as pq

import sej
from sej.hub.copy import FILES_PER_JOURNAL


def sink_files(out: str) -> list[str]:
    """The Parquet files a Spark file sink committed, from its log (`_spark_metadata`), as Spark itself reads them:
    the last compacted batch's file and the batches after it; files of a killed batch are not in it."""
    log = os.path.join(out, "_spark_metadata")
    if not os.path.isdir(log):
        return []
    batches = {}
    for name in os.listdir(log):
        m = re.fullmatch(r"(\d+)(\.compact)?", name)
        if m:
            batches[int(m.group(1))] = name
    compacted = [b for b, n in batches.items() if n.endswith(".compact")]
    first = max(compacted) if compacted else 0
    files: dict[str, bool] = {}
    for b in sorted(b for b in batches if b >= first):
        with open(os.path.join(log, batches[b])) as f:
            lines = f.read().splitlines()
        for line in lines[1:]:  # the first is the log's version, "v1"
            entry = json.loads(line)
            path = entry["path"].removeprefix("file://")
            files[path] = entry.get("action", "add") == "add"
    return sorted(p for p, added in files.items() if added)


def output_rows(out: str) -> tuple[Counter[str], dict[str, set[int]], list[tuple[str, float]]]:
    """(rows per id, the offsets present per journal, (id, ingested at) of every row) of the sink's output."""
    ids: Counter[str] = Counter()
    offsets: dict[str, set[int]] = {}
    ingested = []
    for path in sink_files(out):
        t = pq.read_table(path, columns=["id", "journal", "offset", "ingested"])
        for mid, journal, offset, at in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            ids[mid] += 1
            offsets.setdefault(journal, set()).add(offset)
            ingested.append((mid, at.timestamp()))
    return ids, offsets, ingested


def exactly_once(acked: dict[str, tuple[str, int, float]], ids: Counter[str], complete: bool) -> list[str]:
    """No row twice; with `complete`, every acknowledged message once (`acked` by id)."""
    problems = [f"{mid} is in the output {n} times" for mid, n in ids.items() if n > 1]
    if complete:
        missing = [mid for mid in acked if mid not in ids]
        problems += [f"acknowledged {mid} (journal {acked[mid][0]} offset {acked[mid][1]}) is not in the output"
                     for mid in missing[:20]]  # fmt: skip
        if len(missing) > 20:
            problems.append(f"... {len(missing)} acknowledged messages missing in all")
    return problems


def segment_bytes(journal: str) -> dict[str, bytes]:
    d = os.path.join(journal, "jnl")
    out = {}
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        try:
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
        except FileNotFoundError:
            pass  # retention deleted it meanwhile
    return out


def hub_is_prefix(producer_root: str, hub_root: str, client: str) -> list[str]:
    """Every hub segment still on the producer is a byte prefix of it (whole, when a later segment exists there)."""
    problems = []
    for j in sorted(os.listdir(producer_root)):
        hub = segment_bytes(os.path.join(hub_root, f"{client}.{j}"))  # the hub's first: the producer only grows
        theirs = segment_bytes(os.path.join(producer_root, j))
        for name, mine in hub.items():
            if name not in theirs:
                continue  # deleted by retention on the producer since
            whole = name != max(hub)  # the hub has begun a later segment: this one is complete
            if (theirs[name] != mine) if whole else not theirs[name].startswith(mine):
                problems.append(f"{j}/{name}: the hub's {len(mine)} bytes are not a prefix of the producer's")
    return problems


def stuck(producer_root: str, hub_root: str, client: str) -> list[str]:
    """Journals whose hub copy is behind the producer's."""
    out = []
    for j in sorted(os.listdir(producer_root)):
        theirs = sej.next_offset(os.path.join(producer_root, j))
        hub = os.path.join(hub_root, f"{client}.{j}")
        mine = sej.next_offset(hub) if os.path.isdir(os.path.join(hub, "jnl")) else 0
        if mine != theirs:
            out.append(f"{j}: the hub is at {mine}, the producer at {theirs}")
    return out


DELETED = re.compile(r"^deleted (\S+)/jnl/[0-9a-f]{16}\.jnl: offsets (\d+)-(\d+)")


def deleted_ranges(text: str) -> list[tuple[str, int, int]]:
    """(journal directory, first, last offset) of each segment a `sej-retention` run reported deleting."""
    return [(m.group(1), int(m.group(2)), int(m.group(3))) for m in map(DELETED.match, text.splitlines()) if m]


RECOVERED = re.compile(r"connected to|working again|copied \d+ messages|hub stopped")


def unrecovered(logs: list[str]) -> list[str]:
    """Errors and warnings of the hub's logs (one per daemon run, in order, JSON lines) with no later sign of
    recovery: a connection, a client working again, messages copied."""
    lines = []
    for path in logs:
        with open(path, errors="replace") as f:
            for raw in f:
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    lines.append({"level": "ERROR", "message": raw.strip()})  # a traceback or a stray line
    last_ok = max((i for i, r in enumerate(lines) if RECOVERED.search(r.get("message", ""))), default=-1)
    return [f"{r['level']}: {r['message'][:300]}" for i, r in enumerate(lines)
            if r.get("level") in ("ERROR", "CRITICAL", "WARNING") and i > last_ok]  # fmt: skip


FLAT_QUANTILE = 0.95
"""Flatness compares this quantile of each half, the level the daemon sits at: a leak raises it, while one sample
taken in a busy pass does not (the 2-hour run at stop 45: open files net of the journals' sat at
6 in both halves, and one sample of 1,380 read 10 in a pass copying a burst, with 13 threads)."""


def flat(samples: list[dict[str, float]], key: str, slack: float) -> str | None:
    """Whether `key` stays flat over the second half of the samples: its level there (FLAT_QUANTILE) is at most its
    level over the first half times 1 + `slack`, plus one unit (a leak raises the level; the journals stop growing
    before the second half). The peaks are named too."""
    n = len(samples)
    if n < 8:
        return None
    earlier = sorted(s[key] for s in samples[: n // 2])
    later = sorted(s[key] for s in samples[n // 2 :])
    before, after = (v[min(len(v) - 1, int(FLAT_QUANTILE * len(v)))] for v in (earlier, later))
    if after > before * (1 + slack) + 1:
        return (f"{key} grew: {FLAT_QUANTILE:.0%} of the samples at or under {before:.0f} in the first half, "
                f"{after:.0f} in the second (peaks {earlier[-1]:.0f} and {later[-1]:.0f})")  # fmt: skip
    return None


def bounded(samples: list[dict[str, float]], workers: int) -> list[str]:
    """The daemon's bounds (docs/hub.md, "What the daemon holds"), for one client: threads at most 8 + 3 per
    worker, whatever the journals; open files at most 64 + FILES_PER_JOURNAL (4) per journal at the hub (its kept
    journals)."""
    out = []
    for s in samples:
        if s["threads"] > 8 + 3 * workers:
            out.append(f"{s['threads']} threads at {s['t']} s, more than 8 + 3 x {workers} workers")
        if s["files"] > 64 + FILES_PER_JOURNAL * s["journals"]:
            out.append(f"{s['files']} open files at {s['t']} s, more than 64 + {FILES_PER_JOURNAL} x "
                       f"{s['journals']} journals")  # fmt: skip
    return out[:20]
