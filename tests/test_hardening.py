"""Issue 10's regressions: huge frames, bad indexes, damage in place, a deleted writer lock.

Each test failed on main before the fix (see the closing note of issue 10). Huge
frames are built as sparse files, so a 2 GiB message costs no disk until the hub
copies it.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner

import sej
from sej import index as idx
from sej.apps.cli.main import cli
from sej.hub.copy import CopyError, copy_journal
from sej.hub.local_source import LocalSource
from sej.layout import index_path, segment_path, sum_path, writer_lock_path
from sej.message import HEADER, I32, OVERHEAD, encode

from .conftest import REPO

BIG = 0x7FFFF000  # the most one read or pread returns on Linux
TS = 1_700_000_000 * 10**9


def sparse_journal(jdir: str, value_size: int = BIG, hole_after: int = 0) -> int:
    """A journal whose message 0 has a `value_size`-byte zero value (a sparse file), then message 1.

    `hole_after` more zero bytes (a hole) follow the frames. Returns message 0's frame size.
    """
    os.makedirs(os.path.join(jdir, "jnl"))
    total = OVERHEAD + value_size
    with open(segment_path(jdir, 0), "wb") as f:
        f.write(HEADER.pack(0, TS, 7, 0) + I32.pack(value_size))
        f.seek(total - 4)
        f.write(I32.pack(total))
        f.write(encode(1, TS + 1, 0, b"k", b"after the big one"))
        if hole_after:
            f.truncate(f.tell() + hole_after)
    return total


PEAK = (
    # The process's peak resident memory (VmHWM starts afresh at exec, unlike ru_maxrss, which a
    # child inherits from a big parent).
    "def PEAK_KIB():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1])\n"
)


def run_sej(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "sej.apps.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)  # fmt: skip


# -- 1. frames bigger than one read ------------------------------------------------------------------


def test_a_2_gib_message_reads_everywhere(tmp_path) -> None:  # type: ignore[no-untyped-def]
    jdir = str(tmp_path / "j")
    total = sparse_journal(jdir)
    assert sej.next_offset(jdir) == 2
    with sej.Scanner(jdir, 0, timeout=0) as s:
        first = next(s)
        assert (first.offset, first.type, len(first.value)) == (0, 7, BIG)
        assert first.value.count(0) == BIG
        del first
        assert next(s).value == b"after the big one"
    last = sej.last_messages(jdir, 2)
    assert [len(m.value) for m in last] == [BIG, len(b"after the big one")]
    del last
    with sej.Writer(jdir) as w:
        assert w.recovered is None
        assert w.next_offset == 2
        assert w.append(b"x") == 2
    assert os.path.getsize(segment_path(jdir, 0)) > total
    verify = run_sej("verify", jdir)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_hub_copies_a_2_gib_message_in_bounded_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    jdir = str(src / "big")
    sparse_journal(jdir)
    hub = tmp_path / "hub"
    code = (
        "import sys\n" + PEAK + "from sej.hub.copy import copy_journal\n"
        "from sej.hub.local_source import LocalSource\n"
        "r = copy_journal(LocalSource(sys.argv[1]), 'big', sys.argv[2], 'c1', 'hub')\n"
        "print(r.messages, r.next_offset, PEAK_KIB())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code, str(src), str(hub)], capture_output=True, text=True,
                       env=env, timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stderr
    messages, next_offset, maxrss_kib = map(int, p.stdout.split())
    assert (messages, next_offset) == (2, 2)
    assert maxrss_kib < 256 * 1024, f"the hub used {maxrss_kib} KiB for a 2 GiB message"
    copied = hub / "c1.big" / "jnl" / ("%016x.jnl" % 0)
    assert os.path.getsize(copied) == os.path.getsize(segment_path(jdir, 0))
    with open(copied, "rb") as a, open(segment_path(jdir, 0), "rb") as b:
        for _ in range(1 << 20):
            x, y = a.read(64 << 20), b.read(64 << 20)
            assert x == y
            if not x:
                break
    assert sej.Offset(jdir, "hub").value == 2


def test_a_hostile_3_gib_sparse_segment_costs_the_hub_no_memory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    jdir = str(src / "evil")
    os.makedirs(os.path.join(jdir, "jnl"))
    with open(segment_path(jdir, 0), "wb") as f:
        f.write(HEADER.pack(0, TS, 0, 0) + I32.pack(0x7FFFFF00))  # claims a 2 GiB value...
        f.truncate(3 << 30)  # ...in 3 GiB of holes: its size field is 0
    code = (
        "import sys\n" + PEAK + "from sej.hub.copy import CopyError, copy_journal\n"
        "from sej.hub.local_source import LocalSource\n"
        "try:\n"
        "    copy_journal(LocalSource(sys.argv[1]), 'evil', sys.argv[2], 'c1', 'hub')\n"
        "except CopyError as e:\n"
        "    print('CopyError', e, file=sys.stderr)\n"
        "print(PEAK_KIB())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "hub")], capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "CopyError" in p.stderr and "size field disagrees: says 0" in p.stderr
    assert int(p.stdout) < 256 * 1024
    assert os.path.getsize(tmp_path / "hub" / "c1.evil" / "jnl" / ("%016x.jnl" % 0)) == 0


def test_the_hub_streams_frames_bigger_than_its_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same path as a 2 GiB frame, with real data: reads of 64 KiB and frames of up to 1 MiB."""
    jdir = str(tmp_path / "src" / "j")
    values = [os.urandom(n) for n in (10, 300_000, 5, 1 << 20, 70_000, 65_536 - 26, 3)]
    with sej.Writer(jdir) as w:
        for v in values:
            w.append(v, key=b"k")
    r = copy_journal(LocalSource(str(tmp_path / "src")), "j", str(tmp_path / "hub"), "c", "hub", chunk=1 << 16)
    assert r.messages == len(values)
    dest = str(tmp_path / "hub" / "c.j")
    assert open(segment_path(dest, 0), "rb").read() == open(segment_path(jdir, 0), "rb").read()
    with sej.Scanner(dest, 0, timeout=0) as s:
        assert [m.value for m in s] == values
    # Its index is one the readers confirm: every entry lands on a frame.
    with open(segment_path(dest, 0), "rb") as f:
        loaded = idx.load(index_path(dest, 0), 0)
        assert loaded is not None and len(loaded) > 1
        from sej.segment import entry_confirmed

        assert all(entry_confirmed(f.fileno(), os.path.getsize(f.name), loaded, i) for i in range(len(loaded)))


