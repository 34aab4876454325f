"""Remote reads against an object-store stand-in: ferrio against obstore, fsspec, boto3, KvikIO.

The server is nginx (the OS package) on 127.0.0.1 with a private config in a temporary
directory, run in the foreground and stopped at the end. It serves one object at three paths:

- ``/open/bucket/object.bin``: no cap (the loopback rate);
- ``/capped/bucket/object.bin``: each request paced to ``--rate`` (an object store serves each
  connection at a fraction of the client's link). nginx's own ``limit_rate`` cannot do this for
  ranged reads: it grants every request one second of credit up front (``rate x (elapsed + 1)``),
  so an 8 MiB range at 100 MB/s is never slowed. The pacing is lua (Debian's
  ``libnginx-mod-http-lua``): by default (``--pacing stream``) a ``content_by_lua_block`` sends
  each reply 64 KiB at a time at the cap from its first byte, as an object store does (pieces
  under LuaJIT's 128 KiB mmap threshold: with 256 KiB ones, until session 21, every piece was a
  fresh mapping, faulted in and unmapped (perf), and on the 2-core dev VM the server then took
  ~3x the client's CPU and held the capped rate to ~2.3 GiB/s where 64 KiB pieces give ~3.1); with
  ``--pacing hold`` (sessions 1-14) an ``access_by_lua_block`` holds each request for ``length /
  rate`` seconds and nginx then sends it at once, so a request completes when a stream at the
  cap would, but its bytes arrive in one burst at the end (long ranges then end in bursts that
  collide, and a slow connection cannot be told from a fast one until its end);
- ``/slow/bucket/object.bin``: the same plus a first-byte delay (``--delay-ms``) per request.

Where the OS has no nginx (the GPU machines), a bundle of this machine's nginx, lua module and
shared libraries made by ``benchmarks/carry_nginx.sh`` runs instead, from ``.carry/nginx`` (or
``$FERRIO_BENCH_NGINX_BUNDLE``), through its own dynamic loader. Without either, or with ``--server
python``, a threaded Python server stands in, in ``--server-procs`` processes on one port,
streaming at the cap from the first byte (``os.sendfile`` in 256 KiB steps, paced), with the
same per-request delay: as an object store sends, so a slow connection shows while its body
arrives. The first line of the output says which server ran.
Path-style ``/capped/bucket/object.bin`` is also an S3 endpoint for boto3 (unsigned requests;
the server ignores authentication).

Each client reads the whole object into host memory in a fresh process; the clients alternate
in every round; the table shows medians, and two CPU times per GiB beside every rate: the
read's (every thread of the client while the clock runs) and the whole child's (rusage: start-up,
imports and the destination's first touch too; ferrio and KvikIO read into a buffer faulted in
before the clock starts, the other clients allocate theirs as they read).
Targets (the issue): ferrio at default settings reaches 0.8 x min(requests in flight x cap,
the loopback rate), 1.5 x the best peer at its defaults and 1.0 x the best peer at its best
settings; into GPU memory 0.95 x the host rate (``--gpu``, CuPy). The client
``ferrio-cudahost`` reads into host memory from a process set up as the GPU read's (CUDA's
context and the device allocation made first), to tell what the GPU read does from what a GPU
library in the process does. ``FERRIO_BENCH_SAMPLE_MS=N`` samples every thread's state for the
read's first N ms (``thread_sampler.py``; with ``--trace-dir`` the samples land in the raw
``.trace``).
``FERRIO_BENCH_IMPORT_FIRST=numpy:cupy`` (or ``ferrio-gpu@FERRIO_BENCH_IMPORT_FIRST=...``) makes
a ferrio client import those modules before ferrio, as a user's program would.

    python3 benchmarks/remote_compare.py --size 2GiB --rate 100m --delay-ms 50 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GIB = 1 << 30

# ---------------------------------------------------------------------------------------------
# Clients: each runs in a child process (`--client NAME URL SIZE`) and prints its byte count.
# ---------------------------------------------------------------------------------------------


def _host_buffer(size: int) -> Any:
    import numpy as np

    buf = np.empty(size, dtype=np.uint8)
    buf[:: 1 << 12] = 0  # touch every page, outside the timed part
    return buf


def _client(name: str, url: str, size: int) -> int:
    """Read the whole object at `url` with client `name`; return the bytes read and the time."""
    s3_key = url.split("/", 3)[3]  # capped/bucket/object.bin
    endpoint = url[: url.index("/", len("http://"))]
    if name.startswith("ferrio"):
        import importlib

        # `FERRIO_BENCH_IMPORT_FIRST=numpy:cupy`: modules imported before ferrio, as a user's
        # program would (numpy's BLAS starts threads on import).
        for module in filter(None, os.environ.get("FERRIO_BENCH_IMPORT_FIRST", "").split(":")):
            importlib.import_module(module)
        import ferrio

        # `ferrio@NAME=VALUE+NAME=VALUE` (or `ferrio-gpu@...`): ferrio with settings changed
        # (PYTHONPATH, another build of ferrio, was given to this process by `_run_client`).
        name, _, settings = name.partition("@")
        for key, value in _settings(settings):
            if not _is_env(key):
                ferrio.config.set(**{key: value})
        kw: dict[str, Any] = {}
        if name == "ferrio-64":
            kw = {"concurrency": 64}
        from thread_sampler import ThreadSampler

        sampler = ThreadSampler()
        if name in ("ferrio-gpu", "ferrio-cudahost"):
            # `ferrio-cudahost` reads into host memory from a process set up as the GPU read's
            # (CUDA's context made, the same device allocation): whether that alone slows it.
            import cupy as cp

            dst = cp.empty(size, dtype=cp.uint8)
            cp.cuda.runtime.deviceSynchronize()
        if name != "ferrio-gpu":
            dst = _host_buffer(size)
        t0 = _start()
        sampler.start()
        with ferrio.open_url(url, **kw) as f:
            n = f.read(dst)
        n = _report(n, t0)
        sampler.dump()
        return n
    if name.startswith("obstore"):
        import obstore
        from obstore.store import HTTPStore

        base, path = url.rsplit("/", 1)
        store = HTTPStore.from_url(base, client_options={"allow_http": True})
        t0 = _start()
        if name == "obstore-get_range":
            n = len(obstore.get_range(store, path, start=0, end=size))
        elif name == "obstore-get_ranges":
            step = 8 << 20
            starts = list(range(0, size, step))
            ends = [min(s + step, size) for s in starts]
            n = sum(len(b) for b in obstore.get_ranges(store, path, starts=starts, ends=ends))
        else:  # obstore-async-N: N get_range_async in flight, 8 MiB each (its best shape)
            import asyncio

            conc = int(name.rsplit("-", 1)[1])
            step = 8 << 20

            async def run() -> int:
                sem = asyncio.Semaphore(conc)

                async def one(s: int) -> int:
                    async with sem:
                        b = await obstore.get_range_async(
                            store, path, start=s, end=min(s + step, size)
                        )
                        return len(b)

                return sum(await asyncio.gather(*(one(s) for s in range(0, size, step))))

            n = asyncio.run(run())
        return _report(n, t0)
    if name.startswith("fsspec"):
        import fsspec

        fs = fsspec.filesystem("http")
        t0 = _start()
        if name == "fsspec-cat":
            n = len(fs.cat_file(url))
        else:  # fsspec-ranges: 8 MiB ranges through cat_ranges (concurrent, its batch size)
            step = 8 << 20
            starts = list(range(0, size, step))
            ends = [min(s + step, size) for s in starts]
            n = sum(len(b) for b in fs.cat_ranges([url] * len(starts), starts, ends))
        return _report(n, t0)
    if name.startswith("boto3"):
        import io

        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore import UNSIGNED
        from botocore.config import Config

        conc = None if name == "boto3" else int(name.rsplit("-", 1)[1])
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"},
                          max_pool_connections=max(conc or 10, 10)),
        )  # fmt: skip
        bucket, key = s3_key.split("/", 1)
        cfg = TransferConfig() if conc is None else TransferConfig(max_concurrency=conc)
        out = io.BytesIO()
        t0 = _start()
        client.download_fileobj(bucket, key, out, Config=cfg)
        return _report(out.getbuffer().nbytes, t0)
    if name.startswith("kvikio"):
        if name != "kvikio":  # kvikio-N: N threads in its pool (the default is 1)
            os.environ["KVIKIO_NTHREADS"] = name.rsplit("-", 1)[1]
        import kvikio

        buf = _host_buffer(size)
        t0 = _start()
        with kvikio.RemoteFile.open_http(url) as f:
            n = f.read(buf)
        return _report(n, t0)
    raise SystemExit(f"unknown client {name}")


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat; (0, 0) elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


_TICKS0 = (0, 0)
_CPU0 = 0.0


def _own_cpu() -> float:
    """CPU seconds of this process so far, all its threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _start() -> float:
    """Marks the start of the timed read: the machine's CPU ticks and this process's CPU time,
    then the clock."""
    global _TICKS0, _CPU0
    _TICKS0 = _machine_ticks()
    _CPU0 = _own_cpu()
    return time.perf_counter()


