"""Futures from asyncio and with callbacks: the event loop keeps running while I/O waits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ferrio


def test_await_returns_the_byte_count(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file

    async def main() -> int:
        with ferrio.open(path) as f:
            buf = np.empty(1 << 20, dtype=np.uint8)
            n = await f.pread(buf, offset=4096)
            np.testing.assert_array_equal(buf, data[4096 : 4096 + (1 << 20)])
            return n

    assert asyncio.run(main()) == 1 << 20


def test_gather_of_many_reads(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file
    chunk = 8 << 20

    async def main() -> list[int]:
        with ferrio.open(path) as f:
            bufs = [np.empty(chunk, dtype=np.uint8) for _ in range(8)]
            counts = await asyncio.gather(
                *(f.pread(b, offset=i * chunk) for i, b in enumerate(bufs))
            )
            for i, b in enumerate(bufs):
                np.testing.assert_array_equal(b, data[i * chunk : (i + 1) * chunk])
            return list(counts)

    assert asyncio.run(main()) == [chunk] * 8


def test_event_loop_runs_while_a_read_waits(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file

    async def main() -> tuple[int, int]:
        with ferrio.open(path, direct_read="off") as f:
            buf = np.empty(len(data), dtype=np.uint8)
            fut = f.pread(buf)
            ticks_while_reading = 0
            stop = False

            async def ticker() -> None:
                nonlocal ticks_while_reading
                while not stop:
                    if not fut.done():
                        ticks_while_reading += 1
                    await asyncio.sleep(0)

            tick = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            n = await fut
            stop = True
            await tick
            np.testing.assert_array_equal(buf, data)
            return n, ticks_while_reading

    n, ticks = asyncio.run(main())
    assert n == len(big_file[1])
    # A blocking await would have let the ticker run at most once before the read finished.
    assert ticks > 10, ticks


def test_await_raises_the_operation_error() -> None:
    path = Path("/proc/self/mem")
    if not path.exists():
        pytest.skip("no /proc/self/mem on this system")

    async def main() -> None:
        with ferrio.open(path) as f:
            await f.pread(bytearray(4096), offset=0)

    with pytest.raises(OSError) as e:
        asyncio.run(main())
    assert e.value.filename == str(path)


def test_cancelling_the_task_cancels_the_io(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file

    async def main() -> ferrio.IOFuture:
        with ferrio.open(path, task_size="64KiB", direct_read="off") as f:
            buf = np.empty(len(data), dtype=np.uint8)
            fut = f.pread(buf)
            task = asyncio.ensure_future(fut)
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return fut

    fut = asyncio.run(main())
    # The I/O has stopped (or finished just in time); either way it is done and holds nothing.
    try:
        n = fut.result(timeout=30)
    except ferrio.CancelledError:
        pass
    else:
        assert n == len(data)


def test_done_callbacks_get_the_future(big_file: tuple[Path, np.ndarray]) -> None:
    path, _ = big_file
    called = threading.Event()
    seen: list[tuple[ferrio.IOFuture, int, str]] = []
    with ferrio.open(path) as f:
        fut = f.pread(np.empty(64 << 20, dtype=np.uint8))

        def cb(done: ferrio.IOFuture) -> None:
            seen.append((done, done.result(0), threading.current_thread().name))
            called.set()

        fut.add_done_callback(cb)
        assert called.wait(30)
        assert seen[0][0] is fut and seen[0][1] == 64 << 20
        # Registered after completion: called at once, in this thread.
        late: list[ferrio.IOFuture] = []
        fut.add_done_callback(late.append)
        assert late == [fut]


def test_callback_exceptions_are_reported_not_raised(
    big_file: tuple[Path, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = big_file
    reported: list[BaseException | None] = []
    done = threading.Event()
    monkeypatch.setattr(sys, "unraisablehook", lambda u: (reported.append(u.exc_value), done.set()))

    def bad(_: ferrio.IOFuture) -> None:
        raise RuntimeError("callback failed")

    with ferrio.open(path) as f:
        fut = f.pread(np.empty(32 << 20, dtype=np.uint8))
        fut.add_done_callback(bad)
        after: list[int] = []
        fut.add_done_callback(lambda x: after.append(x.result()))
        assert fut.result() == 32 << 20
        assert done.wait(30)
        fut.add_done_callback(bad)  # done already: runs here, still only reported
    assert len(reported) >= 1 and isinstance(reported[0], RuntimeError)
    assert after == [32 << 20]


def test_timeout(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file
    with ferrio.open(path, task_size="64KiB", direct_read="off") as f:
        shared = np.empty(len(data), dtype=np.uint8)
        load = [f.pread(shared) for _ in range(8)]
        fut = f.pread(np.empty(len(data), dtype=np.uint8))
        with pytest.raises(TimeoutError):
            fut.result(timeout=0)
        with pytest.raises(TimeoutError):
            ferrio.wait([fut, *load], timeout=0.001)
        assert fut.result(timeout=60) == len(data), "the operation went on after the timeout"
        assert ferrio.wait(load) == [len(data)] * 8
        # Any iterable, as concurrent.futures.wait takes; what is not a future is a TypeError.
        assert ferrio.wait(f.pread(np.empty(4096, np.uint8)) for _ in range(3)) == [4096] * 3
        assert ferrio.wait(iter(load)) == [len(data)] * 8
        with pytest.raises(TypeError):
            ferrio.wait([load[0], 5])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            ferrio.wait(5)  # type: ignore[arg-type]


def test_timeouts_too_long_to_count_mean_no_limit(big_file: tuple[Path, np.ndarray]) -> None:
    # Such a deadline overflowed the clock and raised a PanicException (a BaseException).
    path, data = big_file
    with ferrio.open(path, task_size="64KiB", direct_read="off") as f:
        for timeout in (1e19, 1e30, float("inf")):
            fut = f.pread(np.empty(len(data), dtype=np.uint8))
            assert fut.result(timeout=timeout) == len(data)
            assert fut.exception(timeout=timeout) is None
            again = f.pread(np.empty(1 << 20, dtype=np.uint8))
            assert ferrio.wait([again], timeout=timeout) == [1 << 20]
        assert ferrio.wait([], timeout=1e19) == []


def test_a_callback_added_while_the_buffer_is_released_does_not_hang(
    data_file: tuple[Path, np.ndarray],
) -> None:
    # Releasing the buffer of a finished read may run Python code (here the exporter's
    # finalizer). add_done_callback used to release it holding a lock that code may need again
    # (adding a callback itself, or another thread doing so): the process hung with the GIL held,
    # so the check runs in a child process with a time limit.
    script = f"""
import ctypes, time
import ferrio

calls = []

class Buf(ctypes.c_char * 4096):
    def __del__(self):
        fut.add_done_callback(lambda f: calls.append("from the finalizer"))

with ferrio.open({str(data_file[0])!r}) as f:
    fut = f.pread(Buf())
    while "running" in repr(fut):  # wait without observing the future (done() would)
        time.sleep(0.01)
    fut.add_done_callback(lambda f: calls.append("first"))
print("|".join(calls))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "from the finalizer|first", out.stderr