# -- 2. an index whose max_ts lies -------------------------------------------------------------------


def timed_journal(jdir: str, n: int = 1000) -> list[int]:
    stamps = [TS + i * 10**6 for i in range(n)]
    with sej.Writer(jdir, segment_size=40_000) as w:
        for t in stamps:
            w.append(b"v" * 100, timestamp=t)
    return stamps


def forge_max_ts(jdir: str, value: int) -> int:
    """Set every index entry's max_ts to `value`; return how many entries were changed."""
    changed = 0
    for seg in sej.list_segments(jdir):
        path = index_path(jdir, seg.first_offset)
        loaded = idx.load(path, seg.first_offset)
        assert loaded is not None
        forged = idx.SparseIndex(seg.first_offset)
        for e in (loaded[i] for i in range(len(loaded))):
            forged.add(e.offset, e.position, value)
            changed += 1
        idx.save(path, forged)
    return changed


def test_a_lying_max_ts_does_not_make_time_seeks_skip(jdir: str) -> None:
    stamps = timed_journal(jdir)
    assert forge_max_ts(jdir, -(2**62)) > 20
    for k in (0, 100, 101, 555, 999):
        assert sej.offset_at_time(jdir, stamps[k]) == k
        with sej.Scanner.at_time(jdir, stamps[k], timeout=0) as s:
            assert next(s).offset == k
    start = "%d" % stamps[100]
    r = CliRunner().invoke(cli, ["scan", jdir, "--start", start, "--count"])
    assert r.exit_code == 0, r.output
    assert r.output == "900\n"


