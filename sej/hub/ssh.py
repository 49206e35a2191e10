"""SSH connections to producers (paramiko): verified host keys, key authentication, ~/.ssh/config.

A host key is checked against known_hosts; an unknown or changed key refuses the
connection unless accepting new keys was asked for explicitly. Only keys
authenticate (no passwords), and no remote command is ever run: the hub speaks
SFTP only. sej.hub.location imports this module when an SSH location is opened:
no other module of sej imports paramiko when it is imported.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

from ..errors import SejError
from .sftp_source import SftpSource
from .source import IO_TIMEOUT


def _import_paramiko() -> None:
    """Import paramiko without invoke: paramiko.config imports it (yaml, asyncio and more: 45-60 ms of a `sej copy`
    that takes 2 s at a distance) only to run the commands of `Match exec` lines in an ssh config. `resolve` imports
    it when a config it reads has such a line."""
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return
    sys.modules["invoke"] = None  # type: ignore[assignment]  # an ImportError for paramiko.config's try
    try:
        import paramiko.config  # noqa: F401
    finally:
        del sys.modules["invoke"]


_import_paramiko()

import paramiko  # noqa: E402


class SshError(SejError):
    """An SSH connection could not be made or was lost."""


class HostKeyError(SshError):
    """The producer's host key is unknown or does not match known_hosts."""


class Endpoint(NamedTuple):
    """Everything needed to connect, after ~/.ssh/config was applied."""

    host: str  # the name to connect to
    alias: str  # the name the user gave (and that known_hosts may use)
    port: int
    user: str
    identity: list[str]
    known_hosts: str


def resolve(
    host: str,
    port: int | None = None,
    user: str | None = None,
    identity: str | None = None,
    known_hosts: str | None = None,
    ssh_config: str | None = None,
) -> Endpoint:
    """Apply ~/.ssh/config (or `ssh_config`) to the given options; explicit options win."""
    config_path = os.path.expanduser(ssh_config or "~/.ssh/config")
    entry: dict[str, object] = {}
    if os.path.exists(config_path):
        config = paramiko.SSHConfig.from_path(config_path)
        if _runs_commands(config_path):
            _import_invoke()
        entry = dict(config.lookup(host))
    hostname = str(entry.get("hostname", host))
    identities = [identity] if identity else [str(p) for p in entry.get("identityfile", [])]  # type: ignore[attr-defined]
    if not identities:
        identities = [
            p
            for p in ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
            if os.path.exists(os.path.expanduser(p))
        ]
    kh = known_hosts or str(entry.get("userknownhostsfile", "~/.ssh/known_hosts")).split()[0]
    return Endpoint(
        host=hostname,
        alias=host,
        port=port or int(str(entry.get("port", 22))),
        user=user or str(entry.get("user", os.environ.get("USER") or _whoami())),
        identity=[os.path.expanduser(p) for p in identities],
        known_hosts=os.path.expanduser(kh),
    )


def _runs_commands(path: str) -> bool:
    """Whether the ssh config at `path` may have a `Match exec` line (paramiko runs its command with invoke)."""
    try:
        with open(path, "rb") as f:
            return b"exec" in f.read().lower()
    except OSError:
        return True  # paramiko read it: its error is its own


def _import_invoke() -> None:
    """Give paramiko.config the invoke that _import_paramiko kept from it, if installed (else paramiko raises
    its own ImportError at a `Match exec`, as without it)."""
    import paramiko.config as config

    if getattr(config, "invoke", None) is None:
        try:
            import invoke
        except ImportError:
            return
        config.invoke = invoke  # type: ignore[attr-defined]


def _whoami() -> str:
    import getpass

    return getpass.getuser()


FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
"""Preferred first: AES-GCM needs no separate HMAC per packet, and paramiko's bulk reads are
50-60% faster with it than with its default aes128-ctr + hmac-sha2-256 (measured, 107-137 vs
164-174 MiB/s on loopback). The rest of paramiko's list stays, for servers without it."""


