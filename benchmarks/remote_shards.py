#!/usr/bin/env python3
"""Opening a sharded checkpoint over HTTP with a first-byte latency: ferrio.safetensors'
header reads one shard after another against several at once.

A local HTTP server (the one of python/tests/test_safetensors_remote.py: Range, ETag, If-Match)
serves N small shards and their index, sleeping `--delay-ms` before every answer, as an object
store's round trip would. Each round loads the whole index with `_HEADER_THREADS` = 1 and then
at its default, in one process (the data reads are the same in both).

    python3 benchmarks/remote_shards.py [--shards 32] [--delay-ms 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.server
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests"))
import test_safetensors_remote as served

import ferrio.safetensors as fs
import ferrio.safetensors.numpy as fsn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ferrio-shards-"))
    weight_map = {}
    for i in range(a.shards):
        name = f"s-{i:05d}.safetensors"
        save_file({f"l{i}.w": np.full((1024, 256), i, dtype=np.float32)}, str(root / name))
        weight_map[f"l{i}.w"] = name
    (root / "m.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    delay = a.delay_ms / 1000

    class Slow(served._Files):
        def do_HEAD(self) -> None:
            time.sleep(delay)
            super().do_HEAD()

        def do_GET(self) -> None:
            time.sleep(delay)
            super().do_GET()

    Slow.root = root
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/m.safetensors.index.json"
    default = fs._HEADER_THREADS
    for _ in range(a.rounds):
        for threads in (1, default):
            fs._HEADER_THREADS = threads
            t = time.perf_counter()
            got = fsn.load_file(url)
            took = time.perf_counter() - t
            print(f"header threads {threads:>2}: {len(got)} tensors in {took:.2f} s")
    server.shutdown()


if __name__ == "__main__":
    main()
