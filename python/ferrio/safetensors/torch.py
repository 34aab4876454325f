"""``safetensors.torch``'s functions, read and written by ferrio: swap the import to migrate.

``from ferrio.safetensors.torch import load_file, save_file`` loads into torch tensors on the
CPU or a GPU (``device="cuda:0"``); see :mod:`ferrio.safetensors` for ownership and sharding.
``save_model`` and ``load_model`` save and load a module whose tensors share memory (tied
weights), as ``safetensors.torch``'s do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ferrio.safetensors import PathLike, SafetensorError, safe_open, save, save_file
from ferrio.safetensors import load as _load
from ferrio.safetensors import load_file as _load_file
from ferrio.safetensors._frameworks import overlapping

__all__ = [
    "SafetensorError",
    "load",
    "load_file",
    "load_model",
    "safe_open",
    "save",
    "save_file",
    "save_model",
]


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


def save_model(
    model: Any,
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    force_contiguous: bool = True,
) -> None:
    """Save a module's ``state_dict()`` to `filename`, each shared tensor once.

    Where names of the state dict share memory (tied weights: an ``lm_head.weight`` that is the
    embedding's), one name is kept, the lexicographically first of those that cover their whole
    storage, and the others are left out; the metadata maps each left-out name to the one kept
    (a key the caller's `metadata` already has is not overwritten, and the caller's dict is not
    changed). With `force_contiguous` (the default) tensors are saved as their contiguous values.
    The bytes equal ``safetensors.torch.save_model``'s for the same module. Names that share
    memory with none of them covering it all raise ``RuntimeError``, as in ``safetensors``;
    a lone tensor that views part of its storage is saved as its own bytes, where
    ``safetensors`` refuses it.
    """
    state = dict(model.state_dict())
    meta = None if metadata is None else dict(metadata)
    for kept, left_out in _names_to_leave_out(state).items():
        for name in left_out:
            meta = {} if meta is None else meta
            meta.setdefault(name, kept)
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    try:
        save_file(state, filename, metadata=meta)
    except ValueError as e:
        if force_contiguous or "non contiguous" not in str(e):
            raise
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True).") from e


def load_model(
    model: Any,
    filename: PathLike | Sequence[PathLike],
    strict: bool = True,
    device: Any = "cpu",
    *,
    backend: str | None = None,
) -> tuple[set[str], list[str]]:
    """Load a checkpoint (file, directory of shards or index) into `model`'s tensors.

    Each file's tensors are read onto `device` (one buffer per file, freed before the next file
    is read), then copied into the module's own with ``model.load_state_dict``: beside the
    module, memory on `device` holds one file's bytes at a time, as a loop of
    ``safetensors.torch.load_model`` over the shards does. Every file's header, size and dtypes
    are checked before anything is copied in, so a malformed or truncated file, or a dtype this
    torch lacks, leaves the module as it was; a read that fails part way (a file cut short under
    the load) leaves the files before it loaded. Names of the module that share one tensor (tied
    weights, as :func:`save_model` leaves all but one out) count as one: a file that has any of
    them loads them all, one that has none reports the first of them missing, and one that has
    several reports all but one unexpected. Returns ``(missing, unexpected)`` as
    ``safetensors.torch.load_model`` does: the set of the module's names the file did not set
    and the list of the file's names the module has no use for. With `strict` either being
    non-empty raises ``RuntimeError`` naming them.
    """
    with safe_open(filename, framework="pt", device=device) as f:
        ties = _names_to_leave_out(dict(model.state_dict()), preferred=f.keys())
        missing: set[str] | None = None
        unexpected: list[str] = []
        for part in f._get_tensors_file_by_file():
            missing_here, unexpected_here = model.load_state_dict(part, strict=False)
            del part  # this file's buffer goes before the next file's is made
            missing = set(missing_here) if missing is None else missing & set(missing_here)
            unexpected.extend(unexpected_here)
    if missing is None:  # a checkpoint without tensors
        missing = set(model.load_state_dict({}, strict=False)[0])
    for tied in ties.values():
        for name in tied:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = [f"Error(s) in loading state_dict for {type(model).__name__}:"]
        if missing:
            lines.append("Missing key(s) in state_dict: " + _quoted(sorted(missing)))
        if unexpected:
            lines.append("Unexpected key(s) in state_dict: " + _quoted(sorted(unexpected)))
        raise RuntimeError("\n    ".join(lines))
    return missing, unexpected


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _names_to_leave_out(
    state: Mapping[str, Any], preferred: Iterable[str] = ()
) -> dict[str, list[str]]:
    """For each group of names whose tensors overlap in memory: the name kept -> the others.

    The name kept covers its whole storage; among those, the first in sorted order of the
    `preferred` names if any, else of all. Names sharing memory with none covering it all
    raise ``RuntimeError`` (saving any one of them could not restore the others).
    """
    by_storage: dict[tuple[str, int, int], list[tuple[int, int, str]]] = {}
    for name, t in state.items():
        # Not a tensor (save_file names it), no memory, or no bytes to share.
        if not hasattr(t, "untyped_storage") or t.device.type == "meta" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() == 0:
            continue
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        key = (str(t.device), storage.data_ptr(), storage.nbytes())
        by_storage.setdefault(key, []).append((start, end, name))
    wanted = set(preferred)
    out: dict[str, list[str]] = {}
    for (_, base, size), areas in by_storage.items():
        for group in overlapping(sorted(areas)):
            if len(group) < 2:
                continue
            whole = sorted(n for n in group if _covers(state[n], base, size))
            if not whole:
                raise RuntimeError(
                    f"tensors {sorted(group)} share memory and none of them covers all of it: "
                    "saving one would lose the others' bytes; clone them apart first"
                )
            kept = next((n for n in whole if n in wanted), whole[0])
            out[kept] = sorted(n for n in group if n != kept)
    return out


def _covers(t: Any, base: int, size: int) -> bool:
    return bool(t.data_ptr() == base and t.numel() * t.element_size() == size)
