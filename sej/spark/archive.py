"""The Parquet archive: segments every reader has passed, copied into Parquet exactly once.

`archive(spark, path, dest)` archives the journals under `path` (a journal, a sharded
root or a hub root) into `dest`, partitioned `client=<client>/shard=<shard>/date=<UTC date>`.
Each journal's progress is the reader offset `ofs/<reader>.ofs` (default reader
`archive`): every offset below it is in `dest`, verified. A run archives, per journal,
the sealed segments (never the last one, which the writer still appends to) that every
other reader in `ofs/` has passed, in one Spark job:

1. plan: under the lock `dest/.archive.lck`, per journal the range [a, b): a = the
   archive offset (the reader is registered at a when it has no offset file yet, so
   retention keeps the range), b = the first offset of the first segment not eligible;
2. stage: read the ranges with the `sej` source and write Parquet to `dest/_staging/<run>`;
3. verify: per journal, the staged rows are exactly offsets a..b-1 (count, distinct
   count, min, max, and the files' footers), else ArchiveError and nothing is published;
4. publish, per journal: delete the journal's files starting at >= a (left by a run that
   crashed before its commit), move the staged files to `<a:016x>-<b:016x>-<k>.parquet`
   in their partition directories, fsync them and the directories, then commit the
   reader offset b.

A crash at any point, followed by a rerun, leaves exactly one copy of every row.
See docs/archive.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple
from urllib.parse import unquote

from ..errors import DataLossError, InvalidArgumentError, SejError
from ..fsutil import fsync_dir
from ..layout import ARCHIVE_LOCK, check_reader_name, journal_path, list_segments, reader_offset_path
from ..lock import lock_file, unlock_file
from ..offset import Offset, read_offset_file
from ..retention import reader_floor
from .plan import JournalSource, find_sources
from .schema import SPARK_TYPES
from .source import register

LOCK_NAME = ARCHIVE_LOCK
STAGING_DIR = "_staging"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
FILE_RE = re.compile(r"\A([0-9a-f]{16})-([0-9a-f]{16})-([0-9]+)\.parquet\Z")
PARTITION_COLUMNS = ("client", "shard", "date")
DATA_COLUMNS = ("offset", "timestamp", "type", "key", "value")
# The UTC date of the timestamp, whatever spark.sql.session.timeZone says (null without a timestamp).
DATE_EXPR = "date_from_unix_date(CAST(floor(unix_micros(timestamp) / 86400000000) AS INT))"
TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"


class ArchiveError(SejError):
    """The staged Parquet does not hold exactly the planned rows, or the archive and an offset disagree."""


@dataclass(frozen=True)
class JournalReport:
    """One journal's part of a run: offsets [start, end) archived (or to archive, in a dry run).

    `sealed_end` is the first offset of the last segment (nothing from there on is sealed);
    `readers_end` the lowest committed offset of the other readers (None: no other reader).
    `files` are the Parquet files published for the range.
    """

    name: str
    path: str
    client: str | None
    shard: str
    start: int
    end: int
    sealed_end: int
    readers_end: int | None
    files: tuple[str, ...] = ()

    @property
    def rows(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ArchiveReport:
    """What a run archived (or would archive, when `dry_run`), per journal in name order."""

    dest: str
    dry_run: bool
    journals: tuple[JournalReport, ...]

    @property
    def rows(self) -> int:
        return sum(j.rows for j in self.journals)


class Staged(NamedTuple):
    """A journal's verified staged files: `files` are (staged path, date directory name) pairs.

    `rel_dir` is the journal's directory under dest, `client=<c>/shard=<s>` as Spark wrote it.
    """

    path: str
    start: int
    end: int
    rel_dir: str
    files: tuple[tuple[str, str], ...]


def lock_path(dest: str) -> str:
    """The lock a run holds on `dest`: `dest/.archive.lck`."""
    return os.path.join(dest, LOCK_NAME)


def archive(
    spark: Any,
    path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    reader: str = "archive",
    dry_run: bool = False,
) -> ArchiveReport:
    """Archive the sealed segments every other reader has passed into Parquet under `dest`, exactly once.

    `spark` is a SparkSession, or a function returning one (called only when there is
    something to archive). `path` is a journal, a sharded root or a hub root. A dry run
    only plans: it writes nothing and needs no Spark. Raises InvalidArgumentError for a
    bad path, dest or reader, LockedError when another run holds `dest/.archive.lck`,
    DataLossError when segments below a journal's archive offset are gone, and
    ArchiveError when verification fails (nothing is committed then).
    """
    root, out = _check_paths(path, dest)
    check_reader_name(reader)
    sources = find_sources(root)
    if not sources:
        raise InvalidArgumentError(f"{root} holds no journal (no jnl/ directory in it or in its subdirectories)")
    if dry_run:
        return ArchiveReport(out, True, tuple(plan_journal(s, reader, register=False) for s in sources))
    os.makedirs(out, exist_ok=True)
    with _locked(lock_path(out)):
        shutil.rmtree(os.path.join(out, STAGING_DIR), ignore_errors=True)  # a crashed run's
        plans = [plan_journal(s, reader, register=True) for s in sources]
        if not any(p.rows for p in plans):
            return ArchiveReport(out, False, tuple(plans))
        session = spark() if callable(spark) else spark
        staging = os.path.join(out, STAGING_DIR, f"{time.time_ns():x}-{os.getpid()}")
        os.makedirs(os.path.dirname(staging), exist_ok=True)
        stage(session, root, plans, staging)
        staged = verify(session, plans, staging)
        done = []
        for p in plans:
            s = staged.get(p.path)
            files = publish(out, s, reader) if s is not None else ()
            done.append(replace(p, files=files))
        shutil.rmtree(os.path.join(out, STAGING_DIR), ignore_errors=True)
        return ArchiveReport(out, False, tuple(done))


def _check_paths(path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> tuple[str, str]:
    root = os.path.abspath(journal_path(path))
    out = os.path.abspath(journal_path(dest))
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"journal path {root} is not a directory")
    if os.path.exists(out) and not os.path.isdir(out):
        raise InvalidArgumentError(f"archive destination {out} exists and is not a directory")
    real_root, real_out = os.path.realpath(root), os.path.realpath(out)
    if os.path.commonpath([real_root, real_out]) == real_root:
        raise InvalidArgumentError(f"archive destination {out} must not be {root} or inside it")
    return root, out


@contextmanager
def _locked(lock: str) -> Iterator[None]:
    fh = lock_file(lock)
    try:
        yield
    finally:
        unlock_file(fh)


def plan_journal(src: JournalSource, reader: str, *, register: bool) -> JournalReport:
    """The range [a, b) of one journal that a run archives; `register` creates the reader's offset at a."""
    segments = list_segments(src.path)
    first = segments[0].first_offset if segments else 0
    sealed_end = segments[-1].first_offset if segments else first
    # The other readers' floor (one with nothing committed still needs everything); None without others.
    readers_end = reader_floor(src.path, first, exclude=(reader,)).offset
    if register:
        with Offset(src.path, reader) as o:
            a = o.value
            if read_offset_file(o.path) is None:
                o.commit(a)  # from now on retention keeps what the archive has not read
    else:
        stored = read_offset_file(reader_offset_path(src.path, reader))
        a = first if stored is None else stored
    if segments and a < first:
        raise DataLossError(
            f"{src.path}: reader {reader!r} is at offset {a}, but the journal starts at {first}: "
            f"offsets {a} to {first - 1} were deleted before they were archived"
        )
    ends = [s.first_offset for s in segments[1:] if readers_end is None or s.first_offset <= readers_end]
    b = max([a, *ends])
    return JournalReport(src.name, src.path, src.client, src.shard, a, b, sealed_end, readers_end)


