#!/usr/bin/env python3
"""Is the first read of a page-cache-warm file slower than the next ones? (issue 16's warm rows)

`checkpoint_compare.py`'s first warm load after writing the checkpoint reads at ~39 GiB/s where
every later one reads at 44-46, and `fill_shapes.py`'s reads into the GPU after a Python fill ran
at 29-37. This fills the page cache with one file in several ways and then reads it into the GPU
with `ferrio read --gpu 0` (`--host`: into host memory) three times, each in a new process,
recording each rate:

- ``write``: the file written anew by ``ferrio write --cache keep`` and synced (its pages written
  through the cache, as ``safetensors``' ``save_file`` writes a checkpoint);
- ``ferrio``: caches dropped, ``ferrio read`` fills them (ferrio's own fill, `cache=auto`);
- ``dd``: caches dropped, ``dd bs=16M`` reads the file (the kernel's readahead);
- ``python``: caches dropped, 8 Python threads pread the file in 16 MiB pieces;
- ``pywrite``: the file written anew by one Python thread in 64 MiB writes and synced, then read
  once by ``dd`` (what `checkpoint_compare.py` does before its first warm load: `save_file`
  writes, its warm rows `dd` each file first).

Fills alternate round by round. Each read also records what the kernel did meanwhile
(``/proc/vmstat``: ``compact_stall``, direct compactions a process waited for;
``thp_fault_fallback``, huge pages it asked for and did not get; ``pgactivate``, pages moved to
the active list, which the second access to a page since it entered the cache does). Needs root
(drop_caches).

    python3 benchmarks/read_after_fill.py FILE --ferrio FERRIO [--size 8GiB] [--rounds 2]
        [--fills write,ferrio,dd,python,pywrite] [--host]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading

from fill_shapes import drop_caches, run_threads, take

FILLS = ["write", "ferrio", "dd", "python", "pywrite"]


def python_fill(path: str) -> None:
    """8 threads take 16 MiB pieces of the file in turn and pread them (readahead on)."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    piece = 16 << 20
    counter, lock = [0], threading.Lock()

    def work() -> None:
        buf = bytearray(piece)
        while (off := take(counter, lock, piece, size)) is not None:
            os.preadv(fd, [memoryview(buf)[: min(piece, size - off)]], off)

    try:
        run_threads(8, work)
    finally:
        os.close(fd)


def python_write(path: str, size: int) -> None:
    """The file written anew in 64 MiB writes by one thread, synced, then read once by dd."""
    block = os.urandom(64 << 20)
    with open(path, "wb") as f:
        left = size
        while left:
            left -= f.write(block[: min(left, len(block))])
    os.sync()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "status=none"], check=True)


def fill(how: str, path: str, ferrio: str, size: str) -> None:
    if how == "pywrite":
        python_write(path, os.path.getsize(path))
    elif how == "write":
        subprocess.run(
            [ferrio, "write", "--cache", "keep", path, "--size", size],
            check=True,
            capture_output=True,
        )
        os.sync()
    else:
        drop_caches()
        if how == "ferrio":
            subprocess.run([ferrio, "read", path], check=True, capture_output=True)
        elif how == "dd":
            subprocess.run(
                ["dd", f"if={path}", "of=/dev/null", "bs=16M", "status=none"], check=True
            )
        else:
            python_fill(path)


VMSTAT = ("compact_stall", "thp_fault_fallback", "pgactivate")


def vmstat() -> dict[str, int]:
    with open("/proc/vmstat") as f:
        pairs = (line.split() for line in f)
        return {k: int(v) for k, v in pairs if k in VMSTAT}


def timed_read(path: str, ferrio: str, host: bool) -> tuple[float, dict[str, int]]:
    """`ferrio read` into GPU 0 (or host memory) in a new process: GiB/s and vmstat's deltas."""
    where = [] if host else ["--gpu", "0"]
    before = vmstat()
    out = subprocess.run(
        [ferrio, "read", *where, "--json", path], check=True, capture_output=True, text=True
    ).stdout
    after = vmstat()
    return float(json.loads(out)["gib_per_s"]), {k: after[k] - before[k] for k in before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--ferrio", required=True)
    ap.add_argument("--size", default="8GiB")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reads", type=int, default=3)
    ap.add_argument("--fills", default=",".join(FILLS), help="which fills, in order")
    ap.add_argument("--host", action="store_true", help="read into host memory, not GPU 0")
    args = ap.parse_args()
    fills = args.fills.split(",")
    if not os.path.exists(args.path):
        fill("write", args.path, args.ferrio, args.size)
    rates: dict[str, list[list[float]]] = {how: [] for how in fills}
    for r in range(args.rounds):
        for how in fills if r % 2 == 0 else fills[::-1]:
            fill(how, args.path, args.ferrio, args.size)
            reads = [timed_read(args.path, args.ferrio, args.host) for _ in range(args.reads)]
            rates[how].append([rate for rate, _ in reads])
            seen = ", ".join(f"{rate:.2f} {stats}" for rate, stats in reads)
            print(f"# round {r} {how}: {seen}", flush=True)
    print("fill     " + "  ".join(f"read {i + 1} (GiB/s)" for i in range(args.reads)))
    for how, rounds in rates.items():
        cols = [statistics.median(rr[i] for rr in rounds) for i in range(args.reads)]
        print(f"{how:8} " + "  ".join(f"{c:15.2f}" for c in cols))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
