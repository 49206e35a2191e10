"""The serve transport over a real sshd: `sej serve` on the "producer" (this machine, through sshd's exec channel),
copies byte-identical and exactly once under kills, passes in a constant number of round trips, SFTP as fallback,
and a key pinned to `sej serve --restrict` in authorized_keys."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sej
from sej.errors import UnsafeFileError
from sej.hub import copy_all
from sej.hub.copy_state import CopyState
from sej.hub.location import Origin, open_sources
from sej.hub.serve_source import Connection, ServeSource, ServeUnavailable, open_connection, serve_sources
from sej.hub.sftp_source import SftpSource
from sej.offset import read_offset_file
from testing.sshd import keygen
from testing.timing import scaled, wait_until

from .conftest import REPO, popen_python, soak_rounds
from .test_hub_copy import (
    assert_identical,
    assert_prefix_and_no_commit_ahead,
    produce,
    soak_start,
    start_producer,
    stop_producer,
)
from .test_hub_ssh import connect_to, endpoint

SERVE = f"env PYTHONPATH={REPO} {sys.executable} -m sej.apps.cli"
"""serve_command for the tests: the sej of this checkout, on the same machine as the "producer"."""


def serve_copy(sshd, src: str, hub: str, workers: int = 4, **kw):  # type: ignore[no-untyped-def]
    client = connect_to(sshd)
    try:
        return copy_all(serve_sources(client, src, "test", command=SERVE), hub, "c1", "hub", workers=workers, **kw)
    finally:
        client.close()


def serve_pids(root: str) -> list[int]:
    """The `sej serve ROOT` processes running now (the remote side of the tests' connections)."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and root.encode() in argv and b"sej.apps.cli" in argv:
            pids.append(int(p))
    return pids


def test_a_copy_over_serve_is_byte_identical_and_commits_the_hub_offset(sshd, tmp_path) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 3000, segment_size=5000)
    out = serve_copy(sshd, src, hub)
    assert len(out) == 4 and all(o.error is None for o in out), [o.error for o in out]
    assert_identical(src, hub)
    for o in out:
        assert o.result is not None and o.result.messages > 0
        assert read_offset_file(os.path.join(src, o.journal, "ofs", "hub.ofs")) == o.result.next_offset
    # Checksums were checked on the way: the hub wrote its own.
    assert all(f.endswith(".sum") or f.endswith(".idx") for d in os.listdir(hub) for f in os.listdir(f"{hub}/{d}/idx"))
    # A second pass copies nothing and leaves the offsets as they are.
    again = serve_copy(sshd, src, hub)
    assert sum(o.result.messages for o in again if o.result) == 0


