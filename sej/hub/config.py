"""`hub.toml`: the hub's configuration, read with tomllib into validated dataclasses.

    hub_root = "/var/lib/sej-hub"        # required: where `<client-id>.<journal>` copies go
    hub_name = "hub"                     # the reader offset the hub commits on every producer
    poll_interval = 1.0                  # a pass starts every poll_interval seconds (forever mode)
    commit_interval = 5.0                # the hub offset on a producer lags its copy by at most this (daemon)
    workers = 4                          # journals copied at once, per client
    backoff_max = 60.0                   # longest wait before retrying a failed client
    metrics_listen = "127.0.0.1:9108"    # optional, off by default: /metrics (Prometheus) and /health
    health_max_age = 30.0                # /health: 503 when a client's last good pass is older (default:
                                         # the longer of 30 s and 10 poll intervals)
    log_format = "text"                  # or "json": one JSON object per line

    [[client]]
    client_id = "edge-1"
    host = "edge-1.example.com"          # an ~/.ssh/config alias works too
    port = 22                            # optional
    user = "sej"                         # optional
    identity_file = "/etc/sej/hub_ed25519"   # optional; keys only, never passwords
    known_hosts = "/etc/sej/known_hosts"     # optional
    accept_new_host_key = false          # optional
    remote_root = "/var/lib/app"         # a sharded root or one journal on the producer
    transport = "auto"                   # optional: "serve" (sej serve on the producer), "sftp", or "auto"
    serve_command = "sej"                # optional: the producer's sej, e.g. "/opt/app/venv/bin/sej"
    compression = false                  # optional: SSH's own zlib (as scp -C), for slow links

    [[client]]
    client_id = "here"
    local_root = "/var/lib/other-app"    # a producer on this machine: no SSH

Every unknown key and every bad value raises InvalidArgumentError naming the file,
the entry, the key and the value. Relative hub-side paths (hub_root, local_root,
identity_file, known_hosts) are relative to the directory of the config file; `~`
is expanded. There is no password option: the hub authenticates with keys only.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidArgumentError
from ..layout import check_reader_name
from .location import TRANSPORTS, Origin
from .names import check_client_id

MAX_WORKERS = 64
MAX_SECONDS = 86400.0
"""Upper bound of poll_interval and backoff_max (one day): a larger value is a typo."""

_HOST_RE = re.compile(r"\A[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\[\]-]*\Z")
_USER_RE = re.compile(r"\A[A-Za-z0-9_.][A-Za-z0-9_.$-]*\Z")

_SECRET_KEYS = ("password", "passwd", "passphrase", "secret")
"""Keys whose values are never echoed back, in case someone tried to put a password in the file."""

TOP_KEYS = ("hub_root", "hub_name", "poll_interval", "commit_interval", "workers", "backoff_max", "metrics_listen",
            "health_max_age", "log_format", "client")  # fmt: skip
LOG_FORMATS = ("text", "json")
HEALTH_MIN_AGE = 30.0
"""The shortest default of health_max_age (seconds); it is at least 10 poll intervals."""
SSH_KEYS = ("host", "port", "user", "identity_file", "remote_root", "known_hosts", "accept_new_host_key", "transport",
            "serve_command", "compression")  # fmt: skip
CLIENT_KEYS = ("client_id", "local_root", *SSH_KEYS)


@dataclass(frozen=True)
class ClientConfig:
    """One producer: over SSH (`host` + `remote_root`) or on this machine (`local_root`)."""

    client_id: str
    local_root: str | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    remote_root: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    transport: str = "auto"
    serve_command: str = "sej"
    compression: bool = False

    @property
    def is_local(self) -> bool:
        return self.local_root is not None

    @property
    def origin(self) -> Origin:
        """Where the client's journals are, to open with sej.hub.location.open_sources."""
        if self.local_root is not None:
            return Origin(self.local_root)
        assert self.host is not None and self.remote_root is not None  # parse_config checked it
        return Origin(self.remote_root, self.host, self.port, self.user, self.identity_file, self.known_hosts,
                      self.accept_new_host_key, self.transport, self.serve_command, self.compression)  # fmt: skip

    def describe(self) -> str:
        """Where the client's journals are, for messages: a local path or ssh://[user@]host[:port]/root."""
        return str(self.origin)


