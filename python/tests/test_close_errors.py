"""Errors a file system reports only when a file is closed (NFS, CIFS, FUSE mounts of object
storage: written data that did not reach storage), on a FUSE file system made to fail every
close of some files (`fault_fs.py`). Python's `close()` raises them and `cp` exits 1: ferrio
ignored them, so a copy or a write that never reached storage reported success, and a copy
replaced its destination with it."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import cli

import ferrio
from ferrio.safetensors.numpy import save_file


def test_the_control_file_closes_cleanly(fault_fs: Path) -> None:
    # The same writes to a file whose close succeeds: what fails below is the close alone.
    with ferrio.open(fault_fs / "fine.bin", "w") as f:
        f.write(b"x" * 8192)
    assert (fault_fs / "fine.bin").read_bytes() == b"x" * 8192


def test_close_raises_what_closing_says(fault_fs: Path) -> None:
    path = fault_fs / "flush-fails.bin"
    f = ferrio.open(path, "w")
    f.write(b"x" * 8192)
    with pytest.raises(OSError) as e:
        f.close()
    assert e.value.errno == errno.EIO
    assert e.value.filename == str(path)
    assert f.closed
    f.close()  # closing again is allowed, and quiet
    with pytest.raises(OSError) as e, ferrio.open(fault_fs / "flush-fails.2.bin", "w") as g:
        g.write(b"y" * 100)
    assert e.value.errno == errno.EIO


def test_a_copy_that_fails_at_close_replaces_nothing(fault_fs: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"new" * 10_000)
    dst = fault_fs / "flush-fails.copy.bin"
    # The destination holds the old content (written with the close failing, as it does here).
    with open(dst, "wb") as old:
        old.write(b"old")
        with pytest.raises(OSError):
            old.close()
    with pytest.raises(OSError) as e:
        ferrio.copy(src, dst)
    assert e.value.errno == errno.EIO
    assert dst.read_bytes() == b"old"
    assert sorted(p.name for p in fault_fs.iterdir() if "copy" in p.name) == [dst.name]
    out = subprocess.run(cli("cp", str(src), str(dst)), capture_output=True, text=True)
    assert out.returncode == 1, out
    assert "Input/output error" in out.stderr
    assert dst.read_bytes() == b"old"


def test_the_cli_write_and_save_file_report_it(fault_fs: Path) -> None:
    out = subprocess.run(
        cli("write", "--no-sync", "--size", "1MiB", str(fault_fs / "flush-fails.w.bin")),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out
    assert "Input/output error" in out.stderr
    with pytest.raises(OSError) as e:
        save_file({"a": np.ones(9)}, fault_fs / "flush-fails.model.safetensors")
    assert e.value.errno == errno.EIO
    assert not list(fault_fs.glob("*model*"))
