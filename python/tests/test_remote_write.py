"""Writing remote objects and copying to and from URLs, against moto's S3 server on 127.0.0.1.

Uploads round-trip at every size around the part size; an upload that fails or is interrupted
leaves no object and no multipart upload behind; ferrio.copy and `ferrio cp` move files between
local paths and URLs both ways; a failed download leaves no file. A small proxy in front of moto
injects the failures a real network and a misbehaving server have (any step of an upload
refused, never answered, cut off mid-body or answered without its ETag; a completion done by
the store whose every answer is lost; GETs refused). Every case ends within a time bound.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    BOUND_S,
    PART,
    assert_downloads,
    cli,
    files_under,
    in_thread,
    interrupt_when,
    make_tree,
    remote_data,
    write_all,
    write_in_steps,
)

import ferrio

# ---------------------------------------------------------------------------------------------
# moto's S3 server, and a proxy in front of it that misbehaves on request
# ---------------------------------------------------------------------------------------------


class _Faults:
    """What the proxy does to the requests it forwards.

    `stall`, `answer`, `answer_after` and `drop` take the S3 operation a request is
    (`_operation`): CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
    AbortMultipartUpload, PutObject, ListObjectsV2, or the method (GET, HEAD).
    """

    def __init__(self) -> None:
        self.fail_parts = False  # UploadPart answers 500 (retried by the client, then fatal)
        self.stall_parts = False  # UploadPart never answers (until the test ends)
        self.deny_gets = False  # GET answers 403
        self.stall: set[str] = set()  # these read the body and never answer (until the test ends)
        # These answer the next statuses in turn instead of reaching moto, then go through.
        self.answer: dict[str, list[int]] = {}
        # These reach moto, whose answer is replaced by the next statuses in turn.
        self.answer_after: dict[str, list[int]] = {}
        # These lose the connection half-way through the body, this many times.
        self.drop: dict[str, int] = {}
        # These reach moto, whose answer is lost (the connection closed instead), this many times.
        self.lose_answer: dict[str, int] = {}
        self.strip_etag = False  # UploadPart's answer comes without its ETag
        self.on_first_part: Callable[[], None] | None = None  # run as the first UploadPart arrives
        # Run once after moto answered a request of this operation, before the answer goes on.
        self.after: dict[str, Callable[[], None]] = {}
        self.seen: dict[str, int] = {}  # requests per operation
        self.parts_seen = threading.Event()
        self.release = threading.Event()

    def next_status(self, table: dict[str, list[int]], op: str) -> int | None:
        statuses = table.get(op)
        return statuses.pop(0) if statuses else None


def _operation(command: str, path: str) -> str:
    """The S3 operation of a request."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query, keep_blank_values=True)
    if command == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if command == "POST" and "uploadId" in query:
        return "CompleteMultipartUpload"
    if command == "PUT" and "partNumber" in query:
        return "UploadPart"
    if command == "DELETE" and "uploadId" in query:
        return "AbortMultipartUpload"
    if command == "PUT":
        return "PutObject"
    if command == "GET" and "list-type" in query:
        return "ListObjectsV2"
    return command


