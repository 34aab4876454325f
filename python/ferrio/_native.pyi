"""Type stubs of ferrio's native module (``ferrio._native``), checked by ``mypy.stubtest``."""

import os
import types
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, Literal, Self, SupportsIndex, TypeVar, final, overload

__all__ = [
    "Allocation",
    "CancelledError",
    "CudaError",
    "CudaUnavailableError",
    "FerrioError",
    "File",
    "IOFuture",
    "PoolResource",
    "RemoteFile",
    "RemoteWriter",
    "Residency",
    "SafetensorError",
    "__version__",
    "cli_main",
    "config_describe",
    "config_get",
    "config_set",
    "config_settings",
    "copy",
    "drop_cache",
    "drop_system_cache",
    "env_error",
    "env_warnings",
    "is_remote_url",
    "local_path",
    "open",
    "open_url",
    "residency",
    "safetensors_dtypes",
    "safetensors_header_bytes",
    "safetensors_parse_header",
    "safetensors_read_header",
    "stats",
    "wait",
]

__version__: str

_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]
_T = TypeVar("_T")
_Setting = int | bool | str
# What a setting may be given as: also another integer type (numpy's).
_SettingIn = _Setting | SupportsIndex
# Any object with the buffer protocol: numpy arrays, bytearray, memoryview, mmap. Spelled Any,
# not collections.abc.Buffer, because numpy's stubs declare ndarray.__buffer__ only for Python
# 3.12 and later; a wrong object raises TypeError at run time.
_Buffer = Any

class FerrioError(Exception):
    """Root of every ferrio error that is not an OSError or a ValueError."""

class CancelledError(FerrioError):
    """The operation was cancelled before it finished."""

class CudaUnavailableError(FerrioError):
    """A GPU array was given but CUDA cannot be used in this process."""

class CudaError(FerrioError):
    """A CUDA driver call failed."""

class SafetensorError(ValueError):
    """A safetensors file breaks a rule of the format (the message names tensor and rule)."""

