"""az:// blobs read and written through an Azure Blob service on 127.0.0.1 (conftest's
`azure_service`): Azurite where it is installed (from npm, ``make deps-node``), else the emulator
of azure_blob_server.py, in a child process on a free port, stopped at the end.

ferrio's Azure store is pointed at it as object_store documents for emulators
(``AZURE_STORAGE_USE_EMULATOR``, ``AZURITE_BLOB_STORAGE_URL``): every request is signed with
Shared Key and the emulator account's key, and the service checks each signature (one made with
another key is refused, and ferrio says PermissionError). What was stored is seen through the
service's own REST API (`AzureService`) as well as through ferrio.

Reads: sizes 0, 1 and a ragged multi-range blob; many small ranges into numpy arrays; a missing
blob or container; a blob replaced between two GETs of one read. Writes: sizes 0, 1, one block
and several with a ragged tail, invisible until closed; a rewrite; an exception inside ``with``,
``abort()`` and a failing block leave no blob, and the blocks they left uncommitted (Azure has no
abort) stay out of the next write of that name; a missing container. Copies: `ferrio.copy` up,
down and within the container, and of a tree both ways (over several listing pages on the
emulator), and one that the service finishes later or fails later (Azure's Copy Blob may
answer `pending`); ``ferrio cp`` of a file (one Put Blob, or blocks) and of a tree both ways,
and a tree upload whose blocks fail. The emulator's own answers (ranges, conditions, signatures,
blocks) are checked against Azure's documented ones. Tests that need a service failing on
purpose use the emulator's hooks and skip under Azurite.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote
from xml.etree import ElementTree

import numpy as np
import pytest
from conftest import (
    AZURE_CONTAINER,
    AZURE_FAILED_COPY_CONTAINER,
    AZURE_FAILING_CONTAINER,
    AZURE_PENDING_COPY_CONTAINER,
    BOUND_S,
    PART,
    AzureService,
    assert_downloads,
    azure_service_at,
    cli,
    files_under,
    in_thread,
    make_tree,
    read_all,
    remote_data,
    use_azure,
    write_all,
    write_in_steps,
)

import ferrio

CONTAINER = AZURE_CONTAINER
OTHER_KEY = base64.b64encode(b"not the emulator account's key!!").decode()


@pytest.fixture
def az(azure_service: AzureService, monkeypatch: pytest.MonkeyPatch) -> AzureService:
    """The service, with ferrio's az:// store pointed at it."""
    use_azure(monkeypatch, azure_service)
    return azure_service


def _needs_emulator(az: AzureService) -> None:
    if not az.emulated:
        pytest.skip("needs the emulator's failing container (Azurite has no such hook)")


def _eventually(what: str, check: Callable[[], bool]) -> None:
    """Waits (within BOUND_S) until `check()` holds: blocks sent in parallel land in any order."""
    deadline = time.monotonic() + BOUND_S
    while not check():
        assert time.monotonic() < deadline, f"not within {BOUND_S} s: {what}"
        time.sleep(0.02)


def _is_whole(az: AzureService, name: str, data: bytes) -> None:
    """`name` is committed with exactly `data` (through the service and through ferrio), and
    has no uncommitted blocks left."""
    assert az.get(name) == data, f"{name} is not whole"
    assert az.uncommitted(name) == 0
    url = f"az://{CONTAINER}/{quote(name)}"  # a URL's `#` and `?` are percent-encoded
    with ferrio.open_url(url, range_size="1MiB", concurrency=4) as f:
        assert f.size == len(data)
        assert in_thread(lambda: read_all(f)) == data


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`ferrio ARGS` in a child process, with `env` added to this one's environment."""
    return subprocess.run(
        cli(*args),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
        env=dict(os.environ, **env),
    )