def stage(spark: Any, root: str, plans: list[JournalReport], staging: str) -> None:
    """One Spark job: the planned ranges of every journal under `root`, as Parquet partitioned into `staging`."""
    from pyspark.sql import functions as F

    starting = json.dumps({p.name: p.start for p in plans})
    ending = json.dumps({p.name: p.end for p in plans})
    reader = spark.read.format("sej").option("startingOffsets", starting).option("endingOffsets", ending)
    try:
        df = reader.load(root)
    except Exception as e:  # a session not made by sej.spark.spark_session: register the format once
        if "DATA_SOURCE_NOT_FOUND" not in str(e):
            raise
        register(spark)
        df = reader.load(root)
    df = df.withColumn("date", F.expr(DATE_EXPR)).select(*DATA_COLUMNS, *PARTITION_COLUMNS)
    df = df.sortWithinPartitions(*PARTITION_COLUMNS, "offset")
    old = spark.conf.get(TIMESTAMP_CONF)
    spark.conf.set(TIMESTAMP_CONF, "TIMESTAMP_MICROS")  # not the deprecated INT96
    try:
        df.write.partitionBy(*PARTITION_COLUMNS).parquet(_uri(staging))
    finally:
        spark.conf.set(TIMESTAMP_CONF, old)


def archive_schema() -> Any:
    """The archive's Spark schema: offset, timestamp, type, key, value, then the partition columns.

    Read the archive with it (`spark.read.schema(archive_schema()).parquet(dest)`) so that
    partition values like `2.001` stay strings and `date` is a date.
    """
    from pyspark.sql.types import DateType, StructField, StructType

    types = SPARK_TYPES | {"date": DateType()}
    return StructType([StructField(c, types[c], True) for c in (*DATA_COLUMNS, *PARTITION_COLUMNS)])


