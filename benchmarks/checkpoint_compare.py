"""Checkpoint loaders compared: file bytes into GPU memory, one fresh process per load.

Creates (if missing) an 8 GiB bf16 checkpoint of decoder-layer-shaped tensors with
safetensors.torch.save_file, and the same weights as 4 shards of 2 GiB with an index.json.
Each round runs every loader once, in an order that rotates each round, in a fresh Python
process: warm (the files read once before, so they are in the page cache) and cold (page cache
dropped through /proc/sys/vm/drop_caches, needs root; skipped otherwise). The child creates its
CUDA context first (torch.cuda.init() and a tiny allocation), then times from just before the
load call to after torch.cuda.synchronize(), and reports torch.cuda.max_memory_allocated().
A loader whose import fails is reported as missing. Cold rows also say what the disk saw
(/proc/diskstats) during the load: the mean request size, requests in flight while busy, time
per request, bytes read and the rate while busy. A loader or fio shape named with
`@QUEUE_NAME=VALUE` options (`ferrio@CACHE=bypass+QUEUE_NOMERGES=2`) runs with the disk's
/sys/block/DEV/queue/NAME set to VALUE, put back after its load: a probe of what the disk's
queue does to a read shape, beside the same loader without it. Below the table, issue 16's
targets from this run's medians: ferrio's defaults warm against 45 GiB/s and safetensors, cold
against the best peer and the best fio shape.

    python3 benchmarks/checkpoint_compare.py --dir /data/ckpt --rounds 3 [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

GIB = 1 << 30
LOADERS = ["safetensors", "fastsafetensors", "runai", "instanttensor", "ferrio"]
# Also accepted (not in the default list): "ferrio-window" and "ferrio-get-parts", research
# probes (see CHILD), and "ferrio-safe_open" /
# "safetensors-safe_open": one `get_tensor` per name through `safe_open` (with "-via-cpu":
# into host memory, each tensor then copied to the device, as vLLM's default loader does; with
# "-cpu": into host memory only). A ferrio host loop takes CKPT_HOST_MEMORY (see CHILD):
# "ferrio-safe_open-via-cpu@CKPT_HOST_MEMORY=pinned"; "ferrio-load_model" /
# "safetensors-load_model": `load_model` into a module already on the device.

# The child: argv = loader, device, files...; prints one JSON line.
CHILD = r"""
import importlib, json, os, sys, time, torch
loader, device, files = sys.argv[1], sys.argv[2], sys.argv[3:]
if os.environ.get("CKPT_IMPORT_EARLY") == "1":
    # As a script with its imports at the top does: the loader before the CUDA context.
    try:
        importlib.import_module({"ferrio": "ferrio.safetensors.torch"}.get(loader, loader))
    except ImportError:
        pass  # reported below
