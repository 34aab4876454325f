"""ferrio.config: names match the FERRIO_* variables; set() restores as a context manager."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ferrio
from ferrio import config


def test_settings_have_the_names_of_their_variables() -> None:
    infos = config.describe()
    names = {i.name for i in infos}
    assert {"task_size", "direct_read", "direct_write", "direct_overread", "max_threads"} <= names
    assert set(config.settings()) == names
    for info in infos:
        assert info.env == "FERRIO_" + info.name.upper()
        assert info.doc and info.unit
        assert config.get(info.env) == config.get(info.name)


def test_defaults_and_docs_come_from_the_native_table() -> None:
    # A fresh process without FERRIO_* variables runs on the table's defaults: setting every
    # setting to its described default changes nothing.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRIO_")}
    code = (
        "import ferrio\n"
        "c = ferrio.config\n"
        "before = c.settings()\n"
        "c.set(**{i.name: i.default for i in c.describe()})\n"
        "print(c.settings() == before, c.get('direct_write'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True", "auto"]
    doc = config.__doc__ or ""
    for info in config.describe():
        assert f"``{info.env}``" in doc and info.doc in doc


def test_typed_values(restore_settings: None) -> None:
    assert isinstance(config.get("task_size"), int)
    assert isinstance(config.get("direct_overread"), bool)
    assert config.get("direct_read") in ("off", "on", "auto")
    config.set(task_size="2MiB", direct_overread=True, direct_read="ON")
    assert config.get("task_size") == 2 << 20
    assert config.get("direct_overread") is True
    assert config.get("direct_read") == "on"
    config.set(FERRIO_TASK_SIZE=65536, direct_overread="off")
    assert config.get("task_size") == 65536
    assert config.get("direct_overread") is False


def test_set_is_a_context_manager_that_restores(restore_settings: None) -> None:
    before = config.settings()
    with config.set(task_size="1MiB", direct_read="off") as change:
        assert config.get("task_size") == 1 << 20
        assert config.get("direct_read") == "off"
        with config.set(task_size=8192):
            assert config.get("task_size") == 8192
        assert config.get("task_size") == 1 << 20
        assert "task_size" in repr(change)
    assert config.settings() == before
    with pytest.raises(KeyError), config.set(max_threads=3):
        raise KeyError("the old values come back on errors too")
    assert config.settings() == before


def test_bad_values_name_setting_value_and_forms(restore_settings: None) -> None:
    before = config.settings()
    with pytest.raises(ValueError, match=r"task_size: expected .*4MiB") as e:
        config.set(task_size="lots")
    assert '"lots"' in str(e.value)
    with pytest.raises(ValueError, match=r"direct_read.*off\|on\|auto"):
        config.set(direct_read="maybe")
    with pytest.raises(ValueError, match="at least 1"):
        config.set(max_threads=0)
    # A bool given to a size is named as given, not as the "on" it once became.
    with pytest.raises(ValueError, match='invalid value "True" for task_size'):
        config.set(task_size=True)
    # Sizes near 2**64 once wrapped around in the plan: a read got a task of almost 2**64 bytes.
    for huge in (2**64 - 1, 2**63, 2**50 + 1):
        with pytest.raises(ValueError, match="at most 1024TiB"):
            config.set(task_size=huge)
    with pytest.raises(ValueError, match=r"unknown setting.*task_size"):
        config.get("no_such_setting")
    with pytest.raises(ValueError, match="task_size"):
        config.set(no_such_setting=1)
    with pytest.raises(TypeError, match="int, a bool or a str"):
        config.set(task_size=[1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="int, a bool or a str"):
        config.set(task_size=4096.0)  # type: ignore[arg-type]
    # Other integer types, as numpy's, are ints (numpy.fromfile takes them as counts too).
    import numpy as np

    with config.set(task_size=np.int64(1 << 20), max_threads=np.uint8(3)):
        assert config.get("task_size") == 1 << 20
        assert config.get("max_threads") == 3
    # All or none: the good value before the bad one was not applied.
    with pytest.raises(ValueError):
        config.set(task_size="1MiB", direct_read="maybe")
    assert config.settings() == before


def test_files_take_the_settings_in_force_at_open(tmp_path: Path, restore_settings: None) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"x" * 100_000)
    with config.set(task_size="4KiB"), ferrio.open(path) as f:
        pass
    buf = bytearray(100_000)
    with ferrio.open(path, task_size=4096, direct_read=False, direct_overread="on") as f:
        assert f.read(buf) == 100_000


def test_environment_variables_are_read_at_start() -> None:
    env = dict(os.environ, FERRIO_TASK_SIZE="1MiB", FERRIO_DIRECT_READ="off")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ferrio; "
            "print(ferrio.config.get('task_size'), ferrio.config.get('direct_read'))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [str(1 << 20), "off"]


def test_stats_show_the_pools_and_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(b"x" * (3 << 20))
    with ferrio.open(path) as f:
        f.read(bytearray(3 << 20))
    pools = ferrio.stats()
    assert pools, "reading made a pool"
    for p in pools:
        assert set(p) >= {"key", "threads", "max_threads", "bytes_read", "tasks", "busy_seconds"}
    assert sum(p["bytes_read"] for p in pools) >= 3 << 20
