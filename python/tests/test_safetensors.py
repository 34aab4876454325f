"""ferrio.safetensors against the real safetensors package: bit-identical loads and saves,
shards, tensor_filter, slices, validation (one test per rule, plus a hypothesis fuzz)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import Recorder

import ferrio
import ferrio.safetensors as fs
import ferrio.safetensors.numpy as fsn
from ferrio.safetensors import SafetensorError

safetensors = pytest.importorskip("safetensors")
sn = pytest.importorskip("safetensors.numpy")

NUMPY_DTYPES = [
    "bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32", "float32",
    "complex64", "float64", "int64", "uint64",
]  # fmt: skip


def sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(
        0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8
    )
    if dtype == "bool":
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def all_numpy() -> dict[str, np.ndarray]:
    d = {f"t.{dt}": sample(dt, (3, 5), i) for i, dt in enumerate(NUMPY_DTYPES)}
    d["scalar"] = np.array(7, dtype=np.int32)
    d["empty"] = np.zeros((0, 4), dtype=np.float32)
    return d


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def test_every_numpy_dtype_loads_bit_identical_both_ways(tmp_path):
    d = all_numpy()
    theirs = tmp_path / "theirs.safetensors"
    sn.save_file(d, theirs)
    assert_same(fsn.load_file(theirs), sn.load_file(theirs))
    assert_same(fs.load_file(theirs, framework="numpy"), d)
    ours = tmp_path / "ours.safetensors"
    fsn.save_file(d, ours)
    assert_same(sn.load_file(ours), d)
    assert_same(fsn.load(ours.read_bytes()), d)


@pytest.mark.parametrize("metadata", [None, {}, {"format": "np"}])
def test_saved_bytes_equal_safetensors(tmp_path, metadata):
    d = all_numpy()
    assert fsn.save(d, metadata=metadata) == sn.save(d, metadata=metadata)
    fsn.save_file(d, tmp_path / "a", metadata=metadata)
    sn.save_file(d, tmp_path / "b", metadata=metadata)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.parametrize("metadata", ["k=v", [("k", "v")], {"k": 1}, {1: "v"}])
def test_metadata_that_is_not_a_dict_of_strings_is_a_type_error(tmp_path, metadata):
    d = {"a": np.zeros(2)}
    for save in (sn.save, fsn.save):
        with pytest.raises(TypeError):
            save(d, metadata=metadata)
    with pytest.raises(TypeError):
        fsn.save_file(d, tmp_path / "m.safetensors", metadata=metadata)
    assert os.listdir(tmp_path) == []


def test_safe_open_api(tmp_path):
    d = {"b": np.arange(12, dtype=np.float32).reshape(4, 3), "a": np.arange(4, dtype=np.int8)}
    p = tmp_path / "m.safetensors"
    sn.save_file(d, p, metadata={"k": "v"})
    with fs.safe_open(p, framework="numpy", backend="mmap") as f:
        assert f.keys() == ["a", "b"]
        assert f.offset_keys() == ["b", "a"]
        assert f.metadata() == {"k": "v"}
        f.metadata()["k"] = "changed"  # the caller's copy, as in safetensors
        assert f.metadata() == {"k": "v"}
        np.testing.assert_array_equal(f.get_tensor("a"), d["a"])
        sl = f.get_slice("b")
        assert sl.get_shape() == [4, 3] and sl.get_dtype() == "F32"
        np.testing.assert_array_equal(sl[1:3], d["b"][1:3])
        np.testing.assert_array_equal(sl[-1], d["b"][-1])
        np.testing.assert_array_equal(sl[::-2, 1:], d["b"][::-2, 1:])
        np.testing.assert_array_equal(sl[5:], d["b"][5:])
        assert [n for n, _ in f.tensors()] == ["b", "a"]
        with pytest.raises(SafetensorError, match="does not contain tensor zz"):
            f.get_tensor("zz")


def test_numpy_bf16_needs_ml_dtypes_and_matches_safetensors(tmp_path):
    # numpy has no bfloat16: ferrio loads BF16 where the ml_dtypes package provides one, and
    # refuses it (TypeError naming the dtype) otherwise. Where safetensors.numpy loads it too,
    # both give the same bytes.
    p = tmp_path / "bf.safetensors"
    raw = b"\x80\x3f\x00\x40"
    write_raw(p, {"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, 4, raw)
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    if ml_dtypes is None:
        with pytest.raises(TypeError, match="BF16"):
            fsn.load_file(p)
        ours = None
    else:
        ours = fsn.load_file(p)["x"]
        assert ours.dtype == np.dtype(ml_dtypes.bfloat16)
        assert ours.tobytes() == raw
    try:
        with sn.safe_open(p, "np") as f:
            theirs = f.get_tensor("x")
    except TypeError:
        theirs = None
    if theirs is not None:
        assert ours is not None, "safetensors.numpy loads BF16 here and ferrio does not"
        assert ours.tobytes() == theirs.tobytes()


def test_sharded_directory_and_index(tmp_path):
    d1 = {"a": sample("float32", (4, 4), 1), "b": sample("int64", (3,), 2)}
    d2 = {"c": sample("float16", (8,), 3)}
    sn.save_file(d1, tmp_path / "model-00001-of-00002.safetensors")
    sn.save_file(d2, tmp_path / "model-00002-of-00002.safetensors")
    assert_same(fsn.load_file(tmp_path), {**d1, **d2})
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = {"metadata": {}, "weight_map": {"a": first, "b": first, "c": second}}
    (tmp_path / "consolidated.safetensors.index.json").write_text(json.dumps(index))
    assert_same(fsn.load_file(tmp_path / "consolidated.safetensors.index.json"), {**d1, **d2})
    assert_same(fsn.load_file(tmp_path), {**d1, **d2})  # the directory's one index is used
    assert_same(fsn.load_file([tmp_path / "model-00002-of-00002.safetensors"]), d2)


def test_a_directory_with_two_indexes_is_ambiguous(tmp_path):
    """Mistral's repositories hold consolidated.* and model.* checkpoints side by side: a
    directory with both indexes names no single checkpoint, so neither (nor both) is loaded."""
    names = {"consolidated": "layers.0.wq", "model": "model.layers.0.q_proj"}
    for ckpt, name in names.items():
        sn.save_file({name: np.zeros(2)}, tmp_path / f"{ckpt}.safetensors")
        index = {"weight_map": {name: f"{ckpt}.safetensors"}}
        (tmp_path / f"{ckpt}.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SafetensorError, match="2 indexes"):
        fsn.load_file(tmp_path)
    got = fsn.load_file(tmp_path / "model.safetensors.index.json")
    assert list(got) == ["model.layers.0.q_proj"]


def test_no_shards_is_an_empty_checkpoint(tmp_path):
    """An empty list of files, or an index that maps no tensor, holds no tensor (no crash)."""
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    for path in ([], tmp_path / "m.safetensors.index.json", tmp_path):
        assert fsn.load_file(path) == {}
        with fs.safe_open(path, "numpy") as f:
            assert f.keys() == [] and f.metadata() is None and list(f.tensors()) == []


def test_a_missing_or_broken_shard_is_named_and_nothing_stays_open(tmp_path):
    """Shards are opened several at once: the first failure in file order is raised, naming
    its file, and every shard that did open is closed again."""
    names = [f"model-{i:05d}-of-00006.safetensors" for i in range(1, 7)]
    for i, n in enumerate(names):
        sn.save_file({f"t{i}": sample("float32", (16,), i)}, tmp_path / n)
    index = {"weight_map": {f"t{i}": n for i, n in enumerate(names)}}
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / names[4]).write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")  # truncated
    os.unlink(tmp_path / names[2])
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError) as e:
        fsn.load_file(tmp_path / "m.safetensors.index.json")
    assert names[2] in str(e.value)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_shards_open_one_after_another_while_quick_and_at_once_after_a_slow_one():
    """A warm shard opens faster than a pool's thread takes the call, so shards open in the
    caller's thread; from the first open as slow as a cold disk's or a store's, the rest go
    several at once (here three that can only finish together), results in file order."""
    import threading

    caller, threads = threading.get_ident(), set()

    def quick(i):
        threads.add(threading.get_ident())
        return 2 * i

    with fs._Calls(5, pooled=False) as calls:
        assert calls.map(quick, range(5)) == [0, 2, 4, 6, 8]
    assert threads == {caller}

    together = threading.Barrier(3, timeout=30)

    def slow_then_together(i):
        threads.add(threading.get_ident())
        if i == 1:
            time.sleep(10 * fs._QUICK_S)
        if i >= 2:
            together.wait()  # breaks (an error) unless items 2-4 run at once
        return 2 * i

    threads.clear()
    with fs._Calls(5, pooled=False) as calls:
        assert calls.map(slow_then_together, range(5)) == [0, 2, 4, 6, 8]
        assert calls.map(quick, [7]) == [14]  # the pool stays for the headers
    assert caller in threads and len(threads) >= 4
    threads.clear()
    with fs._Calls(2, pooled=True) as calls:  # several objects of a store
        assert calls.map(quick, range(2)) == [0, 2]
    assert caller not in threads


def test_more_shards_than_the_soft_limit_on_open_files_load(tmp_path):
    """Every shard stays open until the load ends (one descriptor each, and a second opened
    at its first direct read): a checkpoint of more shards than `ulimit -n` allows loads where
    the hard limit has room (the soft one is raised), and is refused up front, naming both
    counts, where it has not room for one descriptor each."""
    shards = 150
    for i in range(shards):
        sn.save_file({f"t{i}": np.full(4, i, np.int32)}, tmp_path / f"m-{i:05d}.safetensors")
    load = f"""
