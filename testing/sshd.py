"""A real OpenSSH sshd on 127.0.0.1 for the tests and the benchmark (a helper module, not a test file).

    with Sshd() as server:
        client = server.paramiko_client()
        sftp = client.open_sftp()
        ...
        server.kill_connections()   # cut every open SSH connection; the listener keeps running

Everything lives in a fresh temporary directory: a host key, a client key pair, authorized_keys,
known_hosts (``[127.0.0.1]:PORT <host key>``, the form OpenSSH and paramiko use for ports other than 22),
sshd_config and sshd's log. The server only accepts public-key authentication with the client key, for
the current user (``getpass.getuser()``). It runs on this machine, so the SFTP view is the real filesystem:
use absolute paths (tmp_path works).

The listener is started as a child of the calling process and is stopped by its own pid (never by name).
The per-connection sshd processes are its descendants; they are found by scanning /proc.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .timing import scaled

if TYPE_CHECKING:
    import paramiko

SSHD = "/usr/sbin/sshd"
HOST = "127.0.0.1"

# Deadlines only (every wait ends as soon as its event happens), scaled for loaded machines (testing/timing.py).
START_TIMEOUT = scaled(10.0)  # seconds until sshd must answer with its SSH banner
STOP_TIMEOUT = scaled(5.0)  # seconds between SIGTERM and SIGKILL, and for killed connections to be reaped
CLIENT_TIMEOUT = scaled(10.0)  # paramiko_client's connect, banner and authentication timeouts
PORT_ATTEMPTS = 5  # start attempts, each with a fresh port (another process may grab the port first)


class SshdError(RuntimeError):
    """sshd could not be set up or started; the message includes sshd's log."""


