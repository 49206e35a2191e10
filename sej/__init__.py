"""sej: segmented journals, a durable file-based message log byte-compatible with h12.io/sej.

The public API; see README.md and docs/ for the format and the guarantees.
"""

from __future__ import annotations

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
from .writer import Writer

__version__ = "0.1.0"

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
]
