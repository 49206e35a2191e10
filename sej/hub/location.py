"""Where the hub copies from: a location (a local path, or ssh://[user@]host[:port]/path) and its Sources.

`Origin.parse(text)` reads a location; a hub.toml client gives one too
(`ClientConfig.origin`). `open_sources(origin)` makes the `Sources` of an origin:
the factory of Sources the copy engine takes (copy_all's `make_source`), each a
LocalSource of the root, or an SftpSource on its own SFTP channel of one SSH
connection, made when the Sources are opened. `sej copy`, the hub daemon and the
main job all build their sources here.

paramiko is imported only when an SSH location is opened (sej.hub.ssh); without it
installed that fails with one clear SejError.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from ..errors import InvalidArgumentError, SejError
from .local_source import LocalSource
from .source import CONNECT_TIMEOUT, IO_TIMEOUT, KEEP_HANDLES, Source

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger("sej.hub")


_URL = re.compile(
    r"\Assh://(?:(?P<user>[^@/:]+)@)?(?P<host>[^/:@]+|\[[0-9a-fA-F:.]+\])(?::(?P<port>\d+))?(?P<path>/.*)\Z"
)


class Location(NamedTuple):
    """An `ssh://[user@]host[:port]/path` location."""

    user: str | None
    host: str
    port: int | None
    path: str

    def __str__(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"ssh://{user}{self.host}{port}{self.path}"


TRANSPORTS = ("auto", "serve", "sftp")
"""How an SSH origin is read: `sej serve` on the producer, SFTP, or serve when the producer has it (auto)."""


def check_transport(value: object) -> str:
    if value not in TRANSPORTS:
        raise InvalidArgumentError(f"transport must be one of {', '.join(TRANSPORTS)}, got {value!r}")
    return str(value)


def parse_location(text: str) -> Location | None:
    """The SSH location in `text`, or None when it is a local path; bad ssh:// URLs raise."""
    if not text.startswith("ssh://"):
        return None
    m = _URL.match(text)
    if not m:
        raise InvalidArgumentError(f"{text!r} is not an ssh://[user@]host[:port]/path location")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 0 < port < 65536:
        raise InvalidArgumentError(f"port {port} in {text!r} is not a TCP port")
    return Location(m.group("user"), m.group("host").strip("[]"), port, m.group("path"))


@dataclass(frozen=True)
class Origin:
    """Where a producer's journals are: `root` on this machine, or `root` on `host` over SSH (SFTP).

    `root` is a sharded root or one journal. The SSH settings not given here come from
    ~/.ssh/config (sej.hub.ssh.resolve); only keys authenticate, and a host key is checked
    against known_hosts unless accept_new_host_key is set. `transport` is how an SSH origin
    is read: "serve" (`serve_command serve ROOT` on the producer, sej.hub.serve_source), "sftp",
    or "auto" (serve, else SFTP). `compression`: SSH's own zlib on the connection (as `scp -C`), both transports.
    """

    root: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    transport: str = "auto"
    serve_command: str = "sej"
    compression: bool = False

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        identity: str | None = None,
        known_hosts: str | None = None,
        accept_new_host_key: bool = False,
        transport: str = "auto",
        serve_command: str = "sej",
        compression: bool = False,
    ) -> Origin:
        """The origin a location names: ssh://[user@]host[:port]/path, or else a local path."""
        loc = parse_location(text)
        if loc is None:
            return cls(text)
        return cls(loc.path, loc.host, loc.port, loc.user, identity, known_hosts, accept_new_host_key,
                   check_transport(transport), serve_command, compression)  # fmt: skip

    @property
    def is_local(self) -> bool:
        return self.host is None

    def __str__(self) -> str:
        if self.host is None:
            return self.root
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"ssh://{user}{self.host}{port}{'' if self.root.startswith('/') else '/~/'}{self.root}"