def _proxy_handler(upstream: str, faults: _Faults) -> type[http.server.BaseHTTPRequestHandler]:
    host, port = upstream.removeprefix("http://").split(":")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _forward(self) -> None:
            op = _operation(self.command, self.path)
            n = int(self.headers.get("Content-Length") or 0)
            hook = None
            with lock:
                faults.seen[op] = faults.seen.get(op, 0) + 1
                drop = faults.drop.get(op, 0) > 0 and n > 0
                if drop:
                    faults.drop[op] -= 1
                if op == "UploadPart":
                    hook, faults.on_first_part = faults.on_first_part, None
            if hook:
                hook()
            if drop:
                self.rfile.read(n // 2)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            body = self.rfile.read(n) if n else b""
            if op in faults.stall:
                faults.release.wait(BOUND_S)
                self.close_connection = True
                return
            with lock:
                status = faults.next_status(faults.answer, op)
            if status is not None:
                self._reply(status)
                return
            is_part = op == "UploadPart"
            if is_part:
                faults.parts_seen.set()
                if faults.stall_parts:
                    faults.release.wait(BOUND_S)
                    return
                if faults.fail_parts:
                    self._reply(500)
                    return
            if self.command == "GET" and faults.deny_gets and "Range" in self.headers:
                self._reply(403)
                return
            conn = http.client.HTTPConnection(host, int(port), timeout=BOUND_S)
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in ("content-length", "connection"):
                        conn.putheader(k, v)
                conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                resp = conn.getresponse()
                data = resp.read()
                with lock:
                    lose = faults.lose_answer.get(op, 0) > 0
                    if lose:
                        faults.lose_answer[op] -= 1
                if lose:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                with lock:
                    after = faults.after.pop(op, None)
                if after:
                    after()
                with lock:
                    status = faults.next_status(faults.answer_after, op)
                if status is not None:
                    self._reply(status)
                    return
                self.send_response(resp.status)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                skip = ["content-length", "transfer-encoding", "connection"]
                if is_part and faults.strip_etag:
                    skip.append("etag")
                for k, v in resp.getheaders():
                    if k.lower() not in skip:
                        self.send_header(k, v)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 client on moto with a fresh bucket; ferrio talks to moto through a proxy
    (`s3.faults` says how it misbehaves)."""
    boto3 = pytest.importorskip("boto3")
    faults = _Faults()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _proxy_handler(moto_endpoint, faults))
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    for k in list(os.environ):
        if k.startswith("AWS_") or k.startswith("FERRIO_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"ferrio-w-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    client.create_bucket(Bucket=bucket)
    client.ferrio_bucket = bucket
    client.faults = faults
    try:
        yield client
    finally:
        faults.release.set()
        proxy.shutdown()
        proxy.server_close()


def _get(s3: Any, key: str, bucket: str | None = None) -> bytes | None:
    try:
        got = s3.get_object(Bucket=bucket or s3.ferrio_bucket, Key=key)
    except s3.exceptions.NoSuchKey:
        return None
    body: bytes = got["Body"].read()
    return body


def _uploads(s3: Any, bucket: str | None = None) -> list[Any]:
    listed = s3.list_multipart_uploads(Bucket=bucket or s3.ferrio_bucket)
    uploads: list[Any] = listed.get("Uploads", [])
    return uploads


# ---------------------------------------------------------------------------------------------
# ferrio.open(url, "w")
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, 3 * PART + 12345])
def test_upload_round_trip(s3: Any, size: int) -> None:
    data = remote_data(size, seed=size)
    key = f"up/{size}.bin"
    url = f"s3://{s3.ferrio_bucket}/{key}"

    def nothing_visible() -> None:
        assert _get(s3, key) is None

    write_in_steps(url, data, nothing_visible)
    assert _get(s3, key) == data
    assert _uploads(s3) == []
    with ferrio.open(url) as f:
        buf = bytearray(f.size)
        assert f.read(buf) == size
        assert bytes(buf) == data


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_inside_with_leaves_nothing(s3: Any, exc: type[BaseException]) -> None:
    url = f"s3://{s3.ferrio_bucket}/aborted.bin"
    data = remote_data(3 * PART, seed=7)

    def upload() -> None:
        with ferrio.open(url, "w") as w:
            w.write(data)
            assert _uploads(s3) != []  # parts went up: there is an upload to abort
            raise exc("stop")

    with pytest.raises(exc):
        in_thread(upload)
    assert _get(s3, "aborted.bin") is None
    assert _uploads(s3) == []


def test_ctrl_c_while_write_waits_for_a_part_aborts_at_once(s3: Any, python_sigint: None) -> None:
    # One part in flight, and it never finishes: the next write() waits for it. Ctrl-C there
    # must abort the upload and raise at once, not when the stalled part gives up.
    s3.faults.stall_parts = True
    url = f"s3://{s3.ferrio_bucket}/interrupted.bin"
    w = ferrio.open_url(url, "w", range_size="5MiB", concurrency=1)
    sent_at: list[float] = []

    def interrupt() -> None:
        if s3.faults.parts_seen.wait(BOUND_S):
            time.sleep(0.3)
            sent_at.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        w.write(remote_data(3 * PART, seed=16))
    took = time.monotonic() - sent_at[0]
    assert took < 2.0, f"KeyboardInterrupt took {took:.2f} s after SIGINT"
    with pytest.raises(ValueError):  # the upload is gone: nothing more can be written
        w.write(b"more")
    w.abort()
    assert _get(s3, "interrupted.bin") is None
    assert _uploads(s3) == []


def test_a_forked_child_cannot_touch_the_parents_upload(s3: Any) -> None:
    url = f"s3://{s3.ferrio_bucket}/forked.bin"
    data = remote_data(2 * PART + 7, seed=17)
    w = ferrio.open_url(url, "w", range_size="5MiB")
    w.write(data[: PART + 3])  # one part went up: the upload exists
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                w.write(b"x")
            except ValueError as e:
                code = 0 if "forked child" in str(e) else 2
            del w  # letting go of the parent's upload here must neither hang nor abort it
        finally:
            os._exit(code)
    deadline = time.monotonic() + BOUND_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's upload is untouched and completes.
    w.write(data[PART + 3 :])
    in_thread(w.close)
    assert _get(s3, "forked.bin") == data


_CONCURRENT_WRITES = r"""
import os, socket, sys, threading
from moto.server import ThreadedMotoServer
import boto3, ferrio
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False); server.start()
os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ALLOW_HTTP="true",
                  AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                  AWS_REGION="us-east-1")
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
s3.create_bucket(Bucket="ferrio-conc")
ferrio.config.set(remote_concurrency=1)
w = ferrio.open("s3://ferrio-conc/k", "w")
chunks = [bytes([i]) * (24 << 20) for i in range(3)]
threads = [threading.Thread(target=w.write, args=(c,)) for c in chunks]
for t in threads: t.start()
for t in threads: t.join()
w.close()
print(s3.head_object(Bucket="ferrio-conc", Key="k")["ContentLength"])
server.stop()
"""


def test_writes_from_several_threads_do_not_hold_the_gil_while_they_wait() -> None:
    """Two threads writing one upload at once: the second waited for the first with the GIL
    held, so a store served from the same process (moto, here) could never answer and every
    Python thread stopped. Run in a child process, so that a regression is a timeout here."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("boto3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FERRIO_"))}
    out = subprocess.run(
        [sys.executable, "-c", _CONCURRENT_WRITES],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == str(3 * (24 << 20))


def test_explicit_abort_and_use_after_close(s3: Any) -> None:
    url = f"s3://{s3.ferrio_bucket}/abort.bin"
    w = ferrio.open_url(url, "w", range_size="5MiB")
    w.write(remote_data(2 * PART + 1, seed=8))
    in_thread(w.abort)
    assert w.closed
    with pytest.raises(ValueError):
        w.write(b"more")
    assert _get(s3, "abort.bin") is None
    assert _uploads(s3) == []


def test_failing_part_leaves_nothing(s3: Any) -> None:
    s3.faults.fail_parts = True
    url = f"s3://{s3.ferrio_bucket}/failed.bin"

    def upload() -> None:
        with ferrio.open_url(url, "w", range_size="5MiB") as w:
            w.write(remote_data(3 * PART, seed=9))

    with pytest.raises(OSError) as e:
        in_thread(upload)
    assert e.value.filename == url
    assert _get(s3, "failed.bin") is None
    assert _uploads(s3) == []


# Small request budgets, so that a server that never answers fails the call in a few seconds:
# each request may take 1 s, and is tried twice within 2 s.
FAST_FAIL = {"remote_timeout": "1s", "remote_retries": 1, "remote_retry_timeout": "2s"}
FAST_FAIL_S = 6.0  # the budget above, with room for the backoff, the abort and a slow machine


@pytest.mark.parametrize(
    ("op", "size"),
    [
        ("CreateMultipartUpload", 2 * PART),
        ("UploadPart", PART + 5),
        ("CompleteMultipartUpload", PART + 5),
        ("PutObject", 100),
    ],
)
def test_a_server_that_never_answers_is_a_timeout_error_in_time(
    s3: Any, op: str, size: int
) -> None:
    s3.faults.stall.add(op)
    url = f"s3://{s3.ferrio_bucket}/stalled.bin"
    with ferrio.config.set(**FAST_FAIL):
        w = ferrio.open_url(url, "w", range_size="5MiB", concurrency=1)

    def upload() -> None:
        w.write(remote_data(size, seed=40))
        w.close()

    started = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        in_thread(upload)
    took = time.monotonic() - started
    assert took < FAST_FAIL_S, f"{op}: failed after {took:.1f} s"
    assert e.value.filename == url
    assert "remote_timeout" in str(e.value)
    assert s3.faults.seen[op] == 2  # tried, and tried once more (the first part, for UploadPart)
    with pytest.raises(ValueError):  # the upload is gone
        w.write(b"x")
    assert _get(s3, "stalled.bin") is None
    assert _uploads(s3) == []


def test_an_abort_that_never_answers_fails_in_time(s3: Any) -> None:
    s3.faults.stall.add("AbortMultipartUpload")
    url = f"s3://{s3.ferrio_bucket}/abort-stalled.bin"
    with ferrio.config.set(**FAST_FAIL):
        w = ferrio.open_url(url, "w", range_size="5MiB", concurrency=1)
    w.write(remote_data(PART + 5, seed=41))
    started = time.monotonic()
    with pytest.raises(TimeoutError) as e:
        in_thread(w.abort)
    assert time.monotonic() - started < FAST_FAIL_S
    assert e.value.filename == url
    assert w.closed
    # The store never heard of the abort: the upload is left for the bucket's lifecycle rules.
    assert len(_uploads(s3)) == 1
    assert _get(s3, "abort-stalled.bin") is None

    # A part that fails while the abort cannot be made: the part's error is the one raised,
    # and it says that the parts uploaded stay stored.
    s3.faults.fail_parts = True
    with ferrio.config.set(**FAST_FAIL):
        w = ferrio.open_url(url, "w", range_size="5MiB", concurrency=1)
    started = time.monotonic()
    with pytest.raises(OSError) as e:
        in_thread(lambda: w.write(remote_data(3 * PART, seed=42)))
    assert time.monotonic() - started < FAST_FAIL_S
    assert not isinstance(e.value, TimeoutError) and "500" in str(e.value)
    assert "aborting the upload failed too" in str(e.value), e.value
    assert _get(s3, "abort-stalled.bin") is None


@pytest.mark.parametrize("status", [500, 503])
def test_a_completion_refused_once_is_retried(s3: Any, status: int) -> None:
    s3.faults.answer["CompleteMultipartUpload"] = [status]
    data = remote_data(2 * PART + 5, seed=43)
    url = f"s3://{s3.ferrio_bucket}/complete-retried.bin"
    in_thread(lambda: write_all(url, data))
    assert s3.faults.seen["CompleteMultipartUpload"] == 2
    assert _get(s3, "complete-retried.bin") == data
    assert _uploads(s3) == []


def test_a_completion_whose_answer_is_lost_is_retried(s3: Any) -> None:
    # The store completed the object, but its answer never came back: asked again, it says so.
    s3.faults.answer_after["CompleteMultipartUpload"] = [500]
    data = remote_data(2 * PART + 5, seed=44)
    url = f"s3://{s3.ferrio_bucket}/complete-lost.bin"
    in_thread(lambda: write_all(url, data))
    assert _get(s3, "complete-lost.bin") == data
    assert _uploads(s3) == []


def test_a_completion_done_but_every_answer_lost_is_a_success(s3: Any) -> None:
    # The store completed the object, but no answer came back, the retry's neither: a HEAD
    # finds an object of the size written, with another ETag than the object of that size that
    # was there when the upload began, so it is this upload's.
    data = remote_data(2 * PART + 5, seed=47)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="lost.bin", Body=remote_data(len(data), seed=7))
    s3.faults.lose_answer["CompleteMultipartUpload"] = 100
    url = f"s3://{s3.ferrio_bucket}/lost.bin"
    with ferrio.config.set(**FAST_FAIL):
        in_thread(lambda: write_all(url, data))
    assert s3.faults.seen["CompleteMultipartUpload"] == 2
    assert _get(s3, "lost.bin") == data
    assert _uploads(s3) == []


