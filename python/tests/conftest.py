"""Shared fixtures: files of known content."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

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