class Sources:
    """The Sources of one origin: call it for a new Source (copy_all's `make_source`).

    `label` names where they come from in messages: the local root, or user@host:port.
    `ssh` is the SSH connection the SftpSources share (None for a local origin); close()
    (or leaving `with`) closes it, which also makes every call still waiting on it fail.
    """

    def __init__(self, label: str, make: Callable[[], Source], ssh: paramiko.SSHClient | None = None) -> None:
        self.label = label
        self.ssh = ssh
        self._make = make
        self._kept: dict[int, Source] = {}
        self._lock = threading.Lock()

    def __call__(self) -> Source:
        return self._make()

    def kept(self, k: int) -> Source:
        """Source `k` of those kept between passes (the daemon's): the same channel, and the files it keeps
        open, until it breaks (then a new one). The caller uses each from one thread at a time."""
        with self._lock:
            src = self._kept.get(k)
            if src is not None and not src.broken:
                return src
            self._kept.pop(k, None)
        if src is not None:
            src.close()
        src = self._make()
        try:
            src.keep_handles(KEEP_HANDLES)
        except BaseException:
            src.close()
            raise
        with self._lock:
            self._kept[k] = src
        return src

    def watch(self, on_changed: Callable[[list[str]], None]) -> bool:
        """Hear of changes on the producer as they happen (`on_changed(journals)`, []: anything), if its transport
        pushes them (sej serve); False if it does not (SFTP, a local root): then only passes see them."""
        watch = getattr(self._make, "watch", None)  # ServeSources'
        if watch is None:
            return False
        watch(on_changed)
        return True

    def forget(self, journals: set[str]) -> None:
        """Let the kept sources go of what they hold open for `journals` (gone, failed or stalled)."""
        for src in self._kept_now():
            src.forget(journals)

    def tidy(self) -> None:
        """Close what the kept sources let go of, or kept open for long (SftpSource.tidy). A source that fails
        to is broken (replaced when next asked for); the pass that tidies is not failed for it."""
        errors: tuple[type[BaseException], ...] = (SejError, *transport_errors())
        for src in self._kept_now():
            if not src.broken:
                try:
                    src.tidy()
                except errors as e:
                    log.debug("%s: closing the files kept open: %s", self.label, e)

    def _kept_now(self) -> list[Source]:
        with self._lock:
            return list(self._kept.values())

    def alive(self) -> bool:
        """False once the SSH connection is gone (closed, or lost); a local origin is always alive."""
        if self.ssh is None:
            return True
        transport = self.ssh.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        try:
            if self.ssh is not None:  # first: the connection's end ends every call still waiting on it
                self.ssh.close()
        finally:
            for src in kept:
                src.close()

    def __enter__(self) -> Sources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KeptOf:
    """The sources a Sources keeps between passes (Sources.kept), as copy_all's `kept` (sej.hub.batch.KeptSources).
    The daemon's adds its watchdog."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def __call__(self, k: int) -> Source:
        return self.sources.kept(k)

    def forget(self, journals: set[str]) -> None:
        self.sources.forget(journals)

    def tidy(self) -> None:
        self.sources.tidy()


def open_sources(
    origin: Origin, *, connect_timeout: float = CONNECT_TIMEOUT, io_timeout: float = IO_TIMEOUT,
    client_id: str | None = None,
) -> Sources:  # fmt: skip
    """The Sources of `origin`: LocalSources of its root, or ServeSources or SftpSources over one new SSH
    connection (`origin.transport`; "auto" falls back to SFTP, saying why in one log line, when `sej serve`
    cannot be run there).

    Connecting resolves the host with ~/.ssh/config and fails with an SshError or HostKeyError
    naming the reason (after at most `connect_timeout` seconds per step). Over SSH, an SFTP
    reply that takes longer than `io_timeout` seconds fails its call with a SourceError, and
    what paramiko logs of the connection names `client_id` (sej.hub.ssh.log_channel).
    """
    if origin.host is None:
        root = origin.root
        return Sources(root, lambda: LocalSource(root))
    try:
        from . import ssh
    except ModuleNotFoundError as e:
        if e.name != "paramiko":
            raise
        raise SejError(
            f"{origin}: copying over SSH needs paramiko, which is not installed: "
            "install sej with its 'hub' extra (pip install '.[hub]' in a checkout)"
        ) from None
    ep = ssh.resolve(origin.host, origin.port, origin.user, origin.identity, origin.known_hosts)
    label = f"{ep.user}@{ep.host}:{ep.port}"
    client = ssh.connect(ep, accept_new_host_key=origin.accept_new_host_key, timeout=connect_timeout,
                         log_as=client_id, compress=origin.compression)  # fmt: skip
    try:
        make: Callable[[], Source] | None = None
        if origin.transport != "sftp":
            from .serve_source import ServeUnavailable, serve_sources

            try:
                make = serve_sources(client, origin.root, label, io_timeout, origin.serve_command)
            except ServeUnavailable as e:
                if origin.transport == "serve":
                    raise
                log.warning("sej serve is not available, copying over SFTP: %s", e,
                            extra={"client": client_id} if client_id else None)  # fmt: skip
        if make is None:
            make = ssh.sftp_sources(client, origin.root, label, io_timeout)
    except BaseException:
        client.close()
        raise
    return Sources(label, make, client)


def transport_errors() -> tuple[type[BaseException], ...]:
    """What a call to a producer can fail with: OSError, EOFError and, once paramiko is in use, SSHException.

    paramiko is not imported for this: an SSHException can only come from a paramiko already imported.
    """
    paramiko = sys.modules.get("paramiko")
    ssh_error: tuple[type[BaseException], ...] = () if paramiko is None else (paramiko.SSHException,)
    return (OSError, EOFError, *ssh_error)