torch.cuda.init(); torch.zeros(1, device=device); torch.cuda.synchronize()
parts = {}  # a research probe's own timings, printed with the result
torch.cuda.reset_peak_memory_stats()
try:
    if loader == "safetensors":
        from safetensors.torch import load_file
        def load():
            out = {}
            for f in files:
                out.update(load_file(f, device=device))
            return out
    elif loader == "ferrio":
        from ferrio.safetensors.torch import load_file
        def load():
            return load_file(files if len(files) > 1 else files[0], device=device)
    elif loader.startswith(("ferrio-safe_open", "safetensors-safe_open")):
        # The loop that code written for `safetensors.safe_open` runs (transformers' loading,
        # vLLM's iterator with a device): one `get_tensor` per name, each into memory of its own.
        # "-via-cpu": vLLM's default iterator, host tensors each copied to the device after.
        if loader.startswith("ferrio-safe_open"):
            from ferrio.safetensors import safe_open
            opens = [files if len(files) > 1 else files[0]]
        else:
            from safetensors import safe_open
            opens = files
        via_cpu = loader.endswith("-via-cpu")
        on_cpu = via_cpu or loader.endswith("-cpu")  # "-cpu": host tensors, not copied after
        # Research only: where ferrio's host tensors live (CKPT_HOST_MEMORY; default: as
        # get_tensor allocates them). "pinned": always torch's caching pinned allocator, with
        # no limit (memory reused once freed); "ring": slices of one 2 GiB host buffer faulted
        # in before the clock starts, reused in turn (only right for a loop that copies each
        # tensor before 1 GiB more is read ahead: the ceiling of reused pageable memory).
        host_memory = os.environ.get("CKPT_HOST_MEMORY")
        if host_memory and loader.startswith("ferrio"):
            from ferrio.safetensors import _frameworks
            if host_memory == "pinned":
                def empty(self, n):
                    return torch.empty(n, dtype=torch.uint8, device=self.device,
                                       pin_memory=self.device.type == "cpu")  # fmt: skip
            elif host_memory == "ring":
                ring, ring_at = torch.ones(2 << 30, dtype=torch.uint8), [0]
                def empty(self, n):
                    if self.device.type != "cpu":
                        return torch.empty(n, dtype=torch.uint8, device=self.device)
                    at = ring_at[0] if ring_at[0] + n <= ring.numel() else 0
                    ring_at[0] = (at + n + 4095) // 4096 * 4096
                    return ring[at:at + n]
            else:
                raise ValueError(f"CKPT_HOST_MEMORY={host_memory}")
            _frameworks.Torch.empty = empty
            _frameworks.Torch.empty_tensor = lambda self, n, limit: empty(self, n)
        def load():
            out = {}
            for target in opens:
                with safe_open(target, framework="pt", device="cpu" if on_cpu else device) as f:
                    for k in f.keys():
                        t = f.get_tensor(k)
                        out[k] = t.to(device) if via_cpu else t
            return out
    elif loader in ("ferrio-load_model", "safetensors-load_model"):
        # `load_model(model, file, device=...)` into a module whose parameters are already on
        # the device (made, untimed, from the header): the load_file read, then
        # `load_state_dict`'s copies into the module. safetensors' takes one file at a time.
        if loader.startswith("ferrio"):
            from ferrio.safetensors.torch import load_model
            targets = [files if len(files) > 1 else files[0]]
        else:
            from safetensors.torch import load_model
            targets = files
        from safetensors import safe_open as read_header
        DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
        model = torch.nn.Module()
        for path in files:
            with read_header(path, framework="pt") as h:
                for name in h.keys():
                    part = h.get_slice(name)
                    *parents, leaf = name.split(".")
                    module = model
                    for p in parents:
                        if p not in module._modules:
                            module.add_module(p, torch.nn.Module())
                        module = module._modules[p]
                    t = torch.empty(part.get_shape(), dtype=DTYPES[part.get_dtype()], device=device)
                    module.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
        torch.cuda.synchronize()
        def load():
            for target in targets:
                load_model(model, target, strict=len(targets) == 1, device=device)
            return dict(model.state_dict())
    elif loader == "ferrio-get-parts":
        # Research only: the safe_open loop's reads made by hand, to tell its costs apart: per
        # tensor, a CUDA tensor of its own, then one synchronous `File.read` (what `get_tensor`
        # did before it read ahead), the two timed apart (alloc_s, read_s). (Session 32's
        # "ferrio-get-ahead" probe became `get_tensor`'s own read-ahead: `ferrio-safe_open`.)
        import ferrio
        from ferrio.safetensors import safetensors_read_header
        def entries(path):
            start, _, tensors = safetensors_read_header(path)
            return sorted((start + b, start + e, name) for name, _, _, b, e in tensors)
        def load():
            out, alloc_s, read_s = {}, 0.0, 0.0
            for path in files:
                f = ferrio.open(path)
                for begin, end, name in entries(path):
                    t0 = time.perf_counter()
                    buf = torch.empty(end - begin, dtype=torch.uint8, device=device)
                    t1 = time.perf_counter()
                    alloc_s += t1 - t0
                    f.read(buf, offset=begin)
                    read_s += time.perf_counter() - t1
                    out[name] = buf
                f.close()
            parts.update(alloc_s=alloc_s, read_s=read_s, tensors=len(out))
            return out
    elif loader == "ferrio-window":
        # Research only, not a loader: fastsafetensors' request shape with ferrio's engine.
        # Every file's bytes (header too) into one GPU buffer by 16 threads, each taking the
        # next 512 KiB of one shared queue and reading it direct (cache=bypass) through the
        # engine's bounce ring: requests in flight stay within a few MiB of each other.
        import itertools, ferrio
        sys.path.append(os.environ["BENCHMARKS_DIR"])
        from fill_shapes import run_threads  # a failed read in any thread fails the load
        PIECE, THREADS = 512 << 10, 16
        def load():
            out = {}
            for i, path in enumerate(files):
                f = ferrio.open(path, cache="bypass")
                size = f.size
                buf = torch.empty(size, dtype=torch.uint8, device=device)
                offsets = itertools.count(0, PIECE)
                def work():
                    while (at := next(offsets)) < size:
                        f.pread(buf[at:at + PIECE], offset=at).result()
                run_threads(THREADS, work)
                f.close()
                out[str(i)] = buf
            return out
    elif loader == "fastsafetensors":
        from fastsafetensors import fastsafe_open
        def load():
            with fastsafe_open(filenames=files, nogds=True, device=device) as f:
                return {k: f.get_tensor(k).clone() for k in f.keys()}
    elif loader == "runai":
        from runai_model_streamer import SafetensorsStreamer
        def load():
            out = {}
            with SafetensorsStreamer() as s:
                if hasattr(s, "stream_files"):
                    s.stream_files(files)
                else:
                    for f in files:
                        s.stream_file(f)
                for name, t in s.get_tensors():
                    out[name] = t.to(device)
            return out
    elif loader == "instanttensor":
        from instanttensor import safe_open
        def load():
            out = {}
            index = torch.device(device).index or 0
            target = files if len(files) > 1 else files[0]
            with safe_open(target, framework="pt", device=index) as f:
                for name, t in f.tensors():
                    out[name] = t.clone()
            return out
    else:
        raise ImportError(loader)
