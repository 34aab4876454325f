#!/usr/bin/env python3
"""One process per GPU loading the same checkpoint (the usual server start), aggregate GiB/s.

W = every visible GPU. Each load starts W fresh processes (one per GPU, rank = GPU); each
initialises an NCCL process group (`device_id` given, so the communicator exists) and a CUDA
context BEFORE the clock, as a server has them already. The ranks then meet on a barrier, and
each times from the barrier to its load's end (`torch.cuda.synchronize`); the load's time is
from the first rank's start to the last rank's end, and the aggregate is
W x checkpoint bytes / that time. After the clock each rank checks three tensors (first,
middle, last) against the file, read with safetensors' own `safe_open`. `peak GiB` is torch's
`max_memory_allocated` on the busiest GPU (memory a loader takes outside torch's allocator is
not counted).

Loaders (the order rotates each round; medians reported):
- `ferrio`: `ferrio.safetensors.torch.load_file`, no group: every rank reads every byte;
- `ferrio-group`: the same with `process_group=` the world: each rank reads 1/W of the bytes,
  then one in-place NCCL all-gather;
- `instanttensor-group`: InstantTensor's `safe_open(..., process_group=)`, `tensors()`;
- `instanttensor`: the same without a group;
- `safetensors`: `safetensors.torch.load_file`, no group.
Page cache warm (the files read once with dd before each load) and, with --cold, dropped
(/proc/sys/vm/drop_caches; needs root). The checkpoint is checkpoint_compare.py's 8 GiB bf16
file (created if missing; `--checkpoint 4` for its 4 x 2 GiB shards).

    python3 benchmarks/multi_gpu_checkpoint.py --dir /root/ferrio-ckpt [--rounds 2] [--cold]
        [--loaders ferrio,ferrio-group,...] [--gpus N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_compare import drop_caches, make_checkpoints, warm
from multi_gpu import gpu_count

GIB = 1 << 30
LOADERS = ["ferrio", "ferrio-group", "instanttensor-group", "instanttensor", "safetensors"]
ENV = {
    # The multi-GPU machines require NVLink multicast off.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}
# Ranks of one host meet on the loopback unless told otherwise.
IFACES = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

# One rank: argv = loader, rank, world, port, files...; prints one JSON line.
CHILD = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
loader, port, files = sys.argv[1], sys.argv[4], sys.argv[5:]
rank, world = int(sys.argv[2]), int(sys.argv[3])
dev = torch.device("cuda", rank)
torch.cuda.set_device(dev)
torch.zeros(1, device=dev); torch.cuda.synchronize()
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                        device_id=dev, timeout=datetime.timedelta(seconds=300))
pg = dist.group.WORLD
dist.all_reduce(torch.ones(1, device=dev), group=pg); torch.cuda.synchronize()   # set-up, untimed
target = files if len(files) > 1 else files[0]
try:
    if loader in ("ferrio", "ferrio-group"):
        from ferrio.safetensors.torch import load_file
        group = pg if loader == "ferrio-group" else None
        def load():
            return load_file(target, device=dev, process_group=group)
    elif loader in ("instanttensor", "instanttensor-group"):
        from instanttensor import safe_open
        group = pg if loader == "instanttensor-group" else None
        def load():
            out = {}
            with safe_open(target, framework="pt", device=rank, process_group=group) as f:
                for name, t in f.tensors():   # copy=True (default): tensors own their memory
                    out[name] = t
            return out
    elif loader == "safetensors":
        from safetensors.torch import load_file
        def load():
            out = {}
            for f in files:
                out.update(load_file(f, device=str(dev)))
            return out
    else:
        raise ImportError(loader)
    missing = None
except ImportError as e:
    missing = str(e)
# Every rank says whether it can run, so none waits alone in the barrier.
flag = torch.tensor([0 if missing is None else 1], device=dev)
dist.all_reduce(flag, group=pg)
if flag.item():
    print(json.dumps({"missing": missing or "on another rank"}))
    dist.destroy_process_group()
    sys.exit(0)
torch.cuda.reset_peak_memory_stats(dev)
dist.barrier(group=pg, device_ids=[rank]); torch.cuda.synchronize()
t0 = time.monotonic()
tensors = load()
torch.cuda.synchronize()
t1 = time.monotonic()
peak = torch.cuda.max_memory_allocated(dev)
nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
from safetensors import safe_open as st_open
wrong = []
for path in files:
    with st_open(path, framework="pt") as f:
        keys = list(f.keys())
        for k in [keys[0], keys[len(keys) // 2], keys[-1]]:
            want = f.get_tensor(k)
            got = tensors[k]
            if got.device != dev or not torch.equal(got.cpu().reshape(-1).view(torch.uint8),
                                                   want.reshape(-1).view(torch.uint8)):
                wrong.append(k)
dist.barrier(group=pg, device_ids=[rank])
dist.destroy_process_group()
print(json.dumps({"t0": t0, "t1": t1, "tensor_bytes": nbytes, "peak_gpu_bytes": peak,
                  "wrong": wrong}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_load(loader: str, world: int, files: list[str], timeout: float) -> dict:
    """Run one load on `world` ranks at once; return its time, or why it did not run."""
    port = str(free_port())
    env = dict(IFACES, **os.environ) | ENV
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, loader, str(r), str(world), port, *files],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    results, errors = [], []
    deadline = time.monotonic() + timeout
    try:
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                errors.append(f"rank {r}: no result within {timeout:.0f} s")
                break
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                errors.append(f"rank {r}: " + ((err.strip().splitlines() or ["no output"])[-1]))
                continue
            results.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if errors:
        return {"error": "; ".join(errors)}
    missing = [r["missing"] for r in results if "missing" in r]
    if missing:
        return {"missing": missing[0]}
    wrong = sorted({k for r in results for k in r["wrong"]})
    if wrong:
        return {"error": f"wrong bytes in {wrong}"}
    return {
        "seconds": max(r["t1"] for r in results) - min(r["t0"] for r in results),
        "rank_seconds": [r["t1"] - r["t0"] for r in results],
        "tensor_bytes": results[0]["tensor_bytes"],
        "peak_gpu_bytes": max(r["peak_gpu_bytes"] for r in results),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", default="/tmp/ferrio-ckpt", help="where the checkpoints live")
    ap.add_argument("--checkpoint", choices=["single", "4"], default="single")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="also with the page cache dropped")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: every visible GPU)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per load, all ranks")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    world = a.gpus or gpu_count()
    (ckpt, files), *_ = make_checkpoints(a.dir, a.checkpoint).items()
    file_bytes = sum(os.path.getsize(p) for p in files)
    loaders = [x for x in a.loaders.split(",") if x]
    modes = ["warm"]
    if a.cold:
        if drop_caches():
            modes.append("cold")
        else:
            print("# cannot drop the page cache (needs root): cold rows left out", file=sys.stderr)
    runs: dict[str, list[dict]] = {}
    for mode in modes:
        for r in range(a.rounds):
            order = loaders[r % len(loaders) :] + loaders[: r % len(loaders)]
            for loader in order:
                if mode == "warm":
                    warm(files)
                else:
                    drop_caches()
                res = run_load(loader, world, files, a.timeout)
                key = f"{mode} | {loader}"
                runs.setdefault(key, []).append(res)
                rate = world * file_bytes / res["seconds"] / GIB if "seconds" in res else None
                print(f"# {key} round {r}: {rate and round(rate, 2)} GiB/s {res}",
                      file=sys.stderr, flush=True)  # fmt: skip
    summary: dict[str, dict] = {}
    for key, rs in runs.items():
        ok = [x for x in rs if "seconds" in x]
        if not ok:
            first = rs[0]
            summary[key] = {"status": "missing" if "missing" in first else "error",
                            "detail": first.get("missing") or first.get("error")}  # fmt: skip
            continue
        secs = statistics.median(x["seconds"] for x in ok)
        summary[key] = {
            "median_seconds": secs,
            "aggregate_gib_per_s": world * file_bytes / secs / GIB,
            "all_rounds_gib_per_s": [world * file_bytes / x["seconds"] / GIB for x in ok],
            "peak_gpu_gib": max(x["peak_gpu_bytes"] for x in ok) / GIB,
            "rounds": len(ok),
        }
    print(f"{world} GPUs, one process each; {ckpt} ({file_bytes / GIB:.2f} GiB of files); "
          f"{a.rounds} rounds, medians; aggregate = {world} x file bytes / (first start to "
          "last end)")  # fmt: skip
    print(f"{'cache | loader':<30}{'median s':>9}{'agg GiB/s':>11}{'x it-group':>11}"
          f"{'peak GiB':>10}   all rounds")  # fmt: skip
    for key, s in summary.items():
        if "median_seconds" not in s:
            print(f"{key:<30}{s['status']}: {s['detail']}")
            continue
        ref = summary.get(key.split(" | ")[0] + " | instanttensor-group", {})
        ratio = (
            f"{s['aggregate_gib_per_s'] / ref['aggregate_gib_per_s']:>11.2f}"
            if "aggregate_gib_per_s" in ref
            else f"{'-':>11}"
        )
        rounds = " ".join(f"{x:.2f}" for x in s["all_rounds_gib_per_s"])
        print(f"{key:<30}{s['median_seconds']:>9.3f}{s['aggregate_gib_per_s']:>11.2f}{ratio}"
              f"{s['peak_gpu_gib']:>10.2f}   {rounds}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpus": world, "checkpoint": ckpt, "file_bytes": file_bytes,
                       "runs": runs, "summary": summary}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
