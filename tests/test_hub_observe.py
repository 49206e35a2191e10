"""Operating the hub (issue 16): /metrics and /health of a real sej-hub under faults, `sej hub status`,
JSON logs with the summary on stop, and systemd's notify protocol.

Every sej-hub here is a real process (the installed console script); the SSH client goes through a real
sshd on 127.0.0.1, which is stopped and started again mid-run. Waits are for events (a line, a scrape
that shows what is expected), bounded by scaled deadlines.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sej
from sej.apps.notify import Notifier
from sej.errors import InvalidArgumentError
from sej.hub.config import loads_config
from sej.hub.status import MAX_RECORD, StatusBook, parse_record, read_status
from testing.sshd import Sshd
from testing.timing import scaled

from .test_hub_daemon import HubProcess, env, hub_script, write_config

POLL = 0.2
JOURNALS = ("ev.1.000", "ev.1.001")


def produce(root: Path, n: int, start: int = 0) -> None:
    """n more messages in each of the client's journals (a writer opened and closed per call)."""
    for j in JOURNALS:
        with sej.Writer(str(root / j), segment_size=2048) as w:
            w.append_many([b"m%d" % i for i in range(start, start + n)])


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(name, sorted labels): value}."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=scaled(5)).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        assert m is not None, line
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(got: dict[Any, float], name: str, **labels: str) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def health(address: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=scaled(5)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def eventually(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Call `check` until it returns something true (and return that); fail after scaled(timeout) s."""
    deadline = time.monotonic() + scaled(timeout)
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def json_lines(proc: HubProcess) -> list[dict[str, Any]]:
    """Every stderr line of a sej-hub with log_format = "json", each parsed on its own."""
    return [json.loads(line) for line in proc.lines]


def metrics_address(proc: HubProcess) -> str:
    assert proc.wait_for('"metrics_address"', scaled(30)), proc.lines
    return next(d["metrics_address"] for d in json_lines(proc) if "metrics_address" in d)


def sej_status(hub: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sej.apps.cli", "hub", "status", str(hub), *args],
                          capture_output=True, text=True, timeout=scaled(30), env=env())  # fmt: skip


def test_metrics_health_and_status_of_a_real_hub_through_an_sshd_outage(tmp_path: Path) -> None:
    server = Sshd()
    roots = {c: tmp_path / "src" / c for c in ("here", "there", "remote")}
    hub = tmp_path / "hub"
    max_age = scaled(2)
    proc = None
    try:
        for root in roots.values():
            produce(root, 5)
        clients = [{"client_id": c, "local_root": str(roots[c])} for c in ("here", "there")]
        clients.append({"client_id": "remote", "host": "127.0.0.1", "port": server.port, "user": server.user,
                        "identity_file": str(server.identity), "known_hosts": str(server.known_hosts),
                        "remote_root": str(roots["remote"])})  # fmt: skip
        config = write_config(tmp_path / "hub.toml", hub, clients, poll_interval=POLL, backoff_max=0.5,
                              metrics_listen="127.0.0.1:0", health_max_age=max_age, log_format="json")  # fmt: skip
        proc = HubProcess([hub_script(), "--config", str(config)])
        address = metrics_address(proc)
        produced = {c: 5 for c in roots}

        # A producer appends while the hub copies and the test scrapes.
        def append_rounds() -> None:
            for k in range(10):
                for c, root in roots.items():
                    produce(root, 7, start=produced[c] + 7 * k)

        t = threading.Thread(target=append_rounds)
        t.start()
        scrapes = 0
        while t.is_alive():  # scrapes during the appends: the endpoint answers while copies run
            scrape(address)
            scrapes += 1
        t.join()
        produced = {c: 5 + 70 for c in roots}
        assert scrapes > 0

        def caught_up() -> dict[Any, float] | None:
            got = scrape(address)
            for c, root in roots.items():
                for j in JOURNALS:
                    real = sej.next_offset(str(root / j))
                    assert real == produced[c]
                    if (metric(got, "sej_hub_copied_messages_total", client=c, journal=j) != real
                            or metric(got, "sej_hub_next_offset", client=c, journal=j) != real
                            or metric(got, "sej_hub_lag_messages", client=c, journal=j) != 0
                            or metric(got, "sej_hub_lag_bytes", client=c, journal=j) != 0):  # fmt: skip
                        return None
            return got

        got = eventually(caught_up, 60, "the copied counters to reach the produced totals, and lag 0")
        for c in roots:
            assert metric(got, "sej_hub_connected", client=c) == 1
            assert metric(got, "sej_hub_seconds_since_success", client=c) < max_age  # type: ignore[operator]
            assert metric(got, "sej_hub_pass_duration_seconds_count", client=c) >= 1  # type: ignore[operator]
            for j in JOURNALS:
                size = sum(os.path.getsize(p) for p in (roots[c] / j / "jnl").glob("*.jnl"))
                assert metric(got, "sej_hub_copied_bytes_total", client=c, journal=j) == size
                assert metric(got, "sej_hub_producer_next_offset", client=c, journal=j) == produced[c]
        assert health(address) == (200, {"status": "ok", "max_age": max_age})
        assert metric(got, "sej_hub_health_max_age_seconds") == max_age  # what SejHubNoSuccessfulPass compares with

        # `sej hub status` agrees with the metrics and with the producers' real offsets.
        def status_agrees() -> dict[str, Any] | None:
            r = sej_status(hub, "--json", "--max-lag", "0")
            now = scrape(address)
            doc = json.loads(r.stdout)
            rows = {(x["client"], x["journal"]): x for x in doc["journals"]}
            if r.returncode != 0 or len(rows) != 6:
                return None
            for (c, j), x in rows.items():
                real = sej.next_offset(str(roots[c] / j))
                if not x["hub_next"] == x["producer_next"] == real or x["lag"] != 0 or x["lag_bytes"] != 0:
                    return None
                if metric(now, "sej_hub_next_offset", client=c, journal=j) != x["hub_next"]:
                    return None
            return doc

        doc = eventually(status_agrees, 30, "sej hub status to agree with the metrics and the producers")
        assert {c["client"] for c in doc["clients"]} == set(roots) and doc["problems"] == []
        table = sej_status(hub)
        assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == ["CLIENT", "JOURNAL"]

        # The SSH client's producer goes down: its errors rise, /health turns 503 naming it (and only it).
        errors_before = sum(v for (name, labels), v in got.items()
                            if name == "sej_hub_errors_total" and ("client", "remote") in labels)  # fmt: skip
        server.pause()
        produce(roots["remote"], 3, start=produced["remote"])  # written while the hub cannot reach it
        produced["remote"] += 3

        def remote_errors() -> float:
            now = scrape(address)
            return sum(v for (name, labels), v in now.items()
                       if name == "sej_hub_errors_total" and ("client", "remote") in labels)  # fmt: skip

        eventually(lambda: remote_errors() > errors_before, 60, "the SSH client's error counter to rise")
        # A lost connection makes it 503 at once (`disconnected`); then the client goes stale as well.
        code, body = eventually(lambda: (h := health(address))[0] == 503 and h[1]["stale"] and h, 60,
                                "/health to turn 503 with the client stale")  # fmt: skip
        assert [s["client"] for s in body["stale"]] == ["remote"], body
        assert [d["client"] for d in body.get("disconnected", [])] in ([], ["remote"]), body
        assert body["stale"][0]["seconds_since_success"] > max_age and body["stale"][0]["last_error"]
        got = scrape(address)
        assert metric(got, "sej_hub_connected", client="remote") == 0
        assert metric(got, "sej_hub_connected", client="here") == 1
        r = eventually(lambda: (x := sej_status(hub, "--max-age", str(max_age), "--json")).returncode == 1 and x, 30,
                       "sej hub status --max-age to fail on the stale client")  # fmt: skip
        problems = json.loads(r.stdout)["problems"]
        assert problems and all("client remote" in p for p in problems), problems

        # It comes back: /health is 200 again, and what was written meanwhile arrives.
        server.resume()
        eventually(lambda: health(address)[0] == 200, 60, "/health to be 200 again after sshd restarted")
        eventually(caught_up, 60, "the messages written during the outage to arrive")
        assert eventually(status_agrees, 30, "sej hub status to agree again")

        took = proc.stop(scaled(30))
        assert took is not None and proc.p.returncode == 0, proc.stderr
        docs = json_lines(proc)  # every line is one JSON object
        summaries = {d["client"]: d for d in docs if d.get("summary")}
        assert set(summaries) == set(roots), docs[-10:]
        # The hub's errors name the client (paramiko's records too: tests/test_hub_ssh.py).
        errors = [d for d in docs if d["level"] == "ERROR" and d["logger"].startswith("sej")]
        assert errors and all(d.get("client") == "remote" for d in errors), errors
    finally:
        if proc is not None:
            proc.kill()
        server.stop()


def test_json_logs_and_the_summary_on_a_stop_during_the_poll_wait(tmp_path: Path) -> None:
    root = tmp_path / "src"
    produce(root, 12)
    config = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "a", "local_root": str(root)}],
                          poll_interval=600, log_format="json")  # fmt: skip
    proc = HubProcess([hub_script(), "--config", str(config), "--log-level", "DEBUG"])
    try:
        # The first pass's line (DEBUG): the next pass is 600 s away, so the stop comes during the wait.
        assert proc.wait_for('"client a: copied 24 messages', scaled(30)), proc.lines
        assert proc.stop(scaled(30)) is not None and proc.p.returncode == 0
    finally:
        proc.kill()
    docs = json_lines(proc)
    assert all({"time", "level", "logger", "message"} <= d.keys() for d in docs)
    copied = next(d for d in docs if d["message"].startswith("client a: copied 24"))
    assert copied["client"] == "a" and copied["messages"] == 24 and copied["journals"] == 2 and copied["seconds"] >= 0
    per_journal = [d for d in docs if d.get("journal") in JOURNALS and "hub_next" in d]
    assert sorted(d["journal"] for d in per_journal) == list(JOURNALS)
    # The lag is what the pass found the hub behind by, before copying it: all 12 messages, all their bytes.
    sizes = {j: sum(os.path.getsize(p) for p in (root / j / "jnl").glob("*.jnl")) for j in JOURNALS}
    assert all(d["hub_next"] == d["producer_next"] == d["lag"] == 12 for d in per_journal), per_journal
    assert all(d["lag_bytes"] == sizes[d["journal"]] > 0 for d in per_journal), per_journal
    record = json.loads((tmp_path / "hub" / ".sej-hub" / "a.json").read_text())  # written at the stop
    assert {j: (r["lag"], r["lag_bytes"]) for j, r in record["journals"].items()} == {
        j: (12, sizes[j]) for j in JOURNALS
    }
    (summary,) = [d for d in docs if d.get("summary")]
    assert summary["level"] == "INFO" and summary["client"] == "a" and summary["messages"] == 24
    assert summary["passes"] == 1 and docs.index(summary) < len(docs) - 1
    assert docs[-1]["message"] == "hub stopped"


# -- systemd notify ---------------------------------------------------------------------------------------


class NotifySocket:
    """A datagram socket given to sej-hub as NOTIFY_SOCKET (abstract namespace), as systemd listens."""

    def __init__(self) -> None:
        self.name = f"@sej-test-{secrets.token_hex(8)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.got: list[str] = []

    def receive(self, until: Callable[[list[str]], bool], timeout: float) -> list[str]:
        deadline = time.monotonic() + scaled(timeout)
        while not until(self.got):
            left = deadline - time.monotonic()
            assert left > 0, f"datagrams so far: {self.got}"
            self.sock.settimeout(min(left, 0.5))
            try:
                self.got.append(self.sock.recv(4096).decode())
            except TimeoutError:
                pass
        return self.got

    def close(self) -> None:
        self.sock.close()


def test_sd_notify_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    root = tmp_path / "src"
    produce(root, 3)
    config = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "a", "local_root": str(root)}],
                          poll_interval=POLL)  # fmt: skip
    ns = NotifySocket()
    notify_env = dict(env(), NOTIFY_SOCKET=ns.name, WATCHDOG_USEC="200000")
    p = subprocess.Popen([hub_script(), "--config", str(config)], env=notify_env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        got = ns.receive(lambda g: sum("WATCHDOG=1" in d for d in g) >= 3, 30)
        ready = [i for i, d in enumerate(got) if "READY=1" in d.splitlines()]
        assert len(ready) == 1 and ready[0] < next(i for i, d in enumerate(got) if "WATCHDOG=1" in d), got
        assert any(line.startswith("STATUS=") for line in got[ready[0]].splitlines())
        p.terminate()
        assert p.wait(scaled(30)) == 0
        ns.receive(lambda g: any("STOPPING=1" in d for d in g), 10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        ns.close()


def test_a_config_error_exits_2_before_ready(tmp_path: Path) -> None:
    config = tmp_path / "hub.toml"
    config.write_text('hub_root = "hub"\nmetrics_listen = "nowhere"\n[[client]]\nclient_id = "a"\nlocal_root = "s"\n')
    ns = NotifySocket()
    try:
        r = subprocess.run([hub_script(), "--config", str(config)], env=dict(env(), NOTIFY_SOCKET=ns.name),
                           capture_output=True, text=True, timeout=scaled(30))  # fmt: skip
        assert r.returncode == 2 and "metrics_listen = 'nowhere'" in r.stderr and "Traceback" not in r.stderr
        ns.sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing was sent: the process has exited, no READY=1 came
            ns.sock.recv(4096)
    finally:
        ns.close()


def test_notifier_speaks_the_protocol_and_does_nothing_without_a_socket(tmp_path: Path) -> None:
    assert not Notifier({}).enabled and Notifier({}).send("READY=1") is False
    path = tmp_path / "n.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(scaled(5))
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"})
        assert n.interval == 0.5
        n.ready("up")
        assert s.recv(100) == b"READY=1\nSTATUS=up"
        n.ping(alive=False)  # a hub that is not alive sends no WATCHDOG=1: systemd restarts it
        n.ping()
        n.ping()  # not due again yet
        n.stopping()
        assert s.recv(100) == b"WATCHDOG=1" and s.recv(100) == b"STOPPING=1"
    other_pid = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other_pid.interval is None  # the watchdog is another process's
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).send("READY=1") is False


# -- configuration -----------------------------------------------------------------------------------------


BASE = 'hub_root = "/h"\n{}\n[[client]]\nclient_id = "a"\nlocal_root = "/s"\n'


def test_config_of_metrics_health_and_logs() -> None:
    c = loads_config(BASE.format(""))
    assert c.metrics_listen is None and c.log_format == "text" and c.health_age == 30.0
    assert loads_config(BASE.format("poll_interval = 10")).health_age == 100.0  # 10 poll intervals
    c = loads_config(BASE.format('metrics_listen = "[::1]:9108"\nhealth_max_age = 5\nlog_format = "json"'))
    assert c.metrics_listen == ("::1", 9108) and c.health_age == 5.0 and c.log_format == "json"
    for bad, says in [('metrics_listen = "127.0.0.1"', "metrics_listen = '127.0.0.1'"),
                      ('metrics_listen = "h:99999"', "metrics_listen = 'h:99999'"),
                      ("metrics_listen = 9108", "metrics_listen = 9108"),
                      ('log_format = "xml"', "log_format = 'xml'"),
                      ("health_max_age = 0", "health_max_age = 0")]:  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=re.escape(says)):
            loads_config(BASE.format(bad))


# -- the records and `sej hub status` on hostile input -------------------------------------------------------


def test_status_records_are_read_as_hostile_input(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    src = tmp_path / "src"
    produce(src, 4)
    book = StatusBook(str(hub), [("a", str(src)), ("b", "elsewhere")])
    from sej.hub.status import JournalPass

    book.record("a", [JournalPass(j, 4, 6, 2, 40, 4, 100) for j in JOURNALS], 0.01)
    book.record("b", [], 0.01, ("connection", "refused"))
    book.write()
    for j in JOURNALS:  # the hub's copies, as a pass would have left them (4 of the producer's 6)
        with sej.Writer(str(hub / f"a.{j}")) as w:
            w.append_many([b"m%d" % i for i in range(4)])
    st_ = read_status(str(hub))
    assert st_.problems == [] and sorted(st_.records) == ["a", "b"]
    assert [(r.client_id, r.journal, r.hub_next, r.producer_next, r.lag, r.lag_bytes) for r in st_.rows] == [
        ("a", j, 4, 6, 2, 40) for j in JOURNALS
    ]
    r = sej_status(hub, "--max-lag", "1")
    assert r.returncode == 1 and "lag 2 (--max-lag 1)" in r.stderr and "client b: refused" in r.stderr
    assert sej_status(hub, "--client", "a", "--max-lag", "2").returncode == 0
    assert sej_status(hub, "--client", "nobody").returncode == 2

    records = hub / ".sej-hub"
    (records / "b.json").unlink()
    os.symlink(records / "a.json", records / "c.json")  # a link: never followed
    (records / "d.json").write_text('{"version": 1, "client_id": "d", "journals": {"x": 3}}')
    (records / "e.json").write_bytes(b"\xff" * 10)
    os.mkfifo(records / "f.json")  # never opened
    (records / "a.json.tmp-123").write_text("half")  # a write under way: not a record
    st_ = read_status(str(hub))
    assert sorted(st_.records) == ["a"]
    assert sorted(p.split(": ")[0].rsplit("/", 1)[-1] for p in st_.problems) == ["c.json", "d.json", "e.json", "f.json"]
    r = sej_status(hub)
    assert r.returncode == 1 and r.stderr.count("problem:") == 4 and "Traceback" not in r.stderr


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=6),
                    max_leaves=20))  # fmt: skip
def test_parse_record_rejects_any_malformed_document_with_a_value_error(doc: Any) -> None:
    good = {"version": 1, "client_id": "a", "location": "/s", "since": 1.0, "connected": True, "passes": 1,
            "errors": {}, "journals": {}}  # fmt: skip
    for candidate in (doc, {**good, **doc} if isinstance(doc, dict) else doc,
                      {**good, "journals": {"ev.1.000": doc}}):  # fmt: skip
        try:
            rec = parse_record(json.dumps(candidate).encode(), "a")
        except ValueError:
            continue
        assert rec.client_id == "a" and all(j.messages >= 0 for j in rec.journals.values())
    with pytest.raises(ValueError):
        parse_record(b" " * (MAX_RECORD + 1), "a")


# -- the daemon's own judgement: liveness, error kinds, freshness, lag arithmetic ---------------------------


def test_alive_is_false_for_a_pass_without_progress_and_true_between_passes(tmp_path: Path, monkeypatch) -> None:
    from sej.hub import daemon as d

    config = loads_config(BASE.format("").replace('"/h"', f'"{tmp_path / "h"}"').replace('"/s"', f'"{tmp_path}"'))
    with d.Hub(config, records=False) as hub:
        (client,) = hub._clients
        assert hub.alive()  # no pass yet
        release = threading.Event()
        stuck = threading.Thread(target=release.wait, daemon=True)  # a pass in a call that does not return
        stuck.start()
        client._pass = stuck
        client.progress = time.monotonic()
        assert hub.alive()  # progress is recent
        client.progress = time.monotonic() - d.STUCK - 1
        assert not hub.alive()  # systemd's watchdog then restarts the hub
        release.set()
        stuck.join()
        assert hub.alive()  # the pass returned
        client.beat = time.monotonic() - d.LIVENESS - 1  # a supervisor that no longer looks at its pass
        assert not hub.alive()
        client.beat = None  # between passes (a backoff wait, however long)
        assert hub.alive()


def test_error_kinds() -> None:
    from sej.errors import ChecksumError
    from sej.hub.copy import CopyError
    from sej.hub.daemon import StalledError, error_kind
    from sej.hub.source import SourceError

    cause = CopyError("client a, journal j: checksum")
    cause.__cause__ = ChecksumError("seg", 0, 10, "mismatch")
    assert [error_kind(e) for e in (cause, CopyError("x"), StalledError("x"), SourceError("x"),
                                    ConnectionRefusedError(111, "refused"), OSError("Unable to connect"),
                                    OSError(28, "No space left on device"), TimeoutError(), EOFError(),
                                    ValueError())] == [
        "checksum", "copy", "stalled", "source", "connection", "connection", "io", "connection", "connection", "other"
    ]  # fmt: skip


def test_health_counts_a_long_pass_that_copies_as_fresh() -> None:
    now = [1000.0]
    book = StatusBook(None, [("a", "/s")], clock=lambda: now[0])
    from sej.hub.status import JournalPass

    book.record("a", [JournalPass("ev.1.000", 5, 5, 5, 50, 5, 50)], 0.1)
    assert book.stale(30) == []
    book.pass_started("a")  # a catch-up pass of minutes
    now[0] += 100
    assert [c for c, _ in book.stale(30)] == ["a"]  # nothing written for 100 s: stale
    book.progress("a")
    now[0] += 10
    assert book.stale(30) == []  # it writes: not stale
    book.record("a", [], 120.0, ("connection", "lost"))  # it ended failing: its progress no longer counts
    assert [c for c, _ in book.stale(30)] == ["a"]


def test_sej_hub_status_max_age_counts_a_long_pass_that_copies_as_fresh_as_health_does(tmp_path: Path) -> None:
    """`sej hub status --max-age` read only the last successful pass from the records, which were written at
    the end of passes: during a catch-up copy of minutes it called the client stale while /health said 200."""
    from sej.hub.status import REFRESH_EVERY, WRITE_EVERY, JournalPass

    assert REFRESH_EVERY < 100 and WRITE_EVERY > 0.2
    hub = tmp_path / "hub"
    record = hub / ".sej-hub" / "a.json"
    start = time.time() - 1000  # the records' times are wall clock: sej hub status compares them with its own
    wall, ticks = [start], [0.0]
    book = StatusBook(str(hub), [("a", "/s")], clock=lambda: wall[0], ticks=lambda: ticks[0])
    book.record("a", [JournalPass("ev.1.000", 5, 5, 5, 50, 5, 50)], 0.1)  # written: the first record
    book.pass_started("a")  # a catch-up pass of minutes
    wall[0] += 100
    ticks[0] += 100
    book.progress("a")  # the record is older than REFRESH_EVERY: rewritten, saying the pass copies
    wall[0] += 0.1
    ticks[0] += 0.1
    book.progress("a")  # not rewritten: the record was written 0.1 s ago
    on_disk = json.loads(record.read_text())
    assert on_disk["in_pass"] and on_disk["last_progress"] == start + 100
    age = time.time() - (start + 100)
    fresh = sej_status(hub, "--max-age", str(age + 60), "--json")
    assert fresh.returncode == 0, fresh.stderr
    (doc,) = json.loads(fresh.stdout)["clients"]
    assert doc["in_pass"] and doc["last_progress"] == start + 100 and age - 1 < doc["age"] < age + 60, doc
    assert doc["seconds_since_success"] > age  # the last success is older: the pass under way keeps it fresh
    # Only the pass's progress keeps it fresh: past --max-age since then, it is stale, and the line says both.
    stale = sej_status(hub, "--max-age", str(max(1.0, age - 60)))
    assert stale.returncode == 1, stale.stderr
    assert re.search(r"client a: last successful pass \d+\.\ds ago, a pass under way wrote \d+\.\ds ago "
                     r"\(--max-age", stale.stderr), stale.stderr  # fmt: skip

    # The pass ends well and changes nothing, 0.1 s after a write made during it: the throttles alone would
    # skip this record (nothing changed), and the file would say a pass is under way until the next one ends.
    wall[0] += 0.1
    ticks[0] += 0.1
    book.record("a", [], 102.0)
    on_disk = json.loads(record.read_text())
    assert not on_disk["in_pass"] and on_disk["last_success"] == wall[0], on_disk


def test_seen_lag_is_what_the_pass_found_before_copying() -> None:
    from sej.hub.batch import seen_lag
    from sej.hub.copy import CopyResult
    from sej.hub.source import SourceSegment

    segs = [SourceSegment(0, f"{0:016x}.jnl", 1000), SourceSegment(40, f"{40:016x}.jnl", 300)]
    # the hub had 600 bytes of the first segment; it copied the rest and the second: 40 + 12 messages
    done = CopyResult("j", "/h/c.j", 25, 700, 52, f"{40:016x}.jnl", 300)
    assert seen_lag(segs, (f"{0:016x}.jnl", 600), done) == (700, 25, 52)
    # stopped after the first segment: 300 bytes left, of at least the messages up to offset 40
    part = CopyResult("j", "/h/c.j", 13, 400, 40, f"{0:016x}.jnl", 1000)
    assert seen_lag(segs, (f"{0:016x}.jnl", 600), part) == (700, 13, 40)
    assert seen_lag(None, None, done) == (None, None, None)


def test_records_of_clients_no_longer_configured_are_removed(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    StatusBook(str(hub), [("a", "/s"), ("gone", "/t")]).write()
    os.symlink(hub / ".sej-hub" / "a.json", hub / ".sej-hub" / "link.json")
    book = StatusBook(str(hub), [("a", "/s")])
    book.forget_others()
    assert sorted(os.listdir(hub / ".sej-hub")) == ["a.json"]  # the link is removed, its target is not


def test_metrics_histogram_keeps_every_bucket() -> None:
    from sej.hub.metrics import HubCollector
    from sej.hub.status import PASS_BUCKETS

    book = StatusBook(None, [("a", "/s")])
    for seconds in (0.01, 200.0, 1000.0):
        book.record("a", [], seconds)
    (hist,) = [f for f in HubCollector(book).collect() if f.name == "sej_hub_pass_duration_seconds"]
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert len(buckets) == len(PASS_BUCKETS) + 1 and buckets["300.0"] == 2 and buckets["+Inf"] == 3


def test_parse_record_refuses_deep_nesting_and_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="nested"):
        parse_record(b"[" * 100_000, "a")
    good = {"version": 1, "client_id": "a", "location": "/s", "since": 1.0, "connected": True, "passes": 1,
            "errors": {}, "journals": {}, "last_success": float("inf")}  # fmt: skip
    with pytest.raises(ValueError, match="last_success"):
        parse_record(json.dumps(good).encode(), "a")


def test_a_journal_gone_from_its_producer_leaves_the_metrics_and_the_status_record(tmp_path: Path) -> None:
    """A complete pass that no longer finds a journal forgets it (its lag would otherwise stay on the dashboards);
    a pass stopped partway, or one whose client failed, forgets nothing."""
    from sej.hub.daemon import Hub
    from sej.hub.metrics import HubCollector

    src = tmp_path / "src"
    with sej.ShardedWriter(src, "ev", shard_bit=1) as w:
        for i in range(20):
            w.append(b"m%d" % i, key=b"k%d" % i)
    config = loads_config(f'hub_root = "{tmp_path / "hub"}"\n[[client]]\nclient_id = "a"\nlocal_root = "{src}"\n')

    def journals_in_metrics(hub: Hub) -> set[str]:
        return {s.labels["journal"] for f in HubCollector(hub.status).collect() if f.name == "sej_hub_next_offset"
                for s in f.samples}  # fmt: skip

    def journals_in_record() -> set[str]:
        doc = json.loads((tmp_path / "hub" / ".sej-hub" / "a.json").read_text())
        return set(doc["journals"])

    with Hub(config) as hub:
        (report,) = hub.run_once()
        assert report.ok and report.complete
        assert journals_in_metrics(hub) == journals_in_record() == {"ev.1.000", "ev.1.001"}
        os.rename(src / "ev.1.001", tmp_path / "moved")  # the producer removed a shard
        hub.status.record("a", [], 0.01, None, complete=False)  # a pass that saw nothing of it: forgets nothing
        assert journals_in_metrics(hub) == {"ev.1.000", "ev.1.001"}
        (report,) = hub.run_once()
        assert report.ok and report.complete
        assert journals_in_metrics(hub) == journals_in_record() == {"ev.1.000"}
        # `sej hub status` shows the hub's copy of the removed journal as gone: not a lag --max-lag would flag.
        r = sej_status(tmp_path / "hub", "--max-lag", "0", "--json")
        assert r.returncode == 0, r.stderr
        rows = {row["journal"]: row for row in json.loads(r.stdout)["journals"]}
        assert rows["ev.1.001"]["gone"] and rows["ev.1.001"]["error"] is None and not rows["ev.1.000"]["gone"]
        text = sej_status(tmp_path / "hub")
        assert text.returncode == 0 and re.search(r"ev\.1\.001 +\d+ +gone ", text.stdout), text.stdout
        os.rename(src, tmp_path / "src-gone")  # the whole root: the client fails, and its journals stay known
        (report,) = hub.run_once()
        assert report.client_failed and journals_in_metrics(hub) == {"ev.1.000"}
    os.rename(tmp_path / "src-gone", src)
    with Hub(config) as hub:  # a restarted hub knows nothing of ev.1.001: its first complete pass says it is gone
        (report,) = hub.run_once()
        assert report.ok and journals_in_record() == {"ev.1.000"}
    r = sej_status(tmp_path / "hub", "--max-lag", "0", "--json")
    assert r.returncode == 0 and [row["journal"] for row in json.loads(r.stdout)["journals"] if row["gone"]] == [
        "ev.1.001"
    ], r.stdout + r.stderr


@settings(max_examples=200, deadline=None)
@given(max_age=st.floats(0.001, 1e6), over=st.floats(0.0, 10.0))
def test_health_says_stale_exactly_when_older_than_max_age_and_never_shows_an_age_within_it(
    max_age: float, over: float
) -> None:
    """/health's verdict and the age it shows agree: a client stale by less than a millisecond reads as older than
    max_age, never as exactly max_age (CI once saw 20.0 > 20.0 fail, with the age rounded to the nearest ms)."""
    from sej.hub.metrics import health
    from sej.hub.status import StatusBook

    now = [1_000_000.0]
    book = StatusBook(None, [("c", "label")], clock=lambda: now[0])
    now[0] += max_age + over  # no pass yet: the age counts from when the daemon started watching
    code, body = health(book, max_age)
    if now[0] - 1_000_000.0 > max_age:
        assert code == 503 and body["stale"][0]["client"] == "c", body
        assert body["stale"][0]["seconds_since_success"] > max_age, body
    else:
        assert code == 200 and body == {"status": "ok", "max_age": max_age}