import resource, sys
import ferrio.safetensors.numpy as fsn
resource.setrlimit(resource.RLIMIT_NOFILE, (128, int(sys.argv[1])))
try:
    got = fsn.load_file({str(tmp_path)!r})
except OSError as e:
    print("refused", e.errno, e)
else:
    assert sorted(int(v[0]) for v in got.values()) == list(range({shards}))
    print("loaded", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit on open files here is {hard}")
    out = subprocess.run([sys.executable, "-c", load, "1024"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0] == "loaded" and 2 * shards < int(words[1]) <= 1024, out.stdout
    # Room for one descriptor per shard, not two: the shards are read through the page cache,
    # and where they bypass it, those whose direct descriptor cannot be had read buffered.
    for cache in ("auto", "bypass"):
        env = {**os.environ, "FERRIO_CACHE": cache}
        out = subprocess.run(
            [sys.executable, "-c", load, "300"], capture_output=True, text=True, env=env
        )
        assert out.returncode == 0, (cache, out.stderr)
        assert out.stdout.split() == ["loaded", "300"], (cache, out.stdout)
    out = subprocess.run([sys.executable, "-c", load, "128"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"refused {errno.EMFILE} "), out.stdout
    assert f"checkpoint's {shards} files need at least" in out.stdout
    assert "hard limit 128" in out.stdout


def test_tensor_filter_opens_only_the_shards_the_index_names(tmp_path):
    """With an index, a shard holding no selected tensor is never opened: one missing (or
    slow to reach) does not matter."""
    names = [f"model-{i:05d}-of-00003.safetensors" for i in range(1, 4)]
    for i, n in enumerate(names):
        sn.save_file({f"layers.{i}.w": sample("float32", (4,), i)}, tmp_path / n)
    index = {"weight_map": {f"layers.{i}.w": n for i, n in enumerate(names)}}
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps(index))
    os.unlink(tmp_path / names[0])
    got = fsn.load_file(tmp_path, tensor_filter=["layers.2.*"])
    assert_same(got, sn.load_file(tmp_path / names[2]))
    with pytest.raises(FileNotFoundError, match=names[0]):
        fsn.load_file(tmp_path, tensor_filter=["layers.0.*"])


def test_duplicate_across_shards_names_both_files(tmp_path):
    sn.save_file({"a": np.zeros(2)}, tmp_path / "x.safetensors")
    sn.save_file({"a": np.ones(2)}, tmp_path / "y.safetensors")
    with pytest.raises(SafetensorError, match=r"x\.safetensors and .*y\.safetensors"):
        fsn.load_file(tmp_path)


def test_index_pointing_at_the_wrong_file(tmp_path):
    sn.save_file({"a": np.zeros(2)}, tmp_path / "x.safetensors")
    sn.save_file({"b": np.zeros(2)}, tmp_path / "y.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "y.safetensors", "b": "y.safetensors"}})
    )
    with pytest.raises(SafetensorError, match="'a'"):
        fsn.load_file(tmp_path)


@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "sub/../../outside.safetensors",
        "/abs.safetensors",
        "..\\outside.safetensors",
        "",
        "file:///x.safetensors",
    ],
)
def test_an_index_may_name_only_shards_beside_it(tmp_path, shard):
    """A shard named outside the index's directory is refused before anything is opened: an
    index downloaded with a model must not make the loader read other files."""
    inner = tmp_path / "model"
    inner.mkdir()
    sn.save_file({"a": np.zeros(2)}, tmp_path / "outside.safetensors")
    sn.save_file({"b": np.zeros(2)}, inner / "x.safetensors")
    index = inner / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": shard, "b": "x.safetensors"}}))
    with pytest.raises(SafetensorError, match=r"'a' is mapped to .* not a file beside the index"):
        fsn.load_file(index)
    # A shard in a directory below the index is beside it.
    (inner / "sub").mkdir()
    sn.save_file({"a": np.ones(2)}, inner / "sub" / "y.safetensors")
    index.write_text(json.dumps({"weight_map": {"a": "sub/y.safetensors", "b": "x.safetensors"}}))
    np.testing.assert_array_equal(fsn.load_file(index)["a"], np.ones(2))


