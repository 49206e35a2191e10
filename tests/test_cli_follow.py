"""The kcat and kafka-consumer-groups moves of `sej`: scan -c/-f/--from/--reader, reset --to-*/--shift-by,
offset --json, and Ctrl-C at any moment of start-up.

Following and signals are tested with real processes of the installed `sej` console script: their
output is read line by line with a bounded deadline (`Child`), and every wait is for an event (a line,
an exit), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

import sej
from sej.offset import read_offset_file
from sej.shard import format_shard
from testing.timing import scaled

from .conftest import IN_CI
from .test_cli import MIN, REPO, T0, default_sigint, jsonl, make_journal, make_root, one_error_line, run


def ofs(journal: str, reader: str) -> int | None:
    return read_offset_file(os.path.join(journal, "ofs", f"{reader}.ofs"))


def sej_script() -> str:
    """The installed `sej` console script (pip's wrapper beside this interpreter), as a user runs it."""
    script = Path(sys.executable).parent / "sej"
    if script.is_file():
        return str(script)
    found = shutil.which("sej")
    if found is None:
        if IN_CI:
            pytest.fail("the sej console script is not installed (python3 -m pip install -e .)")
        pytest.skip("the sej console script is not installed (python3 -m pip install -e .)")
    return found


class Child:
    """A `sej` process whose stdout and stderr lines are read by threads, to be waited for with deadlines."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(
            [sej_script(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})), preexec_fn=default_sigint,
        )  # fmt: skip
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        self.err_seen = threading.Condition()
        assert self.p.stdout is not None and self.p.stderr is not None
        self.threads = [
            threading.Thread(target=self._read, args=(self.p.stdout, self.out.put), daemon=True),
            threading.Thread(target=self._read, args=(self.p.stderr, self._add_err), daemon=True),
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(stream: IO[str], put: Callable[[str | None], None]) -> None:
        for line in stream:
            put(line)
        put(None)

    def _add_err(self, line: str | None) -> None:
        with self.err_seen:
            if line is not None:
                self.err.append(line)
            self.err_seen.notify_all()

    def line(self, timeout: float | None = None) -> str:
        """The next stdout line; fails after `timeout` (default scaled(20)) seconds or at the end of stdout."""
        try:
            line = self.out.get(timeout=scaled(20) if timeout is None else timeout)
        except queue.Empty:
            raise AssertionError(f"no line within the deadline; stderr: {''.join(self.err)[-2000:]}") from None
        assert line is not None, f"stdout ended (exit {self.p.wait(scaled(20))}); stderr: {''.join(self.err)}"
        return line

    def lines(self, n: int) -> list[str]:
        return [self.line() for _ in range(n)]

    def wait_err(self, pred: Callable[[str], bool], timeout: float) -> float:
        """Wait for a stderr line for which pred(line) holds; the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        with self.err_seen:
            seen = 0
            while True:
                for line in self.err[seen:]:
                    if pred(line):
                        return time.monotonic()
                seen = len(self.err)
                left = deadline - time.monotonic()
                assert left > 0, f"no such stderr line within {timeout:g} s: {''.join(self.err)[-2000:]}"
                self.err_seen.wait(left)

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, list[str], str]:
        """Send `sig`; the exit code, the stdout lines not read yet, and all of stderr."""
        self.p.send_signal(sig)
        code = self.p.wait(scaled(30))
        for t in self.threads:
            t.join(scaled(10))
        rest = []
        while (line := self.out.get_nowait()) is not None:
            rest.append(line)
        return code, rest, "".join(self.err)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def hex_fields(line: str) -> list[str]:
    return line.split()


# -- Ctrl-C at any moment of start-up ----------------------------------------------------------------


def is_entry_import(line: str) -> bool:
    """The line PYTHONPROFILEIMPORTTIME writes once sej.apps.entry (the console script's module) has run."""
    return line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "sej.apps.entry"


