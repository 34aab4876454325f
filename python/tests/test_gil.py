"""The GIL is released while I/O runs, and Ctrl-C interrupts a wait promptly and safely."""

from __future__ import annotations

import _thread
import contextlib
import math
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ferrio


@pytest.fixture
def no_preemption() -> Iterator[None]:
    """Stop Python from switching threads on its own: only a released GIL lets others run."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    yield
    sys.setswitchinterval(before)


def slow_read_load(f: ferrio.File, data: np.ndarray, jobs: int = 24) -> list[ferrio.IOFuture]:
    """Queue reads into one shared array so that any other read on the pool takes a while
    (workers share themselves round-robin between the queued reads)."""
    shared = np.empty(len(data), dtype=np.uint8)
    return [f.pread(shared) for _ in range(jobs)]


def lasting_load(f: ferrio.File, data: np.ndarray, seconds: float = 3.0) -> list[ferrio.IOFuture]:
    """As `slow_read_load`, with as many reads as take about `seconds` on this machine (timed by
    one read first): a machine whose caches hold the file and its buffer copies a fixed number
    of them in less than the 0.2 s a Ctrl-C test waits before it interrupts."""
    start = time.monotonic()
    f.read(np.empty(len(data), dtype=np.uint8))
    one = max(time.monotonic() - start, 1e-4)
    return slow_read_load(f, data, jobs=min(20_000, max(200, math.ceil(seconds / one))))


def stop(load: list[ferrio.IOFuture]) -> None:
    for fut in load:
        fut.cancel()
    for fut in load:
        with contextlib.suppress(ferrio.CancelledError):
            fut.result(timeout=60)


def test_threads_meet_at_a_barrier_while_reads_run(
    big_file: tuple[Path, np.ndarray], no_preemption: None
) -> None:
    path, data = big_file
    barrier = threading.Barrier(2, timeout=20)
    reading = threading.Event()
    finished_at: list[float] = []

    with ferrio.open(path, direct_read="off") as f:
        load = slow_read_load(f, data)

        def reader() -> None:
            buf = np.empty(len(data), dtype=np.uint8)
            reading.set()
            f.read(buf)  # long: shares the pool with the load
            finished_at.append(time.monotonic())

        def other() -> None:
            barrier.wait()

        r = threading.Thread(target=reader)
        o = threading.Thread(target=other)
        r.start()
        assert reading.wait(20)
        o.start()
        # The main thread and `other` can only meet while `reader` is inside f.read() if that
        # call released the GIL (preemption is off); otherwise this times out.
        barrier.wait()
        met_at = time.monotonic()
        o.join(20)
        r.join(60)
        stop(load)
    assert finished_at, "the read did not finish"
    assert met_at < finished_at[0], "the read ended before the threads met: proves nothing"


def test_a_counter_runs_while_another_thread_reads(
    big_file: tuple[Path, np.ndarray], no_preemption: None
) -> None:
    path, data = big_file
    count = 0
    done = False

    def counter() -> None:
        nonlocal count
        while not done:
            count += 1
            if count % 100 == 0:
                time.sleep(0)  # let the reader take the GIL back when its read returns

    with ferrio.open(path, direct_read="off") as f:
        load = slow_read_load(f, data, jobs=8)
        c = threading.Thread(target=counter)
        c.start()
        buf = np.empty(len(data), dtype=np.uint8)
        before = count
        f.read(buf)  # with preemption off, `counter` runs only while this releases the GIL
        during = count - before
        done = True
        c.join(20)
        stop(load)
    np.testing.assert_array_equal(buf, data)
    assert during > 1000, during


def test_ctrl_c_interrupts_a_blocking_read(
    big_file: tuple[Path, np.ndarray], python_sigint: None
) -> None:
    path, data = big_file
    with ferrio.open(path, direct_read="off") as f:
        load = lasting_load(f, data)
        timer = threading.Timer(0.2, _thread.interrupt_main)
        mine = np.empty(len(data), dtype=np.uint8)
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            f.read(mine)
            time.sleep(30)  # only reached if the read ended before the interrupt came
        waited = time.monotonic() - start
        timer.join()
        still_running = sum(not fut.done() for fut in load)
        stop(load)
        assert waited < 2.0, f"KeyboardInterrupt took {waited:.2f} s"
        assert still_running > 0, "the load ended before the interrupt: the read was not long"
        # The file is still usable afterwards.
        small = np.empty(1 << 20, dtype=np.uint8)
        assert f.read(small, offset=12345) == 1 << 20
        np.testing.assert_array_equal(small, data[12345 : 12345 + (1 << 20)])


def test_ctrl_c_interrupts_result_and_wait(
    big_file: tuple[Path, np.ndarray], python_sigint: None
) -> None:
    path, data = big_file
    with ferrio.open(path, direct_read="off") as f:
        for how in ("result", "wait"):
            load = lasting_load(f, data)
            fut = f.pread(np.empty(len(data), dtype=np.uint8))
            timer = threading.Timer(0.2, _thread.interrupt_main)
            timer.start()
            start = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                if how == "result":
                    fut.result()
                else:
                    ferrio.wait([fut, *load])
                time.sleep(30)
            waited = time.monotonic() - start
            timer.join()
            assert waited < 2.0, f"{how}: KeyboardInterrupt took {waited:.2f} s"
            # The interrupted operation was cancelled and has stopped.
            assert fut.done()
            with pytest.raises(ferrio.CancelledError):
                fut.result(0)
            stop(load)
        assert f.read(bytearray(10)) == 10