def test_a_completion_never_done_is_an_error_despite_an_object_of_that_size(s3: Any) -> None:
    # The completion never reaches the store: the object of the size written that is there is
    # the one that was there before (its ETag), so the upload failed, and it is left alone.
    data = remote_data(2 * PART + 5, seed=48)
    old = remote_data(len(data), seed=8)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="never.bin", Body=old)
    s3.faults.drop["CompleteMultipartUpload"] = 100
    url = f"s3://{s3.ferrio_bucket}/never.bin"
    with ferrio.config.set(**FAST_FAIL), pytest.raises(OSError) as e:
        in_thread(lambda: write_all(url, data))
    assert e.value.filename == url
    assert s3.faults.seen["CompleteMultipartUpload"] == 2
    assert _get(s3, "never.bin") == old
    assert _uploads(s3) == []


def test_a_small_put_done_but_every_answer_lost_says_the_outcome_is_unknown(s3: Any) -> None:
    # An object of one part goes up in one PUT. The store made it, but no answer came back:
    # with no ETag known from before, the error must not claim that the old object is intact.
    data = remote_data(1000, seed=49)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="put-lost.bin", Body=remote_data(1000, seed=9))
    s3.faults.lose_answer["PutObject"] = 100
    url = f"s3://{s3.ferrio_bucket}/put-lost.bin"
    with ferrio.config.set(**FAST_FAIL), pytest.raises(OSError) as e:
        in_thread(lambda: write_all(url, data))
    assert e.value.filename == url
    assert "whether this upload's object now exists is unknown" in str(e.value), e.value
    assert _get(s3, "put-lost.bin") == data
    # Of another size than what was there, the object found is not this write's: the error
    # stands as it is.
    s3.faults.lose_answer.clear()
    s3.faults.drop["PutObject"] = 100
    with ferrio.config.set(**FAST_FAIL), pytest.raises(OSError) as e:
        in_thread(lambda: write_all(url, remote_data(10, seed=50)))
    assert "unknown" not in str(e.value), e.value
    assert _get(s3, "put-lost.bin") == data


