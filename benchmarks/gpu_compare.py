#!/usr/bin/env python3
"""File -> GPU memory and back: ferrio against KvikIO and numpy + CuPy, in one run.

Reads an N GiB file (default 8) into a CuPy array, hot (page cache) and cold (caches dropped,
needs root), alternating engines every round, and writes from GPU memory to a file. Reports
medians in GiB/s and CPU-seconds per GiB, the pinned host-to-device copy rate as the ceiling,
and `dd iflag=direct` as the cold yardstick. With --sweep also tries ferrio thread counts and
bounce-ring shapes (to choose defaults).

    python3 benchmarks/gpu_compare.py [--size-gib 8] [--rounds 3] [--dir /root] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cupy as cp
import numpy as np

import ferrio

GIB = 1 << 30


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def kvikio_threads(kvikio: Any, n: int) -> Any:
    """A context manager setting KvikIO's thread count, for old and new KvikIO APIs."""
    d = kvikio.defaults
    if hasattr(d, "set"):
        return d.set("num_threads", n)
    return d.set_num_threads(n)


def measure(nbytes: int, fn: Callable[[], Any]) -> tuple[float, float]:
    """Runs fn (which must synchronise the GPU) and returns (GiB/s, CPU s/GiB)."""
    cp.cuda.runtime.deviceSynchronize()
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    cp.cuda.runtime.deviceSynchronize()
    t, c = time.perf_counter() - t0, cpu_seconds() - c0
    return nbytes / t / GIB, c / (nbytes / GIB)


