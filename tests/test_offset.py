"""Reader offsets: locking, defaults, atomic commits, validation."""

from __future__ import annotations

import os

import pytest

import sej


@pytest.fixture
def journal(jdir: str) -> str:
    with sej.Writer(jdir, segment_size=300) as w:
        w.append_many([b"x" * 20] * 40)
    return jdir


def test_defaults_first_and_last(journal: str) -> None:
    os.remove(sej.list_segments(journal)[0].path)
    first = sej.first_offset(journal)
    assert first > 0
    with sej.Offset(journal, "a") as o:
        assert o.value == first
    with sej.Offset(journal, "b", default="last") as o:
        assert o.value == 40
    assert not os.path.exists(os.path.join(journal, "ofs", "a.ofs")), "nothing is written until commit"


def test_commit_is_eight_bytes_big_endian_and_persists(journal: str) -> None:
    with sej.Offset(journal, "reader-1_x") as o:
        o.commit(0x0102030405060708)
        assert o.value == 0x0102030405060708
    path = os.path.join(journal, "ofs", "reader-1_x.ofs")
    assert open(path, "rb").read() == bytes([1, 2, 3, 4, 5, 6, 7, 8])
    with sej.Offset(journal, "reader-1_x") as o:
        assert o.value == 0x0102030405060708
    assert sej.list_readers(journal) == ["reader-1_x"]
    assert not [f for f in os.listdir(os.path.join(journal, "ofs")) if f.endswith(".tmp")]


def test_reader_lock_in_same_process(journal: str) -> None:
    o = sej.Offset(journal, "r")
    with pytest.raises(sej.LockedError, match="r.lck"):
        sej.Offset(journal, "r")
    o.close()
    o.close()
    with pytest.raises(sej.ClosedError):
        o.commit(3)
    sej.Offset(journal, "r").close()
    assert os.path.exists(os.path.join(journal, "ofs", "r.lck"))


@pytest.mark.parametrize("name", ["", "a b", "../x", "a/b", ".", "..", "x.ofs", "r\0", "é", "a" * 201, None, 5])
def test_bad_reader_names(journal: str, name: object) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="reader name"):
        sej.Offset(journal, name)  # type: ignore[arg-type]


def test_names_are_anchored(journal: str) -> None:
    with pytest.raises(sej.InvalidArgumentError):
        sej.Offset(journal, "ok\n")


@pytest.mark.parametrize("value", [-1, 2**64, 1.0, "3", True, None])
def test_bad_commit_values(journal: str, value: object) -> None:
    with sej.Offset(journal, "r") as o, pytest.raises(sej.InvalidArgumentError, match="offset must be"):
        o.commit(value)  # type: ignore[arg-type]


def test_bad_default_and_missing_journal(journal: str, tmp_path) -> None:
    with pytest.raises(sej.InvalidArgumentError, match="default"):
        sej.Offset(journal, "r", default="middle")  # type: ignore[arg-type]
    with pytest.raises(sej.InvalidArgumentError, match="does not exist"):
        sej.Offset(str(tmp_path / "missing"), "r")


@pytest.mark.parametrize("content", [b"\0", b"\0" * 7, b"\0" * 9])
def test_malformed_offset_file_is_a_corruption_error(journal: str, content: bytes) -> None:
    os.makedirs(os.path.join(journal, "ofs"), exist_ok=True)
    with open(os.path.join(journal, "ofs", "r.ofs"), "wb") as f:
        f.write(content)
    with pytest.raises(sej.CorruptionError, match="not 8"):
        sej.Offset(journal, "r")
    # The lock was released on failure.
    os.remove(os.path.join(journal, "ofs", "r.ofs"))
    sej.Offset(journal, "r").close()