def test_a_completion_always_refused_leaves_nothing(s3: Any) -> None:
    s3.faults.answer["CompleteMultipartUpload"] = [503] * 10
    url = f"s3://{s3.ferrio_bucket}/complete-refused.bin"
    with ferrio.config.set(**FAST_FAIL), pytest.raises(OSError) as e:
        in_thread(lambda: write_all(url, remote_data(2 * PART + 5, seed=45)))
    assert e.value.filename == url and "503" in str(e.value)
    assert s3.faults.seen["CompleteMultipartUpload"] == 2
    assert _get(s3, "complete-refused.bin") is None
    assert _uploads(s3) == []


def test_a_connection_lost_mid_part(s3: Any) -> None:
    # Once: the part is sent again, and the object is whole.
    s3.faults.drop["UploadPart"] = 1
    data = remote_data(2 * PART + 5, seed=46)
    url = f"s3://{s3.ferrio_bucket}/dropped.bin"
    in_thread(lambda: write_all(url, data))
    assert s3.faults.seen["UploadPart"] == 4
    assert _get(s3, "dropped.bin") == data
    # Every time: an error naming the URL, and nothing left.
    s3.faults.drop["UploadPart"] = 100
    with ferrio.config.set(**FAST_FAIL), pytest.raises(OSError) as e:
        in_thread(lambda: write_all(url + ".2", data))
    assert e.value.filename == url + ".2"
    assert _get(s3, "dropped.bin.2") is None
    assert _uploads(s3) == []


def test_a_part_answered_without_its_etag_leaves_nothing(s3: Any) -> None:
    s3.faults.strip_etag = True
    url = f"s3://{s3.ferrio_bucket}/no-etag.bin"
    with pytest.raises(OSError, match="ETag") as e:
        in_thread(lambda: write_all(url, remote_data(2 * PART + 5, seed=47)))
    assert e.value.filename == url
    assert _get(s3, "no-etag.bin") is None
    assert _uploads(s3) == []


@pytest.mark.parametrize(("op", "size"), [("CreateMultipartUpload", PART), ("PutObject", 10)])
def test_a_refused_upload_is_permission_error(s3: Any, op: str, size: int) -> None:
    s3.faults.answer[op] = [403]
    url = f"s3://{s3.ferrio_bucket}/denied.bin"
    with pytest.raises(PermissionError) as e:
        in_thread(lambda: write_all(url, remote_data(size, seed=48)))
    assert e.value.filename == url
    assert s3.faults.seen[op] == 1  # not retried
    assert _get(s3, "denied.bin") is None
    assert _uploads(s3) == []


def test_calls_after_close_and_after_an_error(s3: Any) -> None:
    url = f"s3://{s3.ferrio_bucket}/closed.bin"
    w = ferrio.open_url(url, "w", range_size="5MiB")
    w.write(b"abc")
    in_thread(w.close)
    in_thread(w.close)  # a second close does nothing
    in_thread(w.abort)  # nor does an abort: the object stays
    with pytest.raises(ValueError):
        w.write(b"more")
    with pytest.raises(ValueError):
        w.tell()
    assert _get(s3, "closed.bin") == b"abc"

    # A write that failed: close says the upload is gone (it does not pretend to complete it);
    # then the writer is closed, and closing or aborting again does nothing.
    s3.faults.fail_parts = True
    with ferrio.config.set(remote_retries=0):
        w = ferrio.open_url(url + ".failed", "w", range_size="5MiB", concurrency=1)
    with pytest.raises(OSError):
        in_thread(lambda: w.write(remote_data(3 * PART, seed=49)))
    with pytest.raises(ValueError, match="aborted"):
        in_thread(w.close)
    assert w.closed
    in_thread(w.close)
    in_thread(w.abort)
    with pytest.raises(ValueError):
        w.write(b"more")
    assert _get(s3, "closed.bin.failed") is None
    assert _uploads(s3) == []


def test_a_writer_dropped_in_a_thread_with_parts_in_flight_aborts_promptly(s3: Any) -> None:
    # The abort on drop is a request to the store: it must not hold the GIL (this test's own
    # proxy, a Python thread, could not answer it) nor wait for the parts in flight.
    s3.faults.stall_parts = True
    url = f"s3://{s3.ferrio_bucket}/dropped-writer.bin"
    took: list[float] = []

    def drop_it() -> None:
        with ferrio.config.set(remote_timeout="10s", remote_retries=0):
            w = ferrio.open_url(url, "w", range_size="5MiB", concurrency=4)
        w.write(remote_data(3 * PART + 5, seed=50))
        assert s3.faults.parts_seen.wait(BOUND_S)
        started = time.monotonic()
        with pytest.warns(ResourceWarning, match="unclosed writer for s3://.*aborted"):
            del w
        took.append(time.monotonic() - started)

    in_thread(drop_it)
    assert took[0] < 5.0, f"dropping the writer took {took[0]:.1f} s"
    assert s3.faults.seen["AbortMultipartUpload"] == 1
    assert _get(s3, "dropped-writer.bin") is None
    assert _uploads(s3) == []