@dataclass(frozen=True)
class HubConfig:
    """The whole hub.toml."""

    hub_root: str
    clients: tuple[ClientConfig, ...]
    hub_name: str = "hub"
    poll_interval: float = 1.0
    commit_interval: float = 5.0  # the daemon commits a journal's hub offset on the producer at most this often
    workers: int = 4
    backoff_max: float = 60.0
    metrics_listen: tuple[str, int] | None = None  # (host, port) of /metrics and /health; None: off
    health_max_age: float | None = None  # None: max(HEALTH_MIN_AGE, 10 * poll_interval)
    log_format: str = "text"
    path: str | None = None  # the file it was read from

    @property
    def health_age(self) -> float:
        """Seconds since a client's last successful pass after which /health reports it stale."""
        if self.health_max_age is not None:
            return self.health_max_age
        return max(HEALTH_MIN_AGE, 10 * self.poll_interval)

    def client(self, client_id: str) -> ClientConfig:
        for c in self.clients:
            if c.client_id == client_id:
                return c
        raise KeyError(client_id)


def load_config(path: str | os.PathLike[str]) -> HubConfig:
    """Read and validate a hub.toml file; InvalidArgumentError names what is wrong."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise InvalidArgumentError(f"config file {p} does not exist")
    if os.path.isdir(p):
        raise InvalidArgumentError(f"config file {p} is a directory")
    with open(p, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{p}: not UTF-8 text (byte {e.start})") from None
    config = loads_config(text, base_dir=os.path.dirname(os.path.abspath(p)), where=p)
    return replace(config, path=os.path.abspath(p))


def loads_config(text: str, base_dir: str | None = None, where: str = "hub.toml") -> HubConfig:
    """Parse hub.toml text; relative paths are taken relative to `base_dir` (default: the current directory)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgumentError(f"{where}: not valid TOML: {e}") from None
    return parse_config(data, base_dir=base_dir, where=where)


def parse_config(data: dict[str, Any], base_dir: str | None = None, where: str = "hub.toml") -> HubConfig:
    """Validate an already parsed hub.toml (a dict as tomllib returns it)."""
    base = os.path.abspath(base_dir if base_dir is not None else os.getcwd())
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{where}: expected a TOML table, got {type(data).__name__}")
    _unknown_keys(data, TOP_KEYS, where, "top level")
    if "hub_root" not in data:
        raise InvalidArgumentError(f"{where}: missing key hub_root (the directory the copies go to)")
    hub_root = _local_path(data["hub_root"], "hub_root", where, base)
    hub_name = _checked(data.get("hub_name", "hub"), "hub_name", where, check_reader_name)
    poll_interval = _seconds(data.get("poll_interval", 1.0), "poll_interval", where)
    commit_interval = _seconds(data.get("commit_interval", 5.0), "commit_interval", where, zero=True)
    workers = data.get("workers", 4)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= MAX_WORKERS:
        raise _bad(where, "workers", workers, f"must be an integer from 1 to {MAX_WORKERS}")
    backoff_max = _seconds(data.get("backoff_max", 60.0), "backoff_max", where)
    metrics_listen = None if "metrics_listen" not in data else _listen(data["metrics_listen"], where)
    health_max_age = None if "health_max_age" not in data else _seconds(data["health_max_age"], "health_max_age", where)
    log_format = data.get("log_format", "text")
    if log_format not in LOG_FORMATS:
        raise _bad(where, "log_format", log_format, f"must be one of {', '.join(map(repr, LOG_FORMATS))}")

    entries = data.get("client")
    if entries is None:
        raise InvalidArgumentError(f"{where}: no [[client]] entries: the hub has nothing to copy")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _bad(where, "client", entries, "must be an array of tables, written [[client]]")
    if not entries:
        raise InvalidArgumentError(f"{where}: no [[client]] entries: the hub has nothing to copy")
    clients: list[ClientConfig] = []
    seen: dict[str, int] = {}
    for n, entry in enumerate(entries, 1):
        client = _client(entry, n, where, base)
        if client.client_id in seen:
            raise InvalidArgumentError(
                f"{where}: [[client]] #{n}: client_id = {client.client_id!r} is already used by "
                f"[[client]] #{seen[client.client_id]}: client ids must be unique"
            )
        seen[client.client_id] = n
        clients.append(client)
    return HubConfig(
        hub_root=hub_root,
        clients=tuple(clients),
        hub_name=hub_name,
        poll_interval=poll_interval,
        commit_interval=commit_interval,
        workers=workers,
        backoff_max=backoff_max,
        metrics_listen=metrics_listen,
        health_max_age=health_max_age,
        log_format=log_format,
    )


