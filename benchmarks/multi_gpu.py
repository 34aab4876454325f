#!/usr/bin/env python3
"""Several GPUs of one host fed at once (issue 18): page-cache-warm file -> GPU, aggregate GiB/s.

Every row runs in fresh processes (set-up included) that get ready, then start together on a
signal from this script; a row's aggregate is all bytes moved over the time from the first start
to the last finish. Rows, each round (rounds alternate, medians reported):

- `pinned gpuN`: pinned host -> device copies (torch, 1 GiB pinned buffer) on one GPU alone,
  the same byte count as the file; their sum over the GPUs is the yardstick;
- `pinned all`: the same on every GPU at once, one process per GPU (what the host allows);
- `ferrio gpuN`: one process reading the file into GPU N alone (first call, set-up included);
- `ferrio per-gpu`: one process per GPU, each reading the whole file into its GPU at once
  (the usual server start); `-2nd` is a second read in the same processes, started together;
- `ferrio one-process`: one process reading the file into every GPU at once (one `pread` per
  GPU, futures), and its second read.

Every ferrio read is checked against the file at 64 random 4 KiB windows.

    python3 benchmarks/multi_gpu.py [--size-gib 8] [--rounds 3] [--gpus N] [--file PATH]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, random, sys, time
import torch
mode, path, gpus = sys.argv[1], sys.argv[2], [int(g) for g in sys.argv[3].split(",")]
size = os.path.getsize(path)
for g in gpus:
    torch.zeros(1, device=f"cuda:{g}"); torch.cuda.synchronize(g)   # contexts are not timed
bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus]
for g in gpus:
    torch.cuda.synchronize(g)

def sync():
    for g in gpus:
        torch.cuda.synchronize(g)

def check(buf):
    rng = random.Random(size)
    with open(path, "rb") as f:
        for _ in range(64):
            at = rng.randrange(0, max(1, size - 4096))
            want = os.pread(f.fileno(), 4096, at)
            got = bytes(buf[at:at + len(want)].cpu().numpy())
            if got != want:
                raise SystemExit(f"wrong bytes on {buf.device} at {at}")

if mode == "pinned":
    chunk = min(size, 1 << 30)
    host = torch.empty(chunk, dtype=torch.uint8, pin_memory=True); host.fill_(7)
    def once():
        for buf in bufs:
            done = 0
            while done < size:
                n = min(chunk, size - done)
                buf[done:done + n].copy_(host[:n], non_blocking=True); done += n
        sync()
    once()   # warm-up: the row measures the link, not the first copy's set-up
    rounds = 1
else:
    import ferrio
    f = ferrio.open(path)
    def once():
        futs = [f.pread(buf) for buf in bufs]
        for fut in futs:
            assert fut.result() == size
        sync()
    rounds = 2
print("ready", flush=True)
out = []
for _ in range(rounds):
    sys.stdin.readline()
    t0 = time.monotonic(); once(); t1 = time.monotonic()
    out.append([t0, t1])
    print("done", flush=True)
if mode != "pinned":
    for buf in bufs:
        check(buf)
print(json.dumps({"at": out, "bytes": size * len(gpus)}), flush=True)
"""


def run_together(mode: str, path: str, groups: list[list[int]]) -> list[float]:
    """Starts one child per GPU group, starts them together, returns aggregate GiB/s per round."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, path, ",".join(map(str, g))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for g in groups
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{mode} {groups}: child said {line!r}")
        rounds = 1 if mode == "pinned" else 2
        for _ in range(rounds):
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                assert p.stdout is not None
                line = p.stdout.readline()
                if line.strip() != "done":
                    raise RuntimeError(f"{mode} {groups}: child said {line!r}")
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.readline()))
            if p.wait(timeout=120) != 0:
                raise RuntimeError(f"{mode} {groups}: child exited {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    total = sum(r["bytes"] for r in results)
    rates = []
    for i in range(rounds):
        start = min(r["at"][i][0] for r in results)
        end = max(r["at"][i][1] for r in results)
        rates.append(total / (end - start) / (1 << 30))
    return rates


def gpu_count() -> int:
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all)")
    ap.add_argument("--file", help="an existing file to read (default: a temp file)")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    n = a.gpus or gpu_count()
    gpus = list(range(n))
    made = None
    if a.file:
        path = a.file
    else:
        fd, made = tempfile.mkstemp(prefix="ferrio-multigpu-", dir=os.environ.get("TMPDIR"))
        path = made
        size = int(a.size_gib * (1 << 30))
        block = bytearray(os.urandom(1 << 24))
        with os.fdopen(fd, "wb") as f:
            for i in range(0, size, len(block)):
                block[:8] = i.to_bytes(8, "little")  # no two blocks alike
                f.write(block[: size - i])
    try:
        with open(path, "rb") as f:  # page cache warm
            while f.read(1 << 26):
                pass
        rows: dict[str, list[float]] = {}
        for _ in range(a.rounds):
            for g in gpus:
                rows.setdefault(f"pinned gpu{g}", []).extend(run_together("pinned", path, [[g]]))
            rows.setdefault("pinned all", []).extend(
                run_together("pinned", path, [[g] for g in gpus])
            )
            for g in gpus:
                first, second = run_together("ferrio", path, [[g]])
                rows.setdefault(f"ferrio gpu{g}", []).append(first)
                rows.setdefault(f"ferrio gpu{g}-2nd", []).append(second)
            first, second = run_together("ferrio", path, [[g] for g in gpus])
            rows.setdefault("ferrio per-gpu", []).append(first)
            rows.setdefault("ferrio per-gpu-2nd", []).append(second)
            first, second = run_together("ferrio", path, [gpus])
            rows.setdefault("ferrio one-process", []).append(first)
            rows.setdefault("ferrio one-process-2nd", []).append(second)
        med = {k: statistics.median(v) for k, v in rows.items()}
        yard = sum(med[f"pinned gpu{g}"] for g in gpus)
        print(
            f"{n} GPUs, {os.path.getsize(path) / (1 << 30):.2f} GiB file, page cache warm, "
            f"{a.rounds} rounds, medians"
        )
        print(f"{'row':<26}{'GiB/s':>9}{'x sum pinned':>14}   all rounds")
        for k, v in rows.items():
            print(
                f"{k:<26}{med[k]:>9.2f}{med[k] / yard:>14.2f}   " + " ".join(f"{x:.2f}" for x in v)
            )
        print(f"sum of pinned gpuN (yardstick): {yard:.2f} GiB/s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"gpus": n, "rows": rows, "medians": med, "yardstick": yard}, f)
    finally:
        if made:
            os.unlink(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
