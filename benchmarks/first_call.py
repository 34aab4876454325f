#!/usr/bin/env python3
"""Where a fresh process's first file -> GPU read loses time (issue 16's first-call cost).

Part 1, the CUDA driver alone (ctypes, no ferrio): how long pinned host memory takes to get,
as many 2 MiB `cuMemHostAlloc` calls one after the other, the same from 16 threads at once, one
large call, and `cuMemHostRegister` of private anonymous memory in 4 KiB and in transparent huge
pages, mapping and faulting in on the clock (`--no-driver` skips it). Part 2, ferrio
in fresh processes: the first read of a page-cache-warm file into a CuPy array against the
second, for each variant of the ring set-up (`--variants`; each a named set of `FERRIO_*`
variables, or `NAME=VALUE+...` of any variables; `FIRSTCALL_FRESH_SECOND=1` makes the second
read go to a new array, `FIRSTCALL_TOUCH_FIRST=1` writes the array before the first,
`FIRSTCALL_IMPORT_LATE=1` imports ferrio after the CUDA context is made),
variants alternating round by round, medians. Every child runs with `FERRIO_TRACE=1`; the
timeline of its first read is summarised per variant (when the last worker had its ring, its
first copy, the pinning done on the workers, waits), and the
per-thread timeline of one child per variant is printed (`--timelines 0` leaves it out).

    python3 benchmarks/first_call.py FILE [--rounds 5] [--variants mapped,driver,eager-1buf]
        [--small] [--mib-per-buffer 2] [--buffers 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from thread_sampler import summarise as sample_summary
from trace_summary import parse as parse_trace

CHILD = r"""
import json, os, sys, time
import cupy as cp
# FIRSTCALL_IMPORT_LATE=1: ferrio is imported once the CUDA context exists (as a script that
# imports it where it first needs it), not before.
late = os.environ.get("FIRSTCALL_IMPORT_LATE") == "1"
if not late:
    import ferrio
path, small = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, sys.argv[3])
from thread_sampler import ThreadSampler
sampler = ThreadSampler()  # FERRIO_BENCH_SAMPLE_MS: the first read's threads, sampled
# FIRSTCALL_FRESH_SECOND=1: the second read goes to a new array (GPU memory not yet written).
fresh = os.environ.get("FIRSTCALL_FRESH_SECOND") == "1"
# FIRSTCALL_TOUCH_FIRST=1: the array is written (zeroed) before the first read's clock.
touch = os.environ.get("FIRSTCALL_TOUCH_FIRST") == "1"
cp.zeros(1); cp.cuda.runtime.deviceSynchronize()        # the CUDA context is not timed
if late:
    import ferrio
with ferrio.open(path) as f:
    size = f.size
    arr = cp.empty(size, dtype=cp.uint8)
    if touch:
        arr.fill(0); cp.cuda.runtime.deviceSynchronize()
    out = {}
    if small:
        t = time.perf_counter(); f.read(arr[: 64 << 20]); out["small_s"] = time.perf_counter() - t
    for name in ("first", "second"):
        if name == "second" and fresh:
            first, arr = arr, cp.empty(size, dtype=cp.uint8)
            cp.cuda.runtime.deviceSynchronize()
        # time.monotonic is CLOCK_MONOTONIC, the clock of the FERRIO_TRACE lines.
        if name == "first":
            sampler.start()
        t0 = time.monotonic(); n = f.read(arr); cp.cuda.runtime.deviceSynchronize()
        t1 = time.monotonic()
        if name == "first":
            sampler.dump()
        out[name + "_s"] = t1 - t0
        out[name + "_at"] = [t0, t1]
        assert n == size
    out["gib"] = size / (1 << 30)
