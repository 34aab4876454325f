"""ferrio.safetensors on URLs: checkpoints served by servers on 127.0.0.1 that the tests start.

A small HTTP server with Range and ETag (threads, our own), moto's S3 server (skipped without
moto) and an Azure Blob service (conftest's: Azurite or the emulator of azure_blob_server.py)
serve the same files written by the `safetensors` package; every load from a URL must be
bit-identical to ferrio loading the local file, and every error must name the URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import AZURE_CONTAINER, AzureService, use_azure

import ferrio.safetensors
import ferrio.safetensors.numpy as fst

st_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((257, 33)).astype(np.float32),
        "layers.0.w": rng.integers(-100, 100, size=(64, 129), dtype=np.int16),
        "layers.0.b": rng.standard_normal(129).astype(np.float64),
        "layers.1.w": rng.integers(0, 255, size=(3, 5, 7), dtype=np.uint8),
        "scalar": np.array(3.5, dtype=np.float16),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes(), k


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """One file (with metadata) and a checkpoint of two shards with its index."""
    st_numpy.save_file(_tensors(1), str(tmp_path / "model.safetensors"), metadata={"k": "v"})
    shards = _tensors(2)
    names = sorted(shards)
    st_numpy.save_file({n: shards[n] for n in names[:3]}, str(tmp_path / "s-1.safetensors"))
    st_numpy.save_file({n: shards[n] for n in names[3:]}, str(tmp_path / "s-2.safetensors"))
    weight_map = {n: "s-1.safetensors" if n in names[:3] else "s-2.safetensors" for n in names}
    (tmp_path / "m.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves the files of `root` with Range, ETag (of the content) and If-Match, as object
    stores do."""

    protocol_version = "HTTP/1.1"
    root: Path

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _file(self) -> bytes | None:
        p = self.root / urllib.parse.unquote(self.path.lstrip("/"))
        return p.read_bytes() if p.is_file() else None

    def _head(
        self, status: int, length: int, extra: dict[str, str], body: bytes | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", _etag(body or b""))
        self.send_header("Last-Modified", "Mon, 23 Nov 2026 10:00:00 GMT")
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()

    def do_HEAD(self) -> None:
        body = self._file()
        self._head(404 if body is None else 200, 0 if body is None else len(body), {}, body)

    def do_GET(self) -> None:
        body = self._file()
        if body is None:
            self._head(404, 0, {})
            return
        want = self.headers.get("If-Match")
        if want is not None and want != _etag(body):
            self._head(412, 0, {}, body)
            return
        rng = self.headers.get("Range", "")
        if not rng.startswith("bytes="):
            self._head(200, len(body), {}, body)
            self.wfile.write(body)
            return
        a, _, b = rng[len("bytes=") :].partition("-")
        start, end = int(a), min(int(b) + 1 if b else len(body), len(body))
        part = body[start:end]
        self._head(206, len(part), {"Content-Range": f"bytes {start}-{end - 1}/{len(body)}"}, body)
        self.wfile.write(part)


def _etag(body: bytes) -> str:
    return '"' + hashlib.md5(body).hexdigest() + '"'


@pytest.fixture
def http_base(checkpoint_dir: Path) -> Iterator[str]:
    handler = type("H", (_Files,), {"root": checkpoint_dir})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_http_file_is_bit_identical_to_the_local_file(http_base: str, checkpoint_dir: Path) -> None:
    local = checkpoint_dir / "model.safetensors"
    url = f"{http_base}/model.safetensors"
    _same(fst.load_file(url), fst.load_file(str(local)))
    _same(fst.load_file(url), st_numpy.load_file(str(local)))
    with fst.safe_open(url, framework="numpy") as f:
        assert f.metadata() == {"k": "v"}
        assert f.keys() == sorted(_tensors(1))
        want = _tensors(1)["embed.weight"]
        assert f.get_tensor("embed.weight").tobytes() == want.tobytes()
        assert f.get_slice("embed.weight")[5:9].tobytes() == want[5:9].tobytes()
        streamed = dict(f.tensors())
    _same(streamed, _tensors(1))
    only = fst.load_file(url, tensor_filter=["layers.*"])
    assert sorted(only) == ["layers.0.b", "layers.0.w", "layers.1.w"]


def test_an_object_replaced_after_opening_is_an_error(http_base: str, checkpoint_dir: Path) -> None:
    """Reads stay pinned to the version whose header was read: a checkpoint replaced after
    opening (same size, other bytes) is an error naming the URL, never its bytes under the old
    header."""
    url = f"{http_base}/model.safetensors"
    with fst.safe_open(url, framework="numpy") as f:
        local = checkpoint_dir / "model.safetensors"
        st_numpy.save_file(_tensors(7), str(local), metadata={"k": "v"})
        with pytest.raises(OSError, match=r"model\.safetensors") as e:
            f.get_tensor("embed.weight")
        assert "changed" in str(e.value)
    _same(fst.load_file(url), _tensors(7))


def test_http_sharded_index_loads_every_shard(http_base: str, checkpoint_dir: Path) -> None:
    index = "m.safetensors.index.json"
    _same(fst.load_file(f"{http_base}/{index}"), fst.load_file(str(checkpoint_dir / index)))
    shard_urls = [f"{http_base}/s-1.safetensors", f"{http_base}/s-2.safetensors"]
    _same(fst.load_file(shard_urls), _tensors(2))


def test_shards_named_with_url_characters_load_through_a_remote_index(
    http_base: str, checkpoint_dir: Path
) -> None:
    """An index names its shards as files; the loader percent-encodes them into the URL."""
    shards = _tensors(2)
    names = sorted(shards)
    files = ["s#1 ü.safetensors", "s%41.safetensors"]
    for file, part in zip(files, (names[:3], names[3:]), strict=True):
        st_numpy.save_file({n: shards[n] for n in part}, str(checkpoint_dir / file))
    weight_map = {n: files[0] if n in names[:3] else files[1] for n in names}
    index = checkpoint_dir / "odd.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    _same(fst.load_file(f"{http_base}/odd.safetensors.index.json"), _tensors(2))


def test_an_index_may_name_its_shards_with_dot_segments(
    http_base: str, checkpoint_dir: Path
) -> None:
    """`./d-1.safetensors` is the shard beside the index, remote as local (a remote index with
    it was refused: '.' is no part of an object's key)."""
    shards = _tensors(2)
    names = sorted(shards)
    weight_map = {n: "./d-1.safetensors" if n in names[:3] else "d-2.safetensors" for n in names}
    st_numpy.save_file({n: shards[n] for n in names[:3]}, str(checkpoint_dir / "d-1.safetensors"))
    st_numpy.save_file({n: shards[n] for n in names[3:]}, str(checkpoint_dir / "d-2.safetensors"))
    (checkpoint_dir / "dots.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    _same(fst.load_file(f"{http_base}/dots.safetensors.index.json"), shards)
    _same(fst.load_file(str(checkpoint_dir / "dots.safetensors.index.json")), shards)


def test_save_file_to_a_url_is_a_value_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL is not a local path to write: refused, and no `s3:` directory is written into."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "bucket").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"ferrio\.copy"):
        fst.save_file(_tensors(1), "s3://bucket/model.safetensors")
    assert list((tmp_path / "s3:" / "bucket").iterdir()) == []


def test_url_errors_name_the_url(http_base: str, checkpoint_dir: Path) -> None:
    missing = f"{http_base}/nope.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(missing)
    assert e.value.filename == missing
    with pytest.raises(ferrio.safetensors.SafetensorError, match="cannot be listed"):
        fst.load_file(f"{http_base}/")
    # A file that is not a safetensors file: the format error names the URL.
    (checkpoint_dir / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ferrio.safetensors.SafetensorError, match=r"junk\.safetensors"):
        fst.load_file(f"{http_base}/junk.safetensors")
    (checkpoint_dir / "bad.safetensors.index.json").write_text("{not json")
    with pytest.raises(ferrio.safetensors.SafetensorError, match="not valid JSON"):
        fst.load_file(f"{http_base}/bad.safetensors.index.json")


def test_a_header_longer_than_the_first_get(http_base: str, checkpoint_dir: Path) -> None:
    # 3000 tensors: a header of ~200 KiB+ of JSON, more than the first ranged GET holds.
    name = "t.{:05d}.with.a.rather.long.name.for.padding"
    many = {name.format(i): np.full(3, i, np.int32) for i in range(3000)}
    st_numpy.save_file(many, str(checkpoint_dir / "many.safetensors"))
    with open(checkpoint_dir / "many.safetensors", "rb") as f:
        assert int.from_bytes(f.read(8), "little") > 256 << 10
    _same(fst.load_file(f"{http_base}/many.safetensors"), many)


# ---------------------------------------------------------------------------------------------
# S3 through moto's server
# ---------------------------------------------------------------------------------------------


def test_s3_checkpoint_and_index_are_bit_identical(
    moto_endpoint: str, checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3 = pytest.importorskip("boto3")
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    for k, v in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    bucket = f"ferrio-st-{os.getpid()}"
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for p in checkpoint_dir.iterdir():
        client.put_object(Bucket=bucket, Key=f"ckpt/{p.name}", Body=p.read_bytes())
    base = f"s3://{bucket}/ckpt"
    _same(
        fst.load_file(f"{base}/model.safetensors"),
        fst.load_file(str(checkpoint_dir / "model.safetensors")),
    )
    _same(fst.load_file(f"{base}/m.safetensors.index.json"), _tensors(2))
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(f"{base}/missing.safetensors")
    assert e.value.filename == f"{base}/missing.safetensors"


# ---------------------------------------------------------------------------------------------
# Azure Blob through conftest's service
# ---------------------------------------------------------------------------------------------


def test_az_checkpoint_and_index_are_bit_identical(
    azure_service: AzureService, checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_azure(monkeypatch, azure_service)
    for p in checkpoint_dir.iterdir():
        azure_service.put(f"ckpt/{p.name}", p.read_bytes())
    base = f"az://{AZURE_CONTAINER}/ckpt"
    _same(
        fst.load_file(f"{base}/model.safetensors"),
        fst.load_file(str(checkpoint_dir / "model.safetensors")),
    )
    _same(fst.load_file(f"{base}/m.safetensors.index.json"), _tensors(2))
    with pytest.raises(FileNotFoundError) as e:
        fst.load_file(f"{base}/missing.safetensors")
    assert e.value.filename == f"{base}/missing.safetensors"


# ---------------------------------------------------------------------------------------------
# GPU memory (runs on the GPU machine only)
# ---------------------------------------------------------------------------------------------


def test_http_into_cupy_is_bit_identical(http_base: str, checkpoint_dir: Path) -> None:
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception as e:
        pytest.skip(f"no usable GPU: {e}")
    got = ferrio.safetensors.load_file(f"{http_base}/model.safetensors", "cuda:0", framework="cupy")
    want = _tensors(1)
    for k, v in want.items():
        assert cp.asnumpy(got[k]).tobytes() == v.tobytes(), k
