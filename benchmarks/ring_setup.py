#!/usr/bin/env python3
"""How fast 16 workers' bounce rings can be set up, by the driver alone (issue 16's first call).

Every row runs in a fresh process whose CUDA context exists before the clock (ctypes, no
ferrio), variants alternating round by round, medians in milliseconds. A ring here is what
ferrio's default makes per worker: a stream, 2 pinned buffers of 2 MiB in transparent huge pages
(mapped, faulted in with `MADV_POPULATE_WRITE`, registered with `cuMemHostRegister`) and an
event per buffer. The variants differ in who makes them and in how many registrations:

- ``workers``: each of 16 threads makes its own ring, each buffer its own mapping and
  registration (ferrio's way today); ``ready`` is when the last thread has its ring;
- ``workers-one-map``: each thread maps its two buffers as one and registers that once;
- ``one-pass``: one mapping for every ring, faulted in by 16 threads at once, registered once
  (``ready`` then), then every stream and event made by one thread;
- ``one-pass-halves``: the same, registered in two calls: every ring's first buffer, then
  every ring's second (``first`` is when the first call returned);
- ``workers-1buf``: as ``workers`` with one buffer per ring;
- ``fault``: the faulting alone, 64 MiB by one thread, by 16 threads, by 16 threads again after
  unmapping as much, and by one thread once more;
- ``sizes``: one thread registers memory faulted in before the clock, in calls of 2, 4, 16 and
  64 MiB, and reports milliseconds per call (the first call of the process apart).

    python3 benchmarks/ring_setup.py [--rounds 5] [--workers 16] [--variants ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable

CHILD = r"""
import ctypes, json, statistics, sys, threading, time
variant, workers = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
BUF = 2 * MIB
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int(); assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
free = ctypes.c_size_t(); total = ctypes.c_size_t()
cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))  # the context exists now
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
I, N = ctypes.c_int, ctypes.c_size_t
libc.mmap.argtypes = [ctypes.c_void_p, N, I, I, I, ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
HUGE = 2 * MIB

def mapping(n):
    base = libc.mmap(None, n + HUGE, 3, 0x22, -1, 0)
    assert base and base != ctypes.c_void_p(-1).value
    start = (base + HUGE - 1) // HUGE * HUGE
    libc.madvise(start, n, 14)  # MADV_HUGEPAGE
    return start

def fault(p, n):
    assert libc.madvise(p, n, 23) == 0, ctypes.get_errno()  # MADV_POPULATE_WRITE

def register(p, n):
    rc = cuda.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1)
    assert rc == 0, f"cuMemHostRegister: {rc}"

def stream():
    s = ctypes.c_void_p(); assert cuda.cuStreamCreate(ctypes.byref(s), 1) == 0

def event():
    e = ctypes.c_void_p(); assert cuda.cuEventCreate(ctypes.byref(e), 2) == 0

out = {}
t0 = time.perf_counter()
ms = lambda: (time.perf_counter() - t0) * 1e3
if variant in ("workers", "workers-one-map", "workers-1buf"):
    ready = [0.0] * workers
    go = threading.Barrier(workers + 1)
    def work(i):
        cuda.cuCtxSetCurrent(ctx)
        go.wait()
        stream()
        if variant in ("workers", "workers-1buf"):
            for _ in range(1 if variant == "workers-1buf" else 2):
                p = mapping(BUF); fault(p, BUF); register(p, BUF)
        else:
            p = mapping(2 * BUF); fault(p, 2 * BUF); register(p, 2 * BUF)
        event(); event()
        ready[i] = ms()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in ts: t.start()
    go.wait(); t0 = time.perf_counter()
    for t in ts: t.join()
    out = {"ready": max(ready), "median_ready": statistics.median(ready)}
