"""Conveniences over `File` for whole-file reads; numpy is imported only when used."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ferrio._native import open as _open

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def fromfile(
    path: str | os.PathLike[str],
    dtype: npt.DTypeLike = "uint8",
    count: int = -1,
    offset: int = 0,
    *,
    shape: int | tuple[int, ...] | None = None,
) -> np.ndarray[Any, np.dtype[Any]]:
    """Read a binary file into a new numpy array, like `numpy.fromfile`, in parallel.

    Reads `count` items of `dtype` (-1: as many whole items as the file holds after
    `offset`) starting `offset` bytes into the file, or exactly ``prod(shape)`` items shaped
    `shape`. Raises ValueError if the file is shorter than asked. Needs numpy.
    """
    try:
        import numpy as np
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ferrio.fromfile needs numpy: pip install numpy") from e

    dt = np.dtype(dtype)
    if offset < 0:
        raise ValueError(f"offset must be at least 0, not {offset}")
    if shape is not None and count != -1:
        raise ValueError("give count or shape, not both")
    with _open(path, "r") as f:
        if shape is not None:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            items = int(np.prod(dims, dtype=np.int64))
        else:
            items = count if count >= 0 else max(f.size - offset, 0) // max(dt.itemsize, 1)
            dims = (items,)
        arr = np.empty(dims, dtype=dt)
        got = f.read(arr, offset=offset)
    if got != arr.nbytes:
        raise ValueError(
            f"{os.fspath(path)!r} holds {got} bytes after offset {offset}, "
            f"fewer than the {arr.nbytes} asked for"
        )
    return arr
