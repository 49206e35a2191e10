"""Names that come from a remote host, validated before they touch a local path.

Everything a producer sends (journal directory names, segment file names) is
matched against anchored patterns; nothing else can name a local file, so a
hostile producer cannot write outside `<hub-root>/<client-id>.*`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import InvalidArgumentError
from ..layout import SEGMENT_RE
from ..shard.name import parse_shard

CLIENT_ID_RE = re.compile(r"\A[A-Za-z0-9_-]+\Z")
MAX_CLIENT_ID = 100


def check_client_id(client_id: object) -> str:
    if not isinstance(client_id, str) or not CLIENT_ID_RE.match(client_id) or len(client_id) > MAX_CLIENT_ID:
        raise InvalidArgumentError(
            f"client id must match [A-Za-z0-9_-]+ (at most {MAX_CLIENT_ID} characters), got {client_id!r}"
        )
    return client_id


MAX_CACHED = 255
"""Longest journal name the check remembers (NAME_MAX): a hostile server's huge names are not kept."""


def check_journal_name(name: object) -> str:
    """A client's journal directory name: a shard name (`prefix.bit.index`) or a plain prefix."""
    if not isinstance(name, str):
        raise InvalidArgumentError(f"journal name must be a str, got {name!r}")
    if len(name) > MAX_CACHED:  # longer than a directory name can be: checked, never kept
        parse_shard(name)
        return str.__str__(name)
    return _journal_name(str.__str__(name))  # a plain str: a subclass's own equality never reaches the cache


@lru_cache(maxsize=1 << 14)
def _journal_name(name: str) -> str:
    # A pass builds several paths per journal: each checked name is parsed once (bounded, errors not kept).
    parse_shard(name)  # raises InvalidArgumentError naming it
    return name


def check_segment_name(name: object) -> int:
    """A segment file name (`%016x.jnl`); returns its first offset."""
    m = SEGMENT_RE.match(name) if isinstance(name, str) else None
    if m is None:
        raise InvalidArgumentError(f"{name!r} is not a segment file name (16 lowercase hex digits + .jnl)")
    return int(m.group(1), 16)


def destination_name(client_id: str, journal: str) -> str:
    """The hub directory of a client's journal: `<client-id>.<journal>`."""
    return f"{check_client_id(client_id)}.{check_journal_name(journal)}"
