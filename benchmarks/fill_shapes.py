#!/usr/bin/env python3
"""How a cold file is best pulled into the page cache on this disk (issue 15/16's cold study).

For each shape, the caches are dropped, the whole file is read into host memory by that shape,
and three things are recorded: the rate, what the disk saw (`/proc/diskstats`: mean request
size, requests in flight while busy, time per request), and how fast a new process then reads
the file again from the page cache (and how much of it sits in huge folios). Shapes alternate
round by round; medians are printed at the end.

Shapes (THREADS and sizes are written like `16`, `512K`, `2M`):
  buffered:T:PIECE     T threads each read their own 64 MiB task in PIECE preads, through the
                       page cache (the kernel's readahead sets the depth): ferrio's fill today
  populate:T:CHUNK     T threads take CHUNK after CHUNK of a shared read-only mapping with
                       MADV_HUGEPAGE and MADV_RANDOM, pull each in with MADV_POPULATE_READ
                       (one read of exactly that chunk, kept in the page cache as huge folios
                       where the file system allows), then pread it out: the caller sets the depth
  random:T:BS          T threads take BS blocks in order from one queue and pread them through
                       the page cache from a descriptor advised POSIX_FADV_RANDOM (no
                       readahead: one read of exactly BS per call, fastsafetensors' request
                       shape, but cached; the cache gets small folios)
  direct:T:BS          T threads take BS blocks in order from one queue and read them with
                       O_DIRECT (fastsafetensors' reader: 16 threads, 512 KiB): caches nothing

With ``--gpu-again FERRIO`` each round also reads the file once more with ``FERRIO read --gpu 0``
(a new process, the page cache as the shape left it): the rate a checkpoint loaded again gets.

    sudo python3 benchmarks/fill_shapes.py FILE --rounds 3 --shapes buffered:2:16M,populate:4:2M
"""

import argparse
import ctypes
import json
import mmap
import os
import re
import statistics
import subprocess
import sys
import threading
import time

MADV_POPULATE_READ = 22
TASK = 64 << 20


