"""gs:// objects written and read through the GCS emulator (`gcp-storage-emulator`) on 127.0.0.1.

The emulator runs in a child process on a free port, in memory, and is stopped by the fixture.
ferrio's GCS store is pointed at it the documented way for emulators: a service-account file
with ``"gcs_base_url"`` and ``"disable_oauth": true`` (``GOOGLE_SERVICE_ACCOUNT``), so every
request takes the real GCS code path of `object_store`, unsigned. That path is GCS's XML API,
of which the emulator has only a bare GET and PUT of an object; the child adds the rest before
it starts (`_LAUNCHER`), as GCS documents it:

- reads: HEAD, the `ETag` and `Last-Modified` headers, `If-Match` (412 on a mismatch);
- writes: an `ETag` (and `x-goog-generation`) on the `PUT` of a whole object; the multipart
  upload (`POST ?uploads`, `PUT ?partNumber=&uploadId=`, the completing `POST ?uploadId=` with
  its `<CompleteMultipartUpload>` part list, the aborting `DELETE ?uploadId=`), whose parts are
  held aside in the child until completion stores them as one object in the emulator's storage
  (so nothing shows before, and an abort drops them); the copy within the store (`PUT` with
  `x-goog-copy-source`);
- listing: `GET /BUCKET?list-type=2` (objects) and `GET /BUCKET?uploads` (uploads in
  progress, which the tests check are gone);
- the percent-encoded bucket in the path (`ferrio%2Dtest`) decoded, and an empty object
  stored rather than failing.

Everything else is the emulator's, and the tests read what was written back through its own
JSON API as well as through ferrio. One test hook, no GCS behaviour: every part uploaded into
the bucket `FAILING_BUCKET` answers 500.

Reads: sizes 0, 1 and a ragged multi-range object; a missing object; an object replaced between
two GETs of one read. Writes: sizes 0, 1, one part and several parts with a ragged tail,
invisible until closed; a rewrite; an exception inside `with`, `abort()` and a failing part
leave no object and no upload; a missing bucket; `ferrio.copy` up, down and within the bucket,
and of a tree (an empty file, a key with `#?%`) up and down.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from conftest import (
    BOUND_S,
    PART,
    assert_downloads,
    child_server,
    files_under,
    free_port,
    in_thread,
    make_tree,
    read_all,
    remote_data,
    write_all,
    write_in_steps,
)

import ferrio

BUCKET = "ferrio-test"
FAILING_BUCKET = "ferrio-failing-parts"  # every part uploaded into it answers 500

# Run in the emulator's process: what the XML API of real GCS does and the emulator does not.
_LAUNCHER = r"""
import hashlib
import re
import sys
import uuid
import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, unquote, urlparse

from gcp_storage_emulator import __main__ as cli, server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

HTTP = server.HTTPStatus
UPLOADS = {}  # upload id -> the multipart upload's bucket, key, content type and parts
FAILING_BUCKET = sys.argv.pop(1)  # a test hook, not GCS: its part uploads answer 500


def etag(obj):
    return '"%s-%s"' % (obj.get("md5Hash"), obj.get("generation"))


def E(tag, *kids):
    el = ET.Element(tag)
    for kid in kids:
        if isinstance(kid, ET.Element):
            el.append(kid)
        else:
            el.text = str(kid)
    return el


def reply(response, el, status=HTTP.OK):
    response.status = status
    response.write_file(ET.tostring(el, encoding="unicode"), "application/xml")


_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:
        obj = None
    if obj is not None:
        want = request.get_header("if-match")
        if want is not None and want != etag(obj):
            response.status = HTTP.PRECONDITION_FAILED
            return
        response["ETag"] = etag(obj)
        response["Last-Modified"] = "Mon, 23 Nov 2026 10:00:00 GMT"
    _download(request, response, storage, *args, **kwargs)


def xml_api(handler):
    # Hands the handler the query (`?uploads` included) and the bucket and key; 404 for a
    # missing bucket, object or upload.
    def handle(request, response, storage, *args, **kwargs):
        query = parse_qs(urlparse(request.full_url).query, keep_blank_values=True)
        q = {k: v[0] for k, v in query.items()}
        p = request.params
        try:
            handler(request, response, storage, q, p["bucket_name"], p.get("object_id"))
        except NotFound:
            reply(response, E("Error", E("Code", "NotFound")), HTTP.NOT_FOUND)

    return handle