def sshd_available() -> str | None:
    """None if an sshd can be started here, else the reason why not."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (apt-get install openssh-server)"
    for tool in ("ssh-keygen",):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install openssh-client)"
    return None


def keygen(path: Path, comment: str = "sej-test") -> str:
    """Create a fresh ed25519 key pair at `path` (+ .pub); return the public key as 'ssh-ed25519 AAAA...'."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=scaled(30),
    )
    kind, blob = path.with_name(path.name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _ppids() -> dict[int, int]:
    """pid -> parent pid for every process visible in /proc."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the process went away meanwhile
            continue
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 2 and fields[0] != b"Z":  # a zombie is dead already (its parent has not reaped it)
            out[int(entry)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """All living descendants of `pid` (children first, then grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppids().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo and len(found) < 100_000:
        p = todo.pop(0)
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def pdeathsig_prefix() -> list[str]:
    """`setpriv --pdeathsig TERM`, so that sshd dies if the test process is killed without cleaning up.

    The parent-death signal fires when the *thread* that forked the child ends, so it is only used from
    the main thread (a fixture started from a worker thread would otherwise lose its sshd early).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


class Sshd:
    """A running sshd on 127.0.0.1:`port` that accepts `user` with the key `identity`.

    Attributes: host, port, user, identity (client private key path; identity + ".pub" is the public key),
    known_hosts (path), host_key ('ssh-ed25519 AAAA...'), host_key_path, dir (the temporary directory),
    config (sshd_config path), log_path, pid (the listener's pid), process (its Popen).
    """

    host = HOST

    def __init__(self, *, extra_config: str = "") -> None:
        self.extra_config = extra_config
        self.user = getpass.getuser()
        self.dir = Path(tempfile.mkdtemp(prefix="sej-sshd-"))
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        self.identity = self.dir / "id_ed25519"
        self.authorized_keys = self.dir / "authorized_keys"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "sshd_config"
        self.log_path = self.dir / "sshd.log"
        self.pid_file = self.dir / "sshd.pid"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._others = 0
        try:
            self.host_key = keygen(self.host_key_path, "sej-test-host")
            self.client_key = keygen(self.identity, "sej-test-client")
            self.authorized_keys.write_text(self.client_key + "\n")
            self._start()
        except BaseException:
            self.stop()
            raise

    # -- life cycle ------------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.process is not None, "sshd is not running"
        return self.process.pid

    def _write_config(self) -> None:
        lines = [
            f"ListenAddress {HOST}",
            f"Port {self.port}",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            "StrictModes no",
            "Subsystem sftp internal-sftp",
            f"PidFile {self.pid_file}",
            "LogLevel VERBOSE",
            "MaxSessions 64",
            "MaxStartups 64",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            self.extra_config,
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def _start(self) -> None:
        try:
            os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory (as root)
        except PermissionError:
            pass  # not root: sshd runs without privilege separation and does not need it
        errors: list[str] = []
        for _ in range(PORT_ATTEMPTS):
            self.port = free_port()
            self._write_config()
            self.known_hosts.write_text(f"[{HOST}]:{self.port} {self.host_key}\n")
            self._launch("wb")
            if self._wait_ready():
                return
            log_text = self.log
            code = self.process.poll() if self.process else None
            self._stop_process()
            status = "no SSH banner in time" if code is None else f"exit code {code}"
            errors.append(f"port {self.port} ({status}):\n{log_text}")
            if "Address already in use" not in log_text and "Cannot bind any address" not in log_text:
                break  # not a port race: retrying will not help
        raise SshdError("sshd did not start; its log:\n" + "\n".join(errors))

    def _launch(self, log_mode: str) -> None:
        """Start the listener with the current config, its output to the log (truncated, or appended to)."""
        with open(self.log_path, log_mode) as log:
            self.process = subprocess.Popen(
                [*pdeathsig_prefix(), SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_ready(self) -> bool:
        """True once sshd (our process, still alive) answers on the port with an SSH banner."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                with socket.create_connection((HOST, self.port), timeout=scaled(1)) as s:
                    s.settimeout(scaled(2))
                    banner = s.recv(64)
                # Our sshd (alive, and it says it listens on this port) answers: not some other process.
                listening = f"Server listening on {HOST} port {self.port}." in self.log
                if banner.startswith(b"SSH-2.0-") and listening and self.process.poll() is None:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _stop_process(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            # The listener is stopped first, so that it accepts no connection while its children are killed: a
            # client reconnecting in between got a session that outlived the listener, reparented away from it
            # where it cannot be found (sej-hub's copies then went on through a "paused" sshd).
            try:
                os.kill(proc.pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            self._kill_descendants(proc.pid)
            proc.kill()  # also a stopped process
            proc.wait(STOP_TIMEOUT)

    def pause(self) -> None:
        """Kill every connection and stop the listener, keeping the port, keys and config: the producer is down."""
        self._stop_process()

    def resume(self) -> None:
        """Start the listener again on the same port (after pause): the producer is back."""
        assert self.process is None, "sshd is running"
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # the port was ours a moment ago; another process may take it meanwhile: then fail
            self._launch("ab")
            if self._wait_ready():
                return
            self._stop_process()
            if time.monotonic() > deadline:
                raise SshdError(f"sshd did not start again on port {self.port}; its log:\n{self.log}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill every connection, stop the listener (SIGTERM, then SIGKILL) and remove the directory."""
        try:
            self._stop_process()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Sshd:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- for tests -------------------------------------------------------------------------------------

    @property
    def log(self) -> str:
        """sshd's log so far (LogLevel VERBOSE)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @staticmethod
    def _kill_descendants(pid: int) -> list[int]:
        killed: list[int] = []
        for _ in range(10):  # a monitor may fork its session child while we kill: look again, bounded
            pids = descendants(pid)
            if not pids:
                break
            for p in reversed(pids):  # the deepest first: each parent can reap its killed child
                try:
                    os.kill(p, signal.SIGKILL)
                    killed.append(p)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return killed

    def kill_connections(self) -> list[int]:
        """SIGKILL every per-connection sshd process (all descendants of the listener); return their pids.

        The listener keeps running, so new connections still work. Clients see their connection drop.
        """
        killed = self._kill_descendants(self.pid)
        # The listener reaps its children; wait (bounded) until the killed ones are gone so tests see a clean
        # state. Only those: a client may already have connected again.
        deadline = time.monotonic() + STOP_TIMEOUT
        while set(killed) & set(descendants(self.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        return killed

    def connections(self) -> list[int]:
        """The pids of the per-connection sshd processes (descendants of the listener)."""
        return descendants(self.pid)

    def other_known_hosts(self, path: str | os.PathLike[str]) -> Path:
        """Write at `path` a known_hosts naming this host:port with a *different*, fresh host key."""
        self._others += 1
        other = keygen(self.dir / f"other_host_key_{self._others}", "sej-test-other-host")
        assert other != self.host_key
        out = Path(path)
        out.write_text(f"[{HOST}]:{self.port} {other}\n")
        return out

    def ssh_options(self) -> list[str]:
        """OpenSSH client options (ssh, scp, sftp) for this server, except the port flag (-p or -P)."""
        return [
            "-i",
            str(self.identity),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "PasswordAuthentication=no",
        ]

    def paramiko_client(
        self, *, known_hosts: str | os.PathLike[str] | None = None, timeout: float = CLIENT_TIMEOUT, **kw: Any
    ) -> paramiko.SSHClient:
        """A connected paramiko.SSHClient: host keys from `known_hosts` (default: ours) with RejectPolicy."""
        import paramiko

        client = paramiko.SSHClient()
        try:
            client.load_host_keys(str(self.known_hosts if known_hosts is None else known_hosts))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            args: dict[str, Any] = dict(
                hostname=HOST,
                port=self.port,
                username=self.user,
                key_filename=str(self.identity),
                look_for_keys=False,
                allow_agent=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
            args.update(kw)
            client.connect(**args)
        except BaseException:
            client.close()
            raise
        return client

    def __repr__(self) -> str:
        return f"Sshd({self.user}@{HOST}:{self.port}, pid={self.process.pid if self.process else None})"
