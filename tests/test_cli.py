"""The `sej` command-line tool: every command through click's CliRunner and through a real subprocess.

Journals are built with the library (fixed timestamps, so outputs are exact);
bad input of every kind must give one clear line on stderr, the right exit code
(0 fine, 1 problems, 2 usage) and never a traceback.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner, Result

import sej
import sej.apps.cli.segments  # the `sej` group imports a command's module when the command runs
from sej.apps.cli import progress as progress_mod
from sej.apps.cli.main import cli
from sej.frames import OVERHEAD
from sej.layout import index_path, segment_path
from sej.shard import format_shard
from sej.timestamps import TimeError, format_time, parse_time
from testing.timing import scaled, wait_until

from .conftest import popen_python, run_with_stderr_on_a_terminal

REPO = Path(__file__).resolve().parent.parent
T0 = 1712345678901234567  # 2024-04-05T19:34:38.901234567Z
MIN = 60 * 10**9
SEC = 10**9


# -- building journals --------------------------------------------------------------------------


def value_of(i: int) -> bytes:
    """Message i's value: msgpack for types 0 (i % 3 == 0), text otherwise."""
    return msgpack.packb({"n": i, "raw": b"\xff\x00"}) if i % 3 == 0 else b"value %d" % i


def make_journal(dir: str | Path, n: int = 12, reader: int | None = 5) -> str:
    """n messages, one a minute from T0, key k0/k1, type i % 3, in 200-byte segments; reader billing at `reader`."""
    dir = str(dir)
    with sej.Writer(dir, segment_size=200) as w:
        for i in range(n):
            w.append(value_of(i), key=b"k%d" % (i % 2), type=i % 3, timestamp=T0 + i * MIN)
    if reader is not None:
        with sej.Offset(dir, "billing") as o:
            o.commit(reader)
    return dir


def make_root(root: str | Path, n: int = 10) -> tuple[str, dict[str, list[int]]]:
    """A sharded root ev.1.000 / ev.1.001 with n messages, one a second from T0; shard name -> message numbers."""
    root = str(root)
    where: dict[str, list[int]] = {}
    with sej.ShardedWriter(root, "ev", shard_bit=1, segment_size=200) as sw:
        for i in range(n):
            shard, _offset = sw.append(b"v%d" % i, key=b"key%d" % i, type=i % 2, timestamp=T0 + i * SEC)
            where.setdefault(format_shard("ev", 1, shard), []).append(i)
    assert len(where) == 2, "both shards got messages"
    return root, where


@pytest.fixture
def jnl(tmp_path: Path) -> str:
    return make_journal(tmp_path / "j")


@pytest.fixture
def root(tmp_path: Path) -> tuple[str, dict[str, list[int]]]:
    return make_root(tmp_path / "root")


def segments(dir: str) -> list[sej.Segment]:
    return sej.list_segments(dir)


# -- running the tool ---------------------------------------------------------------------------


def run(*args: str, code: int = 0) -> Result:
    """Invoke through CliRunner; check the exit code and that no traceback leaked."""
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    if code != 0 or result.stderr:
        assert result.stderr.strip(), "a failure says why on stderr"
    return result


def one_error_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("sej: error: "), lines[0]
    return lines[0]


def sub(*args: str, code: int = 0, cwd: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `python -m sej.apps.cli ARGS` in a real subprocess; fail after scaled(timeout) seconds."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run(
        [sys.executable, "-m", "sej.apps.cli", *args], capture_output=True, text=True, env=env, cwd=cwd,
        timeout=scaled(timeout),
    )  # fmt: skip
    assert "Traceback" not in p.stderr + p.stdout, p.stderr
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    return p


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


# -- time arguments -----------------------------------------------------------------------------


def test_parse_time_forms() -> None:
    now = 1_700_000_000 * SEC
    assert parse_time("2024-04-05T19:34:38.901234567Z") == T0
    assert parse_time("2024-04-05T21:34:38.901234567+02:00") == T0
    assert parse_time("2024-04-05 19:34:38.901234567") == T0  # naive means UTC
    assert parse_time("2024-04-05T19:34:38Z") == T0 - 901234567
    assert parse_time("2024-04-05T19:34:38,5Z") == T0 - 401234567
    assert parse_time("2024-04-05") == 1712275200 * SEC
    assert parse_time(str(T0)) == T0
    assert parse_time("-45") == -45
    assert parse_time("now", now) == now
    assert parse_time("-2h", now) == now - 2 * 3600 * SEC
    assert parse_time("-30m", now) == now - 30 * MIN
    assert parse_time("-45s", now) == now - 45 * SEC
    assert parse_time("-7d", now) == now - 7 * 86400 * SEC
    assert parse_time("-1w", now) == now - 7 * 86400 * SEC
    assert parse_time("-1h30m", now) == now - 90 * MIN
    assert parse_time("+10m", now) == now + 10 * MIN
    before = time.time_ns()
    got = parse_time("now")
    assert before <= got <= time.time_ns()


@pytest.mark.parametrize(
    "bad",
    ["yesterday", "", "2h", "-2x", "2024-13-01", "2024-04-05T25:00Z", "1.5", "-h", "2024-04-05T19:34:38.1234567891Z"],
)
def test_parse_time_rejects_and_names_the_string(bad: str) -> None:
    with pytest.raises(TimeError) as e:
        parse_time(bad)
    assert repr(bad) in str(e.value)


def test_parse_time_rejects_out_of_range() -> None:
    with pytest.raises(TimeError, match="64-bit"):
        parse_time(str(2**63))
    with pytest.raises(TimeError, match="64-bit"):
        parse_time("3000-01-01")


def test_format_time() -> None:
    assert format_time(T0) == "2024-04-05T19:34:38.901234567Z"
    assert format_time(0) == "1970-01-01T00:00:00.000000000Z"
    assert format_time(-1) == "1969-12-31T23:59:59.999999999Z"
    assert format_time(None) is None
    assert parse_time(format_time(T0 + 7) or "") == T0 + 7


# -- scan and count -----------------------------------------------------------------------------


def test_scan_prints_every_message_as_json_lines(jnl: str) -> None:
    out = jsonl(run("scan", jnl).stdout)
    assert [m["offset"] for m in out] == list(range(12))
    m1 = out[1]
    assert m1 == {
        "offset": 1,
        "timestamp": T0 + MIN,
        "time": "2024-04-05T19:35:38.901234567Z",
        "type": 1,
        "key": "k1",
        "value": "value 1",
    }
    m0 = out[0]  # a msgpack value is not UTF-8: base64
    assert m0["value_encoding"] == "base64" and base64.b64decode(m0["value"]) == value_of(0)
    assert "key_encoding" not in m0 and "journal" not in m0


