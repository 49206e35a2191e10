"""The hub daemon: hub.toml, Hub.run_once/run_forever, the `sej-hub` console script and the cron script.

Sources are real sharded roots written with the library; the console script and the cron
script run as real subprocesses; the SSH tests talk to a real OpenSSH sshd on 127.0.0.1
(testing/sshd.py). Every wait is for an event, bounded by a deadline scaled for loaded machines (testing/timing.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import sej
from sej.hub import daemon
from sej.hub.config import HubConfig, load_config, loads_config
from sej.hub.daemon import ClientReport, Hub, backoff_delay, lock_hub, lock_path
from sej.hub.ssh import HostKeyError
from sej.lock import lock_file, unlock_file
from sej.offset import read_offset_file
from testing.timing import scaled

if TYPE_CHECKING:
    from testing.sshd import Sshd

REPO = Path(__file__).resolve().parent.parent
CRON = "sej.apps.hub_cron"  # sej-hub-cron
READER = "hub"


# -- helpers -------------------------------------------------------------------------------------------


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))  # a TOML basic string for the paths used here
    raise TypeError(v)


def write_config(path: Path, hub_root: Path | str, clients: list[dict[str, Any]], **top: Any) -> Path:
    lines = [f"hub_root = {toml_value(hub_root)}"] + [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for c in clients:
        lines += ["", "[[client]]"] + [f"{k} = {toml_value(v)}" for k, v in c.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_root(root: Path, n: int, prefix: str = "ev", bit: int = 2, start: int = 0) -> Path:
    """n messages over 2**bit shards of `prefix` in 300-byte segments (several segments per shard)."""
    with sej.ShardedWriter(root, prefix, shard_bit=bit, segment_size=300) as w:
        for i in range(start, start + n):
            w.append(b"value %d " % i + b"x" * (i % 17), key=b"key%d" % i, type=i % 3)
    return root


def journals(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / "jnl").is_dir())


def segment_files(journal: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((journal / "jnl").iterdir()) if p.name.endswith(".jnl")}


def committed(source_journal: Path) -> int:
    return read_offset_file(str(source_journal / "ofs" / f"{READER}.ofs")) or 0


def assert_identical(src: Path, hub_root: Path, client_id: str) -> None:
    """Every source journal is in the hub, byte for byte, and the hub's offset on it is the copy's next offset."""
    names = journals(src)
    assert names, f"no journals in {src}"
    for name in names:
        dest = hub_root / f"{client_id}.{name}"
        assert segment_files(dest) == segment_files(src / name), f"{dest} differs from {src / name}"
        assert committed(src / name) == sej.next_offset(dest) == sej.next_offset(src / name)


def assert_prefix(src: Path, hub_root: Path, client_id: str) -> int:
    """Every hub copy is a byte-identical prefix of its source and the source's offset is the copy's next one.

    Returns the number of messages the hub has.
    """
    total = 0
    for name in journals(src):
        dest = hub_root / f"{client_id}.{name}"
        if not dest.exists():
            assert committed(src / name) == 0
            continue
        mine, theirs = segment_files(dest), segment_files(src / name)
        seg_names = sorted(mine)
        for k, seg in enumerate(seg_names):
            assert seg in theirs, f"{dest}/jnl/{seg} is not in the source"
            if k < len(seg_names) - 1:
                assert mine[seg] == theirs[seg], f"{dest}/jnl/{seg} is not the whole source segment"
            else:
                assert theirs[seg].startswith(mine[seg]), f"{dest}/jnl/{seg} is not a prefix of the source's"
        nxt = sej.next_offset(dest)
        assert committed(src / name) == nxt, f"{name}: the offset on the source is not the copy's next offset"
        total += nxt - sej.first_offset(dest)
    return total


def copied_count(hub_root: Path, client_id: str) -> int:
    """Messages the hub has of a client, counted while it may be copying (-1 while a copy is being set up)."""
    try:
        dests = [p for p in hub_root.iterdir() if p.name.startswith(f"{client_id}.")] if hub_root.exists() else []
        return sum(sej.next_offset(d) - sej.first_offset(d) for d in dests)
    except (OSError, sej.SejError):
        return -1


def holds(check: Callable[[], object]) -> Callable[[], bool]:
    """A condition for wait_for: `check` passes (the hub commits its offset after the copy, so poll for it)."""

    def cond() -> bool:
        try:
            check()
        except (AssertionError, OSError, sej.SejError):
            return False
        return True

    return cond


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `cond` until it holds; fail after scaled(timeout) seconds."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:g}s waiting for {what}")
        time.sleep(0.02)


def hub_script() -> str:
    script = shutil.which("sej-hub", path=os.path.dirname(sys.executable)) or shutil.which("sej-hub")
    if script is None:
        pytest.fail("the sej-hub console script is not installed: run python3 -m pip install -e .")
    return script


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a command; fail after scaled(timeout) seconds."""
    return subprocess.run(args, capture_output=True, text=True, timeout=scaled(timeout), env=env())


