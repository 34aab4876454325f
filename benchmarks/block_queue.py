"""fastsafetensors' read shape on a cold file: threads take the next block from one queue and
read it with O_DIRECT, each read the block plus `--overlap` bytes of the next (fastsafetensors
0.5.0 reads 512 KiB blocks with a 4 KiB overlap from 16 threads; benchmarks/RESULTS.md,
Checkpoints, session 22). Alternates the shapes given, dropping the page cache before each
read (root), and prints GiB/s per read and the medians.

    sudo python3 benchmarks/block_queue.py FILE --shapes 512+0,512+4096,4096+0 --rounds 3
"""

import argparse
import mmap
import os
import statistics
import threading
import time

from checkpoint_compare import drop_caches

GIB = 1 << 30
PAGE = 4096


def read_once(path: str, block: int, overlap: int, threads: int) -> float:
    """One cold read of `path` in `block`-byte blocks (+ `overlap`); returns GiB/s."""
    size = os.stat(path).st_size
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    lock = threading.Lock()
    next_block = [0]

    def work() -> None:
        buf = mmap.mmap(-1, block + overlap)  # page-aligned, as O_DIRECT wants
        while True:
            with lock:
                off = next_block[0]
                next_block[0] += block
            if off >= size:
                return
            want = -(-min(block + overlap, size - off) // PAGE) * PAGE
            os.preadv(fd, [memoryview(buf)[:want]], off)

    try:
        start = time.perf_counter()
        pool = [threading.Thread(target=work) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return size / GIB / (time.perf_counter() - start)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--shapes", default="512+0,512+4096", help="BLOCK_KIB+OVERLAP_BYTES,...")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("+")) for s in a.shapes.split(",")]
    rates: dict[tuple[int, ...], list[float]] = {s: [] for s in shapes}
    for r in range(a.rounds):
        for kib, overlap in shapes if r % 2 == 0 else reversed(shapes):
            if not drop_caches():
                raise SystemExit("cannot drop the page cache: run as root")
            rate = read_once(a.file, kib << 10, overlap, a.threads)
            rates[(kib, overlap)].append(rate)
            print(f"round {r + 1}: {kib} KiB + {overlap} B: {rate:.2f} GiB/s", flush=True)
    for (kib, overlap), got in rates.items():
        rounds = ", ".join(f"{x:.2f}" for x in got)
        print(f"{kib} KiB + {overlap} B: median {statistics.median(got):.2f} GiB/s ({rounds})")


if __name__ == "__main__":
    main()
