"""Read and write safetensors checkpoints in parallel, into host or GPU memory.

A drop-in for the ``safetensors`` package: ``safe_open``, ``load_file``, ``save_file``, ``load``
and ``save`` take the same arguments (``ferrio.safetensors.torch`` and
``ferrio.safetensors.numpy`` mirror ``safetensors.torch`` and ``safetensors.numpy``), so
swapping the import is the whole migration. On top of that:

- a directory, or a ``*.safetensors.index.json`` (``weight_map``; Mistral's
  ``consolidated.safetensors.index.json`` too), loads as one parallel read across all shards;
- ``tensor_filter=["model.layers.0.*", ...]`` (``fnmatch`` globs) reads only the selected
  tensors' bytes; ``get_slice(name)[rows]`` reads only the rows asked for;
- ``device="cuda:N"`` reads file bytes straight into GPU memory through ferrio's pinned bounce
  buffers, with no host copy of the checkpoint;
- a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) reads from object storage: the header
  with a ranged GET, the tensor bytes with ferrio's parallel ranged GETs (into host or GPU
  memory), every GET conditional on the version seen at open. A sharded checkpoint is named by
  its ``*.safetensors.index.json`` URL (shards resolve beside it) or a list of shard URLs; a
  "directory" URL is refused, since an object store cannot be listed without extra rights;
- ``process_group=`` (a ``torch.distributed`` group): every rank gets the whole checkpoint while
  each reads only its 1/W share from storage, the rest exchanged in place over the group (see
  :class:`safe_open`).

Ownership: a load allocates ONE ``uint8`` buffer per call for all the bytes it selects (plus at
most 7 bytes per contiguous run, to keep each tensor at its file alignment, and with a process
group at most W - 1 bytes to divide it among W ranks), and every tensor returned is a view of
it: the buffer lives while any tensor of that load lives, and freeing one tensor frees nothing
until the last one is gone (copy with ``.clone()``/``.copy()`` to keep a few tensors of a big
load). A tensor whose bytes are not aligned to its element size in the
file is the exception: it is copied into memory of its own. ``get_tensor`` and ``get_slice``
return tensors with their own buffer. Nothing is ever overwritten: ``save_file`` writes under a
temporary name in the target's directory and renames it into place only once every byte is
written.

Invalid files raise :class:`SafetensorError` (a ``ValueError``) naming the tensor and the rule.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import itertools
import json
import numbers
import os
import stat
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ferrio
from ferrio._native import (
    SafetensorError,
    is_remote_url,
    local_path,
    safetensors_header_bytes,
    safetensors_parse_header,
    safetensors_read_header,
)
from ferrio.safetensors import _distributed as _dist
from ferrio.safetensors._ahead import ReadAhead, TensorRead, truncated
from ferrio.safetensors._frameworks import (
    Framework,
    check_not_shared,
    parse_device,
    to_bytes,
)
from ferrio.safetensors._frameworks import framework as _framework

__all__ = [
    "SafetensorError",
    "load",
    "load_file",
    "safe_open",
    "save",
    "save_file",
]

PathLike = str | os.PathLike[str]

# Bytes in flight at once while tensors() yields: enough to keep every worker busy, small
# enough that the first tensors arrive early (reads of one pool share its workers round-robin).
_STREAM_WINDOW_BYTES = 256 << 20
# Small tensors that follow one another are read together, up to this many bytes, by
# `safe_open.tensors()`: one read per tensor cost ~29 us each (50,000 tensors of 4 KiB: 1.45 s
# against 0.44 s for the whole file at once).
_STREAM_BATCH_BYTES = 4 << 20

# Numbers the temporary files of `save_file`, so that threads saving to one name at once each
# write their own (`next` on a count is atomic under the GIL).
_save_ids = itertools.count()

# The longest header a loader reads (the library's `MAX_HEADER_BYTES`, safetensors' own limit).
_MAX_HEADER_BYTES = 100_000_000

# Shards opened (and their headers read) at once: each is a round trip or two to a store.
_HEADER_THREADS = 16
# The longest open-and-header of a file after which the rest go through threads (`_Calls`).
_QUICK_S = 0.001


_Run = tuple[str, int, int, int]  # path, file begin, file end, where in the buffer


class _Tensor:
    """Where one tensor's bytes are: file, absolute offsets, dtype and shape."""

    __slots__ = ("begin", "dtype", "end", "name", "path", "shape")

    def __init__(
        self, path: str, name: str, dtype: str, shape: list[int], begin: int, end: int
    ) -> None:
        self.path, self.name, self.dtype, self.shape = path, name, dtype, shape
        self.begin, self.end = begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _read_index(p: str) -> Any:
    """Parse the JSON of a local index file or of an index object at a URL."""
    try:
        if is_remote_url(p):
            with ferrio.open(p, "r") as f:
                raw = bytearray(f.size)
                f.read(raw)
            return json.loads(raw)
        with open(p, "rb") as local:
            return json.load(local)
    except ValueError as e:
        raise SafetensorError(f"index {p}: not valid JSON: {e}") from None