def error_lines(stderr: str, prog: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: error:")]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_root(tmp_path / "src", 120)


# -- configuration -------------------------------------------------------------------------------------


def test_config_good_file(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "hub.toml"
    conf.parent.mkdir()
    conf.write_text(
        """
hub_root = "hub"               # relative to the config file's directory
hub_name = "hub-2"
poll_interval = 0.5
workers = 8
backoff_max = 30

[[client]]
client_id = "edge-1"
host = "edge-1.example.com"
port = 2222
user = "sej"
identity_file = "~/keys/hub_ed25519"
known_hosts = "/etc/sej/known_hosts"
accept_new_host_key = true
remote_root = "/var/lib/app"

[[client]]
client_id = "edge_2"
host = "10.0.0.2"
remote_root = "journals"

[[client]]
client_id = "here"
local_root = "../data"
"""
    )
    c = load_config(conf)
    assert c.path == str(conf)
    assert c.hub_root == str(tmp_path / "etc" / "hub")
    assert (c.hub_name, c.poll_interval, c.workers, c.backoff_max) == ("hub-2", 0.5, 8, 30.0)
    assert isinstance(c.backoff_max, float)
    a, b, here = c.clients
    assert (a.client_id, a.host, a.port, a.user, a.remote_root) == (
        "edge-1",
        "edge-1.example.com",
        2222,
        "sej",
        "/var/lib/app",
    )
    assert a.identity_file == os.path.expanduser("~/keys/hub_ed25519")
    assert a.known_hosts == "/etc/sej/known_hosts" and a.accept_new_host_key is True and not a.is_local
    assert a.describe() == "ssh://sej@edge-1.example.com:2222/var/lib/app"
    assert (b.port, b.user, b.identity_file, b.known_hosts, b.accept_new_host_key) == (None, None, None, None, False)
    assert here.is_local and here.local_root == str(tmp_path / "data") and here.host is None
    assert c.client("here") is here


def test_config_defaults() -> None:
    c = loads_config('hub_root = "/h"\n[[client]]\nclient_id = "a"\nlocal_root = "/src"\n')
    assert (c.hub_name, c.poll_interval, c.workers, c.backoff_max, c.path) == ("hub", 1.0, 4, 60.0, None)
    assert c.commit_interval == 5.0
    zero = loads_config('hub_root = "/h"\ncommit_interval = 0\n[[client]]\nclient_id = "a"\nlocal_root = "/src"\n')
    assert zero.commit_interval == 0.0  # commit on every pass


LOCAL = {"client_id": "a", "local_root": "/src"}
SSH = {"client_id": "s", "host": "127.0.0.1", "remote_root": "/r"}


def without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


BAD_CONFIGS: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[str]]] = [
    # (id, top-level keys, clients, what the error must say)
    ("unknown-top", {"colour": "red"}, [LOCAL], ["unknown key 'colour'", "'red'"]),
    ("hub_name", {"hub_name": "a b"}, [LOCAL], ["hub_name = 'a b'"]),
    ("hub_name-type", {"hub_name": 3}, [LOCAL], ["hub_name = 3"]),
    ("poll-zero", {"poll_interval": 0}, [LOCAL], ["poll_interval = 0", "more than 0"]),
    ("commit-negative", {"commit_interval": -1}, [LOCAL], ["commit_interval = -1", "at least 0"]),
    ("commit-string", {"commit_interval": "5"}, [LOCAL], ["commit_interval = '5'"]),
    ("poll-negative", {"poll_interval": -1.5}, [LOCAL], ["poll_interval = -1.5"]),
    ("poll-string", {"poll_interval": "1"}, [LOCAL], ["poll_interval = '1'"]),
    ("poll-bool", {"poll_interval": True}, [LOCAL], ["poll_interval = True"]),
    ("poll-huge", {"poll_interval": 1e9}, [LOCAL], ["poll_interval = 1000000000.0"]),
    ("workers-zero", {"workers": 0}, [LOCAL], ["workers = 0", "1 to 64"]),
    ("workers-float", {"workers": 2.5}, [LOCAL], ["workers = 2.5"]),
    ("workers-big", {"workers": 65}, [LOCAL], ["workers = 65"]),
    ("workers-string", {"workers": "4"}, [LOCAL], ["workers = '4'"]),
    ("backoff-zero", {"backoff_max": 0}, [LOCAL], ["backoff_max = 0"]),
    ("no-clients", {}, [], ["no [[client]] entries"]),
    ("client-id-bad", {}, [{**LOCAL, "client_id": "a/b"}], ["client_id = 'a/b'"]),
    ("client-id-int", {}, [{**LOCAL, "client_id": 7}], ["client_id = 7"]),
    ("client-id-missing", {}, [without(LOCAL, "client_id")], ["missing key client_id"]),
    ("client-id-dup", {}, [LOCAL, {**LOCAL, "local_root": "/other"}], ["client_id = 'a'", "unique"]),
    ("unknown-client", {}, [{**SSH, "hots": "x"}], ["unknown key 'hots'", "'x'", "client_id 's'"]),
    ("no-host", {}, [without(SSH, "host")], ["missing key host", "client_id 's'"]),
    ("no-remote-root", {}, [without(SSH, "remote_root")], ["missing key remote_root"]),
    ("nothing", {}, [{"client_id": "z"}], ["missing key host", "local_root"]),
    ("host-option", {}, [{**SSH, "host": "-oProxyCommand=sh"}], ["host = '-oProxyCommand=sh'"]),
    ("host-space", {}, [{**SSH, "host": "a b"}], ["host = 'a b'"]),
    ("host-int", {}, [{**SSH, "host": 5}], ["host = 5"]),
    ("port-zero", {}, [{**SSH, "port": 0}], ["port = 0", "1 to 65535"]),
    ("port-big", {}, [{**SSH, "port": 70000}], ["port = 70000"]),
    ("port-string", {}, [{**SSH, "port": "22"}], ["port = '22'"]),
    ("port-bool", {}, [{**SSH, "port": True}], ["port = True"]),
    ("user", {}, [{**SSH, "user": "a b"}], ["user = 'a b'"]),
    ("accept-string", {}, [{**SSH, "accept_new_host_key": "yes"}], ["accept_new_host_key = 'yes'", "true or false"]),
    ("remote-root-empty", {}, [{**SSH, "remote_root": ""}], ["remote_root = ''"]),
    ("identity-empty", {}, [{**SSH, "identity_file": ""}], ["identity_file = ''"]),
    ("known-hosts-int", {}, [{**SSH, "known_hosts": 1}], ["known_hosts = 1"]),
    ("local-and-ssh", {}, [{**LOCAL, "host": "h"}], ["host = 'h'", "local_root"]),
    ("local-root-int", {}, [{**LOCAL, "local_root": 3}], ["local_root = 3"]),
]