def _count_round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the batches of calls sent (each one round trip, however many calls it holds)."""
    sent = [0]
    real = Connection.call_many

    def counted(self, calls):  # type: ignore[no-untyped-def]
        sent[0] += 1
        return real(self, calls)

    monkeypatch.setattr(Connection, "call_many", counted)
    return sent


def test_a_pass_costs_the_same_round_trips_whatever_the_number_of_journals(sshd, tmp_path, monkeypatch) -> None:
    """2 journals or 32: the same number of batches of calls (round trips) in an initial, an incremental and an idle
    pass, each batch holding the calls of every journal."""
    sent = _count_round_trips(monkeypatch)
    counts = {}
    client = connect_to(sshd)
    try:
        for bit in (1, 5):
            src, hub = str(tmp_path / f"src{bit}"), str(tmp_path / f"hub{bit}")
            with sej.ShardedWriter(src, "p", shard_bit=bit, segment_size=1 << 20) as w:
                for i in range(200):
                    w.append(b"v%d" % i, key=b"k%d" % i)
            make = serve_sources(client, src, "test", command=SERVE)
            state = CopyState()
            got = []
            for k in range(3):
                sent[0] = 0
                out = copy_all(make, hub, "c1", "hub", workers=1, state=state)
                assert len(out) == 1 << bit and all(o.error is None for o in out)
                got.append(sent[0])
                if k == 0:  # a message more in every journal for the incremental pass
                    for j in os.listdir(src):
                        with sej.Writer(os.path.join(src, j), segment_size=1 << 20) as w:
                            w.append(b"more")
            assert_identical(src, hub)
            counts[1 << bit] = got
    finally:
        client.close()
    print("batches of calls per pass (initial, incremental, idle):", counts)
    assert counts[2] == counts[32], counts
    initial, incremental, idle = counts[32]
    assert initial <= 5 and incremental <= 6 and idle <= 2, counts


def test_transport_auto_falls_back_to_sftp_when_sej_serve_is_missing(sshd, tmp_path, caplog) -> None:
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    ep = endpoint(sshd)
    origin = Origin(src, "127.0.0.1", sshd.port, sshd.user, str(sshd.identity), str(sshd.known_hosts),
                    transport="auto", serve_command=str(tmp_path / "no-such-sej"))  # fmt: skip
    assert ep.port == sshd.port
    with caplog.at_level(logging.WARNING, logger="sej.hub"), open_sources(origin) as sources:
        src_obj = sources()
        assert isinstance(src_obj, SftpSource)
        out = copy_all(sources, hub, "c1", "hub")
    assert all(o.error is None for o in out)
    assert_identical(src, hub)
    lines = [r.getMessage() for r in caplog.records if "sej serve is not available" in r.getMessage()]
    print(lines)
    assert len(lines) == 1, lines
    assert "no-such-sej" in lines[0] and "127" in lines[0], lines[0]  # what ran, and the shell's exit status
    # transport = "serve" does not fall back: it says why.
    with pytest.raises(ServeUnavailable, match="no-such-sej"):
        open_sources(Origin(src, "127.0.0.1", sshd.port, sshd.user, str(sshd.identity), str(sshd.known_hosts),
                            transport="serve", serve_command=str(tmp_path / "no-such-sej")))  # fmt: skip
    # An old sej (no serve command): its usage error, then an exit, is not a hello either.
    with pytest.raises(ServeUnavailable, match="without a hello"):
        open_sources(Origin(src, "127.0.0.1", sshd.port, sshd.user, str(sshd.identity), str(sshd.known_hosts),
                            transport="serve", serve_command=f"{SERVE} no-such-command"))  # fmt: skip


def extra_key(sshd, tmp_path: Path, options: str) -> Path:  # type: ignore[no-untyped-def]
    """A new key pair whose public key is in the sshd's authorized_keys with `options`; removed by the caller."""
    identity = tmp_path / f"key{random.randrange(1 << 30)}"
    public = keygen(identity, "sej-test-restricted")
    with open(sshd.authorized_keys, "a") as f:
        f.write(f"{options} {public}\n")
    return identity


@pytest.fixture
def restore_authorized_keys(sshd):  # type: ignore[no-untyped-def]
    before = Path(sshd.authorized_keys).read_text()
    yield
    Path(sshd.authorized_keys).write_text(before)


def test_a_producer_with_only_sftp_for_the_hub_falls_back(sshd, tmp_path, caplog, restore_authorized_keys) -> None:
    """The SFTP-only key of docs/hub.md (a Go producer's): exec runs the sftp-server, which is not sej serve."""
    src, hub = str(tmp_path / "src"), str(tmp_path / "hub")
    produce(src, 300)
    key = extra_key(sshd, tmp_path, 'restrict,command="internal-sftp"')
    origin = Origin(src, "127.0.0.1", sshd.port, sshd.user, str(key), str(sshd.known_hosts), serve_command=SERVE)
    t = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="sej.hub"), open_sources(origin) as sources:
        assert time.monotonic() - t < scaled(10), "the fallback does not wait for a timeout"
        out = copy_all(sources, hub, "c1", "hub")
    assert all(o.error is None for o in out)
    assert_identical(src, hub)
    assert [r for r in caplog.records if "sej serve is not available" in r.getMessage()]