except ImportError as e:
    print(json.dumps({"missing": str(e)})); sys.exit(0)
def disk():
    # /proc/diskstats' read counters of the files' disk, as disk_counters() below reads them.
    dev = os.stat(files[0]).st_dev
    for line in open("/proc/diskstats"):
        f = line.split()
        if (int(f[0]), int(f[1])) == (os.major(dev), os.minor(dev)):
            return [int(f[i]) for i in (3, 5, 6, 12, 13)]
disk_before = disk()
start = time.perf_counter()
tensors = load()
torch.cuda.synchronize()
seconds = time.perf_counter() - start
disk_after = disk()
nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
print(json.dumps({"seconds": seconds, "tensor_bytes": nbytes,
                  "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
                  "disk_before": disk_before, "disk_after": disk_after, **parts}))
"""


def make_checkpoints(root: str, which: str = "both") -> dict[str, list[str]]:
    """Create the single-file and/or the sharded checkpoint if missing; return their files."""
    single = os.path.join(root, "single", "model.safetensors")
    shards = [
        os.path.join(root, "sharded", f"model-0000{i + 1}-of-00004.safetensors") for i in range(4)
    ]
    wanted = {"single 8 GiB": [single], "4 x 2 GiB shards": shards}
    if which != "both":
        wanted = {k: v for k, v in wanted.items() if k.startswith(which)}
    if all(os.path.exists(p) for files in wanted.values() for p in files):
        return wanted
    import torch
    from safetensors.torch import save_file

    hidden, inter = 4096, 14336  # decoder-layer shapes: q/k/v/o, gate/up/down, norms
    layer = {
        "self_attn.q_proj.weight": (hidden, hidden),
        "self_attn.k_proj.weight": (hidden // 4, hidden),
        "self_attn.v_proj.weight": (hidden // 4, hidden),
        "self_attn.o_proj.weight": (hidden, hidden),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    per_layer = sum(2 * torch.Size(s).numel() for s in layer.values())
    layers = (8 * GIB) // per_layer
    tensors = {}
    for i in range(layers):
        for name, shape in layer.items():
            tensors[f"model.layers.{i}.{name}"] = torch.randn(shape, dtype=torch.bfloat16)
    os.makedirs(os.path.dirname(single), exist_ok=True)
    os.makedirs(os.path.dirname(shards[0]), exist_ok=True)
    save_file(tensors, single)
    if which == "single":
        # Written back before any load is timed: the first warm load after writing read at
        # 39-41 GiB/s against 44-46 for the next ones while the new pages were still being
        # written back (RESULTS.md, Checkpoints, sessions 30-31; a synced write showed no loss).
        os.sync()
        return wanted
    names = sorted(tensors)
    weight_map = {}
    for i, path in enumerate(shards):
        part = {n: tensors[n] for n in names[i::4]}
        save_file(part, path)
        weight_map.update({n: os.path.basename(path) for n in part})
    with open(os.path.join(os.path.dirname(shards[0]), "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    os.sync()  # see above
    return wanted


def warm(files: list[str]) -> None:
    for p in files:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=16M", "status=none"], check=True)


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


# name -> (block size, iodepth, jobs, direct, layout). With several jobs, "stripes": each job
# reads its own contiguous 1/jobs share of the file in order; "interleaved": job j reads blocks
# j, j + jobs, j + 2 x jobs, ..., so together they read the file front to back from as many
# threads (as a reader that hands out consecutive blocks to a thread pool does).
# fastsafetensors 0.5.0 reads with O_DIRECT from 16 threads that take the next 512 KiB block
# from one queue: its 16 MiB of pinned memory is cut into 2 buffers per thread. Each `pread` is
# 516 KiB at a 512 KiB-aligned offset, the block and the next one's first page (strace, session
# 22), so neighbouring reads overlap by a page; no shape below overlaps so.
FIO_SHAPES = {
    "fio O_DIRECT bs 1 MiB iodepth 32": ("1M", 32, 1, True, ""),
    "fio O_DIRECT bs 16 MiB iodepth 8": ("16M", 8, 1, True, ""),
    "fio O_DIRECT bs 16 MiB iodepth 16": ("16M", 16, 1, True, ""),
    "fio O_DIRECT bs 16 MiB, 16 jobs of one stripe each": ("16M", 1, 16, True, "stripes"),
    "fio buffered bs 16 MiB, 16 jobs of one stripe each": ("16M", 1, 16, False, "stripes"),
    "fio O_DIRECT bs 16 MiB, 16 jobs interleaved": ("16M", 1, 16, True, "interleaved"),
    "fio O_DIRECT bs 512 KiB iodepth 16": ("512K", 16, 1, True, ""),
    "fio O_DIRECT bs 512 KiB, 16 jobs interleaved": ("512K", 1, 16, True, "interleaved"),
    "fio buffered bs 512 KiB, 16 jobs interleaved": ("512K", 1, 16, False, "interleaved"),
}


def run_fio(fio: str, shape: str, files: list[str]) -> dict:
    """The disk's yardstick on the checkpoint's own files: fio io_uring reading every file once
    (cold), timed like a loader (seconds for all file bytes)."""
    bs, depth, jobs, direct, layout = FIO_SHAPES[shape]
    cmd = [fio, "--name=ckpt", f"--filename={':'.join(files)}", f"--bs={bs}",
           f"--iodepth={depth}", "--ioengine=io_uring", f"--direct={int(direct)}",
           f"--numjobs={jobs}", "--group_reporting", "--readonly",
           "--output-format=json"]  # fmt: skip
    block = int(bs[:-1]) << {"K": 10, "M": 20}[bs[-1]]
    if jobs > 1:
        if len(files) > 1:
            return {"error": "the several-job shapes read one file"}
        # Rounded down: a region past the end would make fio lay the file out anew (a write).
        size = os.path.getsize(files[0])
        if layout == "stripes":
            stripe = size // jobs // block * block
            cmd += ["--rw=read", f"--size={stripe}", f"--offset_increment={stripe}"]
        else:
            # Job j starts at block j and skips the other jobs' blocks after each of its own.
            region = (size - (jobs - 1) * block) // block * block
            per_job = region // jobs // block * block
            cmd += [f"--rw=read:{(jobs - 1) * block}", f"--size={region}",
                    f"--io_size={per_job}", f"--offset_increment={block}"]  # fmt: skip
    else:
        cmd.append("--rw=read")
    t = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except OSError as e:  # no fio there: a row that says so, not the end of the run
        return {"error": f"cannot run fio: {e}"}
    secs = time.perf_counter() - t
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["fio failed"])[-1]}
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]["read"]
    # fio's own clock (runtime in ms) leaves out its start-up; the loaders' clocks start late too.
    # Several-job shapes leave less than a block per job unread: their rate is scaled to the file.
    seconds = job["runtime"] / 1000 or secs
    return {"seconds": seconds * sum(map(os.path.getsize, files)) / job["io_bytes"],
            "peak_gpu_bytes": 0}  # fmt: skip


def disk_counters(path: str) -> list[int] | None:
    """/proc/diskstats' read counters of the block device holding `path`: reads completed,
    sectors read, ms spent reading, ms busy, weighted ms in queue (None where unknown)."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)} {os.minor(dev)}"
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if f"{fields[0]} {fields[1]}" == want:
                    return [int(fields[i]) for i in (3, 5, 6, 12, 13)]
    except OSError:
        pass
    return None