@pytest.mark.parametrize("top,clients,expect", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_config_bad_key_or_value_is_named(
    tmp_path: Path, top: dict[str, Any], clients: list[dict[str, Any]], expect: list[str]
) -> None:
    conf = write_config(tmp_path / "hub.toml", "/hub", clients, **top)
    with pytest.raises(sej.InvalidArgumentError) as e:
        load_config(conf)
    message = str(e.value)
    assert message.startswith(f"{conf}: "), message
    assert "\n" not in message
    for part in expect:
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.parametrize(
    "text,expect",
    [
        ("[[client]]\nclient_id = 'a'\nlocal_root = '/s'\n", ["missing key hub_root"]),
        ("hub_root = 5\n[[client]]\nclient_id = 'a'\nlocal_root = '/s'\n", ["hub_root = 5"]),
        ("hub_root = ''\n[[client]]\nclient_id = 'a'\nlocal_root = '/s'\n", ["hub_root = ''"]),
        ("hub_root = '/h'\nclient = 1\n", ["client = 1", "[[client]]"]),
        ("hub_root = '/h'\nclient = [1]\n", ["client = [1]"]),
        (
            "hub_root = '/h'\npoll_interval = inf\n[[client]]\nclient_id = 'a'\nlocal_root = '/s'\n",
            ["poll_interval = inf"],
        ),
        ("hub_root = '/h'\nbackoff_max = nan\n[[client]]\nclient_id = 'a'\nlocal_root = '/s'\n", ["backoff_max = nan"]),
        ("hub_root = '/h'\nworkers = \n", ["not valid TOML", "line 2"]),
    ],
)
def test_config_bad_text(tmp_path: Path, text: str, expect: list[str]) -> None:
    conf = tmp_path / "hub.toml"
    conf.write_text(text)
    with pytest.raises(sej.InvalidArgumentError) as e:
        load_config(conf)
    for part in expect:
        assert part in str(e.value), f"{part!r} not in {str(e.value)!r}"


def test_config_password_is_refused_and_never_echoed(tmp_path: Path) -> None:
    for key in ("password", "ssh_password", "key_passphrase"):
        conf = write_config(tmp_path / "hub.toml", "/hub", [{**SSH, key: "hunter2"}])
        with pytest.raises(sej.InvalidArgumentError) as e:
            load_config(conf)
        assert key in str(e.value) and "keys only" in str(e.value)
        assert "hunter2" not in str(e.value)


def test_config_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(sej.InvalidArgumentError, match="is a directory"):
        load_config(tmp_path)


# -- run_once with local clients -----------------------------------------------------------------------


def local_config(tmp_path: Path, roots: dict[str, Path], **top: Any) -> HubConfig:
    clients = [{"client_id": cid, "local_root": root} for cid, root in roots.items()]
    return load_config(write_config(tmp_path / "hub.toml", tmp_path / "hub", clients, **top))


def test_run_once_copies_a_sharded_root_byte_identically(tmp_path: Path, src: Path) -> None:
    config = local_config(tmp_path, {"edge-1": src})
    with Hub(config) as hub:
        (report,) = hub.run_once()
    assert report.ok and report.client_id == "edge-1" and report.error is None
    assert report.messages == 120 and sorted(o.journal for o in report.outcomes) == journals(src)
    assert len(journals(src)) == 4 and all(len(segment_files(src / j)) > 1 for j in journals(src))
    hub_root = Path(config.hub_root)
    assert sorted(p.name for p in hub_root.iterdir() if p.is_dir()) == [
        ".sej-hub",
        *(f"edge-1.{j}" for j in journals(src)),
    ]
    assert [p.name for p in (hub_root / ".sej-hub").iterdir()] == ["edge-1.json"]  # the client's status record
    assert_identical(src, hub_root, "edge-1")
    with Hub(config) as hub:  # nothing new: nothing copied, nothing changed
        (again,) = hub.run_once()
    assert again.ok and again.messages == 0
    assert_identical(src, hub_root, "edge-1")


def test_new_shards_and_messages_are_found_on_the_next_pass(tmp_path: Path) -> None:
    src = make_root(tmp_path / "src", 40, bit=1)
    config = local_config(tmp_path, {"c": src})
    hub_root = Path(config.hub_root)
    with Hub(config) as hub:
        (first,) = hub.run_once()
        assert first.ok and first.messages == 40
        assert journals(hub_root) == ["c.ev.1.000", "c.ev.1.001"]
        make_root(src, 50, prefix="other", bit=2)  # a new stream: four new shards
        make_root(src, 30, bit=1, start=40)  # and more messages in the old ones
        with sej.Writer(src / "plain", segment_size=300) as w:  # and an unsharded journal
            w.append_many([b"p%d" % i for i in range(10)])
        (second,) = hub.run_once()
    assert second.ok and second.messages == 50 + 30 + 10
    assert len(journals(src)) == 7
    assert journals(hub_root) == [f"c.{j}" for j in journals(src)]
    assert_identical(src, hub_root, "c")


def test_a_directory_that_is_not_a_journal_is_warned_of_once(tmp_path: Path, src: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    with sej.Writer(str(src / "ev.10.000"), segment_size=300) as w:  # the bit in decimal: not a shard name
        w.append(b"never copied")
    empty = tmp_path / "empty"
    os.makedirs(empty / "lost+found")
    config = local_config(tmp_path, {"edge-1": src, "edge-2": empty})
    with caplog.at_level(logging.WARNING, logger="sej.hub"), Hub(config) as hub:
        for _ in range(3):
            one, two = hub.run_once()
            assert one.ok and two.ok and two.outcomes == []
    warned = sorted(r.getMessage() for r in caplog.records)  # the clients' passes run at once
    assert len(warned) == 3, warned  # once each, not once per pass
    assert warned[0].startswith(f"client edge-1: skipping 'ev.10.000' under {src}: not a journal name: 'ev.10.000'")
    assert warned[1] == f"client edge-2: no journal found at {empty}"
    assert warned[2].startswith(f"client edge-2: skipping 'lost+found' under {empty}: not a journal name")
    assert not any(p.name.endswith("ev.10.000") for p in Path(config.hub_root).iterdir())


def test_a_failing_client_does_not_stop_the_others(tmp_path: Path, src: Path) -> None:
    config = local_config(tmp_path, {"gone": tmp_path / "missing", "good": src})
    with Hub(config) as hub:
        gone, good = hub.run_once()
    assert gone.client_id == "gone" and not gone.ok and gone.client_failed and gone.outcomes == []
    assert "missing" in str(gone.error)
    assert gone.failures() == [f"client gone: {gone.error}"]
    assert good.ok and good.messages == 120
    assert_identical(src, Path(config.hub_root), "good")
    assert not any(p.name.startswith("gone.") for p in Path(config.hub_root).iterdir())


def test_a_failing_journal_does_not_stop_the_client(tmp_path: Path, src: Path) -> None:
    config = local_config(tmp_path, {"c": src})
    held = Path(config.hub_root) / "c.ev.2.001"
    held.mkdir(parents=True)
    fh = lock_file(str(held / "jnl.lck"))  # another copier holds this journal's copy
    try:
        with Hub(config) as hub:
            (report,) = hub.run_once()
    finally:
        unlock_file(fh)
    assert not report.ok and not report.client_failed
    (bad,) = report.failed_journals
    assert bad.journal == "ev.2.001" and isinstance(bad.error, sej.LockedError)
    (line,) = report.failures()
    assert line.startswith("client c, journal ev.2.001: ") and "jnl.lck" in line
    for j in journals(src):
        if j != "ev.2.001":
            assert segment_files(Path(config.hub_root) / f"c.{j}") == segment_files(src / j)
    with Hub(config) as hub:  # released: the next pass copies it
        (report,) = hub.run_once()
    assert report.ok
    assert_identical(src, Path(config.hub_root), "c")


def test_run_once_with_stop_already_set_does_nothing(tmp_path: Path, src: Path) -> None:
    stop = threading.Event()
    stop.set()
    with Hub(local_config(tmp_path, {"c": src})) as hub:
        assert hub.run_once(stop) == []
    assert not (tmp_path / "hub").exists()


# -- run_forever ---------------------------------------------------------------------------------------


def test_backoff_delay() -> None:
    assert backoff_delay(0, 1.0, 60.0) == 1.0
    assert [backoff_delay(n, 1.0, 60.0) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(10_000, 0.5, 30.0) == 30.0  # no overflow
    assert backoff_delay(3, 5.0, 1.0) == 5.0  # never faster than a normal pass


Forever = Callable[..., tuple[threading.Event, list[ClientReport]]]


@pytest.fixture
def forever() -> Iterator[Forever]:
    """start(hub): hub.run_forever in a thread; it is stopped (and must end within scaled(5) s) after the test.

    Returns (stop, reports): the reports as they come, and also, with start(hub, stamped), (time.monotonic()
    when it came, report) appended to the list `stamped`.
    """
    running: list[tuple[threading.Thread, threading.Event]] = []

    def start(
        hub: Hub, stamped: list[tuple[float, ClientReport]] | None = None
    ) -> tuple[threading.Event, list[ClientReport]]:
        stop = threading.Event()
        reports: list[ClientReport] = []

        def on_report(report: ClientReport) -> None:
            if stamped is not None:
                stamped.append((time.monotonic(), report))
            reports.append(report)

        t = threading.Thread(target=hub.run_forever, args=(stop, on_report), daemon=True)
        t.start()
        running.append((t, stop))
        return stop, reports

    yield start
    for t, stop in running:
        stop.set()
        t.join(scaled(5))
        assert not t.is_alive(), f"run_forever did not end within {scaled(5):g} s of stop"


def test_run_forever_backs_off_a_failing_client_and_recovers(tmp_path: Path, src: Path, forever: Forever) -> None:
    late = tmp_path / "late"
    config = local_config(tmp_path, {"late": late, "good": src}, poll_interval=0.05, backoff_max=0.4)
    stamped: list[tuple[float, ClientReport]] = []
    stop, reports = forever(Hub(config), stamped)

    def of(client_id: str) -> list[tuple[float, ClientReport]]:
        return [(t, r) for t, r in list(stamped) if r.client_id == client_id]

    wait_for(lambda: len(of("late")) >= 5 and len(of("good")) >= 5, 20, "5 passes of each client")
    failed, good = of("late"), of("good")
    assert all(r.client_failed for _, r in failed)
    assert all(r.ok for _, r in good)
    # Backoff: after its n-th failure in a row the client waits 0.1, 0.2, 0.4, 0.4 s (poll_interval 0.05 s
    # doubled, at most backoff_max), where the good one waits 0.05 s. The wait between two passes is the
    # time between their reports less the second pass's own duration; a loaded machine only lengthens it.
    for n, ((t0, _), (t1, r1)) in enumerate(zip(failed, failed[1:]), start=1):
        waited = t1 - t0 - r1.seconds
        assert waited >= backoff_delay(n, 0.05, 0.4) - 0.01, f"attempt {n + 1} came {waited:.3f} s after {n}"
    assert_identical(src, Path(config.hub_root), "good")
    make_root(late, 30)  # the root appears: copied within one backoff_max
    wait_for(lambda: any(r.client_id == "late" and r.ok and r.messages for r in reports), 5, "the late client")
    assert_identical(late, Path(config.hub_root), "late")
    t0 = time.monotonic()
    stop.set()
    wait_for(lambda: not any(t.name.startswith("sej-hub-") for t in threading.enumerate()), 5, "client threads")
    assert time.monotonic() - t0 < scaled(3)


def test_run_forever_copies_new_data_continuously(tmp_path: Path, forever: Forever) -> None:
    src = make_root(tmp_path / "src", 20, bit=1)
    config = local_config(tmp_path, {"c": src}, poll_interval=0.05)
    hub_root = Path(config.hub_root)
    forever(Hub(config))
    wait_for(holds(lambda: assert_identical(src, hub_root, "c")), 5, "the first copy")
    for round_ in range(1, 4):
        make_root(src, 20, bit=1, start=20 * round_)
        wait_for(holds(lambda: assert_identical(src, hub_root, "c")), 5, f"round {round_}")
    assert copied_count(hub_root, "c") == 80


def test_run_forever_defers_the_offset_on_the_producer_and_commits_it_on_stop(tmp_path: Path) -> None:
    """commit_interval: the first copy of a journal commits at once; later ones wait (the producer's offset lags the
    hub's copy, which is whole and durable), and stopping the hub commits what waits."""
    src = make_root(tmp_path / "src", 20, bit=1)
    config = local_config(tmp_path, {"c": src}, poll_interval=0.05, commit_interval=3600)
    hub_root = Path(config.hub_root)
    stop = threading.Event()
    reports: list[ClientReport] = []
    hub = Hub(config)
    t = threading.Thread(target=hub.run_forever, args=(stop, reports.append), daemon=True)
    t.start()
    try:
        wait_for(holds(lambda: assert_identical(src, hub_root, "c")), 5, "the first copy, committed at once")
        first = {j: committed(src / j) for j in journals(src)}
        make_root(src, 20, bit=1, start=20)
        wait_for(lambda: copied_count(hub_root, "c") == 40, 5, "the second copy")
        n = len(reports)
        wait_for(lambda: len(reports) >= n + 2, 5, "two more passes")  # passes that could have committed
        assert {j: committed(src / j) for j in journals(src)} == first  # waiting: 3600 s
    finally:
        stop.set()
        t.join(scaled(5))
    assert not t.is_alive()
    assert_identical(src, hub_root, "c")  # committed on stop
    make_root(src, 20, bit=1, start=40)
    (report,) = hub.run_once()  # one pass: it commits what it copies
    assert report.ok and report.messages == 20
    assert_identical(src, hub_root, "c")


# -- the sej-hub console script ------------------------------------------------------------------------


def test_console_script_is_declared() -> None:
    cfg = (REPO / "setup.cfg").read_text()
    assert "sej-hub = sej.apps.entry:hub" in cfg
    assert "sej = sej.apps.entry:sej" in cfg and "sej-pipeline = sej.apps.entry:pipeline" in cfg


def test_sej_hub_once_in_a_subprocess(tmp_path: Path, src: Path) -> None:
    conf = write_config(tmp_path / "hub.toml", "hub", [{"client_id": "edge-1", "local_root": "src"}])
    p = run([hub_script(), "--config", str(conf), "--once"])
    assert p.returncode == 0, p.stderr
    assert error_lines(p.stderr, "sej-hub") == [] and "Traceback" not in p.stderr
    assert "copied 120 messages" in p.stderr
    assert_identical(src, tmp_path / "hub", "edge-1")
    assert not (tmp_path / "hub" / ".hub.lck").read_text()  # the lock file stays, empty and unlocked


def test_sej_hub_once_exits_1_when_a_client_fails(tmp_path: Path, src: Path) -> None:
    conf = write_config(
        tmp_path / "hub.toml",
        tmp_path / "hub",
        [{"client_id": "gone", "local_root": tmp_path / "missing"}, {"client_id": "good", "local_root": src}],
    )
    p = run([hub_script(), "--config", str(conf), "--once"])
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert error_lines(p.stderr, "sej-hub") == ["sej-hub: error: 1 failures in 1 of 2 clients (see the log above)"]
    assert f"ERROR sej.hub: client gone: source {tmp_path / 'missing'} is not a directory" in p.stderr
    assert_identical(src, tmp_path / "hub", "good")


@pytest.mark.parametrize(
    "args,text,expect",
    [
        (["--config", "{dir}/nope.toml"], None, "config file {dir}/nope.toml does not exist"),
        (["--config", "{dir}/hub.toml"], "hub_root = '/h'\nworkers = 0\n", "workers = 0"),
        (["--config", "{dir}/hub.toml"], "hub_root = '/h\n", "not valid TOML"),
        (["--once"], None, "Missing option '--config'"),
        (["--config", "x", "--log-level", "loud"], None, "'loud' is not one of"),
        (["--config", "x", "--bogus"], None, "No such option '--bogus'"),
    ],
)
def test_sej_hub_usage_errors_exit_2(tmp_path: Path, args: list[str], text: str | None, expect: str) -> None:
    if text is not None:
        (tmp_path / "hub.toml").write_text(text)
    p = run([hub_script(), *[a.format(dir=tmp_path) for a in args]])
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("sej-hub: error: ") and expect.format(dir=tmp_path) in line, line


def test_sej_hub_refuses_when_another_hub_holds_the_lock(tmp_path: Path, src: Path) -> None:
    conf = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src}])
    fh = lock_hub(load_config(conf))
    try:
        for extra in (["--once"], []):
            p = run([hub_script(), "--config", str(conf), *extra])
            assert p.returncode == 1, p.stderr
            assert error_lines(p.stderr, "sej-hub") == [
                f"sej-hub: error: another hub run holds the lock {tmp_path / 'hub' / '.hub.lck'}"
            ]
    finally:
        unlock_file(fh)
    assert journals(tmp_path / "hub") == []


