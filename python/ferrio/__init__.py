"""ferrio: move file bytes into and out of host and GPU memory fast.

Reads and writes are split into tasks that run in parallel on a worker pool per block device,
with the GIL released; a cache policy (the ``cache`` setting) keeps what fits in the page cache
and sends the rest past it with O_DIRECT. Any writable buffer works as a destination: numpy
arrays of any dtype and shape, bytearray, memoryview, mmap.

>>> import numpy as np, ferrio
>>> with ferrio.open("weights.bin") as f:            # doctest: +SKIP
...     arr = np.empty(f.size, dtype=np.uint8)
...     n = f.read(arr)                               # parallel, blocking
...     fut = f.pread(arr, size=4096, offset=0)       # returns at once; fut.result() or await

Settings (task size, O_DIRECT policy, threads) live in `ferrio.config`; each has a
``FERRIO_*`` environment variable.
"""

from __future__ import annotations

import os
import sys
import warnings

from ferrio import config
from ferrio._convenience import fromfile
from ferrio._native import (
    CancelledError,
    CudaError,
    CudaUnavailableError,
    FerrioError,
    File,
    IOFuture,
    RemoteFile,
    RemoteWriter,
    Residency,
    __version__,
    copy,
    drop_cache,
    drop_system_cache,
    open,
    open_url,
    residency,
    stats,
    wait,
)

__all__ = [
    "CancelledError",
    "CudaError",
    "CudaUnavailableError",
    "FerrioError",
    "File",
    "IOFuture",
    "RemoteFile",
    "RemoteWriter",
    "Residency",
    "__version__",
    "config",
    "copy",
    "drop_cache",
    "drop_system_cache",
    "fromfile",
    "open",
    "open_url",
    "residency",
    "stats",
    "wait",
]


def _imported_by_the_command_line() -> bool:
    """Whether this import is the ``ferrio`` command's (console script or ``python -m ferrio``).

    The command reports a bad ``FERRIO_*`` value itself, as an error.
    """
    if not sys.argv:
        return False
    if sys.argv[0] == "-m":
        # Python says "-m" here while it imports the package of the module it runs.
        args = getattr(sys, "orig_argv", [])
        after_m = args[args.index("-m") + 1 :][:1] if "-m" in args else []
        return "-mferrio" in args or after_m == ["ferrio"]
    return os.path.basename(sys.argv[0]) == "ferrio"


def _warn_about_environment() -> None:
    """Warn of the ``FERRIO_*`` environment's mistakes, each once.

    A bad value (the defaults are in force), and each variable that names no setting (ignored).
    """
    if _imported_by_the_command_line():
        return
    problem = config.environment_error()
    if problem is not None:
        warnings.warn(
            f"ferrio: ignoring the FERRIO_* environment, defaults in force: {problem}",
            RuntimeWarning,
            stacklevel=3,
        )
    for line in config.environment_warnings():
        warnings.warn(f"ferrio: {line}", RuntimeWarning, stacklevel=3)


_warn_about_environment()