def loader_options(loader: str) -> tuple[str, list[tuple[str, str]]]:
    """A loader's name and its options, in order: "NAME@A=1+B=2" -> ("NAME", [("A", "1"), ...])."""
    base, _, opts = loader.partition("@")
    return base, [(n, v) for n, _, v in (kv.partition("=") for kv in opts.split("+") if kv)]


def queue_options(loader: str) -> tuple[str, dict[str, str]]:
    """`loader` without its `QUEUE_NAME=VALUE` options, and those as {name: value}."""
    base, opts = loader_options(loader)
    queue = {n[len("QUEUE_") :].lower(): v for n, v in opts if n.upper().startswith("QUEUE_")}
    kept = [f"{n}={v}" for n, v in opts if not n.upper().startswith("QUEUE_")]
    return (f"{base}@{'+'.join(kept)}" if kept else base), queue


@contextlib.contextmanager
def queue_settings(path: str, settings: dict[str, str]) -> Iterator[None]:
    """The queue settings of the disk holding `path` (/sys/block/DEV/queue/NAME: a partition's
    are its disk's) set to `settings` for the block, and put back after it."""
    if not settings:
        yield
        return
    dev = os.stat(path).st_dev
    node = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    queue = next(
        (q for q in (f"{node}/queue", f"{os.path.dirname(node)}/queue") if os.path.isdir(q)), None
    )
    if queue is None:
        raise RuntimeError(f"{path}: no block queue in sysfs to set {settings}")
    old: dict[str, str] = {}
    try:
        for name, value in settings.items():
            with open(f"{queue}/{name}") as f:
                was = f.read().strip()
            # `scheduler` reads as every choice with the one in use in brackets.
            old[name] = was[was.index("[") + 1 : was.index("]")] if "[" in was else was
            with open(f"{queue}/{name}", "w") as f:
                f.write(value)
        yield
    finally:
        for name, value in old.items():
            with open(f"{queue}/{name}", "w") as f:
                f.write(value)


