"""Every bad input raises the right exception before any I/O; OS errors map to OSError kinds."""

from __future__ import annotations

import ctypes
import errno
import io
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import is_root

import ferrio


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.bin"
    path.write_bytes(bytes(range(256)) * 64)
    return path


def untouched(buf: bytearray | np.ndarray) -> bool:
    return bool((np.frombuffer(buf, dtype=np.uint8) == 0x5A).all())


@pytest.mark.parametrize("method", ["read", "pread"])
def test_read_into_read_only_buffers_is_refused(small_file: Path, method: str) -> None:
    ro = np.full(100, 0x5A, dtype=np.uint8)
    ro.flags.writeable = False
    with ferrio.open(small_file) as f:
        call = getattr(f, method)
        with pytest.raises(ValueError, match="read-only"):
            call(b"x" * 100)
        with pytest.raises(ValueError, match="read-only"):
            call(ro)
        with pytest.raises(ValueError, match="read-only"):
            call(memoryview(bytearray(10)).toreadonly())
    assert untouched(ro)


@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_non_contiguous_buffers_are_refused(small_file: Path, method: str) -> None:
    arr = np.full(200, 0x5A, dtype=np.uint8)
    with ferrio.open(small_file, "r+") as f:
        call = getattr(f, method)
        with pytest.raises(ValueError, match="not C-contiguous"):
            call(arr[::2])
        with pytest.raises(ValueError, match="not C-contiguous"):
            call(np.full((10, 10), 0x5A, dtype=np.uint8).T)
    assert untouched(arr)
    assert small_file.read_bytes() == bytes(range(256)) * 64


@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_sizes_and_offsets_are_checked(small_file: Path, method: str) -> None:
    buf = bytearray(b"\x5a" * 100)
    with ferrio.open(small_file, "r+") as f:
        call = getattr(f, method)
        with pytest.raises(ValueError, match="larger than the buffer"):
            call(buf, size=101)
        with pytest.raises(ValueError, match="at least 0"):
            call(buf, size=-1)
        with pytest.raises(ValueError, match="offset must be at least 0"):
            call(buf, offset=-1)
        with pytest.raises(TypeError, match="buffer protocol"):
            call([1, 2, 3])
        with pytest.raises(TypeError):
            call("text")
        # Buffers that refuse their export say why, not "expected the buffer protocol".
        closed = mmap.mmap(-1, 10)
        closed.close()
        released = memoryview(bytearray(10))
        released.release()
        with pytest.raises(ValueError, match="this mmap: mmap closed"):
            call(closed)
        with pytest.raises(ValueError, match=r"this memoryview: .*released"):
            call(released)
    assert untouched(buf)
    assert small_file.read_bytes() == bytes(range(256)) * 64


def test_closed_file_raises_value_error(small_file: Path) -> None:
    f = ferrio.open(small_file)
    f.close()
    for call in (
        lambda: f.read(bytearray(1)),
        lambda: f.pread(bytearray(1)),
        lambda: f.write(b"x"),
        lambda: f.pwrite(b"x"),
        f.fileno,
        f.sync,
        lambda: f.size,
    ):
        with pytest.raises(ValueError, match="I/O operation on closed file"):
            call()
    with ferrio.open(small_file) as g:
        pass
    assert g.closed


def test_wrong_mode_raises_unsupported_operation(small_file: Path, tmp_path: Path) -> None:
    buf = bytearray(b"\x5a" * 10)
    with ferrio.open(small_file, "r") as f:
        for call in (f.write, f.pwrite):
            with pytest.raises(io.UnsupportedOperation, match="not open for writing"):
                call(b"x")
    with ferrio.open(tmp_path / "w.bin", "w") as f:
        for call in (f.read, f.pread):
            with pytest.raises(io.UnsupportedOperation, match="not open for reading"):
                call(buf)
    assert untouched(buf)
    # io.UnsupportedOperation is both an OSError and a ValueError, like Python's own.
    assert issubclass(io.UnsupportedOperation, ValueError)


