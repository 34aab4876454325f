"""ferrio.safetensors with a process group: every rank gets the whole checkpoint, each reading
only its share.

The division of the buffer, the digest comparison and the whole shared load (with ranks as
threads and a stand-in group) run here without torch; real ``torch.distributed`` ranks (gloo on
the host, NCCL on two GPUs) are child processes started by the tests, bounded in time, and skip
where torch or the GPUs are missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

import ferrio.safetensors as st
import ferrio.safetensors.numpy as stnp
from ferrio.safetensors import _distributed as dist_

# ---------------------------------------------------------------- the pure parts, no torch


def test_shares_pad_to_a_multiple_of_the_ranks() -> None:
    assert dist_.shares(0, 2) == (0, 0)
    assert dist_.shares(10, 2) == (10, 5)
    assert dist_.shares(11, 2) == (12, 6)
    assert dist_.shares(11, 3) == (12, 4)
    assert dist_.shares(5, 8) == (8, 1)
    assert dist_.shares(7, 1) == (7, 7)
    with pytest.raises(ValueError, match="at least one rank"):
        dist_.shares(7, 0)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_rank_runs_cover_every_run_once_and_stay_in_their_piece(world: int) -> None:
    # Runs of two files with alignment gaps between them, as _layout makes them.
    runs = [("a", 8, 21, 0), ("a", 30, 31, 13 + 3), ("b", 100, 164, 24), ("b", 170, 171, 88)]
    size = 89
    padded, piece = dist_.shares(size, world)
    got: list[tuple[str, int]] = []  # (path, file byte) read by any rank
    for r in range(world):
        lo, hi = r * piece, (r + 1) * piece
        for path, begin, end, at in dist_.rank_runs(runs, lo, hi):
            assert lo <= at and at + (end - begin) <= hi, "a rank reads outside its piece"
            # The same mapping file byte -> buffer byte as the run it came from.
            whole = next(x for x in runs if x[0] == path and x[1] <= begin and end <= x[2])
            assert at - whole[3] == begin - whole[1]
            got += [(path, b) for b in range(begin, end)]
    want = [(p, b) for p, begin, end, _ in runs for b in range(begin, end)]
    assert sorted(got) == sorted(want), "some file byte is read twice or never"
    assert padded >= size and padded - size < world


def test_plan_digest_ignores_paths_but_not_the_plan() -> None:
    tensors = [("w", "F32", [3], 0), ("b", "U8", [5], 12)]
    runs = [("/x/m.safetensors", 80, 97, 0)]
    base = dist_.plan_digest(["/x/m.safetensors"], None, tensors, runs, 17, "cuda")
    assert len(base) == dist_.DIGEST_BYTES and base != dist_.FAILED
    same = dist_.plan_digest(
        ["/mnt/m.safetensors"], None, tensors, [("/mnt/m.safetensors", 80, 97, 0)], 17, "cuda"
    )
    assert same == base
    changed = [
        dist_.plan_digest(["/x/m.safetensors"], {"k": "v"}, tensors, runs, 17, "cuda"),
        dist_.plan_digest(["/x/m.safetensors"], None, tensors[:1], runs, 17, "cuda"),
        dist_.plan_digest(["/x/m.safetensors"], None, tensors, runs, 18, "cuda"),
        dist_.plan_digest(["/x/m.safetensors"], None, tensors, runs, 17, "cpu"),
        dist_.plan_digest(["/x/m.safetensors", "/x/n"], None, tensors, runs, 17, "cuda"),
        dist_.plan_digest(["/x/m.safetensors"], None, tensors, [(*runs[0][:2], 98, 0)], 17, "cuda"),
    ]
    assert all(d != base for d in changed)


def test_disagreement_names_the_odd_rank() -> None:
    a, b = b"a" * 32, b"b" * 32
    assert dist_.disagreement([a, a, a]) is None
    assert dist_.disagreement([a]) is None
    why = dist_.disagreement([a, a, b, a])
    assert why is not None and "rank 2 " in why and "than rank 0" in why
    why = dist_.disagreement([b, a, a])  # rank 0 is the odd one
    assert why is not None and "rank 0 " in why and "than rank 1" in why
    why = dist_.disagreement([a, b])
    assert why is not None and "rank 1 " in why
    why = dist_.disagreement([a, dist_.FAILED, dist_.FAILED])
    assert why is not None and "ranks 1, 2 " in why and "could not open" in why


def test_read_failure_names_the_ranks() -> None:
    assert dist_.read_failure([b"\x00", b"\x00"]) is None
    why = dist_.read_failure([b"\x00", b"\x01", b"\x00"])
    assert why is not None and "rank 1 " in why


# ------------------------------------- the shared load with ranks as threads (a stand-in group)


REAL_START = st._Load.start


class ThreadGroup:
    """What safe_open asks of a process group, for `world` threads of one process."""

    def __init__(self, rank: int, world: int, shared: dict[str, Any]) -> None:
        self.rank, self.world, self.shared = rank, world, shared
        self.started: list[tuple[str, int, int, int]] = []

    def check_device(self, device_kind: str) -> None:
        pass

    def _gather(self, value: Any) -> list[Any]:
        barrier: threading.Barrier = self.shared["barrier"]
        slots = self.shared.setdefault("slots", [None] * self.world)
        barrier.wait()
        slots[self.rank] = value
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return self._gather(payload)

    def exchange(self, buf: Any, piece: int) -> None:
        bufs = self._gather(buf)
        mine = bytes(buf[self.rank * piece : (self.rank + 1) * piece])
        pieces = self._gather(mine)
        for r, p in enumerate(pieces):
            buf[r * piece : (r + 1) * piece] = np.frombuffer(p, dtype=np.uint8)
        assert len(bufs) == self.world


def run_ranks(
    world: int, monkeypatch: pytest.MonkeyPatch, call: Any
) -> tuple[list[Any], list[ThreadGroup]]:
    """Run `call(rank, group)` on `world` threads at once; return results (or exceptions)."""
    monkeypatch.setattr(dist_, "Group", lambda pg, kind, index: pg)
    shared: dict[str, Any] = {"barrier": threading.Barrier(world, timeout=30)}
    groups = [ThreadGroup(r, world, shared) for r in range(world)]
    # Record which file bytes each rank reads.
    real_start = REAL_START
    owner = threading.local()

    def start(self: Any, runs: Any) -> Any:
        groups[owner.rank].started += [r for r in runs if r[2] > r[1]]
        return real_start(self, runs)

    monkeypatch.setattr(st._Load, "start", start)
    out: list[Any] = [None] * world

    def body(r: int) -> None:
        owner.rank = r
        try:
            out[r] = call(r, groups[r])
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a rank hung"
    return out, groups


def mixed(seed: int = 0) -> dict[str, np.ndarray]:
    """Mixed dtypes and odd sizes: no piece boundary falls on a tensor or run boundary."""
    rng = np.random.default_rng(seed)
    return {
        "a.u8": rng.integers(0, 255, 7, dtype=np.uint8),
        "b.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "c.i64": rng.integers(-(2**40), 2**40, 13, dtype=np.int64),
        "d.f16": rng.standard_normal(1).astype(np.float16),
        "e.bool": rng.integers(0, 2, 5).astype(bool),
        "f.empty": np.zeros((0, 3), dtype=np.float64),
        "g.f64": rng.standard_normal((2, 3, 3)).astype(np.float64),
        "h.i16": rng.integers(-300, 300, 9, dtype=np.int16),
    }


def same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, k
        assert g.tobytes() == w.tobytes(), k


@pytest.mark.parametrize("world", [2, 3])
def test_thread_ranks_load_the_whole_file_each_reading_its_share(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, world: int
) -> None:
    path = str(tmp_path / "m.safetensors")
    stnp.save_file(mixed(), path)
    want = stnp.load_file(path)
    out, groups = run_ranks(
        world, monkeypatch, lambda r, g: st.load_file(path, framework="numpy", process_group=g)
    )
    for got in out:
        assert not isinstance(got, Exception), got
        same(got, want)
    read = sorted((p, b) for g in groups for p, b0, e0, _ in g.started for b in range(b0, e0))
    assert len(read) == len(set(read)), "a byte was read by two ranks"
    data = sum(v.nbytes for v in want.values())
    assert len(read) == data, "every tensor byte is read exactly once in the group"
    assert all(g.started for g in groups[:-1]), "a rank read nothing"


def test_thread_ranks_share_a_sharded_checkpoint_and_a_filter(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = mixed(1)
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        part = {n: tensors[n] for n in names[i::3]}
        stnp.save_file(part, str(tmp_path / f"m-{i}.safetensors"))
        weight_map.update({n: f"m-{i}.safetensors" for n in part})
    index = tmp_path / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    out, _ = run_ranks(
        2, monkeypatch, lambda r, g: st.load_file(str(index), framework="numpy", process_group=g)
    )
    for got in out:
        assert not isinstance(got, Exception), got
        same(got, tensors)
    flt = ["b.*", "g.*", "h.*"]
    out, _ = run_ranks(
        2,
        monkeypatch,
        lambda r, g: st.load_file(
            str(index), framework="numpy", tensor_filter=flt, process_group=g
        ),
    )
    for got in out:
        assert not isinstance(got, Exception), got
        same(got, {k: v for k, v in tensors.items() if k[0] in "bgh"})


def test_thread_ranks_with_other_files_all_raise(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    stnp.save_file(mixed(0), a)
    stnp.save_file({"x": np.zeros(3, np.float32)}, b)
    out, _ = run_ranks(
        3,
        monkeypatch,
        lambda r, g: st.load_file(b if r == 2 else a, framework="numpy", process_group=g),
    )
    for e in out:
        assert isinstance(e, st.SafetensorError), e
        assert "rank 2 " in str(e)
    # A filter that differs is a different plan too.
    out, _ = run_ranks(
        2,
        monkeypatch,
        lambda r, g: st.load_file(
            a, framework="numpy", tensor_filter=["a.*"] if r else None, process_group=g
        ),
    )
    assert all(isinstance(e, st.SafetensorError) and "rank" in str(e) for e in out), out


def test_a_rank_that_cannot_open_makes_every_rank_raise(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = str(tmp_path / "a.safetensors")
    stnp.save_file(mixed(0), a)
    out, _ = run_ranks(
        2,
        monkeypatch,
        lambda r, g: st.load_file(
            a if r == 0 else a + ".missing", framework="numpy", process_group=g
        ),
    )
    assert isinstance(out[1], FileNotFoundError), out[1]
    assert isinstance(out[0], st.SafetensorError) and "rank 1 " in str(out[0]), out[0]


def test_a_rank_whose_read_fails_makes_every_rank_raise(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = str(tmp_path / "a.safetensors")
    stnp.save_file(mixed(0), a)
    real_wait = st._Load.wait
    calls = threading.local()

    def wait(self: Any, futures: Any, runs: Any) -> None:
        real_wait(self, futures, runs)
        if getattr(calls, "rank", None) == 1:
            raise OSError("disk gone")

    monkeypatch.setattr(st._Load, "wait", wait)

    def call(r: int, g: Any) -> Any:
        calls.rank = r
        with st.safe_open(a, framework="numpy", process_group=g) as f:
            return f.get_tensors()

    out, _ = run_ranks(2, monkeypatch, call)
    assert isinstance(out[1], OSError) and "disk gone" in str(out[1]), out[1]
    assert isinstance(out[0], st.SafetensorError) and "rank 1 " in str(out[0]), out[0]


def test_tensors_with_a_group_yield_in_file_order_after_the_exchange(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = str(tmp_path / "a.safetensors")
    stnp.save_file(mixed(2), a)
    want = stnp.load_file(a)

    def call(r: int, g: Any) -> Any:
        with st.safe_open(a, framework="numpy", process_group=g) as f:
            return f.offset_keys(), list(f.tensors())

    out, _ = run_ranks(2, monkeypatch, call)
    for res in out:
        assert not isinstance(res, Exception), res
        order, pairs = res
        assert [n for n, _ in pairs] == order
        same(dict(pairs), want)


def test_without_a_group_nothing_changes(tmp_path: Any) -> None:
    a = str(tmp_path / "a.safetensors")
    stnp.save_file(mixed(3), a)
    same(st.load_file(a, framework="numpy", process_group=None), stnp.load_file(a))
    with st.safe_open(a, framework="numpy") as f:
        assert f._group is None


# ------------------------------------------------------------ real ranks: torch.distributed

CHILD_ENV = {
    # The GPU machine requires NVLink multicast off.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# Ranks of one host meet on the loopback (a container's host name may not resolve).
CHILD_IFACES = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

# argv: rank, world, port, backend, device ("cpu" or "cuda"), this rank's checkpoint path;
# prints one JSON line: whether the load equals safetensors.torch's, or the SafetensorError.
CHILD = r"""
import datetime, json, sys
import torch, torch.distributed as dist
rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
backend, device, path = sys.argv[4], sys.argv[5], sys.argv[6]
if device == "cuda":
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=60))
import ferrio.safetensors as st
from ferrio.safetensors.torch import load_file
out = {"rank": rank}
try:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(rank)
    got = load_file(path, device=device, process_group=dist.group.WORLD)
    if device.startswith("cuda"):
        torch.cuda.synchronize(rank)
        out["peak"] = torch.cuda.max_memory_allocated(rank)
    import safetensors.torch
    if path.endswith(".json"):
        want = {}
        for f in sorted(set(json.load(open(path))["weight_map"].values())):
            want.update(safetensors.torch.load_file(f"{path.rsplit('/', 1)[0]}/{f}"))
    else:
        want = safetensors.torch.load_file(path)
    bad = []
    for k, w in want.items():
        g = got.get(k)
        if g is None or g.dtype != w.dtype or g.shape != w.shape or str(g.device) != device \
                or not torch.equal(g.cpu().reshape(-1).view(torch.uint8),
                                   w.reshape(-1).view(torch.uint8)):
            bad.append(k)
    out.update(equal=not bad and sorted(got) == sorted(want), bad=bad,
               bytes=sum(w.numel() * w.element_size() for w in want.values()))