WINDOW = 16 << 20
"""The SSH channel window the hub offers (paramiko's default is 2 MiB): how many bytes a producer may send on one
channel before the hub acknowledges them. A window smaller than the link's bandwidth times its round trip caps a
channel's throughput at window / round trip: 2 MiB at +150 ms is 13 MiB/s, under a 200 Mbit/s link's 25 MB/s (the
proxy's queue adds to the round trip). 16 MiB keeps such a link full up to ~600 ms of round trip.

What it costs is memory only when the hub does not read what arrives, and it always reads: a producer sends only what
the hub asked for (SFTP replies, sej serve's replies to a pass's reads, which the pass holds anyway, at most
sej.hub.batch.PREFETCH_PER_ROUND a round) plus sej serve's pushes (a few names). So at most WINDOW bytes per channel
wait in paramiko's buffer: per client connection, 16 MiB over sej serve (one channel), (workers + 3) x 16 MiB over
SFTP in the worst case; in practice what a round's reads ask for, as before."""

MAX_PACKET = 256 << 10
"""The largest SSH packet the hub accepts (paramiko's default is 32 KiB; OpenSSH sends up to 256 KiB): paramiko
decrypts, checks and queues each packet in Python, so bulk bytes in 8x fewer packets cost the hub far less CPU."""


log = logging.getLogger("sej.hub")

KEEPALIVE_IDLE = 5.0
"""Seconds without a byte from the producer before the hub asks it for a reply (an SSH global request with
want_reply, as OpenSSH's ServerAliveInterval sends): a busy link needs none, a quiet one gets one this often."""

KEEPALIVE_DEAD = 10.0
"""Seconds without a byte from the producer (not even the reply to a keepalive) before the hub closes the
connection: a silent partition (nothing closed, bytes held) is found within this and a LIVENESS_TICK, where a
TCP connection would wait for minutes. paramiko's own keepalive only sends; it never notices a dead peer."""

LIVENESS_TICK = 1.0
"""How often the liveness monitor looks at every connection."""


class _HeardSocket(socket.socket):
    """A TCP socket that remembers when it last received bytes (paramiko's transport thread reads it)."""

    heard = 0.0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if data:
            self.heard = time.monotonic()
        return data


def _heard(sock: socket.socket) -> _HeardSocket:
    """`sock` as a _HeardSocket (the same file descriptor, taken over)."""
    timeout = sock.gettimeout()
    heard = _HeardSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    heard.settimeout(timeout)  # a new socket object starts blocking: keep connect()'s bound on the handshake
    heard.heard = time.monotonic()
    return heard