# ---------------------------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, (2 << 20) + 4097])
def test_azure_sizes_are_byte_identical(az: AzureService, size: int) -> None:
    data = remote_data(size, seed=size)
    name = f"d/obj-{size}.bin"
    az.put(name, data)
    _, headers, _ = az.request("HEAD", f"/{CONTAINER}/{name}")
    with ferrio.open_url(f"az://{CONTAINER}/{name}", range_size="256KiB", concurrency=4) as f:
        assert f.size == size
        assert f.etag == headers["ETag"]  # reads are pinned to the version opened
        assert in_thread(lambda: read_all(f)) == data
        if size > 1:
            buf = bytearray(size - 1001)
            assert f.read(buf, offset=1000) == len(buf)
            assert bytes(buf) == data[1000 : size - 1]


def test_azure_many_ranges_into_numpy(az: AzureService, restore_settings: None) -> None:
    ferrio.config.set(remote_range_size="64KiB")  # 49 ranged GETs for the whole blob
    values = np.random.default_rng(5).standard_normal((3 << 20) // 4 + 1001).astype(np.float32)
    az.put("np/values.f32", values.tobytes())
    url = f"az://{CONTAINER}/np/values.f32"
    got = in_thread(lambda: ferrio.fromfile(url, dtype=np.float32))
    assert got.dtype == np.float32 and np.array_equal(got, values)
    # Into part of a larger array, from an offset that is no multiple of the ranges.
    dst = np.zeros(len(values) + 100, dtype=np.float32)
    with ferrio.open(url) as f:
        n = in_thread(lambda: f.read(dst[50:-50], offset=4 * 1000))
    assert n == 4 * (len(values) - 1000)
    assert np.array_equal(dst[50 : 50 + len(values) - 1000], values[1000:])
    assert not dst[:50].any() and not dst[50 + len(values) - 1000 :].any()


def test_azure_missing_blob_or_container_names_the_url(az: AzureService) -> None:
    for url in [f"az://{CONTAINER}/no/such/blob", "az://no-such-container/blob"]:
        with pytest.raises(FileNotFoundError) as e:
            ferrio.open(url)
        assert e.value.filename == url


def test_azure_blob_replaced_mid_read_is_an_error(az: AzureService) -> None:
    data = remote_data(1 << 20, seed=7)
    az.put("r.bin", data)
    url = f"az://{CONTAINER}/r.bin"
    with ferrio.open_url(url, range_size="64KiB", concurrency=1) as f:
        first = bytearray(64 << 10)
        assert f.read(first) == len(first)  # one GET of the version opened
        az.put("r.bin", bytes(len(data)))
        buf = bytearray(len(data))
        with pytest.raises(OSError, match="changed since it was opened") as e:
            in_thread(lambda: f.read(buf))
    assert e.value.filename == url


def test_azure_requests_signed_with_another_key_are_refused(
    az: AzureService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The service checks every signature: ferrio's requests pass (every other test), and the
    same requests signed with another key are PermissionError, for reads and writes."""
    az.put("signed.bin", b"abc")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", OTHER_KEY)
    url = f"az://{CONTAINER}/signed.bin"
    with pytest.raises(PermissionError) as e:
        ferrio.open(url)
    assert e.value.filename == url
    src = tmp_path / "up.bin"
    src.write_bytes(b"never stored")
    with pytest.raises(PermissionError):
        in_thread(lambda: ferrio.copy(src, f"az://{CONTAINER}/signed-up.bin"))
    assert az.get("signed-up.bin") is None


def test_azure_a_changed_endpoint_gets_a_store_of_its_own(
    az: AzureService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ferrio keeps the stores it built, by what they were built from: a process that points
    AZURITE_BLOB_STORAGE_URL elsewhere reaches the other service, not the first one."""
    url = f"az://{CONTAINER}/where.bin"
    az.put("where.bin", b"first")
    with ferrio.open(url) as f:
        assert read_all(f) == b"first"
    with azure_service_at(tmp_path, azurite=None) as other:
        other.put("where.bin", b"other")
        monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", other.url)
        with ferrio.open(url) as f:
            assert read_all(f) == b"other"


def test_emulator_answers_as_azure_documents(az: AzureService) -> None:
    """Ranges, conditions, signatures and blocks on the emulator, against Azure's reference:
    what the tests above rely on it to answer as Azure would."""
    if not az.emulated:
        pytest.skip("checks the emulator itself")
    data = remote_data(1000, seed=3)
    az.put("svc/a.bin", data)
    path = f"/{CONTAINER}/svc/a.bin"
    status, headers, _ = az.request("HEAD", path)
    assert status == 200 and headers["Content-Length"] == "1000"
    etag = headers["ETag"]
    assert etag.startswith('"0x') and headers["Last-Modified"].endswith(" GMT")

    status, headers, body = az.request("GET", path, headers={"Range": "bytes=10-19"})
    assert (status, headers["Content-Range"], body) == (206, "bytes 10-19/1000", data[10:20])
    ranges = {"Range": "bytes=0-0", "x-ms-range": "bytes=990-"}  # x-ms-range wins
    status, headers, body = az.request("GET", path, headers=ranges)
    assert (status, headers["Content-Range"], body) == (206, "bytes 990-999/1000", data[990:])
    status, headers, _ = az.request("GET", path, headers={"Range": "bytes=1000-1001"})
    assert (status, headers["x-ms-error-code"], headers["Content-Range"]) == (
        416,
        "InvalidRange",
        "bytes */1000",
    )
    az.put("svc/empty.bin", b"")
    status, headers, _ = az.request("GET", f"/{CONTAINER}/svc/empty.bin", headers=ranges)
    assert (status, headers["Content-Range"]) == (416, "bytes */0")

    for method in ("GET", "HEAD"):
        status, headers, _ = az.request(method, path, headers={"If-Match": '"0x8D000"'})
        assert (status, headers["x-ms-error-code"]) == (412, "ConditionNotMet")
        status, _, body = az.request(method, path, headers={"If-None-Match": etag})
        assert (status, body) == (304, b"")
        status, _, _ = az.request(method, path, headers={"If-Match": etag, "If-None-Match": "*"})
        assert status == 304
        assert az.request(method, path, headers={"If-Match": etag})[0] == 200

    status, headers, body = az.request("GET", path, key=OTHER_KEY)
    assert (status, headers["x-ms-error-code"]) == (403, "AuthenticationFailed")
    assert b"Server used following string to sign" in body
    status, headers, _ = az.request("GET", path, key=None)  # anonymous
    assert (status, headers["x-ms-error-code"]) == (404, "ResourceNotFound")

    block = base64.b64encode(b"block-0").decode()
    blocks = f"/{CONTAINER}/svc/blocks.bin?comp=block&blockid={quote(block, safe='')}"
    assert az.request("PUT", blocks, b"uncommitted")[0] == 201
    assert az.get("svc/blocks.bin") is None and "svc/blocks.bin" not in az.names("svc/")
    assert az.uncommitted("svc/blocks.bin") == 1
    commit = f"/{CONTAINER}/svc/blocks.bin?comp=blocklist"
    unknown = b"<BlockList><Uncommitted>YmxvY2stMQ==</Uncommitted></BlockList>"
    status, headers, _ = az.request("PUT", commit, unknown)
    assert (status, headers["x-ms-error-code"]) == (400, "InvalidBlockList")
    known = f"<BlockList><Uncommitted>{block}</Uncommitted></BlockList>".encode()
    assert az.request("PUT", commit, known)[0] == 201
    assert az.get("svc/blocks.bin") == b"uncommitted"
    assert az.uncommitted("svc/blocks.bin") == 0
    # A committed block may be listed again, as Committed or as Latest (no uncommitted one).
    again = f"<BlockList><Committed>{block}</Committed><Latest>{block}</Latest></BlockList>"
    assert az.request("PUT", commit, again.encode())[0] == 201
    assert az.get("svc/blocks.bin") == b"uncommitted" * 2
    assert az.names("svc/") == ["svc/a.bin", "svc/blocks.bin", "svc/empty.bin"]
    # Listings give ETags unquoted, unlike the ETag header.
    query = "?restype=container&comp=list&prefix=svc/a"
    listed = ElementTree.fromstring(az.request("GET", f"/{CONTAINER}{query}")[2])
    assert listed.findtext("Blobs/Blob/Properties/Etag") == etag.strip('"')


# ---------------------------------------------------------------------------------------------
# Writes: one Put Blob below a part, blocks and a block list above
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, 3 * PART + 12345])
def test_azure_write_round_trip(az: AzureService, size: int) -> None:
    data = remote_data(size, seed=size)
    name = f"up/{size}.bin"

    def nothing_visible() -> None:
        assert az.get(name) is None
        assert name not in az.names("up/")

    write_in_steps(f"az://{CONTAINER}/{name}", data, nothing_visible)
    _is_whole(az, name, data)