def test_ctrl_c_at_any_moment_of_start_up_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """SIGINT at moments spread over the start-up of `sej scan -f` (the time it takes here to load the
    program and print its first line, measured first) and a little past it, into the follow.

    What is asserted: exit 130 and nothing on stderr but Python's import-time lines and click's blank line,
    every time. The moments count from the line PYTHONPROFILEIMPORTTIME writes when sej.apps.entry, the
    module pip's wrapper imports first, has run: before it, Python handles SIGINT itself, as it does for
    every program (killed by the signal until it installs its handler, -2 here; then a KeyboardInterrupt
    traceback while its site module, the environment's .pth files and the wrapper's own import run: some
    20 ms here, most of it .pth files of this environment). So the test does not send SIGINT there: no
    exit code or output could be asserted of the program, and under load the window is wider.
    """
    jnl = make_journal(tmp_path / "j", n=1, reader=None)
    timing = {"PYTHONPROFILEIMPORTTIME": "1"}

    def started(child: Child) -> float:
        return child.wait_err(is_entry_import, scaled(30))

    with Child("scan", "-f", "--format", "hex", jnl, env=timing) as c:
        t0 = started(c)
        assert hex_fields(c.line())[0] == "0"
        start_up = time.monotonic() - t0  # loading the program and printing the first line, on this machine now
        code, _, err = c.stop()
    assert code == 130 and "Traceback" not in err, err
    moments = [start_up * 1.25 * k / 11 for k in range(12)]  # across the start-up, the last ones into the follow
    for at in moments:
        with Child("scan", "-f", "--format", "hex", jnl, env=timing) as c:
            t0 = started(c)
            time.sleep(max(0.0, t0 + at - time.monotonic()))  # not a synchronisation: the moment to interrupt
            code, _, err = c.stop()
        others = [line for line in err.splitlines() if not line.startswith("import time:")]
        assert code == 130 and "Traceback" not in err and "".join(others).strip() == "", (at, start_up, code, others)


@pytest.mark.parametrize(("raised", "code"), [("KeyboardInterrupt()", 130), ("SystemExit(130)", 130),
                                              ("SystemExit(143)", 143)])  # fmt: skip
def test_an_interrupt_raised_where_python_ignores_exceptions_is_delivered_again(raised: str, code: int) -> None:
    """The loaded suite once found `sej scan -f` following on after Ctrl-C: the handler's exception was raised
    in a weakref callback of the import system's module locks, where Python prints "Exception ignored" and
    goes on. Here a weakref callback raises what the handlers raise (SIGINT's; SIGTERM's in `sej scan -f`):
    the program still ends, with that exit code, and says nothing."""
    program = (
        "import signal, sys, time, weakref\n"
        "import sej.apps.entry\n"
        "def terminated(signum, frame):\n"
        "    raise SystemExit(143)\n"
        "signal.signal(signal.SIGTERM, terminated)  # as sej scan -f's\n"
        "class Thing:\n"
        "    pass\n"
        "def callback(ref):\n"
        f"    raise {raised}  # as a signal handler running inside the callback\n"
        "thing = Thing()\n"
        "ref = weakref.ref(thing, callback)\n"
        "del thing\n"
        "for _ in range(3000):  # the program's work: up to 30 s\n"
        "    time.sleep(0.01)\n"
    )
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, preexec_fn=default_sigint,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=scaled(120))  # fmt: skip
    assert (r.returncode, r.stderr) == (code, "")


def test_an_error_raised_because_ctrl_c_came_exits_130_quietly(tmp_path: Path) -> None:
    """CPython's import, interrupted while it builds an ImportError's message, raises "TypeError: expected a
    message argument" instead of the KeyboardInterrupt (PyErr_SetImportError): `sej scan -f` then ended with
    "internal error" and exit 1 (seen 3 times in 700 interrupts under load). An error raised after Ctrl-C came
    is its doing: exit 130, nothing said."""
    (tmp_path / "interrupted_program.py").write_text(
        "import signal\n"
        "import click\n"
        "from sej.apps.shell import Program\n"
        "@click.command(cls=Program)\n"
        "def main():\n"
        "    try:\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        "    except KeyboardInterrupt:\n"
        "        raise TypeError('expected a message argument')  # as CPython's interrupted import\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", "import sej.apps.entry as e; e.run('interrupted_program')"],
        capture_output=True, text=True, preexec_fn=default_sigint, timeout=scaled(60),
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)])),
    )  # fmt: skip
    assert (r.returncode, r.stderr.strip()) == (130, ""), r.stderr  # click says a blank line, as for any Ctrl-C