def test_a_max_ts_too_high_is_not_trusted_either(jdir: str) -> None:
    stamps = timed_journal(jdir)
    forge_max_ts(jdir, 2**62)
    for k in (0, 100, 777):
        assert sej.offset_at_time(jdir, stamps[k]) == k


# -- 3. an index entry that points at a frame stored inside a value ----------------------------------


def relay_journal(jdir: str) -> tuple[list[bytes], int]:
    """Ten messages; message 5's value is a whole, valid frame for offset 6. Returns (values, its position)."""
    values = [b"value %d" % i for i in range(10)]
    values[5] = encode(6, TS + 6, 0, b"", b"an embedded frame, not message 6")
    pos = 0
    with sej.Writer(jdir, durability="sync") as w:
        for i, v in enumerate(values):
            if i == 5:
                pos = os.path.getsize(segment_path(jdir, 0)) + w._fill  # type: ignore[attr-defined]
            w.append(v, timestamp=TS + i)
    return values, pos + HEADER.size + 4  # the embedded frame starts where message 5's value does


def test_a_forged_entry_inside_a_value_is_not_trusted(jdir: str) -> None:
    values, inner = relay_journal(jdir)
    path = index_path(jdir, 0)
    loaded = idx.load(path, 0)
    assert loaded is not None
    loaded.add(6, inner, TS + 6)  # what a stale or forged index might hold
    idx.save(path, loaded)
    with sej.Scanner(jdir, 6, timeout=0) as s:
        assert [m.value for m in s] == values[6:]
    assert sej.next_offset(jdir) == 10
    before = open(segment_path(jdir, 0), "rb").read()
    with sej.Writer(jdir, durability="sync") as w:
        assert w.recovered is None
        assert w.next_offset == 10
    assert open(segment_path(jdir, 0), "rb").read() == before
    assert not [n for n in os.listdir(os.path.join(jdir, "jnl")) if ".cut-" in n]


def test_entries_that_do_not_go_forward_from_the_segment_start_are_not_trusted(jdir: str) -> None:
    """Found by tests/test_fuzz.py: two entries at the same embedded frame, the second confirmed by a walk
    from the first (which was never checked), made the whole forged index trusted."""
    values, inner = relay_journal(jdir)
    forged = idx.SparseIndex(0)
    forged.add(6, inner, TS + 5)
    forged.add(6, inner, TS + 6)
    idx.save(index_path(jdir, 0), forged)
    with sej.Scanner(jdir, 6, timeout=0) as s:
        assert [m.value for m in s] == values[6:]
    assert sej.next_offset(jdir) == 10
    assert sej.offset_at_time(jdir, TS + 6) == 6
    with sej.Writer(jdir) as w:
        assert w.recovered is None and w.next_offset == 10


def test_recovery_never_cuts_on_the_index_word_alone(jdir: str) -> None:
    """Even an entry the checks accept cannot make recovery cut: a cut is confirmed from the segment's start."""
    values, inner = relay_journal(jdir)
    seg = segment_path(jdir, 0)
    with open(seg, "rb") as f:
        head = f.read(inner)
    # Entries for offsets 0 and 6 only, the second inside message 5's value, with a consistent max_ts.
    forged = idx.SparseIndex(0)
    forged.add(0, 0, TS)
    forged.add(6, inner, TS + 6)
    idx.save(index_path(jdir, 0), forged)
    with sej.Writer(jdir, durability="sync") as w:
        assert w.recovered is None and w.next_offset == 10
    assert open(seg, "rb").read().startswith(head)
    with sej.Scanner(jdir, 0, timeout=0) as s:
        assert [m.value for m in s] == values


# -- 4. damage in the middle of the live segment -------------------------------------------------------