def test_tensor_filter_reads_only_selected_bytes(tmp_path, monkeypatch):
    d = {f"layer.{i}.w": sample("float32", (256, 256), i) for i in range(4)}
    d["embed"] = sample("uint8", (1 << 20,), 9)
    p = tmp_path / "m.safetensors"
    sn.save_file(d, p)
    rec = Recorder(monkeypatch)
    got = fsn.load_file(p, tensor_filter=["layer.[13].*"])
    assert sorted(got) == ["layer.1.w", "layer.3.w"]
    assert_same(got, {k: d[k] for k in got})
    assert rec.nbytes == 2 * 256 * 256 * 4


def test_a_file_replaced_after_opening_is_read_as_opened(tmp_path):
    """A new checkpoint renamed over the one opened (as trainers save) is not read with the old
    header's offsets: every read goes to the file whose header was read."""
    old = {"a": sample("float32", (100,), 1), "b": sample("float32", (300,), 2)}
    new = {"b": sample("float32", (10,), 3), "a": sample("float32", (1000,), 4)}
    p = tmp_path / "m.safetensors"
    sn.save_file(old, p)
    with fs.safe_open(p, "numpy") as f:
        sn.save_file(new, tmp_path / "next.safetensors")
        os.replace(tmp_path / "next.safetensors", p)
        np.testing.assert_array_equal(f.get_tensor("a"), old["a"])
        assert_same(f.get_tensors(), old)
        assert_same(dict(f.tensors()), old)
        np.testing.assert_array_equal(f.get_slice("b")[5:7], old["b"][5:7])
    assert_same(fsn.load_file(p), new)


