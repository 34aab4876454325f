#!/usr/bin/env python3
"""Chooses ferrio's GPU defaults by measurement: each setting combination in its own process
(fresh pools and bounce rings; a warm-up read pays their set-up), hot and cold reads of one file
into a CuPy array, and writes from GPU memory; KvikIO 16 threads in the same way as reference.

    python3 benchmarks/gpu_sweep.py FILE [--plan full|focus|hot] [--json OUT]
    (FILE: a few GiB, on the disk to test)

Plans: "full" chose the defaults (threads x ring shapes x task sizes); "hot" tries larger device
tasks for hot reads; "focus" is the short one for what was open in the second session: the
host-side ceiling of hot reads (the same read into pinned host memory, no GPU copy), writes
from GPU memory with fewer writes in flight and larger ones, and cold reads at fewer threads.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

GIB = 1 << 30

HOT = [
    {
        "FERRIO_THREADS_PER_DEVICE": str(t),
        "FERRIO_BOUNCE_BUFFER_SIZE": size,
        "FERRIO_BOUNCE_BUFFERS": str(k),
    }
    for t in (8, 16, 24)
    for size, k in (("1MiB", 4), ("2MiB", 2), ("2MiB", 4), ("4MiB", 2), ("4MiB", 4), ("8MiB", 2))
]
HOT += [
    {
        "FERRIO_THREADS_PER_DEVICE": str(t),
        "FERRIO_BOUNCE_BUFFER_SIZE": size,
        "FERRIO_BOUNCE_BUFFERS": str(k),
        "FERRIO_TASK_SIZE": task,
    }
    for t in (16, 24)
    for size, k in (("2MiB", 4), ("4MiB", 4))
    for task in ("64MiB", "256MiB")
]
COLD = [
    {
        "FERRIO_THREADS_PER_DEVICE": str(t),
        "FERRIO_BOUNCE_BUFFER_SIZE": size,
        "FERRIO_BOUNCE_BUFFERS": str(k),
    }
    for t in (4, 8, 16)
    for size, k in (("2MiB", 4), ("4MiB", 4))
] + [{"FERRIO_THREADS_PER_DEVICE": str(t), "FERRIO_TASK_SIZE": "64MiB"} for t in (8, 16)]
WRITE = [
    {"FERRIO_THREADS_PER_DEVICE": "1", "FERRIO_BOUNCE_BUFFER_SIZE": "16MiB"},
    {"FERRIO_THREADS_PER_DEVICE": "2", "FERRIO_BOUNCE_BUFFER_SIZE": "16MiB"},
    {"FERRIO_THREADS_PER_DEVICE": "4"},
    {"FERRIO_THREADS_PER_DEVICE": "8"},
    {"FERRIO_BOUNCE_BUFFER_SIZE": "16MiB"},
]
# Hot reads with fewer ring drains: a device task waits for its last copy before it returns, so
# larger tasks keep each worker's disk-side and copy-side overlapping for longer.
HOT_TASKS = [{}] + [
    {"FERRIO_TASK_SIZE": task, "FERRIO_THREADS_PER_DEVICE": str(t)}
    for task in ("32MiB", "128MiB")
    for t in (8, 16)
]
COLD_FOCUS = [
    {"FERRIO_THREADS_PER_DEVICE": "4"},
    {"FERRIO_THREADS_PER_DEVICE": "8", "FERRIO_TASK_SIZE": "16MiB"},
]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def one(engine: str, mode: str, path: str, reps: int) -> dict[str, Any]:
    """Runs in the child: reads (or writes) `path` `reps` times after a warm-up."""
    import cupy as cp

    size = os.path.getsize(path)
    if engine == "ferrio-pinned":
        # The host side alone: the same read into pinned host memory, no copy to the GPU.
        import numpy as np

        mem = cp.cuda.alloc_pinned_memory(size)
        dst = np.frombuffer(mem, dtype=np.uint8, count=size)
        dst[:: 1 << 12] = 0
        engine = "ferrio"
    else:
        dst = cp.empty(size, dtype=cp.uint8)
    out = path + ".w"

    def read() -> int:
        if engine == "kvikio":
            import kvikio

            with kvikio.CuFile(path, "r") as f:
                return int(f.read(dst))
        import ferrio

        with ferrio.open(path) as f:
            return f.read(dst)

    def write() -> int:
        if engine == "kvikio":
            import kvikio

            with kvikio.CuFile(out, "w") as f:
                n = int(f.write(dst))
        else:
            import ferrio

            with ferrio.open(out, "w") as f:
                n = f.write(dst)
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        return n

    op = write if mode == "write" else read
    if mode == "hot":
        read()  # warm-up: rings, pools, and the page cache
    else:
        read()  # warm-up of rings and pools; then drop the cache before each timed run
    rates, cpus = [], []
    for _ in range(reps):
        if mode == "cold":
            drop_caches()
        if mode == "write" and os.path.exists(out):
            os.unlink(out)
            os.sync()
        cp.cuda.runtime.deviceSynchronize()
        c0, t0 = cpu(), time.perf_counter()
        n = op()
        cp.cuda.runtime.deviceSynchronize()
        t, c = time.perf_counter() - t0, cpu() - c0
        assert n == size, (n, size)
        rates.append(size / t / GIB)
        cpus.append(c / (size / GIB))
    if os.path.exists(out):
        os.unlink(out)
    return {
        "gib_per_s": statistics.median(rates),
        "cpu_s_per_gib": statistics.median(cpus),
        "all": rates,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plan", choices=("full", "focus", "hot"), default="full")
    ap.add_argument("--child", nargs=3, metavar=("ENGINE", "MODE", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        engine, mode, reps = args.child
        print(json.dumps(one(engine, mode, args.path, int(reps))))
        return 0

    results = []

    def run(engine: str, mode: str, env: dict[str, str], reps: int) -> None:
        full = {**os.environ, **env}
        if engine == "kvikio":
            full.setdefault("KVIKIO_NTHREADS", "16")
        p = subprocess.run(
            [sys.executable, __file__, args.path, "--child", engine, mode, str(reps)],
            env=full,
            capture_output=True,
            text=True,
            timeout=300,
        )
        label = " ".join(f"{k.removeprefix('FERRIO_').lower()}={v}" for k, v in env.items())
        if p.returncode != 0:
            print(f"{engine} {mode} {label}: FAILED {p.stderr.strip()[-300:]}", flush=True)
            return
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r.update(engine=engine, mode=mode, settings=env)
        results.append(r)
        rate, cpu_s = r["gib_per_s"], r["cpu_s_per_gib"]
        line = f"{mode:5s} {engine:7s} {rate:7.2f} GiB/s {cpu_s:6.3f} CPU s/GiB  {label}"
        print(line, flush=True)

    if args.plan == "hot":
        run("kvikio", "hot", {}, 3)
        for env in HOT_TASKS:
            run("ferrio", "hot", env, 3)
        run("ferrio", "hot", {}, 3)
    elif args.plan == "focus":
        run("kvikio", "hot", {}, 3)
        run("ferrio", "hot", {}, 3)
        run("ferrio-pinned", "hot", {}, 3)
        run("ferrio-pinned", "hot", {"FERRIO_THREADS_PER_DEVICE": "32"}, 3)
        run("ferrio", "hot", {}, 3)
        run("kvikio", "write", {"KVIKIO_NTHREADS": "1"}, 3)
        run("ferrio", "write", {}, 3)
        run("kvikio", "write", {}, 3)
        for env in WRITE:
            run("ferrio", "write", env, 3)
        run("kvikio", "write", {"KVIKIO_NTHREADS": "1"}, 3)
        run("ferrio", "write", {}, 3)
        run("kvikio", "cold", {}, 2)
        run("ferrio", "cold", {}, 2)
        for env in COLD_FOCUS:
            run("ferrio", "cold", env, 2)
        run("ferrio", "cold", {}, 2)
    else:
        full_plan(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def full_plan(run: Any) -> None:
    """The settings sweep that chose the GPU defaults."""
    run("kvikio", "hot", {}, 3)
    for env in HOT:
        run("ferrio", "hot", env, 3)
    run("kvikio", "hot", {}, 3)
    run("kvikio", "cold", {}, 1)
    for env in COLD:
        run("ferrio", "cold", env, 1)
    run("kvikio", "cold", {}, 1)
    run("kvikio", "write", {}, 1)
    run("ferrio", "write", {}, 1)
    run("ferrio", "write", {"FERRIO_DIRECT_WRITE": "on"}, 1)
    run("kvikio", "write", {}, 1)


if __name__ == "__main__":
    sys.exit(main())
