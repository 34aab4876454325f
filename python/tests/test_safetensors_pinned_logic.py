"""The pinning decision of `ferrio.safetensors._pinned`, on the host without torch: a stand-in
for torch whose buffers are plain objects and whose weak references are Python's. The same
rules run against real torch and CUDA in test_safetensors_pinned.py (on a GPU machine)."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest

from ferrio.safetensors import _pinned

MIB = 1 << 20


class Buffer:
    """A stand-in tensor: its own storage, pinned or not."""

    def __init__(self, nbytes: int, pinned: bool) -> None:
        self.size, self.pinned = nbytes, pinned

    def nbytes(self) -> int:
        return self.size

    def untyped_storage(self) -> Buffer:
        return self


class Ref:
    def __init__(self, storage: Buffer) -> None:
        self._ref = weakref.ref(storage)

    def expired(self) -> bool:
        return self._ref() is None


def fake_torch(cuda: bool = True, pin_fails: bool = False) -> SimpleNamespace:
    def empty(nbytes, dtype, pin_memory):
        assert pin_memory
        if pin_fails:
            raise RuntimeError("CUDA error: out of memory")
        return Buffer(nbytes, True)

    return SimpleNamespace(
        uint8="uint8", empty=empty, cuda=SimpleNamespace(is_initialized=lambda: cuda)
    )


@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(_pinned, "_weak_ref", lambda t: Ref(t.untyped_storage()))
    return _pinned.HostMemory()


def give(host: _pinned.HostMemory, nbytes: int) -> Buffer:
    t = Buffer(nbytes, False)
    host.handed_out(t)
    return t


def test_nothing_is_pinned_until_a_tensor_handed_out_is_let_go(host):
    torch = fake_torch()
    kept = [give(host, 2 * MIB) for _ in range(3)]
    assert host.buffer(torch, 2 * MIB, 64 * MIB) is None
    assert not host.pins(torch)
    del kept[0]
    gc.collect()
    buf = host.buffer(torch, 2 * MIB, 64 * MIB)
    assert buf is not None and buf.pinned and host.pins(torch)


def test_small_tensors_never_count_and_are_never_pinned(host):
    torch = fake_torch()
    give(host, MIB - 1)  # let go at once, but too small to be watched
    assert host.buffer(torch, 2 * MIB, 64 * MIB) is None
    give(host, MIB)
    assert host.buffer(torch, MIB - 1, 64 * MIB) is None
    assert host.buffer(torch, MIB, 64 * MIB) is not None


def test_a_process_without_cuda_pins_nothing(host):
    give(host, 2 * MIB)
    assert host.buffer(fake_torch(cuda=False), 2 * MIB, 64 * MIB) is None
    assert not host.pins(fake_torch(cuda=False))


def test_the_pinned_buffers_alive_stay_within_the_limit_and_free_ones_make_room(host):
    torch = fake_torch()
    give(host, 2 * MIB)
    a = host.buffer(torch, 2 * MIB, 5 * MIB)
    b = host.buffer(torch, 2 * MIB, 5 * MIB)
    assert a is not None and b is not None
    assert host.buffer(torch, 2 * MIB, 5 * MIB) is None  # 6 MiB > 5
    assert host.buffer(torch, 6 * MIB, 5 * MIB) is None  # larger than the limit itself
    assert host.pinned_bytes() == 4 * MIB
    del a
    gc.collect()
    c = host.buffer(torch, 2 * MIB, 5 * MIB)
    assert c is not None
    assert host.pinned_bytes() == 4 * MIB  # b and c


def test_a_refused_pin_gives_pageable_memory(host):
    give(host, 2 * MIB)
    assert host.buffer(fake_torch(pin_fails=True), 2 * MIB, 64 * MIB) is None
    assert host.pinned_bytes() == 0
