"""ferrio's stream-ordered pool memory resource for GPU memory, usable as CuPy's allocator.

    import cupy, ferrio.memory
    pool = ferrio.memory.PoolResource(device=0)
    cupy.cuda.set_allocator(pool)

Each CUDA stream gets its own free list with its own lock, so many threads and streams allocate
without queueing on one mutex; a block freed on one stream is reused on another only after that
stream waits for the first on the GPU.
"""

from __future__ import annotations

from typing import Any

from ferrio._native import Allocation
from ferrio._native import PoolResource as _NativePool

__all__ = ["Allocation", "PoolResource"]


class PoolResource:
    """A pool of device memory on one GPU; call it with a byte count to use it from CuPy."""

    def __init__(
        self,
        device: int = 0,
        initial_bytes: int = 0,
        grow_bytes: int = 32 << 20,
        max_bytes: int | None = None,
    ) -> None:
        """Make a pool on GPU `device` that grows by `grow_bytes` up to `max_bytes`."""
        self._pool = _NativePool(device, initial_bytes, grow_bytes, max_bytes)

    @property
    def device(self) -> int:
        """The GPU this pool allocates on."""
        return self._pool.device

    def allocate(self, nbytes: int, stream: int = 0, owner: object | None = None) -> Allocation:
        """Allocate `nbytes` for use on the raw CUDA stream handle `stream`."""
        return self._pool.allocate(nbytes, stream, owner)

    def detach_stream(self, stream: int) -> None:
        """Forget a raw stream handle before the stream is destroyed."""
        self._pool.detach_stream(stream)

    def stats(self) -> dict[str, int]:
        """Return bytes held from the GPU, in use, and the peak in use."""
        return self._pool.stats()

    def __call__(self, nbytes: int) -> Any:
        """Allocate for CuPy on its current stream (``cupy.cuda.set_allocator(pool)``)."""
        import cupy  # type: ignore[import-not-found, unused-ignore]

        stream = cupy.cuda.get_current_stream()
        block = self._pool.allocate(nbytes, stream.ptr, stream)
        memory = cupy.cuda.UnownedMemory(block.ptr, nbytes, block, self._pool.device)
        return cupy.cuda.MemoryPointer(memory, 0)
