"""The hub: copy producers' journals into `<hub-root>/<client-id>.<journal>`, exactly once.

The library of `sej copy`, `sej-hub`, `sej-hub-cron` and the main job (sej.apps): where
to copy from (location: a local path or ssh://), what is read there (the Source protocol in
source; one module per transport: local_source, sftp_source, serve_source; ssh), the copy itself
(copy), a pass over every journal (batch, copy_state), hub.toml (config) and the daemon's passes (daemon).
"""

from __future__ import annotations

from .batch import JournalOutcome, copy_all
from .copy import CopyError, CopyResult, copy_journal
from .copy_state import CopyState
from .local_source import LocalSource
from .location import Origin, Sources, open_sources
from .names import check_client_id, destination_name
from .sftp_source import SftpSource
from .source import Source, SourceError

__all__ = [
    "CopyError",
    "CopyResult",
    "CopyState",
    "JournalOutcome",
    "LocalSource",
    "Origin",
    "SftpSource",
    "Source",
    "SourceError",
    "Sources",
    "check_client_id",
    "copy_all",
    "copy_journal",
    "destination_name",
    "open_sources",
]
