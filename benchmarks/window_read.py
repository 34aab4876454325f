"""Cold reads of one file in the shapes that issue 16's disks tell apart (benchmarks/RESULTS.md,
Checkpoints, session 23 run 4): `ferrio read --cache bypass` with tasks of several sizes (tasks go
to the pool's threads in file order, so 16 threads of 512 KiB tasks keep 16 requests in flight
inside an 8 MiB window, as fastsafetensors does), ferrio's defaults with fill tasks of several
sizes (`fill_task_size`, `fill_in_flight`), and fio's best shapes of that run. Alternates them,
dropping the page cache before each (root), and prints GiB/s and what the disk saw, per read
and as medians.

    sudo python3 benchmarks/window_read.py FILE --ferrio target/release/ferrio --fio fio \\
        --tasks 512KiB,512KiB/32,4MiB,fill:2MiB/16 --rounds 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

from checkpoint_compare import FIO_SHAPES, disk_counters, disk_shape, drop_caches, run_fio

FIO_BEST = ["fio O_DIRECT bs 512 KiB, 16 jobs interleaved", "fio O_DIRECT bs 16 MiB iodepth 16"]


def ferrio_read(ferrio: str, path: str, args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run([ferrio, "read", "--json", *args, path], capture_output=True, text=True,
                         env={**os.environ, **env})  # fmt: skip
    if out.returncode != 0:
        return {"error": out.stderr.strip()}
    return {"gib_per_s": json.loads(out.stdout)["gib_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--ferrio", default="ferrio")
    ap.add_argument("--fio", help="a fio binary: adds fio's best shapes of session 23")
    ap.add_argument("--tasks", default="512KiB,1MiB,4MiB",
                    help="task sizes for --cache bypass, each SIZE or SIZE/THREADS")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    # (name, ferrio read's arguments and environment, or None for a fio shape)
    Shape = tuple[str, tuple[list[str], dict[str, str]] | None]
    shapes: list[Shape] = [("ferrio read, defaults", ([], {}))]
    for spec in a.tasks.split(","):
        fill = spec.startswith("fill:")
        size, _, count = spec.removeprefix("fill:").partition("/")
        if fill:
            env = {"FERRIO_FILL_TASK_SIZE": size, "FERRIO_FILL_IN_FLIGHT": count or "4"}
            shapes.append((f"ferrio read, fill tasks of {size}, {env['FERRIO_FILL_IN_FLIGHT']} "
                           "in flight", ([], env)))  # fmt: skip
            continue
        args = ["--cache", "bypass", "--task-size", size]
        args += ["--threads", count] if count else []
        shapes.append((f"ferrio read {' '.join(args)}", (args, {})))
    if a.fio:
        shapes += [(name, None) for name in FIO_BEST if name in FIO_SHAPES]
    rows: dict[str, list[dict]] = {name: [] for name, _ in shapes}
    size_gib = os.path.getsize(a.file) / (1 << 30)
    for r in range(a.rounds):
        order = shapes[r % len(shapes) :] + shapes[: r % len(shapes)]
        for name, how in order:
            if not drop_caches():
                raise SystemExit("cannot drop the page cache: run as root")
            before = disk_counters(a.file)
            if how is None:
                got = run_fio(a.fio, name, [a.file])
                got = {"gib_per_s": size_gib / got["seconds"]} if "seconds" in got else got
            else:
                got = ferrio_read(a.ferrio, a.file, *how)
            got["disk"] = disk_shape(before, disk_counters(a.file))
            rows[name].append(got)
            print(f"# round {r + 1}: {name}: {got}", flush=True)
    for name, got in rows.items():
        rates = [g["gib_per_s"] for g in got if "gib_per_s" in g]
        if not rates:
            print(f"{name}: failed: {got[0].get('error')}")
            continue
        disks = [g["disk"] for g in got if g.get("disk")]
        disk = {k: statistics.median(d[k] for d in disks) for k in disks[0]} if disks else {}
        print(f"{name}: median {statistics.median(rates):.2f} GiB/s "
              f"({', '.join(f'{x:.2f}' for x in rates)}); disk {disk}")  # fmt: skip


if __name__ == "__main__":
    main()
