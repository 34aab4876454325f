"""Round trips: every dtype and shape, offsets and sizes, end of file, buffer kinds, threads."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import pattern

import ferrio

DTYPES = [np.uint8, np.float32, np.int64, np.complex128]
SHAPES = [(1000,), (37, 53), (5, 7, 11)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{len(s)}d")
def test_write_then_read_every_dtype_and_shape(
    tmp_path: Path, dtype: type, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(3)
    src = (rng.standard_normal(shape) * 1000).astype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        src = src + 1j * rng.standard_normal(shape)
    path = tmp_path / "arr.bin"
    with ferrio.open(path, "w") as f:
        assert f.write(src) == src.nbytes
    assert path.read_bytes() == src.tobytes()
    dst = np.empty_like(src)
    with ferrio.open(path) as f:
        assert f.read(dst) == src.nbytes
    np.testing.assert_array_equal(dst, src)
    np.testing.assert_array_equal(ferrio.fromfile(path, dtype, shape=shape), src)
    np.testing.assert_array_equal(ferrio.fromfile(path, dtype).reshape(shape), src)


@pytest.mark.parametrize(
    ("offset", "size"),
    [
        (0, 1),
        (0, 4096),
        (1, 4095),
        (4095, 2),
        (123, 1 << 20),
        (4096, 3 << 20),
        (777_777, 5_555_555),
        (0, (10 << 20) + 12345),
    ],
)
def test_offsets_and_sizes_match_the_file(
    data_file: tuple[Path, np.ndarray], offset: int, size: int, restore_settings: None
) -> None:
    path, data = data_file
    # Small tasks so that every request is split, with unaligned heads and tails.
    for direct in ("off", "on", "auto"):
        with ferrio.open(path, task_size="64KiB", direct_read=direct) as f:
            buf = np.full(size + 3, 0xAA, dtype=np.uint8)
            assert f.read(buf, size=size, offset=offset) == size
            np.testing.assert_array_equal(buf[:size], data[offset : offset + size])
            assert (buf[size:] == 0xAA).all(), "bytes past `size` must stay untouched"


def test_end_of_file_gives_short_counts(data_file: tuple[Path, np.ndarray]) -> None:
    path, data = data_file
    n = len(data)
    with ferrio.open(path) as f:
        assert f.size == n
        buf = bytearray(1000)
        assert f.read(buf, offset=n - 10) == 10
        assert bytes(buf[:10]) == data[-10:].tobytes()
        assert f.read(buf, offset=n) == 0
        assert f.read(buf, offset=n + 12345) == 0
        assert f.pread(buf, offset=n - 1).result() == 1
        whole = np.empty(n + 4096, dtype=np.uint8)
        assert f.read(whole) == n
        np.testing.assert_array_equal(whole[:n], data)
        assert f.read(bytearray(0)) == 0


def test_fromfile_is_numpy_fromfile(data_file: tuple[Path, np.ndarray]) -> None:
    path, _ = data_file
    for dtype, count, offset in [(np.uint8, -1, 0), (np.float32, 1000, 8), (np.int64, -1, 3)]:
        expected = np.fromfile(path, dtype=dtype, count=count, offset=offset)
        np.testing.assert_array_equal(ferrio.fromfile(path, dtype, count, "", offset), expected)
    with pytest.raises(ValueError, match="fewer than"):
        ferrio.fromfile(path, np.uint8, shape=(1 << 30,))


def test_fromfile_reads_an_open_file_from_its_position_as_numpy_does(
    data_file: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, data = data_file
    with open(path, "rb") as ours, open(path, "rb") as theirs:
        for f in (ours, theirs):
            f.read(10)  # Python's buffer reads ahead; the position is still 10
        for count, offset in [(5, 2), (1000, 0), (-1, 3)]:
            want = np.fromfile(theirs, np.uint16, count=count, offset=offset)
            got = ferrio.fromfile(ours, np.uint16, count=count, offset=offset)
            np.testing.assert_array_equal(got, want)
            assert ours.tell() == theirs.tell()
    # A file written through the object is flushed first; the position ends after the read.
    with open(tmp_path / "rw.bin", "w+b") as f:
        f.write(b"abcdefgh")
        f.seek(2)
        assert ferrio.fromfile(f, "S1", count=3).tolist() == [b"c", b"d", b"e"]
        assert f.tell() == 5 and f.read() == b"fgh"
    with open(path, "rb") as f, pytest.raises(ValueError, match=f"{path}.*fewer than"):
        ferrio.fromfile(f, np.uint8, shape=len(data) + 1)
    with open(path) as text, pytest.raises(TypeError, match="binary mode"):
        ferrio.fromfile(text)  # type: ignore[arg-type]
    with open(tmp_path / "w.bin", "wb") as w, pytest.raises(OSError, match="not open for reading"):
        ferrio.fromfile(w)


def test_fromfile_takes_numpy_positional_order_and_binary_sep_only(
    data_file: tuple[Path, np.ndarray],
) -> None:
    path, _ = data_file
    want = np.fromfile(path, np.float32, 3, "", 8)
    np.testing.assert_array_equal(ferrio.fromfile(path, np.float32, 3, "", 8), want)
    with pytest.raises(TypeError, match="offset is the 5th argument"):
        ferrio.fromfile(path, np.float32, 3, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"text is numpy\.fromfile's"):
        ferrio.fromfile(path, np.float32, sep=" ")


def test_every_kind_of_buffer(data_file: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, data = data_file
    want = data[:8192].tobytes()
    with ferrio.open(path) as f:
        ba = bytearray(8192)
        assert f.read(ba) == 8192 and bytes(ba) == want
        backing = bytearray(10000)
        mv = memoryview(backing)[100:8292]
        assert f.read(mv) == 8192 and bytes(backing[100:8292]) == want
        mm = mmap.mmap(-1, 8192)
        assert f.read(mm) == 8192 and mm[:] == want
        mm.close()
        # a C-contiguous slice of a bigger array
        arr = np.zeros((4, 8192), dtype=np.uint8)
        assert f.read(arr[2]) == 8192 and arr[2].tobytes() == want and not arr[1].any()
    out = tmp_path / "out.bin"
    with ferrio.open(out, "w") as g:
        assert g.write(b"hello ") == 6
        assert g.write(memoryview(b"world"), offset=6) == 5
        assert g.write(bytearray(b"!!!"), size=1, offset=11) == 1
    assert out.read_bytes() == b"hello world!"


def test_buffers_python_files_take(data_file: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    # 0-d arrays and numpy scalars (no shape), ctypes arrays (no strides) and datetime64 arrays
    # (no buffer format): readinto and os.preadv take them; ferrio said "not a buffer".
    path, data = data_file
    scalar = np.zeros((), dtype=np.int64)
    c_bytes = (ctypes.c_uint8 * 16)()
    c_ints = (ctypes.c_int32 * 4)()
    when = np.zeros(3, dtype="datetime64[s]")
    span = np.zeros((2, 2), dtype="timedelta64[ms]")
    with ferrio.open(path) as f:
        assert f.read(scalar) == 8 and scalar.tobytes() == data[:8].tobytes()
        assert f.read(c_bytes, offset=5) == 16 and bytes(c_bytes) == data[5:21].tobytes()
        assert f.pread(c_ints).result() == 16 and bytes(c_ints) == data[:16].tobytes()
        assert f.read(when, offset=3) == 24 and when.tobytes() == data[3:27].tobytes()
        assert f.read(span) == 32 and span.tobytes() == data[:32].tobytes()
    out = tmp_path / "out.bin"
    with ferrio.open(out, "w") as g:
        assert g.write(np.float64(1.5)) == 8
        assert g.write(when, offset=8) == 24
    assert out.read_bytes() == np.float64(1.5).tobytes() + when.tobytes()
    dates = np.arange(5).astype("datetime64[D]")
    dates.tofile(out)
    np.testing.assert_array_equal(ferrio.fromfile(out, "datetime64[D]"), dates)


def test_appends_land_after_other_writers_as_with_o_append(tmp_path: Path) -> None:
    # Mode "a" kept its own end from open: appends by another handle or process were overwritten
    # and a truncation left a hole of zeros. Python's "a" (O_APPEND) writes at the end each time.
    path = tmp_path / "log"
    path.write_bytes(b"start;")
    with (
        ferrio.open(path, "a") as f,
        ferrio.open(path, "a") as g,
        open(path, "ab", buffering=0) as py,
    ):
        f.write(b"f1;")
        py.write(b"py1;")
        g.write(b"g1;")
        f.write(b"f2;")
        assert path.read_bytes() == b"start;f1;py1;g1;f2;"
        os.truncate(path, 3)
        f.write(b"!")
    assert path.read_bytes() == b"sta!"


def test_appends_from_many_threads_on_one_file_keep_every_record(tmp_path: Path) -> None:
    path = tmp_path / "log"
    records = [bytes([65 + i]) * (1000 + 37 * i) for i in range(26)]
    with ferrio.open(path, "a", task_size="4KiB") as f:
        threads = [threading.Thread(target=lambda r=r: f.pwrite(r).result()) for r in records]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    got = path.read_bytes()
    assert len(got) == sum(map(len, records))
    for r in records:
        assert r in got, "each record whole, none overlapping another"


def test_futures_and_modes(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = pattern(3 << 20, seed=4)
    with ferrio.open(path, "w+") as f:
        assert f.mode == "w+"
        futs = [f.pwrite(data[i : i + (1 << 20)], offset=i) for i in range(0, len(data), 1 << 20)]
        assert ferrio.wait(futs) == [1 << 20] * 3
        assert all(fu.done() for fu in futs)
        assert not futs[0].cancel(), "a finished future cannot be cancelled"
        assert not futs[0].cancelled()
        # A cancel that says True always ends cancelled, even if every part had started.
        for _ in range(20):
            fut = f.pread(np.empty(len(data), dtype=np.uint8))
            if fut.cancel():
                with pytest.raises(ferrio.CancelledError):
                    fut.result(timeout=30)
                assert fut.cancelled()
                # As concurrent.futures: a cancelled future has no exception to return.
                with pytest.raises(ferrio.CancelledError):
                    fut.exception()
            else:
                assert fut.result(timeout=30) == len(data)
                assert not fut.cancelled()
        f.sync()
        back = np.empty_like(data)
        fut = f.pread(back)
        assert fut.result(timeout=30) == len(data)
        assert fut.result() == len(data), "the same result on every call"
        assert fut.exception() is None
        np.testing.assert_array_equal(back, data)
    with ferrio.open(path, "a") as f:
        assert f.write(b"tail", offset=0) == 4, "append mode ignores the offset"
    assert path.read_bytes()[-4:] == b"tail"
    assert path.stat().st_size == len(data) + 4
    with ferrio.open(path, "r+b") as f:
        assert f.mode == "r+"
        f.write(b"HEAD")
        assert path.read_bytes()[:4] == b"HEAD"


def test_many_threads_on_one_file(data_file: tuple[Path, np.ndarray]) -> None:
    path, data = data_file
    errors: list[BaseException] = []

    def worker(seed: int, f: ferrio.File) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(25):
                offset = rng.randrange(0, len(data))
                size = rng.randrange(1, 2 << 20)
                buf = np.empty(size, dtype=np.uint8)
                n = f.read(buf, offset=offset) if seed % 2 else f.pread(buf, offset=offset).result()
                expect = data[offset : offset + size]
                assert n == len(expect)
                np.testing.assert_array_equal(buf[:n], expect)
        except BaseException as e:
            errors.append(e)

    with ferrio.open(path, task_size="256KiB") as f:
        threads = [threading.Thread(target=worker, args=(i, f)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_repr_and_properties(data_file: tuple[Path, np.ndarray]) -> None:
    path, data = data_file
    f = ferrio.open(str(path))
    assert isinstance(f, ferrio.File)
    assert f.path == str(path)
    assert f.size == len(data)
    assert isinstance(f.fileno(), int) and f.fileno() >= 0
    assert "data.bin" in repr(f) and "closed" not in repr(f)
    fut = f.pread(bytearray(10))
    fut.result()
    assert "done, 10 bytes" in repr(fut)
    f.close()
    f.close()
    assert f.closed and "closed" in repr(f)


def test_the_buffer_is_held_until_the_io_is_done(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file
    with ferrio.open(path, task_size="64KiB", direct_read="off") as f:
        buf = bytearray(len(data))
        fut = f.pread(buf)
        if not fut.done():
            with pytest.raises(BufferError):
                buf.append(0)  # the export held by the future forbids resizing
        assert fut.result() == len(data)
        buf.append(0)  # released once the future is seen done
        assert buf[: len(data)] == data.tobytes()


def test_dropping_an_unfinished_future_waits_for_it(big_file: tuple[Path, np.ndarray]) -> None:
    path, data = big_file
    with ferrio.open(path, task_size="64KiB", direct_read="off") as f:
        buf = bytearray(len(data))
        fut = f.pread(buf)
        del fut  # the read goes on to its end before the buffer is let go
        buf.append(0)
        assert buf[: len(data)] == data.tobytes()


@pytest.mark.parametrize("direct", ["off", "on", "auto"])
@pytest.mark.parametrize("overread", [False, True])
def test_unaligned_numpy_buffers_with_direct_io(
    data_file: tuple[Path, np.ndarray], direct: str, overread: bool
) -> None:
    path, data = data_file
    ferrio.drop_cache(path)  # cold, so `auto` goes direct too
    with ferrio.open(
        path, "r+", direct_read=direct, direct_write=direct, direct_overread=overread
    ) as f:
        for skew, offset, size in [
            (1, 0, 1 << 20),
            (3, 4097, 3 * 4096 + 5),
            (7, 511, (2 << 20) + 3),
        ]:
            backing = np.full(size + 16, 0xA5, dtype=np.uint8)
            view = backing[skew : skew + size]  # memory not aligned to 512 or 4096
            assert f.read(view, offset=offset) == size
            np.testing.assert_array_equal(view, data[offset : offset + size])
            assert (backing[:skew] == 0xA5).all() and (backing[skew + size :] == 0xA5).all()
        patch = np.random.default_rng(9).integers(0, 256, (1 << 20) + 9, dtype=np.uint8)
        src = np.empty(patch.size + 5, dtype=np.uint8)[5:]  # unaligned source
        src[:] = patch
        assert f.write(src, offset=12345) == patch.size
    got = np.fromfile(path, dtype=np.uint8)
    np.testing.assert_array_equal(got[12345 : 12345 + patch.size], patch)
    np.testing.assert_array_equal(got[:12345], data[:12345])