def test_write_to_missing_bucket_is_file_not_found(s3: Any) -> None:
    url = "s3://no-such-bucket-ferrio/x.bin"
    with pytest.raises(FileNotFoundError) as e, ferrio.open(url, "w") as w:
        w.write(b"hello")
    assert e.value.filename == url
    # What is missing is the bucket: no object needs to exist for a write.
    assert "no such bucket" in str(e.value), e.value
    # The failure came completing the object, a call that asked for no bytes: the message
    # gives no offset (it said "at offset 5, 0 bytes").
    assert "(write)" in str(e.value) and "offset" not in str(e.value), e.value


def test_http_urls_and_bad_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="read-only"):
        ferrio.open("https://example.com/object.bin", "w")
    with pytest.raises(ValueError, match="read-only"):
        ferrio.open_url("http://127.0.0.1:9/object.bin", "w")
    with pytest.raises(ValueError, match='not "a"'):
        ferrio.open("s3://bucket/key", "a")
    with pytest.raises(ValueError):
        ferrio.open("s3://bucket-only", "w")


# ---------------------------------------------------------------------------------------------
# ferrio.copy and ferrio cp with URLs
# ---------------------------------------------------------------------------------------------


def test_copy_local_to_s3_and_back(s3: Any, tmp_path: Path) -> None:
    data = remote_data(2 * PART + 999, seed=11)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    url = f"s3://{s3.ferrio_bucket}/copied/src.bin"
    report = in_thread(lambda: ferrio.copy(str(src), url))
    assert report["files"] == 1 and report["bytes"] == len(data)
    assert _get(s3, "copied/src.bin") == data

    # Into a prefix: named after the source.
    in_thread(lambda: ferrio.copy(src, f"s3://{s3.ferrio_bucket}/prefix/"))
    assert _get(s3, "prefix/src.bin") == data

    # To a file, and into a directory: named after the key.
    assert_downloads(url, data, tmp_path, "src.bin")


def test_download_writes_through_a_symlink_as_a_local_copy_does(s3: Any, tmp_path: Path) -> None:
    data = remote_data(PART + 7, seed=14)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="linked.bin", Body=data)
    url = f"s3://{s3.ferrio_bucket}/linked.bin"
    target = tmp_path / "target.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    in_thread(lambda: ferrio.copy(url, link))
    assert link.is_symlink() and target.read_bytes() == data
    # As `cp`: a dangling symlink is not followed into a new file.
    dangling = tmp_path / "dangling.bin"
    dangling.symlink_to(tmp_path / "nowhere.bin")
    with pytest.raises(OSError, match="dangling"):
        in_thread(lambda: ferrio.copy(url, dangling))
    assert not (tmp_path / "nowhere.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.bin", "link.bin", "target.bin"]


@pytest.mark.parametrize("change", ["shrink", "grow", "rewrite"])
def test_copy_of_a_file_written_during_its_upload_is_refused(
    s3: Any, tmp_path: Path, change: str
) -> None:
    """A file that changes while it is uploaded would go up as a mix of its old and new bytes
    (or a prefix of what it became): the copy fails naming the file, and creates no object."""
    src = tmp_path / "changing.bin"
    src.write_bytes(remote_data(4 * PART, seed=51))

    def change_it() -> None:
        time.sleep(0.05)  # a modification time other than the one the copy started with
        if change == "shrink":
            os.truncate(src, PART + 7)
        elif change == "grow":
            with src.open("ab") as f:
                f.write(b"appended")
        else:
            with src.open("r+b") as f:  # the same size, other bytes
                f.write(remote_data(4 * PART, seed=52))

    # One part at a time: the parts after the first are read after the file changed.
    s3.faults.on_first_part = change_it
    url = f"s3://{s3.ferrio_bucket}/changing.bin"
    settings = {"remote_concurrency": 1, "remote_range_size": "5MiB"}
    with ferrio.config.set(**settings), pytest.raises(OSError) as e:
        in_thread(lambda: ferrio.copy(src, url))
    assert e.value.filename == str(src), e.value
    assert ("shrank" if change == "shrink" else "changed") in str(e.value)
    assert _get(s3, "changing.bin") is None
    assert _uploads(s3) == []
    # A file left alone is copied whole.
    with ferrio.config.set(**settings):
        in_thread(lambda: ferrio.copy(src, url))
    assert _get(s3, "changing.bin") == src.read_bytes()


def test_copy_s3_to_s3_same_and_other_bucket(s3: Any) -> None:
    data = remote_data(PART + 5, seed=12)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="a.bin", Body=data)
    src = f"s3://{s3.ferrio_bucket}/a.bin"
    in_thread(lambda: ferrio.copy(src, f"s3://{s3.ferrio_bucket}/b.bin"))
    assert _get(s3, "b.bin") == data
    other = s3.ferrio_bucket + "-2"
    s3.create_bucket(Bucket=other)
    in_thread(lambda: ferrio.copy(src, f"s3://{other}/c.bin"))
    assert _get(s3, "c.bin", bucket=other) == data


def test_failed_download_leaves_no_file(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=s3.ferrio_bucket, Key="d.bin", Body=remote_data(PART, seed=13))
    s3.faults.deny_gets = True
    dst = tmp_path / "d.bin"
    with pytest.raises(PermissionError):
        in_thread(lambda: ferrio.copy(f"s3://{s3.ferrio_bucket}/d.bin", dst))
    assert list(tmp_path.iterdir()) == []


def test_download_onto_a_directory_is_refused_before_any_byte_moves(
    s3: Any, tmp_path: Path
) -> None:
    """As a local copy refuses it: before, the whole object was fetched into a temporary file
    and only the rename into place failed."""
    s3.put_object(Bucket=s3.ferrio_bucket, Key="o.bin", Body=remote_data(PART, seed=16))
    # Into the directory `o.bin` the copy is `o.bin/o.bin`, a directory too; in `d` it is
    # `d/o.bin`, a symlink to that directory.
    blocked = (tmp_path / "o.bin" / "o.bin").resolve()
    blocked.mkdir(parents=True)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "o.bin").symlink_to(blocked)
    url = f"s3://{s3.ferrio_bucket}/o.bin"
    for dst in [tmp_path / "o.bin", tmp_path / "d"]:
        with pytest.raises(IsADirectoryError) as e:
            in_thread(lambda: ferrio.copy(url, dst))  # noqa: B023
        assert e.value.filename == str(blocked)
    assert s3.faults.seen.get("GET", 0) == 0
    assert list(blocked.iterdir()) == []
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["o.bin"]


