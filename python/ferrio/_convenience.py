"""Conveniences over `File` for whole-file reads; numpy is imported only when used."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ferrio._native import RemoteFile as _RemoteFile
from ferrio._native import local_path as _local_path
from ferrio._native import open as _open

# The largest file `fromfile` reads to its end with one plain read when `count` is -1 (a sysfs
# attribute reports 4096 bytes whatever it holds; a binary one up to its size).
_SMALL_FILE = 64 << 10

if TYPE_CHECKING:
    import numpy.typing as npt


def fromfile(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
    dtype: npt.DTypeLike = "uint8",
    count: int = -1,
    offset: int = 0,
    *,
    shape: int | tuple[int, ...] | None = None,
    device: str = "cpu",
) -> Any:
    """Read a binary file into a new array, like `numpy.fromfile`, in parallel.

    Reads `count` items of `dtype` (-1: as many whole items as the file holds after
    `offset`) starting `offset` bytes into the file, or exactly ``prod(shape)`` items shaped
    `shape`. Raises ValueError if the file is shorter than asked. A file that reports size 0
    (procfs files do, whatever they hold), or at most 64 KiB (sysfs files say 4096), is read to
    its end when `count` is -1.
    Needs numpy.

    `device` ``"cpu"`` gives a numpy array; ``"cuda"`` or ``"cuda:N"`` a CuPy array on GPU N
    (needs CuPy), filled straight from the file through ferrio's pinned bounce buffers.
    """
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferrio.fromfile needs numpy: pip install numpy") from e

    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"cannot read into an array of Python objects (dtype {dt})")
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no size: give one of at least one byte (e.g. 'S1')")
    if offset < 0:
        raise ValueError(f"offset must be at least 0, not {offset}")
    if shape is not None and count != -1:
        raise ValueError("give count or shape, not both")
    path = _local_path(path)  # a file:/ URL's path: the small-file read below opens it too
    with _open(path, "r") as f:
        local = not isinstance(f, _RemoteFile)  # an object's size is what it holds
        if local and shape is None and count < 0 and f.size <= _SMALL_FILE:
            # procfs files report size 0 and sysfs attributes 4096, whatever they hold: a small
            # file is read to its end, as numpy.fromfile does (one plain read; for a regular file
            # the same bytes, and as fast: the pools pay off on large files).
            return _read_to_end(path, dt, offset, device)
        if shape is not None:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            items = int(np.prod(dims, dtype=np.int64))
        else:
            items = count if count >= 0 else max(f.size - offset, 0) // dt.itemsize
            dims = (items,)
        arr = _empty(dims, dt, device)
        got = f.read(arr, offset=offset)
    if got != arr.nbytes:
        raise ValueError(
            f"{os.fspath(path)!r} holds {got} bytes after offset {offset}, "
            f"fewer than the {arr.nbytes} asked for"
        )
    return arr


def _read_to_end(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes], dt: Any, offset: int, device: str
) -> Any:
    """Return the whole items from `offset` to the end of `path`, read sequentially."""
    import numpy as np

    with open(path, "rb") as raw:
        raw.seek(offset)
        data = bytearray(raw.read())
    items = len(data) // max(dt.itemsize, 1)
    host = np.frombuffer(data, dtype=dt, count=items)
    arr = _empty((items,), dt, device)
    if device == "cpu":
        arr[...] = host
    else:
        arr.set(host)
    return arr


def _empty(dims: tuple[int, ...], dt: Any, device: str) -> Any:
    """Return an uninitialised array on `device` ("cpu", "cuda", "cuda:N")."""
    import numpy as np

    if device == "cpu":
        return np.empty(dims, dtype=dt)
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferrio.fromfile(device='cuda') needs CuPy") from e
    with cupy.cuda.Device(int(index or 0)):
        return cupy.empty(dims, dtype=dt)
