"""ferrio.copy: trees copied byte for byte, errors as OSError, nothing partial left."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ferrio


def test_copies_a_tree_byte_for_byte(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    big = np.random.default_rng(3).integers(0, 256, (9 << 20) + 5, dtype=np.uint8)
    big.tofile(src / "a" / "big.bin")
    (src / "a" / "b" / "name with spaces ü").write_bytes(b"hello")
    (src / "empty").write_bytes(b"")
    os.symlink("a/big.bin", src / "link")
    report = ferrio.copy(src, tmp_path / "dst", recursive=True)
    assert report["files"] == 3 and report["bytes"] == big.nbytes + 5
    dst = tmp_path / "dst"
    assert (dst / "a" / "big.bin").read_bytes() == big.tobytes()
    assert (dst / "a" / "b" / "name with spaces ü").read_bytes() == b"hello"
    assert (dst / "empty").read_bytes() == b""
    assert os.readlink(dst / "link") == "a/big.bin"
    assert not [p for p in dst.rglob("*") if ".ferrio-" in p.name], "temporary files left"


def test_errors_are_oserrors_and_directories_need_recursive(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ferrio.copy(tmp_path / "missing", tmp_path / "x")
    (tmp_path / "d").mkdir()
    # As shutil.copy raises for a directory: IsADirectoryError, naming it and what to do.
    with pytest.raises(IsADirectoryError, match=r"recursive") as info:
        ferrio.copy(tmp_path / "d", tmp_path / "e")
    assert info.value.filename == str(tmp_path / "d")
    assert not (tmp_path / "e").exists()


def test_a_file_onto_itself_is_shutils_same_file_error(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"keep me")
    os.link(f, tmp_path / "hard")
    os.symlink("f", tmp_path / "soft")
    for dst in (f, tmp_path / "hard", tmp_path / "soft", tmp_path):
        # shutil.copy refuses each the same way (the last: the copy would be tmp_path / "f").
        with pytest.raises(shutil.SameFileError):
            shutil.copy(f, dst)
        with pytest.raises(shutil.SameFileError, match="same file"):
            ferrio.copy(f, dst)
        assert f.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "hard", "soft"]


def test_file_system_errors_are_oserrors_naming_the_path(tmp_path: Path) -> None:
    # Creating the temporary file fails (its directory is missing): Error::Fs in the library.
    (tmp_path / "f").write_bytes(b"data")
    with pytest.raises(FileNotFoundError) as info:
        ferrio.copy(tmp_path / "f", tmp_path / "no-such-dir" / "g")
    assert info.value.filename is not None
    assert "no-such-dir" in str(info.value.filename)
    assert "temporary file" in str(info.value)


def test_a_directory_loop_followed_is_an_oserror_naming_the_link(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    (src / "self").symlink_to(".")
    with pytest.raises(OSError) as info:
        ferrio.copy(src, tmp_path / "dst", recursive=True, follow_symlinks=True)
    assert info.value.errno == 40  # ELOOP
    assert str(info.value.filename).endswith("self")
    assert not isinstance(info.value, ferrio.FerrioError)


def test_an_empty_destination_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It copied the whole file to a temporary name in the working directory, then failed the
    # rename into ''.
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 100_000)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(FileNotFoundError):
        ferrio.copy(src, "")
    assert list(work.iterdir()) == []


def test_a_missing_destination_directory_reads_as_a_sentence(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x")
    dst = tmp_path / "no" / "such" / "dir.bin"
    with pytest.raises(FileNotFoundError) as e:
        ferrio.copy(src, dst)
    assert e.value.filename == str(dst)
    # Was "No such file or directory (create a temporary file for)".
    assert "(create a temporary file for it)" in str(e.value), e.value


def test_every_file_that_failed_is_named(tmp_path: Path) -> None:
    # The exception is the first failure; the others were skipped in silence (`ferrio cp`
    # names each on stderr).
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.bin").write_bytes(b"a")
    for name in ("fifo-1", "fifo-2", "fifo-3"):
        os.mkfifo(tree / name)
    with pytest.raises(ValueError) as e:  # a FIFO is not copied (as it is not read)
        ferrio.copy(tree, tmp_path / "out", recursive=True)
    notes = "\n".join(getattr(e.value, "__notes__", []))
    failed = [n for n in ("fifo-1", "fifo-2", "fifo-3") if n in str(e.value) or n in notes]
    assert len(failed) == 3, (str(e.value), notes)
    assert notes.startswith("2 more could not be copied"), notes
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"a"