def test_azure_rewrite_replaces_the_blob(az: AzureService) -> None:
    url = f"az://{CONTAINER}/again.bin"
    for size, seed in [(PART + 3, 1), (10, 2), (2 * PART, 3)]:
        data = remote_data(size, seed=seed)
        in_thread(lambda data=data: write_all(url, data))
        _is_whole(az, "again.bin", data)


def test_azure_exception_inside_with_leaves_no_blob(az: AzureService) -> None:
    name = "aborted.bin"

    def upload() -> None:
        with ferrio.open_url(f"az://{CONTAINER}/{name}", "w", range_size="5MiB") as w:
            w.write(remote_data(3 * PART, seed=7))
            _eventually("three blocks uploaded", lambda: az.uncommitted(name) == 3)
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        in_thread(upload)
    assert az.get(name) is None and name not in az.names("")
    # Azure cannot drop blocks (they expire uncommitted): the next write of the name commits
    # its own blocks only, and drops the others.
    assert az.uncommitted(name) == 3
    data = remote_data(PART + 5, seed=8)
    in_thread(lambda: write_all(f"az://{CONTAINER}/{name}", data))
    _is_whole(az, name, data)


def test_azure_explicit_abort_leaves_no_blob(az: AzureService) -> None:
    name = "abort.bin"
    w = ferrio.open_url(f"az://{CONTAINER}/{name}", "w", range_size="5MiB")
    in_thread(lambda: w.write(remote_data(2 * PART + 1, seed=8)))
    _eventually("two blocks uploaded", lambda: az.uncommitted(name) == 2)
    in_thread(w.abort)
    assert w.closed
    with pytest.raises(ValueError):
        w.write(b"more")
    assert az.get(name) is None and name not in az.names("")
    # A blob of that name written in one Put Blob drops the blocks too.
    in_thread(lambda: write_all(f"az://{CONTAINER}/{name}", b"small"))
    _is_whole(az, name, b"small")