# -- scan -c, --from --------------------------------------------------------------------------------


def test_scan_max_messages(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    assert [m["offset"] for m in jsonl(run("scan", jnl, "-c", "3").stdout)] == [0, 1, 2]
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--max-messages", "2", "--type", "2").stdout)] == [2, 5]
    assert run("scan", jnl, "-c", "0").stdout == ""
    assert run("scan", jnl, "-c", "100").stdout.count("\n") == 12
    root, where = make_root(tmp_path / "root")
    out = jsonl(run("scan", root, "-c", "4").stdout)  # merged by timestamp, then cut
    assert [m["value"] for m in out] == ["v0", "v1", "v2", "v3"] and {m["journal"] for m in out} <= set(where)
    # --count counts what scan would print: at most -c
    assert run("scan", jnl, "--count", "-c", "5").stdout == "5\n"
    assert run("scan", jnl, "--count", "-c", "50").stdout == "12\n"
    assert run("scan", jnl, "--count", "-c", "0").stdout == "0\n"
    assert run("scan", jnl, "--count", "--type", "1", "-c", "3").stdout == "3\n"
    assert "-1 is not in the range x>=0" in one_error_line(run("scan", jnl, "-c", "-1", code=2))


def test_scan_from_positions(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--from", "-3").stdout)] == [9, 10, 11]
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--from=-20").stdout)] == list(range(12))
    assert len(jsonl(run("scan", jnl, "--from", "earliest").stdout)) == 12
    assert run("scan", jnl, "--from", "latest").stdout == ""
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--from", "7", "-c", "2").stdout)] == [7, 8]
    assert run("count", jnl, "--from", "-4").stdout == "4\n"
    root, where = make_root(tmp_path / "root")
    out = jsonl(run("scan", root, "--from", "-2").stdout)  # the last 2 of each journal, merged by timestamp
    assert [int(m["value"][1:]) for m in out] == sorted(i for nums in where.values() for i in nums[-2:])
    for bad in ("soon", "1.5", ""):
        assert f"{bad!r} is not an offset, -N, earliest or latest" in one_error_line(
            run("scan", jnl, "--from", bad, code=2)
        )
    assert "--from 13" in one_error_line(run("scan", jnl, "--from", "13", code=2))


# -- scan -f ----------------------------------------------------------------------------------------


def test_follow_a_journal_from_n_back_until_max_messages(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    with Child("scan", "-f", "--from", "-2", "-c", "4", "--format", "hex", jnl) as c:
        assert [hex_fields(x)[0] for x in c.lines(2)] == ["10", "11"]
        with sej.Writer(jnl) as w:
            w.append(b"new 12", key=b"k", type=1, timestamp=T0 + 12 * MIN)
            w.append(b"new 13", key=b"k", type=1, timestamp=T0 + 13 * MIN)
            w.append(b"new 14", key=b"k", type=1, timestamp=T0 + 14 * MIN)
        assert [hex_fields(x)[0] for x in c.lines(2)] == ["12", "13"]
        assert c.p.wait(scaled(20)) == 0  # -c 4: done
        assert c.out.get(timeout=scaled(10)) is None  # and nothing more


def test_follow_with_start_and_type_filters(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")  # type i % 3, one a minute
    with Child("scan", "-f", "--start", str(T0 + 6 * MIN), "--type", "0", "--format", "hex", jnl) as c:
        assert [hex_fields(x)[0] for x in c.lines(2)] == ["6", "9"]
        with sej.Writer(jnl) as w:
            w.append(b"too old", type=0, timestamp=T0)  # 12: before --start
            w.append(b"other type", type=1, timestamp=T0 + 20 * MIN)  # 13
            w.append(b"this one", type=0, timestamp=T0 + 21 * MIN)  # 14
        assert hex_fields(c.line())[:1] == ["14"]
        code, rest, err = c.stop()
    assert code == 130 and rest == [] and "Traceback" not in err


def test_follow_from_latest_prints_only_what_is_appended_later(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    with Child("scan", "-f", "--from", "latest", "-c", "1", "--format", "hex", jnl) as c, sej.Writer(jnl) as w:
        # When the scan starts following is not observable from outside: append until it prints one.
        deadline = time.monotonic() + scaled(20)
        got = None
        while got is None:
            assert time.monotonic() < deadline, "scan -f --from latest printed nothing"
            w.append(b"late", type=1)
            w.flush()
            try:
                got = c.out.get(timeout=0.05)
            except queue.Empty:
                continue
        assert got is not None and int(hex_fields(got)[0]) >= 12  # never one of the 12 there before
        assert c.p.wait(scaled(20)) == 0


def test_follow_a_sharded_root_and_a_shard_created_meanwhile(tmp_path: Path) -> None:
    root, where = make_root(tmp_path / "root")
    with Child("scan", "-f", root) as c:
        first = [json.loads(x) for x in c.lines(10)]
        assert sorted(int(m["value"][1:]) for m in first) == list(range(10))
        for name, nums in where.items():  # each journal in offset order (the journals in turns)
            assert [m["value"] for m in first if m["journal"] == name] == [f"v{i}" for i in nums]
        late = os.path.join(root, format_shard("late", 1, 0))  # a new journal under the root
        with sej.Writer(late) as w:
            w.append(b"late 0", key=b"x")
            w.append(b"late 1", key=b"x")
        got = [json.loads(x) for x in c.lines(2)]
        assert [(m["journal"], m["offset"], m["value"]) for m in got] == [
            ("late.1.000", 0, "late 0"),
            ("late.1.000", 1, "late 1"),
        ]
        old = sorted(where)[0]
        with sej.Writer(os.path.join(root, old)) as w:
            w.append(b"again")
        m = json.loads(c.line())
        assert (m["journal"], m["offset"], m["value"]) == (old, len(where[old]), "again")
        code, rest, err = c.stop()
    assert code == 130 and rest == [] and "Traceback" not in err and err.strip() == ""


# -- scan --reader -----------------------------------------------------------------------------------


def test_reader_commits_what_it_printed_on_sigint_and_on_sigterm(tmp_path: Path) -> None:
    """kcat -G: a restart goes on after the last message printed, with nothing skipped and nothing again."""
    root, where = make_root(tmp_path / "root")
    names = sorted(where)
    with Child("scan", "-f", "--reader", "r", "--format", "hex", root) as c:
        printed = [hex_fields(x) for x in c.lines(10)]
        code, rest, err = c.stop(signal.SIGINT)
    assert code == 130 and rest == [] and "Traceback" not in err and err.strip() == ""
    for name in names:
        assert [int(f[1]) for f in printed if f[0] == name] == list(range(len(where[name])))
        assert ofs(os.path.join(root, name), "r") == len(where[name])  # one past the last printed
    rows = json.loads(run("offset", root, "--reader", "r", "--json").stdout)
    assert [(row["journal"], row["readers"][0]["committed"]) for row in rows] == [(n, len(where[n])) for n in names]

    with sej.Writer(os.path.join(root, names[1])) as w:
        for i in range(3):
            w.append(b"more %d" % i)
    with Child("scan", "-f", "--reader", "r", "--format", "hex", root) as c:
        again = [hex_fields(x) for x in c.lines(3)]
        code, rest, err = c.stop(signal.SIGTERM)
    assert code == 143 and rest == [] and "Traceback" not in err and err == ""
    assert [(f[0], int(f[1])) for f in again] == [(names[1], len(where[names[1]]) + i) for i in range(3)]
    assert ofs(os.path.join(root, names[1]), "r") == len(where[names[1]]) + 3
    assert ofs(os.path.join(root, names[0]), "r") == len(where[names[0]])


def test_reader_interrupted_while_printing_commits_exactly_what_it_printed(tmp_path: Path) -> None:
    """SIGINT while the scan prints as fast as it can: per journal, the committed offset is one past the last
    line written out, wherever the signal came (waiting for messages, between two, or while writing one,
    which is finished and counted first)."""
    root = str(tmp_path / "root")
    with sej.ShardedWriter(root, "ev", shard_bit=2) as w:
        for i in range(40_000):
            w.append(b"m%d" % i, key=b"%d" % i)
    with Child("scan", "-f", "--reader", "r", "--format", "hex", root) as c:
        lines = [c.line()]
        code, rest, err = c.stop(signal.SIGINT)
    assert code == 130 and "Traceback" not in err and err.strip() == ""
    lines += rest
    assert all(x.endswith("\n") for x in lines)
    printed: dict[str, list[int]] = {}
    for x in lines:
        name, offset = hex_fields(x)[:2]
        printed.setdefault(name, []).append(int(offset))
    for name in os.listdir(root):
        got = printed.get(name, [])
        assert got == list(range(len(got))), name  # in order, nothing twice, nothing left out
        assert (ofs(os.path.join(root, name), "r") or 0) == len(got), name


def test_reader_without_follow_reads_to_the_end_and_commits(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")  # reader billing at 5
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--reader", "billing", "-c", "3").stdout)] == [5, 6, 7]
    assert ofs(jnl, "billing") == 8
    out = jsonl(run("scan", jnl, "--reader", "billing", "--type", "1").stdout)
    assert [m["offset"] for m in out] == [10]  # 8, 9 and 11 are left out by --type, and consumed
    assert ofs(jnl, "billing") == 12
    assert run("scan", jnl, "--reader", "billing").stdout == ""
    assert [m["offset"] for m in jsonl(run("scan", jnl, "--reader", "newbie", "-c", "2").stdout)] == [0, 1]
    assert ofs(jnl, "newbie") == 2  # a new reader starts at the first message
    root, where = make_root(tmp_path / "root")
    out = jsonl(run("scan", root, "--reader", "r").stdout)
    assert sorted(m["value"] for m in out) == sorted(f"v{i}" for i in range(10))
    assert all(ofs(os.path.join(root, n), "r") == len(where[n]) for n in where)


def test_reader_in_use_and_bad_reader_names(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    with sej.Offset(jnl, "billing"):
        r = run("scan", jnl, "--reader", "billing", code=1)
    assert "reader billing is in use by another process" in one_error_line(r) and "billing.lck" in r.stderr
    assert ofs(jnl, "billing") == 5
    assert "--reader: reader name must match" in one_error_line(run("scan", jnl, "--reader", "../x", code=2))
    assert "'a b'" in one_error_line(run("scan", jnl, "-f", "--reader", "a b", code=2))


@pytest.mark.parametrize(
    "args, expect",
    [
        (["-f", "--end", "now"], "--end cannot go with -f/--follow"),
        (["-f", "--count"], "--count cannot go with -f/--follow"),
        (["--reader", "r", "--count"], "--count cannot go with --reader"),
        (["--reader", "r", "--from", "3"], "--reader cannot go with --from:"),
        (["--reader", "r", "--start", "-1h", "--end", "now"], "--reader cannot go with --start and --end:"),
        (["-f", "--reader", "r", "--from", "latest"], "--reader cannot go with --from:"),
        (["-f", "--from", "13"], "--from 13"),
    ],
)
def test_scan_options_that_do_not_go_together(tmp_path: Path, args: list[str], expect: str) -> None:
    jnl = make_journal(tmp_path / "j")
    assert expect in one_error_line(run("scan", jnl, *args, code=2))
    assert ofs(jnl, "r") is None  # nothing was read or committed


# -- reset --to-earliest, --to-latest, --shift-by -----------------------------------------------------


def test_reset_to_earliest_and_latest(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    r = run("reset", jnl, "--reader", "billing", "--to-earliest")
    assert r.stdout.splitlines()[1].split() == ["billing", "5", "0", "12"] and "dry run" in r.stdout
    assert ofs(jnl, "billing") == 5
    run("reset", jnl, "--reader", "billing", "--to-earliest", "--yes")
    assert ofs(jnl, "billing") == 0
    run("reset", jnl, "--reader", "billing", "--to-latest", "--yes")
    assert ofs(jnl, "billing") == 12
    root, where = make_root(tmp_path / "root")  # each journal its own next offset
    r = run("reset", root, "--reader", "r", "--to-latest", "--yes")
    assert [line.split() for line in r.stdout.splitlines()[1:3]] == [
        [n, "r", "none", str(len(where[n])), "0"] for n in sorted(where)
    ]
    assert all(ofs(os.path.join(root, n), "r") == len(where[n]) for n in where)


def test_reset_shift_by_clamps_to_each_journal_and_says_so(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")  # billing at 5, offsets 0..12
    r = run("reset", jnl, "--reader", "billing", "--shift-by", "-2")
    assert [line.split() for line in r.stdout.splitlines()[:2]] == [["READER", "CURRENT", "NEW", "LAG"],
                                                                    ["billing", "5", "3", "9"]]  # fmt: skip
    assert "dry run" in r.stdout and ofs(jnl, "billing") == 5
    run("reset", jnl, "--reader", "billing", "--shift-by=-2", "--yes")
    assert ofs(jnl, "billing") == 3
    r = run("reset", jnl, "--reader", "billing", "--shift-by", "100", "--yes")
    assert r.stdout.splitlines()[1].split() == ["billing", "3", "12", "0", "clamped", "from", "103", "to", "the",
                                                "next", "offset"]  # fmt: skip
    assert ofs(jnl, "billing") == 12
    r = run("reset", jnl, "--reader", "billing", "--shift-by", "-100")
    assert "clamped from -88 to the first offset" in r.stdout and ofs(jnl, "billing") == 12
    run("reset", jnl, "--reader", "fresh", "--shift-by", "4", "--yes")  # nothing committed: from the first
    assert ofs(jnl, "fresh") == 4
    root, where = make_root(tmp_path / "root")
    names = sorted(where)
    for name, at in zip(names, (1, 3)):
        with sej.Offset(os.path.join(root, name), "r") as o:
            o.commit(at)
    r = run("reset", root, "--reader", "r", "--shift-by", "-2", "--yes")
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["JOURNAL", "READER", "CURRENT", "NEW", "LAG", "NOTE"]
    assert rows[1][:5] == [names[0], "r", "1", "0", str(len(where[names[0]]))]
    assert " ".join(rows[1][5:]) == "clamped from -1 to the first offset"
    assert rows[2] == [names[1], "r", "3", "1", str(len(where[names[1]]) - 1), "-"]
    assert [ofs(os.path.join(root, n), "r") for n in names] == [0, 1]


def test_reset_takes_exactly_one_way(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    r = run("reset", jnl, "--reader", "billing", "--to-earliest", "--to-latest", code=2)
    assert "give exactly one of --offset, --time, --to-earliest, --to-latest and --shift-by" in one_error_line(r)
    assert "(got --to-earliest and --to-latest)" in r.stderr
    r = run("reset", jnl, "--reader", "billing", "--shift-by", "1", "--offset", "2", "--yes", code=2)
    assert "(got --offset and --shift-by)" in one_error_line(r)
    assert "'x'" in one_error_line(run("reset", jnl, "--reader", "billing", "--shift-by", "x", code=2))
    assert ofs(jnl, "billing") == 5


# -- offset --json ------------------------------------------------------------------------------------


def test_offset_json_is_a_list_of_journal_rows_for_a_journal_and_a_root(tmp_path: Path) -> None:
    jnl = make_journal(tmp_path / "j")
    root, where = make_root(tmp_path / "root")
    one = json.loads(run("offset", jnl, "--json").stdout)
    several = json.loads(run("offset", root, "--json").stdout)
    assert isinstance(one, list) and isinstance(several, list)
    assert len(one) == 1 and len(several) == 2
    keys = {"journal", "path", "first_offset", "next_offset", "readers"}
    assert all(set(row) == keys for row in one + several)
    assert (one[0]["journal"], one[0]["next_offset"], one[0]["readers"][0]["name"]) == ("", 12, "billing")
    assert [(row["journal"], row["next_offset"]) for row in several] == [(n, len(where[n])) for n in sorted(where)]
    with_reader = json.loads(run("offset", jnl, "--json", "--reader", "billing").stdout)
    assert with_reader == one  # the summary line is the table's; JSON keeps its shape