def pages_activated() -> int | None:
    """/proc/vmstat's `pgactivate`: pages the kernel has moved to its active list so far. The
    first warm load after the checkpoint is written is the second access to its pages (`dd`,
    just before it, made the first), and moves every page of it (RESULTS.md, Checkpoints,
    session 32); later loads find them active."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, value = line.split()
                if name == "pgactivate":
                    return int(value)
    except OSError:
        pass
    return None


def disk_shape(before: list[int] | None, after: list[int] | None) -> dict:
    """What the disk saw between two disk_counters(): the mean request size and the mean number
    of requests in flight while it was busy (so a loader's I/O shape can be told from its
    rate)."""
    if not before or not after:
        return {}
    reads, sectors, read_ms, busy_ms, queue_ms = (a - b for a, b in zip(after, before, strict=True))
    if not reads or not busy_ms:
        return {}
    # Bytes read over the time the disk was busy: the disk's own rate, whatever the loader's
    # clock leaves in or out (and whether the loader read every byte from the disk).
    return {"request_kib": round(sectors * 512 / reads / 1024),
            "in_flight": round(queue_ms / busy_ms, 1),
            "latency_ms": round(read_ms / reads, 2),
            "read_gib": round(sectors * 512 / GIB, 2),
            "busy_gib_per_s": round(sectors * 512 / GIB / (busy_ms / 1000), 2)}  # fmt: skip


def run_child(loader: str, device: str, files: list[str]) -> dict:
    # "ferrio@NAME=VALUE+NAME=VALUE": ferrio with settings, given to the child as FERRIO_* (so
    # for every ferrio loader and probe: "ferrio-safe_open@TASK_SIZE=1MiB")
    # (PYTHONPATH as itself: another build of ferrio to compare against; CKPT_IMPORT_EARLY=1
    # imports the loader before the CUDA context is made, as a script's imports do). Another
    # loader's variables go as they are written ("fastsafetensors@FASTSAFETENSORS_ODIRECT=0").
    base, opts = loader_options(loader)
    env = dict(os.environ)
    for name, value in opts:
        # `ferrio@cache=bypass` sets FERRIO_CACHE; so does `ferrio@FERRIO_CACHE=bypass` (which
        # became FERRIO_FERRIO_CACHE, ignored, in session 26's runs 4-5).
        ferrio_setting = (
            base.startswith("ferrio")
            and name != "PYTHONPATH"
            and not name.startswith(("CKPT_", "FERRIO_"))
        )
        env["FERRIO_" + name.upper() if ferrio_setting else name] = value
    res = run_python(CHILD, [base, device, *files], env)
    # The disk's view of the load alone, where the child could read it (cold rows show it).
    before, after = res.pop("disk_before", None), res.pop("disk_after", None)
    if before and after and (shape := disk_shape(before, after)):
        res["disk"] = shape
    return res


def run_python(code: str, args: list[str], env: dict | None = None, timeout: int = 900) -> dict:
    """Run `code` in a fresh Python process; return the last JSON line it printed, or
    ``{"error": its last line of stderr}``."""
    # The child finds the benchmarks' shared helpers (fill_shapes.run_threads) here.
    env = dict(
        os.environ if env is None else env,
        BENCHMARKS_DIR=os.path.dirname(os.path.abspath(__file__)),
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


class _Stopped(Exception):
    """The run was told to stop (SIGTERM)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stopped


