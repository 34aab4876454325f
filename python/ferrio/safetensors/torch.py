"""``safetensors.torch``'s functions, read and written by ferrio: swap the import to migrate.

``from ferrio.safetensors.torch import load_file, save_file`` loads into torch tensors on the
CPU or a GPU (``device="cuda:0"``); see :mod:`ferrio.safetensors` for ownership and sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ferrio.safetensors import PathLike, SafetensorError, safe_open, save, save_file
from ferrio.safetensors import load as _load
from ferrio.safetensors import load_file as _load_file

__all__ = ["SafetensorError", "load", "load_file", "safe_open", "save", "save_file"]


def load_file(
    filename: PathLike | Sequence[PathLike],
    device: Any = "cpu",
    *,
    backend: str | None = None,
    tensor_filter: Sequence[str] | None = None,
    process_group: Any = None,
) -> dict[str, Any]:
    """Load a file, directory of shards or index into torch tensors on `device`.

    With a ``torch.distributed`` ``process_group`` each rank reads its share and the ranks
    exchange the rest (see :class:`ferrio.safetensors.safe_open`).
    """
    return _load_file(
        filename, device, framework="pt", tensor_filter=tensor_filter, process_group=process_group
    )


def load(data: bytes) -> dict[str, Any]:
    """Load torch tensors (CPU) from the bytes of a safetensors file."""
    return _load(data, framework="pt")