def test_reading_after_close_is_an_error(tmp_path):
    d = {"a": sample("float32", (100,), 1)}
    p = tmp_path / "m.safetensors"
    sn.save_file(d, p)
    with fs.safe_open(p, "numpy") as f:
        a = f.get_tensor("a")
    np.testing.assert_array_equal(a, d["a"])  # what was returned stays valid
    # Closed for everything, as safetensors' file is (the names too).
    with pytest.raises(SafetensorError, match="closed"):
        f.keys()
    with pytest.raises(SafetensorError, match="closed"):
        f.get_tensor("a")
    with pytest.raises(SafetensorError, match="closed"):
        f.get_tensors()


def test_streaming_reads_small_neighbours_together(tmp_path, monkeypatch):
    """tensors() yields in file order, every tensor right, with one read per run of small
    neighbours (up to 4 MiB) and one per large tensor, not one per tensor."""
    d = {f"small.{i:04d}": sample("float32", (256,), i) for i in range(3000)}  # 3 MB
    d["zbig"] = sample("uint8", (5 << 20,), 1)
    d["zsmall"] = sample("float32", (7,), 2)
    p = tmp_path / "m.safetensors"
    sn.save_file(d, p)
    rec = Recorder(monkeypatch)
    with fs.safe_open(p, "numpy") as f:
        order = f.offset_keys()
        streamed = list(f.tensors())
    assert [n for n, _ in streamed] == order
    assert_same(dict(streamed), d)
    assert rec.nbytes == sum(v.nbytes for v in d.values())
    assert len(rec.reads) <= 4, rec.reads


def test_get_slice_reads_only_needed_rows(tmp_path, monkeypatch):
    w = sample("float32", (1000, 64), 4)
    p = tmp_path / "m.safetensors"
    sn.save_file({"w": w}, p)
    rec = Recorder(monkeypatch)
    with fs.safe_open(p, "numpy") as f:
        np.testing.assert_array_equal(f.get_slice("w")[10:20:3], w[10:20:3])
    assert rec.nbytes == (19 - 10 + 1) * 64 * 4


def test_get_slice_integers_of_any_kind_index_as_in_safetensors(tmp_path, monkeypatch):
    """A bool or numpy integer is one index, as safetensors reads it (numpy would take
    `[True]` as a mask, adding a dimension), and reads only its row."""
    w = sample("int16", (6, 5, 4), 5)
    p = tmp_path / "m.safetensors"
    sn.save_file({"w": w}, p)
    keys = [True, False, (1, True), np.int64(-2), (np.int32(3), np.uint8(1), True)]
    with safetensors.safe_open(p, "numpy") as ref:
        want = [ref.get_slice("w")[k] for k in keys]
    rec = Recorder(monkeypatch)
    with fs.safe_open(p, "numpy") as f:
        for k, expected in zip(keys, want, strict=True):
            got = f.get_slice("w")[k]
            assert got.shape == expected.shape, k
            np.testing.assert_array_equal(got, expected)
    assert rec.nbytes == len(keys) * 5 * 4 * 2


def test_loaded_tensors_are_writable_and_aligned(tmp_path):
    d = {"a": sample("uint8", (3,), 1), "b": sample("float64", (5,), 2)}
    p = tmp_path / "m.safetensors"
    write_raw(p, {"a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
                  "b": {"dtype": "F64", "shape": [5], "data_offsets": [3, 43]}},
              0, d["a"].tobytes() + d["b"].tobytes())  # fmt: skip
    got = fsn.load_file(p)
    assert_same(got, d)
    assert got["b"].flags.aligned and got["b"].flags.writeable


def test_a_misaligned_tensor_is_copied_only_after_its_bytes_arrive(tmp_path, monkeypatch):
    """A view of bytes not aligned to the element size is a copy; made before the reads end it
    would copy what the buffer held before (zeros, junk), as load_file once did."""
    big = np.arange(32 << 20, dtype=np.uint8)
    w = np.array([1.5, 2.5, 3.5, 4.5], dtype=np.float32)
    p = tmp_path / "m.safetensors"
    end = 1 + big.size
    write_raw(p, {"flag": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                  "big": {"dtype": "U8", "shape": [big.size], "data_offsets": [1, end]},
                  "w": {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}},
              0, b"\x07" + big.tobytes() + w.tobytes())  # fmt: skip
    started: list[ferrio.IOFuture] = []
    copied_early: list[str] = []
    real_start, real_view = fs._Load.start, fs._Load.view

    def start(self, runs):
        futures = real_start(self, runs)
        started.extend(futures)
        return futures

    def view(self, t):
        # "w" lies at an odd place in the buffer, as in the file: its view is a copy.
        if t.name == "w" and not all(f.done() for f in started):
            copied_early.append(t.name)
        return real_view(self, t)

    monkeypatch.setattr(fs._Load, "start", start)
    monkeypatch.setattr(fs._Load, "view", view)
    for _ in range(3):
        got = fsn.load_file(p)
        np.testing.assert_array_equal(got["w"], w)
        assert got["flag"][0] == 7 and got["big"][-1] == big[-1]
    assert copied_early == []