def test_copy_missing_and_not_recursive(s3: Any, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ferrio.copy(f"s3://{s3.ferrio_bucket}/missing.bin", tmp_path / "x")
    (tmp_path / "tree").mkdir()
    # A local directory without recursive, as shutil.copy raises it.
    with pytest.raises(IsADirectoryError, match="recursive"):
        ferrio.copy(tmp_path / "tree", f"s3://{s3.ferrio_bucket}/tree/")
    with pytest.raises(ValueError, match="recursive"):
        ferrio.copy(f"s3://{s3.ferrio_bucket}/tree/", tmp_path / "out")
    # A prefix named without its '/' is no object either; it said "no such object", where `cp`
    # says of a directory that it needs -r.
    s3.put_object(Bucket=s3.ferrio_bucket, Key="pre/fix/a.bin", Body=b"a")
    for prefix in ("pre", "pre/fix"):
        with pytest.raises(ValueError, match=r"is a prefix: copy it with recursive"):
            ferrio.copy(f"s3://{s3.ferrio_bucket}/{prefix}", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        ferrio.copy(f"s3://{s3.ferrio_bucket}/pre/fi", tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]


# ---------------------------------------------------------------------------------------------
# recursive copies with URLs
# ---------------------------------------------------------------------------------------------


def _keys(s3: Any, prefix: str) -> list[str]:
    listed = s3.list_objects_v2(Bucket=s3.ferrio_bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_copy_names_keys_and_files_as_the_user_means(s3: Any, tmp_path: Path) -> None:
    # A bucket without its '/' is the bucket's root, as `aws s3 cp` takes it.
    (tmp_path / "up.bin").write_bytes(b"up")
    in_thread(lambda: ferrio.copy(tmp_path / "up.bin", f"s3://{s3.ferrio_bucket}"))
    assert _get(s3, "up.bin") == b"up"
    # A key written percent-encoded is copied under its own last name, decoded.
    s3.put_object(Bucket=s3.ferrio_bucket, Key="d/h#x ü.bin", Body=b"h")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="t/q?x.bin", Body=b"q")
    down = tmp_path / "down"
    down.mkdir()
    for url in ("d/h%23x%20%C3%BC.bin", "t%2Fq%3Fx.bin"):
        in_thread(lambda u=url: ferrio.copy(f"s3://{s3.ferrio_bucket}/{u}", down))
        url_copy = f"s3://{s3.ferrio_bucket}/{url}"
        in_thread(lambda u=url_copy: ferrio.copy(u, f"s3://{s3.ferrio_bucket}/copies/"))
    assert sorted(p.name for p in down.iterdir()) == ["h#x ü.bin", "q?x.bin"]
    assert _keys(s3, "copies/") == ["copies/h#x ü.bin", "copies/q?x.bin"]


def test_copy_tree_up_and_down(s3: Any, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    files = make_tree(src)
    url = f"s3://{s3.ferrio_bucket}/up/tree/"
    report = in_thread(lambda: ferrio.copy(src, url, recursive=True))
    assert report["files"] == len(files)
    assert report["bytes"] == sum(len(d) for d in files.values())
    assert _keys(s3, "up/") == sorted(f"up/tree/{rel}" for rel in files)
    for rel, data in files.items():
        assert _get(s3, f"up/tree/{rel}") == data
    assert _uploads(s3) == []

    # Into a directory that does not exist: the prefix's contents become it (cp -r's rule),
    # and the prefix may be named without its trailing slash.
    out = tmp_path / "out"
    report = in_thread(lambda: ferrio.copy(url.rstrip("/"), out, recursive=True))
    assert report["files"] == len(files)
    assert files_under(out) == files
    # Into a directory that exists: the tree goes inside it by name.
    in_thread(lambda: ferrio.copy(url, out, recursive=True))
    assert files_under(out / "tree") == files
    assert not [p for p in tmp_path.rglob("*") if ".ferrio-" in p.name]


def test_copy_empty_tree_and_missing_prefix(s3: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "nested").mkdir(parents=True)
    report = in_thread(lambda: ferrio.copy(empty, f"s3://{s3.ferrio_bucket}/e/", recursive=True))
    assert report["files"] == 0
    assert _keys(s3, "e/") == []
    url = f"s3://{s3.ferrio_bucket}/e/"
    with pytest.raises(FileNotFoundError) as e:
        in_thread(lambda: ferrio.copy(url, tmp_path / "down", recursive=True))
    assert e.value.filename == url
    assert not (tmp_path / "down").exists()


def test_copy_prefix_with_directory_markers(s3: Any, tmp_path: Path) -> None:
    """Folders made in a console are empty keys `dir/`: one with keys under it is no file, and
    one with nothing under it downloads as an empty directory, not an error or an empty file."""
    s3.put_object(Bucket=s3.ferrio_bucket, Key="m/empty/", Body=b"")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="m/full/", Body=b"")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="m/full/a.bin", Body=b"abc")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="m/zero.bin", Body=b"")
    out = tmp_path / "out"
    report = in_thread(lambda: ferrio.copy(f"s3://{s3.ferrio_bucket}/m/", out, recursive=True))
    # Directories count as in a local tree copy: the root, `full` (made once, though both its
    # marker and its object ask for it) and `empty`.
    assert report["files"] == 2 and report["dirs"] == 3
    assert (out / "empty").is_dir() and list((out / "empty").iterdir()) == []
    assert (out / "full" / "a.bin").read_bytes() == b"abc"
    assert (out / "zero.bin").is_file() and (out / "zero.bin").stat().st_size == 0


