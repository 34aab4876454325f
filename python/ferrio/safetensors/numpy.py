"""``safetensors.numpy``'s functions, read and written by ferrio: swap the import to migrate.

numpy has no bfloat16 or 8-bit float types: loading such a tensor raises ``TypeError``, as
``safetensors.numpy`` does (select the others with ``tensor_filter``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ferrio.safetensors import PathLike, SafetensorError, safe_open
from ferrio.safetensors import load as _load
from ferrio.safetensors import load_file as _load_file
from ferrio.safetensors import save as _save
from ferrio.safetensors import save_file as _save_file

__all__ = ["SafetensorError", "load", "load_file", "safe_open", "save", "save_file"]


def load_file(
    filename: PathLike | Sequence[PathLike],
    *,
    backend: str | None = None,
    tensor_filter: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Load a file, directory of shards or index into numpy arrays."""
    return _load_file(filename, "cpu", framework="numpy", tensor_filter=tensor_filter)


def load(data: bytes) -> dict[str, Any]:
    """Load numpy arrays from the bytes of a safetensors file."""
    return _load(data, framework="numpy")


# `tensor_dict`, as safetensors.numpy names it, so that calls by keyword carry over.
def save_file(
    tensor_dict: Mapping[str, Any],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    fsync: bool = False,
) -> None:
    """Write numpy arrays to `filename` (see :func:`ferrio.safetensors.save_file`)."""
    _save_file(tensor_dict, filename, metadata, fsync=fsync)


def save(tensor_dict: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """Return the bytes of a safetensors file holding numpy arrays (identical to safetensors')."""
    return _save(tensor_dict, metadata)
