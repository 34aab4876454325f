"""safe_open.get_tensor read ahead: calls that walk a checkpoint in file or keys() order get
tensors read before they are asked for; every other pattern gets the same bytes, with the
memory held ahead bounded and nothing left running after close."""

from __future__ import annotations

import json
import os
import struct
import threading
import time

import numpy as np
import pytest
from conftest import Recorder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ferrio
import ferrio.safetensors as fs
from ferrio.safetensors import SafetensorError

sn = pytest.importorskip("safetensors.numpy")

MIB = 1 << 20


def sample(dtype: str, n: int, seed: int) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, n * np.dtype(dtype).itemsize, np.uint8)
    return raw.view(dtype)


def checkpoint(tmp_path, tensors: dict[str, np.ndarray], name: str = "m.safetensors"):
    path = tmp_path / name
    sn.save_file(tensors, path)
    return path


def layers(count: int, elems: int = 4096) -> dict[str, np.ndarray]:
    """`count` float32 tensors, named so that keys() order is file order."""
    return {f"layer.{i:03d}.w": sample("float32", elems, i) for i in range(count)}


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("walk", ["keys", "offset_keys"])
def test_a_loop_in_order_is_read_ahead_and_bit_identical(tmp_path, walk):
    # Mixed dtypes: safetensors lays out wider types first, so file order is not keys() order.
    d = {f"a.{i:02d}": sample("uint8", 5000 + i, i) for i in range(12)}
    d.update({f"b.{i:02d}": sample("float64", 700 + i, 50 + i) for i in range(12)})
    d.update({f"c.{i:02d}": sample("int16", 900 + i, 90 + i) for i in range(12)})
    path = checkpoint(tmp_path, d)
    with fs.safe_open(path, "numpy") as f:
        names = getattr(f, walk)()
        assert f.keys() != f.offset_keys()  # the test means something only if they differ
        for name in names:
            same(f.get_tensor(name), d[name])
        # All but the first two calls (which tell the order) and the first of each dtype
        # run, where a keys() walk leaves file order, came from reads started ahead.
        assert f._ahead.hits >= len(names) - 6, f._ahead.hits


def test_tensors_read_ahead_have_memory_of_their_own(tmp_path):
    d = layers(8)
    path = checkpoint(tmp_path, d)
    with fs.safe_open(path, "numpy") as f:
        names = f.keys()
        got = [f.get_tensor(k) for k in names]
    assert f._ahead.hits > 0
    for i, a in enumerate(got):
        assert a.flags.writeable
        assert not any(np.shares_memory(a, b) for b in got[i + 1 :])


