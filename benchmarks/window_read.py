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


def queue_setting(path: str, name: str) -> str:
    """The sysfs file of block queue setting `name` for the disk holding `path` (a partition's
    queue is its disk's)."""
    dev = os.stat(path).st_dev
    sysdir = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not os.path.isdir(os.path.join(sysdir, "queue")):
        sysdir = os.path.dirname(sysdir)
    return os.path.join(sysdir, "queue", name)


def set_nomerges(path: str, value: str) -> str:
    """Sets the disk's `nomerges` (0: merge, 2: never merge requests); returns the old value."""
    setting = queue_setting(path, "nomerges")
    with open(setting) as f:
        old = f.read().strip()
    with open(setting, "w") as f:
        f.write(value)
    return old


def ferrio_read(ferrio: str, path: str, args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run([ferrio, "read", "--json", *args, path], capture_output=True, text=True,
                         env={**os.environ, **env})  # fmt: skip
    if out.returncode != 0:
        return {"error": out.stderr.strip()}
    return {"gib_per_s": json.loads(out.stdout)["gib_per_s"]}


# How a shape reads: `ferrio read`'s arguments and environment, or None for a fio shape.
How = tuple[list[str], dict[str, str]] | None
# A shape's name and how it reads, and whether the disk's request merging is off for it.
Run = tuple[str, How, bool]


def measure(a: argparse.Namespace, runs: list[Run]) -> dict[str, list[dict]]:
    """Each run once a round, alternating, the page cache dropped before each: name -> results."""
    label = {(name, nm): name + (", nomerges=2" if nm else "") for name, _, nm in runs}
    rows: dict[str, list[dict]] = {label[name, nm]: [] for name, _, nm in runs}
    size_gib = os.path.getsize(a.file) / (1 << 30)
    for r in range(a.rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        for name, how, nm in order:
            if a.nomerges:
                set_nomerges(a.file, "2" if nm else "0")
            if not drop_caches():
                raise SystemExit("cannot drop the page cache: run as root")
            before = disk_counters(a.file)
            if how is None:
                got = run_fio(a.fio, name, [a.file])
                got = {"gib_per_s": size_gib / got["seconds"]} if "seconds" in got else got
            else:
                got = ferrio_read(a.ferrio, a.file, *how)
            got["disk"] = disk_shape(before, disk_counters(a.file))
            rows[label[name, nm]].append(got)
            print(f"# round {r + 1}: {label[name, nm]}: {got}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--ferrio", default="ferrio")
    ap.add_argument("--fio", help="a fio binary: adds fio's best shapes of session 23")
    ap.add_argument("--tasks", default="512KiB,1MiB,4MiB",
                    help="task sizes for --cache bypass, each SIZE or SIZE/THREADS; "
                    "fill:SIZE/N reads with the defaults (keeping the file) in fill tasks of "
                    "SIZE, N at a time")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--fio-shapes", help="fio shapes, as 1-based numbers into FIO_SHAPES "
                    "(default: the two best of session 23)")  # fmt: skip
    ap.add_argument("--nomerges", action="store_true",
                    help="read each shape twice: as the disk is, and with the block layer's "
                    "request merging off (queue/nomerges=2; restored after)")  # fmt: skip
    a = ap.parse_args()
    shapes: list[tuple[str, How]] = [("ferrio read, defaults", ([], {}))]
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
        names = list(FIO_SHAPES)
        fio = [names[int(i) - 1] for i in a.fio_shapes.split(",")] if a.fio_shapes else FIO_BEST
        shapes += [(name, None) for name in fio if name in FIO_SHAPES]
    # Each shape with merges as the disk has them, and (--nomerges) with merging off.
    runs: list[Run] = [(name, how, False) for name, how in shapes]
    if a.nomerges:
        runs = [(name, how, nm) for name, how in shapes for nm in (False, True)]
    original = set_nomerges(a.file, "0") if a.nomerges else None
    try:
        rows = measure(a, runs)
    finally:
        if original is not None:
            set_nomerges(a.file, original)
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
