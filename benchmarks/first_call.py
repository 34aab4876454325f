#!/usr/bin/env python3
"""Where a fresh process's first file -> GPU read loses time (issue 16's first-call cost).

Part 1, the CUDA driver alone (ctypes, no ferrio): how long pinned host memory takes to get,
as many 4 MiB `cuMemHostAlloc` calls one after the other, the same from 16 threads at once, one
large call, and `cuMemHostRegister` of ordinary memory. Part 2, ferrio in fresh processes: the
first read of a page-cache-warm file into a CuPy array, against the second, with and without a
small read first (which pays the set-up).

    python3 benchmarks/first_call.py FILE [--mib-per-buffer 4] [--buffers 32]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time

CHILD = r"""
import json, sys, time
import cupy as cp
import ferrio
path, small = sys.argv[1], int(sys.argv[2])
cp.zeros(1); cp.cuda.runtime.deviceSynchronize()        # the CUDA context is not timed
with ferrio.open(path) as f:
    size = f.size
    arr = cp.empty(size, dtype=cp.uint8)
    out = {}
    if small:
        t = time.perf_counter(); f.read(arr[: 64 << 20]); out["small_s"] = time.perf_counter() - t
    for name in ("first_s", "second_s"):
        t = time.perf_counter(); n = f.read(arr); cp.cuda.runtime.deviceSynchronize()
        out[name] = time.perf_counter() - t
        assert n == size
    out["gib"] = size / (1 << 30)
print(json.dumps(out))
"""


def driver() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    cuda._ctx = ctx  # type: ignore[attr-defined]
    return cuda


def host_alloc(cuda: ctypes.CDLL, nbytes: int) -> ctypes.c_void_p:
    p = ctypes.c_void_p()
    rc = cuda.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes), 0)
    assert rc == 0, rc
    return p


def timed(label: str, fn, results: dict) -> None:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    results[label] = round((time.perf_counter() - t) * 1e3, 2)
    print(f"{label:<52} {results[label]:>9.2f} ms", flush=True)


def part_driver(buf_mib: int, count: int) -> dict:
    cuda = driver()
    nbytes = buf_mib << 20
    res: dict = {}
    keep: list = []

    def sequential() -> None:
        keep.extend(host_alloc(cuda, nbytes) for _ in range(count))

    def threaded() -> None:
        def work() -> None:
            cuda.cuCtxSetCurrent(cuda._ctx)
            for _ in range(count // 16):
                keep.append(host_alloc(cuda, nbytes))

        ts = [threading.Thread(target=work) for _ in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def one_slab() -> None:
        keep.append(host_alloc(cuda, nbytes * count))

    def register() -> None:
        import mmap

        m = mmap.mmap(-1, nbytes * count)
        m.write(b"\0" * len(m))  # faulted in first, as a pool of ordinary memory would be
        addr = ctypes.c_void_p.from_buffer(m)
        keep.append(m)
        rc = cuda.cuMemHostRegister_v2(ctypes.addressof(addr), ctypes.c_size_t(len(m)), 0)
        assert rc == 0, rc

    timed(f"cuMemHostAlloc {count} x {buf_mib} MiB, one after another", sequential, res)
    timed(f"cuMemHostAlloc {count} x {buf_mib} MiB from 16 threads", threaded, res)
    timed(f"cuMemHostAlloc 1 x {count * buf_mib} MiB", one_slab, res)
    try:
        timed(f"cuMemHostRegister of {count * buf_mib} MiB (faulted)", register, res)
    except (AssertionError, ValueError, TypeError) as e:
        print(f"cuMemHostRegister: {e}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--mib-per-buffer", type=int, default=4)
    ap.add_argument("--buffers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out: dict = {"driver": part_driver(args.mib_per_buffer, args.buffers), "ferrio": []}
    subprocess.run(["dd", f"if={args.file}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    for _ in range(args.rounds):
        for small in (0, 1):
            r = subprocess.run(
                [sys.executable, "-c", CHILD, args.file, str(small)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(line[-1]) if line else {"error": r.stderr[-400:]}
            res["small_first"] = bool(small)
            out["ferrio"].append(res)
            if "gib" in res:
                g = res["gib"]
                print(
                    f"ferrio fresh process, small read first={bool(small)}: "
                    f"small {res.get('small_s', 0) * 1e3:.1f} ms, "
                    f"first {g / res['first_s']:.2f} GiB/s, second {g / res['second_s']:.2f} GiB/s",
                    flush=True,
                )
            else:
                print(res, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