def test_sej_hub_forever_stops_on_sigterm_with_a_consistent_copy(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_root(src, 10, bit=2)
    conf = write_config(
        tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src}], poll_interval=0.05
    )
    hub_root = tmp_path / "hub"
    produce = threading.Event()
    written = [0]

    def producer() -> None:  # keeps appending while the hub copies, until told to stop (safety: scaled(120) s)
        deadline = time.monotonic() + scaled(120)
        with sej.ShardedWriter(src, "ev", shard_bit=2, segment_size=4096, durability="flush") as w:
            i = 10
            while not produce.is_set() and time.monotonic() < deadline:
                w.append_many(
                    [b"live %d " % j + b"y" * (j % 50) for j in range(i, i + 20)],
                    keys=[b"k%d" % j for j in range(i, i + 20)],
                )
                i += 20
                written[0] = i
                time.sleep(0.002)

    writer = threading.Thread(target=producer, daemon=True)
    writer.start()
    p = subprocess.Popen(
        [hub_script(), "--config", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env()
    )
    try:
        wait_for(lambda: copied_count(hub_root, "c") > 200, 15, "the hub to copy")
        time.sleep(0.3)  # not a wait for anything: the hub copies on for a moment while the producer appends
        p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, stderr = p.communicate(timeout=scaled(5))
        stopped_in = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=scaled(5))
        produce.set()
        writer.join(scaled(10))
    assert p.returncode == 0, stderr
    assert stopped_in < scaled(5)
    assert "Traceback" not in stderr and error_lines(stderr, "sej-hub") == []
    assert "stopping: finishing the current chunks" in stderr and "hub stopped" in stderr
    assert "still busy" not in stderr, "every client finished its chunks (the hub did not give up waiting)"
    copied = assert_prefix(src, hub_root, "c")  # the producer has stopped: compare against what it wrote
    assert 200 < copied <= written[0]
    p2 = run([hub_script(), "--config", str(conf), "--once"])  # and the next run completes it
    assert p2.returncode == 0, p2.stderr
    assert_identical(src, hub_root, "c")


