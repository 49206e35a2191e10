"""Generate docs/cli.md: the `sej` CLI reference with real commands and their real output.

    python3 scripts/cli_examples.py [--out docs/cli.md]

Builds a small example journal, a sharded root and a damaged copy in a temporary
directory, runs real `sej` commands there (as `python -m sej.apps.cli`, the same
code as the `sej` console script) and writes every command line, its output and
its exit code into the page. Nothing in the examples is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import sej  # noqa: E402

T0 = 1712345678000000000  # 2024-04-05T19:34:38Z
MIN = 60 * 10**9


class Session:
    """Runs `sej` commands in the example directory and collects them as markdown."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")

    def run(self, *args: str, expect: int | None = 0, terminal: bool = False) -> str:
        """Run `sej ARGS`; with `terminal`, its stdin is a terminal (a pseudo-terminal), as when typed by hand."""
        tty = pty.openpty() if terminal else None
        try:
            p = subprocess.run(
                [sys.executable, "-m", "sej.apps.cli", *args], capture_output=True, text=True, cwd=self.cwd,
                env=self.env, timeout=60, stdin=tty[1] if tty else None,
            )  # fmt: skip
        finally:
            for fd in tty or ():
                os.close(fd)
        if expect is not None and p.returncode != expect:
            raise SystemExit(f"sej {' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
        if "Traceback" in p.stderr:
            raise SystemExit(f"sej {' '.join(args)} printed a traceback:\n{p.stderr}")
        # Paths under the example directory are shown relative to it, as the commands name them.
        return self.block(args, (p.stdout + p.stderr).replace(self.cwd + "/", ""), p.returncode)

    @staticmethod
    def block(args: tuple[str, ...] | list[str], output: str, code: int) -> str:
        shown = " ".join(_quote(a) for a in args)
        text = f"$ sej {shown}\n{output}"
        if not text.endswith("\n"):
            text += "\n"
        if code:
            text += f"[exit {code}]\n"
        return f"```console\n{text}```\n\n"

    def help(self, *cmd: str) -> str:
        p = subprocess.run([sys.executable, "-m", "sej.apps.cli", *cmd, "--help"], capture_output=True, text=True,
                           cwd=self.cwd, env=self.env, timeout=60)  # fmt: skip
        return f"```text\n{p.stdout}```\n\n"

    def interrupt(self, args: list[str], *steps: tuple[int, Callable[[], object]]) -> str:
        """Start `sej ARGS`; for each step, read that many lines and then do its action; then Ctrl-C it."""
        p = subprocess.Popen([sys.executable, "-m", "sej.apps.cli", *args], cwd=self.cwd, env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert p.stdout is not None
        lines = []
        for n, action in steps:
            lines += [p.stdout.readline() for _ in range(n)]
            action()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
        if p.returncode != 130 or "Traceback" in err:
            raise SystemExit(f"sej {' '.join(args)}: exit {p.returncode} on Ctrl-C, expected 130\n{out}{err}")
        return self.block(args, "".join(lines) + out + "^C\n" + err.strip(), p.returncode)

    def append(self, journal: str, *values: bytes, minute: int = 20) -> Callable[[], None]:
        """An action: another process appends `values` to `journal` (a journal directory, new or not)."""

        def action() -> None:
            with sej.Writer(os.path.join(self.cwd, journal)) as w:
                for i, v in enumerate(values):
                    w.append(v, key=b"ann", type=1, timestamp=T0 + (minute + i) * MIN)

        return action


def _quote(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./:=+," for c in a) else "'" + a.replace("'", "'\\''") + "'"


def build(dir: str) -> None:
    """The example data: a journal `events`, a sharded root `shards`, a damaged copy `damaged`."""
    events = os.path.join(dir, "events")
    users = ["ann", "bob", "cy"]
    with sej.Writer(events, segment_size=400) as w:
        for i in range(12):
            user = users[i % 3]
            if i % 4 == 3:
                value = msgpack.packb({"user": user, "cart": [i, i + 1], "total": 9.5 * i})
                typ = 2
            else:
                value = json.dumps({"event": "click", "user": user, "n": i}).encode()
                typ = 1
            w.append(value, key=user.encode(), type=typ, timestamp=T0 + i * MIN)
    with sej.Offset(events, "billing") as o:
        o.commit(9)
    with sej.Offset(events, "audit") as o:
        o.commit(4)
    month_ago = time.time() - 30 * 86400
    for seg in sej.list_segments(events):
        os.utime(seg.path, (month_ago, month_ago))
    shards = os.path.join(dir, "shards")
    with sej.ShardedWriter(shards, "ev", shard_bit=1) as sw:
        for i in range(8):
            sw.append(b"reading %d" % i, key=b"sensor-%d" % i, timestamp=T0 + i * 10**9)
    for shard, at in (("ev.1.000", 2), ("ev.1.001", 1)):  # a Spark query named daily has read this far
        with sej.Offset(os.path.join(shards, shard), "spark-daily") as o:
            o.commit(at)
    damaged = os.path.join(dir, "damaged")
    shutil.copytree(events, damaged)
    segs = sej.list_segments(damaged)
    first = bytearray(Path(segs[0].path).read_bytes())
    first[-1] ^= 0x01  # the size field of the first segment's last frame
    Path(segs[0].path).write_bytes(bytes(first))
    with open(segs[-1].path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x0c\x00\x00")  # a torn last frame
    rotted = os.path.join(dir, "rotted")  # one flipped bit in a value: every frame still valid
    shutil.copytree(events, rotted)
    seg = sej.list_segments(rotted)[1]
    data = bytearray(Path(seg.path).read_bytes())
    data[30] ^= 0x04
    Path(seg.path).write_bytes(bytes(data))
    legacy = os.path.join(dir, "legacy")  # as the Go original writes it: no checksum files
    shutil.copytree(events, legacy)
    for name in os.listdir(os.path.join(legacy, "idx")):
        if name.endswith(".sum"):
            os.remove(os.path.join(legacy, "idx", name))


def page(s: Session, dir: str) -> str:
    segs = [os.path.relpath(seg.path, dir) for seg in sej.list_segments(os.path.join(dir, "events"))]
    damaged = [os.path.relpath(seg.path, dir) for seg in sej.list_segments(os.path.join(dir, "damaged"))]
    notes = Path(dir, "notes.txt")
    notes.write_text("just some text\n")
    out: list[str] = []
    add = out.append
    add("# The `sej` command-line tool\n\n")
    add(
        "<!-- Generated by scripts/cli_examples.py: do not edit by hand. -->\n\n"
        "**This page is generated** by `python3 scripts/cli_examples.py`: it builds a small example "
        "journal (`events`, 12 messages in 400-byte segments, readers `billing` and `audit`; the `tail -f` "
        "example appends two more), a sharded "
        "root (`shards`, `ev.1.000` and `ev.1.001`; the `scan -f` examples read a copy, `feed`) and a damaged "
        "copy (`damaged`) in a temporary "
        "directory, runs each command below there with `python -m sej.apps.cli` (the same code as the "
        "`sej` console script) and copies the command line, its output and its exit code here. "
        "Nothing below was typed by hand.\n\n"
    )
    add("## Overview\n\n")
    add(
        "`sej` inspects and maintains journals. It is installed with sej: `python3 -m pip install .` in a "
        "checkout (or `python3 -m pip install` a built wheel); add the `hub` extra (`'.[hub]'`) for "
        "`sej copy` from `ssh://` locations. `python3 -m sej.apps.cli` runs the same tool.\n\n"
        "**DIR** is a plain journal (a directory holding `jnl/`), a sharded root of "
        "`<prefix>.<bit>.<index>/` journals, or a hub root of `<client>.<shard>/` journals "
        "(whatever `sej.shard.find_journals` finds). When a command reads several journals, its "
        "output names the journal of each line. **FILE** is one segment file.\n\n"
    )
    add(s.help())
    add("### Exit codes\n\n")
    add(
        "| code | meaning |\n|---|---|\n"
        "| 0 | fine (also a closed stdout pipe, as in `sej scan DIR \\| head`) |\n"
        "| 1 | problems found: corruption, a lock held by another process, `verify` problems, a value "
        "that is not msgpack under `--format msgpack`, I/O errors |\n"
        "| 2 | usage errors: bad options, a missing path, a path that is not a journal or segment file, "
        "a bad time string, an offset outside the journal |\n"
        "| 130 | interrupted with Ctrl-C, at any moment: also `scan -f` and `tail -f`, which run until then, "
        "and while the program starts |\n"
        "| 143 | `scan -f` or `scan --reader` ended by SIGTERM (after committing what was printed) |\n\n"
        "Errors go to stderr as one line, `sej: error: ...`, never a traceback; `sej --debug COMMAND ...` "
        "shows the traceback of an unexpected error.\n\n"
    )
    add("### Time arguments\n\n")
    add(
        "Options that take a TIME (`--start`, `--end`, `reset --time`) accept:\n\n"
        "| form | example | meaning |\n|---|---|---|\n"
        "| ISO 8601 with `Z` or an offset | `2024-04-05T19:40:00Z`, `2024-04-05T21:40:00+02:00` | that instant |\n"
        "| ISO 8601 without an offset | `2024-04-05T19:40:00`, `2024-04-05` | UTC |\n"
        "| fractions up to nanoseconds | `2024-04-05T19:40:00.123456789Z` | exact |\n"
        "| relative to now | `-2h`, `-30m`, `-45s`, `-7d`, `-1w`, `-1h30m`, `+10m` | now minus (plus) that |\n"
        "| `now` | `now` | the current time |\n"
        "| an integer | `1712346038000000000` | nanoseconds since the Unix epoch |\n\n"
        "Anything else is a usage error naming the bad string (exit 2).\n\n"
    )
    add("### Message output formats (`--format`)\n\n")
    add(
        "- `json` (default): one JSON object per line: `journal` (only when several journals are read), "
        "`offset`, `timestamp` (int ns or null), `time` (ISO 8601 UTC or null), `type`, `key`, `value`. "
        'Key and value are UTF-8 text when they decode, else base64 with `"key_encoding": "base64"` / '
        '`"value_encoding": "base64"`. `dump` adds each frame\'s byte `position`.\n'
        "- `msgpack`: like `json`, with the value decoded from msgpack (bytes inside as base64 strings, "
        "non-string map keys as strings). A value that is not msgpack gets an error line on stderr and is "
        "skipped; the command goes on and exits 1 at the end.\n"
        "- `raw`: the value bytes, then a newline.\n"
        "- `hex`: `[journal] offset timestamp type key value`, key and value in hex, `-` when empty or "
        "without a timestamp.\n\n"
        "Long work (`verify`, `scan`/`count`, `old --delete`) draws a progress bar on stderr "
        "only when stderr is a terminal (for `scan`, only when stdout is not), and is quiet when piped.\n\n"
    )

    add("## Commands\n\n")

    add("### `sej scan` and `sej count`\n\n")
    add(s.help("scan"))
    add(
        "Each journal is read from the first message at or after `--start` (found through the sparse "
        "index with `sej.offset_at_time`, without decoding what comes before) and/or from `--from`, up to, "
        "not including, the first message at or after `--end`. Messages in between whose own timestamp is "
        "outside [start, end) (out-of-order clocks) are skipped too. With one journal, `--from` outside the "
        "journal is a usage error; with several it is clamped to each journal's range. Several journals are "
        "merged by timestamp. `count` reads every message it counts, as `scan` does, also without filters: on "
        "a corrupt frame it fails with the same error as `scan` (exit 1) instead of printing a number.\n\n"
    )
    add(s.run("scan", "events", "--start", "2024-04-05T19:40:00Z", "--end", "2024-04-05T19:43:00Z"))
    add(s.run("scan", "events", "--from", "9", "--format", "hex"))
    add(s.run("scan", "events", "--type", "2", "--format", "msgpack"))
    add(s.run("scan", "events", "--from", "6", "--format", "msgpack", expect=1))
    add(s.run("scan", "events", "--type", "1", "--from", "8", "--format", "raw"))
    add(s.run("scan", "shards", "--start", str(T0 + 5 * 10**9)))
    add(s.run("scan", "events", "--start", "2024-04-05T19:40:00Z", "--count"))
    add(
        "`-c N` stops after N messages (with `--count`, counts at most N). `--from` also takes `-N` (the last N "
        "messages of each journal), `earliest` (the default) and `latest` (nothing there now: for `-f`), as "
        "kcat's `-o`:\n\n"
    )
    add(s.run("scan", "events", "-c", "2", "--format", "hex"))
    add(s.run("scan", "shards", "--from", "-1", "--format", "hex"))
    add("#### Following (`-f`) and reading as a reader (`--reader`)\n\n")
    add(
        "With `-f`, scan prints what is there, then new messages as they come, until Ctrl-C (exit 130); on a "
        "root, also those of journals created meanwhile (from their first message). With `-f` or `--reader` "
        "the messages come in the order they are read (each journal in offset order, the journals in turns), "
        "not merged by timestamp, and every line of a root names its journal. `--end` and `--count` do not go "
        "with `-f`; `--start`, `--from`, `--type` and `--format` do. Here another process appends to "
        "`ev.1.001`, then creates the journal `late.1.000`:\n\n"
    )
    shutil.copytree(os.path.join(dir, "shards"), os.path.join(dir, "feed"))
    add(s.interrupt(["scan", "feed", "-f", "--from", "-1", "--format", "hex"],
                    (2, s.append("feed/ev.1.001", b"new in ev.1.001")),
                    (1, s.append("feed/late.1.000", b"first of late.1.000")), (1, lambda: None)))  # fmt: skip
    add(
        "`--reader NAME` starts each journal at the reader's committed offset (its first offset if none) and "
        "commits one past the last message printed (or left out by `--type`): every 1000 messages or 5 s, at the "
        "end, and on Ctrl-C and SIGTERM too, as `kcat -G`. A restart goes on from there: Ctrl-C and SIGTERM "
        "replay nothing, a crash replays at most what was printed since the last commit, and nothing is ever "
        "skipped. Without `-f` it reads to the end. `--from`, `--start` and `--end` do not go with it (`sej "
        "reset` moves the reader), and a reader in use by another process is an error (exit 1).\n\n"
    )
    add(s.run("scan", "feed", "--reader", "audit", "-c", "3", "--format", "hex"))
    add(s.run("offset", "feed", "--reader", "audit"))
    add(s.interrupt(["scan", "feed", "-f", "--reader", "audit", "--format", "hex"], (7, lambda: None)))
    add(s.run("offset", "feed", "--reader", "audit"))
    add(s.run("scan", "feed", "--reader", "audit", "--from", "2", expect=2))
    add(s.help("count"))
    add(s.run("count", "events", "--type", "2"))
    add(s.run("count", "shards"))

    add("### `sej tail`\n\n")
    add(s.help("tail"))
    add(s.run("tail", "events", "-n", "2"))
    add(s.run("tail", "shards", "-n", "1", "--format", "hex"))
    add(
        "With `-f`, after the last messages it waits for new ones (here appended by another process) until "
        "Ctrl-C (exit 130):\n\n"
    )
    login, logout = b'{"event": "login", "user": "ann"}', b'{"event": "logout", "user": "ann"}'
    add(s.interrupt(["tail", "events", "-n", "1", "-f"], (1, s.append("events", login, logout)), (2, lambda: None)))
    add(s.run("tail", "shards", "-f", expect=2))

    add("### `sej offset`\n\n")
    add(s.help("offset"))
    add(s.run("offset", "events"))
    add(s.run("offset", "shards"))
    add(s.run("offset", "shards", "--reader", "spark-daily"))
    add(
        "`--json` prints the same for a journal and for a root: a list of journal rows (one row for a journal, "
        'whose `journal` is `""`). The `--reader` summary line is the table\'s only; the rows hold what it '
        "sums up.\n\n"
    )
    add(s.run("offset", "events", "--json"))
    add(s.run("offset", "shards", "--json", "--reader", "spark-daily"))

    add("### `sej reset`\n\n")
    add(s.help("reset"))
    add(
        "Exactly one of `--offset`, `--time`, `--to-earliest`, `--to-latest` and `--shift-by N` (as "
        "kafka-consumer-groups' `--reset-offsets`), and nothing changes without `--yes`. On a root each journal "
        "gets its own offset. `--shift-by` moves from the committed offset (the first one if none); a result "
        "outside a journal's offsets is clamped to them, and the NOTE column says so.\n\n"
    )
    add(s.run("reset", "events", "--reader", "audit", "--time", "2024-04-05T19:40:00Z"))
    add(s.run("reset", "events", "--reader", "audit", "--to-earliest"))
    add(s.run("reset", "events", "--reader", "audit", "--shift-by", "-6"))
    add(s.run("reset", "shards", "--reader", "spark-daily", "--shift-by", "3"))
    add(s.run("reset", "shards", "--reader", "spark-daily", "--to-latest"))
    add(s.run("reset", "events", "--reader", "audit", "--offset", "6", "--yes"))
    add(s.run("reset", "events", "--reader", "audit", "--offset", "99", expect=2))

    add("### `sej old`\n\n")
    add(s.help("old"))
    add(
        "The segments of `events` were last modified 30 days ago (the last one again by the `tail -f` "
        "example); the slowest reader, `audit`, is at offset 6 since the `reset` above:\n\n"
    )
    add(s.run("old", "events", "--days", "7"))
    add(s.run("old", "events", "--days", "7", "--delete"))
    add("The journal now starts at offset 6 (see `sej stat` below).\n\n")
    add(s.run("old", "shards", "--days", "0"))

    add("### `sej file`\n\n")
    add(s.help("file"))
    add(s.run("file", segs[1]))
    add(s.run("file", damaged[0], expect=1))

    add("### `sej dump`\n\n")
    add(s.help("dump"))
    add(s.run("dump", segs[1]))
    add(s.run("dump", damaged[0], expect=1))
    add(s.run("dump", "notes.txt", expect=2))

    add("### `sej verify`\n\n")
    add(s.help("verify"))
    add(s.run("verify", "events"))
    add(s.run("verify", "damaged", expect=1))
    add(s.run("verify", "damaged", "--repair", expect=1))
    add(s.run("verify", "damaged", expect=1))
    add(
        "Every segment has checksums beside it (`idx/*.sum`, docs/format.md). A flipped bit that leaves every "
        "frame valid (`rotted`: one bit of a value) is a checksum mismatch, named with its byte range and the "
        "messages it covers; `--json` gives the same report for programs:\n\n"
    )
    add(s.run("verify", "rotted", expect=1))
    add(s.run("verify", "--json", "rotted", expect=1))
    add(
        "Journals written by the Go original or by sej before checksums have none (`legacy`): their bytes "
        "are unchecked. `--seal` records checksums from the bytes as they are now (under the writer lock), so "
        "damage from then on is seen; it cannot vouch for their past. A mismatch is never sealed or repaired: "
        "there is nothing to repair from but another copy (the hub's copy of a producer's journal, or the "
        "producer's of the hub's; see docs/durability.md).\n\n"
    )
    add(s.run("verify", "legacy"))
    add(s.run("verify", "--seal", "legacy"))
    add(s.run("verify", "legacy"))

    add("### `sej hub status`\n\n")
    add(s.help("hub", "status"))
    from sej.hub.config import loads_config
    from sej.hub.daemon import Hub

    config = loads_config('hub_root = "hub"\n[[client]]\nclient_id = "edge-1"\nlocal_root = "shards"\n', base_dir=dir)
    with Hub(config) as hub:
        hub.run_once()  # one pass of the daemon's, as sej-hub makes them: it writes the client's record
    add(
        "After one pass of `sej-hub` copying `shards` as client `edge-1` into the hub root `hub` "
        '(docs/hub.md, "Watching it work"):\n\n'
    )
    add(s.run("hub", "status", "hub"))
    add(s.run("hub", "status", "hub", "--json"))
    add(s.run("hub", "status", "hub", "--max-age", "0", expect=1))

    add("### `sej serve`\n\n")
    add(s.help("serve"))
    add(
        "The producer's side of the hub's `serve` transport (docs/hub.md, \"`sej serve`: the streaming "
        'transport"): `sej-hub` and `sej copy` run `sej serve REMOTE_ROOT` on the producer over SSH, when sej '
        "is installed there, and speak a framed binary protocol with it on its stdin and stdout. The client's "
        "`transport` in `hub.toml` (`sej copy --transport`) chooses it; `serve_command` (`sej copy "
        "--serve-command`) names the producer's `sej` when it is not on the login's `PATH`. To pin the hub's key "
        "to it, the producer's `authorized_keys` runs `sej serve --restrict ROOT` whatever the hub asks for "
        "(docs/hub.md shows the line). It is not a command to type: from a terminal it says so and exits "
        "(2):\n\n"
    )
    add(s.run("serve", "shards", expect=2, terminal=True))

    add("### `sej stat`\n\n")
    add(s.help("stat"))
    add(s.run("stat", "events"))
    add(s.run("stat", "shards"))

    add("## Errors\n\n")
    add("Each is one line on stderr with the exit code from the table above.\n\n")
    add(s.run("scan", "missing", expect=2))
    os.makedirs(os.path.join(dir, "empty"), exist_ok=True)
    add(s.run("stat", "empty", expect=2))
    add(s.run("hub", "status", "empty", "--max-age", "60", "--max-lag", "0", expect=2))
    add(s.run("scan", "events", "--start", "yesterday", expect=2))
    add(s.run("scan", "damaged", "--format", "hex", expect=1))
    add(s.run("scan", "events", "--limit", "3", expect=2))
    return "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "cli.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sej-cli-") as dir:
        build(dir)
        text = page(Session(dir), dir)
    Path(args.out).write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines)")


if __name__ == "__main__":
    main()
