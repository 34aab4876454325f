#!/usr/bin/env python3
"""Direct writes that extend a file, with and without allocating it first: a 2 GiB numpy array
written with ferrio to a new file, then fsync, three times per mode.

    FERRIO_THREADS_PER_DEVICE=4 python3 benchmarks/extend_write.py [--dir target/bench]

Modes: "plain" (ferrio as it is: it extends the file with one fallocate before a direct write
of several tasks), "trunc" (ftruncate to the final size first) and "falloc" (posix_fallocate
first, which ferrio then finds done).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ferrio

GIB = 1 << 30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="target/bench")
    ap.add_argument("--size-gib", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "extend_write.bin")
    data = np.full(args.size_gib * GIB, 7, dtype=np.uint8)
    for mode in ("plain", "trunc", "falloc"):
        rates = []
        for _ in range(3):
            if os.path.exists(path):
                os.unlink(path)
            os.sync()
            t0 = time.perf_counter()
            with ferrio.open(path, "w") as f:
                if mode != "plain":
                    fd = os.open(path, os.O_WRONLY)
                    if mode == "trunc":
                        os.ftruncate(fd, data.nbytes)
                    else:
                        os.posix_fallocate(fd, 0, data.nbytes)
                    os.close(fd)
                f.write(data)
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            rates.append(data.nbytes / (time.perf_counter() - t0) / GIB)
        print(f"{mode:7s}", " ".join(f"{r:.2f}" for r in rates), "GiB/s")
    os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