def test_a_key_pinned_to_sej_serve_restrict_reads_only_its_root_and_writes_only_its_offsets(
    sshd, tmp_path, restore_authorized_keys
) -> None:
    """authorized_keys: command="sej serve --restrict ROOT",restrict. Copying works; nothing else does."""
    root = tmp_path / "app"
    produce(str(root), 300)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the hub")
    (tmp_path / "other").mkdir()
    produce(str(tmp_path / "other" / "elsewhere"), 50)  # a journal root outside ROOT
    key = extra_key(sshd, tmp_path, f'command="{SERVE} serve --restrict {root}",restrict')
    ep = endpoint(sshd)._replace(identity=[str(key)])
    from sej.hub.ssh import connect

    client = connect(ep, timeout=scaled(15))
    try:
        # The hub's own root: copied, offsets committed.
        make = serve_sources(client, str(root), "restricted", command="anything: the key's command runs")
        out = copy_all(make, str(tmp_path / "hub"), "c1", "hub")
        assert out and all(o.error is None for o in out), [o.error for o in out]
        assert_identical(str(root), str(tmp_path / "hub"))
        transport = client.get_transport()
        assert transport is not None
        # Another root: refused at the hello.
        with pytest.raises(ServeUnavailable, match="may read .* only"):
            open_connection(transport, str(tmp_path / "other"), "restricted")
        conn = open_connection(transport, str(root), "restricted")
        src = ServeSource(conn, "restricted")
        journal = src.journals()[0]
        # No path outside the root: names that climb out are refused on both ends.
        for bad in ("..", "../other", "/etc", "p.2.000/../../secret.txt"):
            (got,) = conn.call_many([("segments", bad)])
            assert isinstance(got, sej.InvalidArgumentError) and repr(bad) in str(got), (bad, got)
        # No other reader's offset, and nothing but the offset file.
        (refused,) = conn.call_many([("commit_offset", journal, "billing", 1, False)])
        assert isinstance(refused, sej.SejError) and "may commit the reader hub only" in str(refused)
        assert not os.path.exists(root / journal / "ofs" / "billing.ofs")
        # A symlink to a file outside the root is not followed.
        os.symlink(secret, root / journal / "jnl" / ("f" * 16 + ".jnl"))
        (got,) = conn.call_many([("read", journal, "f" * 16 + ".jnl", 0, 100)])
        assert isinstance(got, sej.UnsafeFileError), got
        conn.close()
        # A shell command, or SFTP, gets sej serve instead: nothing runs, nothing is read.
        marker = tmp_path / "ran"
        ch = transport.open_session(timeout=scaled(15))
        ch.settimeout(scaled(15))
        ch.exec_command(f"cat {secret}; touch {marker}")
        ch.sendall(b"\0\0\0\x05hello")  # not a hello: sej serve ends the stream
        got_bytes = b"".join(iter(lambda: ch.recv(65536), b""))
        assert b"not for the hub" not in got_bytes and got_bytes.startswith(b"SEJSERV")
        assert ch.recv_exit_status() != 0
        assert not marker.exists()
        import paramiko

        with pytest.raises((paramiko.SSHException, paramiko.sftp.SFTPError, EOFError, OSError)):
            sftp = paramiko.SFTPClient.from_transport(transport)
            assert sftp is not None
            sftp.get_channel().settimeout(scaled(15))
            sftp.open(str(secret)).read()
    finally:
        client.close()
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}
    assert all("ofs" not in p.parts or p.name.startswith("hub.") for p in before), "only the hub's offsets written"


SERVE_COPIER = r"""
import sys
from sej.hub import copy_all
from sej.hub.ssh import connect, resolve
from sej.hub.serve_source import serve_sources
import sej.hub.copy as c
port, user, identity, known, src, hub, chunk, timeout, command = sys.argv[1:10]
c.CHUNK = int(chunk)
client = connect(resolve("127.0.0.1", int(port), user, identity, known, ssh_config="/dev/null"), timeout=float(timeout))
make = serve_sources(client, src, "copier", command=command)
print("connected", flush=True)
for _ in range(100000):
    copy_all(make, hub, "c1", "hub", workers=2)
"""