def _report(n: int, t0: float) -> int:
    seconds = time.perf_counter() - t0
    # The read's span on CLOCK_MONOTONIC too, the clock of ferrio's trace (`--trace-dir`).
    ended = time.monotonic()
    busy, total = (a - b for a, b in zip(_machine_ticks(), _TICKS0, strict=True))
    print(
        json.dumps(
            {
                "bytes": int(n),
                "seconds": seconds,
                "span": [ended - seconds, ended],
                # The CPU time of the read itself, every thread of this process: without
                # the start-up and the destination's first touch (ferrio and KvikIO read into
                # a buffer made, and faulted in, before the clock starts; the other clients
                # allocate theirs as they read).
                "read_cpu": _own_cpu() - _CPU0,
                # How busy the whole machine (server included) was during the read.
                "machine_busy": busy / total if total > 0 else float("nan"),
                # The CPUs this process may run on (a GPU library may narrow them).
                "cpus": len(os.sched_getaffinity(0)),
            }
        )
    )
    return int(n)


# What each peer needs, to skip those that are missing with a line saying so.
NEEDS = {"obstore": "obstore", "fsspec": "fsspec", "boto3": "boto3", "kvikio": "kvikio"}


def _available(name: str) -> str | None:
    """None if client `name` can run here, else why not."""
    import importlib.util

    name = name.partition("@")[0]
    mod = next((m for p, m in NEEDS.items() if name.startswith(p)), None)
    if mod is not None and importlib.util.find_spec(mod) is None:
        return f"{mod} is not installed"
    if name.startswith("fsspec") and importlib.util.find_spec("aiohttp") is None:
        return "aiohttp (fsspec's HTTP file system) is not installed"
    if name in ("ferrio-gpu", "ferrio-cudahost"):
        try:
            import cupy as cp

            if cp.cuda.runtime.getDeviceCount() < 1:
                return "no GPU"
        except Exception as e:
            return f"no usable GPU ({type(e).__name__})"
    return None


