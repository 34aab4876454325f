#!/usr/bin/env python3
"""A cold `ferrio.open(F).read(buf)` into memory of several kinds (issue 15's numpy row): a fresh
numpy array (transparent huge pages), the same array touched first, a fresh array that a second
thread faults in ahead of the read (`MADV_POPULATE_WRITE`, 64 MiB at a time, beside it: session
16's experiment), an anonymous mmap, and an mmap without huge pages. Drops the page cache before
every read (needs root); one line per read. `--pause` seconds between reads lets a VM's balloon
hand the memory freed by the last read back to its host first, so every fault is a fresh one.

    sudo python3 benchmarks/fresh_memory.py FILE [--rounds 2] [--kinds numpy,numpy-prefault]
        [--pause 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CHILD = r"""
import mmap, os, resource, sys, time
import numpy as np, ferrio
path, kind = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
if kind == "numpy":
    buf = np.empty(size, np.uint8)
elif kind == "numpy-touched":
    buf = np.empty(size, np.uint8); buf.fill(1)
elif kind == "numpy-prefault":
    import ctypes, threading
    buf = np.empty(size, np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    def prefault(addr=buf.ctypes.data, step=64 << 20, page=4096):
        start = -(-addr // page) * page
        for a in range(start, addr + size, step):
            libc.madvise(a, min(step, addr + size - a) // page * page, 23)  # POPULATE_WRITE
elif kind == "mmap":
    buf = np.frombuffer(mmap.mmap(-1, size), np.uint8)
else:
    m = mmap.mmap(-1, size); m.madvise(mmap.MADV_NOHUGEPAGE); buf = np.frombuffer(m, np.uint8)
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
if kind == "numpy-prefault":
    helper = threading.Thread(target=prefault); helper.start()
with ferrio.open(path) as f:
    n = f.read(buf)
if kind == "numpy-prefault":
    helper.join()
dt = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_SELF)
assert n == size
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
gib = size / 2**30
print(f"{kind:<14} {gib / dt:6.2f} GiB/s  {cpu / gib:.2f} CPU-s/GiB", flush=True)
"""

KINDS = ["numpy", "numpy-touched", "numpy-prefault", "mmap", "mmap-nohuge"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS)
    )
    ap.add_argument("--pause", type=float, default=0, help="seconds before each read")
    a = ap.parse_args()
    for _ in range(a.rounds):
        for kind in a.kinds.split(","):
            time.sleep(a.pause)
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            subprocess.run([sys.executable, "-c", CHILD, a.file, kind], check=True)


if __name__ == "__main__":
    main()