def _client(entry: dict[str, Any], n: int, where: str, base: str) -> ClientConfig:
    label = f"[[client]] #{n}"
    if "client_id" not in entry:
        _unknown_keys(entry, CLIENT_KEYS, where, label)
        raise InvalidArgumentError(f"{where}: {label}: missing key client_id")
    cid = _checked(entry["client_id"], "client_id", f"{where}: {label}", check_client_id)
    ctx = f"{where}: {label} (client_id {cid!r})"
    _unknown_keys(entry, CLIENT_KEYS, ctx, "")
    if "local_root" in entry:
        ssh = [k for k in SSH_KEYS if k in entry]
        if ssh:
            raise _bad(
                ctx, ssh[0], entry[ssh[0]], "is an SSH option, but this client has local_root (a local producer)"
            )
        return ClientConfig(cid, local_root=_local_path(entry["local_root"], "local_root", ctx, base))
    for required in ("host", "remote_root"):
        if required not in entry:
            raise InvalidArgumentError(
                f"{ctx}: missing key {required} (an SSH client needs host and remote_root; "
                "a client on this machine needs local_root)"
            )
    host = entry["host"]
    if not isinstance(host, str) or not _HOST_RE.match(host) or len(host) > 255:
        raise _bad(ctx, "host", host, "must be a host name, an IP address or an ~/.ssh/config alias")
    port = entry.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise _bad(ctx, "port", port, "must be a TCP port, an integer from 1 to 65535")
    user = entry.get("user")
    if user is not None and (not isinstance(user, str) or not _USER_RE.match(user) or len(user) > 64):
        raise _bad(ctx, "user", user, "must be a user name")
    remote_root = entry["remote_root"]
    if not isinstance(remote_root, str) or not remote_root or "\0" in remote_root:
        raise _bad(ctx, "remote_root", remote_root, "must be a non-empty path on the producer")
    accept = entry.get("accept_new_host_key", False)
    if not isinstance(accept, bool):
        raise _bad(ctx, "accept_new_host_key", accept, "must be true or false")
    identity = entry.get("identity_file")
    known_hosts = entry.get("known_hosts")
    transport = entry.get("transport", "auto")
    if transport not in TRANSPORTS:
        raise _bad(ctx, "transport", transport, f"must be one of {', '.join(map(repr, TRANSPORTS))}")
    serve_command = entry.get("serve_command", "sej")
    if not isinstance(serve_command, str) or not serve_command.strip() or any(c in serve_command for c in "\0\n\r"):
        raise _bad(ctx, "serve_command", serve_command, "must be a command line on the producer, e.g. "
                   "'/opt/app/venv/bin/sej'")  # fmt: skip
    compression = entry.get("compression", False)
    if not isinstance(compression, bool):
        raise _bad(ctx, "compression", compression, "must be true or false")
    return ClientConfig(
        cid,
        host=host,
        port=port,
        user=user,
        identity_file=None if identity is None else _local_path(identity, "identity_file", ctx, base),
        remote_root=remote_root,
        known_hosts=None if known_hosts is None else _local_path(known_hosts, "known_hosts", ctx, base),
        accept_new_host_key=accept,
        transport=transport,
        serve_command=serve_command,
        compression=compression,
    )


def _unknown_keys(table: dict[str, Any], known: tuple[str, ...], where: str, label: str) -> None:
    ctx = f"{where}: {label}" if label else where
    for key, value in table.items():
        if key in known:
            continue
        if any(s in key.lower() for s in _SECRET_KEYS):
            raise InvalidArgumentError(
                f"{ctx}: unknown key {key!r} (value not shown): passwords are not a hub option, "
                "the hub authenticates with SSH keys only (identity_file)"
            )
        raise InvalidArgumentError(f"{ctx}: unknown key {key!r} (= {_show(value)}); known keys: {', '.join(known)}")


def _bad(where: str, key: str, value: object, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{where}: {key} = {_show(value)}: {problem}")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _checked(value: object, key: str, where: str, check: Any) -> Any:
    try:
        return check(value)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{where}: {key} = {_show(value)}: {e}") from None


def _seconds(value: object, key: str, where: str, zero: bool = False) -> float:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not (value >= 0 if zero else value > 0)
        or value > MAX_SECONDS
    ):
        least = "at least 0" if zero else "more than 0"
        raise _bad(where, key, value, f"must be a number of seconds, {least} and at most {MAX_SECONDS:g}")
    return float(value)


def _listen(value: object, where: str) -> tuple[str, int]:
    """metrics_listen: "HOST:PORT" ("[::1]:9108" for IPv6); port 0 picks a free one (tests)."""
    problem = 'must be "HOST:PORT", e.g. "127.0.0.1:9108"'
    if not isinstance(value, str):
        raise _bad(where, "metrics_listen", value, problem)
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536 or not _HOST_RE.match(host):
        raise _bad(where, "metrics_listen", value, problem)
    return host, int(port)


def _local_path(value: object, key: str, where: str, base: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise _bad(where, key, value, "must be a non-empty path")
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))