def test_copy_prefix_where_a_directory_cannot_be_made(s3: Any, tmp_path: Path) -> None:
    """A file where the download needs a directory fails that directory once, and only the
    objects under it: the rest of the tree is copied."""
    for key, body in [("t/ok/a.bin", b"a"), ("t/blocked/b.bin", b"b"), ("t/blocked/c/d.bin", b"d")]:
        s3.put_object(Bucket=s3.ferrio_bucket, Key=key, Body=body)
    # Into an existing directory the tree lands under its own name, `t`, as with `cp -r`.
    into = tmp_path / "into"
    out = into / "t"
    out.mkdir(parents=True)
    (out / "blocked").write_bytes(b"a file, not a directory")
    with pytest.raises(OSError) as e:
        in_thread(lambda: ferrio.copy(f"s3://{s3.ferrio_bucket}/t/", into, recursive=True))
    assert "blocked" in str(e.value)
    assert (out / "ok" / "a.bin").read_bytes() == b"a"
    assert (out / "blocked").read_bytes() == b"a file, not a directory"
    assert sorted(p.name for p in out.iterdir()) == ["blocked", "ok"]


def test_copy_prefix_with_escaping_key_is_refused(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=s3.ferrio_bucket, Key="evil/ok.bin", Body=b"fine")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="evil/../../escaped.bin", Body=b"bad")
    assert "evil/../../escaped.bin" in _keys(s3, "evil/")
    out = tmp_path / "inner" / "out"
    out.parent.mkdir()
    url = f"s3://{s3.ferrio_bucket}/evil/"
    with pytest.raises(ValueError, match="not a safe relative path"):
        in_thread(lambda: ferrio.copy(url, out, recursive=True))
    # Nothing at all was written: not the safe key either, and nothing outside.
    assert list(tmp_path.rglob("*")) == [out.parent]