def test_scan_binary_key_and_missing_timestamp(tmp_path: Path) -> None:
    d = str(tmp_path / "b")
    with sej.Writer(d) as w:
        w.append(b"\x80\x81", key=b"\xfe", timestamp=sej.NO_TIMESTAMP)
    (m,) = jsonl(run("scan", d).stdout)
    assert m["timestamp"] is None and m["time"] is None
    assert m["key"] == base64.b64encode(b"\xfe").decode() and m["key_encoding"] == "base64"
    assert m["value"] == base64.b64encode(b"\x80\x81").decode() and m["value_encoding"] == "base64"
    assert run("scan", d, "--format", "hex").stdout == "0 - 0 fe 8081\n"


def test_scan_time_range_is_start_inclusive_end_exclusive(jnl: str) -> None:
    start = format_time(T0 + 3 * MIN) or ""
    end = format_time(T0 + 6 * MIN) or ""
    out = jsonl(run("scan", jnl, "--start", start, "--end", end).stdout)
    assert [m["offset"] for m in out] == [3, 4, 5]
    out = jsonl(run("scan", jnl, "--start", str(T0 + 3 * MIN + 1)).stdout)
    assert [m["offset"] for m in out] == list(range(4, 12))
    out = jsonl(run("scan", jnl, "--end", "2024-04-05T19:36:00Z").stdout)
    assert [m["offset"] for m in out] == [0, 1]
    assert run("scan", jnl, "--start", "now").stdout == ""
    assert run("scan", jnl, "--start", start, "--end", end, "--count").stdout == "3\n"
    assert run("count", jnl, "--start", start, "--end", end).stdout == "3\n"


def test_scan_end_before_start_is_a_usage_error(jnl: str) -> None:
    r = run("scan", jnl, "--start", "-1h", "--end", "-2h", code=2)
    assert "--end is before --start" in one_error_line(r)


def test_scan_from_offset_type_and_count(jnl: str) -> None:
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--from", "9").stdout)] == [9, 10, 11]
    assert run("scan", jnl, "--from", "12").stdout == ""
    out = jsonl(run("scan", jnl, "--type", "1").stdout)
    assert [m["offset"] for m in out] == [1, 4, 7, 10]
    out = jsonl(run("scan", jnl, "--type", "1", "--type", "2", "--from", "6").stdout)
    assert [m["offset"] for m in out] == [7, 8, 10, 11]
    assert run("count", jnl).stdout == "12\n"
    assert run("count", jnl, "--from", "4").stdout == "8\n"
    assert run("count", jnl, "--type", "0").stdout == "4\n"
    assert run("scan", jnl, "--type", "0", "--count").stdout == "4\n"


def test_scan_from_outside_the_journal_is_a_usage_error(jnl: str) -> None:
    r = run("scan", jnl, "--from", "13", code=2)
    assert "offset 13 is outside the journal, which holds offsets 0 to 11" in one_error_line(r)


def test_scan_formats_raw_hex_msgpack(jnl: str) -> None:
    raw = run("scan", jnl, "--format", "raw", "--from", "10").stdout_bytes
    assert raw == b"value 10\nvalue 11\n"
    hexed = run("scan", jnl, "--format", "hex", "--from", "11").stdout
    assert hexed == f"11 {T0 + 11 * MIN} 2 {b'k1'.hex()} {b'value 11'.hex()}\n"
    r = run("scan", jnl, "--format", "msgpack", "--type", "0")
    assert [m["value"] for m in jsonl(r.stdout)] == [
        {"n": i, "raw": base64.b64encode(b"\xff\x00").decode()} for i in (0, 3, 6, 9)
    ]


def test_scan_msgpack_reports_each_bad_value_keeps_going_and_exits_1(jnl: str) -> None:
    r = run("scan", jnl, "--format", "msgpack", "--from", "8", code=1)
    assert [m["offset"] for m in jsonl(r.stdout)] == [9]
    errors = r.stderr.strip().splitlines()
    assert len(errors) == 3  # offsets 8, 10, 11 are text
    assert errors[0].startswith("sej: error: offset 8: value is not msgpack (")


@pytest.mark.parametrize("where", ["first-segment", "last-segment"])
def test_count_fails_where_scan_fails_on_a_corrupt_frame(jnl: str, where: str) -> None:
    """`sej count` printed next - first and exited 0 on a journal with a corrupt frame, which `sej scan`
    reports at that offset: the commands must agree on what a corrupt journal is."""
    written = [s.path for s in segments(jnl) if os.path.getsize(s.path)]
    assert len(written) > 1
    seg = written[0 if where == "first-segment" else -1]
    data = bytearray(Path(seg).read_bytes())
    data[0] ^= 0x40  # the first frame's offset: out of sequence, not a torn tail
    Path(seg).write_bytes(bytes(data))
    scan = sub("scan", jnl, code=1)
    error = one_error_line(scan)
    assert seg in error and "offset out of sequence" in error
    for args in (["count"], ["scan", "--count"], ["count", "--from", "0"]):
        r = sub(*args[:1], jnl, *args[1:], code=1)
        assert r.stdout == "" and one_error_line(r) == error, (args, r.stdout, r.stderr)
    assert sub("count", jnl, "--type", "0", code=1).stderr.strip() == error


@pytest.mark.parametrize("damage", ["flip", "torn-finished-segment", "gap"])
def test_count_fails_where_scan_fails(jnl: str, damage: str) -> None:
    """Found by tests/test_fuzz.py: count (arithmetic) exited 0 on journals scan reports as corrupt."""
    segs = sej.list_segments(jnl)
    if damage == "flip":  # the offset field of a frame in the middle of a finished segment
        with open(segs[1].path, "r+b") as f:
            _, second = sej.decode(f.read())  # where the second frame starts
            f.seek(second + 5)
            f.write(b"\xff")
    elif damage == "torn-finished-segment":
        os.truncate(segs[1].path, os.path.getsize(segs[1].path) - 3)
    else:
        os.remove(segs[1].path)
    scan = run("scan", jnl, code=1)
    count = run("count", jnl, code=1)
    assert count.stdout == "" and count.stderr.startswith("sej: error: ")
    assert run("scan", jnl, "--count", code=1).stderr == count.stderr
    assert scan.stderr.split(":")[2] == count.stderr.split(":")[2]  # the same file