def test_the_bytes_held_ahead_stay_within_the_setting(tmp_path, monkeypatch):
    d = layers(40, elems=MIB // 4)  # 40 tensors of 1 MiB
    path = checkpoint(tmp_path, d)
    reads = Recorder(monkeypatch)
    with ferrio.config.set(tensor_read_ahead="4MiB"), fs.safe_open(path, "numpy") as f:
        for k in sorted(d)[:3]:
            same(f.get_tensor(k), d[k])
            assert f._ahead._bytes <= 4 * MIB
    # Three asked for, and at most the window's four read beyond them.
    assert 3 * MIB <= reads.nbytes <= 7 * MIB, reads.nbytes


def test_a_tensor_larger_than_the_window_is_still_read_one_ahead(tmp_path):
    d = layers(6, elems=MIB)  # 4 MiB each
    path = checkpoint(tmp_path, d)
    with ferrio.config.set(tensor_read_ahead="1MiB"), fs.safe_open(path, "numpy") as f:
        names = f.keys()
        for k in names:
            same(f.get_tensor(k), d[k])
            assert len(f._ahead._ahead) <= 1
    assert f._ahead.hits == len(d) - 2


def test_no_read_ahead_when_the_setting_is_zero_at_open(tmp_path, monkeypatch):
    d = layers(10)
    path = checkpoint(tmp_path, d)
    reads = Recorder(monkeypatch)
    with ferrio.config.set(tensor_read_ahead=0):
        f = fs.safe_open(path, "numpy")
    with f:  # the setting is taken at open, as a file's settings are
        for k in sorted(d)[:5]:
            same(f.get_tensor(k), d[k])
    assert f._ahead.hits == 0
    assert reads.nbytes == 5 * 4096 * 4  # exactly what was asked for


def test_a_walk_that_skips_lets_the_skipped_go_and_goes_on(tmp_path):
    d = layers(30)
    path = checkpoint(tmp_path, d)
    names = sorted(d)
    # As a loader does that takes only the tensors its model has: runs with gaps.
    walk = names[0:4] + names[7:10] + names[15:17] + names[25:30]
    with fs.safe_open(path, "numpy") as f:
        for k in walk:
            same(f.get_tensor(k), d[k])
            held = [r.tensor.name for r in f._ahead._ahead]
            assert all(n > k for n in held), (k, held)  # nothing before the call is kept
        assert f._ahead.hits >= 8


def test_backwards_walks_read_alone_and_stop_the_read_ahead(tmp_path, monkeypatch):
    d = layers(20)
    path = checkpoint(tmp_path, d)
    names = sorted(d)
    reads = Recorder(monkeypatch)
    with fs.safe_open(path, "numpy") as f:
        for k in names[:3]:  # tells the order: reads start ahead
            same(f.get_tensor(k), d[k])
        for k in reversed(names[:3]):  # then the caller goes back: read alone
            same(f.get_tensor(k), d[k])
        assert f._ahead._order is None and not f._ahead._ahead
        before = reads.nbytes
        for k in names[10:15]:  # in order again: no more reads ahead on this handle
            same(f.get_tensor(k), d[k])
        assert reads.nbytes - before == 5 * 4096 * 4


def test_a_reverse_walk_never_reads_ahead(tmp_path, monkeypatch):
    d = layers(12)
    path = checkpoint(tmp_path, d)
    reads = Recorder(monkeypatch)
    with fs.safe_open(path, "numpy") as f:
        for k in reversed(f.keys()):
            same(f.get_tensor(k), d[k])
    assert f._ahead.hits == 0 and reads.nbytes == 12 * 4096 * 4


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=st.lists(st.integers(0, 15), min_size=1, max_size=40), window=st.integers(0, 40000))
def test_any_sequence_of_calls_gets_the_right_bytes(tmp_path, calls, window):
    d = {
        f"t.{i:02d}": sample(["uint8", "float32", "int64"][i % 3], 100 + 37 * i, i)
        for i in range(16)
    }
    path = tmp_path / "h.safetensors"
    if not path.exists():
        sn.save_file(d, path)
    names = sorted(d)
    largest = max(v.nbytes for v in d.values())
    with ferrio.config.set(tensor_read_ahead=window), fs.safe_open(path, "numpy") as f:
        for i in calls:
            same(f.get_tensor(names[i]), d[names[i]])
            assert f._ahead._bytes <= max(window, largest)


def test_a_file_truncated_under_the_reads_fails_the_call_that_asks(tmp_path):
    d = layers(16)  # 16 KiB each
    path = checkpoint(tmp_path, d)
    with ferrio.config.set(tensor_read_ahead="32KiB"), fs.safe_open(path, "numpy") as f:
        names = f.keys()
        for k in names[:4]:
            same(f.get_tensor(k), d[k])
        # Shortened under the open handle: the last six tensors are gone.
        os.truncate(path, os.path.getsize(path) - 6 * 4096 * 4)
        failed = []
        for k in names[4:]:
            try:
                same(f.get_tensor(k), d[k])
            except SafetensorError as e:
                failed.append((k, "truncated" in str(e)))
    assert failed == [(k, True) for k in names[10:]]


