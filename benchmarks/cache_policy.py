#!/usr/bin/env python3
"""The cache policy's targets (issue 15), measured in one run. Needs root (drop_caches, cgroups).

1. First read of a cold file with defaults, against fio io_uring O_DIRECT in the issue's two
   shapes (bs 1 MiB iodepth 32, bs 16 MiB iodepth 8), and also bs 512 KiB iodepth 16, which
   some virtual disks serve fastest: `ferrio read` (host memory, a new process), a
   Python `ferrio.open(F).read(numpy array)` and, with --gpu, the same into a CuPy array.
2. Second read of the file in a NEW process with defaults (after a first read with defaults),
   against ferrio on a page-cache-warm file (warmed with dd) and numpy.fromfile (new process).
3. A file larger than memory read with defaults leaves a previously hot file resident: both run
   in a memory cgroup whose limit is smaller than the big file (the hot file is read in it first,
   so its pages are charged to it); residency measured with `ferrio.residency`. `cache=keep` runs
   as the control that evicts.

Contenders alternate every round; medians; CPU seconds per GiB from the children's rusage.

    sudo python3 benchmarks/cache_policy.py --dir /var/tmp --size-gib 2 --rounds 5 [--gpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

GIB = 1 << 30


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(path: str) -> None:
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    """Runs cmd; returns its stdout and the CPU seconds it used."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd}: {p.stderr.strip()}")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return p.stdout, cpu


def make_file(path: str, size: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    with open(path, "wb") as f:
        left = size
        chunk = os.urandom(64 << 20)
        while left:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
    os.sync()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp", help="a directory on the disk to measure")
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--ferrio", default=os.environ.get("FERRIO_BENCH_BIN", "ferrio"), help="the CLI"
    )
    ap.add_argument("--gpu", action="store_true", help="also read into GPU memory (CuPy)")
    ap.add_argument("--skip-cgroup", action="store_true")
    a = ap.parse_args()
    for tool in ("fio", a.ferrio):
        if shutil.which(tool) is None:
            sys.exit(f"cache_policy.py: {tool} not found (PATH=.carry/bin:$PATH has a static fio)")

    size = int(a.size_gib * GIB)
    path = os.path.join(a.dir, "ferrio-cache-policy.bin")
    make_file(path, size)
    gib = size / GIB
    py = sys.executable

    def fio(bs: str, depth: int) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            out, cpu = timed(
                [
                    "fio",
                    "--name=r",
                    f"--filename={path}",
                    "--rw=read",
                    "--ioengine=io_uring",
                    "--direct=1",
                    f"--bs={bs}",
                    f"--iodepth={depth}",
                    f"--size={size}",
                    "--output-format=json",
                ]
            )
            bw = sum(j["read"]["bw_bytes"] for j in json.loads(out)["jobs"]) / GIB
            return bw, cpu / gib

        return run

    def cli(*flags: str) -> Callable[[], tuple[float, float]]:
        def run() -> tuple[float, float]:
            out, cpu = timed([a.ferrio, "read", "--json", *flags, path])
            return json.loads(out)["gib_per_s"], cpu / gib

        return run

    # A fresh process per read, as a user's would be; the destination is touched before the
    # clock starts (the VM backs fresh memory lazily); the open is timed, the import is not.
    py_read = (
        "import sys,time,os;t0=time.perf_counter();import ferrio,numpy as np;"
        "p=sys.argv[1];n=os.path.getsize(p);{alloc};t=time.perf_counter();"
        "f=ferrio.open(p);m=f.read(a);{sync}dt=time.perf_counter()-t;assert m==n;print(n/2**30/dt)"
    )
    host_alloc = "a=np.empty(n,np.uint8);a[::4096]=1"
    gpu_alloc = "import cupy as cp;a=cp.empty(n,cp.uint8);cp.cuda.runtime.deviceSynchronize()"

    def pyread(gpu: bool) -> Callable[[], tuple[float, float]]:
        code = py_read.format(
            alloc=gpu_alloc if gpu else host_alloc,
            sync="cp.cuda.runtime.deviceSynchronize();" if gpu else "",
        )

        def run() -> tuple[float, float]:
            out, cpu = timed([py, "-c", code, path])
            return float(out.strip().splitlines()[-1]), cpu / gib

        return run

    def fromfile() -> tuple[float, float]:
        code = (
            "import sys,time,numpy as np;t=time.perf_counter();"
            "a=np.fromfile(sys.argv[1],dtype=np.uint8);print(a.size/2**30/(time.perf_counter()-t))"
        )
        out, cpu = timed([py, "-c", code, path])
        return float(out), cpu / gib

    results: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, r: tuple[float, float]) -> None:
        results.setdefault(name, []).append(r)
        # As it happens, so that a run cut short still tells something.
        print(f"# {name}: {r[0]:.2f} GiB/s, {r[1]:.2f} CPU s/GiB", file=sys.stderr, flush=True)

    cold: dict[str, Callable[[], tuple[float, float]]] = {
        "fio io_uring O_DIRECT bs 1 MiB iodepth 32": fio("1M", 32),
        "fio io_uring O_DIRECT bs 16 MiB iodepth 8": fio("16M", 8),
        # Not one of the two shapes: few small requests in order, which some virtual
        # disks serve fastest (benchmarks/RESULTS.md, Checkpoints, session 13).
        "fio io_uring O_DIRECT bs 512 KiB iodepth 16": fio("512K", 16),
        "ferrio read (CLI, defaults)": cli(),
        "ferrio read (CLI, cache=bypass)": cli("--cache", "bypass"),
        "ferrio.open().read(numpy), defaults": pyread(False),
    }
    if a.gpu:
        cold["ferrio.open().read(cupy), defaults"] = pyread(True)
    second: dict[str, Callable[[], tuple[float, float]]] = {
        "ferrio read (CLI), 2nd read in a new process": cli(),
        "ferrio.open().read(numpy), 2nd read in a new process": pyread(False),
    }
    if a.gpu:
        second["ferrio.open().read(cupy), 2nd read in a new process"] = pyread(True)
    warm_runs: dict[str, Callable[[], tuple[float, float]]] = {
        "ferrio read (CLI), page-cache-warm (dd)": cli(),
        "ferrio.open().read(numpy), page-cache-warm (dd)": pyread(False),
        "numpy.fromfile, page-cache-warm (dd)": fromfile,
    }
    if a.gpu:
        warm_runs["ferrio.open().read(cupy), page-cache-warm (dd)"] = pyread(True)

    for r in range(a.rounds):
        order = list(cold) if r % 2 == 0 else list(reversed(cold))
        for name in order:
            drop_caches()
            record(name, cold[name]())
        # Second read: a first read with defaults, then the measured one in a new process.
        for name in list(second) if r % 2 == 0 else list(reversed(second)):
            drop_caches()
            cli()()
            record(name, second[name]())
        warm(path)
        for name in list(warm_runs) if r % 2 == 0 else list(reversed(warm_runs)):
            record(name, warm_runs[name]())
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    med = {
        k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for k, v in results.items()
    }
    print(f"\n{path}: {gib:.2f} GiB, {a.rounds} rounds, medians (load {os.getloadavg()[0]:.2f})")
    print("| what | GiB/s | CPU s/GiB | all rounds |\n|---|---|---|---|")
    for k, (bw, cpu) in med.items():
        allr = ", ".join(f"{x[0]:.2f}" for x in results[k])
        print(f"| {k} | {bw:.2f} | {cpu:.2f} | {allr} |")
    fio_best = max(
        med["fio io_uring O_DIRECT bs 1 MiB iodepth 32"][0],
        med["fio io_uring O_DIRECT bs 16 MiB iodepth 8"][0],
    )
    fio_any = max(v[0] for k, v in med.items() if k.startswith("fio"))
    print()
    for k in cold:
        if k.startswith("ferrio"):
            print(f"- cold {k} / best fio O_DIRECT: {med[k][0] / fio_best:.2f}x (target >= 0.95x)"
                  f"; / best of all fio shapes: {med[k][0] / fio_any:.2f}x")  # fmt: skip
    pairs = [
        ("ferrio read (CLI), 2nd read in a new process", "ferrio read (CLI), page-cache-warm (dd)"),
        (
            "ferrio.open().read(numpy), 2nd read in a new process",
            "ferrio.open().read(numpy), page-cache-warm (dd)",
        ),
    ]
    if a.gpu:
        pairs.append(
            (
                "ferrio.open().read(cupy), 2nd read in a new process",
                "ferrio.open().read(cupy), page-cache-warm (dd)",
            )
        )
    for s, w in pairs:
        print(f"- {s} / warm: {med[s][0] / med[w][0]:.2f}x (target >= 0.8x)")
    nf = med["numpy.fromfile, page-cache-warm (dd)"][0]
    s = "ferrio.open().read(numpy), 2nd read in a new process"
    print(f"- {s} / numpy.fromfile warm: {med[s][0] / nf:.2f}x (target >= 1.5x on the dev VM)")

    if not a.skip_cgroup:
        cgroup_check(a, path, size)
    return 0


