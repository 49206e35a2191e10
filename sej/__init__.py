"""sej: segmented journals, a durable file-based message log byte-compatible with h12.io/sej.

The public API; see README.md and docs/ for the format and the guarantees.

The names below are loaded on first use (PEP 562), so that importing `sej` itself costs
nothing: the console scripts import their entry module (sej.apps.entry) through this
package, and until that module runs, Ctrl-C would end them with a traceback.
"""

from __future__ import annotations

from .lazy import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from .errors import (
        ChecksumError,
        ClosedError,
        CorruptionError,
        CorruptionWarning,
        DataLossError,
        FrameError,
        InvalidArgumentError,
        LockedError,
        LockLostError,
        OffsetOutOfRangeError,
        SejError,
        SyncError,
        TruncatedError,
        UnsafeFileError,
    )
    from .journal import first_offset, last_messages, next_offset, offset_at_time
    from .layout import Segment, list_readers, list_segments
    from .message import NO_TIMESTAMP, Message, decode, encode, encode_message
    from .offset import Offset
    from .scanner import Scanner
    from .shard import Consumer, ShardedWriter, ShardOffset, find_journals, list_shards
    from .shard.table import read_batches, read_table
    from .writer import Writer

__version__ = "0.1.0"

_WHERE = {
    **dict.fromkeys(
        ["ChecksumError", "ClosedError", "CorruptionError", "CorruptionWarning", "DataLossError", "FrameError",
         "InvalidArgumentError", "LockedError", "LockLostError", "OffsetOutOfRangeError", "SejError", "SyncError",
         "TruncatedError", "UnsafeFileError"],
        ".errors",
    ),
    **dict.fromkeys(["first_offset", "last_messages", "next_offset", "offset_at_time"], ".journal"),
    **dict.fromkeys(["Segment", "list_readers", "list_segments"], ".layout"),
    **dict.fromkeys(["NO_TIMESTAMP", "Message", "decode", "encode", "encode_message"], ".message"),
    "Offset": ".offset",
    "Scanner": ".scanner",
    **dict.fromkeys(["Consumer", "ShardedWriter", "ShardOffset", "find_journals", "list_shards"], ".shard"),
    **dict.fromkeys(["read_batches", "read_table"], ".shard.table"),
    "Writer": ".writer",
}  # fmt: skip
"""Each public name and the module (under sej) it comes from."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _WHERE)

__all__ = [
    "Consumer",
    "NO_TIMESTAMP",
    "ClosedError",
    "ChecksumError",
    "CorruptionError",
    "CorruptionWarning",
    "DataLossError",
    "FrameError",
    "InvalidArgumentError",
    "LockedError",
    "LockLostError",
    "Message",
    "Offset",
    "OffsetOutOfRangeError",
    "Scanner",
    "ShardOffset",
    "ShardedWriter",
    "Segment",
    "SejError",
    "SyncError",
    "TruncatedError",
    "UnsafeFileError",
    "Writer",
    "decode",
    "encode",
    "encode_message",
    "find_journals",
    "first_offset",
    "last_messages",
    "list_readers",
    "list_segments",
    "list_shards",
    "next_offset",
    "offset_at_time",
    "read_batches",
    "read_table",
]
