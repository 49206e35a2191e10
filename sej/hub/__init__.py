"""The hub: copy producers' journals into `<hub-root>/<client-id>.<journal>`, exactly once."""

from __future__ import annotations

from .copy import CopyError, CopyResult, JournalOutcome, copy_all, copy_journal
from .names import check_client_id, destination_name
from .source import LocalSource, SftpSource, Source, SourceError

__all__ = [
    "CopyError",
    "CopyResult",
    "JournalOutcome",
    "LocalSource",
    "SftpSource",
    "Source",
    "SourceError",
    "check_client_id",
    "copy_all",
    "copy_journal",
    "destination_name",
]