elif variant in ("one-pass", "one-pass-halves"):
    n = workers * 2 * BUF
    p = mapping(n)
    ts = [threading.Thread(target=fault, args=(p + i * 2 * BUF, 2 * BUF)) for i in range(workers)]
    for t in ts: t.start()
    for t in ts: t.join()
    out["faulted"] = ms()
    if variant == "one-pass":
        register(p, n)
        out["registered"] = ms()
    else:
        register(p, n // 2)
        out["first"] = ms()
    for _ in range(workers):
        stream(); event(); event()
    out["streams_events"] = ms()
    if variant == "one-pass-halves":
        register(p + n // 2, n // 2)
    out["ready"] = ms()
elif variant == "fault":
    n = workers * 2 * BUF
    def parallel(p):
        ts = [threading.Thread(target=fault, args=(p + i * 2 * BUF, 2 * BUF))
              for i in range(workers)]
        for t in ts: t.start()
        for t in ts: t.join()
    for label, threads in (("one_thread", 1), ("threads", workers)):
        p = mapping(n); t = time.perf_counter()
        fault(p, n) if threads == 1 else parallel(p)
        out[label] = (time.perf_counter() - t) * 1e3
        libc.munmap(p, n)
    # The same size again, now that this process has freed as much.
    p = mapping(n); t = time.perf_counter(); parallel(p)
    out["threads_again"] = (time.perf_counter() - t) * 1e3
    p = mapping(n); t = time.perf_counter(); fault(p, n)  # kept: a fresh one, not a reused one
    out["one_thread_more"] = (time.perf_counter() - t) * 1e3
elif variant == "sizes":
    for size_mib, calls in ((2, 9), (4, 4), (16, 2), (64, 1)):
        n = size_mib * MIB * calls
        p = mapping(n); fault(p, n)
        times = []
        for k in range(calls):
            t = time.perf_counter(); register(p + k * size_mib * MIB, size_mib * MIB)
            times.append((time.perf_counter() - t) * 1e3)
        if size_mib == 2:
            out["first_call_2MiB"] = times.pop(0)
        out[f"{size_mib}MiB_per_call"] = statistics.median(times)
else:
    sys.exit(f"unknown variant {variant}")
print(json.dumps(out))
"""

VARIANTS = [
    "workers", "workers-one-map", "workers-1buf", "one-pass", "one-pass-halves", "fault", "sizes"
]  # fmt: skip


def json_child(code: str, *args: str, label: str, timeout: float | None = None) -> dict | None:
    """The last JSON line a fresh ``python -c code args...`` printed, or None (said, with the
    end of its output, under `label`) if it printed none."""
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        print(f"{label}: failed: {(r.stderr or r.stdout)[-400:]}", flush=True)
        return None
    return json.loads(lines[-1])


def alternate(
    names: list[str], rounds: int, child: Callable[[str], dict | None], width: int = 16
) -> dict[str, list[dict]]:
    """Each of `names` run by `child` (a fresh process's JSON, or None if it failed) once per
    round, in order in even rounds and reversed in odd ones; every result printed as it comes."""
    got: dict[str, list[dict]] = {n: [] for n in names}
    for rnd in range(rounds):
        for name in names if rnd % 2 == 0 else names[::-1]:
            res = child(name)
            if res is None:
                continue
            got[name].append(res)
            shown = ", ".join(f"{k} {v:.2f}" for k, v in res.items())
            print(f"{name:<{width}} round {rnd}: {shown}", flush=True)
    return got


def print_medians(got: dict[str, list[dict]], width: int = 16) -> None:
    """One line per name: the median of each key over its results."""
    for name, rows in got.items():
        if rows:
            med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
            print(f"  {name:<{width}} " + ", ".join(f"{k} {v}" for k, v in med.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()

    def child(name: str) -> dict | None:
        return json_child(CHILD, name, str(args.workers), label=name)

    got = alternate(args.variants.split(","), args.rounds, child)
    print(f"\nmedians of {args.rounds} fresh processes, ms ({args.workers} rings of 2 x 2 MiB):")
    print_medians(got)


if __name__ == "__main__":
    main()