print(json.dumps(out))
"""

# Variants of the ring set-up: name -> FERRIO_* variables (on top of the defaults).
VARIANTS = {
    "eager": {},
    "eager-1buf": {"FERRIO_BOUNCE_BUFFERS": "1"},
    "eager-2x4MiB": {"FERRIO_BOUNCE_BUFFER_SIZE": "4MiB"},
    "mapped": {"FERRIO_PINNED_MEMORY": "mapped"},
    "driver": {"FERRIO_PINNED_MEMORY": "driver"},
}


def variant_env(name: str) -> dict[str, str]:
    """A named variant, or ``NAME=VALUE+NAME=VALUE`` (any variables, e.g. a ``PYTHONPATH`` with
    another build of ferrio to compare against)."""
    if name in VARIANTS:
        return VARIANTS[name]
    return dict(kv.split("=", 1) for kv in name.split("+"))


def summarise(events: list, at: list[float]) -> dict:
    """What the trace says about one read that ran from at[0] to at[1] (ms from its start)."""
    t0, t1 = at
    inside = [e for e in events if t0 - 1e-4 <= e[0] <= t1]
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    workers = sorted({e[2] for e in inside if e[3] == "task"})
    first_task = [min(e[0] for e in inside if e[2] == w and e[3] == "task") for w in workers]
    rings = [e for e in inside if e[3] == "ring"]
    copies = {}
    for e in inside:
        if e[3] == "copy" and e[2] not in copies:
            copies[e[2]] = e[0]
    pins_worker = [e for e in inside if e[3] == "pin" and e[2] in workers]
    waits = [e for e in inside if e[3] == "wait"]
    settle = [e for e in inside if e[3] == "settle"]
    tasks = [e for e in inside if e[3] == "task"]
    out = {
        "workers": len(workers),
        "tasks": len(tasks),
        "first_task_ms_max": round(max(map(ms, first_task)), 2) if first_task else None,
        "ring_ready_ms_max": round(max(ms(e[0]) + e[1] for e in rings), 2) if rings else None,
        "ring_ms_sum": round(sum(e[1] for e in rings), 2),
        "first_copy_ms_median": (
            round(statistics.median(map(ms, copies.values())), 2) if copies else None
        ),
        "first_copy_ms_max": round(max(map(ms, copies.values())), 2) if copies else None,
        "pins_on_workers": len(pins_worker),
        "pin_ms_on_workers": round(sum(e[1] for e in pins_worker), 2),
        "zero_ms": round(sum(e[1] for e in inside if e[3] == "zero"), 2),
        "stream_ms": round(sum(e[1] for e in inside if e[3] == "stream"), 2),
        "event_ms": round(sum(e[1] for e in inside if e[3] == "event"), 2),
        "bind_ms": round(sum(e[1] for e in inside if e[3] == "bind"), 2),
        "waits_traced": len(waits),
        "wait_ms_traced": round(sum(e[1] for e in waits), 2),
        "last_task_end_ms": round(max(ms(e[0]) + e[1] for e in tasks), 2) if tasks else None,
        "settle_ms_max": round(max(e[1] for e in settle), 2) if settle else None,
        "read_ms": round((t1 - t0) * 1e3, 2),
    }
    # Ring memory made ahead (anywhere in the process's timeline): whether the thread found CUDA
    # started, and when the slab was whole, in ms from this read's start.
    for e in events:
        if e[3] == "ahead-check":
            out["ahead_found_cuda"] = e[4]
        if e[3] == "ahead-made":
            out["ahead_whole_ms"] = round(ms(e[0]) + e[1], 2)
    return out


def timeline(events: list, at: list[float]) -> str:
    """One line per thread of the read from at[0]: each event as what@start_ms(duration_ms)."""
    t0, t1 = at
    by_thread: dict[int, list] = {}
    for e in events:
        if t0 - 1e-4 <= e[0] <= t1 and e[3] not in ("task", "settle"):
            by_thread.setdefault(e[2], []).append(e)
    lines = []
    for th, evs in sorted(by_thread.items(), key=lambda kv: kv[1][0][0]):
        evs.sort()
        tasks = [e for e in events if e[2] == th and e[3] == "task" and t0 <= e[0] <= t1]
        parts = [f"{e[3]}@{(e[0] - t0) * 1e3:.2f}({e[1]:.2f})" for e in evs]
        lines.append(f"  thread {th}: {len(tasks)} tasks; " + " ".join(parts))
    return "\n".join(lines)


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

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]  # fmt: skip
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    huge = 2 << 20

    def mapped(n: int, thp: bool) -> int:
        """Private anonymous memory, huge-page aligned and advised if `thp`, faulted in."""
        total = n + (huge if thp else 0)
        base = libc.mmap(None, total, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        assert base not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        start = (base + huge - 1) // huge * huge if thp else base
        if thp:
            libc.madvise(start, n, 14)  # MADV_HUGEPAGE
        ctypes.memset(start, 0, n)
        return start

    def register(n: int, thp: bool, pieces: int, threads: int = 1) -> None:
        def work(k: int) -> None:
            cuda.cuCtxSetCurrent(cuda._ctx)
            for _ in range(k):
                p = mapped(n // pieces, thp)
                rc = cuda.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n // pieces), 1)
                assert rc == 0, f"cuMemHostRegister: {rc}"

        if threads == 1:
            work(pieces)
            return
        ts = [threading.Thread(target=work, args=(pieces // threads,)) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            thp_mode = fh.read().strip()
    except OSError:
        thp_mode = "unknown"
    print(f"transparent huge pages: {thp_mode}")
    res["thp"] = thp_mode
    timed(f"cuMemHostAlloc {count} x {buf_mib} MiB, one after another", sequential, res)
    timed(f"cuMemHostAlloc {count} x {buf_mib} MiB from 16 threads", threaded, res)
    timed(f"cuMemHostAlloc 1 x {count * buf_mib} MiB", one_slab, res)
    total = nbytes * count
    for label, thp, pieces, threads in (
        (f"register 1 x {count * buf_mib} MiB, 4 KiB pages (mmap+fault on the clock)", False, 1, 1),
        (f"register 1 x {count * buf_mib} MiB, huge pages", True, 1, 1),
        (f"register {count} x {buf_mib} MiB, 4 KiB pages, one after another", False, count, 1),
        (f"register {count} x {buf_mib} MiB, huge pages, one after another", True, count, 1),
        (f"register {count} x {buf_mib} MiB, huge pages, from 16 threads", True, count, 16),
    ):
        try:
            timed(label, lambda t=thp, p=pieces, th=threads: register(total, t, p, th), res)
        except AssertionError as e:
            print(f"{label}: {e}")
    return res


HERE = os.path.dirname(os.path.abspath(__file__))  # the children import thread_sampler from here


def run_child(path: str, small: bool, env_extra: dict) -> tuple[dict, list, str]:
    env = dict(os.environ, FERRIO_TRACE="1", **env_extra)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, path, str(int(small)), HERE],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(line[-1]) if line else {"error": r.stderr[-400:]}
    return res, parse_trace(r.stderr), r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--mib-per-buffer", type=int, default=2)
    ap.add_argument("--buffers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="mapped,driver")
    ap.add_argument("--small", action="store_true", help="also a 64 MiB read before the first")
    ap.add_argument("--no-driver", action="store_true", help="skip part 1")
    ap.add_argument("--timelines", type=int, default=1, help="per-thread timelines per variant")
    ap.add_argument("--json", help="write every result here")
    args = ap.parse_args()
    names = args.variants.split(",")
    for n in names:
        if n not in VARIANTS and "=" not in n:
            sys.exit(f"unknown variant {n!r}; known: {', '.join(VARIANTS)}")
    out: dict = {"driver": {}, "ferrio": {n: [] for n in names}}
    if not args.no_driver:
        out["driver"] = part_driver(args.mib_per_buffer, args.buffers)
    subprocess.run(["dd", f"if={args.file}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    shown = {n: 0 for n in names}
    for rnd in range(args.rounds):
        # Alternate the order too, so no variant always runs right after the same other one.
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            res, events, stderr = run_child(args.file, args.small, variant_env(name))
            res["round"] = rnd
            if "gib" not in res:
                print(name, res, flush=True)
                out["ferrio"][name].append(res)
                continue
            g = res["gib"]
            res["trace_first"] = summarise(events, res["first_at"])
            res["trace_second"] = summarise(events, res["second_at"])
            out["ferrio"][name].append(res)
            tf = res["trace_first"]
            print(
                f"{name:<20} round {rnd}: first {g / res['first_s']:.2f} GiB/s "
                f"({res['first_s'] * 1e3:.1f} ms), second {g / res['second_s']:.2f} "
                f"({res['second_s'] * 1e3:.1f} ms), ratio {res['second_s'] / res['first_s']:.3f}; "
                f"last ring ready {tf['ring_ready_ms_max']} ms, last first copy "
                f"{tf['first_copy_ms_max']} ms, pinning on workers {tf['pin_ms_on_workers']} ms "
                f"({tf['pins_on_workers']}), event creation {tf['event_ms']} ms; ring memory "
                f"made ahead: found CUDA started {tf.get('ahead_found_cuda')}, whole at "
                f"{tf.get('ahead_whole_ms')} ms",
                flush=True,
            )
            sampled = "ferrio-sample" in stderr
            samples = sample_summary(stderr, res["first_at"][0]) if sampled else ""
            if sampled:
                print("  thread samples of the first read:" + samples.splitlines()[0], flush=True)
            if shown[name] < args.timelines:
                shown[name] += 1
                print(f"timeline of {name}'s first read (ms from its start: what@start(duration)):")
                print(timeline(events, res["first_at"]), flush=True)
                if sampled:
                    print(
                        f"thread samples of {name}'s first read (FERRIO_BENCH_SAMPLE_MS):\n"
                        f"{samples}"
                    )
    print("\nmedians, fresh process per row; ratio = first-read rate / second-read rate (>= 0.9):")
    head = f"{'variant':<20} {'first GiB/s':>11} {'second':>8} {'ratio':>6}"
    print(head + "  trace of the first read (medians)")
    for name in names:
        ok = [r for r in out["ferrio"][name] if "gib" in r]
        if not ok:
            print(f"{name:<20} no result")
            continue
        g = ok[0]["gib"]
        first = statistics.median(r["first_s"] for r in ok)
        second = statistics.median(r["second_s"] for r in ok)
        ratio = statistics.median(r["second_s"] / r["first_s"] for r in ok)
        keys = (
            "ring_ready_ms_max", "first_copy_ms_max", "pin_ms_on_workers", "zero_ms",
            "wait_ms_traced", "settle_ms_max", "event_ms", "ahead_whole_ms",
        )  # fmt: skip
        med = {}
        for k in keys:
            vals = [r["trace_first"][k] for r in ok if r["trace_first"].get(k) is not None]
            med[k] = round(statistics.median(vals), 2) if vals else None
        print(f"{name:<20} {g / first:>11.2f} {g / second:>8.2f} {ratio:>6.3f}  {med}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh)
    times = {
        n: [{k: r.get(k) for k in ("first_s", "second_s")} for r in v]
        for n, v in out["ferrio"].items()
    }
    print(json.dumps(times))


if __name__ == "__main__":
    main()
