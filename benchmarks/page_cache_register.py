#!/usr/bin/env python3
"""Can a warm file reach the GPU without a CPU copy? (issue 16's warm target, an experiment)

ferrio's warm file -> GPU read copies page-cache bytes into pinned ring buffers (one CPU copy)
and the GPU copies them on; a second process's read of an 8 GiB file stays ~10% under the
pinned host -> device rate. This asks the driver alone (ctypes, no ferrio) whether the page
cache itself can be the copy's source: the file mapped read-only and shared, its pages pinned
with ``cuMemHostRegister(CU_MEMHOSTREGISTER_READ_ONLY)`` piece by piece, each piece copied to
the GPU from where it lies, then unregistered. A fresh process per row, its CUDA context made
before the clock, variants alternating round by round, medians (GiB/s of file bytes, or ms):

- ``pinned``: the pinned host -> device rate, one 64 MiB pinned buffer copied over and over
  on 4 streams (the yardstick);
- ``whole``: the whole file registered in one call (``register_ms``), copied in 64 MiB pieces
  on 4 streams (``copy``), unregistered (``unregister_ms``);
- ``pipe-T-C``: T threads, each taking the next C MiB piece, registering it, copying it on its
  own stream, and unregistering the piece before last once its copy is done (``rate`` from the
  first register to the last copy's end, everything on the clock);
- ``populate-T-C``: as ``pipe`` with each piece's page tables filled first
  (``MADV_POPULATE_READ``).

Every row checks bytes: 4 KiB at the start, middle and end of every 512 MiB on the GPU against
the file. The device attributes that decide whether this works at all are printed first.

    python3 benchmarks/page_cache_register.py FILE [--rounds 3] [--variants ...]
"""

from __future__ import annotations

import argparse

from ring_setup import alternate, json_child, print_medians

CHILD = r"""
import ctypes, json, os, sys, threading, time
path, variant = sys.argv[1], sys.argv[2]
MIB = 1 << 20
cuda = ctypes.CDLL("libcuda.so.1")
V, N, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
def ok(rc, what):
    if rc != 0:
        s = ctypes.c_char_p(); cuda.cuGetErrorName(rc, ctypes.byref(s))
        raise SystemExit(f"{what}: {rc} {s.value}")
ok(cuda.cuInit(0), "cuInit")
dev = I(); ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = V(); ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(cuda.cuCtxSetCurrent(ctx), "set")
size = os.path.getsize(path)
dptr = ctypes.c_uint64(); ok(cuda.cuMemAlloc_v2(ctypes.byref(dptr), N(size)), "cuMemAlloc")
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = V
libc.mmap.argtypes = [V, N, I, I, I, ctypes.c_long]
libc.madvise.argtypes = [V, N, I]
libc.munmap.argtypes = [V, N]
fd = os.open(path, os.O_RDONLY)
out = {}
if variant == "attrs":
    for name, attr in (("read_only_host_register_supported", 113),
                       ("pageable_memory_access_uses_host_page_tables", 100),
                       ("host_register_supported", 99), ("pageable_memory_access", 88)):
        v = I(); rc = cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, dev)
        out[name] = v.value if rc == 0 else f"error {rc}"
    print(json.dumps(out)); sys.exit()
streams = []
def stream():
    s = V(); ok(cuda.cuStreamCreate(ctypes.byref(s), 1), "stream"); return s
def copy(dst, src, n, s):
    ok(cuda.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dst), V(src), N(n), s), "copy")
def sync(s): ok(cuda.cuStreamSynchronize(s), "sync")
def register(p, n):
    ok(cuda.cuMemHostRegister_v2(V(p), N(n), 8), "cuMemHostRegister(READ_ONLY)")
def unregister(p): ok(cuda.cuMemHostUnregister(V(p)), "unregister")
base = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
assert base and base != V(-1).value
piece = 64 * MIB
t0 = time.perf_counter()
ms = lambda: (time.perf_counter() - t0) * 1e3
if variant == "pinned":
    host = V(); ok(cuda.cuMemHostAlloc(ctypes.byref(host), N(piece), 0), "hostalloc")
    ss = [stream() for _ in range(4)]
    t0 = time.perf_counter()
    for k, off in enumerate(range(0, size, piece)):
        copy(dptr.value + off, host.value, min(piece, size - off), ss[k % 4])
    for s in ss: sync(s)
    out["rate"] = size / (1 << 30) / (ms() / 1e3)
    check = False
elif variant == "whole":
    ss = [stream() for _ in range(4)]
    t0 = time.perf_counter(); register(base, size); out["register_ms"] = ms()
    t1 = time.perf_counter()
    for k, off in enumerate(range(0, size, piece)):
        copy(dptr.value + off, base + off, min(piece, size - off), ss[k % 4])
    for s in ss: sync(s)
    out["copy"] = size / (1 << 30) / (time.perf_counter() - t1)
    t2 = time.perf_counter(); unregister(base)
    out["unregister_ms"] = (time.perf_counter() - t2) * 1e3
    out["rate"] = size / (1 << 30) / (ms() / 1e3)
    check = True
else:
    kind, threads, mib = variant.split("-")
    threads, chunk = int(threads), int(mib) * MIB
    populate = kind == "populate"
    ss = [stream() for _ in range(threads)]
    nxt = [0]; lock = threading.Lock(); reg_ms = [0.0] * threads; errors = []
    def work(i):
        try:
            ok(cuda.cuCtxSetCurrent(ctx), "set")
            held = []
            while True:
                with lock:
                    off = nxt[0]; nxt[0] += chunk
                if off >= size: break
                n = min(chunk, size - off)
                t = time.perf_counter()
                if populate: libc.madvise(base + off, n, 22)  # MADV_POPULATE_READ
                register(base + off, n)
                reg_ms[i] += (time.perf_counter() - t) * 1e3
                copy(dptr.value + off, base + off, n, ss[i])
                e = V(); ok(cuda.cuEventCreate(ctypes.byref(e), 2), "event")
                ok(cuda.cuEventRecord(e, ss[i]), "record")
                held.append((base + off, e))
                if len(held) > 2:
                    # The oldest piece's copy is waited for, then its pages let go.
                    p, e = held.pop(0)
                    ok(cuda.cuEventSynchronize(e), "event sync"); unregister(p)
            sync(ss[i])
            for p, _ in held: unregister(p)
        except SystemExit as e:
            errors.append(str(e))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    out["rate"] = size / (1 << 30) / (ms() / 1e3)
    out["register_ms_per_thread"] = sum(reg_ms) / threads
    if errors: raise SystemExit(errors[0])
    check = True
if check:
    back = ctypes.create_string_buffer(4096)
    bad = 0
    for off in range(0, size, 512 * MIB):
        for at in (off, off + 256 * MIB, min(off + 512 * MIB, size) - 4096):
            ok(cuda.cuMemcpyDtoH_v2(back, ctypes.c_uint64(dptr.value + at), N(4096)), "back")
            if back.raw != os.pread(fd, 4096, at): bad += 1
    out["wrong_pieces"] = bad
print(json.dumps(out))
"""

VARIANTS = ["pinned", "whole", "pipe-4-64", "pipe-8-32", "pipe-16-16", "populate-8-32"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()

    def child(name: str) -> dict | None:
        return json_child(CHILD, args.file, name, label=name, timeout=120)

    print("attributes:", child("attrs"), flush=True)
    got = alternate(args.variants.split(","), args.rounds, child, width=14)
    print(f"\nmedians of {args.rounds} fresh processes (rate, copy: GiB/s; *_ms: ms):")
    print_medians(got, width=14)


if __name__ == "__main__":
    main()