def measure(
    args: argparse.Namespace,
    ckpts: dict[str, list[str]],
    by_mode: dict[str, list[str]],
    can_drop: bool,
    results: dict[str, dict],
) -> None:
    """Every load of every round, alternating loaders; each result into `results` as it ends."""
    for ckpt, files in ckpts.items():
        total = sum(os.path.getsize(p) for p in files)
        for mode in ["warm", "cold"] if can_drop else ["warm"]:
            loaders = [name for name in by_mode[mode] if name]
            if not loaders:
                continue
            for r in range(args.rounds):
                order = loaders[r % len(loaders) :] + loaders[: r % len(loaders)]
                for loader in order:
                    if mode == "warm":
                        warm(files)
                    else:
                        drop_caches()
                    name, queue = queue_options(loader)
                    before = disk_counters(files[0])
                    activated = pages_activated()
                    with queue_settings(files[0], queue):
                        if name in FIO_SHAPES:
                            res = (
                                run_fio(args.fio, name, files)
                                if args.fio
                                else {"error": "a fio shape needs --fio"}
                            )
                        else:
                            res = run_child(name, args.device, files)
                    if mode == "cold":
                        # A loader's own counters cover its load alone; the process's also
                        # its start (Python's and torch's libraries, read from the disk again).
                        res.setdefault("disk", disk_shape(before, disk_counters(files[0])))
                    elif activated is not None and (now := pages_activated()) is not None:
                        res["pages_activated"] = now - activated
                    loads = [(f"{ckpt} | {mode} | {loader}", res)]
                    # (Not under cache=bypass, which leaves nothing cached: its row is known;
                    # nor the window probe, which bypasses it.)
                    keeps = (
                        loader.startswith("ferrio")
                        and loader != "ferrio-window"
                        and "CACHE=BYPASS" not in loader.upper()
                    )
                    if mode == "cold" and args.reread and keeps:
                        # What the cold load left in the page cache, read by a new process.
                        activated = pages_activated()
                        again = run_child(name, args.device, files)
                        if activated is not None and (now := pages_activated()) is not None:
                            again["pages_activated"] = now - activated
                        loads.append((f"{ckpt} | cold, read again | {loader}", again))
                    for key, res in loads:
                        entry = results.setdefault(key, {"runs": [], "file_bytes": total})
                        entry["runs"].append(res)
                        # One line per load as it happens, so a run cut short still tells
                        # something.
                        rate = total / res["seconds"] / GIB if "seconds" in res else None
                        print(f"# {key} round {r}: {rate and round(rate, 2)} GiB/s {res}",
                              file=sys.stderr, flush=True)  # fmt: skip