def size_arg(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def disk_of(path):
    dev = os.stat(path).st_dev
    node = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    # A partition's statistics are its own, but its queue settings are its disk's.
    return os.path.basename(os.path.dirname(node) if os.path.exists(f"{node}/partition") else node)


def read_text(path):
    with open(path) as f:
        return f.read()


def diskstats(disk):
    for line in read_text("/proc/diskstats").splitlines():
        f = line.split()
        if f[2] == disk:
            return int(f[3]), int(f[5]), int(f[6]), int(f[12]), int(f[13])
    raise SystemExit(f"{disk} not in /proc/diskstats")


def disk_summary(before, after):
    reads, sectors, ms_reading, busy, weighted = (a - b for a, b in zip(after, before, strict=True))
    reads = max(reads, 1)
    return {
        "request_kib": round(sectors * 512 / reads / 1024),
        "in_flight": round(weighted / max(busy, 1), 1),
        "ms_each": round(ms_reading / reads, 2),
    }


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def take(counter, lock, step, size):
    with lock:
        off = counter[0]
        counter[0] += step
    return off if off < size else None


def run_threads(n, fn):
    errors = []

    def guarded():
        try:
            fn()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def read_buffered(path, size, threads, piece):
    fd = os.open(path, os.O_RDONLY)
    counter, lock = [0], threading.Lock()

    def work():
        buf = bytearray(piece)
        while (task := take(counter, lock, TASK, size)) is not None:
            end = min(task + TASK, size)
            off = task
            while off < end:
                view = memoryview(buf)[: min(piece, end - off)]
                n = os.preadv(fd, [view], off)
                if n <= 0:
                    raise OSError(f"short read at {off}")
                off += n

    try:
        run_threads(threads, work)
    finally:
        os.close(fd)


def read_populate(path, size, threads, chunk):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    for advice in (mmap.MADV_HUGEPAGE, mmap.MADV_RANDOM):
        if libc.madvise(base, size, advice) != 0:
            raise OSError(ctypes.get_errno(), f"madvise {advice}")
    counter, lock = [0], threading.Lock()

    def work():
        buf = bytearray(chunk)
        while (off := take(counter, lock, chunk, size)) is not None:
            n = min(chunk, size - off)
            # ctypes releases the GIL around the call, so the threads' reads overlap.
            if libc.madvise(base + off, n, MADV_POPULATE_READ) != 0:
                raise OSError(ctypes.get_errno(), f"MADV_POPULATE_READ at {off}")
            os.preadv(fd, [memoryview(buf)[:n]], off)

    try:
        run_threads(threads, work)
    finally:
        libc.munmap(base, size)
        os.close(fd)


def read_random(path, size, threads, block):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    counter, lock = [0], threading.Lock()

    def work():
        buf = bytearray(block)
        while (off := take(counter, lock, block, size)) is not None:
            view = memoryview(buf)[: min(block, size - off)]
            if os.preadv(fd, [view], off) != len(view):
                raise OSError(f"short read at {off}")

    try:
        run_threads(threads, work)
    finally:
        os.close(fd)


def read_direct(path, size, threads, block):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    counter, lock = [0], threading.Lock()

    def work():
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        while (off := take(counter, lock, block, size)) is not None:
            os.preadv(fd, [buf], off)

    try:
        run_threads(threads, work)
    finally:
        os.close(fd)


READERS = {
    "buffered": read_buffered,
    "populate": read_populate,
    "random": read_random,
    "direct": read_direct,
}

REREAD = r"""
import os, sys, threading, time
path, threads, piece = sys.argv[1], 8, 16 << 20
fd = os.open(path, os.O_RDONLY); size = os.fstat(fd).st_size
counter, lock = [0], threading.Lock()
def work():
    buf = bytearray(piece)
    while True:
        with lock:
            off = counter[0]; counter[0] += piece
        if off >= size: return
        os.preadv(fd, [memoryview(buf)[:min(piece, size - off)]], off)
t = time.perf_counter()
ts = [threading.Thread(target=work) for _ in range(threads)]
[x.start() for x in ts]; [x.join() for x in ts]
print(size / (time.perf_counter() - t) / 2**30)
"""


def file_huge_kib():
    for line in read_text("/proc/meminfo").splitlines():
        if line.startswith("FileHugePages:"):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="buffered:2:16M,populate:4:2M,populate:8:2M,direct:16:512K")
    ap.add_argument(
        "--gpu-again", metavar="FERRIO", help="also time `FERRIO read --gpu 0 FILE` after each"
    )
    args = ap.parse_args()
    size = os.path.getsize(args.path)
    disk = disk_of(args.path)
    q = f"/sys/block/{disk}/queue"
    knobs = {
        k: read_text(f"{q}/{k}").strip()
        for k in (
            "max_sectors_kb",
            "max_segments",
            "max_segment_size",
            "read_ahead_kb",
            "nr_requests",
            "scheduler",
            "rotational",
        )
        if os.path.exists(f"{q}/{k}")
    }
    print(f"# {args.path}: {size / 2**30:.2f} GiB on {disk} {knobs}", flush=True)
    shapes = []
    for text in args.shapes.split(","):
        kind, threads, piece = text.split(":")
        shapes.append((text, READERS[kind], int(threads), size_arg(piece)))
    results = {text: [] for text, *_ in shapes}
    for r in range(args.rounds):
        order = shapes if r % 2 == 0 else shapes[::-1]
        for text, reader, threads, piece in order:
            drop_caches()
            huge0 = file_huge_kib()
            before = diskstats(disk)
            t = time.perf_counter()
            reader(args.path, size, threads, piece)
            seconds = time.perf_counter() - t
            disk_seen = disk_summary(before, diskstats(disk))
            huge = (file_huge_kib() - huge0) * 1024 / size
            again = float(
                subprocess.run(
                    [sys.executable, "-c", REREAD, args.path],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            row = {"gib_s": size / seconds / 2**30, "again": again, "huge": huge, **disk_seen}
            if args.gpu_again:
                out = subprocess.run(
                    [args.gpu_again, "read", "--gpu", "0", "--json", args.path],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                row["gpu_again"] = json.loads(out)["gib_per_s"]
            results[text].append(row)
            print(
                f"# round {r} {text}: {row['gib_s']:.2f} GiB/s, {disk_seen}, "
                f"huge folios {huge:.0%}, read again {again:.2f} GiB/s"
                + (f", into the GPU {row['gpu_again']:.2f}" if args.gpu_again else ""),
                flush=True,
            )
    gpu_head = f" {'GPU':>6}" if args.gpu_again else ""
    print(f"{'shape':24} {'GiB/s':>6} {'again':>6}{gpu_head} {'huge':>5}  disk (medians)")
    for text, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        spread = ", ".join(f"{r['gib_s']:.2f}" for r in rows)
        print(
            f"{text:24} {med['gib_s']:6.2f} {med['again']:6.2f}"
            + (f" {med['gpu_again']:6.2f}" if args.gpu_again else "")
            + f" {med['huge']:5.0%}  "
            f"{med['request_kib']:.0f} KiB requests, {med['in_flight']:.1f} in flight, "
            f"{med['ms_each']:.2f} ms each  (rounds {spread})"
        )


if __name__ == "__main__":
    main()
