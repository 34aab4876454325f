"""Shared fixtures and helpers: files of known content, and what the remote-storage tests share
(bounded waits, free ports, servers in child processes, moto's S3 server, an Azure Blob service,
uploads, trees of files, the CLI)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import quote
from xml.etree import ElementTree

import numpy as np
import pytest
from azure_blob_server import ACCOUNT, KEY, VERSION, shared_key

import ferrio
import ferrio.safetensors as fs


def pattern(size: int, seed: int = 0) -> np.ndarray:
    """Return `size` reproducible pseudo-random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A file of 10 MiB + 12345 bytes (not a multiple of any alignment) and its content."""
    data = pattern((10 << 20) + 12345, seed=1)
    path = tmp_path / "data.bin"
    data.tofile(path)
    return path, data


@pytest.fixture(scope="session")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A 256 MiB file, in the page cache, for tests that need reads to last a while."""
    data = pattern(256 << 20, seed=2)
    path = tmp_path_factory.mktemp("big") / "big.bin"
    data.tofile(path)
    return path, data


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler, for tests that interrupt the main thread or a child.

    A shell starts background jobs with SIGINT ignored, and Python then installs no handler, so
    `_thread.interrupt_main()` or a SIGINT would do nothing (as a real Ctrl-C would), and a child
    would start with it ignored too (an ignored signal stays ignored across `exec`): install the
    handler here, which children then start without (a handled signal is reset by `exec`).
    """
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture
def restore_settings() -> Iterator[None]:
    """Put every process-wide setting back after the test."""
    before = ferrio.config.settings()
    yield
    ferrio.config.set(**before)


def is_root() -> bool:
    """Whether the tests run as root (who bypasses file permissions)."""
    return os.geteuid() == 0


# Every remote call in the tests must end well before this; pytest itself has no timeout plugin.
BOUND_S = 60.0


@pytest.fixture(scope="module")
def fault_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A mounted `fault_fs.py` (FUSE): files whose name holds ``flush-fails`` fail at close."""
    try:
        import fuse  # type: ignore[import-untyped]  # noqa: F401
    except (ImportError, OSError) as e:  # fusepy missing, or libfuse 2 (OSError)
        pytest.skip(f"fusepy cannot load: {e}")
    if not is_root() or not os.path.exists("/dev/fuse"):
        pytest.skip("mounting a FUSE file system needs root and /dev/fuse")
    where = tmp_path_factory.mktemp("fault-fs")
    log = where.parent / f"{where.name}.log"
    script = Path(__file__).with_name("fault_fs.py")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), str(where)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + BOUND_S
        while not os.path.ismount(where):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"fault_fs did not mount: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        proc.terminate()
        proc.wait(BOUND_S)


def remote_data(n: int, seed: int) -> bytes:
    """Return `n` reproducible bytes (no repeating short period) for an object."""
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


