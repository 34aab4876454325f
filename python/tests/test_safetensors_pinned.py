"""safe_open.get_tensor's torch host tensors in pinned memory: where the process already uses
CUDA, up to `pinned_tensor_limit` bytes of pinned memory in use, so that copying them to a GPU
(vLLM's default loader) runs at the link's rate; never a CUDA context made for it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ferrio
import ferrio.safetensors as fs

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

MIB = 1 << 20


def needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.cuda.init()
    if not hasattr(torch.cuda.memory, "host_memory_stats"):
        pytest.fail(f"torch {torch.__version__} cannot say how much memory is pinned")


def pinned_in_use() -> int:
    return torch.cuda.memory.host_memory_stats()["active_bytes.current"]


def checkpoint(tmp_path, count: int = 12) -> tuple[str, dict]:
    """`count` bf16 tensors of 2 MiB (exactly a pinned block each) and a tiny one."""
    g = torch.Generator().manual_seed(5)
    d = {f"layer.{i:02d}.w": torch.randn(1024, 1024, generator=g).to(torch.bfloat16)
         for i in range(count)}  # fmt: skip
    d["norm"] = torch.arange(7, dtype=torch.float32)
    path = str(tmp_path / "m.safetensors")
    st.save_file(d, path)
    return path, st.load_file(path)


def test_host_tensors_are_pinned_and_bit_identical_where_cuda_is_in_use(tmp_path):
    needs_cuda()
    path, want = checkpoint(tmp_path)
    with fs.safe_open(path, "pt") as f:
        names = f.keys()
        got = {k: f.get_tensor(k) for k in names}
    for k, t in got.items():
        assert t.device.type == "cpu" and t.dtype == want[k].dtype and t.shape == want[k].shape
        assert torch.equal(t.view(torch.uint8), want[k].view(torch.uint8)), k
        # Small tensors are never pinned; the 2 MiB ones are, within the default 2 GiB.
        assert t.is_pinned() == (k != "norm"), k
        assert torch.equal(t.to("cuda:0").cpu().view(torch.uint8), want[k].view(torch.uint8))


def test_no_pinning_when_the_limit_is_zero_at_open(tmp_path):
    needs_cuda()
    path, want = checkpoint(tmp_path, 4)
    with ferrio.config.set(pinned_tensor_limit=0):
        f = fs.safe_open(path, "pt")
    with f:
        names = f.keys()
        for k in names:
            t = f.get_tensor(k)
            assert not t.is_pinned(), k
            assert torch.equal(t.view(torch.uint8), want[k].view(torch.uint8))


def test_tensors_kept_past_the_limit_are_pageable(tmp_path):
    """The limit counts pinned memory in use: a caller that keeps every tensor gets the first
    ones pinned, up to the limit, and the rest in pageable memory, with the same bytes."""
    needs_cuda()
    path, want = checkpoint(tmp_path, 8)
    base = pinned_in_use()
    with ferrio.config.set(pinned_tensor_limit=base + 5 * MIB, tensor_read_ahead="4MiB"):
        f = fs.safe_open(path, "pt")
    with f:
        names = f.offset_keys()
        kept = {k: f.get_tensor(k) for k in names}
    pinned = [k for k in names if kept[k].is_pinned()]
    big = [k for k in names if k != "norm"]  # the small one is never pinned
    assert pinned == big[:2]  # 2 + 2 MiB fit under base + 5 MiB; a third does not
    for k, t in kept.items():
        assert torch.equal(t.view(torch.uint8), want[k].view(torch.uint8)), k


def test_a_loop_that_copies_each_tensor_to_the_gpu_stays_pinned(tmp_path):
    """vLLM's loop: each host tensor copied to the GPU, then dropped. Its pinned blocks go back
    to torch's cache, so a limit far below the checkpoint's bytes still pins every tensor."""
    needs_cuda()
    path, want = checkpoint(tmp_path, 24)  # 48 MiB
    base = pinned_in_use()
    with ferrio.config.set(pinned_tensor_limit=base + 16 * MIB, tensor_read_ahead="4MiB"):
        f = fs.safe_open(path, "pt")
    on_gpu = {}
    with f:
        names = f.keys()
        for k in names:
            t = f.get_tensor(k)
            assert t.is_pinned() == (k != "norm"), k
            on_gpu[k] = t.to("cuda:0")
            del t
        assert f._ahead.hits >= len(on_gpu) - 3
    for k, t in on_gpu.items():
        assert torch.equal(t.cpu().view(torch.uint8), want[k].view(torch.uint8)), k


def test_a_process_without_cuda_gets_pageable_tensors_and_no_cuda_context(tmp_path):
    """Pinning needs a CUDA context: a process that has none (CPU work, a DataLoader worker)
    must not get one from loading a checkpoint."""
    path, want = checkpoint(tmp_path, 3)
    code = (
        "import sys, torch, ferrio.safetensors as fs\n"
        "with fs.safe_open(sys.argv[1], 'pt') as f:\n"
        "    got = {k: f.get_tensor(k) for k in f.keys()}\n"
        "assert not torch.cuda.is_initialized(), 'a CUDA context was made'\n"
        "torch.save(got, sys.argv[2])\n"
    )
    out = str(tmp_path / "got.pt")
    subprocess.run([sys.executable, "-c", code, path, out], check=True, timeout=120)
    got = torch.load(out)
    assert sorted(got) == sorted(want)
    for k, t in got.items():
        assert np.array_equal(t.view(torch.uint8).numpy(), want[k].view(torch.uint8).numpy()), k
