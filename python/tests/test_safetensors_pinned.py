"""Torch host tensors of safe_open in pinned memory: only in a process that uses CUDA, only once
the caller lets tensors go, never more alive at once than the setting, and always the bytes
safetensors gives (also under asynchronous copies from tensors let go at once)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest

import ferrio
import ferrio.safetensors as fs
from ferrio.safetensors import _pinned

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

MIB = 1 << 20


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.zeros(1, device="cuda:0")  # the process uses CUDA from here on
    return torch.device("cuda:0")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    # Each test starts as a new process would: no tensor seen let go, none pinned.
    monkeypatch.setattr(_pinned, "HOST", _pinned.HostMemory())


def checkpoint(tmp_path, count: int, mib: int = 2):
    g = torch.Generator().manual_seed(count)
    d = {
        f"layer.{i:03d}.w": torch.randn(mib * MIB // 4, generator=g).view(-1, 256)
        for i in range(count)
    }
    d["norm"] = torch.randn(64, generator=g)  # one tensor below the size ever pinned
    path = tmp_path / "m.safetensors"
    st.save_file(d, path)
    return path, st.load_file(path)


def test_a_loop_that_lets_tensors_go_gets_pinned_tensors_with_the_right_bytes(tmp_path, cuda):
    path, want = checkpoint(tmp_path, 12)
    pinned = []
    with fs.safe_open(path, "pt") as f:
        for k in list(want):
            t = f.get_tensor(k)
            assert torch.equal(t, want[k]) and t.device.type == "cpu"
            pinned.append(t.is_pinned())
            del t
    assert pinned[-1] is False  # "norm": too small to pin
    # The first tensors come before any is let go (those read ahead with them too); from
    # then on every large one is pinned.
    assert any(pinned) and all(pinned[-6:-1]), pinned


def test_a_loop_that_keeps_every_tensor_pins_none(tmp_path, cuda):
    path, want = checkpoint(tmp_path, 12)
    with fs.safe_open(path, "pt") as f:
        kept = {k: f.get_tensor(k) for k in want}
    assert not any(t.is_pinned() for t in kept.values())
    assert all(torch.equal(kept[k], want[k]) for k in want)


def test_views_and_parameters_keep_a_tensor_held(tmp_path, cuda):
    # What holds a tensor's memory counts, not the object get_tensor returned.
    path, want = checkpoint(tmp_path, 12)
    with fs.safe_open(path, "pt") as f:
        held = [torch.nn.Parameter(f.get_tensor(k), requires_grad=False) for k in want]
        held += [f.get_tensor(k).view(-1)[1:] for k in want]
    assert not any(t.is_pinned() for t in held)


def test_the_pinned_tensors_alive_stay_within_the_setting(tmp_path, cuda):
    path, want = checkpoint(tmp_path, 24)
    kept = []
    with ferrio.config.set(pinned_tensor_limit="5MiB"), fs.safe_open(path, "pt") as f:
        for i, k in enumerate(want):
            t = f.get_tensor(k)
            if i % 2:  # keep every other one: the loop still lets tensors go
                kept.append(t)
            del t
            assert _pinned.HOST.pinned_bytes() <= 5 * MIB
    assert sum(t.is_pinned() for t in kept) <= 2
    assert all(torch.equal(t, want[k]) for t, k in zip(kept, list(want)[1::2], strict=True))


def test_the_setting_zero_at_open_pins_nothing(tmp_path, cuda):
    path, want = checkpoint(tmp_path, 12)
    with ferrio.config.set(pinned_tensor_limit=0), fs.safe_open(path, "pt") as f:
        seen = []
        for k in want:
            seen.append(f.get_tensor(k).is_pinned())
    assert not any(seen)


def test_asynchronous_copies_from_tensors_let_go_at_once_get_the_right_bytes(tmp_path, cuda):
    # Each host tensor is dropped right after its copy is queued: the pinned block must not be
    # handed out again (and overwritten by the next read) before the copy has read it.
    path, want = checkpoint(tmp_path, 40, mib=4)
    stream = torch.cuda.Stream(cuda)
    out = {}
    with torch.cuda.stream(stream), fs.safe_open(path, "pt") as f:
        for k in want:
            out[k] = f.get_tensor(k).to(cuda, non_blocking=True)
            # Hold the stream back so that copies are still queued when reads reuse memory.
            torch.cuda._sleep(2_000_000)
    stream.synchronize()
    gc.collect()
    for k, t in want.items():
        assert torch.equal(out[k].cpu(), t), k


def test_a_process_that_does_not_use_cuda_pins_nothing_and_makes_no_context(tmp_path, cuda):
    path, _ = checkpoint(tmp_path, 12)
    code = textwrap.dedent(
        f"""
        import torch, ferrio.safetensors as fs
        with fs.safe_open({str(path)!r}, "pt") as f:
            got = []
            for k in f.keys():
                got.append(f.get_tensor(k))
                got.pop()  # let each go, as a streaming loop does
        assert not torch.cuda.is_initialized()
        with fs.safe_open({str(path)!r}, "pt") as f:
            got = [f.get_tensor(k) for k in f.keys()]
        assert not torch.cuda.is_initialized()
        print(sum(t.is_pinned() for t in got))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_while_pinning_the_read_ahead_holds_at_most_the_pinned_window(tmp_path, cuda, monkeypatch):
    # Pinned read-ahead memory is pinned afresh for each block: a small window reuses it.
    monkeypatch.setattr(_pinned, "WINDOW", 4 * MIB)
    path, want = checkpoint(tmp_path, 16)
    held = {}
    for limit in ("2GiB", 0):
        with ferrio.config.set(pinned_tensor_limit=limit), fs.safe_open(path, "pt") as f:
            most = 0
            for k in want:
                t = f.get_tensor(k)
                assert torch.equal(t, want[k])
                del t
                most = max(most, f._ahead._bytes)
            held[limit] = most
    assert held["2GiB"] <= 4 * MIB < held[0], held