# -- the cron script -----------------------------------------------------------------------------------


def cron(conf: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", CRON, "--config", str(conf), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
    )


def test_cron_script_skips_while_another_run_holds_the_lock(tmp_path: Path, src: Path) -> None:
    hub_root = tmp_path / "hub"
    conf = write_config(tmp_path / "hub.toml", hub_root, [{"client_id": "c", "local_root": src}])
    fh = lock_hub(load_config(conf))  # the test is "the other run"
    try:
        runs = [cron(conf), cron(conf)]  # two at once
        outs = [r.communicate(timeout=scaled(30)) for r in runs]
    finally:
        unlock_file(fh)
    for r, (_, err) in zip(runs, outs):
        assert r.returncode == 0, err
        assert f"another run holds the lock {lock_path(load_config(conf))}; nothing to do" in err
        assert "Traceback" not in err
    assert journals(hub_root) == [] and committed(src / "ev.2.000") == 0  # nothing copied, nothing committed
    runs = [cron(conf), cron(conf)]  # lock free: whichever gets it copies; the other skips or finds nothing new
    outs = [r.communicate(timeout=scaled(30)) for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs
    assert sum("copied 120 messages" in err for _, err in outs) == 1, outs
    assert_identical(src, hub_root, "c")


def test_cron_script_exit_codes(tmp_path: Path, src: Path) -> None:
    bad = write_config(tmp_path / "bad.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src, "port": 22}])
    p = cron(bad)
    _, err = p.communicate(timeout=scaled(30))
    assert p.returncode == 2 and err.strip().startswith("sej-hub-cron: error: ") and "port = 22" in err, err
    conf = write_config(
        tmp_path / "hub.toml",
        tmp_path / "hub",
        [{"client_id": "gone", "local_root": tmp_path / "missing"}, {"client_id": "c", "local_root": src}],
    )
    p = cron(conf, "--max-time", str(int(scaled(30))))
    _, err = p.communicate(timeout=scaled(30))
    assert p.returncode == 1, err
    assert error_lines(err, "sej-hub-cron") == ["sej-hub-cron: error: 1 failures in 1 of 2 clients"], err
    assert_identical(src, tmp_path / "hub", "c")


def test_example_crontab_and_systemd_unit() -> None:
    """The unit and the crontab the wheel carries (sej/apps/files/), as `sej-hub --print` fills them in
    (tests/test_hub_files.py has the rest)."""
    from sej.apps.hub_files import render

    unit = render("unit")
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.lstrip().startswith("#")
    )
    assert settings["Type"] == "notify" and settings["Restart"] == "on-failure" and settings["KillSignal"] == "SIGTERM"
    assert settings["RestartPreventExitStatus"] == "2"  # a config error (exit 2) is not restarted in a loop
    assert settings["ExecStart"].endswith("/sej-hub --config /etc/sej/hub.toml")
    assert int(settings["TimeoutStopSec"]) > 30  # more than the daemon's own wait for the current chunks
    (line,) = [x for x in render("crontab").splitlines() if x and not x.startswith("#")]
    fields = line.split()
    assert len(fields[:5]) == 5 and fields[6].endswith("/sej-hub-cron")  # the installed console script
    assert "--config" in fields and "--max-time" in fields


# -- over SSH (a real sshd on 127.0.0.1) ---------------------------------------------------------------


def ssh_client(sshd: Sshd, client_id: str, remote_root: Path, **over: Any) -> dict[str, Any]:
    """A client over SFTP, whatever the producer has on its PATH (tests/test_hub_serve.py covers `sej serve`)."""
    return {
        "transport": "sftp",
        "client_id": client_id,
        "host": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "identity_file": sshd.identity,
        "known_hosts": sshd.known_hosts,
        "remote_root": remote_root,
        **over,
    }


def logins(sshd: Sshd) -> int:
    return sshd.log.count("Accepted publickey")


def test_run_once_over_ssh(tmp_path: Path, src: Path, sshd: Sshd) -> None:
    config = load_config(write_config(tmp_path / "hub.toml", tmp_path / "hub", [ssh_client(sshd, "edge-1", src)]))
    before = logins(sshd)
    with Hub(config) as hub:
        (report,) = hub.run_once()
        assert report.ok, report.failures()
        assert report.messages == 120
        assert_identical(src, tmp_path / "hub", "edge-1")  # the offsets were committed over SFTP
        make_root(src, 30, start=120)
        (again,) = hub.run_once()  # on the same connection
        assert again.ok and again.messages == 30
    assert_identical(src, tmp_path / "hub", "edge-1")
    assert logins(sshd) - before == 1, "the connection is kept between passes"


def test_ssh_host_key_mismatch_fails_that_client_only(tmp_path: Path, src: Path, sshd: Sshd) -> None:
    wrong = sshd.other_known_hosts(tmp_path / "wrong_known_hosts")
    clients = [ssh_client(sshd, "spoofed", src, known_hosts=wrong), {"client_id": "local", "local_root": src}]
    config = load_config(write_config(tmp_path / "hub.toml", tmp_path / "hub", clients))
    before = logins(sshd)
    with Hub(config) as hub:
        spoofed, local = hub.run_once()
    assert isinstance(spoofed.error, HostKeyError) and "does not match" in str(spoofed.error)
    assert logins(sshd) == before, "nothing authenticated to a host with the wrong key"
    assert local.ok and local.messages == 120
    assert not any(p.name.startswith("spoofed.") for p in (tmp_path / "hub").iterdir())


# paramiko's SFTP prefetch thread dies of the dropped connection (the read it serves fails and is reported);
# sej-hub logs that in one line (sej.apps.hub.quiet_prefetch_errors), this in-process test does not.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_run_forever_reconnects_after_the_connection_drops(tmp_path: Path, sshd: Sshd, forever: Forever) -> None:
    src = make_root(tmp_path / "src", 40, bit=1)
    config = load_config(
        write_config(
            tmp_path / "hub.toml", tmp_path / "hub", [ssh_client(sshd, "s", src)], poll_interval=0.05, backoff_max=0.5
        )
    )
    hub_root = tmp_path / "hub"
    before = logins(sshd)
    _, reports = forever(Hub(config))
    wait_for(holds(lambda: assert_identical(src, hub_root, "s")), 10, "the first copy")
    passes = len(reports)
    wait_for(lambda: len(reports) >= passes + 5, 10, "5 more passes")
    assert logins(sshd) - before == 1, "one connection for many passes"
    sshd.kill_connections()
    make_root(src, 40, bit=1, start=40)
    wait_for(holds(lambda: assert_identical(src, hub_root, "s")), 15, "the copy after reconnecting")
    assert copied_count(hub_root, "s") == 80
    assert logins(sshd) - before >= 2


def test_the_hub_needs_nothing_but_sftp_on_the_producer(tmp_path: Path, src: Path, sshd: Sshd) -> None:
    """A key restricted to SFTP (`restrict,command="internal-sftp"`, as docs/hub.md advises) is enough:
    the hub runs no remote command. A shell command with the same key is refused."""
    from testing.sshd import Sshd as SshdServer  # a server of its own: the session's sshd keeps its unrestricted key

    with SshdServer() as server:
        key = server.authorized_keys.read_text().strip()
        server.authorized_keys.write_text(f'restrict,command="internal-sftp" {key}\n')
        config = load_config(write_config(tmp_path / "hub.toml", tmp_path / "hub", [ssh_client(server, "c", src)]))
        with Hub(config) as hub:
            (report,) = hub.run_once()
        assert report.ok, report.failures()
        assert_identical(src, tmp_path / "hub", "c")
        client = server.paramiko_client()
        try:
            _, out, _ = client.exec_command("echo hello", timeout=scaled(10))
            assert b"hello" not in out.read()
        finally:
            client.close()


def test_a_producer_that_stops_answering_is_cut_off_by_the_watchdog(
    tmp_path: Path, src: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening an SFTP channel has no timeout of its own: a producer whose sshd hangs (its TCP connection
    still up) would block its client for good. The watchdog closes the connection; the next pass reconnects."""
    monkeypatch.setattr(daemon, "WATCH_INTERVAL", 0.1)
    config = load_config(write_config(tmp_path / "hub.toml", tmp_path / "hub", [ssh_client(sshd, "c", src)]))
    with Hub(config) as hub:
        # A short STALL_TIMEOUT only while the producer hangs: a loaded machine may well make an answering
        # producer's call take a second, and the watchdog would then rightly cut it.
        (first,) = hub.run_once()
        assert first.ok
        make_root(src, 30, start=120)
        frozen = sshd.connections()
        assert frozen, "the hub keeps its connection between passes"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)  # the producer's sshd hangs; the kernel still keeps the TCP connection up
        passes: list[list[ClientReport]] = []
        t = threading.Thread(target=lambda: passes.append(hub.run_once()), daemon=True)
        limit = scaled(10)
        try:
            monkeypatch.setattr(daemon, "STALL_TIMEOUT", 1.0)
            t0 = time.monotonic()
            t.start()
            t.join(limit)  # bounded even if the watchdog failed
            took = time.monotonic() - t0
        finally:
            monkeypatch.undo()  # STALL_TIMEOUT and WATCH_INTERVAL as they were
            sshd.kill_connections()  # SIGKILL ends stopped processes too (and unblocks a hung pass)
            t.join(limit)
        assert took < limit, "the pass against a hung producer did not end"
        ((stalled,),) = passes
        assert stalled.client_failed and not stalled.ok
        (again,) = hub.run_once()  # a fresh connection
        assert again.ok and again.messages == 30, again.failures()
    assert_identical(src, tmp_path / "hub", "c")


# -- FIFOs and stalled calls: SIGTERM ends sej-hub within seconds in every state (issue 10, item 6) --------------


class HubProcess:
    """A sej-hub (or a script) running as a real subprocess, its stderr read line by line as it comes."""

    def __init__(self, args: list[str]) -> None:
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        self.lines: list[str] = []
        self.out: list[str] = []
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(f, buf), daemon=True)
                         for f, buf in ((self.p.stderr, self.lines), (self.p.stdout, self.out))]  # fmt: skip
        for t in self._readers:
            t.start()

    def _read(self, f: Any, buf: list[str]) -> None:
        for line in f:
            with self._changed:
                buf.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, text: str, timeout: float, stream: str = "stderr") -> bool:
        """Whether a line containing `text` came within `timeout` seconds."""
        buf = self.lines if stream == "stderr" else self.out
        with self._changed:
            return self._changed.wait_for(lambda: any(text in line for line in buf), timeout)

    def stop(self, timeout: float) -> float | None:
        """SIGTERM; the seconds it took to exit, or None if it did not exit within `timeout` (then SIGKILL)."""
        t0 = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout)
            return time.monotonic() - t0
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.kill()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        for t in self._readers:
            t.join(10)

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)


def fifo_at_hub_offset(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A source copied once, then its ev.2.001/ofs/hub.ofs replaced by a FIFO; (source, config, the FIFO)."""
    src = make_root(tmp_path / "src", 120)
    conf = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src}],
                        poll_interval=0.05)  # fmt: skip
    first = run([hub_script(), "--config", str(conf), "--once"])
    assert first.returncode == 0, first.stderr
    fifo = src / "ev.2.001" / "ofs" / f"{READER}.ofs"
    fifo.unlink()
    os.mkfifo(fifo)
    return src, conf, fifo


