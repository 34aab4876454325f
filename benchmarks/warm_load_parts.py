#!/usr/bin/env python3
"""Where a warm `ferrio.safetensors.load_file` onto the GPU spends its time (issue 16).

Each part is timed in a fresh Python process whose CUDA context exists before the clock, the
checkpoint page-cache warm, parts alternating round by round, medians in milliseconds:

- ``load``: the whole ``load_file(path, device=...)``, as ``checkpoint_compare.py`` times it;
- ``header``: ``safe_open`` and ``close`` alone (open, read and check the header);
- ``alloc``: ``torch.empty`` of the data section's size on the device, one allocation;
- ``alloc8``: the same bytes as 8 allocations;
- ``read``: one ``File.pread`` of the data section into a tensor allocated before the clock.

``load`` less ``read`` is what the load adds around the bare read; ``alloc`` says how much of
that the one large allocation could be.

    python3 benchmarks/warm_load_parts.py CHECKPOINT [--rounds 4] [--device cuda:0] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from checkpoint_compare import run_python

PARTS = ["load", "header", "alloc", "alloc8", "read"]

CHILD = r"""
import json, sys, time, torch
part, path, device = sys.argv[1], sys.argv[2], sys.argv[3]
torch.cuda.init(); torch.zeros(1, device=device); torch.cuda.synchronize()
import ferrio, ferrio.safetensors
from ferrio.safetensors.torch import load_file
with open(path, "rb") as f:
    start = 8 + int.from_bytes(f.read(8), "little")
f = None
size = ferrio.open(path).size - start
if part == "read":
    f = ferrio.open(path); buf = torch.empty(size, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
t = time.perf_counter()
if part == "load":
    out = load_file(path, device=device)
elif part == "header":
    ferrio.safetensors.safe_open(path, "pt", device).close()
elif part == "alloc":
    buf = torch.empty(size, dtype=torch.uint8, device=device)
elif part == "alloc8":
    bufs = [torch.empty(size // 8 + 1, dtype=torch.uint8, device=device) for _ in range(8)]
elif part == "read":
    assert f.pread(buf, offset=start).result() == size
torch.cuda.synchronize()
print(json.dumps({"ms": (time.perf_counter() - t) * 1e3, "gib": size / (1 << 30)}))
"""


def run(part: str, path: str, device: str) -> dict:
    return run_python(CHILD, [part, path, device], timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("checkpoint")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    subprocess.run(["dd", f"if={args.checkpoint}", "of=/dev/null", "bs=16M", "status=none"],
                   check=True)  # fmt: skip
    runs: dict[str, list[float]] = {p: [] for p in PARTS}
    gib = 0.0
    for r in range(args.rounds):
        for part in PARTS[r % len(PARTS) :] + PARTS[: r % len(PARTS)]:
            res = run(part, args.checkpoint, args.device)
            print(f"# {part} round {r}: {res}", file=sys.stderr, flush=True)
            if "ms" in res:
                runs[part].append(res["ms"])
                gib = res["gib"]
    med = {p: statistics.median(v) for p, v in runs.items() if v}
    if args.json:
        print(json.dumps({"median_ms": med, "runs_ms": runs, "gib": gib}))
        return
    print(f"data section {gib:.2f} GiB; medians of {args.rounds} fresh processes, ms:")
    for p in PARTS:
        if p in med:
            rate = f"  ({gib / med[p] * 1e3:.2f} GiB/s)" if p in ("load", "read") else ""
            print(f"  {p:7s} {med[p]:8.2f}{rate}")
    if "load" in med and "read" in med:
        print(f"  load - read = {med['load'] - med['read']:.2f} ms")


if __name__ == "__main__":
    main()
