"""`sej serve` keeps the offset files it overwrote in place open between bursts (sej.hub.serve_commit.Kept), and
writes a kept one only while its name still is that file: a journal moved aside and made again, an offset file
hard-linked, replaced by a symlink or cut to another size gets each commit where its name points now (or an error),
never lost in the old file; in a batch (one syncfs) as in a small run (each synced alone)."""

from __future__ import annotations

import os
import shutil

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


@pytest.mark.parametrize("which", ["ofs", "journal"])
def test_a_kept_offset_file_is_not_written_once_a_directory_on_its_path_became_a_symlink(tmp_path, which: str) -> None:
    """The journal's ofs/ (or the journal's directory) moved out of the root, a symlink left in its place: the kept
    file is no longer written (it now lies outside the root), the commit is refused as a fresh one is."""
    root = tmp_path / "root"
    (j,) = journals_root(root, 0)
    outside = tmp_path / "outside"
    outside.mkdir()
    conn = serving(str(root), restrict=True)
    try:
        assert _commit(conn, [j], 5) == [None]  # created
        assert _commit(conn, [j], 6) == [None]  # in place, kept
        moved = root / j / "ofs" if which == "ofs" else root / j
        os.rename(moved, outside / moved.name)
        os.symlink(outside / moved.name, moved)
        (got,) = _commit(conn, [j], 7)
    finally:
        conn.close()
    assert isinstance(got, UnsafeFileError), got
    held = outside / "ofs" / "hub.ofs" if which == "ofs" else outside / j / "ofs" / "hub.ofs"
    assert read_offset_file(str(held)) == 6, "the file outside the root keeps its value"


def test_a_batch_whose_root_cannot_be_opened_fails_each_commit_and_the_session_goes_on(tmp_path) -> None:
    root = tmp_path / "root"
    journals = journals_root(root, 5)
    assert len(journals) >= BATCH_FROM
    conn = serving(str(root))
    try:
        assert _commit(conn, journals, 5) == [None] * len(journals)
        os.rename(root, tmp_path / "moved")
        got = _commit(conn, journals, 6)
        assert len(got) == len(journals) and all(isinstance(g, Exception) for g in got), got
        os.rename(tmp_path / "moved", root)
        assert _commit(conn, journals, 7) == [None] * len(journals), "the same session commits again"
    finally:
        conn.close()
    assert all(read_offset_file(str(root / j / "ofs" / "hub.ofs")) == 7 for j in journals)
