"""ferrio.memory.PoolResource as CuPy's allocator. Skipped without CuPy and a GPU."""

from __future__ import annotations

import threading

import pytest

import ferrio.memory

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no GPU", allow_module_level=True)
except Exception as e:
    pytest.skip(f"no usable GPU: {e}", allow_module_level=True)


def test_cupy_runs_on_the_pool_across_streams_and_threads() -> None:
    pool = ferrio.memory.PoolResource(device=0, grow_bytes=64 << 20)
    old = cp.cuda.get_allocator()
    cp.cuda.set_allocator(pool)
    try:
        errors: list[BaseException] = []

        def work(seed: int) -> None:
            try:
                with cp.cuda.Stream(non_blocking=True):
                    for i in range(20):
                        a = cp.arange(100_000 + i * 999, dtype=cp.int64) * seed
                        b = a.copy()
                        assert int((b - a).sum()) == 0
                        assert int(b[-1]) == (100_000 + i * 999 - 1) * seed
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(1, 9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        stats = pool.stats()
        assert stats["pool_bytes"] > 0 and stats["peak_in_use_bytes"] > 0
    finally:
        cp.cuda.set_allocator(old)


def test_allocation_is_returned_when_dropped() -> None:
    pool = ferrio.memory.PoolResource(device=0)
    a = pool.allocate(1 << 20)
    assert a.ptr != 0 and a.size >= 1 << 20
    assert pool.stats()["in_use_bytes"] >= 1 << 20
    del a
    s = pool.stats()
    assert s["in_use_bytes"] == 0
    # Freed bytes are free, in a list or in this thread's cache.
    assert s["free_bytes"] == s["pool_bytes"] and s["cached_bytes"] <= s["free_bytes"]
