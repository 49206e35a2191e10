"""The hub: copy producers' journals into `<hub-root>/<client-id>.<journal>`, exactly once.

The library of `sej copy`, `sej-hub`, `sej-hub-cron` and the main job (sej.apps): where
to copy from (location: a local path or ssh://), what is read there (the Source protocol in
source; one module per transport: local_source, sftp_source, serve_source; ssh), the copy itself
(copy), a pass over every journal (batch, copy_state), hub.toml (config) and the daemon's passes (daemon).

The names below are loaded on first use (PEP 562): `sej serve` on a producer imports its own
modules only, not the copy engine (the hub's start, and the server's, cost less).
"""

from __future__ import annotations

from ..lazy import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (mypy knows the name)
if TYPE_CHECKING:
    from .batch import JournalOutcome, copy_all
    from .copy import CopyError, CopyResult, copy_journal
    from .copy_state import CopyState
    from .local_source import LocalSource
    from .location import Origin, Sources, open_sources
    from .names import check_client_id, destination_name
    from .sftp_source import SftpSource
    from .source import Source, SourceError

_WHERE = {
    **dict.fromkeys(["JournalOutcome", "copy_all"], ".batch"),
    **dict.fromkeys(["CopyError", "CopyResult", "copy_journal"], ".copy"),
    "CopyState": ".copy_state",
    "LocalSource": ".local_source",
    **dict.fromkeys(["Origin", "Sources", "open_sources"], ".location"),
    **dict.fromkeys(["check_client_id", "destination_name"], ".names"),
    "SftpSource": ".sftp_source",
    **dict.fromkeys(["Source", "SourceError"], ".source"),
}
"""Each public name and the module (under sej.hub) it comes from."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _WHERE)

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
