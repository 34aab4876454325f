"""Remote objects: ferrio.open(url) against servers on 127.0.0.1 started by the tests.

moto's S3 server (skipped without moto) for the S3 store, credentials and version checks; a
small HTTP server of our own for the failure modes a real network has: a server that ignores
Range (read whole, one GET per read; Python's own `http.server` too), answers 503 before it
succeeds, drops the connection mid-body, stalls mid-body (once, or for good), answers a range
with another one, or replaces the object between requests. Every case ends in the right bytes
or a clear error, within a time bound.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BOUND_S, in_thread, read_all, remote_data

import ferrio
from ferrio.safetensors.numpy import load_file, save_file

# ---------------------------------------------------------------------------------------------
# A misbehaving HTTP server
# ---------------------------------------------------------------------------------------------


class _Object:
    """The object the HTTP server serves, and how the server misbehaves."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.etag: str | None = '"v1"'  # None: the server sends no ETag
        self.last_modified: str | None = "Mon, 23 Nov 2026 10:00:00 GMT"  # None: none sent
        self.grow_on_replace = False  # the replacement is longer, not just other bytes
        self.ignore_range = False
        self.ignore_range_gets = 0  # this many ranged GETs are answered with the whole object
        self.whole_gets = 0  # GETs answered with the whole object
        self.chunked = False  # the whole object (a Range ignored) goes chunked, with no length
        self.fail_503 = 0  # this many GETs answer 503 first
        self.drop_after = 0  # if >0: the next GET sends this many body bytes, then hangs up
        self.replace_after_gets = -1  # after this many GETs, the object changes
        self.stalls = 0  # this many GETs send half their body, then stall for `stall_s`
        self.stall_s = 0.0
        self.shift_range = 0  # ranges are answered this many bytes later than asked (and say so)
        self.head = "ok"  # or "405": HEAD not allowed; "no-length": HEAD without Content-Length
        self.gets = 0
        self.lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    obj: _Object

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _headers(self, status: int, length: int | None, extra: dict[str, str]) -> None:
        self.send_response(status)
        if length is not None:
            self.send_header("Content-Length", str(length))
        if self.obj.etag is not None:
            self.send_header("ETag", self.obj.etag)
        if self.obj.last_modified is not None:
            self.send_header("Last-Modified", self.obj.last_modified)
        self.send_header("Accept-Ranges", "bytes")
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def _missing(self) -> bool:
        if self.path == "/data/object.bin":
            return False
        self._headers(404, 0, {})
        return True

    def do_HEAD(self) -> None:
        if self._missing():
            return
        if self.obj.head == "405":
            self._headers(405, 0, {"Allow": "GET"})
            return
        if self.obj.head == "no-length":
            self.send_response(200)
            self.send_header("ETag", self.obj.etag)
            self.end_headers()
            return
        with self.obj.lock:
            self._headers(200, len(self.obj.body), {})

    def do_GET(self) -> None:
        if self._missing():
            return
        obj = self.obj
        with obj.lock:
            obj.gets += 1
            if obj.replace_after_gets >= 0 and obj.gets > obj.replace_after_gets:
                obj.body = bytes(b ^ 0xFF for b in obj.body[:16]) + obj.body[16:]
                obj.body += b"more" * obj.grow_on_replace
                obj.etag = obj.etag and '"v2"'
                obj.last_modified = obj.last_modified and "Tue, 24 Nov 2026 10:00:00 GMT"
                obj.replace_after_gets = -1
            if obj.fail_503 > 0:
                obj.fail_503 -= 1
                self._headers(503, 0, {"Retry-After": "0"})
                return
            body, etag = obj.body, obj.etag
            drop, obj.drop_after = obj.drop_after, 0
            stall = obj.stalls > 0
            obj.stalls -= stall
            rng = self.headers.get("Range")
            ignore = obj.ignore_range or (rng is not None and obj.ignore_range_gets > 0)
            obj.ignore_range_gets -= rng is not None and obj.ignore_range_gets > 0
            obj.whole_gets += ignore or rng is None
        want = self.headers.get("If-Match")
        # Compared strongly, as RFC 9110 and nginx compare: a weak ETag never matches.
        if want is not None and (want != (etag or "") or want.startswith("W/")):
            self._headers(412, 0, {})
            return
        if rng and not ignore and rng.startswith("bytes="):
            a, _, b = rng[len("bytes=") :].partition("-")
            start, end = int(a), min(int(b) + 1 if b else len(body), len(body))
            if obj.shift_range and end + obj.shift_range <= len(body):
                start, end = start + obj.shift_range, end + obj.shift_range
            part = body[start:end]
            self._headers(206, len(part), {"Content-Range": f"bytes {start}-{end - 1}/{len(body)}"})
        elif obj.chunked:
            self._headers(200, None, {"Transfer-Encoding": "chunked"})
            for i in range(0, len(body), 1 << 16):
                piece = body[i : i + (1 << 16)]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        else:
            part = body
            self._headers(200, len(part), {})
        if stall:
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            time.sleep(obj.stall_s)
            self.close_connection = True
            return
        if drop:
            self.wfile.write(part[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(part)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the dropped-connection case resets sockets on purpose


@pytest.fixture
def http_object() -> Iterator[tuple[str, _Object]]:
    obj = _Object(remote_data((5 << 20) + 12345, seed=1))
    handler = type("H", (_Handler,), {"obj": obj})
    server = _Server(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/data/object.bin", obj
    finally:
        server.shutdown()
        server.server_close()


def test_http_ranges_are_byte_identical(http_object: tuple[str, _Object]) -> None:
    url, obj = http_object
    with ferrio.open(url, task_size="1MiB") as f:
        assert isinstance(f, ferrio.RemoteFile)
        assert f.size == len(obj.body)
        assert in_thread(lambda: read_all(f)) == obj.body
        for offset, size in [(0, 1), (12345, 3 << 20), (len(obj.body) - 7, 7)]:
            buf = bytearray(size)
            assert f.read(buf, offset=offset) == size
            assert bytes(buf) == obj.body[offset : offset + size]
        # Past the end: short, like pread.
        buf = bytearray(100)
        assert f.read(buf, offset=len(obj.body) - 40) == 40
        assert bytes(buf[:40]) == obj.body[-40:]
        assert f.read(buf, offset=len(obj.body) + 10) == 0
        fut = f.pread(bytearray(1000), offset=5)
        assert fut.result(timeout=BOUND_S) == 1000
    assert f.closed
    with pytest.raises(ValueError):
        f.read(bytearray(1))


def test_http_server_ignoring_range_is_read_whole_one_get_per_read(
    http_object: tuple[str, _Object],
) -> None:
    url, obj = http_object
    obj.ignore_range = True
    with ferrio.open_url(url, range_size="1MiB") as f:
        # The first read's ranged GETs find out (6 ranges), then one GET streams the object
        # (after one ranged GET that asks whether the server honours ranges again).
        assert in_thread(lambda: read_all(f)) == obj.body
        first = obj.gets
        assert first <= 6 + 2, first
        buf = bytearray(3 << 20)
        assert f.read(buf, offset=12345) == len(buf)
        assert bytes(buf) == obj.body[12345 : 12345 + len(buf)]
        # Later reads are one GET of the whole object each (and that one ranged GET), not one
        # per range.
        assert obj.gets - first == 2


def test_a_range_ignoring_server_that_sends_no_length_is_a_clear_error(
    http_object: tuple[str, _Object],
) -> None:
    url, obj = http_object
    obj.ignore_range = obj.chunked = True
    with ferrio.open_url(url, range_size="1MiB") as f, pytest.raises(OSError) as e:
        in_thread(lambda: read_all(f))
    assert "without a Content-Length" in str(e.value), e.value
    assert "object.bin" in str(e.value)


def test_python_http_server_serves_reads_copies_and_checkpoints(tmp_path: Path) -> None:
    """`python -m http.server` ignores Range: ferrio reads from it all the same."""
    served = tmp_path / "served"
    served.mkdir()
    body = remote_data((3 << 20) + 5, seed=7)
    (served / "blob.bin").write_bytes(body)
    tensors = {"w": np.arange(1000, dtype=np.float32), "b": np.ones((3, 4), dtype=np.int16)}
    save_file(tensors, str(served / "model.safetensors"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with ferrio.open(f"{base}/blob.bin") as f:
            assert f.size == len(body)
            assert in_thread(lambda: read_all(f)) == body
            buf = bytearray(1 << 20)
            assert f.read(buf, offset=len(body) - 100) == 100
            assert bytes(buf[:100]) == body[-100:]
        in_thread(lambda: ferrio.copy(f"{base}/blob.bin", tmp_path / "copy.bin"))
        assert (tmp_path / "copy.bin").read_bytes() == body
        loaded = in_thread(lambda: load_file(f"{base}/model.safetensors"))
        assert loaded.keys() == tensors.keys()
        for name, t in tensors.items():
            np.testing.assert_array_equal(loaded[name], t)
    finally:
        server.shutdown()
        server.server_close()


def test_http_503_twice_then_success_is_retried(http_object: tuple[str, _Object]) -> None:
    url, obj = http_object
    f = ferrio.open_url(url, range_size="8MiB")
    obj.fail_503 = 2
    assert in_thread(lambda: read_all(f)) == obj.body
    assert obj.fail_503 == 0


def test_http_dropped_connection_mid_body(http_object: tuple[str, _Object]) -> None:
    url, obj = http_object
    f = ferrio.open_url(url, range_size="8MiB")
    obj.drop_after = 100_000
    # The broken body is asked again from where it stopped: right bytes, or a clear error.
    outcome: list[Any] = []
    try:
        outcome.append(in_thread(lambda: read_all(f)))
    except OSError as e:
        outcome.append(e)
    if isinstance(outcome[0], OSError):
        assert "object.bin" in str(outcome[0])
    else:
        assert outcome[0] == obj.body
    assert obj.drop_after == 0


@pytest.mark.parametrize("head", ["405", "no-length"])
def test_a_server_whose_head_does_not_give_the_size_is_asked_with_a_get(
    http_object: tuple[str, _Object], head: str
) -> None:
    """Web servers that refuse HEAD, or answer it without a Content-Length, still serve: the
    object is opened with a one-byte ranged GET, as a presigned URL is."""
    url, obj = http_object
    obj.head = head
    with ferrio.open(url) as f:
        assert f.size == len(obj.body)
        assert in_thread(lambda: read_all(f)) == obj.body


def test_http_stalled_body_times_out_and_is_asked_again(http_object: tuple[str, _Object]) -> None:
    """A GET whose body stops coming is cut at `remote_timeout` and asked again."""
    url, obj = http_object
    obj.stalls, obj.stall_s = 1, 8.0
    with ferrio.config.set(remote_timeout="1s"):
        f = ferrio.open_url(url, range_size="8MiB")
        t0 = time.monotonic()
        assert in_thread(lambda: read_all(f)) == obj.body
    assert time.monotonic() - t0 < 6.0, "waited for the stalled body instead of retrying"
    assert obj.stalls == 0


def test_http_server_stalling_for_good_is_a_clear_error(http_object: tuple[str, _Object]) -> None:
    """Every GET sends half of what is left, then stalls: the read fails with `TimeoutError`
    naming the URL once the retry budget is spent (each re-ask of the broken body counts), not
    after one more round of retries per piece that arrived."""
    url, obj = http_object
    obj.stalls, obj.stall_s = 1000, 8.0
    with ferrio.config.set(remote_timeout="1s", remote_retries=1, remote_retry_timeout="3s"):
        f = ferrio.open_url(url, range_size="8MiB")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"object\.bin"):
            in_thread(lambda: read_all(f))
    # object_store resumes a body once (retries 1), ferrio asks once more: four 1 s timeouts.
    assert time.monotonic() - t0 < 6.0
    assert obj.gets <= 5, f"{obj.gets} GETs for a retry budget of 1"


def test_a_server_that_never_answers_is_asked_once_at_open() -> None:
    """A server that takes the connection and never answers: the open fails with
    `TimeoutError` after the HEAD's retries. It used to try a GET of the first byte and then
    one of the whole object, each with the same budget: three times as long."""
    heard: list[str] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            conn.settimeout(2.0)
            with contextlib.suppress(OSError):
                head = conn.recv(65536).decode("latin-1")
                heard.append(head.split(" ", 1)[0] + (" range" if "range:" in head.lower() else ""))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = listener.getsockname()[1]
    try:
        for url, first in [
            (f"http://127.0.0.1:{port}/x.bin", "HEAD"),
            # A signed URL is opened with a ranged GET instead: that one, and no other.
            (f"http://127.0.0.1:{port}/x.bin?sig=1", "GET range"),
        ]:
            heard.clear()
            with (
                ferrio.config.set(remote_timeout="1s", remote_retries=1, remote_retry_timeout="2s"),
                pytest.raises(TimeoutError) as e,
            ):
                in_thread(functools.partial(ferrio.open, url))
            assert e.value.filename == url
            assert heard and set(heard) == {first}, heard
    finally:
        done.set()
        t.join(BOUND_S)
        listener.close()
        for conn in held:
            conn.close()


def test_a_server_that_ignored_range_once_is_read_in_ranges_again(
    http_object: tuple[str, _Object],
) -> None:
    """One ranged GET answered with the whole object (a CDN on a cache miss) made every later
    read of the object stream it from byte 0, a small read at its end included."""
    url, obj = http_object
    obj.ignore_range_gets = 1
    with ferrio.open_url(url, range_size="1MiB", concurrency=1) as f:
        assert in_thread(lambda: read_all(f)) == obj.body
        obj.whole_gets = 0
        tail = bytearray(100)
        for _ in range(5):
            assert in_thread(lambda: f.read(tail, offset=len(obj.body) - 100)) == 100
            assert bytes(tail) == obj.body[-100:]
        assert in_thread(lambda: read_all(f)) == obj.body
    assert obj.whole_gets == 0


def test_a_weak_etag_pins_reads_without_if_match(http_object: tuple[str, _Object]) -> None:
    """`If-Match` compares strongly, so a server that follows RFC 9110 (nginx) refused every
    read of an object with a weak ETag: "the object changed since it was opened"."""
    url, obj = http_object
    obj.etag = 'W/"v1"'
    with ferrio.open_url(url, range_size="1MiB") as f:
        assert f.etag == 'W/"v1"'
        assert in_thread(lambda: read_all(f)) == obj.body
        # Still pinned: by the ETags of the replies and by Last-Modified.
        obj.replace_after_gets = obj.gets
        with pytest.raises(OSError, match="changed since it was opened"):
            in_thread(lambda: read_all(f))


def test_http_range_answered_with_another_range_is_an_error(
    http_object: tuple[str, _Object],
) -> None:
    """A 206 whose Content-Range is not the range asked for is refused, never copied in."""
    url, obj = http_object
    obj.shift_range = 1
    f = ferrio.open_url(url, range_size="1MiB")
    with pytest.raises(OSError, match=r"object\.bin"):
        in_thread(lambda: read_all(f))


def test_http_object_replaced_between_requests(http_object: tuple[str, _Object]) -> None:
    url, obj = http_object
    f = ferrio.open_url(url, range_size="1MiB", concurrency=1)
    obj.replace_after_gets = 2
    with pytest.raises(OSError, match="changed since it was opened"):
        in_thread(lambda: read_all(f))


@pytest.mark.parametrize("pinned_by", ["last-modified", "size"])
def test_http_object_without_etag_replaced_between_requests(
    http_object: tuple[str, _Object], pinned_by: str
) -> None:
    """A server that sends no ETag cannot be asked `If-Match`: its Last-Modified time pins the
    object instead, and the size always does, so a replaced object is still an error, never a
    mix of old and new bytes (which ferrio returned before)."""
    url, obj = http_object
    obj.etag = None
    if pinned_by == "size":
        obj.last_modified = None
        obj.grow_on_replace = True
    f = ferrio.open_url(url, range_size="1MiB", concurrency=1)
    assert f.etag is None
    obj.replace_after_gets = 2
    with pytest.raises(OSError, match="changed since it was opened") as e:
        in_thread(lambda: read_all(f))
    assert e.value.filename == url
    # Reopened, the new object reads whole.
    with ferrio.open_url(url, range_size="1MiB") as again:
        assert in_thread(lambda: read_all(again)) == obj.body


class _Paths(http.server.BaseHTTPRequestHandler):
    """Serves objects by the request's path exactly as sent (no decoding), with ranges."""

    protocol_version = "HTTP/1.1"
    objects: dict[str, bytes]
    requests: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def do_GET(self, head: bool = False) -> None:
        self.requests.append(self.path)
        body = self.objects.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        rng = self.headers.get("Range")
        status, part, extra = 200, body, {}
        if rng and not head:
            a, _, b = rng[len("bytes=") :].partition("-")
            start, end = int(a), min(int(b) + 1, len(body))
            status, part = 206, body[start:end]
            extra = {"Content-Range": f"bytes {start}-{end - 1}/{len(body)}"}
        self.send_response(status)
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(part)


def test_an_http_url_asks_for_its_path_as_written(tmp_path: Any) -> None:
    """A web server's path is not an object key: `%2F` is not a separator (GitLab's
    `projects/group%2Fproj`), `a//b` and `dir/` are other resources than `a/b` and `dir`.
    Each was asked for as `/a/b` or `/dir`, or refused, and read another resource's bytes."""
    paths = ["/api/group%2Fproj/raw", "/api/group/proj/raw", "/dir/", "/dir", "/a//b", "/a/b"]
    paths += ["/c%2Bd", "/c+d"]
    objects = {p: remote_data(1000 + 7 * i, seed=i) for i, p in enumerate(paths)}
    handler = type("P", (_Paths,), {"objects": objects, "requests": []})
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        for path, body in objects.items():
            handler.requests.clear()
            with ferrio.open(base + path) as f:
                buf = bytearray(f.size)
                assert in_thread(functools.partial(f.read, buf)) == len(body), path
            assert bytes(buf) == body, path
            assert set(handler.requests) == {path}, (path, handler.requests)
            out = tmp_path / "copy.bin"
            in_thread(functools.partial(ferrio.copy, base + path, out))
            assert out.read_bytes() == body, path
    finally:
        server.shutdown()
        server.server_close()


def test_fromfile_reads_small_and_large_objects() -> None:
    """`fromfile(url)` of an object of at most 64 KiB took the path of small local files (sysfs
    and procfs say the wrong size) and opened the URL as a local path: FileNotFoundError."""
    objects = {"/small.bin": remote_data(1000, seed=30), "/big.bin": remote_data(300_000, seed=31)}
    handler = type("P", (_Paths,), {"objects": objects, "requests": []})
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        for path, body in objects.items():
            got = in_thread(functools.partial(ferrio.fromfile, base + path))
            assert got.tobytes() == body, path
            words = in_thread(functools.partial(ferrio.fromfile, base + path, "<u4", offset=4))
            assert words.tobytes() == body[4 : 4 + (len(body) - 4) // 4 * 4], path
    finally:
        server.shutdown()
        server.server_close()


class _Signed(http.server.BaseHTTPRequestHandler):
    """Serves objects only to requests whose query carries the right signature, and refuses
    HEAD with 403 as a store refuses a URL presigned for GET; ranges answer with Content-Range,
    and a range of an empty object with 416."""

    protocol_version = "HTTP/1.1"
    objects: dict[str, bytes]
    requests: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes = b"", extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.requests.append(f"HEAD {self.path}")
        self._answer(403)

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        path, _, query = self.path.partition("?")
        if "X-Amz-Signature=good" not in query.split("&"):
            self._answer(403)
            return
        body = self.objects.get(path)
        if body is None:
            self._answer(404)
            return
        etag = {"ETag": '"' + hashlib.md5(body).hexdigest() + '"'}
        rng = self.headers.get("Range")
        if rng is None:
            self._answer(200, body, etag)
            return
        a, _, b = rng[len("bytes=") :].partition("-")
        start, end = int(a), min(int(b) + 1, len(body))
        if start >= len(body):
            self._answer(416, b"", {"Content-Range": f"bytes */{len(body)}"})
            return
        part = body[start:end]
        headers = {**etag, "Content-Range": f"bytes {start}-{end - 1}/{len(body)}"}
        self._answer(206, part, headers)


@pytest.fixture
def signed_server() -> Iterator[tuple[str, type[_Signed]]]:
    handler = type("S", (_Signed,), {"objects": {}, "requests": []})
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_presigned_urls_keep_their_query_and_open_without_head(
    signed_server: tuple[str, type[_Signed]], tmp_path: Any
) -> None:
    """A presigned (or signed, or SAS) URL's query is its authorization: every request carries
    it, and the object is opened with a ranged GET, since the URL is signed for GET alone."""
    base, handler = signed_server
    body = remote_data((3 << 20) + 17, seed=5)
    handler.objects["/bucket/model.bin"] = body
    handler.objects["/bucket/empty.bin"] = b""
    query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=good&X-Amz-Expires=300"
    url = f"{base}/bucket/model.bin?{query}"
    with ferrio.open(url) as f:
        assert f.size == len(body)
        buf = bytearray(len(body))
        assert in_thread(lambda: f.read(buf)) == len(body)
    assert bytes(buf) == body
    assert not any(r.startswith("HEAD") for r in handler.requests)
    assert all(r.endswith(query) for r in handler.requests), handler.requests
    with ferrio.open(f"{base}/bucket/empty.bin?{query}") as f:
        assert f.size == 0 and f.read(bytearray(1)) == 0
    out = tmp_path / "model.bin"
    in_thread(lambda: ferrio.copy(url, out))
    assert out.read_bytes() == body
    bad = f"{base}/bucket/model.bin?X-Amz-Signature=bad"
    with pytest.raises(PermissionError) as e:
        ferrio.open(bad)
    assert e.value.filename == bad


def test_missing_and_malformed_urls(http_object: tuple[str, _Object]) -> None:
    url, _ = http_object
    with pytest.raises(ValueError, match="bad object URL"):
        ferrio.open_url("s3://")
    with pytest.raises(ValueError):
        ferrio.open_url(url, "w")
    with pytest.raises(ValueError, match="local files"):
        ferrio.open(url, cache="keep")
    missing = url.replace("object.bin", "missing.bin")
    with pytest.raises(FileNotFoundError) as e:
        ferrio.open(missing)
    assert e.value.filename == missing


def test_forked_child_reads_with_its_own_runtime(http_object: tuple[str, _Object]) -> None:
    import multiprocessing

    url, obj = http_object
    f = ferrio.open_url(url, range_size="1MiB")
    assert in_thread(lambda: read_all(f)) == obj.body  # the parent's runtime is running

    def child(conn: Any) -> None:
        # The object opened before the fork, and a new one: both read in the child.
        digest = hashlib.sha256(read_all(f)).hexdigest()
        again = hashlib.sha256(read_all(ferrio.open_url(url))).hexdigest()
        conn.send((digest, again))
        conn.close()

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    p = ctx.Process(target=child, args=(theirs,))
    p.start()
    assert ours.poll(BOUND_S), "the forked child did not answer in time"
    want = hashlib.sha256(obj.body).hexdigest()
    assert ours.recv() == (want, want)
    p.join(BOUND_S)
    assert p.exitcode == 0


def test_a_download_over_a_file_keeps_its_permissions(
    http_object: tuple[str, _Object], tmp_path: Path
) -> None:
    """As a local copy (and `cp`, which writes into it) keeps them; a new file gets the
    umask's. The download's file replaced it with one of mode 0o666 & ~umask."""
    url, obj = http_object
    kept = tmp_path / "kept.bin"
    kept.write_bytes(b"old")
    kept.chmod(0o600)
    in_thread(lambda: ferrio.copy(url, kept))
    assert kept.read_bytes() == obj.body
    assert kept.stat().st_mode & 0o777 == 0o600
    new = tmp_path / "new.bin"
    in_thread(lambda: ferrio.copy(url, new))
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask


def test_file_urls_name_local_files(tmp_path: Path) -> None:
    """`file://` URLs open, copy and load as the local paths they name (they were refused as
    "not a URL scheme ferrio opens")."""
    src = tmp_path / "a b#.bin"
    body = remote_data(3 << 20, seed=40)
    src.write_bytes(body)
    url = src.as_uri()  # file:///.../a%20b%23.bin
    with ferrio.open(url) as f:
        assert isinstance(f, ferrio.File) and f.path == str(src)
        buf = bytearray(f.size)
        f.read(buf)
    assert bytes(buf) == body
    assert ferrio.fromfile(url).tobytes() == body
    small = tmp_path / "small.bin"  # read to its end with one plain read (sysfs, procfs)
    small.write_bytes(b"0123456789")
    assert ferrio.fromfile(small.as_uri()).tobytes() == b"0123456789"
    out = tmp_path / "out dir"
    out.mkdir()
    ferrio.copy(url, out.as_uri() + "/")
    assert (out / src.name).read_bytes() == body
    with ferrio.open((tmp_path / "w.bin").as_uri(), "w") as w:
        w.write(b"written")
    assert (tmp_path / "w.bin").read_bytes() == b"written"
    tensors = {"w": np.arange(10, dtype=np.float32)}
    model = (tmp_path / "m.safetensors").as_uri()
    save_file(tensors, model)
    np.testing.assert_array_equal(load_file(model)["w"], tensors["w"])
    cli_out = subprocess.run(
        [sys.executable, "-m", "ferrio._cli", "read", url, "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert cli_out.returncode == 0, cli_out.stderr
    assert json.loads(cli_out.stdout)["bytes"] == len(body)
    for bad in ("file://server/share/x.bin", url + "?v=1"):
        with pytest.raises(ValueError, match="bad file URL"):
            ferrio.open(bad)


def test_cli_reads_a_url(http_object: tuple[str, _Object]) -> None:
    url, obj = http_object
    out = subprocess.run(
        [sys.executable, "-m", "ferrio._cli", "read", url, "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bytes"] == len(obj.body)
    missing = url.replace("object.bin", "missing.bin")
    out = subprocess.run(
        [sys.executable, "-m", "ferrio._cli", "read", missing],
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert out.returncode != 0
    assert "missing.bin" in out.stderr


def test_cli_info_describes_an_object(http_object: tuple[str, _Object]) -> None:
    # `ferrio info URL` looked for a local file of that name ("No such file or directory").
    url, obj = http_object

    def info(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ferrio._cli", "info", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=BOUND_S,
            env=dict(os.environ, FERRIO_REMOTE_CONCURRENCY="12"),
        )

    out = info("--json", url)
    assert out.returncode == 0, out.stderr
    described = json.loads(out.stdout)
    assert described["url"] == url and described["size"] == len(obj.body), described
    assert described["e_tag"] == obj.etag and described["reads"]["in_flight"] == 12, described
    out = info(url)
    assert out.returncode == 0, out.stderr
    assert f"({len(obj.body) / (1 << 20):.2f} MiB)" in out.stdout, out.stdout
    out = info(url.replace("object.bin", "missing.bin"))
    assert out.returncode == 2 and "missing.bin" in out.stderr, out  # a missing file is 2 too
    # A password is never echoed.
    out = info(url.replace("http://", "http://user:secret@"))
    assert out.returncode == 2 and "secret" not in out.stderr, out


# ---------------------------------------------------------------------------------------------
# S3 through moto's server
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    boto3 = pytest.importorskip("boto3")
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"ferrio-{os.getpid()}-{threading.get_ident() % 10000}"
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    client.ferrio_bucket = bucket
    return client


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AWS_ENDPOINT_URL", "localhost:9000"),
        ("AWS_ENDPOINT_URL", ""),
        ("AWS_ENDPOINT_URL", " http://127.0.0.1:9000"),
        # Taken, and every request then asked for http://127.0.0.1:9/?x=1/bucket/key.
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9/?x=1"),
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9/#top"),
        ("AWS_SESSION_TOKEN", "token\r"),
        ("AWS_ACCESS_KEY_ID", "AKIA\n"),
        ("AWS_REGION", "us east 1"),
        ("AWS_REGION", "ü"),
    ],
)
def test_a_store_variable_the_store_cannot_use_is_a_value_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """object_store takes these at build time and panicked on the first request."""
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    if name != "AWS_REGION":  # a region panicked where no endpoint was set (it makes the host)
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv(name, value)
    for call in (
        lambda: ferrio.open("s3://bucket/key"),
        lambda: ferrio.open("s3://bucket/key", "w"),
    ):
        with pytest.raises(ValueError, match=name):
            call()


def test_s3_whole_and_ranged_reads(s3: Any) -> None:
    data = remote_data((17 << 20) + 333, seed=2)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="dir/w.bin", Body=data)
    with ferrio.open(f"s3://{s3.ferrio_bucket}/dir/w.bin") as f:
        assert f.size == len(data)
        assert f.etag
        assert in_thread(lambda: read_all(f)) == data
        buf = bytearray(9 << 20)
        assert f.read(buf, offset=1 << 20) == len(buf)
        assert bytes(buf) == data[1 << 20 : (1 << 20) + len(buf)]


def test_a_plain_http_endpoint_needs_no_allow_http_unless_it_forbids_it(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An http:// AWS_ENDPOINT_URL is plain HTTP, as boto3 takes it: without AWS_ALLOW_HTTP
    every request failed with only "builder error"; forbidding it is now an error naming both."""
    s3.put_object(Bucket=s3.ferrio_bucket, Key="plain.bin", Body=b"plain http")
    url = f"s3://{s3.ferrio_bucket}/plain.bin"
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    with ferrio.open(url) as f:
        buf = bytearray(f.size)
        f.read(buf)
    assert bytes(buf) == b"plain http"
    monkeypatch.setenv("AWS_ALLOW_HTTP", "false")
    with pytest.raises(ValueError, match=r"AWS_ENDPOINT_URL.*AWS_ALLOW_HTTP"):
        ferrio.open(url)


def test_s3_missing_key_is_file_not_found(s3: Any) -> None:
    url = f"s3://{s3.ferrio_bucket}/no/such/key"
    with pytest.raises(FileNotFoundError) as e:
        ferrio.open(url)
    assert e.value.filename == url


def test_listing_a_missing_bucket_is_file_not_found(s3: Any, tmp_path: Path) -> None:
    # It was an OSError holding the store's XML reply.
    url = "s3://no-such-bucket-ferrio/prefix/"
    with pytest.raises(FileNotFoundError, match="no such bucket") as e:
        in_thread(lambda: ferrio.copy(url, tmp_path / "out", recursive=True))
    assert e.value.filename == url


def test_s3_object_replaced_after_open_is_an_error(s3: Any) -> None:
    data = remote_data(3 << 20, seed=3)
    s3.put_object(Bucket=s3.ferrio_bucket, Key="r.bin", Body=data)
    f = ferrio.open_url(f"s3://{s3.ferrio_bucket}/r.bin", range_size="1MiB")
    s3.put_object(Bucket=s3.ferrio_bucket, Key="r.bin", Body=b"\0" * len(data))
    buf = bytearray(len(data))
    with pytest.raises(OSError, match="changed since it was opened") as e:
        in_thread(lambda: f.read(buf))
    assert e.value.filename == f"s3://{s3.ferrio_bucket}/r.bin"


def test_s3_key_with_hash_or_question_mark_must_be_percent_encoded(s3: Any) -> None:
    """`#...` and `?...` are no part of a URL's path: `s3://b/k#x` read (and wrote) the object
    `k`, silently. They are refused now; percent-encoded (%23, %3F) they name the key."""
    bucket = s3.ferrio_bucket
    s3.put_object(Bucket=bucket, Key="h/name", Body=b"another object")
    s3.put_object(Bucket=bucket, Key="h/name#1.bin", Body=b"hash")
    s3.put_object(Bucket=bucket, Key="h/name?versionId=1", Body=b"query")
    for raw in [f"s3://{bucket}/h/name#1.bin", f"s3://{bucket}/h/name?versionId=1"]:
        with pytest.raises(ValueError, match="%23"):
            ferrio.open(raw)
        with pytest.raises(ValueError, match="%23"):
            ferrio.open(raw, "w")
    for encoded, body in [("name%231.bin", b"hash"), ("name%3FversionId=1", b"query")]:
        with ferrio.open(f"s3://{bucket}/h/{encoded}") as f:
            assert in_thread(lambda: read_all(f)) == body
    with pytest.raises(ValueError, match="%23"):
        ferrio.open("https://example.com/file#part")


def test_s3_key_a_url_would_change_is_refused_not_rewritten(s3: Any) -> None:
    """URL parsing resolves `..`, drops tabs and surrounding spaces, and an object path has no
    empty segment: `s3://b/k/` read (and wrote) the object `k`. Such keys are refused."""
    bucket = s3.ferrio_bucket
    s3.put_object(Bucket=bucket, Key="k", Body=b"the object k")
    for key in ["k/", "a/../k", "a/%2e%2e/k", "./k", "k ", "k\t", "k\n", "a//k"]:
        for mode in ["r", "w"]:
            with pytest.raises(ValueError, match="bad object URL"):
                ferrio.open(f"s3://{bucket}/{key}", mode)
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"the object k"
    # Percent-encoded, a space is part of the key.
    s3.put_object(Bucket=bucket, Key="k ", Body=b"k and a space")
    with ferrio.open(f"s3://{bucket}/k%20") as f:
        assert in_thread(lambda: read_all(f)) == b"k and a space"


def test_s3_anonymous_without_credentials(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3.ferrio_bucket
    s3.put_object(Bucket=bucket, Key="public.bin", Body=b"hello", ACL="public-read")
    s3.put_object(Bucket=bucket, Key="private.bin", Body=b"secret")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # No credentials in the environment: unsigned requests, no wait on a metadata endpoint. A
    # public object reads; a private one is a PermissionError naming the URL.
    with ferrio.open(f"s3://{bucket}/public.bin") as f:
        assert in_thread(lambda: read_all(f)) == b"hello"
    with pytest.raises(PermissionError) as e:
        ferrio.open(f"s3://{bucket}/private.bin")
    assert e.value.filename == f"s3://{bucket}/private.bin"


# ---------------------------------------------------------------------------------------------
# GPU memory (runs on the GPU machine only)
# ---------------------------------------------------------------------------------------------


def _cupy_with_gpu() -> Any:
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception as e:
        pytest.skip(f"no usable GPU: {e}")
    return cp


def test_http_into_cupy(http_object: tuple[str, _Object]) -> None:
    cp = _cupy_with_gpu()
    url, obj = http_object
    with ferrio.open_url(url, range_size="1MiB") as f:
        dst = cp.full(f.size + 10, 0xA5, dtype=cp.uint8)
        assert in_thread(lambda: f.read(dst, size=f.size)) == f.size
        assert cp.asnumpy(dst[: f.size]).tobytes() == obj.body
        assert int(dst[f.size]) == 0xA5
        part = cp.zeros(3 << 20, dtype=cp.uint8)
        assert f.read(part, offset=4097) == len(part)
        assert cp.asnumpy(part).tobytes() == obj.body[4097 : 4097 + len(part)]


def test_http_server_ignoring_range_into_cupy(http_object: tuple[str, _Object]) -> None:
    """The whole-object stream of a server that ignores Range lands each range in GPU memory."""
    cp = _cupy_with_gpu()
    url, obj = http_object
    obj.ignore_range = True
    with ferrio.open_url(url, range_size="1MiB") as f:
        dst = cp.full(f.size + 10, 0xA5, dtype=cp.uint8)
        assert in_thread(lambda: f.read(dst, size=f.size)) == f.size
        assert cp.asnumpy(dst[: f.size]).tobytes() == obj.body
        assert int(dst[f.size]) == 0xA5
        first = obj.gets
        part = cp.full(3 << 20, 0xA5, dtype=cp.uint8)
        assert f.read(part, offset=4097) == len(part)
        assert cp.asnumpy(part).tobytes() == obj.body[4097 : 4097 + len(part)]
        # One GET of the whole object, after one ranged GET that asks again.
        assert obj.gets - first == 2


@pytest.mark.usefixtures("restore_settings")
def test_http_into_cupy_through_pieces_shorter_than_the_ranges(
    http_object: tuple[str, _Object],
) -> None:
    """Guided ranges longer than the pinned pieces: each GET fills several pieces in turn."""
    cp = _cupy_with_gpu()
    url, obj = http_object
    # Two GETs in flight, each an even share of the read between 64 KiB and 1 MiB long, and
    # pieces of 64 KiB (a GPU read's pieces are bounce buffers).
    ferrio.config.set(
        remote_range_size="64KiB",
        remote_max_range_size="1MiB",
        remote_concurrency=2,
        bounce_buffer_size="64KiB",
    )
    with ferrio.open_url(url) as f:
        for offset in (0, 4097):
            size = f.size - offset
            dst = cp.full(size + 10, 0xA5, dtype=cp.uint8)
            assert f.read(dst, size=size, offset=offset) == size
            assert cp.asnumpy(dst[:size]).tobytes() == obj.body[offset:]
            assert int(dst[size]) == 0xA5


_TABLE = """
import resource, sys, threading, time
if sys.argv[1] == "threaded-ferrio":
    threading.Thread(target=threading.Event().wait, daemon=True).start()
if sys.argv[1].endswith("ferrio"):
    import ferrio
def size():
    return int(next(l for l in open("/proc/self/status") if l.startswith("FDSize:")).split()[1])
limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
at_import = size()
# Grown in the background where the import found other threads: wait for it (a grace period).
deadline = time.monotonic() + 5
while sys.argv[1] != "plain" and size() < min(1024, limit) and time.monotonic() < deadline:
    time.sleep(0.01)
print(at_import, size(), limit)
"""


def test_import_grows_the_descriptor_table_for_a_reads_sockets() -> None:
    """`import ferrio` grows the descriptor table while the process has one thread: later,
    among a GPU library's threads, a growth under a read's 64 new sockets waits for an RCU grace
    period and holds up every GET (RESULTS.md, session 17)."""

    def table(what: str) -> tuple[int, int, int]:
        out = subprocess.run(
            [sys.executable, "-c", _TABLE, what], capture_output=True, text=True, check=True
        )
        at_import, later, limit = out.stdout.split()
        return int(at_import), int(later), int(limit)

    plain, _, limit = table("plain")
    want = min(1024, limit)
    if plain >= want:
        pytest.skip(f"a fresh interpreter here already has a table of {plain} descriptors")
    # Alone, the import grows it itself (free with one thread).
    at_import, _, _ = table("ferrio")
    assert at_import >= want, f"table of {at_import} after import, {plain} without; want {want}"
    # With another thread running, a growth waits for a grace period: a thread of ferrio's
    # waits it out in the background, and the table is grown soon after.
    _, later, _ = table("threaded-ferrio")
    assert later >= want, f"table of {later} after a threaded import, {plain} without"