def _is_env(key: str) -> bool:
    """Whether a client's `NAME=VALUE` is an environment variable (PYTHONPATH, another build of
    ferrio; FERRIO_*) rather than a ferrio setting."""
    return key == "PYTHONPATH" or key.startswith("FERRIO_")


def _settings(text: str) -> list[tuple[str, str]]:
    """`NAME=VALUE+NAME=VALUE` as pairs."""
    return [tuple(kv.split("=", 1)) for kv in text.split("+") if kv]  # type: ignore[misc]


def _run_client(
    name: str, url: str, size: int, timeout: float, trace: Path | None = None
) -> tuple[float, float, float] | str:
    """(GiB/s, CPU-s/GiB of the read, CPU-s/GiB of the whole process) of one fresh-process
    run, or why it failed. With `trace` (a file), a ferrio client runs with FERRIO_TRACE=1 and
    its timeline, summarised, goes there."""
    env = dict(os.environ)
    env.update((k, v) for k, v in _settings(name.partition("@")[2]) if _is_env(k))
    trace = trace if name.startswith("ferrio") else None
    if trace is not None:
        env["FERRIO_TRACE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--client", name, url, str(size)],
            capture_output=True, text=True, timeout=timeout, check=False, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f}s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "no message"
        return f"failed (exit {out.returncode}): {last}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if trace is not None:
        from thread_sampler import summarise as samples
        from trace_summary import parse, summarise

        text = summarise(parse(out.stderr), got["span"])
        if "ferrio-sample" in out.stderr:
            sampled = samples(out.stderr, got["span"][0])
            text += "\nthread samples (FERRIO_BENCH_SAMPLE_MS):\n" + sampled
        trace.write_text(text + "\n")
        # The raw timeline beside it, for a closer look.
        trace.with_suffix(".trace").write_text(out.stderr)
        print(f"    trace {trace.name}: {text.splitlines()[0]}")
    if got["bytes"] != size:
        return f"read {got['bytes']} of {size} bytes"
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpus = f"; the client may run on {got['cpus']} of {os.cpu_count()} CPUs"
    narrowed = cpus if got["cpus"] != os.cpu_count() else ""
    print(f"    machine busy during the read: {got['machine_busy']:.0%}{narrowed}")
    return size / GIB / got["seconds"], got["read_cpu"] / (size / GIB), cpu / (size / GIB)


# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------

NGINX_CONF = """
worker_processes {workers};
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
{modules}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    {lua_path}
    sendfile on;
    keepalive_requests 100000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        location /open/ {{ alias {root}/; }}
        location /capped/ {{ alias {root}/; {capped} }}
        location /slow/ {{ alias {root}/; {slow} }}
        location /up/ {{ client_max_body_size 0; client_body_buffer_size 64m; {upload} }}
        location /upslow/ {{ client_max_body_size 0; client_body_buffer_size 64m; {upload_slow} }}
    }}
}}
"""

# Holds a request for (its body's length / rate + delay) seconds, then lets nginx send it.
PACE = """access_by_lua_block {
    local size, rate, delay = %d, %d, %f
    local n = size
    if ngx.req.get_method() == "HEAD" then
        n = 0
    else
        local a, b = string.match(ngx.var.http_range or "", "^bytes=(%%d+)-(%%d*)$")
        if a then
            local e = size
            if b ~= "" then e = math.min(tonumber(b) + 1, size) end
            n = math.max(e - tonumber(a), 0)
        end
    end
    ngx.sleep(delay + n / rate)
}"""

# Sends each reply itself, streamed at `rate` from its first byte (64 KiB at a time, each flushed
# and then paced), after `delay`: as an object store sends, so a slow connection shows while its
# body arrives. Ranges as nginx serves them (206 and Content-Range; 416 past the end), a fixed
# ETag and Last-Modified, HEAD with the size. A client that goes away ends the reply.
STREAM = """content_by_lua_block {
    local prefix, root, rate, delay = "%s", "%s", %d, %f
    local f = io.open(root .. string.sub(ngx.var.uri, #prefix + 1), "rb")
    if not f then return ngx.exit(ngx.HTTP_NOT_FOUND) end
    local size = f:seek("end")
    local a, e = 0, size
    ngx.header["ETag"] = '"paced-' .. size .. '"'
    ngx.header["Last-Modified"] = "Mon, 23 Nov 2026 10:00:00 GMT"
    ngx.header["Accept-Ranges"] = "bytes"
    local x, y = string.match(ngx.var.http_range or "", "^bytes=(%%d+)-(%%d*)$")
    if x then
        a = tonumber(x)
        if y ~= "" then e = math.min(tonumber(y) + 1, size) end
        if a >= size then
            f:close()
            ngx.header["Content-Range"] = "bytes */" .. size
            return ngx.exit(416)
        end
        ngx.status = 206
        ngx.header["Content-Range"] = "bytes " .. a .. "-" .. (e - 1) .. "/" .. size
    end
    ngx.header["Content-Length"] = e - a
    if ngx.req.get_method() == "HEAD" then f:close() return end
    if delay > 0 then ngx.sleep(delay) end
    f:seek("set", a)
    ngx.update_time()
    local began, sent, n = ngx.now(), 0, e - a
    while sent < n do
        local piece = f:read(math.min(65536, n - sent))
        if not piece or not ngx.print(piece) or not ngx.flush(true) then break end
        sent = sent + #piece
        ngx.update_time()
        local ahead = began + sent / rate - ngx.now()
        if ahead > 0.001 then ngx.sleep(ahead) end
    end
    f:close()
}"""

