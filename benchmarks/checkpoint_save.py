"""Checkpoint writers compared: `ferrio.safetensors.torch.save_file` against
`safetensors.torch.save_file`, one fresh process per save.

The child builds a dict of decoder-layer-shaped bf16 tensors (the shapes of
`checkpoint_compare.py`, as many layers as fit in --size-gib) on the host or on a GPU, filled
before the clock starts, then times one `save_file` into --dir (with `fsync`: until the file's
bytes are on the device; safetensors has no such option, so its file is fsync'd after the call,
inside the timing). The parent runs `sync` before every child so one save's dirty pages do not
slow the next, alternates the writers each round, and prints medians of GiB/s of file bytes.

    python3 benchmarks/checkpoint_save.py --dir /data/save --size-gib 8 --device cuda:0 --rounds 3
    python3 benchmarks/checkpoint_save.py --dir /tmp/save --size-gib 2 --device cpu --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WRITERS = ["safetensors", "ferrio"]

CHILD = r"""
import json, os, sys, time, torch
writer, device, path, size_gib, fsync = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5] == "1"
hidden, inter = 4096, 14336
layer = {
    "self_attn.q_proj.weight": (hidden, hidden), "self_attn.k_proj.weight": (hidden // 4, hidden),
    "self_attn.v_proj.weight": (hidden // 4, hidden), "self_attn.o_proj.weight": (hidden, hidden),
    "mlp.gate_proj.weight": (inter, hidden), "mlp.up_proj.weight": (inter, hidden),
    "mlp.down_proj.weight": (hidden, inter), "input_layernorm.weight": (hidden,),
    "post_attention_layernorm.weight": (hidden,),
}
per_layer = sum(2 * torch.Size(s).numel() for s in layer.values())
layers = max(1, int(size_gib * (1 << 30)) // per_layer)
tensors = {}
for i in range(layers):
    for j, (name, shape) in enumerate(layer.items()):
        tensors[f"model.layers.{i}.{name}"] = torch.empty(shape, dtype=torch.bfloat16, device=device).fill_(i + j / 16)
if device != "cpu":
    torch.cuda.synchronize()
if writer == "ferrio":
    from ferrio.safetensors.torch import save_file
    def save():
        save_file(tensors, path, metadata={"format": "pt"}, fsync=fsync)
else:
    from safetensors.torch import save_file
    def save():
        save_file(tensors, path, metadata={"format": "pt"})
        if fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
r0 = os.times()
start = time.perf_counter()
save()
seconds = time.perf_counter() - start
r1 = os.times()
size = os.path.getsize(path)
os.unlink(path)
print(json.dumps({"seconds": seconds, "bytes": size,
                  "cpu_s": (r1.user - r0.user) + (r1.system - r0.system)}))
"""  # noqa: E501


def run(writer: str, device: str, path: str, size_gib: float, fsync: bool) -> dict:
    """One save in a fresh process. ``ferrio@NAME=VALUE+...`` is ferrio with ``FERRIO_NAME``
    set to VALUE (e.g. ``ferrio@CACHE=bypass``)."""
    name, _, variant = writer.partition("@")
    env = dict(os.environ)
    for pair in filter(None, variant.split("+")):
        key, _, value = pair.partition("=")
        env[f"FERRIO_{key.upper()}"] = value
    subprocess.run(["sync"], check=False)
    r = subprocess.run(
        [sys.executable, "-c", CHILD, name, device, path, str(size_gib), str(int(fsync))],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if os.path.exists(path):
        os.unlink(path)
    return json.loads(line[-1]) if line else {"error": r.stderr[-600:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size-gib", type=float, default=8)
    ap.add_argument("--device", default="cuda:0", help="cpu, cuda:0, ... (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fsync", default="off,on", help="off, on, or off,on")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument(
        "--writers",
        default=",".join(WRITERS),
        help="safetensors, ferrio, ferrio@NAME=VALUE (FERRIO_NAME set for that writer)",
    )
    args = ap.parse_args()
    writers = args.writers.split(",")
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "save.safetensors")
    rows: dict[tuple[str, str, bool], list[dict]] = {}
    for device in args.device.split(","):
        for fsync in (f == "on" for f in args.fsync.split(",")):
            for rnd in range(args.rounds):
                order = writers if rnd % 2 == 0 else writers[::-1]
                for writer in order:
                    res = run(writer, device, path, args.size_gib, fsync)
                    rows.setdefault((device, writer, fsync), []).append(res)
                    if "seconds" in res:
                        gib = res["bytes"] / (1 << 30)
                        print(
                            f"{device:<7} fsync={'on ' if fsync else 'off'} {writer:<20} "
                            f"round {rnd}: {gib / res['seconds']:.2f} GiB/s "
                            f"({gib:.2f} GiB in {res['seconds']:.2f} s, {res['cpu_s']:.2f} CPU-s)",
                            flush=True,
                        )
                    else:
                        print(device, fsync, writer, res, flush=True)
    print("\nmedians (GiB/s of file bytes; CPU-s per GiB):")
    print(f"{'device':<8} {'fsync':<6} {'writer':<20} {'GiB/s':>7} {'CPU-s/GiB':>10}  all rounds")
    for (device, writer, fsync), res in rows.items():
        ok = [r for r in res if "seconds" in r]
        if not ok:
            print(f"{device:<8} {'on' if fsync else 'off':<6} {writer:<20} failed")
            continue
        rates = [r["bytes"] / (1 << 30) / r["seconds"] for r in ok]
        cpu = statistics.median(r["cpu_s"] / (r["bytes"] / (1 << 30)) for r in ok)
        print(
            f"{device:<8} {'on' if fsync else 'off':<6} {writer:<20} "
            f"{statistics.median(rates):>7.2f} {cpu:>10.2f}  {', '.join(f'{x:.2f}' for x in rates)}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"|".join(map(str, k)): v for k, v in rows.items()}, fh)


if __name__ == "__main__":
    main()
