"""The Spark source's options: Kafka-source names, time bounds in ms, and unknown names refused (no Spark needed).

The readers are built as Spark builds them (SejDataSource(options).reader / .streamReader) and
planned and read in this process, so each option's effect is checked on the rows read.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

import sej  # noqa: E402
from sej.spark.options import ALIASES, BATCH_OPTIONS, STREAM_OPTIONS, checked  # noqa: E402
from sej.spark.read import read_partition  # noqa: E402
from sej.spark.source import SejDataSource  # noqa: E402

MS = 1_700_000_000_000  # ms since the epoch of message 0; message i is i seconds later


def write_root(root: str) -> None:
    for name in ("a.ev.1.000", "a.ev.1.001"):
        with sej.Writer(f"{root}/{name}") as w:
            for i in range(20):
                w.append(b"%d" % i, timestamp=(MS + i * 1000) * 1_000_000)


def batch_offsets(root: str, **options: str) -> dict[str, list[int]]:
    reader = SejDataSource({"path": root, **options}).reader(None)  # type: ignore[arg-type]
    out: dict[str, list[int]] = {}
    for p in reader.partitions():
        for b in read_partition(p):
            for shard, off in zip(b.column("shard").to_pylist(), b.column("offset").to_pylist()):
                out.setdefault(shard, []).append(off)
    return {k: sorted(v) for k, v in out.items()}


def test_batch_kafka_positions_and_timestamps(tmp_path) -> None:
    root = str(tmp_path)
    write_root(root)
    every = list(range(20))
    assert batch_offsets(root, startingOffsets="earliest", endingOffsets="latest") == {
        "ev.1.000": every, "ev.1.001": every}  # fmt: skip
    assert batch_offsets(root, startingOffsets="latest") == {}
    assert batch_offsets(root, startingTimestamp=str(MS + 5000), endingTimestamp=str(MS + 8000)) == {
        "ev.1.000": [5, 6, 7], "ev.1.001": [5, 6, 7]}  # fmt: skip
    by_journal = batch_offsets(
        root,
        startingOffsetsByTimestamp=json.dumps({"a.ev.1.000": MS + 15_000}),
        endingOffsetsByTimestamp=json.dumps({"a.ev.1.001": MS + 2_000}),
    )
    assert by_journal == {"ev.1.000": list(range(15, 20)), "ev.1.001": [0, 1]}
    # Ours and Kafka's together: the narrower bound wins.
    both = batch_offsets(root, startTime=str((MS + 3000) * 1_000_000), startingTimestamp=str(MS + 4000))
    assert both == {"ev.1.000": list(range(4, 20)), "ev.1.001": list(range(4, 20))}


def stream_batches(root: str, **options: str) -> list[dict[str, list[int]]]:
    reader = SejDataSource({"path": root, **options}).streamReader(None)  # type: ignore[arg-type]
    start = reader.initialOffset()
    out = []
    for _ in range(100):
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            return out
        got: dict[str, list[int]] = {}
        for p in reader.partitions(start, end):
            for b in read_partition(p):
                for shard, off in zip(b.column("shard").to_pylist(), b.column("offset").to_pylist()):
                    got.setdefault(shard, []).append(off)
        out.append({k: sorted(v) for k, v in got.items()})
        start = end
    raise AssertionError("the stream did not end")


def test_stream_max_offsets_per_trigger_is_max_records_per_trigger(tmp_path) -> None:
    root = str(tmp_path)
    write_root(root)
    kafka = stream_batches(root, maxOffsetsPerTrigger="10")
    ours = stream_batches(root, maxRecordsPerTrigger="10")
    assert kafka == ours and len(kafka) == 4 and all(sum(map(len, b.values())) == 10 for b in kafka)


def test_stream_starting_timestamps(tmp_path) -> None:
    root = str(tmp_path)
    write_root(root)
    first = stream_batches(root, startingTimestamp=str(MS + 17_000))
    assert first == [{"ev.1.000": [17, 18, 19], "ev.1.001": [17, 18, 19]}]
    first = stream_batches(root, startingOffsetsByTimestamp=json.dumps({"a.ev.1.001": MS + 18_000}),
                           startingOffsets="latest")  # fmt: skip
    assert first == [{"ev.1.001": [18, 19]}]  # the other journal starts at the latest: nothing
    assert stream_batches(root, startTime=str((MS + 19_000) * 1_000_000)) == [{"ev.1.000": [19], "ev.1.001": [19]}]


@pytest.mark.parametrize("kind", ["batch", "stream"])
@pytest.mark.parametrize("name", ["startingOffset", "subscribe", "kafka.bootstrap.servers", "maxRecordPerTrigger"])
def test_unknown_options_are_refused_by_name(tmp_path, kind: str, name: str) -> None:
    source = SejDataSource({"path": str(tmp_path), name: "1"})
    with pytest.raises(sej.InvalidArgumentError, match=f"unknown option '{name}'; the options are .*startingOffsets"):
        source.reader(None) if kind == "batch" else source.streamReader(None)  # type: ignore[arg-type]


def test_every_option_and_alias_is_accepted_in_any_case(tmp_path) -> None:
    for valid in (BATCH_OPTIONS, STREAM_OPTIONS):
        for name in valid:  # case does not matter to Spark
            assert checked({name.upper(): "v"}, valid, "t") == {name.lower(): "v"}
        for alias, name in ALIASES.items():
            if name in valid:
                assert checked({alias: "v"}, valid, "t") == {name.lower(): "v"}
    with pytest.raises(
        sej.InvalidArgumentError, match="'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger' are the same"
    ):
        SejDataSource({"path": "x", "maxOffsetsPerTrigger": "1", "maxRecordsPerTrigger": "2"}).streamReader(None)  # type: ignore[arg-type]
    with pytest.raises(sej.InvalidArgumentError, match="startingTimestamp must be milliseconds"):
        SejDataSource({"path": "x", "startingTimestamp": "2026-01-01"}).reader(None)  # type: ignore[arg-type]
