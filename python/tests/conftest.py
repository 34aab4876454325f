"""Shared fixtures and helpers: files of known content, and what the remote-storage tests share
(bounded waits, free ports, moto's S3 server)."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ferrio


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
    """Python's own Ctrl-C handler, for tests that interrupt the main thread.

    A shell starts background jobs with SIGINT ignored, and Python then installs no handler, so
    `_thread.interrupt_main()` would do nothing (as a real Ctrl-C would): install it here.
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
