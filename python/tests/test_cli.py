"""The ``ferrio`` command line ships in the package and runs from Python."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferrio._cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_help_and_bad_usage() -> None:
    out = run("--help")
    assert out.returncode == 0, out.stderr
    assert "Usage: ferrio" in out.stdout
    for command in ("read", "write", "bench", "info"):
        assert command in out.stdout
    bad = run("no-such-command")
    assert bad.returncode == 2


def test_read_and_info_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"z" * (3 << 20))
    assert run("read", str(path)).returncode == 0
    info = run("info", str(path))
    assert info.returncode == 0, info.stderr
    assert str(path) in info.stdout
    missing = run("read", str(tmp_path / "missing"))
    assert missing.returncode == 2
    assert "missing" in missing.stderr


def test_console_script_is_installed() -> None:
    exe = shutil.which("ferrio")
    if exe is None:
        pytest.skip("the ferrio console script is not on PATH (package not installed with pip)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "ferrio" in out.stdout


def test_cli_main_gives_ctrl_c_back_to_python(tmp_path: Path) -> None:
    # In a child, so that a failure cannot leave this test process without its handler.
    path = tmp_path / "f.bin"
    path.write_bytes(b"z" * 4096)
    script = f"""
import os, signal, ferrio._native as n
signal.signal(signal.SIGINT, signal.default_int_handler)
def on_term(signum, frame):
    print("SIGTERM handled")
signal.signal(signal.SIGTERM, on_term)
for _ in range(2):
    assert n.cli_main(["ferrio", "read", {str(path)!r}]) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        pass
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines().count("KeyboardInterrupt") == 2, out.stdout
    # The SIGTERM handler the command line installs for its run is taken down too.
    assert out.stdout.splitlines().count("SIGTERM handled") == 2, out.stdout
