"""Conveniences over `File` for whole-file reads; numpy is imported only when used."""

from __future__ import annotations

import io
import os
from typing import IO, TYPE_CHECKING, Any

from ferrio._native import RemoteFile as _RemoteFile
from ferrio._native import local_path as _local_path
from ferrio._native import open as _open

# The largest file `fromfile` reads to its end with one plain read when `count` is -1 (a sysfs
# attribute reports 4096 bytes whatever it holds; a binary one up to its size).
_SMALL_FILE = 64 << 10

if TYPE_CHECKING:
    import numpy.typing as npt


def fromfile(
    file: str | bytes | os.PathLike[str] | os.PathLike[bytes] | IO[bytes],
    dtype: npt.DTypeLike = "uint8",
    count: int = -1,
    sep: str = "",
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

    `file` is a path, a ``file:`` URL, an object URL (``s3://...``, see `open_url`) or, as in
    numpy, an open binary file of a local regular file or block device: then `offset` counts from
    its current position, and the position ends after the bytes read. The positional order is
    numpy's (`sep` before `offset`); `sep` must be ``""`` (binary): text files are numpy's.

    `device` ``"cpu"`` gives a numpy array; ``"cuda"`` or ``"cuda:N"`` a CuPy array on GPU N
    (needs CuPy), filled straight from the file through ferrio's pinned bounce buffers.
    """
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferrio.fromfile needs numpy: pip install numpy") from e

    if not isinstance(sep, str):
        raise TypeError(
            f"sep must be a str, not {type(sep).__name__}: offset is the 5th argument, after "
            "sep, as in numpy.fromfile (or give it by name: offset=...)"
        )
    if sep:
        raise ValueError(f"sep must be '' (a binary file), not {sep!r}: text is numpy.fromfile's")
    if offset < 0:
        raise ValueError(f"offset must be at least 0, not {offset}")
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"cannot read into an array of Python objects (dtype {dt})")
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no size: give one of at least one byte (e.g. 'S1')")
    if shape is not None and count != -1:
        raise ValueError("give count or shape, not both")
    if isinstance(file, (str, bytes, os.PathLike)):
        path = _local_path(file)  # a file:/ URL's path: the small-file read opens it too
        return _read_path(path, os.fsdecode(path), dt, count, offset, shape, device)
    if not hasattr(file, "fileno"):
        raise TypeError(f"expected a path or an open binary file, not {type(file).__name__}")
    # numpy reads an open file from its position and leaves it after what it read.
    if isinstance(file, io.TextIOBase):
        raise TypeError("fromfile reads a file opened in binary mode ('rb'), not text mode")
    name = str(getattr(file, "name", file))
    if hasattr(file, "readable") and not file.readable():
        raise io.UnsupportedOperation(f"{name!r} is not open for reading")
    if hasattr(file, "writable") and file.writable():
        file.flush()  # bytes written through the object reach the file first
    start = file.tell()
    at = f"/proc/self/fd/{file.fileno()}"  # the same file, opened anew for ferrio's reads
    arr = _read_path(at, name, dt, count, start + offset, shape, device)
    file.seek(start + offset + arr.nbytes)
    return arr


def _read_path(
    path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
    name: str,
    dt: Any,
    count: int,
    offset: int,
    shape: int | tuple[int, ...] | None,
    device: str,
) -> Any:
    """`fromfile` of the file at `path`, called `name` in errors."""
    import numpy as np

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
            f"{name!r} holds {got} bytes after offset {offset}, "
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