# An S3 stand-in that takes uploads under /up/BUCKET/KEY, and /upslow/ with the first-byte delay
# (remote_upload.py), and keeps nothing:
# CreateMultipartUpload, UploadPart, CompleteMultipartUpload, AbortMultipartUpload and PutObject,
# unsigned or signed (signatures are not checked). Each request's body is read and dropped, the
# request held until `length / rate` seconds after it began (a store takes each connection's
# bytes at a fraction of the client's link), plus the delay before it answers.
UPLOAD = """content_by_lua_block {
    local prefix, rate, delay = "%s", %d, %f
    ngx.update_time()
    local began = ngx.now()
    ngx.req.read_body()
    local n = tonumber(ngx.var.content_length or "0") or 0
    ngx.update_time()
    local wait = delay + n / rate - (ngx.now() - began)
    if wait > 0.001 then ngx.sleep(wait) end
    local args, m = ngx.req.get_uri_args(), ngx.req.get_method()
    local bucket, key = string.match(ngx.var.uri, "^/" .. prefix .. "/([^/]+)/(.*)$")
    local xml = '<?xml version="1.0" encoding="UTF-8"?>'
    ngx.header["Content-Type"] = "application/xml"
    if m == "POST" and args.uploads ~= nil then
        ngx.say(xml .. "<InitiateMultipartUploadResult><Bucket>" .. bucket .. "</Bucket><Key>"
            .. key .. "</Key><UploadId>u" .. ngx.now() .. "</UploadId>"
            .. "</InitiateMultipartUploadResult>")
    elseif m == "POST" and args.uploadId ~= nil then
        ngx.say(xml .. "<CompleteMultipartUploadResult><Bucket>" .. bucket .. "</Bucket><Key>"
            .. key .. "</Key><ETag>&quot;done-1&quot;</ETag></CompleteMultipartUploadResult>")
    elseif m == "PUT" then
        -- No body: botocore takes any body of a 200 to a PUT for an error.
        ngx.header["ETag"] = '"p' .. (args.partNumber or "0") .. '"'
        ngx.header["Content-Length"] = "0"
        ngx.exit(ngx.HTTP_OK)
    elseif m == "DELETE" then
        ngx.status = 204
    else
        ngx.status = 404
    end
}"""

LUA_MODULES = [
    "/usr/lib/nginx/modules/ndk_http_module.so",
    "/usr/lib/nginx/modules/ngx_http_lua_module.so",
]

# benchmarks/carry_nginx.sh's bundle: sbin/nginx, modules/, lua/ and lib/ (the loader included).
BUNDLE = Path(
    os.environ.get("FERRIO_BENCH_NGINX_BUNDLE", Path(__file__).parent.parent / ".carry/nginx")
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes] | None, log: Path | None) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"nginx exited: {log.read_text() if log else ''}")
        time.sleep(0.05)
    raise SystemExit("the server did not start listening within 20 s")


def _installed_nginx() -> bool:
    """Whether nginx and its lua module (the pacing) are installed."""
    found = shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")
    return bool(found) and all(os.path.exists(m) for m in LUA_MODULES)


def _have_nginx() -> bool:
    """Whether nginx with its lua module is installed or bundled."""
    return _installed_nginx() or (BUNDLE / "sbin/nginx").exists()


def _nginx_command() -> tuple[list[str], list[str], str]:
    """How to run nginx, the modules to load, and the lua_package_path line (bundle only)."""
    if _installed_nginx():
        return [shutil.which("nginx") or "/usr/sbin/nginx"], LUA_MODULES, ""
    lib = BUNDLE / "lib"
    cmd = [str(lib / "ld-linux-x86-64.so.2"), "--library-path", str(lib)]
    cmd.append(str(BUNDLE / "sbin/nginx"))
    modules = [str(BUNDLE / "modules" / Path(m).name) for m in LUA_MODULES]
    return cmd, modules, f'lua_package_path "{BUNDLE}/lua/?.lua;;";'