def create(request, response, storage, bucket, key, data, content_type):
    obj = objects._make_object_resource(
        request.base_url, bucket, key, content_type, str(len(data))
    )
    storage.create_file(bucket, key, data, objects._checksums(data, obj))
    response["ETag"] = etag(obj)
    response["x-goog-generation"] = obj["generation"]
    return obj


def upload(q, bucket, key):
    up = UPLOADS.get(q["uploadId"])
    if up is None or (up["bucket"], up["key"]) != (bucket, key):
        raise NotFound
    return up


@xml_api
def put(request, response, storage, q, bucket, key):
    data = request.data
    source = request.get_header("x-goog-copy-source")
    if "uploadId" in q:  # a part of a multipart upload, held aside until it completes
        up = upload(q, bucket, key)
        if bucket == FAILING_BUCKET:
            response.status = HTTP.INTERNAL_SERVER_ERROR
            return
        tag = '"%s"' % hashlib.md5(data).hexdigest()
        up["parts"][int(q["partNumber"])] = (tag, data)
        response["ETag"] = tag
    elif source is not None:  # a copy of another object
        src_bucket, _, src_key = source.lstrip("/").partition("/")
        obj = objects._copy(
            request.base_url, storage, unquote(src_bucket), unquote(src_key), bucket, key
        )
        response["ETag"] = etag(obj)
        reply(response, E("CopyObjectResult", E("ETag", etag(obj))))
    else:  # the whole object
        content_type = request.get_header("Content-Type", "application/octet-stream")
        create(request, response, storage, bucket, key, data, content_type)


@xml_api
def post(request, response, storage, q, bucket, key):
    if "uploads" in q:  # starts a multipart upload
        if storage.get_bucket(bucket) is None:
            raise NotFound
        upload_id = uuid.uuid4().hex
        content_type = request.get_header("Content-Type", "application/octet-stream")
        UPLOADS[upload_id] = {"bucket": bucket, "key": key, "type": content_type, "parts": {}}
        reply(
            response,
            E("InitiateMultipartUploadResult", E("Bucket", bucket), E("Key", key),
              E("UploadId", upload_id)),
        )
    elif "uploadId" in q:  # completes it from the parts listed, in ascending order
        up = upload(q, bucket, key)
        listed = [
            (int(part.findtext("PartNumber")), part.findtext("ETag"))
            for part in ET.fromstring(request.data).iter("Part")
        ]
        numbers = [n for n, _ in listed]
        if not listed or numbers != sorted(set(numbers)) or any(
            up["parts"].get(n, (None,))[0] != tag for n, tag in listed
        ):
            reply(response, E("Error", E("Code", "InvalidPart")), HTTP.BAD_REQUEST)
            return
        data = b"".join(up["parts"][n][1] for n in numbers)
        obj = create(request, response, storage, bucket, key, data, up["type"])
        del UPLOADS[q["uploadId"]]
        reply(
            response,
            E("CompleteMultipartUploadResult", E("Bucket", bucket), E("Key", key),
              E("ETag", etag(obj))),
        )
    else:
        response.status = HTTP.NOT_IMPLEMENTED


@xml_api
def delete(request, response, storage, q, bucket, key):
    if "uploadId" in q:  # aborts a multipart upload: its parts are dropped
        upload(q, bucket, key)
        del UPLOADS[q["uploadId"]]
        response.status = HTTP.NO_CONTENT
    else:
        objects.delete(request, response, storage)


@xml_api
def bucket(request, response, storage, q, bucket, _key):
    if "uploads" in q:  # the multipart uploads in progress
        ups = [(u["key"], i) for i, u in UPLOADS.items() if u["bucket"] == bucket]
        reply(
            response,
            E("ListMultipartUploadsResult", E("Bucket", bucket),
              *(E("Upload", E("Key", k), E("UploadId", i)) for k, i in sorted(ups))),
        )
        return
    objs, prefixes = storage.get_file_list(
        bucket, q.get("prefix") or None, q.get("delimiter") or None
    )
    reply(
        response,
        E("ListBucketResult", E("Name", bucket), E("KeyCount", len(objs) + len(prefixes)),
          *(E("Contents", E("Key", o["name"]), E("Size", o["size"]),
              E("LastModified", o["updated"]), E("ETag", etag(o))) for o in objs),
          *(E("CommonPrefixes", E("Prefix", p)) for p in prefixes)),
    )