def test_sej_hub_once_refuses_a_fifo_at_a_sources_hub_offset(tmp_path: Path) -> None:
    """A FIFO at `ofs/hub.ofs` blocked `sej-hub --once` forever in open() (when nothing was new to copy)."""
    src, conf, fifo = fifo_at_hub_offset(tmp_path)
    p = run([hub_script(), "--config", str(conf), "--once"], timeout=60)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert f"ERROR sej.hub: {fifo} is a FIFO, not a regular file: refusing to open it" in p.stderr
    assert error_lines(p.stderr, "sej-hub") == ["sej-hub: error: 1 failures in 1 of 1 clients (see the log above)"]
    assert fifo.is_fifo()


def test_sej_hub_stops_on_sigterm_while_a_source_holds_a_fifo(tmp_path: Path) -> None:
    src, conf, fifo = fifo_at_hub_offset(tmp_path)
    hub = HubProcess([hub_script(), "--config", str(conf)])
    try:
        # It used to hang in open() instead; wait for the refusal (or give up after a while), then stop it.
        refused = hub.wait_for(f"{fifo} is a FIFO", 20)
        took = hub.stop(timeout=10)
    finally:
        hub.kill()
    assert took is not None, f"sej-hub did not exit within 10 s of SIGTERM:\n{hub.stderr}"
    assert refused, hub.stderr
    assert hub.p.returncode == 0 and "hub stopped" in hub.stderr and "Traceback" not in hub.stderr


