#!/usr/bin/env python3
"""Several GPUs of one host fed at once (issue 18): page-cache-warm file -> GPU, aggregate GiB/s.

Every row runs in fresh processes (set-up included) that get ready, then start together on a
signal from this script; a row's aggregate is all bytes moved over the time from the first start
to the last finish. Rows, each round (rounds alternate, medians reported):

- `host read N threads`: N threads reading the file into reused 4 MiB host buffers, no GPU
  (what the page cache gives);
- `pinned gpuN`: pinned host -> device copies (torch, 1 GiB pinned buffer) on one GPU alone,
  the same byte count as the file; their sum over the GPUs is the yardstick;
- `pinned all`: the same on every GPU at once, one process per GPU (what the host allows);
- `pageable gpu0, 16 threads`: copies from ordinary memory, which the driver stages through
  pinned buffers made with the context (a first call with no pinning of its own);
- `ferrio gpuN`: one process reading the file into GPU N alone (first call, set-up included);
- `ferrio per-gpu`: one process per GPU, each reading the same file into its GPU at once
  (the usual server start);
- `ferrio one-process`: one process reading a file of its own into every GPU at once (one
  `pread` per GPU, futures; a loader feeding each GPU its own data).
A ferrio row's `2nd` is a second read in the same processes, started together again;
`[variant]` rows run with extra `FERRIO_*` settings (`--variants`). Every ferrio read is checked
against its file at 64 random 4 KiB windows.

    python3 benchmarks/multi_gpu.py [--size-gib 8] [--rounds 3] [--gpus N]
        [--variants 'small=FERRIO_BOUNCE_BUFFER_SIZE=1MiB,FERRIO_BOUNCE_BUFFERS=4;...']
        [--host-threads 16,32] [--json OUT]
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
mode, gpus = sys.argv[1], [int(g) for g in sys.argv[3].split(",")]
paths = sys.argv[2].split(",")
paths = paths * len(gpus) if len(paths) == 1 else paths   # one file for all, or one per GPU
size = os.path.getsize(paths[0])
for g in gpus:
    torch.zeros(1, device=f"cuda:{g}"); torch.cuda.synchronize(g)   # contexts are not timed
bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus]
for g in gpus:
    torch.cuda.synchronize(g)

def sync():
    for g in gpus:
        torch.cuda.synchronize(g)

def check(buf, path):
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
elif mode == "pageable":
    # 16 threads copying from ordinary (pageable) memory: the driver stages the bytes through
    # pinned buffers of its own, made with the context, so no pinning is on this clock.
    import threading
    piece = 64 << 20
    hosts = [torch.full((piece,), 7, dtype=torch.uint8) for _ in range(16)]
    def once():
        def work(i):
            for buf in bufs:
                with torch.cuda.device(buf.device):
                    for at in range(i * piece, size, 16 * piece):
                        n = min(piece, size - at)
                        buf[at:at + n].copy_(hosts[i][:n])
        ts = [threading.Thread(target=work, args=(i,)) for i in range(16)]
        for t in ts: t.start()
        for t in ts: t.join()
        sync()
    rounds = 2
else:
    import ferrio
    files = [ferrio.open(p) for p in paths]
    def once():
        futs = [f.pread(buf) for f, buf in zip(files, bufs)]
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
if mode == "ferrio":
    for buf, p in zip(bufs, paths):
        check(buf, p)
print(json.dumps({"at": out, "bytes": size * len(gpus)}), flush=True)
"""


