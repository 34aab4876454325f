#!/usr/bin/env python3
"""ferrio against numpy.fromfile and a raw readinto, reading a file into a fresh numpy array.

Reads a file (default 2 GiB) hot (in the page cache) and cold (its pages dropped with
``ferrio.drop_cache`` before every run) with three readers, alternating A B C every round:

- ferrio:   ``arr = np.empty(n, uint8); ferrio.open(path).read(arr)``
- fromfile: ``numpy.fromfile(path, dtype=uint8)``
- readinto: ``arr = np.empty(n, uint8); open(path, "rb", buffering=0).readinto(arr)`` (looped:
  one read(2) moves at most 2 GiB - 4 KiB)

Every run allocates a fresh array, so page faults count as they do for a user. Prints medians,
GiB/s, CPU-seconds per GiB (all threads of the process, from getrusage) and ferrio's ratios over
the other two; ``--json`` prints the same as JSON. The issue's target: >= 1.5x both, hot and
cold.

    python3 benchmarks/numpy_compare.py [--size 2GiB] [--rounds 5] [--dir DIR] [--json]

The file is made in a temporary directory under --dir (default: the current directory, which
should be on a real disk, not tmpfs) and removed at the end, also on failure and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import ferrio

GIB = 1 << 30
UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": GIB,
    "gib": GIB,
    "t": 1 << 40,
    "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """Parse ``2GiB``, ``512M``, ``1073741824``."""
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits) :]
    if not digits.isdigit() or unit not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (forms: 2GiB, 512M, 1073741824)")
    return int(digits) * UNITS[unit]


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_file(path: str, size: int) -> None:
    block = np.random.default_rng(7).integers(0, 256, 64 << 20, dtype=np.uint8)
    with open(path, "wb") as f:
        left = size
        i = 0
        while left:
            n = min(left, len(block))
            f.write((block[:n] ^ np.uint8(i & 0xFF)).tobytes())
            left -= n
            i += 1
        f.flush()
        os.fsync(f.fileno())


def read_ferrio(path: str, size: int) -> np.ndarray:
    arr = np.empty(size, dtype=np.uint8)
    with ferrio.open(path) as f:
        n = f.read(arr)
    assert n == size, (n, size)
    return arr


def read_fromfile(path: str, size: int) -> np.ndarray:
    arr = np.fromfile(path, dtype=np.uint8)
    assert arr.nbytes == size, (arr.nbytes, size)
    return arr


def read_readinto(path: str, size: int) -> np.ndarray:
    arr = np.empty(size, dtype=np.uint8)
    view = memoryview(arr)
    done = 0
    with open(path, "rb", buffering=0) as f:
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
    assert done == size, (done, size)
    return arr


READERS: dict[str, Callable[[str, int], np.ndarray]] = {
    "ferrio": read_ferrio,
    "fromfile": read_fromfile,
    "readinto": read_readinto,
}


def sample(arr: np.ndarray) -> bytes:
    """A few spread-out bytes, to check every reader read the same file."""
    idx = np.linspace(0, len(arr) - 1, 4097).astype(np.int64)
    return arr[idx].tobytes()


def measure(path: str, size: int, rounds: int, cold: bool) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {k: [] for k in READERS}
    cpus: dict[str, list[float]] = {k: [] for k in READERS}
    expected: bytes | None = None
    names = list(READERS)
    if not cold:
        read_readinto(path, size)  # warm the page cache
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # A B C, B C A, C A B, ...
        for name in order:
            if cold:
                ferrio.drop_cache(path)
                resident = ferrio.residency(path).share
                if resident > 0.01:
                    raise SystemExit(f"could not drop the file's pages ({resident:.0%} cached)")
            c0, t0 = cpu_seconds(), time.perf_counter()
            arr = READERS[name](path, size)
            t1, c1 = time.perf_counter(), cpu_seconds()
            got = sample(arr)
            del arr
            if expected is None:
                expected = got
            elif got != expected:
                raise SystemExit(f"{name} read different bytes")
            times[name].append(t1 - t0)
            cpus[name].append(c1 - c0)
    out: dict[str, dict[str, float]] = {}
    for name in names:
        t = statistics.median(times[name])
        out[name] = {
            "median_s": t,
            "gib_per_s": size / GIB / t,
            "cpu_s_per_gib": statistics.median(cpus[name]) / (size / GIB),
            "min_s": min(times[name]),
            "max_s": max(times[name]),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=parse_size, default=2 * GIB, help="file size (default 2GiB)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per mode (default 5)")
    ap.add_argument("--dir", default=".", help="where to make the file (default: .)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ferrio-numpy-", dir=args.dir) as d:
        path = os.path.join(d, "data.bin")
        make_file(path, args.size)
        results: dict[str, Any] = {
            "size_bytes": args.size,
            "rounds": args.rounds,
            "dir": os.path.abspath(args.dir),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(),
            "numpy": np.__version__,
            "ferrio": ferrio.__version__,
            "settings": ferrio.config.settings(),
        }
        for mode in ("hot", "cold"):
            m = measure(path, args.size, args.rounds, cold=mode == "cold")
            m["ratio_vs_fromfile"] = {"x": m["fromfile"]["median_s"] / m["ferrio"]["median_s"]}
            m["ratio_vs_readinto"] = {"x": m["readinto"]["median_s"] / m["ferrio"]["median_s"]}
            results[mode] = m

    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{args.size / GIB:.2f} GiB, {args.rounds} rounds, medians; {results['machine']}, "
        f"Python {results['python']}, numpy {results['numpy']}"
    )
    print(f"{'mode':<5} {'reader':<9} {'seconds':>8} {'GiB/s':>7} {'CPU s/GiB':>10}")
    for mode in ("hot", "cold"):
        for name in READERS:
            r = results[mode][name]
            print(
                f"{mode:<5} {name:<9} {r['median_s']:>8.3f} {r['gib_per_s']:>7.2f} "
                f"{r['cpu_s_per_gib']:>10.3f}"
            )
        print(
            f"{mode:<5} ferrio is {results[mode]['ratio_vs_fromfile']['x']:.2f}x fromfile, "
            f"{results[mode]['ratio_vs_readinto']['x']:.2f}x readinto (target >= 1.5x)"
        )


if __name__ == "__main__":
    main()