except st.SafetensorError as e:
    out["error"] = str(e)
dist.destroy_process_group()
print(json.dumps(out), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torch_or_skip() -> Any:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.distributed
    except ImportError:
        pytest.skip(
            "torch is not installed (PyPI's Linux torch needs the CUDA libraries; see the "
            "Makefile): the process-group tests run on the GPU machine"
        )
    if not torch.distributed.is_available():
        pytest.skip("this torch has no torch.distributed")
    pytest.importorskip("safetensors.torch", reason="safetensors is the reference loader")
    return torch


def run_real_ranks(backend: str, device: str, paths: list[str]) -> list[dict[str, Any]]:
    port = free_port()
    env = dict(CHILD_IFACES, **os.environ) | CHILD_ENV
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(r), str(len(paths)), str(port), backend, device, p],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r, p in enumerate(paths)
    ]
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=180)
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            assert p.returncode == 0 and lines, f"rank exited {p.returncode}: {stderr[-3000:]}"
            results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def torch_checkpoints(torch: Any, root: Any) -> dict[str, str]:
    """A single file and 3 shards with an index, mixed dtypes and odd sizes."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.u8": torch.randint(0, 255, (7,), dtype=torch.uint8, generator=g),
        "b.bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "c.f32": torch.randn(1001, generator=g),
        "d.i64": torch.randint(-(2**40), 2**40, (13,), generator=g),
        "e.f16": torch.randn(1, generator=g).half(),
        "f.bool": torch.randint(0, 2, (5,), generator=g).bool(),
        "g.empty": torch.zeros(0, 3, dtype=torch.float64),
        "h.f64": torch.randn(2, 3, 3, generator=g, dtype=torch.float64),
        "i.scalar": torch.tensor(3.5),
    }
    single = os.path.join(root, "single.safetensors")
    save_file(tensors, single)
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        part = {n: tensors[n] for n in names[i::3]}
        save_file(part, os.path.join(root, f"shard-{i}.safetensors"))
        weight_map.update({n: f"shard-{i}.safetensors" for n in part})
    index = os.path.join(root, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return {"single": single, "sharded": index}


@pytest.mark.parametrize("which", ["single", "sharded"])
def test_gloo_ranks_on_the_host_load_what_safetensors_loads(tmp_path: Any, which: str) -> None:
    torch = torch_or_skip()
    path = torch_checkpoints(torch, str(tmp_path))[which]
    for res in run_real_ranks("gloo", "cpu", [path, path]):
        assert "error" not in res, res
        assert res["equal"], res


@pytest.mark.parametrize("which", ["single", "sharded"])
def test_nccl_ranks_on_two_gpus_load_what_safetensors_loads(tmp_path: Any, which: str) -> None:
    torch = torch_or_skip()
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs in this host for NCCL ranks")
    path = torch_checkpoints(torch, str(tmp_path))[which]
    for res in run_real_ranks("nccl", "cuda", [path, path]):
        assert "error" not in res, res
        assert res["equal"], res
        # One buffer of the checkpoint's bytes (padding and alignment gaps aside).
        assert res["peak"] <= res["bytes"] + 4096, res


def test_gloo_ranks_with_different_files_all_raise(tmp_path: Any) -> None:
    torch = torch_or_skip()
    paths = torch_checkpoints(torch, str(tmp_path))
    other = os.path.join(str(tmp_path), "shard-0.safetensors")
    for res in run_real_ranks("gloo", "cpu", [paths["single"], other]):
        assert "error" in res, res
        assert "rank" in res["error"] and "different files" in res["error"], res