def test_save_file_refuses_what_cannot_be_a_file_before_writing(tmp_path):
    d = {"a": np.arange(4, dtype=np.float32)}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="regular files only"):
        fsn.save_file(d, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        fsn.save_file(d, tmp_path / "dir")
    with pytest.raises(NotADirectoryError):
        fsn.save_file(d, str(tmp_path / "new.safetensors") + "/")
    with pytest.raises(FileNotFoundError):
        fsn.save_file(d, "")
    with pytest.raises(FileNotFoundError, match="nodir"):
        fsn.save_file(d, tmp_path / "nodir" / "m.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["dir", "fifo"]
    assert os.listdir(tmp_path / "dir") == []


def test_save_file_takes_the_longest_name_a_directory_holds(tmp_path):
    p = tmp_path / ("m" * 240 + ".safetensors")  # 252 bytes: the temporary name is cut
    d = {"a": np.arange(4, dtype=np.float32)}
    fsn.save_file(d, p)
    assert_same(sn.load_file(p), d)
    assert os.listdir(tmp_path) == [p.name]


def test_save_refuses_a_header_no_loader_reads():
    with pytest.raises(SafetensorError, match="header too large"):
        fsn.save({"a": np.zeros(1)}, metadata={"k": "x" * 100_000_001})


@pytest.mark.parametrize(
    "value",
    [
        np.array([1 + 2j]),
        np.array(["x"]),
        np.array([1, "x"], dtype=object),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
    ],
    ids=["complex128", "str", "object", "datetime64"],
)
def test_a_dtype_the_format_lacks_is_a_safetensor_error_as_in_safetensors(tmp_path, value):
    # `except SafetensorError` catches it in safetensors; a drop-in must raise the same class.
    with pytest.raises(safetensors.SafetensorError):
        sn.save({"a": value})
    with pytest.raises(SafetensorError, match="tensor 'a': safetensors has no dtype for"):
        fsn.save_file({"a": value}, tmp_path / "m.safetensors")
    assert os.listdir(tmp_path) == []


def test_numpy_views_and_fortran_arrays_save_their_values_in_c_order(tmp_path):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = {
        "strided": base[:, ::2],
        "fortran": np.asfortranarray(base),
        "reversed": base[::-1],
        "big_endian": base.astype(">f4"),
    }
    p = tmp_path / "m.safetensors"
    fsn.save_file(d, p)
    got = sn.load_file(p)
    for name, want in d.items():
        assert got[name].shape == want.shape, name
        assert np.array_equal(got[name], want), name
    # Identical to safetensors' bytes once each is contiguous (given as is, safetensors 0.8
    # writes a strided or Fortran array's underlying buffer in place of its values).
    packed = {k: np.ascontiguousarray(v).astype("<f4") for k, v in d.items()}
    assert p.read_bytes() == sn.save(packed) == fsn.save(d)


def test_a_tensor_named_like_the_metadata_is_a_safetensor_error():
    # safetensors 0.8 saves it, and then cannot load the file it wrote.
    data = sn.save({"__metadata__": np.zeros(2)})
    with pytest.raises(safetensors.SafetensorError):
        sn.load(data)
    with pytest.raises(SafetensorError, match=r'tensor "__metadata__": the name is reserved'):
        fsn.save({"__metadata__": np.zeros(2)})


def test_a_bytes_path_loads_and_bad_metadata_is_named(tmp_path):
    p = tmp_path / "m.safetensors"
    d = {"a": np.arange(3, dtype=np.int32)}
    fsn.save_file(d, p)
    assert_same(fsn.load_file(os.fsencode(p)), d)
    with pytest.raises(TypeError, match=r"metadata must be a dict of str to str: 'k'"):
        fsn.save(d, metadata={"k": 1})  # type: ignore[dict-item]


def test_tensor_filter_may_be_any_iterable_of_patterns(tmp_path):
    p = tmp_path / "m.safetensors"
    d = {n: np.arange(3, dtype=np.int32) for n in ("a", "b", "c")}
    fsn.save_file(d, p)
    got = fsn.load_file(p, tensor_filter=(pat for pat in ["c", "b*", "a"]))
    assert sorted(got) == ["a", "b", "c"]


def test_save_file_is_atomic(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"old")
    with pytest.raises(ValueError, match="complex128"):
        fsn.save_file({"a": np.zeros(2), "z": np.zeros(2, dtype=np.complex128)}, p)
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["m.safetensors"]
    fs.save_file({"a": np.zeros(2)}, p, fsync=True)
    assert_same(sn.load_file(p), {"a": np.zeros(2)})
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_save_file_replaces_a_symlink_as_safetensors_does(tmp_path):
    """A save to a symlink (a Hugging Face cache's snapshot entry, say) replaces the link with
    the new file and leaves the file it named alone, as safetensors 0.8 does, checked here
    against safetensors itself: ferrio wrote through the link, into the (shared) blob."""
    d = {"a": sample("float32", (10,), 1)}
    for who, save in (("safetensors", sn.save_file), ("ferrio", fsn.save_file)):
        root = tmp_path / who
        (root / "blobs").mkdir(parents=True)
        blob = root / "blobs" / "abc123"
        blob.write_bytes(b"old")
        link = root / "model.safetensors"
        link.symlink_to(blob)
        dangling = root / "new.safetensors"
        dangling.symlink_to(root / "blobs" / "def456")
        save(d, str(link))
        save(d, str(dangling))
        seen = (
            link.is_symlink(),
            blob.read_bytes(),
            dangling.is_symlink(),
            sorted(os.listdir(root / "blobs")),
        )
        assert seen == (False, b"old", False, ["abc123"]), (who, seen)
        assert_same(sn.load_file(link), d)
        assert_same(sn.load_file(dangling), d)
    # A regular file replaced keeps its permission bits (safetensors makes it 0600).
    kept = tmp_path / "kept.safetensors"
    kept.write_bytes(b"old")
    kept.chmod(0o640)
    fsn.save_file(d, kept)
    assert kept.stat().st_mode & 0o777 == 0o640
    assert_same(sn.load_file(kept), d)


def test_threads_saving_one_name_at_once_each_write_their_own(tmp_path):
    """Concurrent saves to one name never share a temporary file: the result is one whole
    checkpoint of one of them, and nothing is left beside it."""
    import threading

    p = tmp_path / "m.safetensors"
    dicts = [{"w": sample("float32", (64, 1024), i)} for i in range(6)]
    errors: list[BaseException] = []

    def save(d: dict) -> None:
        try:
            fsn.save_file(d, p)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=save, args=(d,)) for d in dicts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = sn.load_file(p)
    assert any(got["w"].tobytes() == d["w"].tobytes() for d in dicts)
    assert os.listdir(tmp_path) == ["m.safetensors"]


# --- validation: one test per rule ---


def write_raw(
    path, header: dict, data_len: int, data: bytes | None = None, pad: bool = True
) -> None:
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    body = data if data is not None else bytes(data_len)
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)


