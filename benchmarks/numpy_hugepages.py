#!/usr/bin/env python3
"""A cold read into a fresh numpy array, with and without numpy's huge-page advice.

numpy advises `MADV_HUGEPAGE` on large arrays by default; `np.core.multiarray.
_set_madvise_hugepage(False)` turns that off. Each child process allocates the array, reads
FILE into it with `ferrio.open().read` after the page cache was dropped, and reports GiB/s and
its own CPU-s/GiB. Rounds alternate the two settings. Needs root (drop_caches).

    sudo python3 benchmarks/numpy_hugepages.py FILE [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
import ferrio
path, advise = sys.argv[1], sys.argv[2] == "1"
np.core.multiarray._set_madvise_hugepage(advise)
size = os.path.getsize(path)
r0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
a = np.empty(size, dtype=np.uint8)
with ferrio.open(path) as f:
    n = f.read(a)
secs = time.perf_counter() - t
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"gibs": n / secs / 2**30, "cpu_s_per_gib": cpu / (n / 2**30)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    for rnd in range(args.rounds):
        for advise in ("1", "0"):
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3")
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.file, advise],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            res = json.loads(out.stdout) if out.returncode == 0 else out.stderr[-300:]
            name = "huge pages advised" if advise == "1" else "not advised"
            print(f"round {rnd} {name:<19} {res}", flush=True)


if __name__ == "__main__":
    main()
