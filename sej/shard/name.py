"""Shard directory names: `<prefix>.<shard-bit>.<shard-index>`, formatted and parsed exactly.

`prefix` matches [A-Za-z0-9_-]* (with an empty prefix the `prefix.` part is left
out); `shard-bit` is one lowercase hex digit, 1 to a (2 to 1024 shards);
`shard-index` is three lowercase hex digits below 2**bit. Shard bit 0 stands for
the plain, unsharded journal `<prefix>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidArgumentError

PREFIX_RE = re.compile(r"\A[A-Za-z0-9_-]*\Z")
_SHARDED_RE = re.compile(r"\A(?:([A-Za-z0-9_-]*)\.)?([1-9a])\.([0-3][0-9a-f]{2})\Z")
MAX_BIT = 10
MAX_PREFIX = 200


@dataclass(frozen=True, order=True, slots=True)
class ShardName:
    """A parsed shard directory name."""

    prefix: str
    bit: int  # 0: the plain journal `<prefix>`; 1..10: one of 2**bit shards
    index: int

    def __str__(self) -> str:
        return format_shard(self.prefix, self.bit, self.index)


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not PREFIX_RE.match(prefix) or len(prefix) > MAX_PREFIX:
        raise InvalidArgumentError(
            f"shard prefix must match [A-Za-z0-9_-]* (at most {MAX_PREFIX} characters), got {prefix!r}"
        )
    return prefix


def check_bit(bit: object) -> int:
    if not isinstance(bit, int) or isinstance(bit, bool) or not 0 <= bit <= MAX_BIT:
        raise InvalidArgumentError(f"shard bit must be an int in 0..{MAX_BIT}, got {bit!r}")
    return bit


def format_shard(prefix: str, bit: int, index: int) -> str:
    """The directory name of shard `index` of 2**bit shards (bit 0: the plain journal `prefix`)."""
    check_prefix(prefix)
    check_bit(bit)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < (1 << bit):
        raise InvalidArgumentError(f"shard index must be an int in 0..{(1 << bit) - 1} for bit {bit}, got {index!r}")
    if bit == 0:
        if not prefix:
            raise InvalidArgumentError("an unsharded journal (bit 0) needs a non-empty prefix to name its directory")
        return prefix
    name = f"{bit:x}.{index:03x}"
    return f"{prefix}.{name}" if prefix else name


def parse_shard(name: object) -> ShardName:
    """Parse a shard directory name; InvalidArgumentError naming it if it is not one."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"shard name must be a str, got {name!r}")
    m = _SHARDED_RE.match(name)
    if m:
        prefix, bit, index = m.group(1) or "", int(m.group(2), 16), int(m.group(3), 16)
        if index >= 1 << bit:
            raise InvalidArgumentError(f"shard name {name!r}: index {index:03x} is not below 2**{bit}")
        if m.group(1) == "":
            raise InvalidArgumentError(f"shard name {name!r}: an empty prefix is written without its dot")
        if len(prefix) > MAX_PREFIX:  # as check_prefix: no writer makes such a name
            raise InvalidArgumentError(
                f"shard name {name[:60]!r}...: its prefix is longer than {MAX_PREFIX} characters"
            )
        return ShardName(prefix, bit, index)
    if name and PREFIX_RE.match(name) and len(name) <= MAX_PREFIX:
        return ShardName(name, 0, 0)
    raise InvalidArgumentError(
        f"{name!r} is not a shard name: expected <prefix>.<bit 1-a>.<index 000-3ff>, <bit>.<index>, or a plain prefix"
    )


def is_shard_name(name: str) -> bool:
    try:
        parse_shard(name)
    except InvalidArgumentError:
        return False
    return True


def split_name(name: str) -> tuple[str | None, str]:
    """(client, shard) of a journal found under a root: `<client>.<shard>` in a hub root; (None, name) for a
    shard of a sharded root or another journal; (None, "") for a lone journal (name "")."""
    if not name:
        return None, ""
    if is_shard_name(name):
        return None, name
    client, _, shard = name.partition(".")
    return (client, shard) if shard else (None, name)