def f32(b: int, e: int, shape: list[int]) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [b, e]}


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        (b"\x01\x02", "shorter than the 8-byte"),
        (struct.pack("<Q", 100_000_001) + b"{}", "exceeds the limit of 100000000"),
        (struct.pack("<Q", 64) + b"{}", "runs past the end"),
        (struct.pack("<Q", 5) + b"[1,2]", "not a JSON object"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not a JSON object"),
    ],
)
def test_header_rules(tmp_path, raw, pattern):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(raw)
    with pytest.raises(SafetensorError, match=pattern):
        fsn.load_file(p)
    with pytest.raises(ValueError, match=pattern):
        fsn.load(raw)


@pytest.mark.parametrize(
    ("header", "data_len", "tensor", "pattern"),
    [
        ({"a": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}}, 4, "a", "unknown dtype"),
        ({"a": f32(0, 8, [1])}, 8, "a", "size: shape"),
        ({"a": f32(0, 4, [1]), "b": f32(8, 12, [1])}, 12, "b", "hole"),
        ({"a": f32(0, 8, [2]), "b": f32(4, 12, [2])}, 12, "b", "overlap"),
        ({"a": f32(0, 4, [1])}, 9, "a", "holds 9 bytes after the header"),
        ({"a": f32(4, 0, [1])}, 4, "a", "end before they begin"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, 4, "a", "non-negative"),
        ({"__metadata__": {"k": 3}}, 0, "__metadata__", "not a string"),
    ],
)
def test_tensor_rules(tmp_path, header, data_len, tensor, pattern):
    p = tmp_path / "bad.safetensors"
    write_raw(p, header, data_len)
    with pytest.raises(SafetensorError, match=pattern) as e:
        fsn.load_file(p)
    assert f'tensor "{tensor}"' in str(e.value)
    assert str(p) in str(e.value)


def test_duplicate_names_are_refused(tmp_path):
    p = tmp_path / "dup.safetensors"
    entry = '{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}}'
    h = ('{"a":' + entry.format(0, 1) + ',"a":' + entry.format(1, 2) + "}").encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0\0")
    with pytest.raises(SafetensorError, match="appears twice"):
        fs.safe_open(p, "numpy")


def test_null_metadata_is_no_metadata_as_in_safetensors(tmp_path):
    p = tmp_path / "m.safetensors"
    write_raw(p, {"__metadata__": None, "a": f32(0, 4, [1])}, 4)
    for module in (fs, safetensors):
        with module.safe_open(p, "numpy") as f:
            assert f.metadata() is None
            assert f.keys() == ["a"]
    assert_same(fsn.load(p.read_bytes()), sn.load(p.read_bytes()))


def test_truncated_files_never_crash(tmp_path):
    data = sn.save(all_numpy())
    p = tmp_path / "t.safetensors"
    for n in range(0, len(data), 37):
        p.write_bytes(data[:n])
        with pytest.raises(SafetensorError):
            fsn.load_file(p)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=6),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids, max_size=4)
    ),
    max_leaves=12,
)
_entries = st.dictionaries(
    st.sampled_from(["a", "b", "__metadata__"]) | st.text(max_size=3),
    st.fixed_dictionaries(
        {},
        optional={
            "dtype": st.sampled_from(["F32", "U8", "BF16", "F4", "F6_E2M3", "X"]) | _json_values,
            "shape": st.lists(st.integers(-1, 2**40), max_size=3) | _json_values,
            "data_offsets": st.lists(st.integers(-1, 64), min_size=0, max_size=3) | _json_values,
        },
    )
    | _json_values,
    max_size=4,
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    header=_entries, data_len=st.integers(0, 80), pad=st.booleans(),
    garbage=st.binary(max_size=64), length=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)  # fmt: skip
