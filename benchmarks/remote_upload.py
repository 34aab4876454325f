"""Uploads to an S3 stand-in: `ferrio cp FILE s3://...` against boto3 and obstore.

remote_compare.py's nginx takes S3 uploads under ``/up/`` (and ``/upslow/``, with a first-byte
delay): CreateMultipartUpload, UploadPart, CompleteMultipartUpload, PutObject. It reads each
body, drops it, and holds each request until ``length / rate`` seconds after it began, as a store
takes each connection's bytes at a fraction of the client's link. Signatures are not checked.
The file to upload is read from ``--dir`` (tmpfs or page-cache warm), so the disk is not what
is measured. Each client runs in a fresh process, alternating, and the table shows the median
rate over the process's wall time and its CPU time (rusage) per GiB. Clients: ``ferrio`` (the
CLI at its defaults), ``boto3`` (``upload_file``, its transfer manager at its defaults: 10
threads), ``boto3-64`` (64 threads), ``obstore`` (``put`` of the file, its defaults).

    python3 benchmarks/remote_upload.py --size 4GiB --rounds 3 --dir /dev/shm/up
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remote_compare as rc

GIB = 1 << 30
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}

CLIENT = """
import sys
endpoint, src, name = sys.argv[1:4]
if name.startswith("boto3"):
    import boto3
    from boto3.s3.transfer import TransferConfig
    s3 = boto3.client("s3", endpoint_url=endpoint)
    conf = TransferConfig(max_concurrency=64) if name == "boto3-64" else None
    s3.upload_file(src, "bench", "up.bin", Config=conf)
else:
    import obstore
    from obstore.store import S3Store
    store = S3Store("bench", endpoint=endpoint, client_options={"allow_http": True})
    obstore.put(store, "up.bin", open(src, "rb"))
"""


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, float] | str:
    """(wall seconds, CPU seconds) of one fresh process, or why it failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f}s"
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return f"failed (exit {out.returncode}): {out.stderr.strip()[-300:]}"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--rate", default="100m", help="per-request cap, nginx units (100m)")
    ap.add_argument("--delay-ms", type=int, default=50, help="first-byte delay of /upslow/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default="capped,slow")
    ap.add_argument("--clients", default="ferrio,boto3,boto3-64,obstore")
    ap.add_argument("--dir", default=None, help="where the file lives (default: a temp dir)")
    ap.add_argument("--ferrio", default=shutil.which("ferrio") or "ferrio", help="the CLI")
    ap.add_argument("--timeout", type=float, default=180)
    a = ap.parse_args()
    size = rc._size(a.size)
    root = Path(a.dir or tempfile.mkdtemp(prefix="ferrio-upload-"))
    src = str(rc._make_object(root, size))
    if not rc._have_nginx():
        raise SystemExit("needs nginx with its lua module (or benchmarks/carry_nginx.sh's bundle)")
    clients = []
    for c in a.clients.split(","):
        mod = "boto3" if c.startswith("boto3") else c
        if c != "ferrio" and importlib.util.find_spec(mod) is None:
            print(f"skip {c}: {mod} is not installed")
        else:
            clients.append(c)
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with rc._nginx(root, rc._rate(a.rate), a.delay_ms) as (base, how):
        print(f"server: {how}; {size / GIB:.2f} GiB from {root}; {a.rounds} rounds")
        for setting in a.settings.split(","):
            endpoint = f"{base}/{'up' if setting == 'capped' else 'upslow'}"
            env = dict(os.environ, **KEYS, AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true")
            for r in range(a.rounds):
                for c in clients if r % 2 == 0 else list(reversed(clients)):
                    if c == "ferrio":
                        cmd = [a.ferrio, "cp", src, "s3://bench/up.bin"]
                    else:
                        cmd = [sys.executable, "-c", CLIENT, endpoint, src, c]
                    got = run(cmd, env, a.timeout)
                    if isinstance(got, str):
                        print(f"  {setting} {c}: {got}", flush=True)
                        continue
                    runs.setdefault((setting, c), []).append(got)
                    rate = size / GIB / got[0]
                    print(f"  {setting} round {r + 1} {c}: {rate:.2f} GiB/s", flush=True)
    print()
    print("| setting | client | GiB/s (median) | CPU-s/GiB | runs |")
    print("|---|---|---|---|---|")
    for (setting, c), rs in runs.items():
        rate = statistics.median(size / GIB / w for w, _ in rs)
        cpu = statistics.median(cpu / (size / GIB) for _, cpu in rs)
        print(f"| {setting} | {c} | {rate:.2f} | {cpu:.2f} | {len(rs)} |")


if __name__ == "__main__":
    main()