def run_together(
    mode: str, path: str, groups: list[list[int]], env_extra: dict[str, str] | None = None
) -> list[float]:
    """Starts one child per GPU group, starts them together, returns aggregate GiB/s per round.

    `path` is one file for every GPU or a comma-separated file per GPU of the group."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
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


HOST_READ = r"""
import os, sys, threading, time
path, threads = sys.argv[1], int(sys.argv[2])
size = os.path.getsize(path)
fd = os.open(path, os.O_RDONLY)
step = 4 << 20
def work(i):
    buf = bytearray(step)   # reused: a cache-sized target, as a bounce buffer is
    for off in range(i * step, size, threads * step):
        os.preadv(fd, [buf], off)
ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
t0 = time.monotonic()
for t in ts: t.start()
for t in ts: t.join()
print(size / (time.monotonic() - t0) / (1 << 30))
"""


def host_read(path: str, threads: int) -> float:
    """GiB/s of `threads` threads reading the warm file into reused 4 MiB buffers (no GPU)."""
    out = subprocess.run(
        [sys.executable, "-c", HOST_READ, path, str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout)


def parse_variants(spec: str) -> dict[str, dict[str, str]]:
    """`name=VAR=V,VAR=V;name2=...` -> {name: {VAR: V}}; `default` (no variables) always first."""
    out: dict[str, dict[str, str]] = {"default": {}}
    for part in filter(None, spec.split(";")):
        name, _, rest = part.partition("=")
        out[name] = dict(kv.split("=", 1) for kv in filter(None, rest.split(",")))
    return out


def make_file(size: int, seed: int) -> str:
    fd, path = tempfile.mkstemp(prefix="ferrio-multigpu-", dir=os.environ.get("TMPDIR"))
    block = bytearray(os.urandom(1 << 24))
    with os.fdopen(fd, "wb") as f:
        for i in range(0, size, len(block)):
            block[:16] = i.to_bytes(8, "little") + seed.to_bytes(8, "little")  # no two alike
            f.write(block[: size - i])
    return path


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
    ap.add_argument(
        "--variants",
        default="",
        help="extra ferrio settings to compare: 'name=FERRIO_X=V,FERRIO_Y=W;name2=...'",
    )
    ap.add_argument(
        "--host-threads", default="16,32", help="thread counts of the host-read rows ('' for none)"
    )
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    n = a.gpus or gpu_count()
    gpus = list(range(n))
    variants = parse_variants(a.variants)
    size = int(a.size_gib * (1 << 30))
    # One file every process reads (the same checkpoint on every GPU), and one more per GPU for
    # the one-process row (a loader feeding each GPU its own data).
    files = [make_file(size, seed) for seed in range(n)]
    try:
        for p in files:  # page cache warm
            with open(p, "rb") as f:
                while f.read(1 << 26):
                    pass
        rows: dict[str, list[float]] = {}

        def add(name: str, rates: list[float]) -> None:
            rows.setdefault(name, []).append(rates[0])
            if len(rates) > 1:
                rows.setdefault(name + " 2nd", []).append(rates[1])

        for _ in range(a.rounds):
            for t in filter(None, a.host_threads.split(",")):
                add(f"host read {t} threads", [host_read(files[0], int(t))])
            for g in gpus:
                add(f"pinned gpu{g}", run_together("pinned", files[0], [[g]]))
            add("pinned all", run_together("pinned", files[0], [[g] for g in gpus]))
            add("pageable gpu0, 16 threads", run_together("pageable", files[0], [[0]]))
            for name, env in variants.items():
                tag = "" if name == "default" else f" [{name}]"
                for g in gpus if name == "default" else gpus[:1]:
                    add(f"ferrio gpu{g}{tag}", run_together("ferrio", files[0], [[g]], env))
                add(
                    f"ferrio per-gpu{tag}",
                    run_together("ferrio", files[0], [[g] for g in gpus], env),
                )
                add(
                    f"ferrio one-process{tag}",
                    run_together("ferrio", ",".join(files), [gpus], env),
                )
        med = {k: statistics.median(v) for k, v in rows.items()}
        yard = sum(med[f"pinned gpu{g}"] for g in gpus)
        print(
            f"{n} GPUs, {size / (1 << 30):.2f} GiB per file, page cache warm, "
            f"{a.rounds} rounds, medians; variants: {variants}"
        )
        print(f"{'row':<40}{'GiB/s':>9}{'x sum pinned':>14}   all rounds")
        for k, v in rows.items():
            print(
                f"{k:<40}{med[k]:>9.2f}{med[k] / yard:>14.2f}   " + " ".join(f"{x:.2f}" for x in v)
            )
        print(f"sum of pinned gpuN (yardstick): {yard:.2f} GiB/s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"gpus": n, "rows": rows, "medians": med, "yardstick": yard}, f)
    finally:
        for p in files:
            os.unlink(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