def test_fuzzed_headers_never_crash(tmp_path_factory, header, data_len, pad, garbage, length):
    p = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    write_raw(p, header, data_len, pad=pad)
    raw = p.read_bytes()
    if length is not None:
        raw = struct.pack("<Q", length) + raw[8:]
    for blob in (raw, raw + garbage, garbage):
        p.write_bytes(blob)
        started = time.monotonic()
        with contextlib.suppress(SafetensorError, ValueError, TypeError, OSError):
            fsn.load_file(p)
        assert time.monotonic() - started < 5


# --- torch (the GPU machine has it) ---


def torch_samples(torch):
    names = ["bool", "uint8", "int8", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu",
             "float8_e4m3fnuz", "float8_e5m2fnuz", "int16", "uint16", "float16", "bfloat16",
             "int32", "uint32", "float32", "complex64", "float64", "int64", "uint64"]  # fmt: skip
    out = {}
    for i, n in enumerate(names):
        dt = getattr(torch, n, None)
        if dt is None:
            continue
        raw = torch.randint(
            0,
            256,
            (6 * 4 * dt.itemsize,),
            dtype=torch.uint8,
            generator=torch.Generator().manual_seed(i),
        )
        if dt == torch.bool:
            raw = raw % 2
        out[f"t.{n}"] = raw.view(dt).reshape(6, 4)
    return out


def torch_same(torch, a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].cpu().view(torch.uint8), b[k].cpu().view(torch.uint8)), k