objects.download = download
xml_object = {"GET": download, "PUT": put, "POST": post, "DELETE": delete}
server.HANDLERS = tuple(
    (regex, xml_object if handlers.get("PUT") is objects.xml_upload else
     {m: (download if h is _download else h) for m, h in handlers.items()})
    for regex, handlers in server.HANDLERS
) + ((r"^/(?P<bucket_name>[-.\w]+)$", {"GET": bucket}),)


# object_store percent-encodes the bucket in the path (`ferrio%2Dtest`), which the routes do not
# match; the key is decoded once by the routes themselves. Decoding only the bucket keeps keys
# with `%`, `?` or `#` intact.
def decoding_bucket(do):
    def do_decoded(self):
        self.path = re.sub(r"^/[^/?]*", lambda m: unquote(m.group()), self.path)
        do(self)

    return do_decoded


for name in ("do_GET", "do_PUT", "do_POST", "do_DELETE"):
    setattr(server.RequestHandler, name, decoding_bucket(getattr(server.RequestHandler, name)))


def do_HEAD(self):
    real = self.wfile

    class HeadersOnly:
        writes = 0

        def write(self, b):
            self.writes += 1
            return real.write(b) if self.writes == 1 else len(b)

        def flush(self):
            real.flush()

    self.wfile = HeadersOnly()
    try:
        self.do_GET()
    finally:
        self.wfile = real


