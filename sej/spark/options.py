"""The options of the `sej` format, parsed: one function per kind of option, shared by the batch and stream readers.

Spark's option names are case-insensitive: `lower_case` gives the dict the parsers read,
and they look names up in lower case (`startingoffsets`). A bad value raises
InvalidArgumentError naming the option and the value; a missing one gives the default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgumentError
from ..timestamps import parse_time

MAX_BYTES_PER_PARTITION = 128 << 20
"""The most bytes one task reads, unless a single segment piece is bigger (option maxBytesPerPartition)."""

OPEN_COST_IN_BYTES = 256 << 10
"""What one more segment piece costs a task, counted as bytes (Spark's spark.sql.files.openCostInBytes).

Spark's 4 MiB models opening a file on HDFS or S3. A segment opens in tens of microseconds, and
a task (a Python worker's round trip) is what costs: with 4 MiB a hub root of 1,000 small
journals was read in 65 tasks and 2.5x Parquet's time, with 256 KiB in 5 tasks and faster than
Parquet (docs/benchmarks.md, benchmark 13)."""

VERIFY_CHECKSUMS = True
"""The default of option verifyChecksums, batch and stream: check every block read against its checksums.

On because it costs little: see docs/benchmarks.md, benchmark 15 (Spark read, verified vs not)."""

Options = dict[str, str]
"""Options by lower-case name."""


BATCH_OPTIONS = (
    "path", "paths", "includeRoot", "startingOffsets", "endingOffsets", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "startingTimestamp", "endingTimestamp", "startTime", "endTime", "type",
    "maxBytesPerPartition", "openCostInBytes", "minPartitions", "pushFilters", "verifyChecksums",
)  # fmt: skip
"""The batch reader's options, as users write them (Spark compares names in any case)."""

STREAM_OPTIONS = (
    "path", "paths", "includeRoot", "queryName", "startingOffsets", "startingOffsetsByTimestamp",
    "startingTimestamp", "startTime", "maxRecordsPerTrigger", "failOnDataLoss", "type", "maxBytesPerPartition",
    "openCostInBytes", "minPartitions", "verifyChecksums",
)  # fmt: skip
"""The stream reader's options."""

ALIASES = {"maxOffsetsPerTrigger": "maxRecordsPerTrigger"}
"""Names of Spark's Kafka source that mean the same thing as one of ours."""


def _shown(name: str) -> str:
    """An option's name as the docs write it (`maxBytesPerPartition` for `maxbytesperpartition`)."""
    for n in (*BATCH_OPTIONS, *STREAM_OPTIONS):
        if n.lower() == name:
            return n
    return name


def lower_case(options: Mapping[str, Any]) -> Options:
    """The options as strings, by lower-case name."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def checked(options: Mapping[str, Any], valid: tuple[str, ...], call: str) -> Options:
    """`lower_case(options)` with aliases replaced; InvalidArgumentError naming any unknown option.

    A misspelled option must not be ignored silently (a read would then quietly read
    something else), so every name is checked against the reader's `valid` ones.
    """
    known = {n.lower(): n for n in valid}
    aliases = {a.lower(): b.lower() for a, b in ALIASES.items() if b.lower() in known}
    out: Options = {}
    given: dict[str, str] = {}
    for k, v in dict(options).items():
        name = aliases.get(str(k).lower(), str(k).lower())
        if name not in known:
            names = ", ".join(sorted([*valid, *(a for a, b in ALIASES.items() if b in valid)], key=str.lower))
            raise InvalidArgumentError(f"{call}: unknown option {k!r}; the options are {names}")
        if name in out:
            raise InvalidArgumentError(f"{call}: options {given[name]!r} and {k!r} are the same option; give one")
        out[name], given[name] = str(v), str(k)
    return out


def paths_option(options: Options, call: str) -> list[str]:
    """The loaded paths: `path`, and `paths` (a JSON list: Spark sets it for `load([a, b])`).

    InvalidArgumentError saying `call` needs one when there are none. Glob patterns stay as
    they are: plan.expand_paths matches them when the journals are listed.
    """
    paths = [options["path"]] if options.get("path") else []
    raw = options.get("paths")
    if raw is not None:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, list) or not all(isinstance(p, str) and p for p in parsed):
            raise InvalidArgumentError(f'option paths must be a JSON list of paths like ["/a", "/b"], got {raw!r}')
        paths += parsed
    if not paths:
        raise InvalidArgumentError(f"{call} needs a path")
    return paths


def _journal_map(options: Options, name: str, example: str, ok: Any, what: str) -> dict[str, int] | None:
    """JSON `{"<journal>": int}` whose values pass `ok`; None when missing (errors name the option)."""
    raw = options.get(name)
    if raw is None:
        return None
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f"option {_shown(name)} must be JSON like {example}, got {raw!r}: {e}") from None
    if not isinstance(parsed, dict) or not all(ok(v) for v in parsed.values()):
        raise InvalidArgumentError(f"option {_shown(name)} must map journal names to {what}, got {raw!r}")
    return {str(k): int(v) for k, v in parsed.items()}


def offsets_option(options: Options, name: str) -> dict[str, int]:
    """JSON `{"<journal>": offset}` (an offset >= 0, -1 for the latest or -2 for the earliest); {} when missing."""
    got = _journal_map(options, name, '{"<journal>": 42}', lambda v: isinstance(v, int) and v >= -2,
                       "offsets (>= 0, -1 or -2)")  # fmt: skip
    return got or {}


def position_or_offsets_option(options: Options, name: str, default: str) -> str | dict[str, int]:
    """The position `earliest` or `latest` (`default` when missing), or offsets as `offsets_option` reads them."""
    raw = options.get(name, default)
    if raw in ("earliest", "latest"):
        return raw
    return offsets_option(options, name)


def millis_option(options: Options, name: str) -> int | None:
    """Milliseconds since the Unix epoch (as the Kafka source's timestamps), in ns; None when missing."""
    raw = options.get(name)
    if raw is None:
        return None
    try:
        return int(raw) * 1_000_000
    except ValueError:
        what = "milliseconds since the Unix epoch"
        raise InvalidArgumentError(f"option {_shown(name)} must be {what}, got {raw!r}") from None


def millis_by_journal_option(options: Options, name: str) -> dict[str, int]:
    """JSON `{"<journal>": ms}` (ms since the Unix epoch, as the Kafka source's), in ns; {} when missing."""
    got = _journal_map(options, name, '{"<journal>": 1700000000000}',
                       lambda v: isinstance(v, int) and not isinstance(v, bool), "ms since the Unix epoch")  # fmt: skip
    return {k: v * 1_000_000 for k, v in (got or {}).items()}


def time_option(options: Options, name: str) -> int | None:
    """A time as sej.timestamps.parse_time reads it (ISO 8601, relative, `now` or ns), in ns; None when missing."""
    raw = options.get(name)
    if raw is None:
        return None
    try:
        return parse_time(raw)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"option {_shown(name)}: {e}") from None


def types_option(options: Options, name: str = "type") -> tuple[int, ...] | None:
    """Message types 0-255, comma-separated (`2` or `1,3`); None (every type) when missing."""
    raw = options.get(name)
    if raw is None:
        return None
    try:
        types = tuple(int(x) for x in str(raw).split(","))
    except ValueError:
        types = ()
    if not types or not all(0 <= t <= 255 for t in types):
        raise InvalidArgumentError(f"option {_shown(name)} must be message types 0-255 like 2 or 1,3, got {raw!r}")
    return types


def int_option(options: Options, name: str, default: int, minimum: int = 1) -> int:
    """An integer >= `minimum`; `default` (which may be below it) when missing."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise InvalidArgumentError(f"option {_shown(name)} must be an integer >= {minimum}, got {raw!r}")
    return value


def packing_options(options: Options) -> tuple[int, int, int]:
    """(maxBytesPerPartition, openCostInBytes, minPartitions) for packing segment pieces into tasks.

    minPartitions defaults to the CPU count of the machine that plans the read (the driver): in
    local mode that is the cores Spark runs tasks on; on a cluster, set it to the executors' cores.
    """
    return (
        int_option(options, "maxbytesperpartition", MAX_BYTES_PER_PARTITION),
        int_option(options, "opencostinbytes", OPEN_COST_IN_BYTES, minimum=0),
        int_option(options, "minpartitions", os.cpu_count() or 1),
    )


def verify_option(options: Options) -> bool:
    """Option verifyChecksums: check each segment's bytes against its checksums before decoding them."""
    return bool_option(options, "verifychecksums", VERIFY_CHECKSUMS)


def bool_option(options: Options, name: str, default: bool, *, strict: bool = True) -> bool:
    """`true` or `false` (any case, spaces around ignored); `default` when missing.

    Not `strict`: any other value is false instead of an error (pushFilters has always read so).
    """
    raw = options.get(name)
    if raw is None:
        return default
    low = raw.strip().lower()
    if strict and low not in ("true", "false"):
        raise InvalidArgumentError(f"option {_shown(name)} must be true or false, got {raw!r}")
    return low == "true"


__all__ = [
    "ALIASES",
    "VERIFY_CHECKSUMS",
    "BATCH_OPTIONS",
    "STREAM_OPTIONS",
    "Options",
    "checked",
    "millis_by_journal_option",
    "millis_option",
    "bool_option",
    "int_option",
    "lower_case",
    "offsets_option",
    "packing_options",
    "paths_option",
    "position_or_offsets_option",
    "time_option",
    "types_option",
    "verify_option",
]
