"""`fill_reads` A/B: how a cold read fills the page cache, and how fast the file reads again.

For each mode (``FERRIO_FILL_READS``), alternating every round, in fresh processes, with the
page cache dropped before each cold read (and ``--pause`` seconds after the drop, so that a VM
whose balloon reports free pages to its hypervisor has handed the freed memory back):

- ``cold CLI``: ``ferrio read`` of the cold file (it fills the page cache, ``cache=auto``);
- ``2nd py``: then ``ferrio.open(F).read(a)`` into a numpy array touched before the clock;
- ``3rd CLI``: then ``ferrio read`` again;
- ``cold py``: caches dropped, the Python read of the cold file;
- ``2nd CLI``: then ``ferrio read``.

GiB/s and CPU seconds per GiB (the child's rusage, the Python child's import and array touch
included), medians and every round. Needs root (drop_caches).

    sudo python3 benchmarks/fill_reads_compare.py --file /var/tmp/pol/f2 --rounds 6 [--pause 6]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PY_READ = (
    "import sys,time,os;import ferrio,numpy as np;p=sys.argv[1];n=os.path.getsize(p);"
    "a=np.empty(n,np.uint8);a[::4096]=1;t=time.perf_counter();f=ferrio.open(p);m=f.read(a);"
    "dt=time.perf_counter()-t;assert m==n;print(n/2**30/dt)"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", required=True, help="an existing file to read (a few GiB)")
    ap.add_argument("--ferrio", default="target/release/ferrio", help="the CLI to run")
    ap.add_argument("--modes", default="readahead,populate", help="FERRIO_FILL_READS values")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds after each cache drop")
    a = ap.parse_args()
    gib = os.path.getsize(a.file) / 2**30

    def drop() -> None:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        time.sleep(a.pause)

    def run(cmd: list[str], env: dict[str, str]) -> tuple[str, float]:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        return out, cpu / gib

    def cli(env: dict[str, str]) -> tuple[float, float]:
        out, cpu = run([a.ferrio, "read", "--json", a.file], env)
        return json.loads(out)["gib_per_s"], cpu

    def py(env: dict[str, str]) -> tuple[float, float]:
        out, cpu = run([sys.executable, "-c", PY_READ, a.file], env)
        return float(out.strip().splitlines()[-1]), cpu

    results: dict[str, list[tuple[float, float]]] = {}

    def record(name: str, r: tuple[float, float]) -> None:
        results.setdefault(name, []).append(r)
        print(f"# {name}: {r[0]:.2f} GiB/s, {r[1]:.2f} CPU-s/GiB", file=sys.stderr, flush=True)

    modes = a.modes.split(",")
    for r in range(a.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            env = dict(os.environ, FERRIO_FILL_READS=mode)
            drop()
            record(f"{mode}: cold CLI", cli(env))
            record(f"{mode}: 2nd py", py(env))
            record(f"{mode}: 3rd CLI", cli(env))
            drop()
            record(f"{mode}: cold py", py(env))
            record(f"{mode}: 2nd CLI", cli(env))
    print(f"{a.file}: {gib:.2f} GiB, {a.rounds} rounds, pause {a.pause} s after each drop")
    print("| what | GiB/s | CPU-s/GiB | rounds |\n|---|---|---|---|")
    for name in sorted(results):
        v = results[name]
        rounds = ", ".join(f"{x[0]:.2f}" for x in v)
        rate = statistics.median(x[0] for x in v)
        cpu = statistics.median(x[1] for x in v)
        print(f"| {name} | {rate:.2f} | {cpu:.2f} | {rounds} |")


if __name__ == "__main__":
    main()
