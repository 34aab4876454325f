"""Remote-object read rates against servers on 127.0.0.1 (issue 17, first figures).

A range-serving HTTP server (a separate process; `os.sendfile` from a file in /dev/shm, HTTP/1.1
keep-alive, ETag) and, optionally, moto's S3 server. Reads the whole object into preallocated
host memory and prints GiB/s (best and median of --rounds) for:

  ferrio   ferrio.open_url(url, range_size=R, concurrency=C).read(buf), a sweep of R and C
  obstore  obstore.get (one stream) and get_range_async of every range, C at a time
  boto3    download_fileobj from moto, sequential (use_threads=False) and threaded (default)

No rate cap: this measures client overhead on loopback, not a network (the issue's
benchmarks/remote_compare.py with nginx rate caps is the full comparison).

    python3 benchmarks/remote_local.py --size 1GiB --rounds 3
    python3 benchmarks/remote_local.py --size 256MiB --s3      # moto + boto3 instead
    python3 benchmarks/remote_local.py --conn-rate 50MiB       # per-connection cap
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

GIB = 1 << 30


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "K": 1 << 10, "M": 1 << 20, "G": GIB}
    t = text.strip().upper()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(t)


class RangeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    path_on_disk = ""
    # Bytes per second per connection (0: no cap): object stores serve one connection at a
    # fraction of the client's bandwidth, which is why ranges go in parallel.
    conn_rate = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _head(self, status: int, length: int, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", '"bench"')
        self.send_header("Last-Modified", "Mon, 23 Nov 2026 10:00:00 GMT")
        self.send_header("Accept-Ranges", "bytes")
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head(200, os.path.getsize(self.path_on_disk), {})

    def do_GET(self) -> None:
        size = os.path.getsize(self.path_on_disk)
        start, end = 0, size
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a), min(int(b) + 1 if b else size, size)
            extra = {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
            self._head(206, end - start, extra)
        else:
            self._head(200, size, {})
        self.wfile.flush()
        step = 1 << 20 if self.conn_rate else end - start
        t0 = time.perf_counter()
        with open(self.path_on_disk, "rb") as f:
            sent = 0
            while sent < end - start:
                want = min(step, end - start - sent)
                n = os.sendfile(self.connection.fileno(), f.fileno(), start + sent, want)
                if n == 0:
                    break
                sent += n
                if self.conn_rate:
                    ahead = sent / self.conn_rate - (time.perf_counter() - t0)
                    if ahead > 0:
                        time.sleep(ahead)


def serve(path: str, port_file: str, conn_rate: int) -> None:
    RangeHandler.path_on_disk = path
    RangeHandler.conn_rate = conn_rate
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    server.daemon_threads = True
    with open(port_file, "w") as f:
        f.write(str(server.server_port))
    server.serve_forever()


def timed(fn: Callable[[], int], rounds: int, size: int) -> tuple[float, float]:
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t
        assert n == size, (n, size)
        rates.append(size / dt / GIB)
    return max(rates), statistics.median(rates)


def row(name: str, best_median: tuple[float, float]) -> None:
    print(f"{name:<48} {best_median[0]:6.2f} {best_median[1]:6.2f}", flush=True)


def bench_http(args: argparse.Namespace, url: str, size: int, buf: Any) -> None:
    import ferrio

    print(f"{'http (127.0.0.1, sendfile server)':<48} {'best':>6} {'median':>6}  GiB/s")
    default = ferrio.open_url(url)
    row("ferrio default", timed(lambda: default.read(buf), args.rounds, size))
    for r in args.range_sizes.split(","):
        for c in args.concurrency.split(","):
            f = ferrio.open_url(url, range_size=r, concurrency=int(c))
            rate = timed(lambda f=f: f.read(buf), args.rounds, size)
            row(f"ferrio range_size={r} concurrency={c}", rate)
    try:
        import obstore
        from obstore.store import HTTPStore
    except ImportError:
        print("obstore: not installed")
        return
    base, _, key = url.rpartition("/")
    store = HTTPStore.from_url(base + "/", client_options={"allow_http": True})
    view = memoryview(buf)

    def ob_get() -> int:
        n = 0
        for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
            view[n : n + len(chunk)] = chunk
            n += len(chunk)
        return n

    row("obstore get (one stream)", timed(ob_get, args.rounds, size))
    for r in args.range_sizes.split(","):
        rs = parse_size(r)
        for c in args.concurrency.split(","):
            conc = int(c)

            async def ranges(rs: int = rs, conc: int = conc) -> int:
                sem = asyncio.Semaphore(conc)

                async def one(start: int) -> int:
                    async with sem:
                        end = min(start + rs, size)
                        data = await obstore.get_range_async(store, key, start=start, end=end)
                        view[start:end] = data
                        return end - start

                got = await asyncio.gather(*(one(s) for s in range(0, size, rs)))
                return sum(got)

            row(
                f"obstore get_range_async {r} x {c} in flight",
                timed(lambda: asyncio.run(ranges()), args.rounds, size),
            )


def bench_s3(args: argparse.Namespace, data_path: str, size: int, buf: Any) -> None:
    import logging

    import boto3
    from boto3.s3.transfer import TransferConfig
    from moto.server import ThreadedMotoServer

    import ferrio

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
    )
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    s3.upload_file(data_path, "bench", "object.bin")
    print(f"{'s3 (moto server, in this process)':<48} {'best':>6} {'median':>6}  GiB/s")
    f = ferrio.open("s3://bench/object.bin")
    row("ferrio default", timed(lambda: f.read(buf), args.rounds, size))
    view = memoryview(buf)

    class Sink:
        def __init__(self) -> None:
            self.n = 0

        def write(self, b: bytes) -> int:
            view[self.n : self.n + len(b)] = b
            self.n += len(b)
            return len(b)

        def seek(self, *_: Any) -> int:  # download_fileobj with threads seeks
            raise OSError("not seekable")

    for name, cfg in [
        ("boto3 download_fileobj sequential", TransferConfig(use_threads=False)),
        ("boto3 download_fileobj threaded (default)", TransferConfig()),
    ]:

        def dl(cfg: Any = cfg) -> int:
            sink = Sink()
            s3.download_fileobj("bench", "object.bin", sink, Config=cfg)
            return sink.n

        row(name, timed(dl, args.rounds, size))
    server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--range-sizes", default="8MiB,16MiB")
    ap.add_argument("--concurrency", default="4,8,16,32")
    ap.add_argument("--s3", action="store_true", help="moto's S3 server with boto3 instead")
    ap.add_argument(
        "--conn-rate", default="0", help="cap per HTTP connection, bytes/s (e.g. 100MiB; 0: none)"
    )
    ap.add_argument(
        "--serve", nargs=3, metavar=("PATH", "PORT_FILE", "RATE"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], int(args.serve[2]))
        return
    import numpy as np

    size = parse_size(args.size)
    data_path = f"/dev/shm/ferrio-remote-bench-{os.getpid()}.bin"
    port_file = data_path + ".port"
    with open(data_path, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.write(block[: size & ((1 << 20) - 1)])
    rate = parse_size(args.conn_rate)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", data_path, port_file, str(rate)]
    )
    try:
        port = 0
        for _ in range(200):
            if os.path.exists(port_file):
                with open(port_file) as pf:
                    text = pf.read()
                if text:
                    port = int(text)
                    break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        buf = np.empty(size, dtype=np.uint8)
        buf[:] = 1  # fault the pages in before any clock starts
        cap = f"{rate / (1 << 20):.0f} MiB/s per connection" if rate else "no rate cap"
        load = os.getloadavg()[0]
        print(f"object: {size / GIB:.2f} GiB, {cap}, {os.cpu_count()} CPUs, load {load:.2f}")
        if args.s3:
            bench_s3(args, data_path, size, buf)
        else:
            bench_http(args, f"http://127.0.0.1:{port}/object.bin", size, buf)
    finally:
        server.kill()
        server.wait()
        for p in (data_path, port_file):
            if os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    main()