class _Liveness:
    """Closes connections whose producer fell silent: one thread for every connection of the process.

    A connection quiet for `idle` seconds is sent a keepalive that wants a reply (from a thread of its own:
    paramiko waits for the reply without a bound); one that stays quiet `dead` seconds is closed, so that
    every call waiting on it fails at once and the client reconnects.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: weakref.WeakKeyDictionary[paramiko.Transport, tuple[_HeardSocket, float, float, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._asking: weakref.WeakSet[paramiko.Transport] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def watch(self, transport: paramiko.Transport, sock: _HeardSocket, idle: float, dead: float, label: str) -> None:
        with self._lock:
            self._watched[transport] = (sock, idle, dead, label)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sej-ssh-liveness", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:  # a daemon thread, for the life of the process: it sleeps while nothing is watched
            time.sleep(LIVENESS_TICK)
            with self._lock:
                watched = list(self._watched.items())
            for transport, (sock, idle, dead, label) in watched:
                if not transport.is_active():
                    with self._lock:
                        self._watched.pop(transport, None)
                    continue
                quiet = time.monotonic() - sock.heard
                if quiet >= dead:
                    log.warning("%s: nothing heard from the producer for %.0fs (not even a keepalive's reply); "
                                "closing the connection", label, quiet)  # fmt: skip
                    with self._lock:
                        self._watched.pop(transport, None)
                    transport.close()
                elif quiet >= idle and transport not in self._asking:
                    self._asking.add(transport)
                    threading.Thread(target=self._ask, args=(transport,), name="sej-ssh-keepalive",
                                     daemon=True).start()  # fmt: skip

    def _ask(self, transport: paramiko.Transport) -> None:
        """A keepalive that wants a reply (OpenSSH answers an unknown request with a failure: bytes all the same);
        returns when it came, or when the connection is closed."""
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception as e:  # a closed transport: _run drops it
            log.debug("keepalive: %s", e)
        finally:
            self._asking.discard(transport)


LIVENESS = _Liveness()


def _transport(sock: socket.socket, log_as: str | None = None, heard: list[_HeardSocket] | None = None,
               **kwargs: object) -> paramiko.Transport:  # fmt: skip
    """A paramiko Transport that prefers FAST_CIPHERS, logging as client `log_as` (log_channel). With `heard`,
    its socket (a _HeardSocket: when it last received bytes) is appended to it."""
    if heard is not None:
        sock = _heard(sock)
        heard.append(sock)
    kwargs.setdefault("default_window_size", WINDOW)
    kwargs.setdefault("default_max_packet_size", MAX_PACKET)
    t = paramiko.Transport(sock, **kwargs)
    if log_as is not None:
        t.set_log_channel(log_channel(log_as))
    options = t.get_security_options()
    have = tuple(options.ciphers)
    options.ciphers = tuple(c for c in FAST_CIPHERS if c in have) + tuple(c for c in have if c not in FAST_CIPHERS)
    return t


def connect(ep: Endpoint, accept_new_host_key: bool = False, timeout: float = 15.0,
            log_as: str | None = None, compress: bool = False, keepalive: tuple[float, float] = (KEEPALIVE_IDLE,
            KEEPALIVE_DEAD)) -> paramiko.SSHClient:  # fmt: skip
    """An authenticated SSH connection to `ep`; HostKeyError or SshError with one clear reason.

    With `log_as` (a client id), what paramiko logs of this connection names the client (log_channel). With
    `compress`, SSH's own zlib compresses the connection (as `ssh -C`; a server that refuses it gets none).
    `keepalive` is (idle, dead): see KEEPALIVE_IDLE and KEEPALIVE_DEAD.
    """
    client = paramiko.SSHClient()
    heard: list[_HeardSocket] = []
    try:
        if os.path.exists(ep.known_hosts):
            client.load_host_keys(ep.known_hosts)
        elif not accept_new_host_key:
            raise HostKeyError(f"known_hosts file {ep.known_hosts} does not exist: cannot verify {ep.host}")
        if accept_new_host_key:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # explicit opt-in only
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if not ep.identity:
            raise SshError(f"no SSH identity file for {ep.user}@{ep.host}: pass one (--identity or identity_file)")
        client.connect(
            ep.host,
            port=ep.port,
            username=ep.user,
            key_filename=ep.identity,
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            compress=compress,
            transport_factory=functools.partial(_transport, log_as=log_as, heard=heard),
        )
        if accept_new_host_key and os.path.isdir(os.path.dirname(ep.known_hosts) or "."):
            client.save_host_keys(ep.known_hosts)
        transport = client.get_transport()
        if transport is not None and heard:
            LIVENESS.watch(transport, heard[-1], *keepalive, f"{ep.user}@{ep.host}:{ep.port}")
        return client
    except paramiko.BadHostKeyException as e:
        client.close()
        raise HostKeyError(
            f"host key of [{ep.host}]:{ep.port} does not match {ep.known_hosts} "
            f"(got {e.key.get_name()} {e.key.get_fingerprint().hex()}): refusing to connect"
        ) from None
    except paramiko.AuthenticationException as e:
        client.close()
        raise SshError(f"{ep.user}@{ep.host}:{ep.port}: key authentication failed: {e}") from None
    except paramiko.SSHException as e:
        why = _why(e, client)
        client.close()
        if "not found in known_hosts" in str(e):
            raise HostKeyError(
                f"host [{ep.host}]:{ep.port} is not in {ep.known_hosts}: refusing to connect "
                "(add its key, or accept new host keys explicitly)"
            ) from None
        raise SshError(f"{ep.user}@{ep.host}:{ep.port}: {why}") from None
    except (TimeoutError, OSError, EOFError) as e:
        why = _why(e, client)
        client.close()
        raise SshError(f"{ep.user}@{ep.host}:{ep.port}: {why}") from None
    except BaseException:
        client.close()
        raise


def _why(e: BaseException, client: paramiko.SSHClient) -> str:
    """Why connecting failed, in words, never empty: a reset or a close gets named, with the phase it came in.

    paramiko reports a peer that closes before its banner as a bare EOFError (no text) and one that
    resets it as "Error reading SSH protocol banner[Errno 104] ...".
    """
    chain: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    transport = client.get_transport()
    # A reset or a close needs an established TCP connection (a refused one is ECONNREFUSED), so without
    # the server's banner it came before it, even when paramiko had not made its Transport yet.
    banner = transport is not None and bool(transport.remote_version)
    phase = " during the SSH handshake" if banner else " before the SSH banner"
    if any(isinstance(c, (ConnectionResetError, BrokenPipeError)) for c in chain):
        return "connection reset by the peer" + phase
    if any(isinstance(c, (EOFError, ConnectionAbortedError)) for c in chain):
        return "connection closed by the peer" + phase
    if any(isinstance(c, TimeoutError) for c in chain):
        return "timed out" + (phase if transport is not None else " connecting")
    return " ".join(str(e).split()) or type(e).__name__


class _NoTransportTracebacks(logging.Filter):
    """Drops the traceback paramiko's transport thread logs, line by line, after the error it died of.

    The error itself stays (one line), and connect() or the failed call reports it with its reason.
    """

    def __init__(self) -> None:
        super().__init__()
        self._in_traceback: set[tuple[int | None, str | None]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        thread = (record.thread, record.threadName)
        if record.levelno != logging.ERROR:
            self._in_traceback.discard(thread)
            return True
        message = str(record.msg)
        if message.startswith(("Exception (", "Unknown exception:")):
            self._in_traceback.add(thread)  # paramiko logs util.tb_strings() next
            return True
        return thread not in self._in_traceback


TRANSPORT_FILTER = _NoTransportTracebacks()
logging.getLogger("paramiko.transport").addFilter(TRANSPORT_FILTER)


class _Names(logging.Filter):
    """Puts the client id in the `client` field of each record, as sej's own records of a client have it."""

    def __init__(self, client_id: str) -> None:
        super().__init__()
        self.client_id = client_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.client = self.client_id
        return True