def _is_index(p: str, remote: bool) -> bool:
    """Return whether `p` names a shard index.

    That is a ``*.index.json`` file or object, or a local ``*.json`` file that is not itself a
    safetensors file (whose first 8 bytes give its header's length, and whose header then
    begins with ``{``).
    """
    if not p.endswith(".json"):
        return False
    if remote or p.endswith(".index.json"):
        return True
    try:
        with open(p, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return True  # the index's own read says what is wrong
    return not (len(head) == 9 and head[8:] == b"{" and int.from_bytes(head[:8], "little") <= size)


def _shard_files(
    path: PathLike | Sequence[PathLike],
) -> tuple[list[str], dict[str, str] | None]:
    """Return the files behind `path` and, for an index, which file holds which tensor."""
    if isinstance(path, list | tuple):
        return [local_path(os.fsdecode(os.fspath(p))) for p in path], None
    p = local_path(os.fsdecode(os.fspath(path)))  # type: ignore[arg-type]
    remote = is_remote_url(p)
    if remote and p.endswith("/"):
        raise SafetensorError(
            f"{p}: a URL must name one object (an object store cannot be listed): give the "
            "*.safetensors.index.json URL or the list of shard URLs"
        )
    if not remote and os.path.isdir(p):
        indexes = sorted(f for f in os.listdir(p) if f.endswith(".safetensors.index.json"))
        if len(indexes) == 1:
            return _shard_files(os.path.join(p, indexes[0]))
        if indexes:  # e.g. Mistral's consolidated.* and model.*: two checkpoints side by side
            raise SafetensorError(
                f"directory {p!r} holds {len(indexes)} indexes ({', '.join(indexes)}): pass "
                "the one to load"
            )
        files = sorted(f for f in os.listdir(p) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors file in directory {p!r}")
        return [os.path.join(p, f) for f in files], None
    if _is_index(p, remote):
        index = _read_index(p)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise SafetensorError(f"index {p}: weight_map must map tensor names to file names")
        shards: dict[str, str] = {}  # as the index names each shard: its clean relative name
        for name, shard in weight_map.items():
            # A shard lies beside the index (or below it): an index must not make the loader
            # read a file or object anywhere else.
            parts = shard.replace("\\", "/").split("/")
            # `./model.safetensors` and `model.safetensors` are one file (and one object).
            clean = "/".join(part for part in shard.split("/") if part not in ("", "."))
            if not clean or shard.startswith("/") or "://" in shard or ".." in parts:
                raise SafetensorError(
                    f"index {p}: tensor {name!r} is mapped to {shard!r}, which is not a file "
                    "beside the index (shards are named relative to its directory, without '..')"
                )
            shards[shard] = clean
        if remote:  # shards are objects beside the index, named in the URL percent-encoded
            base = p.rsplit("/", 1)[0]
            mapped = {k: f"{base}/{_url_part(shards[v])}" for k, v in weight_map.items()}
        else:
            base = os.path.dirname(p)
            mapped = {k: os.path.join(base, shards[v]) for k, v in weight_map.items()}
        return sorted(set(mapped.values())), mapped
    return [p], None


def _url_part(name: str) -> str:
    """`name`, a shard's file name in an index ('/' between directories), as a URL names it.

    Every byte that does not stand for itself is percent-encoded (`model#1.safetensors` is the
    object `model%231.safetensors`), as ferrio encodes the keys of a listing.
    """
    return urllib.parse.quote(name, safe="/!$&'()*+,;=:@~")


class _Checkpoint:
    """Every tensor of one file or a set of shards, validated, after `tensor_filter`.

    Each file is opened once, here, and every later read goes through that handle: a file
    replaced meanwhile (a new checkpoint renamed over the old) is never read with the old
    header's offsets, and an object's reads stay pinned to the version whose header was read.
    """

    def __init__(
        self, path: PathLike | Sequence[PathLike], tensor_filter: Sequence[str] | None
    ) -> None:
        files, weight_map = _shard_files(path)
        if isinstance(tensor_filter, str):
            tensor_filter = [tensor_filter]
        elif tensor_filter is not None:
            tensor_filter = list(tensor_filter)  # a generator would be used up by the first name
        if weight_map is not None and tensor_filter is not None:
            # The index says which shards hold a selected tensor: open only those.
            wanted = {f for n, f in weight_map.items() if _selected(n, tensor_filter)}
            files = [f for f in files if f in wanted]
        self.files = files
        self.handles: dict[str, ferrio.File | ferrio.RemoteFile] = {}
        try:
            self._read_headers(files, weight_map, tensor_filter)
        except BaseException:
            self.close()
            raise

    def _read_headers(
        self,
        files: list[str],
        weight_map: dict[str, str] | None,
        tensor_filter: Sequence[str] | None,
    ) -> None:
        self.metadata: dict[str, str] | None = None
        self.tensors: dict[str, _Tensor] = {}
        self.order: list[str] = []  # file order, then offset order
        headers = self._open(files)
        for i, (file, (start, meta, entries)) in enumerate(zip(files, headers, strict=True)):
            if i == 0:
                self.metadata = meta
            for name, dtype, shape, begin, end in entries:
                if weight_map is not None and weight_map.get(name) != file:
                    continue  # the index says another file holds it (or none does)
                if tensor_filter is not None and not _selected(name, tensor_filter):
                    continue
                other = self.tensors.get(name)
                if other is not None:
                    raise SafetensorError(
                        f"tensor {name!r} is in both {other.path} and {file}: shards must not "
                        "repeat a name"
                    )
                self.tensors[name] = _Tensor(file, name, dtype, shape, start + begin, start + end)
                self.order.append(name)
        if weight_map is not None:
            missing = [
                n
                for n, f in weight_map.items()
                if n not in self.tensors and (tensor_filter is None or _selected(n, tensor_filter))
            ]
            if missing:
                raise SafetensorError(
                    f"tensor {missing[0]!r}: the index maps it to {weight_map[missing[0]]}, "
                    "which does not hold it"
                )

    def _open(self, files: list[str]) -> list[Any]:
        """Open every file and read its header, one after another while that is quick.

        Several at once once it is not (`_Calls`): a shard's open and header are round trips
        to a store, or reads of a cold disk. Every handle opened is kept for `close`, and the
        first failure, in file order, is raised once all have finished. Local files all open
        before any header is read: a direct read opens a second descriptor for its file, and
        where the limit on open files has room for only one each (`_make_room_for`), the
        files without it then read through the page cache, where opening them afterwards
        would fail.
        """
        if not files:  # an empty list, or an index that maps no tensor
            return []
        _make_room_for(sum(not is_remote_url(f) for f in files))
        local_files = [f for f in files if not is_remote_url(f)]
        with _Calls(len(files), pooled=len(files) - len(local_files) > 1) as calls:
            local = dict(zip(local_files, calls.map(_open_for_reading, local_files), strict=True))
            done = calls.map(lambda f: _open_and_read_header(f, local.get(f)), files)
        headers = []
        for file, (opened, header) in zip(files, done, strict=True):
            if opened is not None:
                self.handles[file] = opened
            headers.append(header)
        for header in headers:
            if isinstance(header, BaseException):
                raise header
        return headers

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()


# Descriptors an open local `ferrio.File` holds: one, and a second (`O_DIRECT`) only where its
# reads bypass the page cache or go direct; and those left for everything else the process
# opens while a checkpoint is open.
_FDS_PER_FILE_LEAST, _FDS_PER_FILE_MOST = 1, 2
_FDS_SPARE = 64


def _make_room_for(local_files: int) -> None:
    """Let `local_files` more files be open at once: raise the soft limit if needed.

    The soft limit on open files (``ulimit -n``) is raised as far as the hard limit allows, up
    to what the files could need (two descriptors each); where the hard limit leaves less than
    one each, `OSError` (``EMFILE``) names both counts before anything opens. A sharded
    checkpoint is read as one read across all its files, each open until the load ends; with
    the common soft limit of 1024 descriptors, a checkpoint of 1000 shards would fail part way
    (as ``ulimit -n`` would need raising by hand). Only ever raised, and only as far as needed.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:  # no procfs: count none in use, the spare covers a few
        in_use = 0
    least = in_use + _FDS_PER_FILE_LEAST * local_files + _FDS_SPARE
    most = in_use + _FDS_PER_FILE_MOST * local_files + _FDS_SPARE
    if soft == resource.RLIM_INFINITY or most <= soft:
        return
    if hard != resource.RLIM_INFINITY and least > hard:
        raise OSError(
            errno.EMFILE,
            f"this checkpoint's {local_files} files need at least {least} open descriptors "
            f"({_FDS_PER_FILE_LEAST} each, {in_use} in use), more than this process may have "
            f"(hard limit {hard}): raise it (ulimit -Hn) or load fewer shards at once",
        )
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (most if hard == resource.RLIM_INFINITY else min(most, hard), hard)
    )


class _Calls:
    """Calls made one after another while each returns within `_QUICK_S`, then through threads.

    The pool of threads starts after the first call that does not (or at once, `pooled`). A
    warm local file opens and gives its header in ~0.15 ms, less than handing the call to a
    pool's thread costs (4 warm shards on the dev VM: 0.6-1.1 ms one after another, 1.5-3.3 ms
    through a pool); a cold disk or a store answers in milliseconds, which threads overlap.
    """

    def __init__(self, calls: int, pooled: bool) -> None:
        self._threads = min(_HEADER_THREADS, calls)
        self._pool = ThreadPoolExecutor(self._threads) if pooled else None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for i, item in enumerate(items):
            if self._pool is not None:
                out.extend(self._pool.map(fn, items[i:]))
                break
            began = time.perf_counter()
            out.append(fn(item))
            if time.perf_counter() - began > _QUICK_S and self._threads > 1:
                self._pool = ThreadPoolExecutor(self._threads)
        return out

    def __enter__(self) -> _Calls:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _selected(name: str, tensor_filter: Sequence[str]) -> bool:
    """Whether `name` matches one of the `tensor_filter` globs."""
    return any(fnmatch.fnmatchcase(name, pat) for pat in tensor_filter)


def _open_for_reading(file: str) -> ferrio.File | ferrio.RemoteFile | Exception:
    """Open a file or URL for reading; return the handle, or the exception that says why not."""
    try:
        return ferrio.open(file, "r")
    except Exception as e:
        return e


def _open_and_read_header(
    file: str, opened: ferrio.File | ferrio.RemoteFile | Exception | None = None
) -> tuple[ferrio.File | ferrio.RemoteFile | None, Any]:
    """Open `file` (unless `opened` is its handle or failure already) and read its header.

    Returns `(handle, header)`, or `(handle or None, the exception)` when either step failed.
    """
    handle = opened if opened is not None else _open_for_reading(file)
    if isinstance(handle, Exception):
        return None, handle
    try:
        return handle, safetensors_read_header(handle)
    except Exception as e:
        return handle, e


def _layout(tensors: list[_Tensor]) -> tuple[list[_Run], dict[str, int], int]:
    """Place `tensors` in one buffer: the file runs to read, each tensor's offset, the size.

    Contiguous tensors of a file form one run, read with one pread (ferrio splits it into
    parallel tasks); a run starts in the buffer at its file alignment modulo 8.
    """
    runs: list[_Run] = []  # path, file begin, file end, buf at
    at: dict[str, int] = {}
    size = 0
    for t in tensors:
        last = runs[-1] if runs else None
        if last is not None and last[0] == t.path and last[2] == t.begin:
            runs[-1] = (last[0], last[1], t.end, last[3])
        else:
            size += (t.begin - size) % 8
            runs.append((t.path, t.begin, t.end, size))
        run = runs[-1]
        at[t.name] = run[3] + (t.begin - run[1])
        size = run[3] + (run[2] - run[1])
    return runs, at, size


class _Load:
    """One buffer for a set of tensors, and the reads that fill it (all files at once).

    With `world` ranks sharing the load the buffer is padded to a multiple of `world` bytes
    (`piece` bytes per rank); the padding is never part of a view.
    """

    def __init__(
        self, fw: Framework, ckpt: _Checkpoint, tensors: list[_Tensor], world: int = 1
    ) -> None:
        self.fw = fw
        self.files = ckpt.handles
        self.runs, self.at, size = _layout(tensors)
        padded, self.piece = _dist.shares(size, world)
        self.buf = fw.empty(padded)

    def start(self, runs: Sequence[tuple[str, int, int, int]]) -> list[ferrio.IOFuture]:
        futures = []
        for path, begin, end, at in runs:
            if end == begin:
                continue
            f = self.files[path]
            futures.append(f.pread(self.fw.target(self.buf, at, at + end - begin), offset=begin))
        return futures

    def wait(
        self, futures: list[ferrio.IOFuture], runs: Sequence[tuple[str, int, int, int]]
    ) -> None:
        got = ferrio.wait(futures)
        want = [end - begin for _, begin, end, _ in runs if end > begin]
        for (path, begin, _, _), g, w in zip(
            [r for r in runs if r[2] > r[1]], got, want, strict=True
        ):
            if g != w:
                raise truncated(path, g, w, begin)

    def view(self, t: _Tensor) -> Any:
        at = self.at[t.name]
        return self.fw.view(self.buf, at, at + t.nbytes, t.dtype, t.shape)


def _load(fw: Framework, ckpt: _Checkpoint, tensors: list[_Tensor]) -> dict[str, Any]:
    for t in tensors:
        fw.check_dtype(t.name, t.dtype)
    load = _Load(fw, ckpt, tensors)
    futures = load.start(load.runs)
    # A view needs the buffer, not its bytes: made while the reads run. Except where the view
    # is a copy (bytes not aligned to the element size, which a file may place them at): a
    # copy made now would copy bytes not yet read, so those wait for the reads.
    early = [t for t in tensors if load.at[t.name] % 8 == 0]
    try:
        views = {t.name: load.view(t) for t in early}
    except BaseException:
        ferrio.wait(futures)  # the reads end before the buffer can go
        raise
    load.wait(futures, load.runs)
    return {t.name: views[t.name] if t.name in views else load.view(t) for t in tensors}


def _load_shared(
    fw: Framework, ckpt: _Checkpoint, tensors: list[_Tensor], group: _dist.Group
) -> dict[str, Any]:
    """Load `tensors` on every rank of `group`, each reading only its piece of the buffer.

    Every rank reports whether its reads succeeded before the exchange, so a failure on one
    rank raises on all of them instead of leaving the others in the all-gather.
    """
    err: Exception | None = None
    load: _Load | None = None
    try:
        load = _Load(fw, ckpt, tensors, group.world)
        lo = group.rank * load.piece
        mine = _dist.rank_runs(load.runs, lo, lo + load.piece)
        load.wait(load.start(mine), mine)
    except Exception as e:  # told to every rank below, then raised here
        err = e
    why = _dist.read_failure(group.all_gather_bytes(b"\x01" if err is not None else b"\x00"))
    if err is not None:
        raise err
    if why is not None:
        raise SafetensorError(why)
    assert load is not None  # err is None, so the load was made
    group.exchange(load.buf, load.piece)
    return {t.name: load.view(t) for t in tensors}


class _SliceIndexError(SafetensorError, IndexError):
    """An index out of a tensor's bounds.

    A SafetensorError, as safetensors raises, and an IndexError, as numpy and torch raise.
    """


class _Slice:
    """A tensor whose bytes are read on indexing, only the rows the index needs.

    It keeps the checkpoint's files open for as long as it lives, as safetensors' slices keep
    the file mapped: indexing works after the ``safe_open`` block that made it has ended.
    """

    def __init__(self, fw: Framework, ckpt: _Checkpoint, t: _Tensor) -> None:
        self._fw, self._ckpt, self._t = fw, ckpt, t

    def get_shape(self) -> list[int]:
        """Return the tensor's shape."""
        return list(self._t.shape)

    def get_dtype(self) -> str:
        """Return the tensor's safetensors dtype name (``"BF16"``, ...)."""
        return self._t.dtype

    def __getitem__(self, key: Any) -> Any:
        try:
            got = self._index(key)
        except SafetensorError:
            raise
        except IndexError as e:
            raise _SliceIndexError(f"tensor {self._t.name}: {e}") from None
        except ValueError as e:  # a step of 0, more than one Ellipsis, ...
            raise SafetensorError(f"tensor {self._t.name}: {e}") from None
        return _zero_d(got)

    def _index(self, key: Any) -> Any:
        t = self._t
        keys = key if isinstance(key, tuple) else (key,)
        # An integer of any kind (numpy's, or a bool) picks one index, as in safetensors:
        # `[True]` is `[1]` there, where numpy and torch would read it as a mask. numpy's bool,
        # which safetensors refuses, is taken as Python's is, not as a mask.
        keys = tuple(int(k) if _is_integer(k) else k for k in keys)
        key = keys if isinstance(key, tuple) else keys[0]
        first = keys[0] if keys else slice(None)
        rows = t.shape[0] if t.shape else 0
        row_bytes = t.nbytes // rows if rows else 0
        if not t.shape or rows == 0 or row_bytes * rows != t.nbytes:
            return self._read(t)[key]
        new_first: int | slice
        if isinstance(first, int):
            i = first + rows if first < 0 else first
            if not 0 <= i < rows:
                raise IndexError(f"index {first} is out of bounds for dimension 0 of {rows}")
            lo, hi, new_first = i, i + 1, 0
        elif isinstance(first, slice):
            r = range(*first.indices(rows))
            if len(r) == 0:
                lo, hi, new_first = 0, 0, slice(0, 0)
            else:
                lo, hi = min(r), max(r) + 1
                stop = r.stop - lo
                new_first = slice(r.start - lo, stop if stop >= 0 else None, r.step)
        else:  # Ellipsis, lists, arrays: read everything and let the library index
            return self._read(t)[key]
        part = _Tensor(
            t.path, t.name, t.dtype, [hi - lo, *t.shape[1:]],
            t.begin + lo * row_bytes, t.begin + hi * row_bytes,
        )  # fmt: skip
        return self._read(part)[(new_first, *keys[1:])]

    def _read(self, t: _Tensor) -> Any:
        return TensorRead(self._fw, self._ckpt, t).take(self._fw)


def _is_integer(k: Any) -> bool:
    """Whether `k` is an integer index: Python's, numpy's, or a bool of either."""
    numpy_bool = type(k).__module__ == "numpy" and type(k).__name__ in ("bool", "bool_")
    return isinstance(k, numbers.Integral) or numpy_bool


def _zero_d(x: Any) -> Any:
    """Return `x`, or a 0-d array where `x` is a numpy scalar.

    Indexing every axis with an integer gives numpy a scalar, safetensors (and torch, CuPy) a
    0-d array.
    """
    if type(x).__module__ == "numpy":
        import numpy as np

        if isinstance(x, np.generic):
            return np.asarray(x)
    return x


class safe_open:  # the name of safetensors' class
    """A safetensors file (or shards) opened for reading tensors by name.

    ``safe_open(path, framework="pt", device="cpu")`` as in ``safetensors``; ``path`` may also
    be a list of shard files, a directory of shards or an index JSON, and ``tensor_filter``
    (glob patterns) limits which tensors it shows and reads (with an index, only the shards
    that hold a selected tensor are opened). ``backend`` is accepted for
    compatibility and ignored. The header is read and validated on opening.

    ``process_group`` (a ``torch.distributed`` group, as InstantTensor's keyword): every rank
    of the group loads the same checkpoint and ends with all of it on its own ``device``, while
    each byte is read from storage once per group. The load's buffer is cut into one equal,
    contiguous piece per rank (padded by at most ``world_size - 1`` bytes, never part of a
    tensor); each rank reads only its piece, then the pieces are exchanged in place, with one
    ``all_gather_into_tensor`` for GPU tensors (an NCCL group, on the current CUDA stream) or one
    broadcast per rank for host tensors (a gloo group, ``device="cpu"``). No second full-size
    buffer is made, and ownership is as without a group. When the ranks span several nodes,
    pass a node-local group (the first item of ``torch.distributed.new_subgroups()``): each
    byte is read once per group. numpy and CuPy buffers take a group too (shared with torch,
    not copied).

    With a group, opening, :meth:`get_tensors` and :meth:`tensors` are collective: every rank
    must make the same calls with the same files, ``tensor_filter`` and device kind. Opening
    compares a digest of what each rank opened and raises :class:`SafetensorError` naming the
    rank that differs; a rank that fails to open or read makes every rank raise, so none waits
    forever. :meth:`tensors` yields only after the whole exchange, and :meth:`get_tensor` and
    :meth:`get_slice` read on the calling rank alone, without the group. Without a group
    (``None``, the default) each process reads everything itself.
    """

    def __init__(
        self,
        filename: PathLike | Sequence[PathLike],
        framework: str = "pt",
        device: Any = "cpu",
        *,
        backend: str | None = None,
        tensor_filter: Sequence[str] | None = None,
        process_group: Any = None,
    ) -> None:
        del backend  # safetensors' mmap/pread choice; ferrio always reads in parallel
        self._group: _dist.Group | None = None
        # A snapshot at open, as a file takes its settings when it is opened.
        read_ahead = int(ferrio.config.get("tensor_read_ahead"))
        if process_group is None:
            self._fw = _framework(framework, device)
            self._ckpt = _Checkpoint(filename, tensor_filter)
            self._ahead = ReadAhead(self._fw, self._ckpt, read_ahead)
            return
        kind: str | None = None
        index: int | None = None
        with contextlib.suppress(ValueError, TypeError):
            kind, index = parse_device(device)
        group = _dist.Group(process_group, kind, index)
        err: Exception | None = None
        try:
            self._fw = _framework(framework, device)
            group.check_device(self._fw.kind)
            self._ckpt = _Checkpoint(filename, tensor_filter)
            self._ahead = ReadAhead(self._fw, self._ckpt, read_ahead)
            ts = self._ordered()
            for t in ts:
                self._fw.check_dtype(t.name, t.dtype)
            runs, at, size = _layout(ts)
            selected = [(t.name, t.dtype, t.shape, at[t.name]) for t in ts]
            digest = _dist.plan_digest(
                self._ckpt.files, self._ckpt.metadata, selected, runs, size, self._fw.kind
            )
        except Exception as e:  # told to every rank below, then raised here
            err, digest = e, _dist.FAILED
        why = _dist.disagreement(group.all_gather_bytes(digest))
        if err is not None or why is not None:
            self.close()
        if err is not None:
            raise err
        if why is not None:
            raise SafetensorError(why)
        self._group = group

    def _ordered(self) -> list[_Tensor]:
        return [self._ckpt.tensors[n] for n in self._ckpt.order]

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the files; leaving the ``with`` block does it.

        Tensors already returned stay valid, and so do slices (``get_slice``), which keep the
        files open while they live, as safetensors' keep the file mapped; anything else raises
        :class:`SafetensorError` afterwards, as in safetensors.
        """
        ahead = getattr(self, "_ahead", None)
        if ahead is not None:
            ahead.close()  # its reads end before their buffers (and the files) can go
        ckpt = getattr(self, "_ckpt", None)
        if ckpt is not None:
            if not getattr(self, "_lent", False):
                ckpt.close()
            self._closed = True

    def _open_ckpt(self) -> _Checkpoint:
        if getattr(self, "_closed", False):
            raise SafetensorError("File is closed")
        return self._ckpt

    def keys(self) -> list[str]:
        """Return the tensor names, sorted (as safetensors)."""
        return sorted(self._open_ckpt().tensors)

    def offset_keys(self) -> list[str]:
        """Return the tensor names in file order (shard by shard, then by data offset)."""
        return list(self._open_ckpt().order)

    def metadata(self) -> dict[str, str] | None:
        """Return the ``__metadata__`` strings (of the first shard opened), or None.

        A new dict on each call, as in safetensors: changing it changes nothing here.
        """
        meta = self._open_ckpt().metadata
        return None if meta is None else dict(meta)

    def _info(self, name: str) -> _Tensor:
        t = self._open_ckpt().tensors.get(name)
        if t is None:
            raise SafetensorError(f"File does not contain tensor {name}")
        return t

    def get_tensor(self, name: str) -> Any:
        """Read one tensor into memory of its own.

        Calls that walk the checkpoint in file order or in :meth:`keys` order (``for k in
        f.keys(): f.get_tensor(k)``) are read ahead: once two calls in a row ask for
        neighbours, the next tensors in that order are read while the caller works, up to the
        ``tensor_read_ahead`` setting as it was when this file was opened
        (``FERRIO_TENSOR_READ_AHEAD``, 1 GiB; 0 turns it off), and at least one tensor. Each
        still gets memory of its own; tensors read ahead but never asked for are freed when the
        caller skips past them or the file is closed.

        A torch host tensor (``device="cpu"``) of 1 MiB or more is in pinned memory, from
        torch's pinned allocator, where the process already uses CUDA, once the caller has let
        go of a tensor it got before (a loop that keeps every tensor gets none pinned), and
        while the pinned tensors alive stay within the ``pinned_tensor_limit`` setting as it
        was at open (``FERRIO_PINNED_TENSOR_LIMIT``, 2 GiB; 0: never); while tensors are
        pinned, at most 256 MiB is read ahead. Copying it to a GPU, the usual next step, then
        runs at the link's rate. Freeing it returns its memory to torch's pinned cache, which
        hands it out again once the copies from it are done.
        """
        return self._ahead.get(self._info(name))

    def get_slice(self, name: str) -> _Slice:
        """Return a lazy tensor: indexing it reads only the rows (first dimension) needed.

        It stays usable after this file is closed (it keeps the files open while it lives).
        """
        t = self._info(name)
        self._lent = True
        return _Slice(self._fw, self._ckpt, t)

    def get_tensors(self) -> dict[str, Any]:
        """Read every tensor in one parallel read; they share one buffer (see the module).

        With a ``process_group`` this is collective: each rank reads its piece, then the
        ranks exchange them (see the class).
        """
        ckpt = self._open_ckpt()
        if self._group is not None:
            return _load_shared(self._fw, ckpt, self._ordered(), self._group)
        return _load(self._fw, ckpt, self._ordered())

    def _get_tensors_file_by_file(self) -> Iterator[dict[str, Any]]:
        """Yield each file's tensors, read in one parallel read into a buffer of its own.

        The next file is read only when the caller asks for it, so a caller that drops each
        dict before the next holds one file's buffer at a time (``torch.load_model``). Every
        tensor's dtype is checked before the first file is read.
        """
        ckpt = self._open_ckpt()
        ordered = self._ordered()
        for t in ordered:
            self._fw.check_dtype(t.name, t.dtype)
        for _, ts in itertools.groupby(ordered, key=lambda t: t.path):
            yield _load(self._fw, ckpt, list(ts))

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(name, tensor)`` in file order as each tensor's bytes arrive.

        Reads run ahead of the consumer by a window of bytes, so work on the first tensors
        overlaps the reading of the rest; the tensors share one buffer (see the module). With
        a ``process_group`` the first tensor is yielded after the whole collective load.
        """
        if self._group is not None:
            yield from self.get_tensors().items()
            return
        ckpt = self._open_ckpt()
        ts = self._ordered()
        for t in ts:
            self._fw.check_dtype(t.name, t.dtype)
        load = _Load(self._fw, ckpt, ts)
        batches = _batches(ts, _STREAM_BATCH_BYTES)
        pending: deque[tuple[list[_Tensor], list[ferrio.IOFuture], _Run]] = deque()
        in_flight = 0
        try:
            i = 0
            while i < len(batches) or pending:
                while i < len(batches) and (in_flight < _STREAM_WINDOW_BYTES or not pending):
                    batch = batches[i]
                    first, last = batch[0], batch[-1]
                    run = (first.path, first.begin, last.end, load.at[first.name])
                    pending.append((batch, load.start([run]), run))
                    in_flight += last.end - first.begin
                    i += 1
                batch, futures, run = pending.popleft()
                load.wait(futures, [run])
                in_flight -= run[2] - run[1]
                for t in batch:
                    yield t.name, load.view(t)
        finally:
            if pending:
                ferrio.wait([f for _, fs, _ in pending for f in fs])


def _batches(ts: list[_Tensor], most: int) -> list[list[_Tensor]]:
    """Cut `ts` (in file order) into batches read with one pread each.

    A batch is tensors that follow one another in one file, up to `most` bytes; a larger
    tensor is a batch of its own.
    """
    batches: list[list[_Tensor]] = []
    size = 0
    for t in ts:
        last = batches[-1][-1] if batches else None
        if (
            last is not None
            and last.path == t.path
            and last.end == t.begin
            and size + t.nbytes <= most
        ):
            batches[-1].append(t)
            size += t.nbytes
        else:
            batches.append([t])
            size = t.nbytes
    return batches


def load_file(
    filename: PathLike | Sequence[PathLike],
    device: Any = "cpu",
    *,
    framework: str = "pt",
    backend: str | None = None,
    tensor_filter: Sequence[str] | None = None,
    process_group: Any = None,
) -> dict[str, Any]:
    """Load every tensor (or those `tensor_filter` selects) of a file, directory or index.

    All shards are read at once, straight into one buffer on `device` (see the module for what
    owns the memory). ``framework`` is ``"pt"`` (default, as ``safetensors.torch``),
    ``"numpy"`` or ``"cupy"``. With a ``torch.distributed`` ``process_group`` every rank calls
    this with the same arguments and gets the whole checkpoint, each rank reading only its
    share from storage (see :class:`safe_open`).
    """
    with safe_open(
        filename, framework, device, tensor_filter=tensor_filter, process_group=process_group
    ) as f:
        return f.get_tensors()


def load(data: bytes, *, framework: str = "pt") -> dict[str, Any]:
    """Load tensors from the bytes of a safetensors file; they share one host buffer (a copy)."""
    start, _, entries = safetensors_parse_header(data)
    fw = _framework(framework, "cpu")
    for name, dtype, *_ in entries:
        fw.check_dtype(name, dtype)
    buf = fw.empty(len(data) - start)
    fw.target(buf, 0, len(data) - start)[:] = memoryview(data)[start:]
    return {name: fw.view(buf, b, e, dtype, list(shape)) for name, dtype, shape, b, e in entries}


def _prepare(
    tensors: Mapping[str, Any], metadata: Mapping[str, str] | None
) -> tuple[bytes, list[tuple[Any, int]]]:
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, tensor] but received {type(tensors)}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict of str to str, not {type(metadata).__name__}")
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(
                f"metadata must be a dict of str to str: {k!r} -> {type(v).__name__} {v!r}"
            )
    check_not_shared(dict(tensors))
    specs, data = [], {}
    for name, t in tensors.items():
        dtype, shape, raw = to_bytes(name, t)
        specs.append((name, dtype, shape))
        data[name] = raw
    header, places = safetensors_header_bytes(specs, None if metadata is None else dict(metadata))
    if len(header) - 8 > _MAX_HEADER_BYTES:
        # What no loader would read back (this one's rule, and safetensors').
        raise SafetensorError(
            f"header too large: {len(header) - 8} bytes, more than the limit of "
            f"{_MAX_HEADER_BYTES} (metadata or tensor names too long)"
        )
    return header, [(data[name], len(header) + b) for name, b, e in places if e > b]