@pytest.mark.parametrize("mode", ["", "rw", "r++", "wr", "t", "rt", "rbb", "xa", "rU"])
def test_bad_modes_raise_value_error(small_file: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="r, r\\+, w, w\\+, a, a\\+, x, x\\+"):
        ferrio.open(small_file, mode)


def test_modes_as_python_open_takes_them(small_file: Path, tmp_path: Path) -> None:
    # "x" (exclusive create) and any order of letters ("+r", "b+r") were refused as bad modes.
    for mode, name in [("+r", "r+"), ("b+r", "r+"), ("br", "r"), ("rb+", "r+")]:
        with ferrio.open(small_file, mode) as f:
            assert f.mode == name
    new = tmp_path / "new.bin"
    with ferrio.open(new, "xb") as f:
        assert f.mode == "x"
        assert f.write(b"fresh") == 5
        with pytest.raises(io.UnsupportedOperation, match="not open for reading"):
            f.read(bytearray(5))
    for mode in ("x", "x+"):
        with pytest.raises(FileExistsError) as e:
            ferrio.open(new, mode)
        assert e.value.errno == errno.EEXIST and e.value.filename == str(new)
    assert new.read_bytes() == b"fresh"
    with ferrio.open(tmp_path / "new2.bin", "x+") as f:
        f.write(b"both ways")
        back = bytearray(9)
        assert f.read(back) == 9 and back == b"both ways"
    with pytest.raises(ValueError, match="bytes only"):
        ferrio.open(small_file, "rt")


def test_bad_options_raise_value_error(small_file: Path) -> None:
    with pytest.raises(ValueError, match=r"task_size.*4MiB"):
        ferrio.open(small_file, task_size="lots")
    with pytest.raises(ValueError, match=r"direct_read.*off\|on\|auto"):
        ferrio.open(small_file, direct_read="sometimes")
    with pytest.raises(TypeError, match="int, a bool or a str"):
        ferrio.open(small_file, task_size=1.5)  # type: ignore[arg-type]


def test_a_url_of_an_unknown_scheme_is_named_as_such() -> None:
    with pytest.raises(FileNotFoundError, match="ftp:// is not a URL scheme ferrio opens"):
        ferrio.open("ftp://example.invalid/x")


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "missing.bin"
    with pytest.raises(FileNotFoundError) as e:
        ferrio.open(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(missing)
    assert e.value.strerror
    with pytest.raises(FileNotFoundError) as e2:
        ferrio.residency(missing)
    assert e2.value.filename == str(missing)
    with pytest.raises(FileNotFoundError):
        ferrio.drop_cache(missing)
    with pytest.raises(FileNotFoundError):
        ferrio.fromfile(missing)


def test_directory(tmp_path: Path) -> None:
    for mode in ("r", "r+"):
        with pytest.raises(IsADirectoryError) as e:
            ferrio.open(tmp_path, mode)
        assert e.value.errno == errno.EISDIR
        assert e.value.filename == str(tmp_path)


@pytest.mark.skipif(is_root(), reason="root bypasses file permissions")
def test_no_permission(small_file: Path) -> None:
    small_file.chmod(0o000)
    try:
        with pytest.raises(PermissionError) as e:
            ferrio.open(small_file)
        assert e.value.errno in (errno.EACCES, errno.EPERM)
        assert e.value.filename == str(small_file)
    finally:
        small_file.chmod(0o644)


@pytest.mark.skipif(is_root(), reason="root may drop the system cache")
def test_drop_system_cache_needs_root() -> None:
    with pytest.raises(PermissionError) as e:
        ferrio.drop_system_cache()
    assert e.value.filename == "/proc/sys/vm/drop_caches"


def test_exception_hierarchy() -> None:
    for cls in (ferrio.CancelledError, ferrio.CudaUnavailableError, ferrio.CudaError):
        assert issubclass(cls, ferrio.FerrioError)
    assert issubclass(ferrio.FerrioError, Exception)
    assert not issubclass(ferrio.FerrioError, OSError)
    assert ferrio.FerrioError.__module__ == "ferrio"


def test_gpu_arrays_without_a_driver_say_why(small_file: Path) -> None:
    class FakeCudaArray:
        @property
        def __cuda_array_interface__(self) -> dict[str, object]:
            return {"shape": (4,), "typestr": "|u1", "data": (0x1000, False), "version": 3}

    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]  # noqa: F401

        pytest.skip("CuPy present: the GPU tests cover device arrays")
    except ImportError:
        pass
    with (
        ferrio.open(small_file) as f,
        pytest.raises(ferrio.CudaUnavailableError, match="CUDA is not available"),
    ):
        f.read(FakeCudaArray())


