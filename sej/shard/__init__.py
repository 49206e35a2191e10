"""Sharding: fan writes out over `<prefix>.<bit>.<index>` journals, and read them back.

The names below are loaded on first use (PEP 562): a module that needs only shard names
(sej.shard.name: the hub, `sej serve`) does not import the consumer and asyncio with them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from ..frames import ShardMessage
    from .consumer import Consumer, Lag
    from .name import ShardName, format_shard, is_shard_name, parse_shard
    from .root import Journal, Shard, ShardWatch, find_journals, is_journal, list_shards, merged_scan
    from .writer import ShardedWriter, ShardOffset, default_hash

_WHERE = {
    "ShardMessage": "sej.frames",
    **dict.fromkeys(["Consumer", "Lag"], "sej.shard.consumer"),
    **dict.fromkeys(["ShardName", "format_shard", "is_shard_name", "parse_shard"], "sej.shard.name"),
    **dict.fromkeys(
        ["Journal", "Shard", "ShardWatch", "find_journals", "is_journal", "list_shards", "merged_scan"],
        "sej.shard.root",
    ),
    **dict.fromkeys(["ShardedWriter", "ShardOffset", "default_hash"], "sej.shard.writer"),
}
"""Each public name and the module it comes from."""


def __getattr__(name: str) -> object:
    """A public name, loaded on first use; or a submodule (`sej.shard.root` after `import sej.shard`, as before)."""
    import importlib

    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name.isidentifier() and not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