def test_azure_failing_block_leaves_no_blob(az: AzureService, restore_settings: None) -> None:
    _needs_emulator(az)
    ferrio.config.set(remote_retries=0)
    url = f"az://{AZURE_FAILING_CONTAINER}/failed.bin"
    with pytest.raises(OSError, match="500 Internal Server Error") as e:
        in_thread(lambda: write_all(url, remote_data(3 * PART, seed=9)))
    assert e.value.filename == url
    assert az.get("failed.bin", container=AZURE_FAILING_CONTAINER) is None


@pytest.mark.parametrize("size", [5, PART + 1])
def test_azure_write_to_missing_container_is_file_not_found(az: AzureService, size: int) -> None:
    url = f"az://no-such-container-ferrio/{size}.bin"
    with pytest.raises(FileNotFoundError) as e:
        in_thread(lambda: write_all(url, remote_data(size, seed=size)))
    assert e.value.filename == url


# ---------------------------------------------------------------------------------------------
# Copies: ferrio.copy and ferrio cp, files and trees, both ways
# ---------------------------------------------------------------------------------------------


def test_azure_copy_local_to_az_and_back_and_within(
    az: AzureService, tmp_path: Path, restore_settings: None
) -> None:
    ferrio.config.set(remote_range_size="5MiB")  # three blocks
    data = remote_data(2 * PART + 999, seed=11)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    url = f"az://{CONTAINER}/copied/src.bin"
    report = in_thread(lambda: ferrio.copy(str(src), url))
    assert report["files"] == 1 and report["bytes"] == len(data)
    _is_whole(az, "copied/src.bin", data)
    # Into a prefix: named after the source.
    in_thread(lambda: ferrio.copy(src, f"az://{CONTAINER}/copied/into/"))
    _is_whole(az, "copied/into/src.bin", data)

    # To a file, and into a directory: named after the blob.
    assert_downloads(url, data, tmp_path, "src.bin")

    # Within the container: a copy by the service (Copy Blob).
    in_thread(lambda: ferrio.copy(url, f"az://{CONTAINER}/copied/again.bin"))
    _is_whole(az, "copied/again.bin", data)
    missing = f"az://{CONTAINER}/copied/missing.bin"
    with pytest.raises(FileNotFoundError) as e:
        in_thread(lambda: ferrio.copy(missing, f"az://{CONTAINER}/copied/never.bin"))
    assert e.value.filename == missing
    names = ["copied/again.bin", "copied/into/src.bin", "copied/src.bin"]
    assert az.names("copied/") == names