def test_bad_cuda_array_interfaces_are_value_errors(small_file: Path) -> None:
    class Strided:
        __cuda_array_interface__ = {  # noqa: RUF012
            "shape": (4, 4),
            "typestr": "<f4",
            "data": (0x1000, False),
            "strides": (32, 8),
            "version": 3,
        }

    class ReadOnly:
        __cuda_array_interface__ = {  # noqa: RUF012
            "shape": (4,),
            "typestr": "|u1",
            "data": (0x1000, True),
            "version": 3,
        }

    class Broken:
        __cuda_array_interface__ = {"shape": (4,)}  # noqa: RUF012

    with ferrio.open(small_file) as f:
        with pytest.raises(ValueError, match="contiguous"):
            f.read(Strided())
        with pytest.raises(ValueError, match="read-only"):
            f.read(ReadOnly())
        with pytest.raises(ValueError, match="data"):
            f.read(Broken())


def test_failed_io_raises_from_future_every_time(tmp_path: Path) -> None:
    # /proc/self/mem has a size of 0 and refuses reads at unmapped addresses (offset 0).
    path = Path("/proc/self/mem")
    if not path.exists():
        pytest.skip("no /proc/self/mem on this system")
    with ferrio.open(path) as f:
        fut = f.pread(bytearray(4096), offset=0)
        with pytest.raises(OSError) as e1:
            fut.result()
        with pytest.raises(OSError) as e2:
            fut.result()
        assert e1.value.errno == e2.value.errno == errno.EIO
        assert e1.value.filename == str(path)
        assert isinstance(fut.exception(), OSError)
        assert "failed" in repr(fut)


