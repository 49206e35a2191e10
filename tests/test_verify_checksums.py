"""`sej verify` checks every byte against its checksum (journals and hub roots), reports unchecked bytes,
seals them on request (never a mismatch), and has a JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sej
from sej.apps.cli.check import verify_journal
from sej.checksum import BLOCK, Hasher, check_segment
from sej.layout import list_segments, sum_path
from sej.sealing import seal_journal
from sej.shard import Journal
from testing.flips import copy_to_hub, count_kinds, flip, flips, write_journal
from testing.timing import scaled
from tests.conftest import REPO


def verify(dir: str) -> object:
    return verify_journal(Journal(os.path.basename(dir), dir), lambda n: None, False)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sej.apps.cli", "verify", *args], capture_output=True, text=True,
                          timeout=scaled(120), env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip


def check_flips(dir: str, count: int, seed: int) -> dict[str, int]:
    caught: dict[str, int] = {}
    for f in flips(dir, count, seed):
        problems = verify(dir).problems  # type: ignore[attr-defined]
        name = os.path.basename(f.path)[:16]
        assert any(os.path.basename(p.path)[:16] == name for p in problems), (f, problems)
        if f.kind != "sums":
            sums = [p for p in problems if p.end is not None]
            assert any(p.position <= f.pos < p.end and p.offsets is not None for p in sums), (f, problems)
        count_kinds(caught, f)
    return caught


@pytest.mark.slow
def test_verify_reports_every_flipped_byte_on_a_journal(jdir: str) -> None:
    write_journal(jdir)
    assert not verify(jdir).problems  # type: ignore[attr-defined]
    caught = check_flips(jdir, 1000, seed=31)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught


@pytest.mark.slow
def test_verify_reports_every_flipped_byte_on_a_hub_root(tmp_path: Path) -> None:
    write_journal(str(tmp_path / "producer" / "ev"))
    hub = tmp_path / "hub"
    d = copy_to_hub(tmp_path / "producer", hub)
    assert not verify(d).problems  # type: ignore[attr-defined]
    caught = check_flips(d, 1000, seed=32)
    assert sum(caught.values()) == 1000 and len(caught) == 4, caught
    p = cli(str(hub))  # the hub root as a whole
    assert p.returncode == 0 and "no problems" in p.stdout and "unchecked" not in p.stdout, p.stdout + p.stderr


def test_cli_exit_codes_and_json(jdir: str) -> None:
    write_journal(jdir, n=800)
    p = cli(jdir)
    assert p.returncode == 0 and "no problems" in p.stdout and "unchecked" not in p.stdout, p.stdout + p.stderr
    seg = list_segments(jdir)[1]
    data = Path(seg.path).read_bytes()
    pos = 18 + data[17] + 4 + 3  # inside the first message's value
    flip(seg.path, pos, 2)
    p = cli(jdir)
    assert p.returncode == 1 and "checksum mismatch" in p.stdout and seg.path in p.stdout, p.stdout + p.stderr
    p = cli("--json", jdir)
    assert p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    (j,) = report["journals"]
    (bad,) = [x for x in j["problems"] if x["checksum"]]
    assert bad["segment"] == seg.path and bad["position"] <= pos < bad["end"]
    assert bad["offsets"][0] == seg.first_offset
    assert report["problems"] >= 1 and j["unchecked"] == []


def test_go_journals_are_unchecked_until_sealed(jdir: str) -> None:
    msgs = write_journal(jdir, n=1200)
    for seg in list_segments(jdir):
        os.remove(sum_path(jdir, seg.first_offset))
    p = cli(jdir)
    assert p.returncode == 0 and "unchecked" in p.stdout and "does not vouch for their past" in p.stdout, p.stdout
    report = json.loads(cli("--json", jdir).stdout)
    assert report["unchecked_bytes"] == sum(os.path.getsize(s.path) for s in list_segments(jdir))
    with sej.Writer(jdir, segment_size=160 << 10):
        p = cli("--seal", jdir)
        assert p.returncode == 1 and "a writer holds its lock" in p.stderr, p.stdout + p.stderr
        assert not os.path.exists(sum_path(jdir, 0))
    p = cli("--seal", jdir)
    assert p.returncode == 0 and "sealed:" in p.stdout and "does not vouch for their past" in p.stdout, p.stdout
    p = cli(jdir)
    assert p.returncode == 0 and "unchecked" not in p.stdout and "no problems" in p.stdout, p.stdout
    with sej.Writer(jdir, segment_size=160 << 10) as w:  # a sealed journal written further stays clean
        for i in range(500):
            w.append(b"%0300d" % i)
    p = cli(jdir)
    assert p.returncode == 0 and "unchecked" not in p.stdout and "no problems" in p.stdout, p.stdout
    with sej.Scanner(jdir, 0, timeout=0, verify=True) as s:
        assert [m.value for m in s][: len(msgs)] == [v for _, v in msgs]


def test_seal_appends_to_a_short_checksum_file_and_never_touches_a_mismatch(jdir: str) -> None:
    write_journal(jdir, n=1200)
    segs = list_segments(jdir)
    short, bad = segs[0], segs[1]
    sp = sum_path(jdir, short.first_offset)
    full = Path(sp).read_bytes()
    Path(sp).write_bytes(full[:-32])  # a tail past the last record (a crash before a power loss)
    flip(bad.path, 100, 0)
    bad_sums = Path(sum_path(jdir, bad.first_offset)).read_bytes()
    bad_bytes = Path(bad.path).read_bytes()
    sealed, refused = seal_journal(jdir)
    assert [x.path for x in sealed] == [short.path] and len(refused) == 1 and "not sealed" in refused[0]
    c = check_segment(short.path, sp, short.first_offset)
    assert not c.errors and c.checked == c.size
    assert Path(sum_path(jdir, bad.first_offset)).read_bytes() == bad_sums and Path(bad.path).read_bytes() == bad_bytes
    p = cli(jdir)
    assert p.returncode == 1 and "checksum mismatch" in p.stdout


def small_journal(dir: str) -> sej.Segment:
    with sej.Writer(dir) as w:
        for _ in range(3):
            w.append(b"x" * 30, key=b"k")
    return list_segments(dir)[-1]


def test_a_torn_tail_is_not_offered_for_sealing_nor_sealed_and_repair_leaves_a_clean_journal(jdir: str) -> None:
    """Issue 38: torn bytes are not messages. verify offered to seal them, --seal sealed them, --repair cut the
    segment but not its checksums, and the journal then failed verification for good."""
    seg = small_journal(jdir)
    good = os.path.getsize(seg.path)
    sp = sum_path(jdir, seg.first_offset)
    with open(seg.path, "ab") as f:
        f.write(b"\x01" * 10)
    p = cli(jdir)
    assert p.returncode == 1 and "a torn tail" in p.stdout, p.stdout + p.stderr
    assert "unchecked" not in p.stdout and "--seal" not in p.stdout, p.stdout
    assert f"sej verify --repair {jdir}" in p.stdout, p.stdout  # the advice that helps
    assert json.loads(cli("--json", jdir).stdout)["unchecked_bytes"] == 0
    sums = Path(sp).read_bytes()
    p = cli("--seal", jdir)
    assert p.returncode == 1 and "sealed:" not in p.stdout and "a torn tail" in p.stdout, p.stdout + p.stderr
    assert Path(sp).read_bytes() == sums, "the torn bytes were sealed"
    p = cli("--repair", jdir)
    assert p.returncode == 0 and f"repaired: {seg.path}: cut 10 bytes from byte {good}" in p.stdout, p.stdout
    assert os.path.getsize(seg.path) == good
    p = cli(jdir)
    assert p.returncode == 0 and "no problems" in p.stdout and "unchecked" not in p.stdout, p.stdout + p.stderr
    with sej.Writer(jdir) as w:
        assert w.recovered is None and w.append(b"after") == 3
    with sej.Scanner(jdir, 0, timeout=0, verify=True) as s:
        assert [m.value for m in s] == [b"x" * 30] * 3 + [b"after"]


def test_repair_drops_checksums_for_bytes_past_the_end_of_the_last_segment(jdir: str) -> None:
    """What the torn tail sealed and cut before the fix left behind: checksum records past the segment's end.
    --repair drops them (as the writer does when it opens); in a finished segment they are only reported."""
    seg = small_journal(jdir)
    good = os.path.getsize(seg.path)
    sp = sum_path(jdir, seg.first_offset)
    torn = Path(seg.path).read_bytes() + b"\x01" * 10
    start = good // BLOCK * BLOCK
    with open(sp, "ab") as f:  # sealed torn bytes, then the segment cut back
        f.write(Hasher(good, torn[start:good]).update(torn[good:]))
    p = cli(jdir)
    assert p.returncode == 1 and "past the segment's end" in p.stdout, p.stdout + p.stderr
    assert f"sej verify --repair {jdir}" in p.stdout, p.stdout
    p = cli("--repair", jdir)
    assert p.returncode == 0 and f"repaired: {seg.path}: dropped the checksums of bytes {good}..{good + 10}" \
        in p.stdout, p.stdout + p.stderr  # fmt: skip
    p = cli(jdir)
    assert p.returncode == 0 and "no problems" in p.stdout and "unchecked" not in p.stdout, p.stdout + p.stderr
    assert os.path.getsize(seg.path) == good
    with sej.Writer(jdir) as w:  # a finished segment with checksums past its end: reported, never changed
        w.append(b"y" * 5000)
    with sej.Writer(jdir, segment_size=1) as w:
        w.append(b"z")
    first = list_segments(jdir)[0]
    assert len(list_segments(jdir)) == 2
    os.truncate(first.path, os.path.getsize(first.path) - 100)
    before = Path(sum_path(jdir, 0)).read_bytes()
    p = cli("--repair", jdir)
    assert p.returncode == 1 and "past the segment's end" in p.stdout and "not repaired" in p.stderr, p.stdout
    assert Path(sum_path(jdir, 0)).read_bytes() == before


def test_repair_of_a_last_segment_cut_inside_its_last_frame_counts_both_problems_repaired(jdir: str) -> None:
    """A last segment cut short inside its last frame, its checksums still covering the lost bytes: a torn tail and
    checksums past the end. --repair mends both; it said the second was "not repaired" (exit 1), although the cut
    had dropped those checksums and the journal then verified clean."""
    seg = small_journal(jdir)
    frame = os.path.getsize(seg.path) // 3
    os.truncate(seg.path, os.path.getsize(seg.path) - 10)
    p = cli(jdir)
    assert p.returncode == 1 and "a torn tail" in p.stdout and "past the segment's end" in p.stdout, p.stdout
    p = cli("--repair", jdir)
    assert p.returncode == 0 and "2 problems, 2 repaired" in p.stdout and "not repaired" not in p.stderr, \
        p.stdout + p.stderr  # fmt: skip
    assert f"repaired: {seg.path}: cut {frame - 10} bytes from byte {2 * frame}" in p.stdout, p.stdout
    assert os.path.getsize(seg.path) == 2 * frame
    p = cli(jdir)
    assert p.returncode == 0 and "no problems" in p.stdout, p.stdout + p.stderr


def test_seal_with_a_running_writer_is_one_error_line(jdir: str) -> None:
    seg = small_journal(jdir)
    os.remove(sum_path(jdir, seg.first_offset))
    with sej.Writer(jdir):
        p = cli("--seal", jdir)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("sej: error: "), p.stderr
    assert f"cannot seal {jdir}: a writer holds its lock" in lines[0], lines
    assert "sealed:" not in p.stdout
