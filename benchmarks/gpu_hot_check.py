#!/usr/bin/env python3
"""Diagnoses hot file -> GPU reads in one process: defaults against explicit settings, with the
pools ferrio made. `python3 benchmarks/gpu_hot_check.py FILE`."""

from __future__ import annotations

import sys
import time

import cupy as cp

import ferrio

GIB = 1 << 30


def main() -> int:
    path = sys.argv[1]
    with ferrio.open(path) as f:
        size = f.size
    dst = cp.empty(size, dtype=cp.uint8)

    def read(label: str, **cfg: object) -> None:
        rates = []
        for _ in range(3):
            cp.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            with ferrio.config.set(**cfg), ferrio.open(path) as f:
                f.read(dst)
            cp.cuda.runtime.deviceSynchronize()
            rates.append(size / (time.perf_counter() - t0) / GIB)
        pools = [(p["key"], p["threads"], p["max_threads"]) for p in ferrio.stats()]
        direct = sum(p["bytes_direct"] for p in ferrio.stats())
        print(
            f"{label:40s} {' '.join(f'{r:6.2f}' for r in rates)} GiB/s  pools={pools} "
            f"direct_bytes={direct}",
            flush=True,
        )

    read("warm (direct_read=off)", direct_read="off")
    read("defaults")
    read("threads_per_device=16", threads_per_device=16)
    read("defaults again")
    read("direct_read=off", direct_read="off")
    read("bounce 4MiB x4", bounce_buffers=4)
    read("threads_per_device=8", threads_per_device=8)
    read("defaults, last")
    print(ferrio.config.settings(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
