#!/usr/bin/env python3
"""Many small objects: what opening an object costs, and a recursive download of a prefix.

Starts moto's S3 server on 127.0.0.1 (a free port), puts N objects of SIZE bytes under one
prefix, then, in this process: opens and reads every object one after the other (ms per
object, `--rounds` passes), and copies the whole prefix to a temporary directory with
`ferrio.copy(..., recursive=True)` (seconds). Local loopback, no TLS: on a real store a new
client per object also pays a TLS handshake per object, which this does not show.

    python3 benchmarks/remote_many.py [--objects 100] [--size 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=100)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    import boto3
    import numpy as np
    from moto.server import ThreadedMotoServer

    import ferrio

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
    )
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="bench-bucket")
        for i in range(a.objects):
            s3.put_object(Bucket="bench-bucket", Key=f"d/f{i}", Body=os.urandom(a.size))
        buf = np.empty(a.size, np.uint8)
        for r in range(a.rounds):
            t = time.perf_counter()
            for i in range(a.objects):
                with ferrio.open(f"s3://bench-bucket/d/f{i}") as f:
                    assert f.read(buf) == a.size
            ms = (time.perf_counter() - t) / a.objects * 1e3
            print(f"round {r + 1}: open + read {ms:.2f} ms per object")
        out = tempfile.mkdtemp(prefix="ferrio-remote-many-")
        try:
            t = time.perf_counter()
            ferrio.copy("s3://bench-bucket/d/", os.path.join(out, "d"), recursive=True)
            secs = time.perf_counter() - t
            assert len(os.listdir(os.path.join(out, "d"))) == a.objects
            print(f"copy -r of {a.objects} objects: {secs:.3f} s")
        finally:
            shutil.rmtree(out)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