def verify(spark: Any, plans: list[JournalReport], staging: str) -> dict[str, Staged]:
    """Check that the staging directory holds exactly offsets [a, b) of each planned journal; by journal path.

    Raises ArchiveError naming every journal whose rows differ (count, distinct offsets,
    lowest, highest, or the row count in its files' Parquet footers).
    """
    from pyspark.sql import functions as F

    df = spark.read.schema(archive_schema()).parquet(_uri(staging))
    stats = {
        (r["client"], r["shard"]): (r["n"], r["distinct"], r["lo"], r["hi"])
        for r in df.groupBy("client", "shard")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.count_distinct("offset").alias("distinct"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
        )
        .collect()
    }
    files = _staged_files(staging)
    problems = []
    out: dict[str, Staged] = {}
    for p in plans:
        key = (p.client, p.shard)
        want = (p.rows, p.rows, p.start, p.end - 1) if p.rows else None
        got = stats.get(key)
        rel_dir, found = files.get(key, ("", []))
        in_footers = _footer_rows(f for f, _ in found)
        if got != want or in_footers != p.rows:
            problems.append(
                f"{p.path}: expected offsets {p.start} to {p.end - 1} ({p.rows} rows), staged (rows, distinct "
                f"offsets, lowest, highest) = {got or (0, 0, None, None)}, {in_footers} rows in the files"
            )
        elif p.rows:
            out[p.path] = Staged(p.path, p.start, p.end, rel_dir, tuple(found))
    if problems:
        raise ArchiveError(f"verification failed, nothing archived (staging kept in {staging}): " + "; ".join(problems))
    return out


def _footer_rows(paths: Iterable[str]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in paths)


def _partition_value(dirname: str, column: str) -> str | None:
    value = unquote(dirname[len(column) + 1 :])
    return None if value == NULL_PARTITION else value


