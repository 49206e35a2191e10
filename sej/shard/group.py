"""Consumer groups without a coordinator: who is alive, and each member's fair share of journals.

Every member of group `<reader>` on a root holds an exclusive lock on its own file
`<root>/.sej-groups/<reader>/<id>.member` for as long as it lives; the kernel drops the lock
when the process dies, however it dies. A member is alive while its file is locked. The file
is locked under a temporary name first and then renamed, so no one ever sees a member file
that is not yet locked (and takes it for a dead one).

The journals themselves are owned through their reader locks (`ofs/<reader>.lck`), so two
members never read one journal at once, whatever they think of each other; the member files
only decide how many journals each member tries to hold: the sorted ids give every member the
same ranking, and rank r of M members gets N // M journals, plus one if r < N % M.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from typing import IO

from ..errors import LockedError, UnsafeFileError
from ..fsutil import open_dir
from ..layout import GROUPS_DIR
from ..lock import lock_file, unlock_file

MEMBER_SUFFIX = ".member"
MEMBER_RE = re.compile(r"\A[A-Za-z0-9_.-]+\.member\Z")


def group_dir(root: str, reader: str) -> str:
    return os.path.join(root, GROUPS_DIR, reader)


def share(journals: int, members: list[str], me: str) -> int:
    """How many of `journals` the member `me` holds when `members` (sorted ids, `me` among them) share them."""
    rank, count = members.index(me), len(members)
    return journals // count + (1 if rank < journals % count else 0)


class Membership:
    """This process's membership of a group: alive until `close()` (or until the process dies)."""

    def __init__(self, root: str, reader: str) -> None:
        self.dir = group_dir(root, reader)
        os.makedirs(self.dir, exist_ok=True)
        host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"
        self._pid = os.getpid()
        self.id = f"{host}-{self._pid}-{secrets.token_hex(4)}"
        temp = os.path.join(self.dir, f".{self.id}.tmp")
        self.path = os.path.join(self.dir, self.id + MEMBER_SUFFIX)
        self._fh: IO[str] | None = lock_file(temp)  # a fresh name: never held by anyone else
        try:
            os.rename(temp, self.path)  # the lock goes with the file
        except BaseException:
            self.close()
            os.unlink(temp)
            raise

    def members(self) -> list[str]:
        """The ids of the live members, sorted (this one among them); files of dead ones are removed."""
        alive = [self.id]
        fd = open_dir(self.dir)  # never through a link
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        for name in names:
            if not MEMBER_RE.match(name):
                continue  # temporary names of members still joining, and anything else
            id = name[: -len(MEMBER_SUFFIX)]
            if id == self.id:
                continue
            path = os.path.join(self.dir, name)
            try:
                fh = lock_file(path)
            except LockedError:
                alive.append(id)
                continue
            except (UnsafeFileError, FileNotFoundError):
                continue  # not a member file; or removed meanwhile (its directory is gone)
            try:  # locked by us: its member is dead (or it was just removed, and we created it again)
                os.unlink(path)
            except FileNotFoundError:
                pass
            finally:
                unlock_file(fh)
        alive.sort()
        return alive

    def close(self) -> None:
        """Leave the group. Idempotent. In a child forked since it joined, the membership stays the parent's:
        only this process's copy of its file is closed."""
        if self._fh is not None:
            if os.getpid() == self._pid:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
            unlock_file(self._fh)  # in a forked child, closes only its copy
            self._fh = None


__all__ = ["GROUPS_DIR", "Membership", "group_dir", "share"]