# A local call that never returns, as on a hung network filesystem (a process stuck in the kernel cannot be
# interrupted): the source's read is replaced by one that blocks for good. Everything else is the real sej-hub.
STUCK_HUB = r"""
import os, sys, threading
import sej.hub.daemon as daemon
from sej.hub import local_source
stall = float(sys.argv[1])
if stall:
    daemon.STALL_TIMEOUT, daemon.WATCH_INTERVAL = stall, 0.1
never = threading.Event()

def stuck_read(self, journal, name, pos, size):
    os.write(1, b"stuck in a read\n")
    never.wait()

local_source.LocalSource.read = stuck_read
from sej.apps.hub import main
sys.argv[1:] = sys.argv[2:]
main()
"""


def test_the_watchdog_bounds_a_stalled_local_pass(tmp_path: Path, src: Path) -> None:
    """The watchdog only closed SSH connections: a local pass stuck in a call hung `sej-hub --once` for good."""
    conf = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src}])
    hub = HubProcess([sys.executable, "-c", STUCK_HUB, "1.0", "--config", str(conf), "--once"])
    try:
        assert hub.wait_for("stuck in a read", 30, "stdout"), hub.stderr
        hub.p.wait(60)  # STALL_TIMEOUT is 1 s here
    except subprocess.TimeoutExpired:
        pass
    finally:
        hub.kill()
    assert hub.p.returncode == 1, hub.stderr
    assert "Traceback" not in hub.stderr
    assert f"client c: a call to {src} has not returned for 1s; abandoning the pass" in hub.stderr
    assert "the pass was abandoned after" in hub.stderr
    assert error_lines(hub.stderr, "sej-hub") == ["sej-hub: error: 1 failures in 1 of 1 clients (see the log above)"]
    # The stuck read is the pass's read-ahead (sej.hub.batch), in the pass's own daemon thread: the
    # process exits (above) without waiting for it.


@pytest.mark.parametrize("once", [False, True])
def test_sigterm_stops_sej_hub_while_a_local_call_is_stuck(tmp_path: Path, src: Path, once: bool) -> None:
    conf = write_config(tmp_path / "hub.toml", tmp_path / "hub", [{"client_id": "c", "local_root": src}])
    hub = HubProcess([sys.executable, "-c", STUCK_HUB, "0", "--config", str(conf), *(["--once"] if once else [])])
    try:
        assert hub.wait_for("stuck in a read", 30, "stdout"), hub.stderr
        took = hub.stop(timeout=15)  # STALL_TIMEOUT is 300 s: only stopping can end this pass
    finally:
        hub.kill()
    assert took is not None, f"sej-hub did not exit within 15 s of SIGTERM:\n{hub.stderr}"
    assert "Traceback" not in hub.stderr
    assert "after stop; the pass was abandoned" in hub.stderr
    assert hub.p.returncode == (1 if once else 0), hub.stderr
    # The copy is consistent: the journals that were copied are whole prefixes, nothing was committed ahead.
    for name in journals(src):
        dest = tmp_path / "hub" / f"c.{name}"
        assert committed(src / name) <= (sej.next_offset(dest) if dest.exists() else 0)
