"""Pinned host memory for the torch host tensors that ``safe_open`` reads one at a time.

Code that loads a checkpoint on the host and copies each tensor to a GPU (vLLM's default
iterator, then ``param.copy_(t)``; transformers' loading) is paced by that copy, and from
pageable memory it runs at a fraction of the link's rate. From pinned memory it runs at the
link's rate. Pinning is costly (the memory is zeroed and locked), so it pays only where the
memory is used again: torch's pinned allocator keeps freed blocks and hands them out again, and
it tracks the copies still reading a block, so a block is never reused under an asynchronous
copy. A tensor is therefore pinned only where all of these hold:

- the process already uses CUDA: pinning would otherwise make a CUDA context nothing needs;
- the caller has let go of a tensor it got before: a loop that keeps every tensor (a state
  dict built on the host) would pay for pinning all of them and reuse none;
- the pinned tensors still alive, this one with them, stay within the ``pinned_tensor_limit``
  setting of the handle;
- the tensor is at least ``_PIN_FROM`` bytes: a smaller one copies in microseconds either way.

Where torch cannot pin (no memory to be had), the tensor is pageable, as it would be without
this module. The state is the process's: a loader opens one handle per file, and what its loop
does with tensors is the same across them.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

# Host tensors smaller than this are never pinned.
_PIN_FROM = 1 << 20
# Bytes read ahead of get_tensor calls while host tensors are pinned (at most the setting
# `tensor_read_ahead`): what is read ahead is held in pinned memory, and every block of it is
# pinned afresh before torch can hand it out again. On the H200 (8 GB checkpoint, warm, each
# tensor copied to the GPU and dropped) the loop ran at 12.0-13.2 GiB/s with 256 MiB ahead,
# 11.8 with 128 MiB, 11.4 with 64 MiB, 8.3 with 512 MiB and 5.8 with 1 GiB (benchmarks/RESULTS.md,
# Checkpoints, session 39).
WINDOW = 256 << 20
# Tensors handed out that are watched for being let go: the most recent ones (a loop that lets
# tensors go drops each within a call or two).
_WATCHED = 8


def _weak_ref(tensor: Any) -> Any:
    """Return a weak reference to `tensor`'s storage, or None where this torch has none.

    A weak reference to the storage, not to the tensor object: views of it, and objects made
    around it (``nn.Parameter(t)``), keep the memory alive after the tensor object is gone.
    """
    try:
        from torch.multiprocessing.reductions import (  # type: ignore[import-not-found, unused-ignore]
            StorageWeakRef,
        )
    except ImportError:  # pragma: no cover - every torch since 1.x has it
        return None
    return StorageWeakRef(tensor.untyped_storage())  # type: ignore[no-untyped-call, unused-ignore]


class HostMemory:
    """Which host tensors are pinned: the tensors watched, and the pinned buffers made.

    State under `_lock`: weak references to the most recent tensors handed out (until one of
    them is seen let go), and to every pinned buffer made that may still be alive, with their
    sizes summed (an upper bound of the pinned bytes alive, made exact when it would refuse).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: deque[Any] = deque(maxlen=_WATCHED)
        self._lets_go = False  # a tensor handed out was let go
        self._pinned: list[tuple[Any, int]] = []
        self._pinned_bytes = 0

    def pins(self, torch: Any) -> bool:
        """Whether host tensors are pinned from now on (size and limit allowing)."""
        return self._lets_go and torch.cuda.is_initialized()

    def buffer(self, torch: Any, nbytes: int, limit: int) -> Any:
        """Return a pinned uint8 host buffer of `nbytes` for one tensor, or None: pageable."""
        if nbytes < _PIN_FROM or nbytes > limit or not torch.cuda.is_initialized():
            return None
        with self._lock:
            if not self._lets_go:
                self._lets_go = any(r.expired() for r in self._watched)
                if not self._lets_go:
                    return None
                self._watched.clear()
            if self._pinned_bytes + nbytes > limit:
                self._pinned = [(r, n) for r, n in self._pinned if not r.expired()]
                self._pinned_bytes = sum(n for _, n in self._pinned)
                if self._pinned_bytes + nbytes > limit:
                    return None
            try:
                buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError:  # no pinned memory to be had: pageable serves as well
                return None
            ref = _weak_ref(buf)
            if ref is None:  # pragma: no cover
                return None
            self._pinned.append((ref, nbytes))
            self._pinned_bytes += nbytes
            return buf

    def handed_out(self, tensor: Any) -> None:
        """Note a host tensor given to the caller, to see whether the caller lets tensors go."""
        if self._lets_go or tensor.untyped_storage().nbytes() < _PIN_FROM:
            return
        ref = _weak_ref(tensor)
        if ref is not None:
            with self._lock:
                self._watched.append(ref)

    def pinned_bytes(self) -> int:
        """Bytes of the pinned buffers made that are still alive (for tests)."""
        with self._lock:
            return sum(n for r, n in self._pinned if not r.expired())


HOST = HostMemory()
"""The process's host memory state for ``safe_open``'s torch host tensors."""


def _after_fork_in_child() -> None:
    # A forked child cannot use its parent's CUDA, so it pins nothing; a fresh state also
    # drops a lock another thread of the parent may have held at the fork.
    global HOST
    HOST = HostMemory()


os.register_at_fork(after_in_child=_after_fork_in_child)
