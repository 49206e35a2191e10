"""The `sshd` fixture (testing/sshd.py) really is an OpenSSH server that the sej.hub tests can rely on."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from testing.sshd import Sshd, descendants, keygen
from testing.timing import scaled


def test_sftp_lists_and_reads_a_local_file(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_bytes(b"hello over sftp\n")
    with sshd.paramiko_client() as client, client.open_sftp() as sftp:
        assert sftp.listdir(str(tmp_path)) == ["hello.txt"]
        assert sftp.stat(str(tmp_path / "hello.txt")).st_size == 16
        with sftp.open(str(tmp_path / "hello.txt"), "rb") as f:
            assert f.read() == b"hello over sftp\n"


def test_sftp_writes_a_file_that_is_read_locally(sshd: Sshd, tmp_path: Path) -> None:
    data = os.urandom(300_000)  # several SFTP write requests
    with (
        sshd.paramiko_client() as client,
        client.open_sftp() as sftp,
        sftp.open(str(tmp_path / "written.bin"), "wb") as f,
    ):
        f.write(data)
    assert (tmp_path / "written.bin").read_bytes() == data


def test_sftp_posix_rename_replaces_the_target(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "new.tmp").write_bytes(b"new")
    (tmp_path / "final").write_bytes(b"old")
    with sshd.paramiko_client() as client, client.open_sftp() as sftp:
        sftp.posix_rename(str(tmp_path / "new.tmp"), str(tmp_path / "final"))  # plain rename would refuse
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]
    assert (tmp_path / "final").read_bytes() == b"new"


def test_the_known_hosts_file_names_the_servers_real_host_key(sshd: Sshd) -> None:
    assert sshd.known_hosts.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key}\n"
    with sshd.paramiko_client() as client:
        transport = client.get_transport()
        assert transport is not None
        key = transport.get_remote_server_key()
        assert f"{key.get_name()} {key.get_base64()}" == sshd.host_key


def test_a_different_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    other = sshd.other_known_hosts(tmp_path / "known_hosts")
    assert sshd.host_key not in other.read_text()
    with pytest.raises(paramiko.BadHostKeyException):
        sshd.paramiko_client(known_hosts=other)


def test_an_unknown_host_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "known_hosts").write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        sshd.paramiko_client(known_hosts=tmp_path / "known_hosts")


def test_only_public_key_authentication_is_offered(sshd: Sshd) -> None:
    with socket.create_connection((sshd.host, sshd.port), timeout=scaled(10)) as sock:
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=scaled(10))
            with pytest.raises(paramiko.BadAuthenticationType) as e:
                transport.auth_none(sshd.user)
            assert e.value.allowed_types == ["publickey"]  # neither password nor keyboard-interactive
        finally:
            transport.close()


def test_an_unknown_client_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    keygen(tmp_path / "stranger")
    with pytest.raises(paramiko.AuthenticationException):
        sshd.paramiko_client(key_filename=str(tmp_path / "stranger"))


def test_kill_connections_cuts_an_open_sftp_session_and_the_server_keeps_serving(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    client = sshd.paramiko_client()
    try:
        sftp = client.open_sftp()
        sftp.get_channel().settimeout(scaled(10))  # a hang would be a failure, not a stuck test
        f = sftp.open(str(tmp_path / "f"), "rb")
        assert f.read(10) == b"x" * 10
        assert sshd.connections(), "an open connection has its sshd processes"
        killed = sshd.kill_connections()
        assert killed
        assert sshd.connections() == []
        assert sshd.process is not None and sshd.process.poll() is None, "the listener still runs"
        with pytest.raises((EOFError, paramiko.SSHException, OSError)):
            f.seek(50_000)
            f.read(10)
    finally:
        client.close()
    with sshd.paramiko_client() as again, again.open_sftp() as sftp2:
        assert sftp2.stat(str(tmp_path / "f")).st_size == 100_000
    assert "Server listening on 127.0.0.1" in sshd.log


def _alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def test_a_server_stops_by_its_own_pid_with_its_connections(sshd: Sshd) -> None:
    # A second server besides the session's (the fixture already proved sshd is usable here).
    with Sshd() as server:
        assert server.port != sshd.port
        pid, directory = server.pid, server.dir
        client = server.paramiko_client()
        connection = descendants(pid)
        assert connection
    try:
        assert not directory.exists()
        assert not _alive(pid)
        deadline = time.monotonic() + scaled(5)
        while any(_alive(p) for p in connection) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(_alive(p) for p in connection), "connection processes die with the server"
        assert sshd.process is not None and sshd.process.poll() is None, "the other server is untouched"
    finally:
        client.close()


def _pause_under_reconnects(server: Sshd) -> paramiko.SSHClient:
    """Pause `server` while a thread reconnects in a loop, as sej-hub does after a lost connection; the last
    client it got."""
    import threading

    stop = threading.Event()
    live: dict[str, paramiko.SSHClient | None] = {"client": None}

    def reconnect() -> None:
        for _ in range(100_000):  # bounded; ends when told
            if stop.is_set():
                return
            c = live["client"]
            t = c.get_transport() if c is not None else None
            if t is not None and t.is_active():
                time.sleep(0.0005)
                continue
            try:
                live["client"] = server.paramiko_client()
            except (paramiko.SSHException, OSError, EOFError):
                time.sleep(0.001)

    thread = threading.Thread(target=reconnect, daemon=True)
    thread.start()
    deadline = time.monotonic() + scaled(10)
    while live["client"] is None and time.monotonic() < deadline:  # connected once, then pause
        time.sleep(0.01)
    server.pause()
    stop.set()
    thread.join(scaled(30))
    c = live["client"]
    assert c is not None
    return c


def test_pause_leaves_no_session_to_a_client_that_reconnects_at_once() -> None:
    """No session outlives pause(): the listener accepts nothing while its children are killed (a reconnecting
    client got one in 9 of 10 pauses when the listener was stopped after them)."""
    for _ in range(5):
        with Sshd() as server:
            client = _pause_under_reconnects(server)
            try:
                with pytest.raises((EOFError, paramiko.SSHException, OSError)):
                    client.open_sftp().listdir("/")
            finally:
                client.close()


def test_throughput_sftp_versus_scp(sshd: Sshd, tmp_path: Path) -> None:
    """Measures (does not assert) a 64 MiB download: paramiko SFTP read methods against OpenSSH scp.

    scp runs as a new process, so its time includes starting ssh and the handshake; "scp connect" is
    the same for a 1-byte file. OpenSSH 9 scp speaks the SFTP protocol by default.
    """
    size = 64 << 20
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(size))
    results: dict[str, float] = {}

    def scp(source: Path, dest: Path) -> None:
        subprocess.run(
            ["scp", "-q", "-P", str(sshd.port), *sshd.ssh_options(), f"{sshd.user}@{sshd.host}:{source}", str(dest)],
            check=True,
            timeout=scaled(120),
        )

    def timed(name: str, dest: Path, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        fn()
        results[name] = time.perf_counter() - t0
        assert dest.stat().st_size == size
        dest.unlink()

    with sshd.paramiko_client() as client, client.open_sftp() as sftp:
        dest = tmp_path / "dest.bin"

        def prefetch() -> None:
            with sftp.open(str(src), "rb") as f, open(dest, "wb") as out:
                f.prefetch(size)
                for _ in range(size):  # bounded: at least 1 byte per read until EOF
                    block = f.read(1 << 20)
                    if not block:
                        break
                    out.write(block)

        def readv() -> None:
            chunks = [(o, min(1 << 20, size - o)) for o in range(0, size, 1 << 20)]
            with sftp.open(str(src), "rb") as f, open(dest, "wb") as out:
                for block in f.readv(chunks):
                    out.write(block)

        def getfo() -> None:
            with open(dest, "wb") as out:
                sftp.getfo(str(src), out)

        timed("paramiko prefetch", dest, prefetch)
        timed("paramiko readv", dest, readv)
        timed("paramiko getfo", dest, getfo)
    timed("scp", dest, lambda: scp(src, dest))
    (tmp_path / "one").write_bytes(b"1")
    t0 = time.perf_counter()
    scp(tmp_path / "one", tmp_path / "one.copy")
    connect = time.perf_counter() - t0

    lines = [f"{name:18s} {dt:6.3f} s {size / dt / 1e6:7.1f} MB/s" for name, dt in results.items()]
    print("\n64 MiB download over 127.0.0.1:\n" + "\n".join(lines) + f"\nscp connect (1 byte) {connect:6.3f} s")
    best = min(dt for name, dt in results.items() if name.startswith("paramiko"))
    print(f"best paramiko / scp speed: {results['scp'] / best:.2f}x (target 0.7x)")