def test_copy_tree_upload_failing_mid_way_leaves_no_partial_object(s3: Any, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "big.bin").write_bytes(remote_data(3 * PART, seed=23))
    (src / "sub" / "small.bin").write_bytes(b"small")
    (src / "dangling").symlink_to(tmp_path / "nowhere")
    s3.faults.fail_parts = True
    url = f"s3://{s3.ferrio_bucket}/fail/"
    env = {"FERRIO_REMOTE_RANGE_SIZE": "5MiB", "FERRIO_REMOTE_RETRIES": "0"}
    with pytest.raises(OSError):
        in_thread(lambda: ferrio.copy(src, url, recursive=True))
    # The multipart upload of the big file was aborted; the small one (one PUT) is whole.
    assert _get(s3, "fail/big.bin") is None
    assert _uploads(s3) == []
    assert _keys(s3, "fail/") == ["fail/sub/small.bin"]
    # The same through the CLI: one line per failed file, exit status 1.
    out = subprocess.run(
        cli("cp", "-r", str(src), url, "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
        env=dict(os.environ, **env),
    )
    assert out.returncode == 1, out.stderr
    summary = json.loads(out.stdout)
    assert summary["files"] == 1
    failed = sorted(Path(e["path"]).name for e in summary["errors"])
    assert failed == ["big.bin", "dangling"]
    assert _get(s3, "fail/big.bin") is None
    assert _uploads(s3) == []


def test_copy_prefix_download_failing_mid_way_leaves_no_partial_file(
    s3: Any, tmp_path: Path
) -> None:
    for i in range(4):
        s3.put_object(Bucket=s3.ferrio_bucket, Key=f"d/{i}/x.bin", Body=remote_data(PART, seed=i))
    s3.faults.deny_gets = True
    out = tmp_path / "out"
    with pytest.raises(PermissionError):
        in_thread(lambda: ferrio.copy(f"s3://{s3.ferrio_bucket}/d/", out, recursive=True))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    # A local conflict fails one file; the others are whole, and no temporary file is left.
    s3.faults.deny_gets = False
    out.mkdir(exist_ok=True)
    (out / "d").mkdir(exist_ok=True)
    if (out / "d" / "2").exists():
        (out / "d" / "2").rmdir()
    (out / "d" / "2").write_bytes(b"a file where a directory should be")
    with pytest.raises(OSError):
        in_thread(lambda: ferrio.copy(f"s3://{s3.ferrio_bucket}/d/", out, recursive=True))
    for i in (0, 1, 3):
        assert (out / "d" / str(i) / "x.bin").read_bytes() == remote_data(PART, seed=i)
    assert not [p for p in tmp_path.rglob("*") if ".ferrio-" in p.name]


def test_copy_prefix_with_objects_deleted_or_replaced_after_the_listing(
    s3: Any, tmp_path: Path
) -> None:
    """An object deleted after the listing is FileNotFoundError for that object, one replaced is
    an error too (reads are conditional on the listed ETag), never its new bytes; the others
    are copied whole, and no temporary file is left."""
    bodies = {i: remote_data(PART + i, seed=40 + i) for i in range(4)}
    for i, body in bodies.items():
        s3.put_object(Bucket=s3.ferrio_bucket, Key=f"race/{i}.bin", Body=body)

    def after_listing() -> None:
        s3.delete_object(Bucket=s3.ferrio_bucket, Key="race/1.bin")
        s3.put_object(Bucket=s3.ferrio_bucket, Key="race/2.bin", Body=bytes(PART + 2))

    s3.faults.after["ListObjectsV2"] = after_listing
    out = tmp_path / "out"
    result = subprocess.run(
        cli("cp", "-r", f"s3://{s3.ferrio_bucket}/race/", str(out), "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert result.returncode == 1, result.stderr
    errors = {Path(e["path"]).name: e["error"] for e in json.loads(result.stdout)["errors"]}
    assert sorted(errors) == ["1.bin", "2.bin"]
    assert "no such object" in errors["1.bin"]
    assert "changed since it was opened" in errors["2.bin"]
    assert files_under(out) == {"0.bin": bodies[0], "3.bin": bodies[3]}


def test_cli_cp_ctrl_c_while_the_store_does_not_answer(
    s3: Any, tmp_path: Path, python_sigint: None
) -> None:
    """Ctrl-C while a listing (cp -r) or the object's HEAD (cp) waits on the store exits with 130
    at once, and nothing is made; before, it waited for the request to time out, and the
    destination directory of the tree was made after all."""
    for i in range(3):
        s3.put_object(Bucket=s3.ferrio_bucket, Key=f"slow/{i}.bin", Body=b"x" * 100)
    for op, args in [
        ("ListObjectsV2", ["-r", f"s3://{s3.ferrio_bucket}/slow/", str(tmp_path / "tree")]),
        ("HEAD", [f"s3://{s3.ferrio_bucket}/slow/0.bin", str(tmp_path / "one.bin")]),
    ]:
        s3.faults.stall = {op}
        proc = subprocess.Popen(
            cli("cp", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

        def asked(op: str = op) -> None:
            deadline = time.monotonic() + BOUND_S
            while s3.faults.seen.get(op, 0) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert s3.faults.seen.get(op, 0) > 0, f"no {op} reached the server"
            time.sleep(0.3)

        err, took = interrupt_when(proc, asked, BOUND_S)
        assert proc.returncode == 130, err
        assert took < 2.0, f"{op}: exit took {took:.2f} s after SIGINT"
        assert list(tmp_path.iterdir()) == []


def test_cli_cp_recursive_json(s3: Any, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    files = make_tree(src)
    url = f"s3://{s3.ferrio_bucket}/cli-tree/"
    out = subprocess.run(
        cli("cp", "-r", str(src), url, "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"] == len(files)
    down = tmp_path / "down"
    out = subprocess.run(
        cli("cp", "-r", url, str(down), "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["files"] == len(files)
    # `down`, `sub` and `sub/deeper`: the empty directories were not uploaded (objects only).
    assert report["dirs"] == 3
    assert files_under(down) == files
    missing = f"s3://{s3.ferrio_bucket}/no-such-prefix/"
    out = subprocess.run(
        cli("cp", "-r", missing, str(tmp_path / "none")),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 2
    assert "no-such-prefix" in out.stderr


# ---------------------------------------------------------------------------------------------
# GPU memory (runs on the GPU machine only)
# ---------------------------------------------------------------------------------------------


def _cupy() -> Any:
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception as e:
        pytest.skip(f"no usable GPU: {e}")
    return cp


def test_upload_from_cupy_array(s3: Any) -> None:
    cp = _cupy()
    data = remote_data(3 * PART + 4099, seed=30)
    key = "gpu/cupy.bin"
    url = f"s3://{s3.ferrio_bucket}/{key}"
    src = cp.asarray(np.frombuffer(data, dtype=np.uint8))
    cp.cuda.runtime.deviceSynchronize()

    def upload() -> None:
        with ferrio.open_url(url, "w", range_size="5MiB", concurrency=2) as w:
            # Host and GPU writes mix; the GPU write starts inside a part and spans several.
            assert w.write(data[:1000]) == 1000
            assert w.write(src[1000 : 2 * PART]) == 2 * PART - 1000
            assert w.write(src[2 * PART :]) == len(data) - 2 * PART
            assert w.tell() == len(data)
            assert _get(s3, key) is None

    in_thread(upload)
    assert _get(s3, key) == data
    assert _uploads(s3) == []


def test_upload_from_torch_cuda_tensor_and_abort(s3: Any) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU for torch")
    data = remote_data(PART + 17, seed=31)
    url = f"s3://{s3.ferrio_bucket}/gpu/torch.bin"
    src = torch.frombuffer(bytearray(data), dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    in_thread(lambda: write_all(url, src))
    assert _get(s3, "gpu/torch.bin") == data
    # An exception after a GPU write still aborts: no object, no parts.

    def aborted() -> None:
        with ferrio.open_url(url + ".aborted", "w", range_size="5MiB") as w:
            w.write(src)
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError):
        in_thread(aborted)
    assert _get(s3, "gpu/torch.bin.aborted") is None
    assert _uploads(s3) == []


def test_cli_cp_json_both_ways(s3: Any, tmp_path: Path) -> None:
    data = remote_data(PART + 3, seed=14)
    src = tmp_path / "cli.bin"
    src.write_bytes(data)
    url = f"s3://{s3.ferrio_bucket}/cli.bin"
    out = subprocess.run(
        cli("cp", str(src), url, "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["files"] == 1 and summary["bytes"] == len(data)
    assert _get(s3, "cli.bin") == data
    back = tmp_path / "cli-back.bin"
    out = subprocess.run(
        cli("cp", url, str(back), "--json"),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    assert back.read_bytes() == data
    out = subprocess.run(
        cli("cp", url + ".missing", str(back)),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 2
    assert "cli.bin.missing" in out.stderr


def test_cli_cp_ctrl_c_during_upload_leaves_nothing(
    s3: Any, tmp_path: Path, python_sigint: None
) -> None:
    s3.faults.stall_parts = True
    src = tmp_path / "big.bin"
    src.write_bytes(remote_data(4 * PART, seed=15))
    url = f"s3://{s3.ferrio_bucket}/big.bin"
    env = dict(os.environ, FERRIO_REMOTE_RANGE_SIZE="5MiB")
    proc = subprocess.Popen(
        cli("cp", str(src), url),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def uploading() -> None:
        assert s3.faults.parts_seen.wait(BOUND_S), "no part reached the server"
        time.sleep(0.2)

    err, took = interrupt_when(proc, uploading, BOUND_S)
    assert proc.returncode == 130, err
    assert took < 2.0, f"exit took {took:.2f} s after SIGINT"
    assert _get(s3, "big.bin") is None
    assert _uploads(s3) == []
