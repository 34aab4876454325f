#!/usr/bin/env python3
"""A cold `ferrio.open(F).read(buf)` into memory of four kinds (issue 15's numpy row): a fresh
numpy array (transparent huge pages), the same array touched first, an anonymous mmap, and an
mmap without huge pages. Drops the page cache before every read (needs root); one line per read.

    sudo python3 benchmarks/fresh_memory.py FILE [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r"""
import mmap, os, resource, sys, time
import numpy as np, ferrio
path, kind = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
if kind == "numpy":
    buf = np.empty(size, np.uint8)
elif kind == "numpy-touched":
    buf = np.empty(size, np.uint8); buf.fill(1)
elif kind == "mmap":
    buf = np.frombuffer(mmap.mmap(-1, size), np.uint8)
else:
    m = mmap.mmap(-1, size); m.madvise(mmap.MADV_NOHUGEPAGE); buf = np.frombuffer(m, np.uint8)
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
with ferrio.open(path) as f:
    n = f.read(buf)
dt = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
assert n == size
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
gib = size / 2**30
print(f"{kind:<14} {gib / dt:6.2f} GiB/s  {cpu / gib:.2f} CPU-s/GiB", flush=True)
"""

KINDS = ["numpy", "numpy-touched", "mmap", "mmap-nohuge"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    for _ in range(a.rounds):
        for kind in KINDS:
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            subprocess.run([sys.executable, "-c", CHILD, a.file, kind], check=True)


if __name__ == "__main__":
    main()
