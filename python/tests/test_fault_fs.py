"""File systems that misbehave as network ones do, made with FUSE (`fault_fs.py`).

Errors reported only when a file is closed (NFS, CIFS, FUSE mounts of object storage: written
data that did not reach storage): Python's `close()` raises them and `cp` exits 1; ferrio
ignored them, so a copy or a write that never reached storage reported success, and a copy
replaced its destination with it. And slow reads: a cancelled read stops within a block.
"""

from __future__ import annotations

import errno
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import cli, interrupt_when

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


def test_close_waits_for_writes_in_flight_and_says_what_closing_says(fault_fs: Path) -> None:
    # The check ran before a write still in flight had finished, so it said nothing of it.
    f = ferrio.open(fault_fs / "slow-writes-flush-fails.bin", "w", cache="keep")
    fut = f.pwrite(np.ones(1 << 20, dtype=np.uint8), offset=0)
    with pytest.raises(OSError) as e:
        f.close()
    assert e.value.errno == errno.EIO
    assert fut.done(), "close() returned before the write in flight was done"
    assert fut.result() == 1 << 20


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


def test_a_cancelled_cold_read_on_a_slow_file_system_stops_soon(fault_fs: Path) -> None:
    """A read that fills the page cache goes in 64 MiB tasks; on a file system that answers
    each 128 KiB after 20 ms one takes about 10 s, and a cancel (Ctrl-C) waited for the
    tasks running. They now stop between 2 MiB blocks."""
    path = fault_fs / "slow.bin"
    body = np.random.default_rng(5).integers(0, 256, 192 << 20, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(body.tobytes())
    ferrio.drop_cache(path)
    with ferrio.open(path, cache="keep") as f:
        buf = np.empty(body.size, dtype=np.uint8)
        fut = f.pread(buf)
        time.sleep(0.5)
        assert fut.cancel()
        t0 = time.monotonic()
        with pytest.raises(ferrio.CancelledError):
            fut.result(timeout=60)
        took = time.monotonic() - t0
    assert took < 3.0, f"the cancelled read took {took:.1f} s to stop"
    # The same file reads whole and right.
    with ferrio.open(path) as f:
        again = np.empty(2 << 20, dtype=np.uint8)
        assert f.read(again, offset=100 << 20) == again.size
    np.testing.assert_array_equal(again, body[100 << 20 : (100 << 20) + again.size])


def _fill_slow(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes())
    ferrio.drop_cache(path)


def _ctrl_c_after_a_while(*args: str) -> None:
    """Run `ferrio ARGS`, send Ctrl-C 1.5 s in: it must exit with 130 within 2.5 s."""
    proc = subprocess.Popen(
        cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    err, took = interrupt_when(proc, lambda: time.sleep(1.5), 60)
    assert proc.returncode == 130, err
    assert took < 2.5, f"exited {took:.1f} s after Ctrl-C"


def test_ctrl_c_stops_the_cli_read_of_a_slow_file_at_once(
    fault_fs: Path, python_sigint: None
) -> None:
    """`ferrio read` keeps two windows in flight. Ctrl-C cancelled the window it was waiting
    for and then waited for that window's tasks before cancelling the other one, whose 64 MiB
    fill task the pool's thread could be running meanwhile: about 10 s on this file system."""
    path = fault_fs / "slow.cli-read.bin"
    _fill_slow(path, 192 << 20)  # windows of 128 and 64 MiB, each in 64 MiB fill tasks
    _ctrl_c_after_a_while("read", "--threads", "1", str(path))


def test_ctrl_c_stops_the_cli_write_of_a_slow_file_soon(
    fault_fs: Path, python_sigint: None
) -> None:
    """`ferrio write` on a file system that takes 20 ms for each 4 KiB it is written stops
    within a task of Ctrl-C (a `pwrite` in progress is not interrupted: 64 KiB tasks here take
    0.3 s each), and removes the file it created."""
    path = fault_fs / "slow-writes.cli-write.bin"
    _ctrl_c_after_a_while(
        "write", "--threads", "1", "--task-size", "64KiB", "--size", "256MiB", str(path)
    )
    assert not path.exists()