def test_scan_and_count_a_sharded_root(root: tuple[str, dict[str, list[int]]]) -> None:
    path, where = root
    out = jsonl(run("scan", path).stdout)
    assert [m["value"] for m in out] == [f"v{i}" for i in range(10)]  # merged by timestamp
    for m in out:
        i = int(m["value"][1:])
        assert m["journal"] in where and i in where[m["journal"]]
        assert m["offset"] == where[m["journal"]].index(i)
        assert m["timestamp"] == T0 + i * SEC
    assert run("count", path).stdout == "10\n"
    assert run("scan", path, "--count").stdout == "10\n"
    assert run("count", path, "--type", "1").stdout == "5\n"
    start = format_time(T0 + 4 * SEC) or ""
    assert [m["value"] for m in jsonl(run("scan", path, "--start", start).stdout)] == [f"v{i}" for i in range(4, 10)]
    # --from applies to each journal's own offsets
    expect = sorted(i for nums in where.values() for i in nums[2:])
    assert [int(m["value"][1:]) for m in jsonl(run("scan", path, "--from", "2").stdout)] == expect
    hexed = run("scan", path, "--format", "hex").stdout.splitlines()
    assert hexed[0].split()[0] in where and len(hexed) == 10


def test_progress_bar_only_when_enabled(
    root: tuple[str, dict[str, list[int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = root
    assert run("count", path, "--type", "1").stderr == ""  # stderr is not a terminal: quiet
    monkeypatch.setattr(progress_mod, "enabled", lambda needs_stdout_redirected=False: True)
    r = CliRunner().invoke(cli, ["count", path, "--type", "1"])
    assert r.exit_code == 0 and r.stdout == "5\n"
    assert "counting" in r.stderr  # click draws the bar on stderr


def test_progress_bar_on_a_real_terminal_and_quiet_when_piped(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j")
    p, drawn = run_with_stderr_on_a_terminal(["verify", d], timeout=scaled(30))
    assert p.returncode == 0 and b"no problems" in p.stdout
    assert b"verifying" in drawn and b"100%" in drawn
    assert sub("verify", d).stderr == ""  # piped: quiet


def test_scan_start_in_a_corrupt_segment_is_not_skipped_silently(jnl: str) -> None:
    """A corrupt region before the start time is an error, not a silent skip to a later segment."""
    seg = segments(jnl)[0].path
    data = bytearray(Path(seg).read_bytes())
    second = 26 + 2 + len(value_of(0))
    data[second + 17] = 0x80  # offsets 1..5 are unreadable
    Path(seg).write_bytes(bytes(data))
    for name in os.listdir(os.path.join(jnl, "idx")):
        os.remove(os.path.join(jnl, "idx", name))
    r = CliRunner().invoke(cli, ["scan", jnl, "--start", format_time(T0 + 3 * MIN) or ""])
    assert r.exit_code == 1 and seg in one_error_line(r)


# -- tail ---------------------------------------------------------------------------------------


def test_tail_last_n(jnl: str) -> None:
    assert [m["offset"] for m in jsonl(run("tail", jnl).stdout)] == list(range(2, 12))
    assert [m["value"] for m in jsonl(run("tail", jnl, "-n", "2").stdout)] == ["value 10", "value 11"]
    assert run("tail", jnl, "-n", "0").stdout == ""
    assert run("tail", jnl, "-n", "1", "--format", "raw").stdout == "value 11\n"


def test_tail_of_a_root_merges_each_journals_last_n(root: tuple[str, dict[str, list[int]]]) -> None:
    path, where = root
    out = jsonl(run("tail", path, "-n", "2").stdout)
    expect = sorted(i for nums in where.values() for i in nums[-2:])
    assert [int(m["value"][1:]) for m in out] == expect
    assert {m["journal"] for m in out} == set(where)


def test_tail_follow_of_a_root_is_refused(root: tuple[str, dict[str, list[int]]]) -> None:
    path, _ = root
    r = run("tail", path, "-f", code=2)
    assert "tail -f follows one journal" in one_error_line(r)


def default_sigint() -> None:
    """In the child: SIGINT as a terminal gives it. A test run started in the background (nohup, `&` in a
    script) ignores SIGINT, and an ignored signal stays ignored across exec, so Ctrl-C could never work."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_tail_follow_in_a_subprocess_until_ctrl_c(jnl: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
    p = subprocess.Popen(
        [sys.executable, "-m", "sej.apps.cli", "tail", jnl, "-n", "1", "-f", "--format", "hex"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=default_sigint,
    )  # fmt: skip
    try:
        assert p.stdout is not None
        assert p.stdout.readline().split()[0] == "11"
        with sej.Writer(jnl) as w:
            w.append(b"later", key=b"k", type=7, timestamp=T0 + 99 * MIN)
        assert p.stdout.readline() == f"12 {T0 + 99 * MIN} 7 6b {b'later'.hex()}\n"
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=scaled(20))
        except subprocess.TimeoutExpired:  # seen once under heavy load: show where it hangs
            p.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack to stderr
            _, err = p.communicate(timeout=scaled(10))
            pytest.fail(f"tail -f did not stop on SIGINT; its threads:\n{err}")
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in err and err.strip() == ""  # Ctrl-C: 130, as every command


def test_tail_follow_stops_on_sigint_whichever_thread_the_kernel_hands_it_to(jnl: str) -> None:
    """Found under load: SIGINT delivered to one of watchdog's threads did not wake the main thread,
    blocked without a timeout on the scanner's event, so `tail -f` ran on (the kernel picks the thread)."""
    import ctypes

    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "sej.apps.cli", "tail", jnl, "-n", "1", "-f"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=default_sigint)  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline()  # following now: the watch threads run

        def threads() -> list[int]:
            return [int(t) for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid]

        # watchdog's observer, inotify reader and emitter: the watch is in place, the main thread waits.
        wait_until(lambda: len(threads()) >= 3, scaled(20), "tail -f to start watching")
        tids = threads()
        assert tgkill(p.pid, tids[-1], signal.SIGINT) == 0
        _, err = p.communicate(timeout=scaled(20))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and err.strip() == ""


# -- offset and reset ---------------------------------------------------------------------------


def frame_bytes(path: str, start: int) -> int:
    """Bytes of the frames of messages `start` on, from what the Scanner reads."""
    with sej.Scanner(path, start, timeout=0) as s:
        return sum(OVERHEAD + len(m.key) + len(m.value) for m in s)


def test_offset_shows_first_next_and_reader_lag(jnl: str) -> None:
    text = run("offset", jnl).stdout.splitlines()
    assert text[0].split() == ["FIRST", "NEXT", "READER", "COMMITTED", "LAG", "LAG", "BYTES"]
    assert text[1].split() == ["0", "12", "billing", "5", "7", str(frame_bytes(jnl, 5))]
    rows = json.loads(run("offset", jnl, "--json").stdout)
    assert len(rows) == 1  # a journal is a list of one row, as a root is a list of rows
    doc = rows[0]
    assert doc["journal"] == "" and doc["path"] == jnl
    assert doc["first_offset"] == 0 and doc["next_offset"] == 12
    assert doc["readers"] == [{"name": "billing", "committed": 5, "lag": 7, "lag_bytes": frame_bytes(jnl, 5)}]


def test_offset_of_one_reader_sums_its_lag_over_a_root(tmp_path: Path) -> None:
    """What a Spark query's progress would show (offsets behind latest), from its reader offsets."""
    root = str(tmp_path / "root")
    with sej.ShardedWriter(root, "ev", shard_bit=2, segment_size=300) as w:  # several segments per journal
        for i in range(200):
            w.append(b"v" * (i % 13), key=b"k%d" % i)
    names = sorted(os.listdir(root))
    committed = {names[0]: 0, names[1]: 7, names[2]: 20}  # names[3]: never committed
    for name, at in committed.items():
        with sej.Offset(os.path.join(root, name), "spark-q") as o:
            o.commit(at)
    with sej.Offset(os.path.join(root, names[3]), "other") as o:
        o.commit(1)
    lags = {n: (sej.next_offset(os.path.join(root, n)) - at, frame_bytes(os.path.join(root, n), at))
            for n, at in committed.items()}  # fmt: skip
    rows = json.loads(run("offset", root, "--reader", "spark-q", "--json").stdout)
    assert [r["journal"] for r in rows] == names
    by = {j["journal"]: j["readers"] for j in rows}
    assert by[names[3]] == []  # only the reader asked for
    for n, (m, b) in lags.items():
        assert by[n] == [{"name": "spark-q", "committed": committed[n], "lag": m, "lag_bytes": b}]
    # The summary is the table's last line (JSON has the rows it sums up): 3 of 4 committed, min/avg/max.
    ms, bs = [m for m, _ in lags.values()], [b for _, b in lags.values()]
    last = run("offset", root, "--reader", "spark-q").stdout.splitlines()[-1]
    assert last == (f"reader spark-q: committed in 3 of 4 journals; lag min/avg/max {min(ms)}/{sum(ms) / 3:.1f}/"
                    f"{max(ms)} messages, {min(bs)}/{sum(bs) / 3:.0f}/{max(bs)} bytes")  # fmt: skip
    assert "--reader" in one_error_line(run("offset", root, "--reader", "../x", code=2))


def test_offset_of_a_root_and_a_corrupt_offset_file(root: tuple[str, dict[str, list[int]]]) -> None:
    path, where = root
    names = sorted(where)
    with sej.Offset(os.path.join(path, names[0]), "audit") as o:
        o.commit(1)
    rows = json.loads(run("offset", path, "--json").stdout)
    assert [r["journal"] for r in rows] == names
    by = {j["journal"]: j for j in rows}
    lag_bytes = frame_bytes(os.path.join(path, names[0]), 1)
    assert by[names[0]]["readers"] == [
        {"name": "audit", "committed": 1, "lag": len(where[names[0]]) - 1, "lag_bytes": lag_bytes}
    ]
    assert by[names[1]]["readers"] == [] and by[names[1]]["next_offset"] == len(where[names[1]])
    rows = [line.split() for line in run("offset", path).stdout.splitlines()]
    assert rows[1] == [
        names[0],
        "0",
        str(len(where[names[0]])),
        "audit",
        "1",
        str(len(where[names[0]]) - 1),
        str(lag_bytes),
    ]
    Path(path, names[0], "ofs", "audit.ofs").write_bytes(b"\x01\x02\x03")
    r = run("offset", path, code=1)
    assert "audit.ofs" in one_error_line(r) and "not 8" in r.stderr


def test_offset_and_stat_report_a_fifo_reader_instead_of_hanging(jnl: str) -> None:
    """A FIFO in ofs/ hung every command that reads the readers' offsets in open()."""
    fifo = os.path.join(jnl, "ofs", "spark.ofs")
    os.mkfifo(fifo)
    r = sub("offset", jnl, code=1, timeout=60)
    assert f"reader spark: {fifo} is a FIFO, not a regular file: refusing to open it" in r.stderr, r.stderr
    assert "billing" in r.stdout  # the other readers are still listed
    r = sub("stat", jnl, timeout=60)  # stat lists an unreadable reader as having committed nothing (as before)
    assert "billing (lag 7), spark (none committed)" in r.stdout


def test_reset_dry_run_changes_nothing(jnl: str) -> None:
    r = run("reset", jnl, "--reader", "billing", "--offset", "2")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["READER", "CURRENT", "NEW", "LAG"]
    assert lines[1].split() == ["billing", "5", "2", "10"]
    assert "dry run" in r.stdout
    assert sej.offset.read_offset_file(os.path.join(jnl, "ofs", "billing.ofs")) == 5


def test_reset_commits_with_yes_by_offset_and_by_time(jnl: str) -> None:
    ofs = os.path.join(jnl, "ofs", "billing.ofs")
    run("reset", jnl, "--reader", "billing", "--offset", "2", "--yes")
    assert sej.offset.read_offset_file(ofs) == 2
    r = run("reset", jnl, "--reader", "billing", "--time", format_time(T0 + 7 * MIN) or "", "--yes")
    assert r.stdout.splitlines()[1].split() == ["billing", "2", "7", "5"]
    assert sej.offset.read_offset_file(ofs) == 7
    run("reset", jnl, "--reader", "newreader", "--offset", "12", "--yes")  # a new reader may be created
    assert sej.offset.read_offset_file(os.path.join(jnl, "ofs", "newreader.ofs")) == 12


def test_reset_bad_input(jnl: str) -> None:
    assert "exactly one of" in one_error_line(run("reset", jnl, "--reader", "billing", code=2))
    r = run("reset", jnl, "--reader", "billing", "--offset", "1", "--time", "now", code=2)
    assert "exactly one of" in one_error_line(r)
    assert "outside" in one_error_line(run("reset", jnl, "--reader", "billing", "--offset", "13", code=2))
    assert "reader name" in one_error_line(run("reset", jnl, "--reader", "no/way", "--offset", "1", code=2))
    assert "'soon'" in one_error_line(run("reset", jnl, "--reader", "billing", "--time", "soon", code=2))


def test_reset_of_a_reader_in_use_fails_and_changes_nothing(jnl: str) -> None:
    with sej.Offset(jnl, "billing"):
        r = run("reset", jnl, "--reader", "billing", "--offset", "1", "--yes", code=1)
    assert "in use" in one_error_line(r) and "billing.lck" in r.stderr
    assert sej.offset.read_offset_file(os.path.join(jnl, "ofs", "billing.ofs")) == 5


def test_reset_by_time_on_a_root(root: tuple[str, dict[str, list[int]]]) -> None:
    path, where = root
    run("reset", path, "--reader", "r1", "--time", format_time(T0 + 5 * SEC) or "", "--yes")
    for name, nums in where.items():
        got = sej.offset.read_offset_file(os.path.join(path, name, "ofs", "r1.ofs"))
        assert got == len([i for i in nums if i < 5])
    r = run("reset", path, "--reader", "r1", "--offset", "0", code=2)
    assert "--offset needs one journal" in one_error_line(r)


# -- old ----------------------------------------------------------------------------------------


def age(path: str, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(path, (t, t))


def test_old_lists_passed_old_segments_and_deletes_only_with_delete(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j", reader=12)
    segs = segments(d)
    assert [s.first_offset for s in segs] == [0, 6, 12]
    for s in segs:
        age(s.path, 10)
    r = run("old", d, "--days", "5")
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["SEGMENT", "FIRST", "LAST", "AGE", "BYTES"]
    assert [row[:3] for row in rows[1:3]] == [["0000000000000000.jnl", "0", "5"], ["0000000000000006.jnl", "6", "11"]]
    assert " ".join(rows[3]).endswith("bytes; add --delete to delete them") and len(rows) == 4  # never the last
    assert len(segments(d)) == 3
    assert "no segment" in run("old", d, "--days", "11").stdout
    r = run("old", d, "--days", "5", "--delete")
    assert "deleted 2 segments" in r.stdout
    assert [s.first_offset for s in segments(d)] == [12]
    assert not os.path.exists(index_path(d, 0)) and not os.path.exists(index_path(d, 6))
    assert sej.first_offset(d) == 12 and sej.next_offset(d) == 12


def test_old_needs_every_reader_past_and_never_leaves_a_gap(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j", reader=12)
    with sej.Offset(d, "slow") as o:
        o.commit(6)
    for s in segments(d):
        age(s.path, 10)
    rows = run("old", d, "--days", "1").stdout.splitlines()
    assert len(rows) == 3 and rows[1].split()[0] == "0000000000000000.jnl"  # slow has passed segment 0 only
    with sej.Offset(d, "slow") as o:
        o.commit(12)
    age(segment_path(d, 0), 0)  # the oldest segment is recent: the later one must stay too
    assert "no segment" in run("old", d, "--days", "1", "--delete").stdout
    assert len(segments(d)) == 3


def test_old_delete_waits_for_no_retention_run_and_deletes_nothing_while_one_holds_the_lock(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j", reader=12)
    for s in segments(d):
        age(s.path, 10)
    holder = popen_python(  # holds the lock until its input ends
        "import sys; from sej.retention import lock_retention; held = lock_retention(sys.argv[1]); "
        "print('locked', flush=True); sys.stdin.read()",
        d,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        r = run("old", d, "--days", "5", "--delete", code=1)
        assert "retention.lck" in one_error_line(r) and "another process" in one_error_line(r)
        # the lock is a retention run's, not a writer's or a reader's (issue 38)
        assert "another retention run" in one_error_line(r) and "writer" not in one_error_line(r)
        assert [s.first_offset for s in segments(d)] == [0, 6, 12]
        assert holder.poll() is None, "the lock holder was still there"
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()  # type: ignore[union-attr]
        holder.stdout.close()  # type: ignore[union-attr]
    assert "deleted 2 segments" in run("old", d, "--days", "5", "--delete").stdout
    assert [s.first_offset for s in segments(d)] == [12]


def test_old_without_readers_counts_nothing_as_passed(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j", reader=None)
    for s in segments(d):
        age(s.path, 10)
    r = run("old", d, "--days", "0", "--delete")
    assert "no readers, so no segment counts as passed" in r.stdout
    assert len(segments(d)) == 3


# -- file and dump ------------------------------------------------------------------------------


def test_file_first_and_last(jnl: str) -> None:
    seg = segments(jnl)[1].path
    lines = dict(line.split(None, 1) for line in run("file", seg).stdout.replace("first ", "first_").replace(
        "last ", "last_").splitlines())  # fmt: skip
    assert lines["messages"] == "6"
    assert lines["first_offset"] == "6" and lines["last_offset"] == "11"
    assert lines["last_timestamp"] == f"{T0 + 11 * MIN} (2024-04-05T19:45:38.901234567Z)"
    doc = json.loads(run("file", seg, "--json").stdout)
    assert doc["first_offset"] == 6 and doc["last_offset"] == 11 and doc["messages"] == 6
    assert doc["first_timestamp"] == T0 + 6 * MIN and doc["bytes"] == os.path.getsize(seg)
    assert json.loads(run("file", segments(jnl)[2].path, "--json").stdout)["messages"] == 0  # empty last segment


def test_file_finds_the_last_frame_through_the_trailing_size(jnl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = sej.apps.cli.segments.read_messages

    def spy(fd: int, pos: int, offset: int, size: int, limit: int = 1 << 62) -> Any:
        calls.append(limit)
        return real(fd, pos, offset, size, limit)

    monkeypatch.setattr(sej.apps.cli.segments, "read_messages", spy)
    run("file", segments(jnl)[0].path)
    assert calls == [1]  # only the first frame is decoded forward


def test_file_with_a_torn_tail_is_an_error(jnl: str) -> None:
    seg = segments(jnl)[1].path
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00")
    r = run("file", seg, code=1)
    assert seg in one_error_line(r) and "trailing size field" in r.stderr


def test_dump_prints_every_message_and_stops(jnl: str) -> None:
    seg = segments(jnl)[1].path
    out = jsonl(run("dump", seg).stdout)
    assert [m["offset"] for m in out] == list(range(6, 12))
    assert out[0]["position"] == 0
    size0 = 26 + 2 + len(value_of(6))
    assert out[1]["position"] == size0
    assert out[-1]["value"] == "value 11"
    assert run("dump", segments(jnl)[2].path).stdout == ""  # the empty last segment


def test_dump_of_a_copy_takes_the_first_offset_from_the_frame(jnl: str, tmp_path: Path) -> None:
    copy = tmp_path / "copy.bin"
    shutil.copy(segments(jnl)[1].path, copy)
    assert [m["offset"] for m in jsonl(run("dump", str(copy)).stdout)] == list(range(6, 12))


def test_dump_of_a_corrupt_segment_prints_what_decoded_then_one_error(jnl: str) -> None:
    seg = segments(jnl)[1].path
    data = bytearray(Path(seg).read_bytes())
    second = 26 + 2 + len(value_of(6))
    third = second + 26 + 2 + len(b"value 7")
    data[third - 1] ^= 0xFF  # the second frame's size field
    Path(seg).write_bytes(bytes(data))
    r = run("dump", seg, code=1)
    assert [m["offset"] for m in jsonl(r.stdout)] == [6]
    line = one_error_line(r)
    assert seg in line and f"at byte {second}" in line and "size field disagrees" in line


def test_dump_of_a_misnamed_segment_is_corrupt(jnl: str, tmp_path: Path) -> None:
    named = str(tmp_path / "0000000000000005.jnl")
    shutil.copy(segments(jnl)[1].path, named)
    r = run("dump", named, code=1)
    assert "found 6, expected 5" in one_error_line(r) and "at byte 0" in r.stderr


def test_dump_and_file_of_something_that_is_not_a_segment(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a journal segment at all\n")
    for cmd in ("dump", "file"):
        assert "is not a segment file" in one_error_line(run(cmd, str(text), code=2))
        assert "does not exist" in one_error_line(run(cmd, str(tmp_path / "nope.jnl"), code=2))
        assert "is a directory" in one_error_line(run(cmd, str(tmp_path), code=2))


# -- verify -------------------------------------------------------------------------------------


def test_verify_a_good_journal_and_root(jnl: str, root: tuple[str, dict[str, list[int]]]) -> None:
    r = run("verify", jnl)
    size = sum(os.path.getsize(s.path) for s in segments(jnl))
    assert r.stdout == f"verified 1 journal, 3 segments, 12 messages, {size} bytes: no problems\n"
    assert "verified 2 journals" in run("verify", root[0]).stdout


def test_verify_reports_every_problem_with_file_and_byte(jnl: str) -> None:
    seg = segments(jnl)[0].path
    data = bytearray(Path(seg).read_bytes())
    second = 26 + 2 + len(value_of(0))
    data[second + 17] = 0x80  # negative key size in the second frame
    Path(seg).write_bytes(bytes(data))
    # and a gap: rename the next segment
    s1 = segments(jnl)[1].path
    os.rename(s1, segment_path(jnl, 7))
    r = run("verify", jnl, code=1)
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{seg}: byte {second}: negative key size -128")
    # the damaged bytes also disagree with their checksum (the block holding them, with its messages)
    assert lines[1].startswith(f"{seg}: byte 0: checksum mismatch (bytes 0..")
    assert lines[2].startswith(
        f"{segment_path(jnl, 7)}: byte 0: the first frame has offset 6, but the file name says 7"
    )
    # the renamed segment has no checksum file under its new name
    assert lines[3].startswith(f"unchecked: {segment_path(jnl, 7)}: bytes 0..")
    assert lines[-2].endswith("3 problems")
    assert "3 problems" in one_error_line(r)


def test_verify_finds_a_gap_between_segments(jnl: str) -> None:
    last = segments(jnl)[2].path
    os.rename(last, segment_path(jnl, 13))
    r = run("verify", jnl, code=1)
    assert f"{segment_path(jnl, 13)}: byte 0: gap: the segment starts at offset 13" in r.stdout


def test_verify_repair_cuts_a_torn_tail_like_the_writer(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j", n=8)
    last = segments(d)[-1].path
    good = os.path.getsize(last)
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x08garbage")
    r = run("verify", d, code=1)
    assert f"{last}: byte {good}: incomplete frame" in r.stdout and "torn tail" in r.stdout
    r = run("verify", d, "--repair")
    assert f"repaired: {last}: cut 15 bytes from byte {good}, kept in {last}.cut-{good}-" in r.stdout
    assert os.path.getsize(last) == good
    (cut,) = [p for p in os.listdir(os.path.dirname(last)) if ".cut-" in p]
    assert Path(os.path.dirname(last), cut).read_bytes() == b"\x00\x00\x00\x00\x00\x00\x00\x08garbage"
    r = run("verify", d)
    assert "no problems" in r.stdout and "cut by an earlier recovery" in r.stdout
    with sej.Writer(d) as w:  # the writer finds nothing more to cut
        assert w.recovered is None and w.append(b"x") == 8


def test_verify_repair_leaves_problems_outside_the_last_segment(jnl: str) -> None:
    seg = segments(jnl)[0].path
    data = bytearray(Path(seg).read_bytes())
    data[-1] ^= 1
    Path(seg).write_bytes(bytes(data))
    before = Path(seg).read_bytes()
    r = run("verify", jnl, "--repair", code=1)
    assert "size field disagrees" in r.stdout and "0 repaired" in r.stdout
    assert "not repaired" in one_error_line(r)
    assert Path(seg).read_bytes() == before


def test_verify_repair_with_a_running_writer_fails(jnl: str) -> None:
    with sej.Writer(jnl):
        r = run("verify", jnl, "--repair", code=1)
        assert "a writer holds its lock" in one_error_line(r)
        assert "no problems" in run("verify", jnl).stdout  # verifying alone is fine


def test_verify_notes_an_incomplete_frame_while_a_writer_runs(jnl: str) -> None:
    with sej.Writer(jnl):
        last = segments(jnl)[-1].path
        with open(last, "ab") as f:
            f.write(b"\x00\x00")  # as if the writer were halfway through a frame
        r = run("verify", jnl)
        assert "no problems" in r.stdout and "a writer holds the lock" in r.stdout


# -- stat ---------------------------------------------------------------------------------------


def test_stat_of_a_journal(jnl: str) -> None:
    lines = run("stat", jnl).stdout.splitlines()
    got = {line[:12].strip(): line[12:].strip() for line in lines}
    size = sum(os.path.getsize(s.path) for s in segments(jnl))
    assert got["segments"] == "3" and got["messages"] == "12" and got["bytes"] == f"{size} ({size} B)"
    assert got["first offset"] == "0" and got["next offset"] == "12"
    assert got["first time"] == "2024-04-05T19:34:38.901234567Z"
    assert got["last time"] == "2024-04-05T19:45:38.901234567Z"
    assert got["readers"] == "billing (lag 7)"
    doc = json.loads(run("stat", jnl, "--json").stdout)
    assert doc["first_timestamp"] == T0 and doc["last_timestamp"] == T0 + 11 * MIN and doc["segments"] == 3


def test_stat_of_a_root_has_totals(root: tuple[str, dict[str, list[int]]]) -> None:
    path, where = root
    doc = json.loads(run("stat", path, "--json").stdout)
    by = {j["journal"]: j for j in doc["journals"]}
    assert set(by) == set(where)
    for name, nums in where.items():
        assert by[name]["messages"] == len(nums)
        assert by[name]["first_timestamp"] == T0 + nums[0] * SEC and by[name]["last_timestamp"] == T0 + nums[-1] * SEC
    assert doc["total"]["messages"] == 10 and doc["total"]["journals"] == 2
    assert doc["total"]["first_timestamp"] == T0 and doc["total"]["last_timestamp"] == T0 + 9 * SEC
    rows = [line.split() for line in run("stat", path).stdout.splitlines()]
    assert rows[0][:4] == ["JOURNAL", "SEGMENTS", "BYTES", "MESSAGES"]
    assert rows[-1][0] == "TOTAL" and rows[-1][3] == "10"


def test_stat_of_an_empty_journal(tmp_path: Path) -> None:
    d = str(tmp_path / "e")
    sej.Writer(d).close()
    doc = json.loads(run("stat", d, "--json").stdout)
    assert doc["messages"] == 0 and doc["first_timestamp"] is None and doc["segments"] == 1


# -- hub status ---------------------------------------------------------------------------------


def test_hub_status_fails_where_there_is_no_hub(tmp_path: Path, jnl: str) -> None:
    """A health check pointed at the wrong directory must fail, not print an empty table and exit 0."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for where, code, says in [
        (empty, 2, f"{empty} is not a hub root: no records of sej-hub in {empty}/.sej-hub/ and no journals"),
        (tmp_path / "nope", 2, f"{tmp_path / 'nope'} does not exist"),
    ]:
        r = run("hub", "status", str(where), "--max-age", "60", "--max-lag", "0", code=code)
        assert says in one_error_line(r) and r.stdout == "", r.stdout
        p = sub("hub", "status", str(where), "--max-age", "60", "--max-lag", "0", code=code)
        assert says in one_error_line(p)
    (empty / ".sej-hub").mkdir()  # sej-hub ran there, but keeps no client (none configured any more)
    r = run("hub", "status", str(empty), code=1)
    assert f"no client at {empty}" in one_error_line(r)
    # a hub root with a copied journal and no record yet is a hub (sej copy writes no record)
    hub = tmp_path / "hub"
    hub.mkdir()
    shutil.copytree(jnl, hub / "edge-1.ev")
    r = run("hub", "status", str(hub))
    assert "edge-1" in r.stdout and "ev" in r.stdout


# -- errors common to the commands --------------------------------------------------------------

DIR_COMMANDS = [
    ["scan"], ["count"], ["tail"], ["offset"], ["reset", "--reader", "r", "--offset", "0"],
    ["old", "--days", "1"], ["verify"], ["stat"],
]  # fmt: skip


@pytest.mark.parametrize("cmd", DIR_COMMANDS, ids=lambda c: c[0])
def test_missing_directory_and_not_a_journal(cmd: list[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "x" / "jnl")
    r = run(cmd[0], missing, *cmd[1:], code=2)
    assert one_error_line(r) == f"sej: error: {missing} does not exist"
    r = run(cmd[0], str(tmp_path), *cmd[1:], code=2)
    assert f"{tmp_path} is not a journal" in one_error_line(r)
    f = tmp_path / "file"
    f.write_text("x")
    assert "is not a directory" in one_error_line(run(cmd[0], str(f), *cmd[1:], code=2))


@pytest.mark.parametrize("cmd", [["scan", "--start"], ["scan", "--end"], ["count", "--start"]])
def test_bad_time_strings(cmd: list[str], jnl: str) -> None:
    r = run(cmd[0], jnl, cmd[1], "2024-02-30T10:00Z", code=2)
    line = one_error_line(r)
    assert "'2024-02-30T10:00Z' is not a time" in line and cmd[1] in line


@pytest.mark.parametrize("cmd", [["scan"], ["count", "--type", "1"], ["tail"], ["stat"]], ids=lambda c: c[0])
def test_a_corrupt_segment_is_one_error_line_with_exit_1(cmd: list[str], jnl: str) -> None:
    seg = segments(jnl)[1].path
    data = bytearray(Path(seg).read_bytes())
    data[-1] ^= 1  # the last frame's size field: forward and backward readers both trip on it
    Path(seg).write_bytes(bytes(data))
    r = CliRunner().invoke(cli, [cmd[0], jnl, *cmd[1:]])
    assert r.exit_code == 1 and "Traceback" not in r.output
    line = one_error_line(r)
    assert seg in line and "at byte" in line


def test_usage_errors_from_click_are_one_line(jnl: str) -> None:
    assert "No such option" in one_error_line(run("scan", jnl, "--bogus", code=2))
    assert "No such command" in one_error_line(run("frobnicate", code=2))
    assert "Missing option '--days'" in one_error_line(run("old", jnl, code=2))
    assert "'yaml'" in one_error_line(run("scan", jnl, "--format", "yaml", code=2))
    r = run(code=2)
    assert "Usage:" in r.stdout and "no command given" in one_error_line(r)  # no command: the help


def test_unexpected_errors_are_one_line_unless_debug(jnl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*a: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("sej.apps.cli.maintenance.journal_stat", broken)
    r = run("stat", jnl, code=1)
    assert "internal error: RuntimeError: boom" in one_error_line(r) and "--debug" in r.stderr
    r = CliRunner().invoke(cli, ["--debug", "stat", jnl])
    assert isinstance(r.exception, RuntimeError)  # propagates: the traceback is shown


# -- real subprocesses: every command, good and bad input ------------------------------------------


def test_subprocess_every_command(tmp_path: Path) -> None:
    d = make_journal(tmp_path / "j")
    path, where = make_root(tmp_path / "root")
    seg = segments(d)[0].path
    assert len(jsonl(sub("scan", d).stdout)) == 12
    assert sub("scan", path, "--count").stdout == "10\n"
    assert sub("count", d, "--type", "2").stdout == "4\n"
    assert [m["offset"] for m in jsonl(sub("tail", d, "-n", "3").stdout)] == [9, 10, 11]
    assert sub("offset", d).stdout.splitlines()[1].split() == ["0", "12", "billing", "5", "7", str(frame_bytes(d, 5))]
    assert [r["journal"] for r in json.loads(sub("offset", path, "--json").stdout)] == sorted(where)
    assert "dry run" in sub("reset", d, "--reader", "billing", "--offset", "0").stdout
    assert "no segment" in sub("old", d, "--days", "1").stdout
    assert len(jsonl(sub("dump", seg).stdout)) == 6
    assert json.loads(sub("file", seg, "--json").stdout)["last_offset"] == 5
    assert "no problems" in sub("verify", d).stdout
    assert json.loads(sub("stat", path, "--json").stdout)["total"]["messages"] == 10
    assert sub("--version").stdout.strip().endswith(sej.__version__)


@pytest.mark.parametrize(
    "args, code, expect",
    [
        (["scan", "{missing}"], 2, "{missing} does not exist"),
        (["count", "{missing}"], 2, "{missing} does not exist"),
        (["tail", "{missing}"], 2, "{missing} does not exist"),
        (["offset", "{tmp}"], 2, "is not a journal"),
        (["stat", "{tmp}"], 2, "is not a journal"),
        (["old", "{notes}", "--days", "1"], 2, "is not a directory"),
        (["verify", "{corrupt}"], 1, "problem"),
        (["scan", "{corrupt}"], 1, "size field disagrees"),
        (["dump", "{corrupt_seg}"], 1, "size field disagrees"),
        (["file", "{notes}"], 2, "is not a segment file"),
        (["scan", "{good}", "--start", "tomorrow"], 2, "'tomorrow' is not a time"),
        (["reset", "{good}", "--reader", "billing", "--time", "-2x"], 2, "'-2x' is not a time"),
        (["reset", "{good}", "--reader", "billing", "--offset", "1", "--yes"], 1, "in use"),
        (["verify", "{good}", "--repair"], 1, "a writer holds its lock"),
        (["tail", "{root}", "-f"], 2, "tail -f follows one journal"),
    ],
)
def test_subprocess_bad_input(tmp_path: Path, args: list[str], code: int, expect: str) -> None:
    good = make_journal(tmp_path / "good")
    corrupt = make_journal(tmp_path / "corrupt")
    corrupt_seg = segments(corrupt)[0].path
    data = bytearray(Path(corrupt_seg).read_bytes())
    data[-1] ^= 1
    Path(corrupt_seg).write_bytes(bytes(data))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a journal\n")
    root, _ = make_root(tmp_path / "root")
    names = {"missing": str(tmp_path / "x" / "jnl"), "tmp": str(tmp_path / "root" / "ev.1.000" / "ofs"),
             "notes": str(notes), "corrupt": corrupt, "corrupt_seg": corrupt_seg, "good": good,
             "root": root}  # fmt: skip
    os.makedirs(names["tmp"], exist_ok=True)
    argv = [a.format(**names) for a in args]
    helper = None
    if "--yes" in args or "--repair" in args:  # hold the lock in another process
        what = "sej.Offset(sys.argv[1], 'billing')" if "--yes" in args else "sej.Writer(sys.argv[1])"
        code_ = f"import sys, sej\nh = {what}\nprint('ready', flush=True)\nsys.stdin.read()"
        env = dict(os.environ, PYTHONPATH=str(REPO))
        helper = subprocess.Popen([sys.executable, "-c", code_, good], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)  # fmt: skip
        assert helper.stdout is not None and helper.stdout.readline() == "ready\n"
    try:
        p = sub(*argv, code=code)
    finally:
        if helper is not None:
            helper.communicate("", timeout=scaled(10))
    line = one_error_line(p) if "problem" not in expect else p.stderr.strip().splitlines()[-1]
    assert expect.format(**names) in line, line


def test_subprocess_closed_stdout_pipe_exits_quietly(tmp_path: Path) -> None:
    d = str(tmp_path / "big")
    with sej.Writer(d) as w:
        w.append_many([b"x" * 200] * 3000)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "sej.apps.cli", "scan", d], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert p.stdout is not None and p.stderr is not None
    assert json.loads(p.stdout.readline())["offset"] == 0
    p.stdout.close()  # like `| head -1`
    err = p.stderr.read().decode()
    assert p.wait(timeout=scaled(20)) == 0
    assert err == ""


def test_console_script_is_declared_and_installed() -> None:
    cfg = (REPO / "setup.cfg").read_text()
    assert "sej = sej.apps.entry:sej" in cfg and "sej-pipeline = sej.apps.entry:pipeline" in cfg
    script = shutil.which("sej")
    if script is None:
        pytest.skip("the sej script is not installed (pip install -e .)")
    p = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=scaled(30))
    assert p.returncode == 0 and sej.__version__ in p.stdout


# Run `sej ARGS` in a fresh interpreter, then name the heavy modules it imported on the way.
IMPORTS = r"""
import sys
from sej.apps.cli.main import cli
code = cli.main(sys.argv[1:], prog_name="sej", standalone_mode=False)
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"paramiko", "cryptography", "pyspark", "pyarrow", "py4j"})
print("exit", code, "heavy", *heavy, file=sys.stderr)
"""


def test_commands_import_paramiko_and_spark_only_when_they_need_them(jnl: str, tmp_path: Path) -> None:
    """paramiko loads only for an ssh:// location, PySpark and PyArrow only in Spark commands (none in sej)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for args in (["--version"], ["scan", jnl], ["stat", jnl], ["copy", jnl, str(tmp_path / "hub")]):
        p = subprocess.run([sys.executable, "-c", IMPORTS, *args], capture_output=True, text=True, env=env,
                           timeout=60)  # fmt: skip
        assert p.stderr.splitlines()[-1] == "exit 0 heavy", (args, p.stderr)