def test_hub_and_sej_serve_killed_at_random_moments(sshd, tmp_path, keep_on_failure) -> None:
    """Even rounds SIGKILL the hub process (mid-copy, mid-commit), odd rounds SIGKILL `sej serve` under a copy.

    CI: up to 20 rounds within 60 s; SEJ_SOAK_ROUNDS=N: N rounds, however long they take.
    """
    seed, rng, src, hub = soak_start(tmp_path, keep_on_failure)
    soak = soak_rounds()
    producer = start_producer(src, seed)
    kills = serve_kills = 0
    try:
        deadline = float("inf") if soak else time.monotonic() + scaled(60)
        for round_ in range(soak or 20):
            if time.monotonic() > deadline:
                break
            chunk = str(rng.choice([500, 4096, 1 << 16]))
            if round_ % 2 == 0:  # the hub dies
                args = (str(sshd.port), sshd.user, str(sshd.identity), str(sshd.known_hosts), src, hub, chunk,
                        str(scaled(15)), SERVE)  # fmt: skip
                copier = popen_python(SERVE_COPIER, *args, stdout=subprocess.PIPE)
                assert copier.stdout is not None
                assert copier.stdout.readline().strip() == "connected"
                time.sleep(rng.uniform(0.0, 0.3))  # a random moment of its passes (not synchronisation)
                copier.send_signal(signal.SIGKILL)
                assert copier.wait(scaled(10)) == -signal.SIGKILL
                kills += 1
            else:  # sej serve dies under a copy in this process
                client = connect_to(sshd)
                errors: list[object] = []
                make = serve_sources(client, src, "t", command=SERVE)
                pids = serve_pids(src)
                assert pids

                killed = threading.Event()
                first = make.conn

                def run(make=make, errors=errors, killed=killed, first=first) -> None:  # type: ignore[no-untyped-def]
                    # Until a pass fails on the dead server, or one after the kill succeeds on a new one: a kill
                    # between passes is seen by the connection's reader (EOF) and the next pass starts another
                    # sej serve, with no error to report. Bounded in passes and in time after the kill.
                    after = float("inf")
                    try:
                        for _ in range(1_000_000):
                            out = copy_all(make, hub, "c1", "hub", workers=2)
                            errors.extend(o.error for o in out if o.error is not None)
                            if errors or (killed.is_set() and make.conn is not first):
                                return
                            if killed.is_set():
                                after = min(after, time.monotonic() + scaled(20))
                                if time.monotonic() > after:
                                    return
                    except sej.SejError as e:
                        errors.append(e)

                t = threading.Thread(target=run)
                t.start()
                time.sleep(rng.uniform(0.02, 0.3))  # a random moment (not synchronisation)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                killed.set()
                t.join(scaled(40))
                assert not t.is_alive()
                assert first.failed is not None, "the server's death is noticed"
                assert errors or make.conn is not first, "a pass under way fails, or the next runs on a new sej serve"
                # The next source asked for starts a new sej serve, and copies.
                out = copy_all(make, hub, "c1", "hub", workers=2)
                assert all(o.error is None for o in out), [o.error for o in out]
                client.close()
                serve_kills += 1
            assert_prefix_and_no_commit_ahead(src, hub)
        written = stop_producer(producer)
    finally:
        producer.kill()
    wait_until(lambda: not serve_pids(src), scaled(10), "every sej serve ends with its connection")
    out = serve_copy(sshd, src, hub)
    assert all(o.error is None for o in out), [o.error for o in out]
    assert kills >= 3 and serve_kills >= 3
    assert_identical(src, hub)
    total = 0
    for o in out:
        assert o.result is not None
        with sej.Scanner(o.result.destination, 0, timeout=0) as s:
            offsets = [m.offset for m in s]
        assert offsets == list(range(o.result.next_offset)), "no gap, no duplicate"
        assert read_offset_file(os.path.join(src, o.journal, "ofs", "hub.ofs")) == o.result.next_offset
        total += len(offsets)
    assert total == written, (total, written)


