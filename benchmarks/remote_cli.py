"""`ferrio read URL` and `ferrio cp URL FILE` against remote_compare.py's object-store stand-in.

The same nginx (or its bundle, or the Python server) serves one object, each request paced to
``--rate``; ``slow`` adds ``--delay-ms`` before each first byte. Every command runs in a fresh
process, the commands alternating in every round; the table shows the median rate over the
process's wall time (start included) and the command's own ``--json`` figure. ``--binary
NAME=PATH`` (repeatable) compares builds of the CLI in one run; ``boto3``'s
``download_file`` (its transfer manager at its defaults, path-style, unsigned) is the peer for
downloads where boto3 is installed. Downloads go to ``--dest`` and are removed after each run.

    python3 benchmarks/remote_cli.py --size 8GiB --rounds 3 --dest /root/dl \\
        --binary new=target/release/ferrio --binary old=/path/to/old/ferrio
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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

BOTO3_DOWNLOAD = """
import sys, boto3
from botocore import UNSIGNED
from botocore.config import Config
endpoint, key, dest = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(signature_version=UNSIGNED,
                  s3={"addressing_style": "path"}), region_name="us-east-1")
bucket, _, name = key.partition("/")
s3.download_file(bucket, name, dest)
"""


def run(cmd: list[str], timeout: float) -> tuple[float, float | None] | str:
    """(wall seconds, the command's own GiB/s if it printed JSON), or why it failed."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f}s"
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        return f"failed (exit {out.returncode}): {out.stderr.strip()[-300:]}"
    own = None
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if last.startswith("{"):
        own = json.loads(last).get("gib_per_s")
    return wall, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="8GiB")
    ap.add_argument("--rate", default="100m", help="per-request cap, nginx units (100m)")
    ap.add_argument("--delay-ms", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default="capped,slow")
    ap.add_argument("--dir", default=None, help="where the object lives (default: a temp dir)")
    ap.add_argument("--dest", default=None, help="where downloads go (default: a temp dir)")
    ap.add_argument("--binary", action="append", default=[], help="NAME=PATH of a ferrio CLI")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    size = rc._size(a.size)
    binaries = dict(b.split("=", 1) for b in a.binary) or {
        "ferrio": shutil.which("ferrio") or "ferrio"
    }
    root = Path(a.dir or tempfile.mkdtemp(prefix="ferrio-remote-cli-"))
    dest = Path(a.dest or tempfile.mkdtemp(prefix="ferrio-remote-dl-"))
    dest.mkdir(parents=True, exist_ok=True)
    rc._make_object(root, size)
    serve = rc._nginx if rc._have_nginx() else rc._python_server
    have_boto3 = importlib.util.find_spec("boto3") is not None
    runs: dict[tuple[str, str], list[tuple[float, float | None]]] = {}
    with serve(root, rc._rate(a.rate), a.delay_ms) as (base, how):
        print(f"server: {how}; object {size / GIB:.2f} GiB; {a.rounds} rounds; dest {dest}")
        for setting in a.settings.split(","):
            url = f"{base}/{setting}/bucket/object.bin"
            target = dest / "object.bin"
            commands: dict[str, list[str]] = {}
            for name, path in binaries.items():
                commands[f"{name} read"] = [path, "read", url, "--json"]
                commands[f"{name} cp"] = [path, "cp", url, str(target), "--json"]
            if have_boto3:
                key = f"{setting}/bucket/object.bin"
                commands["boto3 download_file"] = [
                    sys.executable,
                    "-c",
                    BOTO3_DOWNLOAD,
                    base,
                    key,
                    str(target),
                ]
            for r in range(a.rounds):
                order = list(commands) if r % 2 == 0 else list(reversed(commands))
                for c in order:
                    got = run(commands[c], a.timeout)
                    target.unlink(missing_ok=True)
                    if isinstance(got, str):
                        print(f"  {setting} {c}: {got}", flush=True)
                        continue
                    runs.setdefault((setting, c), []).append(got)
                    own = f", own {got[1]:.2f}" if got[1] is not None else ""
                    print(
                        f"  {setting} round {r + 1} {c}: {size / GIB / got[0]:.2f} GiB/s wall{own}",
                        flush=True,
                    )
    print()
    print("| setting | command | GiB/s over the process (median) | its own --json figure | runs |")
    print("|---|---|---|---|---|")
    for (setting, c), rs in runs.items():
        wall = statistics.median(size / GIB / w for w, _ in rs)
        owns = [o for _, o in rs if o is not None]
        own = f"{statistics.median(owns):.2f}" if owns else ""
        print(f"| {setting} | {c} | {wall:.2f} | {own} | {len(rs)} |")


if __name__ == "__main__":
    main()