@contextlib.contextmanager
def _nginx(
    root: Path, rate: int, delay_ms: int, pacing: str = "stream"
) -> Iterator[tuple[str, str]]:
    nginx, modules, lua_path = _nginx_command()
    tmp = Path(tempfile.mkdtemp(prefix="ferrio-nginx-"))
    size = (root / "bucket" / "object.bin").stat().st_size
    if pacing == "stream":
        capped = STREAM % ("/capped", root, rate, 0.0)
        slow = STREAM % ("/slow", root, rate, delay_ms / 1000)
    else:
        capped, slow = PACE % (size, rate, 0.0), PACE % (size, rate, delay_ms / 1000)
    conf = NGINX_CONF.format(
        workers=max(2, min(8, os.cpu_count() or 2)),
        tmp=tmp,
        user="user root;" if os.geteuid() == 0 else "",
        modules="\n".join(f"load_module {m};" for m in modules),
        lua_path=lua_path,
        port=(port := _free_port()),
        root=root,
        capped=capped,
        slow=slow,
        upload=UPLOAD % ("up", rate, 0.0),
        upload_slow=UPLOAD % ("upslow", rate, delay_ms / 1000),
    )
    (tmp / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [*nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_listening(port, proc, tmp / "error.log")
        bundled = " (bundled)" if lua_path else ""
        how = f"nginx {_nginx_version(nginx)}{bundled}, each request paced to {rate} B/s (lua, "
        how += "streamed from its first byte)," if pacing == "stream" else "held, then sent),"
        how += f" slow: +{delay_ms} ms before the first byte"
        yield f"http://127.0.0.1:{port}", how
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def _nginx_version(nginx: list[str]) -> str:
    out = subprocess.run([*nginx, "-v"], capture_output=True, text=True, check=False)
    return out.stderr.strip().split("/")[-1]


class _Handler(http.server.BaseHTTPRequestHandler):
    """Range GETs of one directory, each connection capped at `rate` B/s, `delay` s per request."""

    protocol_version = "HTTP/1.1"
    root: Path
    rate: int
    delay: float

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        # A client that has what it wants may close mid-body (ferrio stops a GET whose second
        # half another GET took over): that ends the reply, quietly.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def _target(self) -> tuple[Path, int, float] | None:
        for prefix, rate, delay in [
            ("/open/", 0, 0.0), ("/capped/", self.rate, 0.0), ("/slow/", self.rate, self.delay)
        ]:  # fmt: skip
            if self.path.startswith(prefix):
                p = self.root / self.path[len(prefix) :]
                return (p, rate, delay) if p.is_file() else None
        return None

    def _head(self, status: int, length: int, size: int, extra: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", f'"{size:x}"')
        self.send_header("Last-Modified", "Mon, 23 Nov 2026 10:00:00 GMT")
        self.send_header("Accept-Ranges", "bytes")
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self) -> None:
        t = self._target()
        if t is None:
            self._head(404, 0, 0, {})
            return
        size = t[0].stat().st_size
        self._head(200, size, size, {})

    def do_GET(self) -> None:
        t = self._target()
        if t is None:
            self._head(404, 0, 0, {})
            return
        path, rate, delay = t
        size = path.stat().st_size
        start, end = 0, size
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes="):
            a, _, b = rng[len("bytes=") :].partition("-")
            start, end = int(a), min(int(b) + 1 if b else size, size)
        if delay:
            time.sleep(delay)
        if rng:
            extra = {"Content-Range": f"bytes {start}-{end - 1}/{size}"}
            self._head(206, end - start, size, extra)
        else:
            self._head(200, size, size, {})
        self.wfile.flush()
        t0, sent = time.monotonic(), 0
        with open(path, "rb") as f:
            while start + sent < end:
                n = os.sendfile(
                    self.connection.fileno(), f.fileno(), start + sent,
                    min(256 << 10, end - start - sent),
                )  # fmt: skip
                if n == 0:
                    break
                sent += n
                if rate:
                    ahead = t0 + sent / rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)


class _Server(http.server.ThreadingHTTPServer):
    # Every process of the server listens on the same port; the kernel spreads connections.
    allow_reuse_port = True
    daemon_threads = True
    request_queue_size = 256


@contextlib.contextmanager
def _python_server(
    root: Path, rate: int, delay_ms: int, procs: int = 1
) -> Iterator[tuple[str, str]]:
    handler = type("H", (_Handler,), {"root": root, "rate": rate, "delay": delay_ms / 1000})
    server = _Server(("127.0.0.1", 0), handler)
    port = server.server_port
    # More processes on the same port (SO_REUSEPORT), forked before any thread starts: one
    # interpreter's lock cannot pace 64 streams at 100 MB/s.
    children = []
    for _ in range(procs - 1):
        pid = os.fork()
        if pid == 0:
            try:
                server.server_close()
                _Server(("127.0.0.1", port), handler).serve_forever()
            finally:
                os._exit(0)
        children.append(pid)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        how = f"Python threaded server in {procs} processes (no nginx+lua), {rate} B/s per"
        how += f" request, streamed from the first byte; slow: +{delay_ms} ms before it"
        yield f"http://127.0.0.1:{port}", how
    finally:
        server.shutdown()
        server.server_close()
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------------

HOST_CLIENTS = [
    "ferrio", "ferrio-64",
    "obstore-get_range", "obstore-get_ranges", "obstore-async-32", "obstore-async-64",
    "fsspec-cat", "fsspec-ranges",
    "boto3", "boto3-32", "boto3-64",
    "kvikio", "kvikio-32",
]  # fmt: skip
DEFAULTS = {"ferrio", "obstore-get_range", "fsspec-cat", "boto3", "kvikio"}


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)


