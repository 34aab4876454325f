"""Files that are not plain regular files, zero-size GPU arrays and the device_threads form.

FIFOs, sockets and character devices are refused at once; block devices have a size; procfs
files that report size 0 are read to their end; a zero-length request on an empty GPU array
(null data pointer) returns 0 without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import is_root

import ferrio
from ferrio import config


def test_opening_a_fifo_raises_at_once_naming_the_path(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    # In a child process: before the fix the open blocked forever and ignored Ctrl-C.
    code = (
        "import sys, ferrio\n"
        "for mode in ('r', 'r+', 'w', 'a'):\n"
        "    try:\n"
        "        ferrio.open(sys.argv[1], mode)\n"
        "    except OSError as e:\n"
        "        assert e.filename == sys.argv[1], e\n"
        "        assert 'is a FIFO' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('opened ' + mode)\n"
        "print('refused')\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(fifo)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("ferrio.open(fifo) blocked")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "refused"


def test_a_character_device_is_refused() -> None:
    with pytest.raises(OSError, match="is a character device") as info:
        ferrio.open("/dev/null")
    assert info.value.filename == "/dev/null"


def test_fromfile_reads_a_size_zero_proc_file_to_its_end() -> None:
    path = "/proc/self/status"
    if os.stat(path).st_size != 0:
        pytest.skip(f"{path} does not report size 0 here")
    arr = ferrio.fromfile(path)
    text = arr.tobytes().decode()
    assert text.startswith("Name:"), text
    assert "\nPid:" in text
    # Offsets and whole items count as with any other file (later lines change between reads:
    # compare the first).
    first = text.split("\n", 1)[0]
    assert ferrio.fromfile(path, offset=5).tobytes().decode().startswith(first[5:] + "\n")
    words = ferrio.fromfile(path, dtype="<u4")
    assert words.nbytes == (len(arr) // 4) * 4


def test_fromfile_reads_a_sysfs_attribute_to_its_end() -> None:
    """sysfs says 4096 bytes for an attribute whatever it holds, as numpy.fromfile finds."""
    path = "/sys/class/net/lo/address"
    if not os.path.exists(path):
        pytest.skip(f"no {path} here")
    with open(path, "rb") as f:
        want = f.read()
    assert ferrio.fromfile(path).tobytes() == want


def test_fromfile_of_a_small_regular_file_is_as_for_any_other(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(bytes(range(256)) * 4)
    assert ferrio.fromfile(p).tobytes() == p.read_bytes()
    assert ferrio.fromfile(p, dtype="<u4", offset=3).tobytes() == p.read_bytes()[3:1023]
    assert ferrio.fromfile(p, count=2, dtype="<u2").tolist() == [0x0100, 0x0302]


@pytest.mark.parametrize("size", [3, 100_000])
def test_fromfile_refuses_a_dtype_of_no_size_whatever_the_file_size(
    tmp_path: Path, size: int
) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"a" * size)
    with pytest.raises(ValueError, match="has no size"):
        ferrio.fromfile(p, dtype="S0")


def test_drop_cache_of_a_generated_file_has_nothing_to_drop() -> None:
    """procfs files cannot be synced (EINVAL): nothing of theirs is in the page cache."""
    ferrio.drop_cache("/proc/version")
    assert ferrio.residency("/proc/version").cached_bytes == 0


def test_a_block_device_has_its_size(tmp_path: Path) -> None:
    if not is_root():
        pytest.skip("needs root (losetup)")
    img = tmp_path / "img"
    data = np.random.default_rng(3).integers(0, 255, size=2 << 20, dtype=np.uint8)
    data.tofile(img)
    made = subprocess.run(
        ["losetup", "-f", "--show", str(img)], capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0:
        pytest.skip(f"no loop device: {made.stderr.strip()}")
    dev = made.stdout.strip()
    try:
        with ferrio.open(dev) as f:
            assert f.size == data.nbytes
        assert np.array_equal(ferrio.fromfile(dev), data)
    finally:
        subprocess.run(["losetup", "-d", dev], timeout=60, check=False)


class EmptyCudaArray:
    """A zero-size GPU array as CuPy describes it: no memory, data pointer 0."""

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"shape": (0,), "typestr": "|u1", "data": (0, False), "version": 3}


def test_zero_size_gpu_arrays_move_nothing_without_cuda(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with ferrio.open(path, "r+") as f:
        assert f.read(EmptyCudaArray()) == 0
        assert f.write(EmptyCudaArray(), offset=3) == 0
        assert f.pread(EmptyCudaArray(), offset=2).result() == 0
        assert f.pwrite(EmptyCudaArray(), offset=2).result() == 0
    assert path.read_bytes() == b"0123456789"


def test_a_non_empty_gpu_array_still_needs_cuda(tmp_path: Path) -> None:
    class FakeCudaArray:
        @property
        def __cuda_array_interface__(self) -> dict[str, object]:
            return {"shape": (4,), "typestr": "|u1", "data": (0x1000, False), "version": 3}

    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

        pytest.skip("CuPy present: the GPU tests cover device arrays")
    except ImportError:
        pass
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with ferrio.open(path) as f, pytest.raises(ferrio.CudaUnavailableError):
        f.pread(FakeCudaArray()).result()


def test_device_threads_needs_a_pool_name(restore_settings: None) -> None:
    before = config.get("device_threads")
    for bad in ("=3", "nvme0=2,=3"):
        with pytest.raises(ValueError, match=r"FERRIO_DEVICE_THREADS|device_threads") as info:
            config.set(device_threads=bad)
        assert "NAME=N[,NAME=N...]" in str(info.value)
    assert config.get("device_threads") == before
