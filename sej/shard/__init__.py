"""Sharding: fan writes out over `<prefix>.<bit>.<index>` journals, and read them back."""

from __future__ import annotations

from ..frames import ShardMessage
from .consumer import Consumer, Lag
from .name import ShardName, format_shard, is_shard_name, parse_shard
from .root import Journal, Shard, ShardWatch, find_journals, is_journal, list_shards, merged_scan
from .writer import ShardedWriter, ShardOffset, default_hash

__all__ = [
    "Consumer",
    "Lag",
    "Journal",
    "Shard",
    "ShardMessage",
    "ShardName",
    "ShardOffset",
    "ShardWatch",
    "ShardedWriter",
    "default_hash",
    "find_journals",
    "format_shard",
    "is_journal",
    "is_shard_name",
    "list_shards",
    "merged_scan",
    "parse_shard",
]
