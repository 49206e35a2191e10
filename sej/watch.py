"""Wake-ups on changes in a directory, through one shared watchdog observer.

Scanners subscribe to their journal's segment directory; a change (a segment
created, appended to, truncated, removed) sets their threading.Event. Watches of
the same directory are shared and reference-counted.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable

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


try:  # watchdog's own inotify layer (watchdog >= 7, Linux): one reader thread for every watch
    from watchdog.observers.inotify_c import CallbackId, InotifyConstants, InotifyEvent, InotifyFD, Mask

    _DIR_MASK = (
        InotifyConstants.IN_MODIFY
        | InotifyConstants.IN_CREATE
        | InotifyConstants.IN_DELETE
        | InotifyConstants.IN_MOVED_FROM
        | InotifyConstants.IN_MOVED_TO
        | InotifyConstants.IN_DELETE_SELF
        | InotifyConstants.IN_ONLYDIR
        | InotifyConstants.IN_DONT_FOLLOW  # a link is never followed
    )
    _HAVE_INOTIFY = hasattr(InotifyFD, "get_instance") and hasattr(InotifyFD, "add_callback")
except ImportError:  # not Linux
    _HAVE_INOTIFY = False


class _DirCallback:
    """watchdog's WatchCallback for one directory: calls `on_change(created)` for each event in it."""

    def __init__(self, on_change: Callable[[bool], None], gone: Callable[[], object],
                 ignore: tuple[bytes, ...] = ()) -> None:  # fmt: skip
        self.on_change, self.gone, self.ignore = on_change, gone, ignore

    def on_event(self, event: InotifyEvent) -> None:
        if self.ignore and event.name.startswith(self.ignore):
            return
        self.on_change(not event.is_modify)

    def on_watch_deleted(self, wd: object) -> None:
        self.gone()  # the directory was removed (or moved away): a new one of that name is watched anew
        self.on_change(True)

    def on_queue_overflow(self) -> None:
        self.on_change(True)  # events were lost: look at everything


class DirWatch:
    """Watches exactly the directories added, not what is below them, all through one inotify instance
    and one thread (watchdog's shared InotifyFD): no thread per directory, and no events from the
    directories left out. `DirWatch.available()` is False where there is no inotify.

    `add(path, on_change)` calls `on_change(created)` on watchdog's thread for every file created,
    modified, moved or removed in `path` (`created`: anything but a modification), but those whose name starts
    with one of `ignore`.
    """

    @staticmethod
    def available() -> bool:
        return _HAVE_INOTIFY

    def __init__(self) -> None:
        self._fd = InotifyFD.get_instance()
        self._watches: dict[str, tuple[object, _DirCallback]] = {}

    def __contains__(self, path: object) -> bool:
        """Whether `path` is watched now (a watch ends when its directory goes)."""
        return path in self._watches

    def add(self, path: str, on_change: Callable[[bool], None], ignore: tuple[str, ...] = ()) -> bool:
        """Watch `path`; False if it is gone (or not a directory)."""
        if path in self._watches:
            return True
        cb = _DirCallback(on_change, lambda: self._watches.pop(path, None), tuple(os.fsencode(n) for n in ignore))
        try:
            wd = self._fd.add_callback(os.fsencode(path), Mask(_DIR_MASK), cb, CallbackId(id(cb)))
        except OSError as e:
            log.debug("watch %s: %s", path, e)
            return False
        self._watches[path] = (wd, cb)
        return True

    def remove(self, path: str) -> None:
        """Stop watching `path` (if it is)."""
        got = self._watches.pop(path, None)
        if got is None:
            return
        wd, cb = got
        try:
            self._fd.remove_callbacks([(wd, CallbackId(id(cb)))])  # type: ignore[list-item]
        except (OSError, KeyError) as e:  # the directory may be gone
            log.debug("unwatch %s: %s", path, e)

    def close(self) -> None:
        watches, self._watches = self._watches, {}
        try:
            self._fd.remove_callbacks([(wd, CallbackId(id(cb))) for wd, cb in watches.values()])  # type: ignore[misc]
        except OSError as e:  # directories may be gone
            log.debug("unwatch: %s", e)