def test_azure_copy_tree_up_and_down(
    az: AzureService, tmp_path: Path, restore_settings: None
) -> None:
    ferrio.config.set(remote_range_size="5MiB")  # a.bin goes up in two blocks
    src = tmp_path / "tree"
    files = make_tree(src)
    url = f"az://{CONTAINER}/tree/"
    report = in_thread(lambda: ferrio.copy(src, url, recursive=True))
    assert report["files"] == len(files)
    assert report["bytes"] == sum(len(d) for d in files.values())
    assert az.names("tree/") == sorted(f"tree/{rel}" for rel in files)
    for rel, data in files.items():
        _is_whole(az, f"tree/{rel}", data)

    out = tmp_path / "out"  # the listing takes two pages on the emulator
    report = in_thread(lambda: ferrio.copy(url, out, recursive=True))
    assert report["files"] == len(files)
    assert files_under(out) == files
    # Into a directory that exists: the tree goes inside it by name.
    in_thread(lambda: ferrio.copy(url, out, recursive=True))
    assert files_under(out / "tree") == files
    assert not [p for p in tmp_path.rglob("*") if ".ferrio-" in p.name]


def test_azure_copy_within_waits_for_a_pending_copy(az: AzureService) -> None:
    """Azure may answer a Copy Blob `pending` and finish it later: `ferrio.copy` and `ferrio
    cp` return only once the destination is whole. The emulator's pending copy leaves the
    destination half copied until its third Get Blob Properties (checked first, through its
    REST API)."""
    _needs_emulator(az)
    box = AZURE_PENDING_COPY_CONTAINER
    data = remote_data(PART + 4321, seed=51)
    az.put("src.bin", data, container=box)
    source = f"{az.url}/devstoreaccount1/{box}/src.bin"
    status, headers, _ = az.request("PUT", f"/{box}/raw.bin", b"", {"x-ms-copy-source": source})
    assert (status, headers["x-ms-copy-status"]) == (202, "pending")
    half = len(data) // 2
    assert az.get("raw.bin", container=box) == data[:half] + bytes(len(data) - half)
    seen = [az.request("HEAD", f"/{box}/raw.bin")[1]["x-ms-copy-status"] for _ in range(3)]
    assert seen == ["pending", "pending", "success"]
    assert az.get("raw.bin", container=box) == data

    src, dst = f"az://{box}/src.bin", f"az://{box}/dst.bin"
    report = in_thread(lambda: ferrio.copy(src, dst))
    assert report["files"] == 1 and report["bytes"] == len(data)
    assert az.get("dst.bin", container=box) == data
    out = _run("cp", src, f"az://{box}/cli-dst.bin")
    assert out.returncode == 0, out.stderr
    assert az.get("cli-dst.bin", container=box) == data


def test_azure_copy_within_that_fails_later_is_an_error_and_leaves_nothing(
    az: AzureService,
) -> None:
    """A pending copy that ends `failed`: an error naming both URLs, and no destination left."""
    _needs_emulator(az)
    box = AZURE_FAILED_COPY_CONTAINER
    data = remote_data(1000, seed=52)
    az.put("src.bin", data, container=box)
    src, dst = f"az://{box}/src.bin", f"az://{box}/dst.bin"
    with pytest.raises(OSError) as e:
        in_thread(lambda: ferrio.copy(src, dst))
    assert e.value.filename == dst
    assert src in str(e.value) and "ended failed" in str(e.value), str(e.value)
    assert "Copy failed on purpose" in str(e.value)
    out = _run("cp", src, f"az://{box}/cli-dst.bin")
    assert out.returncode != 0
    assert src in out.stderr and "cli-dst.bin" in out.stderr and "ended failed" in out.stderr
    assert az.names("", container=box) == ["src.bin"]


