"""A child process builds its own worker pools: reads in a `fork` or `forkserver` child after the
parent has used the pool complete, also through a File opened before the fork (issue 14), and
its own callback thread: awaits and done callbacks complete in a `fork` child."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import ferrio

# A hang is a failure, not a stuck suite: every wait on a child has this deadline.
DEADLINE_S = 60

MIB = 1 << 20

# The file opened by the parent before it forks, used by the children (fork start method only).
_inherited: ferrio.File | None = None


def _read_path(path: str) -> tuple[int, bytes, int]:
    """Reads the first MiB of `path` in the child: bytes read, a digest, and the bytes read by
    every pool this process sees (only its own)."""
    buf = np.empty(MIB, np.uint8)
    n = ferrio.open(path).read(buf)
    return n, bytes(buf[:64]), sum(p["bytes_read"] for p in ferrio.stats())


def _read_inherited(_: int) -> tuple[int, bytes, int]:
    """Reads through the File the parent opened before forking."""
    assert _inherited is not None
    buf = np.empty(MIB, np.uint8)
    n = _inherited.read(buf)
    return n, bytes(buf[:64]), sum(p["bytes_read"] for p in ferrio.stats())


@pytest.fixture
def two_mib(tmp_path: Path) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(14).integers(0, 256, 2 * MIB, dtype=np.uint8)
    path = tmp_path / "big.bin"
    data.tofile(path)
    return path, data


def _parent_uses_the_pool(path: Path) -> None:
    # One MiB is more than a request run inline: it goes to the pool and starts its threads.
    buf = np.empty(MIB, np.uint8)
    assert ferrio.open(path).read(buf) == MIB
    assert any(p["threads"] > 0 for p in ferrio.stats())


def _map_with_deadline(method: str, func, args: list) -> list:  # type: ignore[no-untyped-def]
    ctx = mp.get_context(method)
    with ctx.Pool(2) as pool:
        try:
            return pool.map_async(func, args).get(timeout=DEADLINE_S)
        except mp.TimeoutError:
            pool.terminate()
            pytest.fail(f"reads in {method} children did not finish in {DEADLINE_S} s (hang)")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_child_reads_after_the_parent_used_the_pool(
    method: str, two_mib: tuple[Path, np.ndarray]
) -> None:
    if method not in mp.get_all_start_methods():
        pytest.skip(f"start method {method} is not available here")
    path, data = two_mib
    _parent_uses_the_pool(path)
    results = _map_with_deadline(method, _read_path, [str(path)] * 2)
    for n, head, child_bytes in results:
        assert n == MIB
        assert head == data[:64].tobytes()
        # The child's statistics count its own read only, not the parent's pools.
        assert child_bytes == MIB
    # The parent's pool still works after the fork.
    _parent_uses_the_pool(path)


def test_a_file_opened_before_fork_reads_in_the_child(two_mib: tuple[Path, np.ndarray]) -> None:
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("start method fork is not available here")
    global _inherited
    path, data = two_mib
    _inherited = ferrio.open(path)
    try:
        buf = np.empty(MIB, np.uint8)
        assert _inherited.read(buf) == MIB
        results = _map_with_deadline("fork", _read_inherited, [0, 1])
        for n, head, child_bytes in results:
            assert n == MIB
            assert head == data[:64].tobytes()
            assert child_bytes == MIB
        assert _inherited.read(buf) == MIB
    finally:
        _inherited = None


def test_a_grandchild_reads_too(two_mib: tuple[Path, np.ndarray]) -> None:
    """A child that used its pools forks again: the grandchild builds its own as well."""
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork here")
    path, _data = two_mib
    _parent_uses_the_pool(path)
    results = _map_with_deadline("fork", _read_then_fork, [str(path)])
    assert results == [0]


def _read_then_fork(path: str) -> int:
    """In a child: read, fork a grandchild that reads, and return its exit status (or -1 when it
    hung and was killed)."""
    _read_path(path)
    pid = os.fork()
    if pid == 0:
        try:
            n, _, _ = _read_path(path)
            os._exit(0 if n == MIB else 1)
        finally:
            os._exit(2)
    return _wait_child(pid, DEADLINE_S / 2)


def _await_and_call_back(path: str) -> tuple[int, bool]:
    """In the child: awaits a read, and waits (bounded) for a done callback."""

    async def read() -> int:
        with ferrio.open(path) as f:
            return await asyncio.wait_for(f.pread(np.empty(MIB, np.uint8)), DEADLINE_S / 4)

    n = asyncio.run(read())
    called = threading.Event()
    with ferrio.open(path) as f:
        fut = f.pread(np.empty(MIB, np.uint8))
        fut.add_done_callback(lambda _: called.set())
        fut.result()
    return n, called.wait(DEADLINE_S / 4)


def test_awaits_and_callbacks_work_in_a_forked_child(two_mib: tuple[Path, np.ndarray]) -> None:
    # Callbacks (and so awaits) run on a dispatcher thread: a fork child of a parent that had
    # started one used to send to the parent's thread, absent in the child, and wait forever.
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("start method fork is not available here")
    path, _ = two_mib
    assert _await_and_call_back(str(path)) == (MIB, True)
    results = _map_with_deadline("fork", _await_and_call_back, [str(path)] * 2)
    assert results == [(MIB, True)] * 2
    assert _await_and_call_back(str(path)) == (MIB, True)


def _wait_child(pid: int, deadline_s: float) -> int:
    """The exit code of child `pid`, or -1 when it did not end within `deadline_s` (killed)."""
    import signal
    import time

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


def _child_sees_the_running_read_end(fut: ferrio.IOFuture, finished_before_fork: int) -> int:
    """In a child forked while `fut` ran: 0 where a callback added here runs and an await
    ends, both with the future's `ValueError`; `finished_before_fork` where it had already
    succeeded; else a code saying what went wrong (see the test below)."""
    called = threading.Event()
    fut.add_done_callback(lambda _: called.set())
    if not called.wait(DEADLINE_S / 4):
        return 4
    if fut.done() and fut.exception() is None:
        return finished_before_fork
    if not fut.done() or not isinstance(fut.exception(), ValueError):
        return 5

    async def wait() -> None:
        await asyncio.wait_for(fut, DEADLINE_S / 4)

    try:
        asyncio.run(wait())
    except ValueError:
        return 0
    except TimeoutError:
        return 7
    return 6


def test_a_forked_child_sees_the_parents_running_read_end(tmp_path: Path) -> None:
    """A child forked while the parent's read runs, with a done callback waiting: the read's
    tasks do not run in the child, so there its future fails at once. A callback added in the
    child ran never, and an await never ended (the child inherited the parent's "the engine
    will call the dispatcher" flag, and neither the parent's workers nor its dispatcher).
    The read is cold, and where it still finished before the fork (the child sees its
    result), it runs again."""
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork here")
    path = tmp_path / "big.bin"
    np.ones(64 * MIB, np.uint8).tofile(path)
    f = ferrio.open(path, task_size=256 << 10)
    finished_before_fork = 8
    for _ in range(5):
        ferrio.drop_cache(path)
        fut = f.pread(np.empty(64 * MIB, np.uint8))
        parent_called = threading.Event()
        fut.add_done_callback(lambda _, called=parent_called: called.set())
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                code = _child_sees_the_running_read_end(fut, finished_before_fork)
            finally:
                os._exit(code)
        code = _wait_child(pid, DEADLINE_S)
        assert fut.result() == 64 * MIB
        assert parent_called.wait(DEADLINE_S / 4)
        if code != finished_before_fork:
            break
    # 4: the callback never ran; 7: the await timed out.
    assert code == 0, (
        "the read finished before every fork" if code == finished_before_fork else code
    )