def test_invalid_timeouts(small_file: Path) -> None:
    with ferrio.open(small_file) as f:
        fut = f.pread(bytearray(10))
        for bad in (-1.0, float("nan")):
            with pytest.raises(ValueError, match="timeout"):
                fut.result(bad)
        assert fut.result(0.0 if fut.done() else 10.0) == 10


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Runs this Python with `args` and the environment `env`, its output captured as text."""
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=False
    )


def test_os_error_of_the_environment_is_a_warning(tmp_path: Path) -> None:
    env = dict(os.environ, FERRIO_TASK_SIZE="lots")
    out = _python(env, "-W", "error::RuntimeWarning", "-c", "import ferrio")
    assert out.returncode != 0
    assert "FERRIO_TASK_SIZE" in out.stderr and "lots" in out.stderr and "4MiB" in out.stderr


@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_object_arrays_are_refused(small_file: Path, method: str) -> None:
    # Bytes written over PyObject pointers crash the interpreter: refused like numpy.fromfile.
    objs = np.array([object() for _ in range(8)], dtype=object)
    record = np.zeros(4, dtype=[("count", np.int64), ("Obj", object)])
    # numpy exports no buffer format for datetime64: the dtype says it holds objects.
    dated = np.zeros(4, dtype=[("when", "datetime64[s]"), ("Obj", object)])
    c_objs = (ctypes.py_object * 4)(*range(4))
    with ferrio.open(small_file, "r+") as f:
        call = getattr(f, method)
        for arr in (objs, record, dated, c_objs):
            with pytest.raises(ValueError, match="Python object"):
                call(arr)
    with pytest.raises(ValueError, match="Python objects"):
        ferrio.fromfile(small_file, dtype=object)
    assert small_file.read_bytes() == bytes(range(256)) * 64


def test_fields_named_with_an_o_are_plain_data(small_file: Path) -> None:
    plain = np.zeros(4, dtype=[("Obj", np.int64)])
    with ferrio.open(small_file) as f:
        assert f.read(plain) == 32
    assert plain.tobytes() == bytes(range(32))


def test_bytes_and_pathlike_bytes_paths(small_file: Path, tmp_path: Path) -> None:
    raw = os.fsencode(small_file)
    with ferrio.open(raw) as f:
        assert f.size == small_file.stat().st_size
    with ferrio.File(raw) as f:
        buf = bytearray(16)
        assert f.read(buf) == 16
    assert ferrio.residency(raw).range_bytes == small_file.stat().st_size
    ferrio.drop_cache(raw)
    # A name that is not valid UTF-8 is kept byte for byte.
    odd = os.fsencode(tmp_path) + b"/odd-\xff.bin"
    with ferrio.open(odd, "w") as f:
        f.write(b"hello")
    assert Path(os.fsdecode(odd)).read_bytes() == b"hello"
    ferrio.copy(raw, os.fsencode(tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == small_file.read_bytes()
    with pytest.raises(TypeError):
        ferrio.open(12.5)  # type: ignore[arg-type]


def test_a_closed_file_cannot_be_entered_again(tmp_path: Path) -> None:
    """As Python's own files: `with f:` on a closed file raises instead of handing it out."""
    p = tmp_path / "f"
    p.write_bytes(b"x")
    f = ferrio.open(p)
    f.close()
    with pytest.raises(ValueError, match="closed file"), f:
        pass
    with open(p, "rb") as plain:
        pass
    with pytest.raises(ValueError, match="closed file"), plain:
        pass


def test_the_command_line_reports_a_bad_variable_once_as_an_error() -> None:
    """`python -m ferrio` (as the console script) says what is wrong with the environment as
    its error; the import's RuntimeWarning said it a second time, as if it were ignored."""
    env = dict(os.environ, FERRIO_TASK_SIZE="lots")
    for args in (["-m", "ferrio"], ["-W", "error::RuntimeWarning", "-m", "ferrio"]):
        out = _python(env, *args, "info", __file__)
        assert out.returncode == 2, out
        assert "RuntimeWarning" not in out.stderr, out.stderr
        assert out.stderr.count("FERRIO_TASK_SIZE") == 1, out.stderr


def test_a_misspelt_variable_is_named_once_with_the_setting_it_is_nearest() -> None:
    """A `FERRIO_*` variable that names no setting was ignored without a word (a benchmark ran
    its defaults for a whole run under `FERRIO_FERRIO_CACHE`)."""
    env = dict(os.environ, FERRIO_THREAD_PER_DEVICE="8")
    out = _python(env, "-c", "import ferrio; print(ferrio.config.environment_warnings())")
    assert out.returncode == 0, out
    assert "RuntimeWarning" in out.stderr, out.stderr
    assert "did you mean FERRIO_THREADS_PER_DEVICE?" in out.stderr, out.stderr
    assert "FERRIO_THREAD_PER_DEVICE is no ferrio setting" in out.stdout, out.stdout
    # The command line says it once, as a warning, and goes on.
    out = _python(env, "-m", "ferrio", "info", __file__)
    assert out.returncode == 0, out
    assert "RuntimeWarning" not in out.stderr, out.stderr
    assert out.stderr.count("FERRIO_THREAD_PER_DEVICE") == 1, out.stderr
    assert "ferrio: warning:" in out.stderr, out.stderr
    # Settings' own variables, `FERRIO_TRACE` and the project's test tools' are no mistake.
    env = dict(os.environ, FERRIO_TASK_SIZE="1MiB", FERRIO_TRACE="off", FERRIO_TEST_X="1")
    out = _python(env, "-W", "error", "-c", "import ferrio")
    assert out.returncode == 0 and not out.stderr, out