def pinned_copy_rates(rounds: int) -> list[tuple[float, float]]:
    """Measure host->device copies of 1 GiB from pinned memory, `rounds` times."""
    pinned = cp.cuda.alloc_pinned_memory(GIB)
    host = np.frombuffer(pinned, dtype=np.uint8, count=GIB)
    host[:] = 1
    dev = cp.empty(GIB, dtype=cp.uint8)
    return [measure(GIB, lambda: dev.set(host)) for _ in range(rounds)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="directory on the disk to test (default: cwd)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--sweep", action="store_true", help="also try ferrio thread/ring settings")
    ap.add_argument("--no-cold", action="store_true", help="skip cold runs (no root)")
    args = ap.parse_args()

    try:
        import kvikio
        import kvikio.defaults
    except ImportError as e:  # still measure ferrio
        print(f"note: KvikIO unavailable ({e})", file=sys.stderr)
        kvikio = None

    nbytes = int(args.size_gib * GIB) // 4096 * 4096
    tmpdir = tempfile.mkdtemp(prefix=".ferrio-gpu-", dir=args.dir or os.getcwd())
    path = os.path.join(tmpdir, "data")
    rows: dict[str, list[tuple[float, float]]] = {}

    def add(name: str, sample: tuple[float, float]) -> None:
        rows.setdefault(name, []).append(sample)
        print(f"  {name:44s} {sample[0]:7.2f} GiB/s  {sample[1]:6.3f} CPU s/GiB", flush=True)

    try:
        out = os.path.join(tmpdir, "out")
        src = cp.random.randint(0, 255, size=nbytes, dtype=cp.uint8)
        cp.cuda.runtime.deviceSynchronize()
        with ferrio.open(path, "w") as f:
            f.write(src)
        os.sync()
        dst = cp.empty(nbytes, dtype=cp.uint8)

        # The ceiling: pinned host -> device copies.
        for sample in pinned_copy_rates(3):
            add("pinned host->device copy (1 GiB)", sample)

        def ferrio_read(**cfg: Any) -> Callable[[], Any]:
            def run() -> None:
                before = sum(p["bytes_direct"] for p in ferrio.stats())
                with ferrio.config.set(**cfg), ferrio.open(path) as f:
                    n = f.read(dst)
                assert n == nbytes, n
                direct = sum(p["bytes_direct"] for p in ferrio.stats()) - before
                if direct:
                    print(f"    (ferrio read {direct / GIB:.2f} GiB with O_DIRECT: not cached)")

            return run

        def kvikio_read(threads: int) -> Callable[[], Any]:
            def run() -> None:
                with kvikio_threads(kvikio, threads), kvikio.CuFile(path, "r") as f:
                    n = f.read(dst)
                assert n == nbytes, n

            return run

        def numpy_read() -> None:
            a = np.fromfile(path, dtype=np.uint8)
            dst[:] = cp.asarray(a)

        def check() -> None:
            assert bool((dst == src).all()), "wrong bytes on the GPU"

        engines: list[tuple[str, Callable[[], Any]]] = [("ferrio (defaults)", ferrio_read())]
        if kvikio is not None:
            engines += [
                ("KvikIO 1 thread (default)", kvikio_read(1)),
                ("KvikIO 16 threads", kvikio_read(16)),
            ]
        engines.append(("numpy.fromfile + cupy.asarray", numpy_read))
        sweep: list[tuple[str, Callable[[], Any]]] = []
        if args.sweep:
            for t in (4, 8, 16, 32):
                sweep.append((f"ferrio threads={t}", ferrio_read(threads_per_device=t)))
            for size, k in (("1MiB", 4), ("2MiB", 4), ("4MiB", 2), ("8MiB", 4)):
                sweep.append(
                    (
                        f"ferrio ring {k}x{size}",
                        ferrio_read(bounce_buffer_size=size, bounce_buffers=k),
                    )
                )

        for r in range(1, args.rounds + 1):
            print(f"round {r}: hot", flush=True)
            # Warm the page cache, twice: the second touch of freshly cached pages moves them to
            # the kernel's active list (lock-heavy with 16 threads), and whichever engine came
            # second would pay for it.
            ferrio_read(direct_read="off")()
            ferrio_read(direct_read="off")()
            for name, fn in engines + sweep:
                dst.fill(0xA5)
                add(f"hot  {name}", measure(nbytes, fn))
                check()
            if not args.no_cold:
                print(f"round {r}: cold", flush=True)
                for name, fn in engines + sweep:
                    dst.fill(0xA5)
                    drop_caches()
                    add(f"cold {name}", measure(nbytes, fn))
                    check()
                drop_caches()
                t0 = time.perf_counter()
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                dd = ["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct", "status=none"]
                subprocess.run(dd, check=True)
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter() - t0
                cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
                add(
                    "cold dd bs=16M iflag=direct (to host)",
                    (nbytes / t / GIB, cpu / (nbytes / GIB)),
                )

            print(f"round {r}: write", flush=True)

            def ferrio_write() -> None:
                with ferrio.open(out, "w") as f:
                    f.write(src)
                    os.fsync(f.fileno())

            def kvikio_write(threads: int) -> Callable[[], Any]:
                def run() -> None:
                    with kvikio_threads(kvikio, threads), kvikio.CuFile(out, "w") as f:
                        f.write(src)
                        os.fsync(os.open(out, os.O_RDONLY))

                return run

            writers = [("ferrio (defaults)", ferrio_write)]
            if kvikio is not None:
                writers += [
                    ("KvikIO 1 thread (default)", kvikio_write(1)),
                    ("KvikIO 16 threads", kvikio_write(16)),
                ]
            for name, fn in writers:
                if os.path.exists(out):
                    os.unlink(out)
                os.sync()
                add(f"write+fsync {name}", measure(nbytes, fn))
                assert os.path.getsize(out) == nbytes
            # The written copies must not push the input out of the page cache.
            os.unlink(out)
            drop_caches()
    finally:
        for p in (path, os.path.join(tmpdir, "out")):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(tmpdir)

    print(f"\nmedians over {args.rounds} rounds, {nbytes / GIB:.1f} GiB file")
    summary: dict[str, dict[str, float]] = {}
    for name, samples in rows.items():
        g = statistics.median(s[0] for s in samples)
        c = statistics.median(s[1] for s in samples)
        summary[name] = {"gib_per_s": g, "cpu_seconds_per_gib": c, "rounds": len(samples)}
        print(f"{name:50s} {g:7.2f} GiB/s  {c:6.3f} CPU s/GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"file_gib": nbytes / GIB, "rounds": args.rounds, "results": summary}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