def in_thread(fn: Any) -> Any:
    """Runs `fn` in a thread and fails the test if it does not return within BOUND_S."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), "remote call did not finish in time"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, for one test module."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def child_server(what: str, argv: list[str], port: int, log: Path) -> Iterator[None]:
    """Runs the test server `argv` in a child process, its output in `log`, until the block ends.

    Returns once it accepts connections on 127.0.0.1:`port`; fails the test, with the end of the
    log, if it exits or is not listening within 30 s.
    """
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{what} did not start: {log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


PART = 5 << 20  # the smallest part S3 and GCS take; the writer's part size in the upload tests


def read_all(f: Any) -> bytes:
    """The whole of the opened remote file `f`, read at once."""
    buf = bytearray(f.size)
    assert f.read(buf) == f.size
    return bytes(buf)


def write_all(url: str, buf: Any) -> None:
    """Uploads `buf` to `url` in one write, in parts of PART bytes."""
    with ferrio.open_url(url, "w", range_size="5MiB") as w:
        w.write(buf)


def write_in_steps(url: str, data: bytes, while_open: Callable[[], None]) -> None:
    """Uploads `data` to `url` in parts of PART bytes (3 in flight) through writes that straddle
    them, checking what each write and `tell` say, and calls `while_open` before the writer
    closes (to check that nothing is visible yet). Fails if it does not end within BOUND_S."""

    def upload() -> None:
        with ferrio.open_url(url, "w", range_size="5MiB", concurrency=3) as w:
            assert isinstance(w, ferrio.RemoteWriter)
            step = (1 << 20) + 7
            for i in range(0, len(data), step):
                assert w.write(memoryview(data)[i : i + step]) == min(step, len(data) - i)
            assert w.tell() == len(data)
            while_open()

    in_thread(upload)


def assert_downloads(url: str, data: bytes, tmp_path: Path, name: str) -> None:
    """`ferrio.copy` of the object at `url` to a file, and into a directory (as `name`, the
    object's last part), gives `data` both times."""
    back = tmp_path / "back.bin"
    in_thread(lambda: ferrio.copy(url, str(back)))
    assert back.read_bytes() == data
    into = tmp_path / "dir"
    into.mkdir()
    in_thread(lambda: ferrio.copy(url, into))
    assert (into / name).read_bytes() == data


def make_tree(root: Path) -> dict[str, bytes]:
    """Makes a tree of files under `root` (nested directories, an empty file, a name with
    `#?%` and spaces, an empty directory) and returns each file's path relative to it and
    bytes; the first file takes two parts."""
    files = {
        "a.bin": remote_data(PART + 5, seed=20),
        "sub/b.bin": remote_data(1000, seed=21),
        "sub/deeper/c.bin": b"",
        "sub/deeper/name with #?%.bin": remote_data(77, seed=22),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "empty-dir" / "nested-empty").mkdir(parents=True)
    return files


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root`: its path relative to `root`, and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def cli(*args: str) -> list[str]:
    """The command line that runs `ferrio ARGS` with this Python."""
    return [sys.executable, "-m", "ferrio._cli", *args]


def interrupt_when(
    proc: subprocess.Popen[str], ready: Callable[[], None], bound_s: float
) -> tuple[str, float]:
    """Once `ready()` returns, send Ctrl-C to `proc`; return its stderr and how long it took to
    exit. `proc` is killed if `ready` fails or it outlives `bound_s`."""
    try:
        ready()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=bound_s)
        return err, time.monotonic() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------------
# An Azure Blob service: Azurite where it is installed, else the emulator of azure_blob_server.py
# ---------------------------------------------------------------------------------------------

AZURE_CONTAINER = "ferrio-test"
AZURE_FAILING_CONTAINER = "ferrio-failing-blocks"  # the emulator's: every Put Block answers 500
# The emulator's: a Copy Blob into these answers pending, and succeeds or fails a few reads later.
AZURE_PENDING_COPY_CONTAINER = "ferrio-pending-copies"
AZURE_FAILED_COPY_CONTAINER = "ferrio-failed-copies"
AZURE_PAGE = 3  # the emulator's listing pages: a small tree takes several
_AZURITE = Path(__file__).resolve().parents[2] / ".tools" / "node_modules" / ".bin" / "azurite-blob"


@dataclass
class AzureService:
    """An Azure Blob service on 127.0.0.1, seen through its REST API with Shared Key requests
    signed with the emulator account's key (what is stored, without ferrio)."""

    url: str  # the service, without the account: what AZURITE_BLOB_STORAGE_URL names
    emulated: bool  # the emulator of azure_blob_server.py (with its test hooks), not Azurite

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        key: str | None = KEY,
    ) -> tuple[int, Message, bytes]:
        """Status, headers and body of a request signed with `key` (None: anonymous); `path`
        (percent-encoded, with its query) is under the account."""
        h = {"x-ms-date": formatdate(usegmt=True), "x-ms-version": VERSION, **(headers or {})}
        if body is not None:
            h.setdefault("Content-Type", "application/octet-stream")
            h["Content-Length"] = str(len(body))
        target = f"/{ACCOUNT}{path}"
        if key is not None:
            lower = {k.lower(): v for k, v in h.items()}
            h["Authorization"] = shared_key(method, target, lower, key)
        req = urllib.request.Request(self.url + target, data=body, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=BOUND_S) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def put(self, name: str, body: bytes, container: str = AZURE_CONTAINER) -> None:
        """Stores `body` as the block blob `name` (Put Blob)."""
        headers = {"x-ms-blob-type": "BlockBlob"}
        status, _, answer = self.request("PUT", f"/{container}/{quote(name)}", body, headers)
        assert status == 201, answer

    def get(self, name: str, container: str = AZURE_CONTAINER) -> bytes | None:
        """The committed blob `name`, or None if there is none."""
        status, _, body = self.request("GET", f"/{container}/{quote(name)}")
        assert status in (200, 404), body
        return body if status == 200 else None

    def names(self, prefix: str, container: str = AZURE_CONTAINER) -> list[str]:
        """The committed blobs under `prefix`, every page of the listing."""
        names: list[str] = []
        marker = ""
        while True:
            query = f"?restype=container&comp=list&prefix={quote(prefix, safe='')}"
            if marker:
                query += f"&marker={quote(marker, safe='')}"
            status, _, body = self.request("GET", f"/{container}{query}")
            assert status == 200, body
            listed = ElementTree.fromstring(body)
            names += [blob.findtext("Name") or "" for blob in listed.iter("Blob")]
            marker = listed.findtext("NextMarker") or ""
            if not marker:
                return names

    def uncommitted(self, name: str, container: str = AZURE_CONTAINER) -> int:
        """How many uncommitted blocks the blob name `name` has (Get Block List)."""
        query = "?comp=blocklist&blocklisttype=uncommitted"
        status, _, body = self.request("GET", f"/{container}/{quote(name)}{query}")
        if status == 404:
            return 0
        assert status == 200, body
        return len(ElementTree.fromstring(body).findall("UncommittedBlocks/Block"))


@contextlib.contextmanager
def azure_service_at(where: Path, azurite: str | None) -> Iterator[AzureService]:
    """Azurite (the program `azurite`) or, when that is None, the emulator of
    azure_blob_server.py, on a free port of 127.0.0.1 with its files and log in `where`, until
    the block ends; with the containers AZURE_CONTAINER, AZURE_FAILING_CONTAINER and the two
    of copies that end later (whose hooks only the emulator has)."""
    port = free_port()
    if azurite is not None:
        argv = [azurite, "--blobHost", "127.0.0.1", "--blobPort", str(port)]
        argv += ["--location", str(where), "--silent", "--skipApiVersionCheck", "--loose"]
    else:
        argv = [sys.executable, str(Path(__file__).with_name("azure_blob_server.py"))]
        argv += ["--port", str(port), "--failing-container", AZURE_FAILING_CONTAINER]
        argv += ["--page-size", str(AZURE_PAGE)]
        argv += ["--pending-copy-container", AZURE_PENDING_COPY_CONTAINER]
        argv += ["--failed-copy-container", AZURE_FAILED_COPY_CONTAINER]
    with child_server("the Azure Blob service", argv, port, where / "server.log"):
        service = AzureService(f"http://127.0.0.1:{port}", emulated=azurite is None)
        containers = [AZURE_CONTAINER, AZURE_FAILING_CONTAINER]
        containers += [AZURE_PENDING_COPY_CONTAINER, AZURE_FAILED_COPY_CONTAINER]
        for container in containers:
            status, _, body = service.request("PUT", f"/{container}?restype=container", b"")
            assert status == 201, body
        yield service


@pytest.fixture(scope="module")
def azure_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureService]:
    """Azurite (from npm into .tools/ by `make deps-node`, or on the PATH) or, without it, the
    emulator of azure_blob_server.py, for one test module (see `azure_service_at`)."""
    azurite = str(_AZURITE) if _AZURITE.exists() else shutil.which("azurite-blob")
    with azure_service_at(tmp_path_factory.mktemp("azure"), azurite) as service:
        yield service


def use_azure(monkeypatch: pytest.MonkeyPatch, service: AzureService) -> None:
    """Points ferrio's az:// store at `service` the way object_store documents for emulators
    (``AZURE_STORAGE_USE_EMULATOR``, ``AZURITE_BLOB_STORAGE_URL``): every request is signed with
    Shared Key and the emulator account's key."""
    for k in list(os.environ):
        if k.startswith("AZURE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", service.url)


class Recorder:
    """Stands in for ferrio.open and records every (offset, size) read of tensor bytes (the
    header is read through the real file the proxy wraps, and not counted): the safetensors
    tests' count of what a load reads."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[int, int]] = []
        real = ferrio.open
        real_header = fs.safetensors_read_header
        rec = self

        class Proxy:
            def __init__(self, path, mode="r"):
                self.f = real(path, mode)

            def pread(self, buf, size=None, offset=0):
                rec.reads.append((offset, memoryview(buf).nbytes))
                return self.f.pread(buf, size, offset)

            def read(self, buf, size=None, offset=0):
                rec.reads.append((offset, memoryview(buf).nbytes))
                return self.f.read(buf, size, offset)

            def close(self):
                self.f.close()

        monkeypatch.setattr(ferrio, "open", Proxy)
        monkeypatch.setattr(
            fs, "safetensors_read_header", lambda h: real_header(h.f if isinstance(h, Proxy) else h)
        )

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.reads)
