"""Sharding: fan writes out over `<prefix>.<bit>.<index>` journals, and read them back.

The names below are loaded on first use (PEP 562): a module that needs only shard names
(sej.shard.name: the hub, `sej serve`) does not import the consumer and asyncio with them.
"""

from __future__ import annotations

from ..lazy import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from ..frames import ShardMessage
    from .consumer import Consumer, Lag
    from .name import ShardName, format_shard, is_shard_name, parse_shard
    from .root import Journal, Shard, ShardWatch, find_journals, is_journal, list_shards, merged_scan
    from .writer import ShardedWriter, ShardOffset, default_hash

_WHERE = {
    "ShardMessage": "..frames",
    **dict.fromkeys(["Consumer", "Lag"], ".consumer"),
    **dict.fromkeys(["ShardName", "format_shard", "is_shard_name", "parse_shard"], ".name"),
    **dict.fromkeys(
        ["Journal", "Shard", "ShardWatch", "find_journals", "is_journal", "list_shards", "merged_scan"],
        ".root",
    ),
    **dict.fromkeys(["ShardedWriter", "ShardOffset", "default_hash"], ".writer"),
}
"""Each public name and the module it comes from."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _WHERE)

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