def _rate(text: str) -> int:
    """nginx's units: k and m are 1000-based here (100m = 100 MB/s)."""
    t = text.strip().lower()
    mult = {"k": 1000, "m": 1000_000}.get(t[-1], 1)
    return int(t.rstrip("km")) * mult


def _make_object(root: Path, size: int) -> Path:
    obj = root / "bucket" / "object.bin"
    obj.parent.mkdir(parents=True, exist_ok=True)
    if obj.exists() and obj.stat().st_size == size:
        return obj
    block = os.urandom(64 << 20)
    with open(obj, "wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return obj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="2GiB", help="object size (default 2GiB)")
    ap.add_argument("--rate", default="100m", help="per-connection cap, nginx units (100m)")
    ap.add_argument("--delay-ms", type=int, default=50, help="first-byte delay of /slow/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the object lives (default: a temp dir)")
    ap.add_argument("--server", choices=["auto", "nginx", "python"], default="auto")
    ap.add_argument(
        "--pacing",
        choices=["stream", "hold"],
        default="stream",
        help="nginx: stream each reply at the cap (default), or hold it for its time, then send"
        " it at once (sessions 1-14)",
    )
    ap.add_argument(
        "--server-procs",
        type=int,
        default=min(os.cpu_count() or 1, 8),
        help="processes of the Python server (default: the CPUs, at most 8)",
    )
    ap.add_argument(
        "--clients",
        default=",".join(HOST_CLIENTS),
        help="comma-separated; ferrio@NAME=VALUE (or ferrio-gpu@...) is ferrio with a setting",
    )
    ap.add_argument("--settings", default="capped,slow", help="capped, slow (comma-separated)")
    ap.add_argument("--gpu", action="store_true", help="add ferrio into GPU memory (CuPy)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per client run")
    ap.add_argument("--json", default=None, help="write every run here too")
    ap.add_argument(
        "--trace-dir",
        default=None,
        help="run ferrio's clients with FERRIO_TRACE=1 and summarise each timeline here "
        "(benchmarks/trace_summary.py); not for the rates reported",
    )
    ap.add_argument("--client", nargs=3, metavar=("NAME", "URL", "SIZE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    # A stopped run still stops its server (the `finally` blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if a.client:
        _client(a.client[0], a.client[1], int(a.client[2]))
        return
    size, rate = _size(a.size), _rate(a.rate)
    root = Path(a.dir or tempfile.mkdtemp(prefix="ferrio-remote-bench-"))
    _make_object(root, size)
    use_nginx = a.server == "nginx" or (a.server == "auto" and _have_nginx())
    if use_nginx:
        serve = functools.partial(_nginx, pacing=a.pacing)
    else:
        serve = functools.partial(_python_server, procs=a.server_procs)
    clients = [c for c in a.clients.split(",") if c]
    if a.gpu:
        clients.append("ferrio-gpu")
    runnable = []
    for c in clients:
        why = _available(c)
        if why:
            print(f"skip {c}: {why}")
        else:
            runnable.append(c)
    results: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    with serve(root, rate, a.delay_ms) as (base, how):
        print(f"server: {how}; object {size / GIB:.2f} GiB; {a.rounds} rounds; ", end="")
        print(f"{os.cpu_count()} CPUs")
        # The loopback rate: ferrio on the uncapped path (the best of its rounds).
        open_url = f"{base}/open/bucket/object.bin"
        loop = [_run_client("ferrio-64", open_url, size, a.timeout) for _ in range(a.rounds)]
        loop_rates = [r[0] for r in loop if not isinstance(r, str)]
        loopback = max(loop_rates) if loop_rates else float("nan")
        print(f"uncapped loopback (ferrio, 64 in flight): {loopback:.2f} GiB/s")
        for setting in a.settings.split(","):
            url = f"{base}/{setting}/bucket/object.bin"
            runs = results.setdefault(setting, {c: [] for c in runnable})
            for r in range(a.rounds):
                order = runnable if r % 2 == 0 else list(reversed(runnable))
                for c in order:
                    trace = None
                    if a.trace_dir:
                        safe = "".join(ch if ch.isalnum() or ch in "-_=" else "_" for ch in c)
                        trace = Path(a.trace_dir) / f"{setting}-{safe}-r{r + 1}.txt"
                        trace.parent.mkdir(parents=True, exist_ok=True)
                    got = _run_client(c, url, size, a.timeout, trace)
                    if isinstance(got, str):
                        print(f"  {setting} {c}: {got}")
                        continue
                    runs[c].append(got)
                    rate_s = f"{got[0]:.3f} GiB/s"
                    cpu_s = f"{got[1]:.2f} CPU-s/GiB ({got[2]:.2f} with the process)"
                    print(f"  {setting} round {r + 1} {c}: {rate_s}, {cpu_s}", flush=True)
    # ferrio's defaults (fewer in flight for an object of fewer ranges), read from ferrio itself
    # so the target follows a changed default.
    import ferrio.config

    range_size = int(ferrio.config.get("remote_range_size"))
    in_flight = min(int(ferrio.config.get("remote_concurrency")), -(-size // range_size))
    cap_gib = in_flight * rate / GIB
    print()
    # CPU-s/GiB of the read (every thread of the client, while the clock runs) and of the whole
    # client process (start-up, imports and faulting its destination in included).
    print("| setting | client | GiB/s (median) | CPU-s/GiB, read | CPU-s/GiB, process | runs |")
    print("|---|---|---|---|---|---|")
    for setting, runs in results.items():
        for c, rs in runs.items():
            if not rs:
                continue
            rate_m = statistics.median(r[0] for r in rs)
            cpu_m = statistics.median(r[1] for r in rs)
            whole_m = statistics.median(r[2] for r in rs)
            mark = " (default)" if c in DEFAULTS else ""
            cells = f"{rate_m:.3f} | {cpu_m:.2f} | {whole_m:.2f} | {len(rs)}"
            print(f"| {setting} | {c}{mark} | {cells} |")
    print()
    for setting, runs in results.items():
        med = {c: statistics.median(r[0] for r in rs) for c, rs in runs.items() if rs}
        if "ferrio" not in med:
            continue
        f = med["ferrio"]
        target = 0.8 * min(cap_gib, loopback)
        peers = {c: v for c, v in med.items() if not c.startswith("ferrio")}
        peers_default = [v for c, v in peers.items() if c in DEFAULTS]
        peers_best = list(peers.values())
        line = f"{setting}: ferrio {f:.3f} GiB/s vs 0.8 x min({in_flight} x cap, loopback)"
        line += f" = {target:.3f}"
        line += f" -> {f / target:.2f}x of that;"
        if peers_default:
            best = max(peers_default)
            line += f" vs best peer at defaults {best:.3f}: {f / best:.2f}x;"
        if peers_best:
            line += f" vs best peer at best {max(peers_best):.3f}: {f / max(peers_best):.2f}x;"
        if "ferrio-gpu" in med:
            line += f" GPU/host {med['ferrio-gpu'] / f:.2f}x"
        print(line)
    if a.json:
        Path(a.json).write_text(
            json.dumps({"loopback": loopback, "server": how, "size": size, "rate": rate,
                        "results": results}, indent=1)
        )  # fmt: skip
    if a.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