@final
class File:
    """An open file whose reads and writes run in parallel with the GIL released."""

    def __new__(
        cls,
        path: _Path,
        mode: str = "r",
        *,
        task_size: _SettingIn | None = None,
        cache: _SettingIn | None = None,
        direct_read: _SettingIn | None = None,
        direct_write: _SettingIn | None = None,
        direct_overread: _SettingIn | None = None,
    ) -> File: ...
    def read(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> int:
        """Read into `buf` in parallel and wait; returns the bytes read."""
    def write(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> int:
        """Write from `buf` in parallel and wait; returns the bytes written.

        In modes ``a``/``a+`` the write goes to the end of the file as it is when it starts,
        after this handle's writes still running; unlike ``O_APPEND``, other handles or
        processes appending at the same time may write over it.
        """
    def pread(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> IOFuture:
        """Start a read into `buf` and return its future at once."""
    def pwrite(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> IOFuture:
        """Start a write from `buf` and return its future at once."""
    def sync(self) -> None:
        """Flush written data to the device.

        Under ``cache="auto"``, writes that end within the write keep limit go through the page
        cache where the device measured that faster (``ferrio info PATH`` says which), and a
        flush of them then takes longer than direct writes would have: a writer that will sync
        should open with ``cache="bypass"``.
        """
    def close(self) -> None:
        """Close the file; later calls raise ValueError.

        Writes still running finish first; what closing says (a network or FUSE file system's
        EIO or ENOSPC for written data) raises OSError, and the file is closed all the same.
        """
    @property
    def closed(self) -> bool:
        """Whether the file is closed."""
    def fileno(self) -> int:
        """Return the file descriptor."""
    @property
    def path(self) -> str:
        """The path the file was opened with."""
    @property
    def mode(self) -> str:
        """The mode the file was opened with."""
    @property
    def size(self) -> int:
        """The file's current size in bytes."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
        /,
    ) -> bool: ...

@final
class RemoteFile:
    """An object in remote storage (s3://, gs://, az://, http(s)://), open for parallel reads."""

    def __new__(
        cls,
        url: str,
        mode: str = "r",
        *,
        range_size: _SettingIn | None = None,
        concurrency: _SettingIn | None = None,
    ) -> Self: ...
    def read(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> int:
        """Read into `buf` at `offset` with parallel ranged GETs; return the bytes read."""
    def pread(self, buf: _Buffer, size: int | None = None, offset: int = 0) -> IOFuture:
        """Start a read and return its future at once."""
    def close(self) -> None:
        """Close the object (reads still running finish first)."""
    @property
    def closed(self) -> bool:
        """Whether the object is closed."""
    @property
    def url(self) -> str:
        """The URL the object was opened with."""
    @property
    def path(self) -> str:
        """The URL, under the name File uses."""
    @property
    def mode(self) -> str:
        """Always "r"."""
    @property
    def size(self) -> int:
        """The object's size in bytes, as it was at open."""
    @property
    def etag(self) -> str | None:
        """The object's ETag at open, if the store gave one."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
        /,
    ) -> bool: ...

@final
class RemoteWriter:
    """A new object in remote storage, written by a multipart upload completed on close.

    Parts go up in parallel while writing goes on; close() (or a with block ending normally)
    completes the object, abort() (or an exception, KeyboardInterrupt included, inside the with
    block) aborts the upload so that no object and no parts are left. A writer let go of while
    open is aborted too, with a ResourceWarning: nothing it was given is written.
    """

    def write(self, buf: _Buffer) -> int:
        """Append the bytes of a host buffer or GPU array; return how many were taken (all)."""
    def close(self) -> None:
        """Complete the object; it exists once this returns."""
    def abort(self) -> None:
        """Abandon the object: abort the upload, nothing is created."""
    def tell(self) -> int:
        """Bytes written so far."""
    @property
    def closed(self) -> bool:
        """Whether the writer was closed or aborted."""
    @property
    def url(self) -> str:
        """The URL written to."""
    @property
    def path(self) -> str:
        """The URL, under the name File uses."""
    @property
    def mode(self) -> str:
        """Always "w"."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        _exc: BaseException | None = None,
        _tb: types.TracebackType | None = None,
    ) -> bool: ...

@final
class IOFuture:
    """The handle of a parallel read or write; awaitable."""

    def result(self, timeout: float | None = None) -> int:
        """Wait and return the bytes moved, or raise the operation's exception."""
    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait; return the operation's exception or None; raise CancelledError if cancelled."""
    def done(self) -> bool:
        """Whether the operation has finished."""
    def cancel(self) -> bool:
        """Cancel the operation (result() then raises CancelledError); False if already finished."""
    def cancelled(self) -> bool:
        """Whether the operation ended cancelled."""
    def add_done_callback(self, fn: Callable[[IOFuture], object], /) -> None:
        """Call `fn(future)` once the operation has finished."""
    def __await__(self) -> Generator[Any, None, int]: ...

@final
class Residency:
    """How much of a file range is in the page cache."""

    @property
    def cached_bytes(self) -> int:
        """Bytes of the range in the page cache."""
    @property
    def dirty_bytes(self) -> int:
        """Cached bytes not yet written to the device."""
    @property
    def range_bytes(self) -> int:
        """Bytes in the range, clipped to the file."""
    @property
    def share(self) -> float:
        """Share of the range that is cached, 0.0 to 1.0."""

@overload
def open(
    path: bytes | os.PathLike[str] | os.PathLike[bytes],
    mode: str = "r",
    *,
    task_size: _SettingIn | None = None,
    cache: _SettingIn | None = None,
    direct_read: _SettingIn | None = None,
    direct_write: _SettingIn | None = None,
    direct_overread: _SettingIn | None = None,
) -> File:
    """Open a local file (a path object or bytes is never a URL)."""

@overload
def open(
    path: str,
    mode: Literal["r", "rb"] = "r",
    *,
    task_size: _SettingIn | None = None,
    cache: _SettingIn | None = None,
    direct_read: _SettingIn | None = None,
    direct_write: _SettingIn | None = None,
    direct_overread: _SettingIn | None = None,
) -> File | RemoteFile:
    """Open a file for reading, or a RemoteFile for a URL (s3://, gs://, az://, http(s)://)."""

@overload
def open(
    path: str,
    mode: Literal["w", "wb"],
    *,
    task_size: _SettingIn | None = None,
    cache: _SettingIn | None = None,
    direct_read: _SettingIn | None = None,
    direct_write: _SettingIn | None = None,
    direct_overread: _SettingIn | None = None,
) -> File | RemoteWriter:
    """Open a file for writing, or a RemoteWriter (multipart upload) for a URL."""

@overload
def open(
    path: str,
    mode: str,
    *,
    task_size: _SettingIn | None = None,
    cache: _SettingIn | None = None,
    direct_read: _SettingIn | None = None,
    direct_write: _SettingIn | None = None,
    direct_overread: _SettingIn | None = None,
) -> File | RemoteFile | RemoteWriter:
    """Open a file, or an object in remote storage for a URL str; see open_url."""

@overload
def open_url(
    url: str,
    mode: Literal["r", "rb"] = "r",
    *,
    range_size: _SettingIn | None = None,
    concurrency: _SettingIn | None = None,
) -> RemoteFile:
    """Open an object in remote storage for parallel reads."""

@overload
def open_url(
    url: str,
    mode: Literal["w", "wb"],
    *,
    range_size: _SettingIn | None = None,
    concurrency: _SettingIn | None = None,
) -> RemoteWriter:
    """Write a new object in remote storage by multipart upload."""

def is_remote_url(path: object) -> bool:
    """Whether `path` is a URL that open() reads from remote storage."""

def local_path(path: _T) -> _T | str:
    """Return the local path a ``file://`` URL names; any other path as given."""

def wait(futures: Iterable[IOFuture], timeout: float | None = None) -> list[int]:
    """Wait for every future; return their byte counts in order."""

def residency(path: _Path, offset: int = 0, size: int | None = None) -> Residency:
    """Return the page-cache residency of a file range."""

def drop_cache(path: _Path) -> None:
    """Drop a file's pages from the page cache."""

def drop_system_cache() -> None:
    """Drop the whole system's clean page cache (needs root)."""

def config_get(name: str) -> _Setting:
    """Return the value of one process-wide setting."""

def config_set(values: Sequence[tuple[str, _SettingIn]]) -> dict[str, _Setting]:
    """Change settings, all or none; return the previous values."""

def config_settings() -> dict[str, _Setting]:
    """Return every setting by name."""

def config_describe() -> list[tuple[str, str, str, str, str]]:
    """Return (name, variable, unit, description, default) of every setting."""

def env_error() -> str | None:
    """Return the error in the FERRIO_* environment found at start-up, or None."""

def env_warnings() -> list[str]:
    """Return one line per FERRIO_* variable that names no setting (ignored)."""

def cli_main(argv: Sequence[str]) -> int:
    """Run the ferrio command line; return its exit code."""

def stats() -> list[dict[str, Any]]:
    """Statistics of every worker pool started so far, one dict per pool, sorted by key.

    Keys: key, threads, max_threads, bytes_read, bytes_written, tasks, queued, busy_seconds,
    bytes_direct, bytes_buffered.
    """

def copy(
    src: str | os.PathLike[str] | list[str | os.PathLike[str]],
    dst: str | os.PathLike[str],
    *,
    recursive: bool = False,
    preserve: bool = False,
    verify: bool = False,
    follow_symlinks: bool = False,
    sync: bool = False,
) -> dict[str, Any]:
    """Copy files or trees like ``cp``, in parallel across files, devices and within files.

    Each file is written under a temporary name in the destination directory and renamed when
    complete, so a failure or Ctrl-C leaves no partial file. A source or ``dst`` may be a URL
    (s3://, gs://, az://; http(s):// as a source): files are uploaded by multipart upload
    (no object unless complete), downloaded into a temporary file renamed into place, or copied
    inside the store within one bucket; a ``dst`` URL ending in "/" is a prefix. With
    ``recursive=True`` a directory is uploaded under a prefix (``prefix/relative/path``) and a
    prefix downloaded into a directory (made as needed); a prefix with no objects raises
    ``FileNotFoundError``, a key with a ``..`` component ``ValueError``. Returns a dict with
    ``files``, ``dirs``, ``symlinks``, ``bytes``, ``verified`` and ``seconds``; raises the
    first error, with a note (``__notes__``) naming the others. As ``shutil.copy``: a directory
    without ``recursive=True`` raises ``IsADirectoryError``, a file onto itself (by any name or
    link) ``shutil.SameFileError``.
    """

@final
class PoolResource:
    """A pool of device memory on one GPU, with a free list per CUDA stream."""

    def __new__(
        cls,
        device: int = 0,
        initial_bytes: int = 0,
        grow_bytes: int = 33554432,
        max_bytes: int | None = None,
    ) -> Self: ...
    @property
    def device(self) -> int:
        """The GPU this pool allocates on."""

    def allocate(self, nbytes: int, stream: int = 0, owner: object | None = None) -> Allocation:
        """Allocate `nbytes` for use on the raw CUDA stream `stream` (0: legacy default)."""

    def detach_stream(self, stream: int) -> None:
        """Forget the raw stream `stream` before it is destroyed."""

    def stats(self) -> dict[str, int]:
        """Bytes held from the GPU, in use, the peak in use, free, and cached in threads."""

@final
class Allocation:
    """One allocation from a PoolResource, freed in stream order when the last reference goes."""

    @property
    def ptr(self) -> int:
        """Device address of the first byte."""

    @property
    def size(self) -> int:
        """Bytes allocated."""

# (data_start, metadata or None, [(name, dtype, shape, begin, end)]), offsets in the data section.
_Header = tuple[int, dict[str, str] | None, list[tuple[str, str, list[int], int, int]]]

def safetensors_read_header(path: _Path | File | RemoteFile) -> _Header:
    """Read and validate the header of a safetensors file.

    From an open File or RemoteFile (whose later reads see the same version), a path, or a URL.
    """

def safetensors_parse_header(data: bytes) -> _Header:
    """Validate the header at the start of the bytes of a whole safetensors file."""

def safetensors_header_bytes(
    tensors: Sequence[tuple[str, str, Sequence[int]]],
    metadata: dict[str, str] | None = None,
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Return the header of a new file and each tensor's (name, begin, end), as safetensors."""

def safetensors_dtypes() -> list[tuple[str, int]]:
    """Return every safetensors dtype as (name, bits), in the format's enum order."""