def test_closing_with_reads_ahead_waits_for_them_and_closes(tmp_path):
    d = layers(50, elems=MIB // 4)
    path = checkpoint(tmp_path, d)
    f = fs.safe_open(path, "numpy")
    for k in sorted(d)[:2]:
        same(f.get_tensor(k), d[k])
    assert f._ahead._ahead  # reads in flight
    f.close()
    assert not f._ahead._ahead
    with pytest.raises(SafetensorError, match="closed"):
        f.get_tensor(sorted(d)[2])


def test_threads_walking_parts_of_one_handle_get_the_right_tensors(tmp_path):
    d = layers(64)
    path = checkpoint(tmp_path, d)
    names = sorted(d)
    errors: list[BaseException] = []
    with fs.safe_open(path, "numpy") as f:

        def walk(part: list[str]) -> None:
            try:
                for k in part:
                    same(f.get_tensor(k), d[k])
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=walk, args=(names[i::4],)) for i in range(4)]
        threads += [threading.Thread(target=walk, args=(names,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]


def test_a_tensor_the_library_cannot_hold_fails_only_when_asked_for(tmp_path):
    try:
        import ml_dtypes  # noqa: F401

        pytest.skip("ml_dtypes gives numpy a bfloat16")
    except ImportError:
        pass
    # Four F32 tensors, then a BF16 one, which numpy without ml_dtypes cannot hold.
    header = {f"a.{i}": {"dtype": "F32", "shape": [100], "data_offsets": [400 * i, 400 * i + 400]}
              for i in range(4)}  # fmt: skip
    header["b.half"] = {"dtype": "BF16", "shape": [10], "data_offsets": [1600, 1620]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = np.arange(400, dtype=np.float32).tobytes() + bytes(20)
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    with fs.safe_open(path, "numpy") as f:
        for i in range(4):  # reads ahead of the last ones try the BF16 tensor: no error yet
            np.testing.assert_array_equal(f.get_tensor(f"a.{i}"), np.arange(100 * i, 100 * i + 100))
        with pytest.raises(TypeError, match="BF16"):
            f.get_tensor("b.half")


def test_a_read_that_cannot_start_ahead_is_not_retried_on_every_call(tmp_path, monkeypatch):
    """A tensor whose memory cannot be had (out of memory) is tried once ahead, then by the
    call that asks for it, which raises; not again on each call in between (a GPU library's
    out-of-memory path empties its whole cache each time). The reads go on after it."""
    from ferrio.safetensors import _frameworks

    d = layers(12)
    d["layer.006.w"] = sample("float32", 5000, 6)  # the one size that cannot be had
    path = checkpoint(tmp_path, d)
    tries = []
    plain = _frameworks.Numpy.empty

    def empty(self, nbytes):
        if nbytes >= 5000 * 4:
            tries.append(nbytes)
            raise MemoryError("no memory for this one")
        return plain(self, nbytes)

    monkeypatch.setattr(_frameworks.Numpy, "empty", empty)
    with fs.safe_open(path, "numpy") as f:
        names = f.keys()
        for k in names:
            if k == "layer.006.w":
                with pytest.raises(MemoryError):
                    f.get_tensor(k)
            else:
                same(f.get_tensor(k), d[k])
        assert f._ahead.hits >= len(names) - 4  # read ahead before it and after it
    assert len(tries) == 2, tries  # once ahead, once by the call that asks


@pytest.mark.parametrize("framework", ["pt", "cupy"])
def test_a_gpu_loop_is_read_ahead_and_bit_identical(tmp_path, framework):
    """The loop transformers and vLLM run, onto the GPU: reads ahead land in tensors of
    their own in GPU memory, every byte as safetensors wrote it."""
    if framework == "pt":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")

        def host(t):
            return t.cpu().numpy()
    else:
        cupy = pytest.importorskip("cupy")
        try:
            cupy.cuda.runtime.getDeviceCount()
        except Exception:
            pytest.skip("no CUDA device")
        host = cupy.asnumpy
    # Sizes from a few bytes to several bounce buffers, so reads ahead run on many workers.
    d = {f"w.{i:02d}": sample("float32", (1 + i * 997) * (i % 5 + 1) * 64, i) for i in range(24)}
    d["tiny"] = sample("uint8", 3, 99)
    path = checkpoint(tmp_path, d)
    with fs.safe_open(path, framework, device="cuda:0") as f:
        names = f.keys()
        got = {k: f.get_tensor(k) for k in names}
        assert f._ahead.hits >= len(names) - 3
    for k, t in got.items():
        same(host(t), d[k])


def test_a_forked_child_reads_what_its_parent_had_read_ahead(tmp_path):
    """Reads ahead belong to the process that started them: a child forked with some in flight
    (a DataLoader worker, a multiprocessing pool) read them itself, where its calls failed with
    'started by process N before it forked'; the parent goes on with its own."""
    d = layers(20)
    path = checkpoint(tmp_path, d)
    names = sorted(d)
    with fs.safe_open(path, "numpy") as f:
        for k in names[:3]:
            same(f.get_tensor(k), d[k])
        assert f._ahead._ahead  # reads ahead when the fork comes
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if every tensor is right
            code = 1
            try:
                for k in names[3:12]:
                    same(f.get_tensor(k), d[k])
                code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child hung")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        hits = f._ahead.hits
        for k in names[3:]:
            same(f.get_tensor(k), d[k])
        assert f._ahead.hits > hits  # the parent's reads ahead still serve it
