"""The cache policy: `cache=keep` leaves what it read in the page cache, `cache=bypass` leaves a
cold file cold and a hot one hot, `auto` keeps a file that fits in memory; bad values name the
variable and the accepted values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import pattern

import ferrio
from ferrio import config

SIZE = 16 << 20


def cold_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    pattern(SIZE, seed=3).tofile(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    ferrio.drop_cache(path)
    assert ferrio.residency(path).share < 0.02
    return path


def read_all(path: Path, **options: str) -> None:
    buf = np.empty(SIZE, np.uint8)
    with ferrio.open(path, **options) as f:  # type: ignore[arg-type]
        assert f.read(buf) == SIZE


def test_keep_leaves_the_file_in_the_page_cache(tmp_path: Path) -> None:
    path = cold_file(tmp_path, "keep.bin")
    read_all(path, cache="keep")
    assert ferrio.residency(path).share >= 0.99


def test_bypass_leaves_a_cold_file_cold_and_a_hot_file_hot(tmp_path: Path) -> None:
    path = cold_file(tmp_path, "bypass.bin")
    read_all(path, cache="bypass")
    assert ferrio.residency(path).share <= 0.03
    path.read_bytes()
    read_all(path, cache="bypass")
    assert ferrio.residency(path).share >= 0.99


def test_auto_keeps_a_file_that_fits_in_memory(tmp_path: Path) -> None:
    path = cold_file(tmp_path, "auto.bin")
    assert config.get("cache") == "auto"
    read_all(path)
    assert ferrio.residency(path).share >= 0.99


def test_bad_cache_values_name_the_setting_and_the_forms(restore_settings: None) -> None:
    with pytest.raises(ValueError, match=r"cache.*auto\|keep\|bypass"):
        config.set(cache="sometimes")
    with pytest.raises(ValueError, match=r"auto\|keep\|bypass"):
        ferrio.open(__file__, cache="sometimes")
    env = dict(os.environ, FERRIO_CACHE="sometimes")
    out = subprocess.run(
        [sys.executable, "-c", "import ferrio; print(ferrio.config.environment_error())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "FERRIO_CACHE" in out.stdout and "auto|keep|bypass" in out.stdout, out


def _info(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "ferrio", "info", "--json", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    info: dict[str, Any] = json.loads(out.stdout)
    return info


def test_writes_keep_or_bypass_as_asked_and_a_synced_save_bypasses(tmp_path: Path) -> None:
    data = pattern(SIZE, seed=4)
    keep = tmp_path / "keep.bin"
    with ferrio.File(keep, "w", cache="keep") as f:
        assert f.write(data) == SIZE
        f.sync()
    assert ferrio.residency(keep).share >= 0.99
    info = _info(keep)
    assert isinstance(info["writes"]["direct"], bool) and info["writes"]["reason"], info
    if not info["direct_io"]["available"]:
        pytest.skip("no O_DIRECT here")
    bypass = tmp_path / "bypass.bin"
    with ferrio.File(bypass, "w", cache="bypass") as f:
        assert f.write(data) == SIZE
        f.sync()
    assert ferrio.residency(bypass).share <= 0.03
    # A synced save goes direct under cache=auto (a flush after buffered writes is slower).
    from ferrio.safetensors import numpy as fs

    synced = tmp_path / "synced.safetensors"
    fs.save_file({"t": data}, synced, fsync=True)
    assert ferrio.residency(synced).share <= 0.03
    assert np.array_equal(fs.load_file(synced)["t"], data)
