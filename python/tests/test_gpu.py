"""GPU arrays: CuPy, PyTorch CUDA tensors and DLPack-only objects, read into and written from.

Skipped without CuPy and a GPU; run for real on the GPU machine (make gpu-test)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import ferrio

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no GPU", allow_module_level=True)
except Exception as e:
    pytest.skip(f"no usable GPU: {e}", allow_module_level=True)

POISON = 0xA5


@pytest.fixture
def data_file(tmp_path: Any) -> tuple[str, np.ndarray]:
    rng = np.random.default_rng(5)
    data = rng.integers(0, 255, size=(24 << 20) + 4099, dtype=np.uint8)
    path = str(tmp_path / "data.bin")
    data.tofile(path)
    return path, data


@pytest.mark.parametrize("direct", ["off", "on", "auto"])
def test_random_offsets_into_cupy(data_file: tuple[str, np.ndarray], direct: str) -> None:
    path, data = data_file
    rng = np.random.default_rng(6)
    with ferrio.open(path, direct_read=direct) as f:
        for _ in range(10):
            offset = int(rng.integers(0, len(data)))
            size = int(rng.integers(1, len(data) - offset + 5000))
            dst = cp.full(size + 64, POISON, dtype=cp.uint8)
            n = f.read(dst[32 : 32 + size], offset=offset)
            want = data[offset : offset + size]
            assert n == len(want)
            got = cp.asnumpy(dst)
            assert (got[32 : 32 + n] == want).all()
            assert (got[:32] == POISON).all() and (got[32 + n :] == POISON).all()


@pytest.mark.parametrize("dtype", ["uint8", "float32", "int64", "complex128"])
def test_dtypes_shapes_and_write_back(tmp_path: Any, dtype: str) -> None:
    src = cp.arange(3 * 5 * 4096, dtype=dtype).reshape(3, 5, 4096)
    path = str(tmp_path / "x.bin")
    with ferrio.open(path, "w") as f:
        assert f.write(src) == src.nbytes
    assert (np.fromfile(path, dtype=dtype).reshape(src.shape) == cp.asnumpy(src)).all()
    back = cp.zeros_like(src)
    with ferrio.open(path) as f:
        fut = f.pread(back)
        assert fut.result() == src.nbytes
    assert bool((back == src).all())
    arr = ferrio.fromfile(path, dtype=dtype, shape=src.shape, device="cuda")
    assert isinstance(arr, cp.ndarray) and bool((arr == src).all())
    # An open file, from its position, as numpy.fromfile reads one.
    row = src[0].nbytes
    with open(path, "rb") as f:
        f.seek(row)
        arr = ferrio.fromfile(f, dtype, count=src[1:].size, device="cuda")
        assert f.tell() == src.nbytes
    assert isinstance(arr, cp.ndarray) and bool((arr == src[1:].reshape(-1)).all())


def test_non_contiguous_gpu_array_is_refused(data_file: tuple[str, np.ndarray]) -> None:
    path, _ = data_file
    a = cp.zeros((64, 64), dtype=cp.float32)
    with ferrio.open(path) as f, pytest.raises(ValueError, match="contiguous"):
        f.read(a[:, ::2])
    with ferrio.open(path) as f, pytest.raises(ValueError, match="larger"):
        f.read(a, size=a.nbytes + 1)


def test_torch_cuda_tensor(data_file: tuple[str, np.ndarray]) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    path, data = data_file
    t = torch.full((1 << 20,), 7, dtype=torch.uint8, device="cuda")
    with ferrio.open(path) as f:
        assert f.read(t, offset=4096) == 1 << 20
    assert (t.cpu().numpy() == data[4096 : 4096 + (1 << 20)]).all()


class DLPackOnly:
    """Exposes a CuPy array through DLPack alone (as JAX and others do)."""

    def __init__(self, a: Any) -> None:
        self._a = a

    def __dlpack__(self, stream: Any = None) -> Any:
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._a.__dlpack_device__()  # type: ignore[no-any-return]


def test_dlpack_only_object(data_file: tuple[str, np.ndarray]) -> None:
    path, data = data_file
    a = cp.full(3 << 20, POISON, dtype=cp.uint8)
    with ferrio.open(path) as f:
        assert f.read(DLPackOnly(a), offset=100) == 3 << 20
    assert (cp.asnumpy(a) == data[100 : 100 + (3 << 20)]).all()


def test_producer_stream_is_honoured(tmp_path: Any) -> None:
    # Work queued on a non-blocking stream must land before ferrio reads the array.
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.zeros(64 << 20, dtype=cp.uint8)
        a += 3
        path = str(tmp_path / "s.bin")
        with ferrio.open(path, "w") as f:
            f.write(a)
    assert (np.fromfile(path, dtype=np.uint8) == 3).all()
    assert os.path.getsize(path) == 64 << 20


def _two_gpus() -> int:
    n = int(cp.cuda.runtime.getDeviceCount())
    if n < 2:
        pytest.skip(f"needs two GPUs ({n} visible)")
    return n


def test_arrays_on_every_gpu_at_once(data_file: tuple[str, np.ndarray]) -> None:
    """One process, one file, an array on each GPU: the reads run at the same time (futures on
    the same workers), each through rings of its own GPU, and each array gets every byte."""
    path, data = data_file
    n = _two_gpus()
    arrays = []
    for g in range(n):
        with cp.cuda.Device(g):
            arrays.append(cp.full(len(data) + 64, POISON, dtype=cp.uint8))
    with ferrio.open(path) as f:
        # Each GPU gets a different offset, so a copy landing on the wrong GPU cannot pass.
        futures = [
            f.pread(a[32 : 32 + len(data) - g * 4096], offset=g * 4096)
            for g, a in enumerate(arrays)
        ]
        assert [fut.result() for fut in futures] == [len(data) - g * 4096 for g in range(n)]
    for g, a in enumerate(arrays):
        assert a.device.id == g
        got = cp.asnumpy(a)
        assert (got[32 : 32 + len(data) - g * 4096] == data[g * 4096 :]).all(), f"GPU {g}"
        assert (got[:32] == POISON).all() and (got[32 + len(data) - g * 4096 :] == POISON).all()


def test_write_from_every_gpu_at_once(tmp_path: Any) -> None:
    """Arrays on different GPUs written to one file at once, each to its own range."""
    n = _two_gpus()
    piece = (8 << 20) + 4096
    srcs = []
    for g in range(n):
        with cp.cuda.Device(g):
            srcs.append(cp.arange(piece, dtype=cp.uint8) + g)
            cp.cuda.runtime.deviceSynchronize()
    path = str(tmp_path / "multi.bin")
    with ferrio.open(path, "w") as f:
        futures = [f.pwrite(s, offset=g * piece) for g, s in enumerate(srcs)]
        assert [fut.result() for fut in futures] == [piece] * n
    got = np.fromfile(path, dtype=np.uint8)
    for g, s in enumerate(srcs):
        assert (got[g * piece : (g + 1) * piece] == cp.asnumpy(s)).all(), f"GPU {g}"