def save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """Return the bytes of a safetensors file holding `tensors` (identical to safetensors')."""
    header, parts = _prepare(tensors, metadata)
    end = max((at + _nbytes(raw) for raw, at in parts), default=len(header))
    out = bytearray(end)
    out[: len(header)] = header
    for raw, at in parts:
        host = raw.get() if hasattr(raw, "get") else raw  # CuPy
        if type(host).__module__.split(".")[0] == "torch":
            host = host.cpu().numpy()
        out[at : at + _nbytes(raw)] = memoryview(host).cast("B")
    return bytes(out)


def _nbytes(raw: Any) -> int:
    n = raw.nbytes
    return int(n() if callable(n) else n)


def _save_target(filename: PathLike) -> str:
    """Return the name `save_file` replaces, checked before any write.

    That is `filename` in its directory with the directory's symlinks resolved; a symlink at
    `filename` itself is replaced, as safetensors replaces it (the file it names is left
    alone). Where `filename` cannot be a file the error names it, rather than the temporary
    file; a device or FIFO is refused, never replaced by a file.
    """
    given = local_path(os.fsdecode(os.fspath(filename)))
    if not given:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", given)
    head, name = os.path.split(given)
    target = os.path.join(os.path.realpath(head or "."), name) if name else given
    try:
        mode = os.lstat(target).st_mode
        if stat.S_ISLNK(mode):
            return target
    except FileNotFoundError:
        if given.endswith(os.sep):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", given) from None
        if not os.path.isdir(os.path.dirname(target)):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", given) from None
        return target
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", given)
    if given.endswith(os.sep):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", given)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file: a save replaces regular files only", given)
    return target