_channels: set[str] = set()
_channels_lock = threading.Lock()


def log_channel(client_id: str) -> str:
    """The logger paramiko logs a client's connection to: `paramiko.transport.<client id>` (its SFTP
    channels: `.sftp` below it), with the client in each record's `client` field and no transport
    tracebacks. Among 50 clients, "Socket exception: Connection reset by peer" says which one."""
    name = f"paramiko.transport.{client_id}"
    with _channels_lock:
        if name not in _channels:
            names = _Names(client_id)
            for logger in (logging.getLogger(name), logging.getLogger(name + ".sftp")):
                logger.addFilter(names)
                logger.addFilter(TRANSPORT_FILTER)  # a logger's filters see only its own records
            _channels.add(name)
    return name


def sftp_sources(
    client: paramiko.SSHClient, root: str, label: str, io_timeout: float = IO_TIMEOUT
) -> Callable[[], SftpSource]:
    """A factory of SftpSources, each on its own SFTP channel of the one connection.

    A reply that takes longer than `io_timeout` seconds fails the call with a SourceError.
    """
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise SshError(f"{label}: the SSH connection is closed")

    def make() -> SftpSource:
        try:
            sftp = paramiko.SFTPClient.from_transport(transport)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise SshError(f"{label}: cannot open an SFTP channel: {str(e) or type(e).__name__}") from None
        if sftp is None:
            raise SshError(f"{label}: cannot open an SFTP channel")
        sftp.get_channel().settimeout(io_timeout)
        return SftpSource(sftp, root, label)

    return make