def test_sej_copy_over_serve_and_its_transport_option(sshd, tmp_path) -> None:
    src = str(tmp_path / "src")
    produce(src, 500)
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}"
    keys = ["--identity", str(sshd.identity), "--known-hosts", str(sshd.known_hosts)]
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))

    def sej_copy(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sej.apps.cli", "copy", *args], capture_output=True, text=True,
                              env=env, timeout=scaled(120))  # fmt: skip

    got = sej_copy(url, str(tmp_path / "hub"), *keys, "--transport", "serve", "--serve-command", SERVE)
    assert got.returncode == 0, got.stderr
    assert_identical(src, str(tmp_path / "hub"), "127-0-0-1")
    missing = sej_copy(url, str(tmp_path / "hub2"), *keys, "--transport", "serve", "--serve-command", "/no/sej")
    assert missing.returncode == 1 and "/no/sej" in missing.stderr and "Traceback" not in missing.stderr
    auto = sej_copy(url, str(tmp_path / "hub3"), *keys, "--serve-command", "/no/sej")
    assert auto.returncode == 0, auto.stderr
    assert_identical(src, str(tmp_path / "hub3"), "127-0-0-1")


def test_the_daemon_learns_of_appends_by_push_not_one_poll_later(sshd, tmp_path) -> None:
    """poll_interval 60 s: an append reaches the hub within seconds, because sej serve pushes it."""
    from sej.hub.config import loads_config
    from sej.hub.daemon import Hub

    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 100)
    journal = sorted(os.listdir(src))[0]
    config = loads_config(
        f'hub_root = "{hub}"\npoll_interval = 60\ncommit_interval = 0\n[[client]]\nclient_id = "c1"\n'
        f'host = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\nidentity_file = "{sshd.identity}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nremote_root = "{src}"\ntransport = "serve"\n'
        f'serve_command = "{SERVE}"\n'
    )
    stop = threading.Event()
    with Hub(config, records=False) as h:
        t = threading.Thread(target=h.run_forever, args=(stop,), daemon=True)
        t.start()
        try:
            wait_until(lambda: os.path.isdir(hub / f"c1.{journal}") and sej.next_offset(str(hub / f"c1.{journal}"))
                       == sej.next_offset(str(src / journal)), scaled(30), "the first pass")  # fmt: skip
            latencies = []
            for k in range(3):
                with sej.Writer(str(src / journal), durability="flush") as w:
                    w.append(b"pushed %d" % k)
                t0 = time.monotonic()
                want = sej.next_offset(str(src / journal))
                wait_until(lambda want=want: sej.next_offset(str(hub / f"c1.{journal}")) == want, scaled(20),
                           "the append at the hub, long before the next poll")  # fmt: skip
                latencies.append(time.monotonic() - t0)
            print("append to hub by push (s):", [round(x, 3) for x in latencies])
            assert max(latencies) < min(scaled(10), 30), "well before the next poll (60 s)"
        finally:
            stop.set()
            t.join(scaled(30))
    assert not t.is_alive()
    assert_identical(str(src), str(hub))