def save_file(
    tensors: Mapping[str, Any],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    fsync: bool = False,
) -> None:
    """Write `tensors` to `filename`, bytes identical to ``safetensors``' own ``save_file``.

    Every tensor is written in parallel straight from its memory (host, or GPU through ferrio's
    bounce buffers) into ``.NAME.ferrio-tmp-PID-N`` beside the target, flushed to the device
    when `fsync` is true (the write then bypasses the page cache under ``cache="auto"``: direct
    writes reach the disk sooner), then renamed over `filename`; on any error the temporary file is
    removed and `filename` is untouched. A `filename` that is a symlink is replaced by the new
    file, as ``safetensors`` replaces it: the file it named (a blob of a Hugging Face cache,
    say, that other snapshots share) keeps its bytes. A file replaced keeps its permission
    bits; other hard links to it keep the old bytes. A `filename` that exists must be
    a regular file: a directory, FIFO or device raises ``OSError`` before anything is written.
    Tensors must not be modified while the call runs. A numpy or CuPy array that is not
    C-contiguous (a strided view, a Fortran array) or is big-endian is saved as its values in
    C order, little-endian (``safetensors.numpy`` 0.8 writes such an array's raw buffer); a
    non-contiguous torch tensor is refused, as in ``safetensors.torch``. A dtype the format
    lacks raises :class:`SafetensorError`.
    """
    if is_remote_url(os.fsdecode(os.fspath(filename))):
        raise ValueError(
            f"save_file writes a local file, not {os.fsdecode(os.fspath(filename))!r}: save it "
            "locally, then upload it with ferrio.copy(path, url)"
        )
    header, parts = _prepare(tensors, metadata)
    target = _save_target(filename)
    suffix = f".ferrio-tmp-{os.getpid()}-{next(_save_ids)}"
    # The target's name, cut where the temporary name would pass NAME_MAX (255 bytes).
    base = os.fsencode(os.path.basename(target))[: 255 - 1 - len(suffix)]
    tmp = os.path.join(os.path.dirname(target), "." + os.fsdecode(base) + suffix)
    try:
        # A synced save bypasses the page cache under cache=auto (File.sync's docstring).
        synced = {"cache": "bypass"} if fsync and ferrio.config.get("cache") == "auto" else {}
        with ferrio.File(tmp, "w", **synced) as f:  # a local name: never a URL
            futures = [f.pwrite(header, offset=0)]
            futures += [f.pwrite(raw, offset=at) for raw, at in parts]
            ferrio.wait(futures)
            if fsync:
                f.sync()
        with contextlib.suppress(FileNotFoundError):
            old = os.lstat(target)
            if stat.S_ISREG(old.st_mode):
                os.chmod(tmp, stat.S_IMODE(old.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