def test_azure_cli_cp_both_ways(az: AzureService, tmp_path: Path) -> None:
    """`ferrio cp` of a file in one Put Blob and in blocks, and back in many small ranges."""
    blocks = {"FERRIO_REMOTE_RANGE_SIZE": "5MiB"}
    small_ranges = {"FERRIO_REMOTE_RANGE_SIZE": "64KiB"}
    for name, size in [("cli-small.bin", 1000), ("cli-blocks.bin", 2 * PART + 3)]:
        data = remote_data(size, seed=size)
        src = tmp_path / name
        src.write_bytes(data)
        url = f"az://{CONTAINER}/{name}"
        out = _run("cp", str(src), url, "--json", **blocks)
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        assert summary["files"] == 1 and summary["bytes"] == size
        _is_whole(az, name, data)
        back = tmp_path / f"back-{name}"
        out = _run("cp", url, str(back), "--json", **small_ranges)
        assert out.returncode == 0, out.stderr
        assert back.read_bytes() == data
    out = _run("cp", f"az://{CONTAINER}/cli-missing.bin", str(tmp_path / "none"))
    assert out.returncode == 2
    assert "cli-missing.bin" in out.stderr
    assert not (tmp_path / "none").exists()


def test_azure_cli_cp_recursive_both_ways(az: AzureService, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    files = make_tree(src)
    url = f"az://{CONTAINER}/cli-tree/"
    out = _run("cp", "-r", str(src), url, "--json", FERRIO_REMOTE_RANGE_SIZE="5MiB")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"] == len(files)
    assert az.names("cli-tree/") == sorted(f"cli-tree/{rel}" for rel in files)
    down = tmp_path / "down"
    out = _run("cp", "-r", url, str(down), "--json", FERRIO_REMOTE_RANGE_SIZE="64KiB")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["files"] == len(files)
    # `down`, `sub` and `sub/deeper`: the empty directories were not uploaded (blobs only).
    assert report["dirs"] == 3
    assert files_under(down) == files
    out = _run("cp", "-r", f"az://{CONTAINER}/no-such-prefix/", str(tmp_path / "none"))
    assert out.returncode == 2
    assert "no-such-prefix" in out.stderr


def test_azure_cli_cp_tree_with_failing_blocks(az: AzureService, tmp_path: Path) -> None:
    """The big file's blocks fail: it is reported and never committed; the small file (one Put
    Blob) is copied whole; the exit status is 1."""
    _needs_emulator(az)
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "big.bin").write_bytes(remote_data(3 * PART, seed=23))
    (src / "sub" / "small.bin").write_bytes(b"small")
    url = f"az://{AZURE_FAILING_CONTAINER}/fail/"
    env = {"FERRIO_REMOTE_RANGE_SIZE": "5MiB", "FERRIO_REMOTE_RETRIES": "0"}
    out = _run("cp", "-r", str(src), url, "--json", **env)
    assert out.returncode == 1, out.stderr
    summary = json.loads(out.stdout)
    assert summary["files"] == 1
    assert [Path(e["path"]).name for e in summary["errors"]] == ["big.bin"]
    assert az.names("fail/", container=AZURE_FAILING_CONTAINER) == ["fail/sub/small.bin"]
    assert az.get("fail/sub/small.bin", container=AZURE_FAILING_CONTAINER) == b"small"


def test_azure_read_with_the_cli_in_small_ranges(az: AzureService) -> None:
    data = remote_data(PART + 7, seed=31)
    az.put("cli-read.bin", data)
    out = _run("read", f"az://{CONTAINER}/cli-read.bin", "--json", FERRIO_REMOTE_RANGE_SIZE="64KiB")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bytes"] == len(data)
