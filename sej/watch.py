"""Wake-ups on changes in a directory, through one shared watchdog observer.

Scanners subscribe to their journal's segment directory; a change (a segment
created, appended to, truncated, removed) sets their threading.Event. Watches of
the same directory are shared and reference-counted.
"""

from __future__ import annotations

import logging
import threading
import warnings

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

log = logging.getLogger("sej.watch")

# watchdog 7 warns when a recursive watch meets a directory created while it adds its watches (it adds
# the same directory twice, harmlessly); a consumer of a root where writers create shards sees it often.
warnings.filterwarnings(
    "ignore", r"Callback with id .* already exists", RuntimeWarning, r"watchdog\.observers\.inotify"
)

_lock = threading.Lock()
_observer: BaseObserver | None = None
_watches: dict[tuple[str, bool, tuple[type, ...]], tuple[ObservedWatch, int]] = {}  # -> watch, users


class Wakeup(FileSystemEventHandler):
    """Sets `event` on any change under the watched directory; `created` on new entries."""

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()
        self.created = True  # nothing seen yet: the first check must look

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("created", "moved", "deleted"):
            self.created = True
        self.event.set()


def _shared_observer() -> BaseObserver:
    global _observer
    if _observer is None or not _observer.is_alive():
        _observer = Observer()
        _observer.daemon = True
        _observer.start()
    return _observer


class Subscription:
    """An event handler (a Wakeup) attached to a directory until `close()`.

    `recursive`: also every directory below it, through the same inotify instance (one per
    watch: the default limit is 128 per user, so a root is watched once, not per journal).
    """

    def __init__(
        self,
        path: str,
        wakeup: FileSystemEventHandler,
        recursive: bool = False,
        event_filter: list[type[FileSystemEvent]] | None = None,
    ) -> None:
        """`event_filter`: only these kinds of events (the kernel is asked for no others)."""
        self.path = path
        self.key = (path, recursive, tuple(event_filter or ()))
        self.wakeup = wakeup
        with _lock:
            obs = _shared_observer()
            entry = _watches.get(self.key)
            if entry is None:
                watch = obs.schedule(wakeup, path, recursive=recursive, event_filter=event_filter)
                _watches[self.key] = (watch, 1)
            else:
                watch, count = entry
                obs.add_handler_for_watch(wakeup, watch)
                _watches[self.key] = (watch, count + 1)
        self._open = True

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        with _lock:
            obs = _observer
            watch, count = _watches[self.key]
            if obs is None:
                return
            if count == 1:
                del _watches[self.key]
                try:
                    obs.unschedule(watch)
                except (KeyError, OSError) as e:  # the directory may be gone already
                    log.debug("unschedule %s: %s", self.path, e)
            else:
                _watches[self.key] = (watch, count - 1)
                obs.remove_handler_for_watch(self.wakeup, watch)
