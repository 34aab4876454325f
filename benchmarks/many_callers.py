"""Many callers, one small read each: T threads take the next piece of a file from one shared
counter and read it with one `pread` (the way a data loader or a columnar reader issues column
chunks), into one host buffer (or GPU buffer with --gpu). Each client runs in a fresh process,
alternating, with the page cache warm (read before) or dropped (--cold, root). Prints GiB/s per
run and medians.

Clients: `ferrio` (`File.pread(...).result()` per piece), `python` (`os.preadv` into the same
buffer, threads doing the I/O themselves; host only), `ferrio@PATH` (another build of ferrio,
its package directory's parent put first on `sys.path`), `kvikio` (`CuFile.pread` per piece;
with --gpu, where installed; `kvikio@NTHREADS=16` sets `KVIKIO_NTHREADS`).

    python3 benchmarks/many_callers.py FILE --threads 16 --piece 512KiB --rounds 3 [--cold] [--gpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from checkpoint_compare import drop_caches
from numpy_compare import parse_size

GIB = 1 << 30

CHILD = r"""
import itertools, json, os, sys, time
client, path = sys.argv[1], sys.argv[2]
threads, piece, gpu = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
if client.startswith("ferrio@"):
    sys.path.insert(0, client.split("@", 1)[1])
    client = "ferrio"
size = os.path.getsize(path)
if gpu:
    import cupy as cp
    buf = cp.empty(size, dtype=cp.uint8)
    cp.cuda.runtime.deviceSynchronize()
else:
    import numpy as np
    buf = np.empty(size, dtype=np.uint8)
    buf[::4096] = 0  # touched, as a reused buffer is: the rows measure the reads
if client == "ferrio":
    import ferrio
    f = ferrio.open(path)
    def read(at):
        f.pread(buf[at:at + piece], offset=at).result()
elif client == "python":
    fd = os.open(path, os.O_RDONLY)
    view = memoryview(buf)
    def read(at):
        os.preadv(fd, [view[at:at + piece]], at)
elif client == "kvikio":
    import kvikio
    f = kvikio.CuFile(path, "r")
    def read(at):
        f.pread(buf[at:at + piece], file_offset=at).get()
else:
    raise SystemExit(f"unknown client {client}")
sys.path.append(os.environ["BENCHMARKS_DIR"])
from fill_shapes import run_threads  # a failed read in any thread fails the run
offsets = itertools.count(0, piece)
def work():
    while (at := next(offsets)) < size:
        read(at)
start = time.perf_counter()
run_threads(threads, work)
if gpu:
    cp.cuda.runtime.deviceSynchronize()
seconds = time.perf_counter() - start
with open(path, "rb") as src:  # every byte checked, 64 MiB at a time
    at = 0
    while want := src.read(64 << 20):
        got = bytes(buf[at:at + len(want)].get() if gpu else buf[at:at + len(want)])
        assert got == want, f"wrong bytes in the 64 MiB at {at}"
        at += len(want)
print(json.dumps({"seconds": seconds}))
"""


def run(client: str, path: str, threads: int, piece: int, gpu: bool) -> float | None:
    # The child finds the benchmarks' shared helpers (fill_shapes.run_threads) here.
    env = dict(os.environ, BENCHMARKS_DIR=os.path.dirname(os.path.abspath(__file__)))
    name = client
    if client.startswith("kvikio@"):  # "kvikio@NTHREADS=16": KvikIO's KVIKIO_NTHREADS
        name, _, setting = client.partition("@")
        key, _, value = setting.partition("=")
        env["KVIKIO_" + key.upper()] = value
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, path, str(threads), str(piece), "1" if gpu else "0"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"# {client}: {(out.stderr.strip().splitlines() or ['no output'])[-1]}")
        return None
    return json.loads(lines[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("file")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--piece", type=parse_size, default="512KiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", default="ferrio,python")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each run")
    ap.add_argument("--gpu", action="store_true", help="into GPU memory (CuPy)")
    args = ap.parse_args()
    piece = args.piece
    size = os.path.getsize(args.file)
    clients = args.clients.split(",")
    rates: dict[str, list[float]] = {c: [] for c in clients}
    for r in range(args.rounds):
        for client in clients[r % len(clients) :] + clients[: r % len(clients)]:
            if args.cold:
                if not drop_caches():
                    raise SystemExit("--cold needs root (/proc/sys/vm/drop_caches)")
            else:
                with open(args.file, "rb") as f:
                    while f.read(16 << 20):
                        pass
            secs = run(client, args.file, args.threads, piece, args.gpu)
            if secs is not None:
                rates[client].append(size / secs / GIB)
                print(f"# round {r} {client}: {rates[client][-1]:.2f} GiB/s", flush=True)
    where = "GPU" if args.gpu else "host"
    cache = "cold" if args.cold else "warm"
    print(f"{size / GIB:.2f} GiB, {args.threads} threads x {piece >> 10} KiB preads into {where} "
          f"memory, {cache}, medians of {args.rounds}:")  # fmt: skip
    for client, got in rates.items():
        if got:
            rounds = ", ".join(f"{x:.2f}" for x in got)
            print(f"  {client:<30} {statistics.median(got):7.2f} GiB/s  ({rounds})")


if __name__ == "__main__":
    main()
