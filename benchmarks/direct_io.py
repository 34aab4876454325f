#!/usr/bin/env python3
"""Direct-I/O policies against each other and against fio, in one run.

Reads a file (default 2 GiB) cold (its pages dropped) and hot with FERRIO_DIRECT_READ off, on,
on + over-read and auto, and fio io_uring O_DIRECT iodepth 32 bs 1 MiB cold; writes it with
FERRIO_DIRECT_WRITE off and on (synced) and fio O_DIRECT writes. Alternates every round; prints
medians, CPU-seconds per GiB and the ratios the direct-I/O issue targets.

    python3 benchmarks/direct_io.py [--size 2GiB] [--rounds 3] [--dir .] [--ferrio PATH]
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
import tempfile

GIB = 1 << 30


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_ferrio(ferrio: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Runs a ferrio command with --json; returns (GiB/s, CPU s/GiB) from its own report."""
    out = subprocess.run(
        [ferrio, *args, "--json"],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    d = json.loads(out)
    return d["bytes"] / d["seconds"] / GIB, d["cpu_seconds_per_gib"]


def run_fio(path: str, size: int, rw: str) -> tuple[float, float]:
    c0 = children_cpu()
    cmd = [
        "fio",
        "--name=direct-io",
        f"--filename={path}",
        f"--rw={rw}",
        "--bs=1M",
        "--iodepth=32",
        "--ioengine=io_uring",
        "--direct=1",
        f"--size={size}",
        "--output-format=json",
    ]
    if rw == "write":
        cmd.append("--end_fsync=1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0][rw]
    cpu = children_cpu() - c0
    return job["bw_bytes"] / GIB, cpu / (size / GIB)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=".")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument(
        "--ferrio",
        default=shutil.which("ferrio") or os.path.join(here, "..", "target", "release", "ferrio"),
    )
    args = ap.parse_args()
    if not shutil.which("fio"):
        print("direct_io: needs fio (apt-get install fio)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix=".ferrio-direct-", dir=args.dir)
    path = os.path.join(tmp, "data")
    rows: dict[str, list[tuple[float, float]]] = {}
    policies = {
        "off": {"FERRIO_DIRECT_READ": "off"},
        "on": {"FERRIO_DIRECT_READ": "on"},
        "on+overread": {"FERRIO_DIRECT_READ": "on", "FERRIO_DIRECT_OVERREAD": "on"},
        "auto": {"FERRIO_DIRECT_READ": "auto"},
    }
    try:
        size = None
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            for mode in ("off", "on"):
                s = run_ferrio(
                    args.ferrio, ["write", path, "--size", args.size], {"FERRIO_DIRECT_WRITE": mode}
                )
                rows.setdefault(f"write {mode} (synced)", []).append(s)
            size = os.path.getsize(path)
            rows.setdefault("write fio O_DIRECT", []).append(run_fio(path + ".fio", size, "write"))
            os.unlink(path + ".fio")
            for name, env in policies.items():
                rows.setdefault(f"cold read {name}", []).append(
                    run_ferrio(args.ferrio, ["read", "--cold", path], env)
                )
            rows.setdefault("cold read fio O_DIRECT", []).append(run_fio(path, size, "read"))
            run_ferrio(args.ferrio, ["read", path], {"FERRIO_DIRECT_READ": "off"})  # warm
            for name, env in policies.items():
                rows.setdefault(f"hot read {name}", []).append(
                    run_ferrio(args.ferrio, ["read", path], env)
                )
                if name in ("on", "on+overread"):  # direct reads do not fill the cache back
                    run_ferrio(args.ferrio, ["read", path], {"FERRIO_DIRECT_READ": "off"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {
        k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for k, v in rows.items()
    }
    print(f"{'':28s} {'GiB/s':>8s} {'CPU s/GiB':>10s}   ({args.rounds} rounds, {args.size})")
    for k, (g, c) in med.items():
        print(f"{k:28s} {g:8.2f} {c:10.3f}")
    ratios = {
        "auto cold / fio O_DIRECT cold (target >= 0.95)": med["cold read auto"][0]
        / med["cold read fio O_DIRECT"][0],
        "auto cold / off cold (target >= 1.5)": med["cold read auto"][0] / med["cold read off"][0],
        "auto hot / off hot (target >= 0.95)": med["hot read auto"][0] / med["hot read off"][0],
        "write on / write off": med["write on (synced)"][0] / med["write off (synced)"][0],
        "write on / fio O_DIRECT write": med["write on (synced)"][0] / med["write fio O_DIRECT"][0],
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