# The peers of issue 16's cold target (every loader but ferrio), and its yardsticks (GiB/s).
PEERS = [name for name in LOADERS if name != "ferrio"]
WARM_TARGET, WARM_TIMES_SAFETENSORS, COLD_TIMES_FIO = 45.0, 9.0, 0.95


def paired(summary: dict[str, dict], a: str, b: str) -> str:
    """How `a` did against `b` round by round: rounds ahead, and the geometric mean of the
    ratios (empty where no round has both)."""
    ours, theirs = (summary[k].get("round_gib_per_s", []) for k in (a, b))
    pairs = [(x, y) for x, y in zip(ours, theirs, strict=False) if x and y]
    if not pairs:
        return ""
    ahead = sum(x > y for x, y in pairs)
    mean = math.exp(statistics.fmean(math.log(x / y) for x, y in pairs))
    return f"; round by round ahead in {ahead} of {len(pairs)}, {mean:.2f}x geometric mean"


def target_lines(summary: dict[str, dict]) -> list[str]:
    """Issue 16's targets from the medians of this run, per checkpoint.

    Warm: ferrio's defaults against 45 GiB/s and 9x safetensors. Cold: against the best of the
    peers and 0.95x the best fio shape that ran (the plain shapes, not those with @options).
    """
    rate = {k: s["gib_per_s"] for k, s in summary.items() if "gib_per_s" in s}
    lines = []
    for ckpt in dict.fromkeys(k.split(" | ")[0] for k in rate):

        def of(mode: str, loader: str, ckpt: str = ckpt) -> float | None:
            return rate.get(f"{ckpt} | {mode} | {loader}")

        if (warm := of("warm", "ferrio")) is not None:
            line = f"{ckpt} | warm: ferrio {warm:.2f} GiB/s, {warm / WARM_TARGET:.3f}x"
            line += f" the {WARM_TARGET:g} GiB/s target"
            if (st := of("warm", "safetensors")) is not None:
                line += f", {warm / st:.1f}x safetensors (target {WARM_TIMES_SAFETENSORS:g}x)"
            lines.append(line)
        if (cold := of("cold", "ferrio")) is not None:
            line = f"{ckpt} | cold: ferrio {cold:.2f} GiB/s"
            peers = {p: r for p in PEERS if (r := of("cold", p)) is not None}
            if peers:
                best = max(peers, key=lambda p: peers[p])
                line += f", {cold / peers[best]:.2f}x the best peer ({best} {peers[best]:.2f}"
                line += paired(summary, f"{ckpt} | cold | ferrio", f"{ckpt} | cold | {best}") + ")"
            fios = {f: r for f in FIO_SHAPES if (r := of("cold", f)) is not None}
            if fios:
                best = max(fios, key=lambda f: fios[f])
                line += (f", {cold / fios[best]:.2f}x fio's best shape ({best} {fios[best]:.2f};"
                         f" target {COLD_TIMES_FIO:g}x)")  # fmt: skip
            lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", default="/tmp/ferrio-ckpt", help="where the checkpoints live")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument(
        "--warm-loaders", help="loaders for the warm rows (default: --loaders; 'none': no rows)"
    )
    ap.add_argument(
        "--cold-loaders", help="loaders for the cold rows (default: --loaders; 'none': no rows)"
    )
    ap.add_argument("--fio", help="a fio binary: adds its shapes (FIO_SHAPES) to the cold rows")
    ap.add_argument(
        "--fio-shapes",
        help="which of FIO_SHAPES, as 1-based numbers (e.g. 3,4,5), or 'none' (only those named "
        "in the loaders, as 'fio O_DIRECT bs 512 KiB iodepth 16@QUEUE_NOMERGES=2' may be)",
    )
    ap.add_argument(
        "--reread",
        action="store_true",
        help="after each cold ferrio load that may keep (not cache=bypass), the same load again "
        "in a new process with what it left in the page cache ('cold, read again' rows)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--checkpoints", choices=["both", "single", "4"], default="both",
                    help="which checkpoints: both, the single file, or the 4 shards")  # fmt: skip
    args = ap.parse_args()
    fio_shapes = list(FIO_SHAPES)
    if args.fio_shapes == "none":  # only the fio shapes named among the loaders
        fio_shapes = []
    elif args.fio_shapes:
        fio_shapes = [fio_shapes[int(i) - 1] for i in args.fio_shapes.split(",")]
    # "none" leaves a mode's rows out (e.g. `--cold-loaders none` for a warm-only run).
    cold = [] if args.cold_loaders == "none" else (args.cold_loaders or args.loaders).split(",")
    by_mode = {
        "warm": []
        if args.warm_loaders == "none"
        else (args.warm_loaders or args.loaders).split(","),
        "cold": cold + (fio_shapes if args.fio and cold else []),
    }
    ckpts = make_checkpoints(args.dir, args.checkpoints)
    results: dict[str, dict] = {}
    can_drop = drop_caches()
    # Cut short by the step's limit (`timeout` sends SIGTERM), the run still prints the medians
    # of the loads it made, with how many rounds each had.
    signal.signal(signal.SIGTERM, _stop)
    stopped = False
    try:
        measure(args, ckpts, by_mode, can_drop, results)
    except _Stopped:
        stopped = True
    summary = {}
    for key, entry in results.items():
        ok = [r for r in entry["runs"] if "seconds" in r]
        if not ok:
            first = entry["runs"][0]
            summary[key] = {"status": "missing" if "missing" in first else "error",
                            "detail": first.get("missing") or first.get("error")}  # fmt: skip
            continue
        secs = statistics.median(r["seconds"] for r in ok)
        summary[key] = {
            "median_seconds": secs,
            "gib_per_s": entry["file_bytes"] / secs / GIB,
            "peak_gpu_gib": max(r["peak_gpu_bytes"] for r in ok) / GIB,
            "rounds": len(ok),
            # Round by round (None where a load failed): the loaders of one round ran minutes
            # apart at most, so pairs of them see the same disk.
            "round_gib_per_s": [
                entry["file_bytes"] / r["seconds"] / GIB if "seconds" in r else None
                for r in entry["runs"]
            ],
        }
        shapes = [r["disk"] for r in ok if r.get("disk")]
        if shapes:
            summary[key]["disk"] = {k: statistics.median(d[k] for d in shapes) for k in shapes[0]}
    if args.json:
        print(json.dumps({"time": time.time(), "stopped": stopped, "results": summary}, indent=1))
        return
    if stopped:
        print("# stopped (SIGTERM) before every round ran: medians of the loads made")
    print(
        f"{'checkpoint | cache | loader':<48} {'median s':>9} {'GiB/s':>7} {'peak GiB':>9} rounds"
    )
    for key, s in summary.items():
        if "median_seconds" in s:
            sec, rate, peak = s["median_seconds"], s["gib_per_s"], s["peak_gpu_gib"]
            disk = s.get("disk")
            shape = (f"  disk: {disk['request_kib']:.0f} KiB requests, {disk['in_flight']:.1f} "
                     f"in flight, {disk['latency_ms']:.2f} ms each, "
                     f"{disk.get('read_gib', 0):.2f} GiB read at "
                     f"{disk.get('busy_gib_per_s', 0):.2f} GiB/s busy" if disk else "")  # fmt: skip
            print(f"{key:<48} {sec:>9.2f} {rate:>7.2f} {peak:>9.2f} {s['rounds']:>6}{shape}")
        else:
            print(f"{key:<48} {s['status']}: {s['detail']}")
    for line in target_lines(summary):
        print(line)


if __name__ == "__main__":
    main()
