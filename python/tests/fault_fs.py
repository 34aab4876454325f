"""A FUSE file system for fault injection, run as its own process: ``python3 fault_fs.py DIR``.

Files live in memory, in one flat directory. A file whose name contains ``flush-fails`` takes
its writes, then fails every close (``flush``) of a descriptor opened for writing, and every
``fsync``, with ``EIO``, as NFS, CIFS or a FUSE mount of object storage reports written data
that did not reach storage. A file whose name contains ``slow`` answers each read after 20 ms,
as a network file system far away; one whose name contains ``slow-writes`` each write too.
Needs ``fusepy`` and libfuse 2 (``conftest.fault_fs`` skips without them).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import sys
import threading
import time
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]

FAILS = "flush-fails"
SLOW = "slow"
SLOW_WRITES = "slow-writes"


class FaultFs(Operations):  # type: ignore[misc]
    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}
        self.modes: dict[str, int] = {}
        self._mutex = threading.Lock()
        self.handles = itertools.count(1)
        self.writers: set[int] = set()  # handles opened for writing

    def _writer(self) -> int:
        fh = next(self.handles)
        with self._mutex:
            self.writers.add(fh)
        return fh

    def _name(self, path: str) -> str:
        name = path.lstrip("/")
        if "/" in name:
            raise FuseOSError(errno.ENOENT)
        return name

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        now = time.time()
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, "st_size": 0}
        name = self._name(path)
        with self._mutex:
            if name not in self.files:
                raise FuseOSError(errno.ENOENT)
            size = len(self.files[name])
            mode = self.modes[name]
        return {
            "st_mode": stat.S_IFREG | mode,
            "st_nlink": 1,
            "st_size": size,
            "st_mtime": now,
            "st_atime": now,
            "st_ctime": now,
        }

    def readdir(self, path: str, fh: Any) -> list[str]:
        with self._mutex:
            return [".", "..", *self.files]

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        name = self._name(path)
        with self._mutex:
            self.files[name] = bytearray()
            self.modes[name] = mode & 0o7777
        return self._writer()

    def open(self, path: str, flags: int) -> int:
        self.getattr(path)
        if flags & (os.O_WRONLY | os.O_RDWR):
            return self._writer()
        return next(self.handles)

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if SLOW in path:
            time.sleep(0.02)
        with self._mutex:
            return bytes(self.files[self._name(path)][offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        if SLOW_WRITES in path:
            time.sleep(0.02)
        with self._mutex:
            body = self.files[self._name(path)]
            if len(body) < offset:
                body.extend(bytes(offset - len(body)))
            body[offset : offset + len(data)] = data
        return len(data)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        with self._mutex:
            body = self.files[self._name(path)]
            del body[length:]
            body.extend(bytes(length - len(body)))

    def unlink(self, path: str) -> None:
        with self._mutex:
            self.files.pop(self._name(path), None)
            self.modes.pop(self._name(path), None)

    def rename(self, old: str, new: str) -> None:
        with self._mutex:
            self.files[self._name(new)] = self.files.pop(self._name(old))
            self.modes[self._name(new)] = self.modes.pop(self._name(old))

    def chmod(self, path: str, mode: int) -> None:
        with self._mutex:
            self.modes[self._name(path)] = mode & 0o7777

    def chown(self, path: str, uid: int, gid: int) -> None:
        pass

    def utimens(self, path: str, times: Any = None) -> None:
        pass

    def flush(self, path: str, fh: int) -> None:
        with self._mutex:
            writer = fh in self.writers
        if FAILS in path and writer:
            raise FuseOSError(errno.EIO)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        if FAILS in path:
            raise FuseOSError(errno.EIO)

    def release(self, path: str, fh: int) -> None:
        with self._mutex:
            self.writers.discard(fh)


if __name__ == "__main__":
    FUSE(FaultFs(), sys.argv[1], foreground=True, nothreads=False)
