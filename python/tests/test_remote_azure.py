"""az:// objects read through Azurite (the Azure Blob emulator) on 127.0.0.1.

Azurite comes from npm into ``.tools/`` (``make deps-node``); it runs in a child process on a
free port with a temporary location and is stopped by the fixture. ferrio's Azure store is
pointed at it the way object_store documents: ``AZURE_STORAGE_USE_EMULATOR=true`` and
``AZURITE_BLOB_STORAGE_URL``. Blobs are uploaded with Shared Key requests signed with the
emulator's published development key. Sizes 0, 1 and a ragged multi-range blob; a missing blob.
Without Azurite (npm's registry unreachable) every test here skips and says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

import ferrio

ACCOUNT = "devstoreaccount1"
# Azurite's published development key (not a secret: it is in Azure's and Azurite's docs).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "ferrio-test"
ROOT = Path(__file__).resolve().parents[2]


def _azurite() -> str | None:
    local = ROOT / ".tools" / "node_modules" / ".bin" / "azurite-blob"
    return str(local) if local.exists() else shutil.which("azurite-blob")


def _signed(method: str, url: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
    """A Shared Key request (the Blob service's signing, version 2021-08-06)."""
    h = {
        "x-ms-date": formatdate(usegmt=True),
        "x-ms-version": "2021-08-06",
        **headers,
    }
    length = str(len(body)) if body else ""
    canon_headers = "".join(f"{k}:{v}\n" for k, v in sorted(h.items()) if k.startswith("x-ms-"))
    resource, _, query = path.partition("?")
    canon_resource = f"/{ACCOUNT}/{ACCOUNT}{resource}"
    for part in sorted(query.split("&")) if query else []:
        k, _, v = part.partition("=")
        canon_resource += f"\n{k}:{v}"
    content_type = h.get("Content-Type", "")
    to_sign = (
        f"{method}\n\n\n{length}\n\n{content_type}\n\n\n\n\n\n\n{canon_headers}{canon_resource}"
    )
    sig = hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
    h["Authorization"] = f"SharedKey {ACCOUNT}:{base64.b64encode(sig).decode()}"
    req = urllib.request.Request(url + path, data=body or None, method=method, headers=h)
    return urllib.request.urlopen(req, timeout=30)


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = _azurite()
    if exe is None:
        pytest.skip(
            "Azurite is not installed: it comes from npm (make deps-node puts it in .tools/), "
            "and npm's registry was not reachable when the tools were installed"
        )
    port = free_port()
    where = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(where),
         "--silent", "--skipApiVersionCheck", "--loose"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/{ACCOUNT}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), 1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("Azurite did not start listening within 30 s")
                time.sleep(0.1)
        with _signed("PUT", base, f"/{CONTAINER}?restype=container", b"", {}) as r:
            assert r.status == 201
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def az(azurite: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k in list(os.environ):
        if k.startswith("AZURE_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azurite.rsplit("/", 1)[0])

    def put(name: str, body: bytes) -> None:
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
        with _signed("PUT", azurite, f"/{CONTAINER}/{name}", body, headers) as r:
            assert r.status == 201

    return put


def _data(n: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 4097])
def test_azure_sizes_are_byte_identical(az: Any, size: int) -> None:
    data = _data(size)
    az(f"d/obj-{size}.bin", data)
    with ferrio.open_url(f"az://{CONTAINER}/d/obj-{size}.bin", range_size="128KiB") as f:
        assert f.size == size
        buf = bytearray(size)
        assert f.read(buf) == size
        assert bytes(buf) == data


def test_azure_missing_blob_names_the_url(az: Any) -> None:
    url = f"az://{CONTAINER}/no/such/blob"
    with pytest.raises(FileNotFoundError) as e:
        ferrio.open(url)
    assert e.value.filename == url
