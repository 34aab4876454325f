"""Awaiting an `IOFuture` from asyncio without blocking the event loop.

`IOFuture.__await__` calls `wrap`: the I/O runs on ferrio's worker threads, and its done
callback (on ferrio's callback thread) hands the outcome to the loop with
``call_soon_threadsafe``. The loop never waits on the GIL-free I/O itself.
"""

from __future__ import annotations

import asyncio
import contextlib

from ferrio._native import IOFuture


def wrap(future: IOFuture) -> asyncio.Future[int]:
    """Return an asyncio future of the running loop that resolves like `future`.

    Cancelling the asyncio future (for example by cancelling the task awaiting it) cancels the
    parts of the I/O that have not started; the buffer stays held until the I/O has stopped.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[int] = loop.create_future()

    def on_done(done: IOFuture) -> None:
        # A RuntimeError means the loop was closed while the I/O ran: nobody is left to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, done, waiter)

    def on_cancel(w: asyncio.Future[int]) -> None:
        if w.cancelled():
            future.cancel()

    waiter.add_done_callback(on_cancel)
    future.add_done_callback(on_done)
    return waiter


def _settle(done: IOFuture, waiter: asyncio.Future[int]) -> None:
    """Copy the finished I/O's outcome into `waiter` (on the loop's thread)."""
    if waiter.done():
        return
    try:
        n = done.result(0)
    except Exception as error:  # the I/O's own error (a cancel too), for the awaiting task
        waiter.set_exception(error)
    else:
        waiter.set_result(n)