def _staged_files(staging: str) -> dict[tuple[str | None, str | None], tuple[str, list[tuple[str, str]]]]:
    """The Parquet files Spark wrote, by (client, shard): (`client=../shard=..`, [(file, `date=..`)])."""
    out: dict[tuple[str | None, str | None], tuple[str, list[tuple[str, str]]]] = {}
    for c in sorted(_listdir(staging)):
        if not c.startswith("client="):
            continue
        for s in sorted(_listdir(os.path.join(staging, c))):
            if not s.startswith("shard="):
                continue
            rel = os.path.join(c, s)
            found = []
            for d in sorted(_listdir(os.path.join(staging, rel))):
                if d.startswith("date="):
                    names = sorted(_listdir(os.path.join(staging, rel, d)))
                    found += [(os.path.join(staging, rel, d, f), d) for f in names if _is_data_file(f)]
            out[(_partition_value(c, "client"), _partition_value(s, "shard"))] = (rel, found)
    return out


def _is_data_file(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def publish(dest: str, staged: Staged, reader: str) -> tuple[str, ...]:
    """Move one journal's staged files into `dest` and commit its reader offset; the published paths.

    Files of the journal starting at or after its archive offset are left by a run that
    crashed before its commit: they are deleted first. A file that straddles the offset
    is an ArchiveError (the offset was moved by hand, not to a file boundary).
    """
    jdir = os.path.join(dest, staged.rel_dir)
    leftovers = []
    for d in sorted(_listdir(jdir)):
        for f in sorted(_listdir(os.path.join(jdir, d))):
            m = FILE_RE.match(f)
            if m is None:
                continue
            lo, hi = int(m.group(1), 16), int(m.group(2), 16)
            if lo >= staged.start:
                leftovers.append(os.path.join(jdir, d, f))
            elif hi > staged.start:
                raise ArchiveError(
                    f"{os.path.join(jdir, d, f)} holds offsets {lo} to {hi - 1} of {staged.path}, but its archive "
                    f"offset is {staged.start}: set the offset to a file boundary ({lo} or {hi})"
                )
    touched = {os.path.dirname(f) for f in leftovers}
    for f in leftovers:
        os.unlink(f)
    published = []
    for k, (src, date_dir) in enumerate(staged.files):
        target_dir = os.path.join(jdir, date_dir)
        os.makedirs(target_dir, exist_ok=True)
        _fsync_file(src)
        target = os.path.join(target_dir, f"{staged.start:016x}-{staged.end:016x}-{k}.parquet")
        os.replace(src, target)
        touched.add(target_dir)
        published.append(target)
    for d in sorted(touched):
        fsync_dir(d)
    for d in (jdir, os.path.dirname(jdir), dest):
        fsync_dir(d)
    commit(staged.path, reader, staged.start, staged.end)
    return tuple(published)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(journal: str, reader: str, start: int, end: int) -> None:
    """Move the reader offset of `journal` from `start` to `end`; ArchiveError if it is no longer at `start`."""
    with Offset(journal, reader) as o:
        if o.value != start:
            raise ArchiveError(f"{journal}: reader {reader!r} moved from {start} to {o.value} during the run")
        o.commit(end)


def _uri(path: str) -> str:
    """A file: URI for Spark, so that a cluster's default file system does not take the path."""
    return "file://" + os.path.abspath(path)


def describe(j: JournalReport, dry_run: bool = False) -> str:
    """One line about a journal's part of a run."""
    name = j.name or j.shard
    if j.rows:
        verb = "would archive" if dry_run else "archived"
        files = "" if dry_run else f" in {len(j.files)} files"
        return f"{name}: {verb} offsets {j.start} to {j.end - 1}: {j.rows} rows{files}"
    held = "" if j.readers_end is None else f", other readers from offset {j.readers_end}"
    return f"{name}: nothing to archive from offset {j.start} (the last segment starts at {j.sealed_end}{held})"


__all__ = [
    "ArchiveError",
    "ArchiveReport",
    "JournalReport",
    "Staged",
    "archive",
    "archive_schema",
    "commit",
    "describe",
    "lock_path",
    "plan_journal",
    "publish",
    "stage",
    "verify",
]
