"""Benchmark 18: a journal whose writer flushes every message (a checksum record each): a hub pass, reopening the
writer and starting a reader late in the segment, against reading and validating its checksum file whole (what
each of them did before: sej.hub.copy.SumsMark, sej.checksum.tail_records, SumReader.skip_to)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import sej

from .common import FRAME_SIZE, KEY, Config, fresh, log, perf_counter, values_for
from .hub import _sshd
from .results import Result, Row, fmt_list, ratio

FLUSHES = (10_000, 100_000, 300_000)
"""Messages in the journal's segment when a pass copies one more, each flushed alone (a checksum record each)."""


def _open_times(jdir: str, reps: int, n: int, times: dict[tuple[int, str], list[float]]) -> None:
    """Writer open, scanner start and a whole parse of the checksum file, interleaved, `reps` times each."""
    from sej.checksum import HEADER, parse_records

    sums = next(Path(jdir, "idx").glob("*.sum"))
    next_offset = sej.next_offset(jdir)

    def writer() -> None:
        sej.Writer(jdir).close()

    def scanner() -> None:
        with sej.Scanner(jdir, next_offset - 5, verify=True) as s:
            next(iter(s))

    def parse() -> None:
        raw = sums.read_bytes()
        _records, problem = parse_records(memoryview(raw)[HEADER.size :], 0)
        assert problem is None

    for _ in range(reps):
        for key, run in (("writer", writer), ("scanner", scanner), ("parse", parse)):
            t = perf_counter()
            run()
            times.setdefault((n, key), []).append(perf_counter() - t)


def bench_hub_sums(cfg: Config, scratch: Path) -> list[Result]:
    from sej.hub import CopyState, copy_all
    from sej.hub.ssh import connect, resolve, sftp_sources

    server = _sshd()
    if server is None:
        log("  openssh-server is missing: skipped")
        return []
    value = values_for(1)[0]
    reps = 3 if cfg.quick else 7
    sizes = FLUSHES[:2] if cfg.quick else FLUSHES
    times: dict[tuple[int, str], list[float]] = {}
    sums_bytes: dict[int, int] = {}
    try:
        ep = resolve("127.0.0.1", server.port, server.user, str(server.identity), str(server.known_hosts),
                     ssh_config=os.devnull)  # fmt: skip
        client = connect(ep)
        try:
            for n in sizes:
                src, hub = fresh(scratch / "sumssrc"), fresh(scratch / "sumshub")
                make = sftp_sources(client, str(src), "bench")
                with sej.Writer(str(src / "ev")) as w:
                    for _ in range(n):
                        w.append(value, KEY)
                        w.flush()
                    state = CopyState()
                    copy_all(make, str(hub), "c", "bench", state=state)
                    for k in range(reps):  # interleaved, each first in turn
                        for how in ("mark", "whole") if k % 2 == 0 else ("whole", "mark"):
                            w.append(value, KEY)
                            w.flush()
                            if how == "whole":
                                state.sums.clear()  # no mark: the checksum file is read whole
                            t = perf_counter()
                            (o,) = copy_all(make, str(hub), "c", "bench", state=state)
                            times.setdefault((n, how), []).append(perf_counter() - t)
                            assert o.error is None and o.result is not None and o.result.messages == 1, o
                sums_bytes[n] = sum(p.stat().st_size for p in (src / "ev" / "idx").glob("*.sum"))
                _open_times(str(src / "ev"), reps, n, times)
                log(f"  {n:,} flushes: mark {statistics.median(times[n, 'mark']) * 1e3:.1f} ms, "
                    f"whole {statistics.median(times[n, 'whole']) * 1e3:.1f} ms")  # fmt: skip
            fresh(scratch / "sumssrc")
            fresh(scratch / "sumshub")
        finally:
            client.close()
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    top = sizes[-1]
    opens = [
        Row(
            f"{n:,} one-message flushes: {what} vs reading and validating its checksum file whole",
            f"{med[n, key] * 1e3:,.2f} ms",
            f"{med[n, 'parse'] * 1e3:,.1f} ms",
            ratio(med[n, "parse"] / med[n, key]),
        )
        for n in sizes
        for what, key in (
            ("opening a `Writer` on the journal", "writer"),
            ("a `Scanner(verify=True)` from 5 messages before the end, to its first message", "scanner"),
        )  # fmt: skip
    ]
    rows = [
        Row(
            f"{n:,} one-message flushes in the segment (checksum file {sums_bytes[n] / 2**20:,.1f} MiB): a pass "
            "copying 1 new message, from the last pass's mark vs reading the checksum file whole",
            f"{med[n, 'mark'] * 1e3:,.1f} ms",
            f"{med[n, 'whole'] * 1e3:,.1f} ms",
            ratio(med[n, "whole"] / med[n, "mark"]),
        )
        for n in sizes
    ]
    summary = Row(
        f"A pass copying 1 message into a journal of {top:,} one-message flushes, over SSH: from the mark vs whole",
        rows[-1].measured,
        rows[-1].baseline,
        rows[-1].ratio,
    )
    return [
        Result(
            "hub_sums",
            "18. A journal that flushes every message",
            [
                "One journal whose writer flushes every message (one 16-byte record per message in its segment's "
                "checksum file), copied over a real sshd on 127.0.0.1 with `copy_all` and a `CopyState` kept "
                "between passes, as `sej-hub` keeps it. Before each timed pass the writer appends and flushes one "
                "message; the pass copies it (checked against the producer's checksums).",
                "Baseline: the same pass with the state's marks dropped (`state.sums.clear()`), so it reads the "
                "checksum file whole, as every pass did before the marks.",
                "Then, on the same journal: opening a `Writer` (which makes the checksum file agree with the segment) "
                "and a verifying `Scanner` started 5 messages before the end, until its first message; baseline: "
                "reading the checksum file and validating all its records (`parse_records`), which each of them "
                "did at start before reading from the end (writer) or by binary search (scanner).",
            ],
            rows + opens,
            [
                f"Medians of {reps} passes each, interleaved; all passes (s): "
                + "; ".join(
                    f"{n:,}: mark {fmt_list(times[n, 'mark'])}, whole {fmt_list(times[n, 'whole'])}" for n in sizes
                )  # fmt: skip
                + ".",
                "Ratio: the whole-file pass's time ÷ the pass from the mark (higher: the mark saves more). A 1 GiB "
                f"segment (the writer's default) of these {FRAME_SIZE}-byte frames flushed one by one has a checksum "
                f"file of {(1 << 30) // FRAME_SIZE * 16 / 2**20:,.0f} MiB.",
            ],
            summary,
        )
    ]