# The emulator reads an empty upload's body as None and fails; real GCS stores an empty object.
_data = server.Request.data
server.Request.data = property(
    lambda self: b"" if (d := _data.fget(self)) is None and self.method in ("POST", "PUT") else d
)
server.RequestHandler.do_HEAD = do_HEAD
cli.main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip(
        "gcp_storage_emulator", reason="gcp-storage-emulator is not installed (make deps-python)"
    )
    port = free_port()
    log = tmp_path_factory.mktemp("gcs") / "emulator.log"
    argv = [sys.executable, "-c", _LAUNCHER, FAILING_BUCKET, "start", "--host", "127.0.0.1",
            "--port", str(port), "--in-memory", "--default-bucket", BUCKET, "-q"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with child_server("the GCS emulator", argv, port, log):
        req = urllib.request.Request(
            f"{base}/storage/v1/b",
            data=json.dumps({"name": FAILING_BUCKET}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=BOUND_S) as r:
            assert r.status == 200
        yield base


@pytest.fixture
def gcs(gcs_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for k in list(os.environ):
        if k.startswith("GOOGLE_"):
            monkeypatch.delenv(k)
    account = tmp_path / "emulator-account.json"
    account.write_text(
        json.dumps(
            {
                "gcs_base_url": gcs_endpoint,
                "disable_oauth": True,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(account))
    monkeypatch.setenv("GOOGLE_ALLOW_HTTP", "true")

    def put(key: str, body: bytes) -> None:
        req = urllib.request.Request(
            f"{gcs_endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={key}",
            data=body,
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        with urllib.request.urlopen(req, timeout=BOUND_S) as r:
            assert r.status == 200

    return put


@pytest.mark.parametrize("size", [0, 1, (2 << 20) + 4097])
def test_gcs_sizes_are_byte_identical(gcs: Any, size: int) -> None:
    data = remote_data(size, seed=size)
    gcs(f"d/obj-{size}.bin", data)
    url = f"gs://{BUCKET}/d/obj-{size}.bin"
    with ferrio.open_url(url, range_size="256KiB", concurrency=4) as f:
        assert f.size == size
        assert in_thread(lambda: read_all(f)) == data
        if size > 1:
            buf = bytearray(size - 1001)
            assert f.read(buf, offset=1000) == len(buf)
            assert bytes(buf) == data[1000 : size - 1]


def test_gcs_missing_object_names_the_url(gcs: Any) -> None:
    url = f"gs://{BUCKET}/no/such/object"
    with pytest.raises(FileNotFoundError) as e:
        ferrio.open(url)
    assert e.value.filename == url


def test_gcs_object_replaced_mid_read_is_an_error(gcs: Any) -> None:
    data = remote_data(1 << 20, seed=7)
    gcs("r.bin", data)
    f = ferrio.open_url(f"gs://{BUCKET}/r.bin", range_size="64KiB", concurrency=1)
    first = bytearray(64 << 10)
    assert f.read(first) == len(first)  # one GET of the version opened
    gcs("r.bin", b"\0" * len(data))
    buf = bytearray(len(data))
    with pytest.raises(OSError, match="changed since it was opened") as e:
        in_thread(lambda: f.read(buf))
    assert e.value.filename == f"gs://{BUCKET}/r.bin"
    with contextlib.suppress(Exception):
        f.close()


# ---------------------------------------------------------------------------------------------
# Writes: one PUT below a part, the XML multipart upload above; copies up, down and within
# ---------------------------------------------------------------------------------------------


def _stored(endpoint: str, key: str, bucket: str = BUCKET) -> tuple[bytes, Any] | None:
    """The object's bytes and resource as the emulator's own JSON API sees them, or None."""
    name = urllib.parse.quote(key, safe="")
    try:
        with urllib.request.urlopen(
            f"{endpoint}/storage/v1/b/{bucket}/o/{name}", timeout=BOUND_S
        ) as r:
            meta = json.loads(r.read())
        with urllib.request.urlopen(
            f"{endpoint}/download/storage/v1/b/{bucket}/o/{name}?alt=media", timeout=BOUND_S
        ) as r:
            return r.read(), meta
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _keys(endpoint: str, prefix: str) -> list[str]:
    url = f"{endpoint}/storage/v1/b/{BUCKET}/o?prefix={urllib.parse.quote(prefix)}"
    with urllib.request.urlopen(url, timeout=BOUND_S) as r:
        return sorted(o["name"] for o in json.loads(r.read()).get("items", []))


def _uploads(endpoint: str, bucket: str = BUCKET) -> list[str]:
    """Keys of the multipart uploads in progress (the XML API's `GET /BUCKET?uploads`)."""
    with urllib.request.urlopen(f"{endpoint}/{bucket}?uploads", timeout=BOUND_S) as r:
        listed = ElementTree.fromstring(r.read())
    return sorted(u.findtext("Key") or "" for u in listed.iter("Upload"))


def _is_whole(endpoint: str, key: str, data: bytes) -> None:
    """`key` holds exactly `data`, read through the emulator and through ferrio."""
    stored = _stored(endpoint, key)
    assert stored is not None, f"{key} was not created"
    body, meta = stored
    assert body == data
    assert int(meta["size"]) == len(data)
    assert meta["md5Hash"] == base64.b64encode(hashlib.md5(data).digest()).decode()
    with ferrio.open_url(f"gs://{BUCKET}/{key}", range_size="1MiB", concurrency=4) as f:
        assert f.size == len(data)
        assert in_thread(lambda: read_all(f)) == data


@pytest.mark.parametrize("size", [0, 1, PART, 3 * PART + 12345])
def test_gcs_write_round_trip(gcs: Any, gcs_endpoint: str, size: int) -> None:
    data = remote_data(size, seed=size)
    key = f"up/{size}.bin"
    url = f"gs://{BUCKET}/{key}"

    def nothing_visible() -> None:
        # Nothing is visible until the writer is closed; a full part started an upload.
        assert _stored(gcs_endpoint, key) is None
        assert _uploads(gcs_endpoint) == ([key] if size >= PART else [])

    write_in_steps(url, data, nothing_visible)
    _is_whole(gcs_endpoint, key, data)
    assert _uploads(gcs_endpoint) == []


def test_gcs_rewrite_replaces_the_object(gcs: Any, gcs_endpoint: str) -> None:
    url = f"gs://{BUCKET}/again.bin"
    for size, seed in [(PART + 3, 1), (10, 2)]:
        data = remote_data(size, seed=seed)
        in_thread(lambda data=data: write_all(url, data))
        _is_whole(gcs_endpoint, "again.bin", data)


def test_gcs_exception_inside_with_leaves_nothing(gcs: Any, gcs_endpoint: str) -> None:
    url = f"gs://{BUCKET}/aborted.bin"

    def upload() -> None:
        with ferrio.open_url(url, "w", range_size="5MiB") as w:
            w.write(remote_data(3 * PART, seed=7))
            assert _uploads(gcs_endpoint) == ["aborted.bin"]  # parts went up
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        in_thread(upload)
    assert _stored(gcs_endpoint, "aborted.bin") is None
    assert _uploads(gcs_endpoint) == []


def test_gcs_explicit_abort_leaves_nothing(gcs: Any, gcs_endpoint: str) -> None:
    url = f"gs://{BUCKET}/abort.bin"
    w = ferrio.open_url(url, "w", range_size="5MiB")
    in_thread(lambda: w.write(remote_data(2 * PART + 1, seed=8)))
    assert _uploads(gcs_endpoint) == ["abort.bin"]
    in_thread(w.abort)
    assert w.closed
    with pytest.raises(ValueError):
        w.write(b"more")
    assert _stored(gcs_endpoint, "abort.bin") is None
    assert _uploads(gcs_endpoint) == []


def test_gcs_failing_part_leaves_nothing(
    gcs: Any, gcs_endpoint: str, restore_settings: None
) -> None:
    ferrio.config.set(remote_retries=0)
    url = f"gs://{FAILING_BUCKET}/failed.bin"
    with pytest.raises(OSError, match="500 Internal Server Error") as e:
        in_thread(lambda: write_all(url, remote_data(3 * PART, seed=9)))
    assert e.value.filename == url
    assert _stored(gcs_endpoint, "failed.bin", bucket=FAILING_BUCKET) is None
    assert _uploads(gcs_endpoint, bucket=FAILING_BUCKET) == []


@pytest.mark.parametrize("size", [5, PART + 1])
def test_gcs_write_to_missing_bucket_is_file_not_found(gcs: Any, size: int) -> None:
    url = f"gs://no-such-bucket-ferrio/{size}.bin"
    with pytest.raises(FileNotFoundError) as e:
        in_thread(lambda: write_all(url, remote_data(size, seed=size)))
    assert e.value.filename == url


def test_gcs_copy_local_to_gs_and_back_and_within(
    gcs: Any, gcs_endpoint: str, tmp_path: Path, restore_settings: None
) -> None:
    ferrio.config.set(remote_range_size="5MiB")  # three parts
    data = remote_data(2 * PART + 999, seed=11)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    url = f"gs://{BUCKET}/copied/src.bin"
    report = in_thread(lambda: ferrio.copy(str(src), url))
    assert report["files"] == 1 and report["bytes"] == len(data)
    _is_whole(gcs_endpoint, "copied/src.bin", data)
    assert _uploads(gcs_endpoint) == []

    # To a file, and into a directory: named after the object.
    assert_downloads(url, data, tmp_path, "src.bin")

    # Within the bucket: a copy by the store (`PUT` with `x-goog-copy-source`).
    in_thread(lambda: ferrio.copy(url, f"gs://{BUCKET}/copied/again.bin"))
    _is_whole(gcs_endpoint, "copied/again.bin", data)
    missing = f"gs://{BUCKET}/copied/missing.bin"
    with pytest.raises(FileNotFoundError) as e:
        in_thread(lambda: ferrio.copy(missing, f"gs://{BUCKET}/copied/never.bin"))
    assert e.value.filename == missing
    assert _keys(gcs_endpoint, "copied/") == ["copied/again.bin", "copied/src.bin"]


def test_gcs_copy_tree_up_and_down(
    gcs: Any, gcs_endpoint: str, tmp_path: Path, restore_settings: None
) -> None:
    ferrio.config.set(remote_range_size="5MiB")  # a.bin goes up in two parts
    src = tmp_path / "tree"
    files = make_tree(src)
    url = f"gs://{BUCKET}/tree/"
    report = in_thread(lambda: ferrio.copy(src, url, recursive=True))
    assert report["files"] == len(files)
    assert report["bytes"] == sum(len(d) for d in files.values())
    assert _keys(gcs_endpoint, "tree/") == sorted(f"tree/{rel}" for rel in files)
    for rel, data in files.items():
        stored = _stored(gcs_endpoint, f"tree/{rel}")
        assert stored is not None and stored[0] == data, rel
    assert _uploads(gcs_endpoint) == []

    out = tmp_path / "out"
    report = in_thread(lambda: ferrio.copy(url, out, recursive=True))
    assert report["files"] == len(files)
    assert files_under(out) == files