def test_a_sej_serve_slow_to_start_is_waited_for_not_killed_and_started_again(sshd, tmp_path) -> None:
    """A busy producer (the rehearsal's: its shell's profile and Python's imports on loaded cores) can take more than
    15 s to answer the hello. The hub waits for it as for any call (IO_TIMEOUT), instead of giving up at 15 s, killing
    it, and starting another that is no faster: over `transport = "serve"` that client was never served."""
    src = str(tmp_path / "src")
    produce(src, 50)
    slow = tmp_path / "slow-sej"
    slow.write_text(f"#!/bin/sh\nsleep 17\nexec {SERVE} \"$@\"\n")  # the start's delay under test, not a sync
    slow.chmod(0o755)
    url = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{src}"
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    got = subprocess.run([sys.executable, "-m", "sej.apps.cli", "copy", url, str(tmp_path / "hub"), "--identity",
                          str(sshd.identity), "--known-hosts", str(sshd.known_hosts), "--transport", "serve",
                          "--serve-command", str(slow)], capture_output=True, text=True, env=env,
                         timeout=scaled(180))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert_identical(src, str(tmp_path / "hub"), "127-0-0-1")


def test_the_daemon_does_not_wait_for_its_commits_and_makes_a_failed_one_again(sshd, tmp_path, caplog) -> None:
    """run_forever over sej serve sends its commits without waiting for the producer's fsyncs: the pass goes on. One
    that fails (ofs/hub.ofs is a directory: the rename onto it fails) is logged by the next pass, which forgets that
    offset, so a pass commits the journal again once it can; on stop, the commits under way are waited for."""
    from sej.hub.config import loads_config
    from sej.hub.daemon import Hub

    src, hub = tmp_path / "src", tmp_path / "hub"
    produce(str(src), 200)
    journals = sorted(os.listdir(src))
    bad = journals[0]
    config = loads_config(
        f'hub_root = "{hub}"\npoll_interval = 0.1\ncommit_interval = 0\n[[client]]\nclient_id = "c1"\n'
        f'host = "127.0.0.1"\nport = {sshd.port}\nuser = "{sshd.user}"\nidentity_file = "{sshd.identity}"\n'
        f'known_hosts = "{sshd.known_hosts}"\nremote_root = "{src}"\ntransport = "serve"\n'
        f'serve_command = "{SERVE}"\n'
    )

    def committed(j: str) -> int | None:
        try:
            return read_offset_file(str(src / j / "ofs" / "hub.ofs"))
        except (FileNotFoundError, UnsafeFileError):  # none yet, or the directory in its way
            return None

    def at_hub(j: str) -> int:
        return sej.next_offset(str(hub / f"c1.{j}")) if os.path.isdir(hub / f"c1.{j}") else -1

    stop = threading.Event()
    caplog.set_level(logging.ERROR, logger="sej.hub")
    with Hub(config, records=False) as h:
        t = threading.Thread(target=h.run_forever, args=(stop,), daemon=True)
        t.start()
        try:
            wait_until(lambda: all(committed(j) == sej.next_offset(str(src / j)) for j in journals), scaled(30),
                       "every journal copied and committed")  # fmt: skip
            os.remove(src / bad / "ofs" / "hub.ofs")
            os.mkdir(src / bad / "ofs" / "hub.ofs")  # the next commit's rename onto it fails
            with sej.Writer(str(src / bad), durability="flush") as w:
                w.append(b"its commit fails")
            want = sej.next_offset(str(src / bad))
            wait_until(lambda: at_hub(bad) == want, scaled(20), "the append at the hub")
            wait_until(lambda: "committing the hub offset" in caplog.text, scaled(20), "the failed commit, logged")
            assert committed(bad) is None
            os.rmdir(src / bad / "ofs" / "hub.ofs")
            wait_until(lambda: committed(bad) == want, scaled(20), "the commit made again by a later pass")
            for j in journals[1:]:
                with sej.Writer(str(src / j), durability="flush") as w:
                    w.append(b"last")
            last = {j: sej.next_offset(str(src / j)) for j in journals}
            wait_until(lambda: all(at_hub(j) == last[j] for j in journals), scaled(20), "the last appends at the hub")
        finally:
            stop.set()
            t.join(scaled(30))
    assert not t.is_alive()
    # The commits sent last were waited for on stop: the producer knows all that was copied.
    assert {j: committed(j) for j in journals} == last
    assert_identical(str(src), str(hub))