def test_torch_every_dtype_bit_identical(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    import ferrio.safetensors.torch as fst

    d = torch_samples(torch)
    p = tmp_path / "t.safetensors"
    # safetensors' writer may not know every dtype this torch has: keep those it saves.
    d = {k: v for k, v in d.items() if _saves(st_torch, k, v)}
    st_torch.save_file(d, p)
    torch_same(torch, fst.load_file(p), st_torch.load_file(p))
    ours = tmp_path / "ours.safetensors"
    fst.save_file(d, ours)
    assert ours.read_bytes() == p.read_bytes()
    torch_same(torch, st_torch.load_file(ours), d)
    torch_same(torch, fst.load(p.read_bytes()), d)


def _saves(st_torch, k, v) -> bool:
    try:
        st_torch.save({k: v})
    except Exception:
        return False
    return True


def _takes_the_same_arguments(ours, theirs) -> None:
    """Every parameter of `theirs` is one of `ours`, of the same kind, at the same position
    when it can be passed by position (so any call that works on theirs works on ours)."""
    import inspect

    mine = inspect.signature(ours).parameters
    for i, (name, p) in enumerate(inspect.signature(theirs).parameters.items()):
        assert name in mine, (ours.__qualname__, name)
        assert mine[name].kind == p.kind, (ours.__qualname__, name)
        if p.kind == p.POSITIONAL_OR_KEYWORD:
            assert list(mine).index(name) == i, (ours.__qualname__, name)
        if name != "backend":  # ours takes it and ignores it
            assert mine[name].default == p.default, (ours.__qualname__, name)


@pytest.mark.parametrize("module", ["numpy", "torch"])
def test_the_functions_take_safetensors_arguments(module):
    import importlib

    theirs = pytest.importorskip(f"safetensors.{module}")
    ours = importlib.import_module(f"ferrio.safetensors.{module}")
    names = ["save_file", "load_file", "save", "load", "save_model", "load_model"]
    for name in [n for n in names if hasattr(theirs, n)]:
        _takes_the_same_arguments(getattr(ours, name), getattr(theirs, name))


def test_torch_goes_by_each_of_its_names_and_a_wrong_name_is_an_error(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "t.safetensors"
    sn.save_file({"a": np.arange(6, dtype=np.int32).reshape(2, 3)}, p)
    for name in ("pt", "torch", "pytorch"):
        with fs.safe_open(p, name) as f:
            t = f.get_tensor("a")
            assert isinstance(t, torch.Tensor) and t.tolist() == [[0, 1, 2], [3, 4, 5]], name
    # safetensors raises its SafetensorError here; ferrio's is also a ValueError.
    with pytest.raises(fs.SafetensorError, match="framework must be one of pt, torch, pytorch"):
        fs.safe_open(p, "tensorflow")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu0", -1, True])
def test_a_wrong_device_is_a_safetensor_error(tmp_path, device):
    p = tmp_path / "t.safetensors"
    sn.save_file({"a": np.arange(6, dtype=np.int32)}, p)
    with pytest.raises(fs.SafetensorError, match="device"):
        fs.safe_open(p, "numpy", device=device)
    with pytest.raises(fs.SafetensorError, match="device"):
        fs.load_file(p, device=device)


def test_torch_refuses_noncontiguous_and_shared(tmp_path):
    torch = pytest.importorskip("torch")
    import ferrio.safetensors.torch as fst

    a = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="non contiguous"):
        fst.save_file({"a": a.t()}, tmp_path / "x")
    with pytest.raises(RuntimeError, match="share memory"):
        fst.save_file({"a": a, "b": a[1:]}, tmp_path / "x")
    fst.save_file({"a": a[:2], "b": a[2:]}, tmp_path / "x")  # disjoint views are fine
    assert (tmp_path / "x").read_bytes() != b""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_saves_tensors_that_require_grad(tmp_path, device):
    """`dict(model.named_parameters())` holds tensors that require grad: safetensors saves
    them, and so must we (numpy() and __cuda_array_interface__ refuse them undetached)."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    st_torch = pytest.importorskip("safetensors.torch")
    import ferrio.safetensors.torch as fst

    layer = torch.nn.Linear(4, 3).to(device)
    d = dict(layer.named_parameters())
    assert all(t.requires_grad for t in d.values())
    fst.save_file(d, tmp_path / "ours.safetensors")
    st_torch.save_file(d, tmp_path / "theirs.safetensors")
    ours = (tmp_path / "ours.safetensors").read_bytes()
    assert ours == (tmp_path / "theirs.safetensors").read_bytes()
    assert fst.save(d) == ours


@pytest.mark.parametrize("device", ["cuda", "cuda:0", 0])
def test_torch_cuda_loads_and_saves(tmp_path, device):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    st_torch = pytest.importorskip("safetensors.torch")
    import ferrio.safetensors.torch as fst

    d = {k: v for k, v in torch_samples(torch).items() if _saves(st_torch, k, v)}
    p = tmp_path / "t.safetensors"
    st_torch.save_file(d, p)
    got = fst.load_file(p, device=device)
    assert all(t.is_cuda for t in got.values())
    torch_same(torch, got, st_torch.load_file(p))
    with fst.safe_open(p, "pt", device=device) as f:
        streamed = dict(f.tensors())
        torch_same(torch, streamed, d)
        assert f.get_slice("t.float32")[2:4].is_cuda
    ours = tmp_path / "gpu.safetensors"
    fst.save_file(got, ours)  # written straight from GPU memory
    assert ours.read_bytes() == p.read_bytes()


def test_cupy_loads(tmp_path):
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("no CUDA device")
    d = all_numpy()
    p = tmp_path / "c.safetensors"
    sn.save_file(d, p)
    got = fs.load_file(p, device="cuda:0", framework="cupy")
    assert_same({k: cupy.asnumpy(v) for k, v in got.items()}, d)
    ours = tmp_path / "ours.safetensors"
    fs.save_file(got, ours)
    assert ours.read_bytes() == p.read_bytes()


def test_a_safetensors_file_named_json_is_not_read_as_an_index(tmp_path: Path) -> None:
    # Any path ending in .json was taken for a shard index: "not valid JSON".
    tensors = {"w": np.arange(6, dtype=np.int32)}
    path = tmp_path / "weights.json"
    fsn.save_file(tensors, path)
    np.testing.assert_array_equal(fsn.load_file(path)["w"], tensors["w"])
    sn.save_file(tensors, str(path))  # and safetensors' own file
    np.testing.assert_array_equal(fsn.load_file(path)["w"], tensors["w"])


def test_a_slice_outlives_its_safe_open_block(tmp_path: Path) -> None:
    # As safetensors' slices (which keep the file mapped); ferrio's raised "File is closed".
    p = tmp_path / "m.safetensors"
    sn.save_file({"w": np.arange(12, dtype=np.float32).reshape(4, 3)}, str(p))
    for mod in (safetensors, fs):
        with mod.safe_open(str(p), framework="numpy") as f:
            sl = f.get_slice("w")
        np.testing.assert_array_equal(sl[1:3], np.arange(3, 9, dtype=np.float32).reshape(2, 3))
        # The file itself is closed, as in safetensors.
        for call in (f.keys, f.metadata, lambda f=f: f.get_tensor("w")):
            with pytest.raises(Exception, match="closed"):
                call()


def test_slices_index_as_safetensors_does(tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    tensors = {
        "v": np.arange(5, dtype=np.int64),
        "s": np.array(2.5),
        "m": np.arange(12, dtype=np.float32).reshape(4, 3),
    }
    sn.save_file(tensors, str(p))
    with (
        safetensors.safe_open(str(p), framework="numpy") as theirs,
        fs.safe_open(str(p), framework="numpy") as ours,
    ):
        # Every axis picked by an integer: a 0-d array (numpy indexing gives a scalar).
        for name, key in [("v", 3), ("m", (0, 1)), ("s", ()), ("v", np.int64(-1))]:
            want, got = theirs.get_slice(name)[key], ours.get_slice(name)[key]
            assert type(got) is type(want) is np.ndarray, (name, key, type(got))
            np.testing.assert_array_equal(got, want)
        # numpy's bool picks an index as Python's does, not a mask.
        np.testing.assert_array_equal(ours.get_slice("m")[np.True_], tensors["m"][1])
        # Bad indices are SafetensorErrors, as in safetensors (and out of bounds IndexErrors).
        for key in [4, -5, (0, 3), (0, 0, 0), slice(None, None, 0)]:
            with pytest.raises(safetensors.SafetensorError):
                theirs.get_slice("m")[key]
            with pytest.raises(SafetensorError):
                ours.get_slice("m")[key]
        with pytest.raises(IndexError):
            ours.get_slice("m")[4]


def test_a_numpy_subclass_saves_as_numpy(tmp_path: Path) -> None:
    class Param(np.ndarray):
        pass

    t = {"w": np.arange(4, dtype=np.float32).view(Param)}
    assert fsn.save(t) == sn.save(t)