def damaged_journal(jdir: str) -> int:
    """100 messages of 100 bytes, message 10's value_size set to 2**30. Returns message 10's position."""
    with sej.Writer(jdir) as w:
        for i in range(100):
            w.append(b"%100d" % i, timestamp=TS + i)
    frame = OVERHEAD + 100
    pos = 10 * frame
    with open(segment_path(jdir, 0), "r+b") as f:
        f.seek(pos + HEADER.size)
        f.write(struct.pack(">i", 2**30))
    return pos


def test_a_damaged_size_in_the_live_segment_fails_readers_fast(jdir: str) -> None:
    pos = damaged_journal(jdir)
    got = []
    with pytest.raises(sej.CorruptionError, match="damaged frame") as e, sej.Scanner(jdir, 0, timeout=60) as s:
        for m in s:
            got.append(m.offset)
    assert got == list(range(10))
    assert e.value.position == pos
    with pytest.raises(sej.CorruptionError, match="damaged frame"):
        sej.offset_at_time(jdir, TS + 50)


def test_verify_calls_damage_in_place_corruption_not_a_torn_tail(jdir: str) -> None:
    pos = damaged_journal(jdir)
    r = run_sej("verify", jdir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"byte {pos}" in r.stdout and "damaged frame" in r.stdout
    assert "(a torn tail)" not in r.stdout
    assert "100 messages" in r.stdout  # the whole frames after the damage are counted


def test_the_hub_refuses_damage_in_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    jdir = str(tmp_path / "src" / "j")
    pos = damaged_journal(jdir)
    # The damaged bytes disagree with their checksum: the block holding them is not copied at all.
    with pytest.raises(CopyError, match=r"0000000000000000\.jnl: checksum mismatch in bytes 0\.\.") as e:
        copy_journal(LocalSource(str(tmp_path / "src")), "j", str(tmp_path / "hub"), "c", "hub")
    end = int(re.search(r"bytes 0\.\.(\d+)", str(e.value)).group(1))  # type: ignore[union-attr]
    assert pos < end
    assert sej.next_offset(str(tmp_path / "hub" / "c.j")) <= 10
    # Without checksums (a Go producer), the frame walk finds the damage in place.
    shutil.rmtree(tmp_path / "hub")
    os.remove(sum_path(jdir, 0))
    with pytest.raises(CopyError, match=f"byte {pos}.*whole frames for offsets 11..99"):
        copy_journal(LocalSource(str(tmp_path / "src")), "j", str(tmp_path / "hub"), "c", "hub")
    assert sej.next_offset(str(tmp_path / "hub" / "c.j")) == 10


def test_a_writer_without_the_index_keeps_what_follows_the_damage(jdir: str) -> None:
    damaged_journal(jdir)
    os.remove(index_path(jdir, 0))
    size = os.path.getsize(segment_path(jdir, 0))
    with pytest.warns(sej.CorruptionWarning, match="damaged frame"), sej.Writer(jdir) as w:
        assert w.recovered is None
        assert w.next_offset == 100
    assert os.path.getsize(segment_path(jdir, 0)) == size
    assert sej.next_offset(jdir) == 100


def test_next_offset_is_where_the_writer_opens_when_the_index_skips_damage(jdir: str) -> None:
    """Found by tests/test_fuzz.py: next_offset walked from the last confirmed index entry only (7
    here), while recovery walks again from byte 0 and cuts at the first damaged frame (and opens at
    1): offsets next_offset had reported would have been handed out again."""
    with sej.Writer(jdir) as w:
        for i in range(8):
            w.append(bytes([65 + i]) * 2100, timestamp=TS + i)  # 2126-byte frames: entries at 0, 2, 4, 6
    with open(segment_path(jdir, 0), "r+b") as f:
        for frame in (1, 7):  # damage the offset fields of frames 1 and 7 in place
            f.seek(frame * 2126)
            f.write(b"\xff")
    with pytest.raises(sej.CorruptionError, match="end is unknown.*at byte 2126"):
        sej.next_offset(jdir)  # frame 7 (offset field damaged too) does not chain back to frame 1
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir) as w:
        assert w.next_offset == 1
    assert sej.next_offset(jdir) == 1


