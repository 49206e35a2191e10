"""`sej serve` keeps the offset files it overwrote in place open between bursts (sej.hub.serve_commit.Kept), and
writes a kept one only while its name still is that file: a journal moved aside and made again, an offset file
hard-linked, replaced by a symlink or cut to another size gets each commit where its name points now (or an error),
never lost in the old file; in a batch (one syncfs) as in a small run (each synced alone)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import sej
from sej.errors import UnsafeFileError
from sej.hub.serve_commit import BATCH_FROM
from sej.offset import read_offset_file

from .test_hub_serve_commit import journals_root
from .test_hub_serve_protocol import serving


def _commit(conn, journals: list[str], value: int) -> list[object]:
    return conn.call_many([("commit_offset", j, "hub", value, False) for j in journals])


@pytest.mark.parametrize("alone", [False, True], ids=["batch", "alone"])
def test_a_kept_offset_file_is_written_only_while_its_name_still_points_to_it(tmp_path, alone: bool) -> None:
    root = tmp_path / "root"
    journals = journals_root(root, 6)[: 1 if alone else None]  # a batch (BATCH_FROM or more), or one alone
    run = len(journals)
    assert alone or run >= BATCH_FROM
    moved, linked, symlinked, cut = (journals * 4)[:4] if run == 1 else journals[:4]
    conn = serving(str(root))
    try:
        assert _commit(conn, journals, 5) == [None] * run  # created (temp file, rename)
        assert _commit(conn, journals, 6) == [None] * run  # opened, overwritten in place, kept
        assert _commit(conn, journals, 7) == [None] * run  # through the kept files
        ofs = {j: root / j / "ofs" / "hub.ofs" for j in journals}
        cases = [moved] if run == 1 else [moved, linked, symlinked, cut]
        if moved in cases:  # the journal moved aside, a new one made under its name (its hub offset: 2)
            os.rename(root / moved, tmp_path / "aside")
            shutil.copytree(tmp_path / "aside", root / moved)
            with sej.Offset(str(root / moved), "hub") as o:
                o.commit(2)
        if run > 1:
            os.link(ofs[linked], root / linked / "ofs" / "backup.ofs")
            os.rename(ofs[symlinked], tmp_path / "target.ofs")
            os.symlink(tmp_path / "target.ofs", ofs[symlinked])
            with open(ofs[cut], "r+b") as f:
                f.truncate(3)
        got = _commit(conn, journals, 8)
        assert _commit(conn, [j for j in journals if j != symlinked or run == 1], 9) == [None] * (
            run if run == 1 else run - 1
        )
    finally:
        conn.close()
    assert read_offset_file(str(tmp_path / "aside" / "ofs" / "hub.ofs")) == 7, "the old file kept its last commit"
    assert read_offset_file(str(ofs[moved])) == 9
    if run == 1:
        assert got == [None]
        return
    assert isinstance(got[journals.index(symlinked)], UnsafeFileError), got
    assert [g for j, g in zip(journals, got, strict=True) if j != symlinked] == [None] * (run - 1)
    assert os.path.islink(ofs[symlinked]) and read_offset_file(str(tmp_path / "target.ofs")) == 7, "left alone"
    assert read_offset_file(str(root / linked / "ofs" / "backup.ofs")) == 7, "the other name is left alone"
    assert os.stat(ofs[linked]).st_nlink == 1 and read_offset_file(str(ofs[linked])) == 9
    assert os.path.getsize(ofs[cut]) == 8 and read_offset_file(str(ofs[cut])) == 9
    for j in journals:
        if j != symlinked:
            assert read_offset_file(str(ofs[j])) == 9, j
