"""Reading ahead of ``safe_open.get_tensor`` calls that walk a checkpoint in order.

Code written for ``safetensors.safe_open`` asks for one tensor at a time (``for k in f.keys():
f.get_tensor(k)``, as transformers and vLLM load). Read one by one, each tensor waits for its
own read and the engine's workers idle between calls. Once two calls in a row ask for
neighbours in file order or in ``keys()`` order, the next tensors in that order are read ahead,
each into memory of its own, while the caller works: up to ``tensor_read_ahead`` bytes of
them (always at least the next one). A call for a tensor read ahead waits only for what is
left of its read.

What a caller gets is unchanged: each tensor has its own buffer, allocated as ``get_tensor``
would, and a read's error is raised by the call that asks for that tensor. Tensors read ahead
that the caller skips are let go (after their reads end); a call that goes backwards counts
as a miss, and after ``_MISSES_TO_STOP`` of them this handle reads no further ahead.

A forked child starts with none read ahead: the reads it inherited belong to the parent (their
futures fail in the child, and the child's copy of their memory holds whatever had arrived at
the fork), so it reads those tensors itself, and its lock is a new one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any

import ferrio
from ferrio._native import SafetensorError

if TYPE_CHECKING:
    from ferrio.safetensors import _Checkpoint, _Tensor
    from ferrio.safetensors._frameworks import Framework

# Backward calls after which a handle stops reading ahead: its caller follows no order.
_MISSES_TO_STOP = 2
# Reads ahead at once, however small the tensors: each is one request of the engine.
_MOST_AHEAD = 256


def truncated(path: str, got: int, want: int, begin: int) -> SafetensorError:
    """Return the error of a read that found fewer bytes than the header promised."""
    return SafetensorError(
        f"invalid safetensors file {path}: truncated, {got} of {want} bytes at offset {begin}"
    )


class TensorRead:
    """One tensor's read into a buffer of its own: started at once, finished by `take`.

    The buffer is placed as a load places a tensor (at its file alignment modulo 8), so a
    tensor whose bytes are aligned in the file is a view of it, and others a copy.
    """

    __slots__ = ("at", "buf", "future", "tensor")

    def __init__(self, fw: Framework, ckpt: _Checkpoint, t: _Tensor) -> None:
        fw.check_dtype(t.name, t.dtype)
        self.tensor = t
        self.at = t.begin % 8
        self.buf = fw.tensor_buffer(self.at + t.nbytes)
        self.future: ferrio.IOFuture | None = None
        if t.nbytes:
            target = fw.target(self.buf, self.at, self.at + t.nbytes)
            self.future = ckpt.handles[t.path].pread(target, offset=t.begin)

    def take(self, fw: Framework) -> Any:
        """Wait for the read; return the tensor (SafetensorError if the file was short)."""
        t = self.tensor
        if self.future is not None:
            got = self.future.result()
            if got != t.nbytes:
                raise truncated(t.path, got, t.nbytes, t.begin)
        tensor = fw.view(self.buf, self.at, self.at + t.nbytes, t.dtype, t.shape)
        fw.handed_out(tensor)
        return tensor

    def settle(self) -> None:
        """Wait for the read and ignore its result: the tensor is not wanted."""
        if self.future is not None:
            # Nobody asked for this tensor: its error is moot.
            with contextlib.suppress(Exception):
                self.future.result()


class ReadAhead:
    """The reads ahead of one ``safe_open`` handle.

    State under `_lock`: the order being followed (file order or ``keys()`` order, once two
    calls in a row asked for neighbours in it), the reads started ahead in that order (a run of
    consecutive positions ending before `_next`), and the bytes they hold. Waiting for a read
    happens outside the lock, so threads that ask for different tensors do not queue.
    """

    def __init__(self, fw: Framework, ckpt: _Checkpoint, window: int) -> None:
        self._fw, self._ckpt, self._window = fw, ckpt, window
        # File order and keys() order, and each name's position in them: made by the first
        # call (a handle used only for whole loads never needs them).
        self._orders: tuple[list[str], ...] = ()
        self._where: tuple[dict[str, int], ...] = ()
        self._lock = threading.Lock()
        self._last: str | None = None  # the name of the last call
        self._order: int | None = None  # index into `_orders` being followed, or None
        self._ahead: deque[TensorRead] = deque()  # started, not yet asked for, in order
        self._next = 0  # position in the order of the next read to start
        self._bytes = 0  # bytes of `_ahead`
        self._misses = 0
        # The position whose read could not start ahead (no memory, say), or None: not tried
        # again until a call moves `_next` past the reads ahead.
        self._stalled: int | None = None
        self.hits = 0  # calls served by a read started ahead (for tests and benchmarks)
        _LIVE.add(self)

    def get(self, t: _Tensor) -> Any:
        """Return tensor `t` in memory of its own, reading ahead where the calls follow order."""
        let_go: list[TensorRead] = []
        with self._lock:
            if not self._orders:
                ckpt = self._ckpt
                self._orders = (list(ckpt.order), sorted(ckpt.tensors))
                self._where = tuple({n: i for i, n in enumerate(o)} for o in self._orders)
            read = self._claim(t, let_go)
            self._top_up()
        for r in let_go:
            r.settle()
        if isinstance(read, Exception):  # its read could not start: say why, once
            raise read
        if read is None:  # not read ahead: read it now, as a call without read-ahead does
            read = TensorRead(self._fw, self._ckpt, t)
        return read.take(self._fw)

    def close(self) -> None:
        """Wait for the reads still ahead and let them go; nothing is read ahead after this."""
        with self._lock:
            let_go = list(self._ahead)
            self._ahead.clear()
            self._bytes = 0
            self._order = None
            self._misses = _MISSES_TO_STOP
        for r in let_go:
            r.settle()

    def _claim(self, t: _Tensor, let_go: list[TensorRead]) -> TensorRead | Exception | None:
        """Return the read of `t`: started ahead or now, why it could not start, or None.

        None: the caller reads `t` itself.

        Updates which order the calls follow. Reads ahead that are not wanted any more go to
        `let_go`, for the caller to settle outside the lock.
        """
        name, last = t.name, self._last
        self._last = name
        if self._order is not None and self._ahead:
            where = self._where[self._order]
            if where[self._ahead[0].tensor.name] <= where[name] < self._next:
                # Read ahead; the tensors before it in the order were skipped.
                while self._ahead[0].tensor.name != name:
                    let_go.append(self._pop_first())
                self.hits += 1
                return self._pop_first()
        if last is None or self._misses >= _MISSES_TO_STOP or self._window <= 0:
            return None
        # A call for the neighbour of the last one, in the order followed or the other one
        # (a walk in keys() order over a file whose order differs, by dtype, say).
        followed = [] if self._order is None else [self._order]
        for i in followed + [i for i in range(len(self._orders)) if i != self._order]:
            where = self._where[i]
            if where[name] == where[last] + 1:
                return self._follow(i, where[name], t, let_go)
        if self._order is not None:
            pos = self._where[self._order][name]
            if pos >= self._next:  # a skip past everything read ahead: the same walk
                return self._follow(self._order, pos, t, let_go)
            # Backwards, or a tensor asked for again: read alone.
            self._misses += 1
            if self._misses >= _MISSES_TO_STOP:
                self._order = None
                while self._ahead:
                    let_go.append(self._pop_first())
        return None

    def _follow(
        self, order: int, pos: int, t: _Tensor, let_go: list[TensorRead]
    ) -> TensorRead | Exception:
        """Follow `order` from `t`, at position `pos` in it: the reads ahead start after it."""
        while self._ahead:
            let_go.append(self._pop_first())
        self._order, self._next = order, pos + 1
        self._stalled = None
        return self._start(t)

    def _start(self, t: _Tensor) -> TensorRead | Exception:
        """Start `t`'s read now, before the reads ahead, so they overlap it.

        Where it cannot start (no memory, a dtype this library lacks, a closed file), the
        error, for the call to raise outside the lock.
        """
        try:
            return TensorRead(self._fw, self._ckpt, t)
        except Exception as e:
            return e

    def _top_up(self) -> None:
        """Start reads in the order followed until the window is full (at least one ahead)."""
        if self._order is None or self._stalled == self._next:
            return
        self._stalled = None
        order = self._orders[self._order]
        window = self._fw.read_ahead_window(self._window)
        while self._next < len(order) and len(self._ahead) < _MOST_AHEAD:
            t = self._ckpt.tensors[order[self._next]]
            if self._ahead and self._bytes + t.nbytes > window:
                break
            try:
                read = TensorRead(self._fw, self._ckpt, t)
            except Exception:
                # Out of memory, or a dtype this library lacks: the call that asks for it
                # reads it alone and raises then. Nothing more ahead until the calls reach
                # it: trying again on every call would fail as often (and a GPU library's
                # out-of-memory path empties its cache each time).
                self._stalled = self._next
                break
            self._ahead.append(read)
            self._bytes += t.nbytes
            self._next += 1

    def _forget_in_child(self) -> None:
        """In a forked child: drop the parent's reads without waiting, and take a new lock."""
        self._lock = threading.Lock()
        self._ahead.clear()
        self._bytes = 0
        self._order = None
        self._last = None

    def _pop_first(self) -> TensorRead:
        read = self._ahead.popleft()
        self._bytes -= read.tensor.nbytes
        return read


# Every live ReadAhead, for the fork hook below.
_LIVE: weakref.WeakSet[ReadAhead] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for ahead in list(_LIVE):
        ahead._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