def test_an_index_entry_past_a_stuck_frame_fails_readers_fast(jdir: str) -> None:
    """Found by tests/test_fuzz.py: message 10's size damaged and the file cut inside message 99 (no whole
    frame at the end to chain back from): a Scanner read 10 messages and waited silently, although the
    index holds entries for frames the writer wrote past the stuck one."""
    pos = damaged_journal(jdir)
    with open(segment_path(jdir, 0), "r+b") as f:
        f.truncate(100 * (OVERHEAD + 100) - 7)
    got = []
    with pytest.raises(sej.CorruptionError, match="the index shows a whole frame") as e, \
            sej.Scanner(jdir, 0, timeout=60) as s:  # fmt: skip
        for m in s:
            got.append(m.offset)
    assert got == list(range(10)) and e.value.position == pos
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir) as w:  # recovery cuts at the damage, kept aside
        assert w.next_offset == 10 and w.recovered is not None and w.recovered.quarantine is not None


def test_damage_in_place_needs_the_frames_after_it_to_start_where_it_ends(jdir: str) -> None:
    """Found by tests/test_fuzz.py: frame 0's offset damaged, frames 1 and 2 whole, and a stray frame for
    offset 1 appended at the end. The stray frame 'chained back' to the damage, so the writer kept it all
    and appended at 2, an offset the file already held."""
    with sej.Writer(jdir) as w:
        for i in range(3):
            w.append(b"%40d" % i, timestamp=TS + i)
    seg = segment_path(jdir, 0)
    with open(seg, "r+b") as f:
        f.write(b"\xff")
        f.seek(0, os.SEEK_END)
        f.write(encode(1, TS, 0, b"", b"stray"))
    size = os.path.getsize(seg)
    with pytest.raises(sej.CorruptionError, match="end is unknown"):
        sej.next_offset(jdir)
    with pytest.warns(sej.CorruptionWarning), sej.Writer(jdir) as w:
        assert w.next_offset == 0 and w.recovered is not None
        assert w.recovered.position == 0 and os.path.getsize(w.recovered.quarantine) == size


def test_next_offset_fails_when_later_frames_do_not_chain_to_the_damage(jdir: str) -> None:
    """Found by tests/test_fuzz.py: frame 2 damaged, and the trailer of frame 5 too, under a live writer that
    appended 6 and 7. next_offset said 2 (where a writer opening now would cut) while the live writer
    was at 8. Whole later frames that do not chain back to the damage leave the end unknown: it raises."""
    w = sej.Writer(jdir, durability="flush")
    try:
        for i in range(6):
            w.append(b"%d" % i * 40, timestamp=TS + i)
        w.flush()
        frame = 26 + 40
        with open(segment_path(jdir, 0), "r+b") as f:
            f.seek(2 * frame + 17)  # frame 2's key size
            f.write(b"\x7f")
            f.seek(6 * frame - 1)  # frame 5's trailing size
            f.write(b"\x00")
        w.append(b"six", timestamp=TS + 6)
        w.append(b"seven", timestamp=TS + 7)
        w.flush()
        assert w.next_offset == 8
        with pytest.raises(sej.CorruptionError, match=f"end is unknown.*at byte {2 * frame}"):
            sej.next_offset(jdir)
        with pytest.raises(sej.CorruptionError):
            sej.last_messages(jdir, 1)
        with pytest.raises(sej.CorruptionError, match="whole frames for offsets 6..7"):
            list(sej.Scanner(jdir, 0, timeout=0))
    finally:
        w.close()