def cgroup_check(a: argparse.Namespace, big: str, size: int) -> None:
    """Target 3: a read larger than the cgroup's memory, with defaults, leaves a hot file hot."""
    hot = os.path.join(a.dir, "ferrio-cache-policy-hot.bin")
    hot_size = min(GIB, size // 2)
    make_file(hot, hot_size)
    limit = hot_size + size // 2  # room for the hot file, not for the big one
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    cg = "/sys/fs/cgroup/ferrio-cache-policy" if v2 else "/sys/fs/cgroup/memory/ferrio-cache-policy"
    os.makedirs(cg, exist_ok=True)
    try:
        with open(os.path.join(cg, "memory.max" if v2 else "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit))
        code = (
            "import ferrio,numpy as np,sys,os\n"
            "hot,big,mode=sys.argv[1:4]\n"
            "np.fromfile(hot,dtype=np.uint8)\n"
            "before=ferrio.residency(hot).share\n"
            "f=ferrio.open(big,cache=mode) if mode!='default' else ferrio.open(big)\n"
            "a=np.empty(64<<20,np.uint8)\n"
            "for off in range(0,os.path.getsize(big),a.size): f.read(a,offset=off)\n"
            "print(before,ferrio.residency(hot).share,ferrio.residency(big).share)\n"
        )
        print(
            f"\nlarger than memory: cgroup limit {limit / GIB:.2f} GiB, hot file "
            f"{hot_size / GIB:.2f} GiB read first, then {size / GIB:.2f} GiB streamed "
            "in 64 MiB reads"
        )
        print(
            "| cache | hot file resident before | after | big file resident after |\n"
            "|---|---|---|---|"
        )
        for mode in ["default", "keep"]:
            drop_caches()
            shell = f'echo $$ > {cg}/cgroup.procs && exec {sys.executable} -c "$0" "$@"'
            out = subprocess.run(
                ["sh", "-c", shell, code, hot, big, mode],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            before, after, bigres = (float(x) for x in out[-3:])
            print(f"| {mode} | {before:.1%} | {after:.1%} | {bigres:.1%} |")
        print("- target: with defaults >= 80% of the hot file stays resident")
    finally:
        time.sleep(0.2)
        try:
            os.rmdir(cg)
        except OSError as e:
            print(f"(could not remove {cg}: {e})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
