#!/usr/bin/env python3
"""Reads several files at once into GPU memory with ferrio (one future per file) and prints one
JSON object: {"bytes", "seconds"}. Used by multi_drive.sh --gpu on the GPU machine.

    python3 benchmarks/multi_read_gpu.py FILE...
"""

from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp

import ferrio


def main() -> int:
    paths = sys.argv[1:]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    files = [ferrio.open(p) for p in paths]
    arrays = [cp.empty(os.path.getsize(p), dtype=cp.uint8) for p in paths]
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    futures = [f.pread(a) for f, a in zip(files, arrays, strict=True)]
    total = sum(fut.result() for fut in futures)
    cp.cuda.runtime.deviceSynchronize()
    secs = time.perf_counter() - t0
    for f in files:
        f.close()
    print(json.dumps({"bytes": total, "seconds": secs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