def test_last_messages_past_damage_in_place_are_those_after_it(jdir: str) -> None:
    """Found by tests/test_fuzz.py: with a frame damaged in place, next_offset named the offset after the
    whole frames that follow it, but last_messages ended before the damage."""
    damaged_journal(jdir)
    assert sej.next_offset(jdir) == 100
    assert [m.offset for m in sej.last_messages(jdir, 3)] == [97, 98, 99]
    assert len(sej.last_messages(jdir, 89)) == 89  # offsets 11..99: everything after the damage
    with pytest.raises(sej.CorruptionError):
        sej.last_messages(jdir, 90)
    os.remove(index_path(jdir, 0))  # without the index, the tail walk itself meets the damage
    assert [m.offset for m in sej.last_messages(jdir, 3)] == [97, 98, 99]
    assert len(sej.last_messages(jdir, 89)) == 89
    with pytest.raises(sej.CorruptionError, match="damaged frame.*reach back past it"):
        sej.last_messages(jdir, 90)


# -- 7. a deleted writer lock ------------------------------------------------------------------------


def test_a_writer_whose_lock_file_was_deleted_stops_before_writing_more(jdir: str) -> None:
    w1 = sej.Writer(jdir)
    for i in range(5):
        w1.append(b"one %d" % i)
    w1.flush()
    os.remove(writer_lock_path(jdir))  # what the Go writer's close, or an operator, does
    with pytest.raises(sej.LockedError, match="jnl is locked"):
        sej.Writer(jdir)  # the lock path now names a new file, but w1's lock on jnl/ keeps a second sej writer out
    # A Go writer takes only jnl.lck, so it could get in now: w1 stops before writing more.
    w1.append(b"never written")
    with pytest.raises(sej.LockLostError, match="jnl.lck was replaced"):
        w1.sync()
    with pytest.raises(sej.LockLostError):
        w1.append(b"x" * 100_000)  # spills: checks again, writes nothing
    with pytest.raises(sej.LockLostError):
        w1.close()
    assert w1.closed
    with sej.Writer(jdir) as w2:  # w1 is gone: the next writer opens after its messages
        assert w2.append(b"two") == 5
    with sej.Scanner(jdir, 0, timeout=0) as s:
        assert [m.value for m in s] == [b"one %d" % i for i in range(5)] + [b"two"]


def test_a_deleted_lock_file_is_noticed_at_rollover(jdir: str) -> None:
    w1 = sej.Writer(jdir, segment_size=1000, durability="flush")
    w1.append(b"a" * 100)
    os.remove(writer_lock_path(jdir))
    with pytest.raises(sej.LockLostError, match="jnl.lck was deleted"):
        for _ in range(100):
            w1.append(b"a" * 100)  # the roll at 1000 bytes checks
    with pytest.raises(sej.LockLostError):
        w1.close()
    assert sej.next_offset(jdir) < 12


def test_the_writer_never_follows_a_link_or_opens_a_fifo_at_its_index_path(jdir: str) -> None:
    """The index appender opens its file at every flush that added an entry: only a regular file."""
    w = sej.Writer(jdir)
    ipath = index_path(jdir, 0)
    target = os.path.join(os.path.dirname(jdir), "elsewhere")
    with open(target, "wb"):
        pass
    os.replace(ipath, ipath + ".away")
    os.symlink(target, ipath)
    for _ in range(100):  # past an index entry (every 4 KiB)
        w.append(b"v" * 100)
    with pytest.raises(sej.UnsafeFileError) as e:
        w.flush()
    assert e.value.path == ipath and e.value.kind == "symlink"
    assert os.path.getsize(target) == 0, "nothing written through the link"
    os.unlink(ipath)
    os.mkfifo(ipath)
    with pytest.raises(sej.UnsafeFileError) as e:
        w.flush()  # returns at once: a FIFO without a reader would block a plain open
    assert e.value.kind == "FIFO"
    os.unlink(ipath)
    w.flush()  # removed: it stays removed (readers rebuild a missing index), no headless file appears
    assert not os.path.exists(ipath)
    w.close()
    with sej.Scanner(jdir, 50, timeout=0) as s:
        assert next(iter(s)).offset == 50
