"""The data's life on the hub: a streaming query, the archive job and retention together, on a real Spark.

Retention may delete only what every reader has passed: the archive (required before it
first runs), the streaming query's `ofs/spark-<name>.ofs` and any other reader. After
retention, the Parquet archive plus what is left in the journals still hold every
message exactly once.
"""

from __future__ import annotations

import os

import sej
from sej.offset import read_offset_file
from sej.retention import apply_retention, plan_retention
from sej.spark.archive import archive

from .test_spark_archive import archived_rows, journal_rows, write_messages
from .test_spark_stream import run_available_now


def retain(root: str) -> dict[str, list[int]]:
    """Retention with every limit at its tightest and the archive required; the segments deleted per journal."""
    deleted = {}
    for j in sej.find_journals(root):
        plan = plan_retention(j.path, max_messages=0, required_readers=("archive",))
        result = apply_retention(plan)
        deleted[j.name] = [d.segment.first_offset for d in result.deleted]
    return deleted


def test_retention_never_deletes_what_the_archive_or_a_stream_has_not_passed(spark, tmp_path) -> None:
    root, dest = str(tmp_path / "hub"), str(tmp_path / "archive")
    write_messages(root, 0, 1600)
    everything = journal_rows(root)
    journals = {j.name: j.path for j in sej.find_journals(root)}

    # A streaming query; its reader offset lags its checkpoint by the last micro-batch.
    run_available_now(
        spark, root, str(tmp_path / "ck"), str(tmp_path / "out"), maxRecordsPerTrigger="600", queryName="daily"
    )
    stream_at = {n: read_offset_file(os.path.join(p, "ofs", "spark-daily.ofs")) for n, p in journals.items()}
    assert all(v is not None for v in stream_at.values())

    # Before the archive has ever run, nothing may go.
    assert retain(root) == {n: [] for n in journals}

    # The archive stops at the stream's position (rounded down to a segment), retention follows it.
    report = archive(spark, root, dest)
    archived_to = {n: read_offset_file(os.path.join(p, "ofs", "archive.ofs")) for n, p in journals.items()}
    assert report.rows > 0
    for n in journals:
        assert archived_to[n] is not None and archived_to[n] <= stream_at[n]  # type: ignore[operator]
    firsts_before = {n: [s.first_offset for s in sej.list_segments(p)] for n, p in journals.items()}
    deleted = retain(root)
    assert any(deleted.values()), "retention had archived, read segments to delete"
    for n, p in journals.items():
        segs = firsts_before[n]
        for first in deleted[n]:
            end = segs[segs.index(first) + 1]
            assert end <= archived_to[n] and end <= stream_at[n]  # type: ignore[operator]
        kept = sej.list_segments(p)
        assert kept[0].first_offset <= min(archived_to[n], stream_at[n])  # type: ignore[type-var]
        assert len(kept) >= 1 and kept[-1].first_offset == segs[-1]  # the last segment is never deleted

    # Everything is still there exactly once: the archive below each journal's first kept offset, the journal above.
    in_journals = journal_rows(root)
    first_kept = {n: sej.first_offset(p) for n, p in journals.items()}
    in_archive = [r for r in archived_rows(spark, dest) if r[2] < first_kept[journal_name(r)]]
    assert sorted(in_archive + in_journals, key=repr) == everything

    # The stream goes on from its checkpoint without data loss: it had read past everything deleted.
    run_available_now(spark, root, str(tmp_path / "ck"), str(tmp_path / "out"), queryName="daily")
    got = sorted((r.shard, r.offset) for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == sorted((r[1], r[2]) for r in everything)


def journal_name(row: tuple) -> str:  # type: ignore[type-arg]
    """The journal an archived row came from: `<client>.<shard>` in a hub root, `<shard>` elsewhere."""
    client, shard = row[0], row[1]
    return str(shard) if client is None else f"{client}.{shard}"
