"""An emulator of the Azure Blob service for the az:// tests, served from memory on 127.0.0.1.

It answers the REST operations that object_store's Azure client sends, on path-style URLs as
Azurite serves them (``http://127.0.0.1:PORT/devstoreaccount1/CONTAINER/BLOB``), the way
Azure's REST reference describes them (version 2023-11-03, the one object_store sends). The
tests run it in a child process (``python azure_blob_server.py --port PORT``) until they
terminate it.

- Shared Key authorization on every request, with the emulator account's published key
  (`KEY`): the string to sign is rebuilt from the request as Azure documents it
  (`string_to_sign`), and a signature that differs is 403 ``AuthenticationFailed`` naming the
  string the server signed, as is a missing or stale (over 15 minutes) date. A request with no
  ``Authorization`` is anonymous, which a private container (every container here) answers
  404 ``ResourceNotFound``, as Azure does.
- Create Container (``PUT ?restype=container``) and List Blobs (``GET
  ?restype=container&comp=list`` with ``prefix``, ``delimiter``, ``marker`` and
  ``maxresults``, a ``NextMarker`` while more remain, ETags listed unquoted as Azure lists
  them).
- Put Blob (block blobs), Put Block, Put Block List (``Uncommitted``, ``Committed`` and
  ``Latest`` ids) and Get Block List: blocks stay uncommitted, invisible to reads and listings,
  until a block list commits them, and a commit or a Put Blob drops the blob's other
  uncommitted blocks. Azure has no abort: blocks never committed just stay invisible.
- Get Blob and Get Blob Properties (``HEAD``): ``ETag``, ``Last-Modified``, ``Content-MD5``
  where Azure keeps one; ``x-ms-range`` (which wins) or ``Range`` answered 206 with
  ``Content-Range``, a range that starts at or past the end 416 ``InvalidRange``; the
  conditions ``If-Match && If-Unmodified-Since && (If-None-Match || If-Modified-Since)``,
  answered 412 or 304 when they fail.
- Delete Blob, and Copy Blob from a blob of this account (done at once: ``x-ms-copy-status:
  success``), the copy's ``x-ms-copy-*`` properties then given with the destination's.

Errors carry Azure's codes (``x-ms-error-code`` and an XML body). What is not emulated (other
blob types, conditional writes, leases, snapshots, versions, service-level operations...)
answers 501 ``NotImplemented`` naming it, never a silent success.

Test hooks, no Azure behaviour: ``--failing-container NAME`` makes every Put Block into that
container answer 500; ``--page-size N`` is the listing's default ``maxresults`` (Azure's is
5000), so that a small tree takes several pages. Two hooks make copies finish later, as Azure
may (its Copy Blob is asynchronous, done "on a best-effort basis"): a Copy Blob into the
container of ``--pending-copy-container NAME`` or ``--failed-copy-container NAME`` answers 202
with ``x-ms-copy-status: pending`` and leaves the destination half copied (the source's first
half, zeros after); the `PENDING_READS`-th Get Blob Properties of it then ends the copy,
``success`` with the whole source in the first container, ``failed`` in the second.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast
from urllib.parse import parse_qsl, unquote, urlsplit
from xml.etree import ElementTree

ACCOUNT = "devstoreaccount1"
PENDING_READS = 3  # Get Blob Properties of a pending copy's destination until the copy ends
# The emulator account's published key (not a secret: it is in Azure's and Azurite's docs).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
VERSION = "2023-11-03"
MAX_RESULTS = 5000  # the most blobs one List Blobs page holds, and its default
MAX_CLOCK_SKEW_S = 15 * 60  # a request dated further from the server's clock is refused
DEFAULT_CONTENT_TYPE = "application/octet-stream"

# The standard headers a Shared Key signature covers, in the order it signs them.
_SIGNED_HEADERS = (
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "date",
    "if-modified-since",
    "if-match",
    "if-none-match",
    "if-unmodified-since",
    "range",
)
_CONDITIONS = ("if-match", "if-none-match", "if-modified-since", "if-unmodified-since")
_CONTAINER_NAME = re.compile(r"[a-z0-9](?:-?[a-z0-9]){2,62}")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_XML_DECLARATION = b'<?xml version="1.0" encoding="utf-8"?>'


def string_to_sign(
    method: str, target: str, headers: Mapping[str, str], account: str = ACCOUNT
) -> str:
    """What a Shared Key request signs: the method, the standard headers (a zero length signs
    as empty), the ``x-ms-`` headers sorted by name with their whitespace folded, and the
    resource: ``/ACCOUNT`` and the path as sent (percent-encoded; the emulator's path holds the
    account again), then each query parameter ``name:value`` (decoded, names lower-cased and
    sorted, a repeated name's values sorted and joined by commas).

    `target` is the request's path and query as sent; `headers` maps lower-case names to values.
    """
    standard = [headers.get(name, "") for name in _SIGNED_HEADERS]
    if standard[2] == "0":  # Content-Length, since version 2015-02-21
        standard[2] = ""
    canonical_headers = "".join(
        f"{name}:{' '.join(value.split())}\n"
        for name, value in sorted(headers.items())
        if name.startswith("x-ms-")
    )
    path, _, query = target.partition("?")
    params: dict[str, list[str]] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(name.lower(), []).append(value)
    resource = f"/{account}{path}" + "".join(
        f"\n{name}:{','.join(sorted(params[name]))}" for name in sorted(params)
    )
    return f"{method}\n" + "\n".join(standard) + "\n" + canonical_headers + resource


def shared_key(
    method: str, target: str, headers: Mapping[str, str], key: str = KEY, account: str = ACCOUNT
) -> str:
    """The ``Authorization`` header of a Shared Key request (see `string_to_sign`)."""
    to_sign = string_to_sign(method, target, headers, account).encode()
    mac = hmac.new(base64.b64decode(key), to_sign, hashlib.sha256).digest()
    return f"SharedKey {account}:{base64.b64encode(mac).decode()}"


class AzureError(Exception):
    """An error answer: its status, Azure's error code, message and extra headers."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})
        self.detail = detail  # Azure's AuthenticationErrorDetail, for signature failures


def _not_emulated(what: str) -> AzureError:
    return AzureError(501, "NotImplemented", f"{what} is not emulated")


def _missing_header(name: str) -> AzureError:
    return AzureError(
        400, "MissingRequiredHeader", f"An HTTP header that's mandatory is missing: {name}"
    )


def _blob_not_found() -> AzureError:
    return AzureError(404, "BlobNotFound", "The specified blob does not exist.")


def _http_date(t: float) -> str:
    return formatdate(t, usegmt=True)


@dataclass
class Blob:
    """A committed block blob."""

    data: bytes
    etag: str  # Azure's form, unquoted: 0x and 15 hex digits
    modified: float  # seconds since the epoch
    content_type: str
    content_md5: str | None  # base64; Azure computes it for Put Blob, not for a block list
    blocks: list[tuple[str, int]]  # the committed block list (ids and sizes); empty after Put Blob
    copy: Copy | None = None  # the Copy Blob that made it, if one did

    def committed_blocks(self) -> dict[str, bytes]:
        """The bytes of each committed block, by id."""
        out: dict[str, bytes] = {}
        offset = 0
        for block_id, size in self.blocks:
            out[block_id] = self.data[offset : offset + size]
            offset += size
        return out


@dataclass
class Copy:
    """The Copy Blob that made a blob: its ``x-ms-copy-*`` properties, and for a pending copy
    what ends it (`reads_left` more Get Blob Properties, then `outcome`, with `data`)."""

    id: str
    source: str
    status: str  # success, pending or failed
    total: int
    data: bytes  # the source's bytes
    reads_left: int = 0
    outcome: str = "success"
    completed: float | None = None

    def headers(self) -> dict[str, str]:
        copied = self.total if self.status == "success" else self.total // 2
        out = {
            "x-ms-copy-id": self.id,
            "x-ms-copy-source": self.source,
            "x-ms-copy-status": self.status,
            "x-ms-copy-progress": f"{copied}/{self.total}",
        }
        if self.completed is not None:
            out["x-ms-copy-completion-time"] = _http_date(self.completed)
        if self.status == "failed":
            out["x-ms-copy-status-description"] = "500 InternalError Copy failed on purpose."
        return out


@dataclass
class Container:
    """A container's committed blobs, and the uncommitted blocks of each blob name."""

    blobs: dict[str, Blob] = field(default_factory=dict)
    uncommitted: dict[str, dict[str, bytes]] = field(default_factory=dict)


class BlobService:
    """The storage account: its containers, behind one lock."""

    def __init__(
        self,
        failing_container: str | None,
        page_size: int,
        pending_copy_container: str | None = None,
        failed_copy_container: str | None = None,
    ) -> None:
        self.containers: dict[str, Container] = {}
        self.lock = threading.Lock()
        self.failing_container = failing_container
        self.pending_copy_container = pending_copy_container
        self.failed_copy_container = failed_copy_container
        self.page_size = page_size
        self._last_tick = 0

    def stamp(self) -> tuple[str, float]:
        """A new ETag (never one given before) and the modification time that goes with it.
        Call with the lock held."""
        now = time.time()
        # Like Azure's, from a clock of 100 ns ticks, which only goes up so that they differ.
        self._last_tick = max(self._last_tick + 1, int(now * 1e7))
        return f"0x8D{self._last_tick % 16**13:013X}", now

    def container(self, name: str) -> Container:
        """The container `name`; 404 ``ContainerNotFound`` if there is none. Call with the lock
        held."""
        found = self.containers.get(name)
        if found is None:
            raise AzureError(404, "ContainerNotFound", "The specified container does not exist.")
        return found

    def blob(self, container: str, name: str) -> Blob:
        """The committed blob; 404 if it or its container does not exist. Call with the lock
        held."""
        found = self.container(container).blobs.get(name)
        if found is None:
            raise _blob_not_found()
        return found

    def commit(self, container: str, name: str, blob: Blob) -> None:
        """Stores `blob` under `name`, dropping the name's uncommitted blocks. Call with the
        lock held."""
        c = self.container(container)
        c.blobs[name] = blob
        c.uncommitted.pop(name, None)


@dataclass
class Request:
    """One request as the operations see it: method, container, blob name (empty for the
    container itself), query, lower-case headers and body."""

    method: str
    container: str
    blob: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    host: str


@dataclass
class Answer:
    """A successful answer: status, headers, body."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _xml(root: ElementTree.Element) -> bytes:
    return _XML_DECLARATION + ElementTree.tostring(root, encoding="unicode").encode()


def _child(parent: ElementTree.Element, tag: str, text: str | None = None) -> ElementTree.Element:
    el = ElementTree.SubElement(parent, tag)
    el.text = text
    return el


def _etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match``/``If-None-Match`` list (quoted or not, or ``*``) names `etag`."""
    tags = [t.strip().strip('"') for t in header.split(",")]
    return "*" in tags or etag in tags


def _header_date(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        raise AzureError(
            400, "InvalidHeaderValue", f"The value for the header {name} is invalid."
        ) from None


def _check_conditions(req: Request, blob: Blob) -> None:
    """Azure's read conditions: If-Match && If-Unmodified-Since && (If-None-Match ||
    If-Modified-Since); 412 when one of the first two fails, 304 when the last two do."""
    h = req.headers
    modified = int(blob.modified)  # Last-Modified has whole seconds
    unmodified_since = _header_date(h, "if-unmodified-since")
    if ("if-match" in h and not _etag_matches(h["if-match"], blob.etag)) or (
        unmodified_since is not None and modified > unmodified_since
    ):
        raise AzureError(412, "ConditionNotMet", "The condition specified was not met.")
    modified_since = _header_date(h, "if-modified-since")
    either = []
    if "if-none-match" in h:
        either.append(not _etag_matches(h["if-none-match"], blob.etag))
    if modified_since is not None:
        either.append(modified > modified_since)
    if either and not any(either):
        raise AzureError(304, "ConditionNotMet", "The condition specified was not met.")


def _requested_range(headers: Mapping[str, str], size: int) -> tuple[int, int] | None:
    """The first and last byte asked for (``x-ms-range`` wins over ``Range``), cut at the end;
    None for the whole blob. 416 for a range that starts at or past the end."""
    name = "x-ms-range" if "x-ms-range" in headers else "range"
    spec = headers.get(name)
    if spec is None:
        return None
    m = _RANGE.fullmatch(spec.strip())
    if m is None or (m[2] and int(m[2]) < int(m[1])):
        raise AzureError(400, "InvalidHeaderValue", f"The value for the header {name} is invalid.")
    first = int(m[1])
    if first >= size:
        raise AzureError(
            416,
            "InvalidRange",
            "The range specified is invalid for the current size of the resource.",
            {"Content-Range": f"bytes */{size}"},
        )
    return first, min(int(m[2]) if m[2] else size - 1, size - 1)


def _properties(blob: Blob) -> dict[str, str]:
    return {
        "ETag": f'"{blob.etag}"',
        "Last-Modified": _http_date(blob.modified),
        "Content-Type": blob.content_type,
        "Accept-Ranges": "bytes",
        "x-ms-blob-type": "BlockBlob",
        "x-ms-lease-state": "available",
        "x-ms-lease-status": "unlocked",
        "x-ms-server-encrypted": "true",
        **(blob.copy.headers() if blob.copy is not None else {}),
    }


def _written(blob: Blob, status: int = 201) -> Answer:
    return Answer(
        status,
        {
            "ETag": f'"{blob.etag}"',
            "Last-Modified": _http_date(blob.modified),
            "x-ms-request-server-encrypted": "true",
        },
    )


def _refuse_conditional_write(req: Request) -> None:
    for name in (*_CONDITIONS, "x-ms-lease-id"):
        if name in req.headers:
            raise _not_emulated(f"the header {name} on a write")


# ---------------------------------------------------------------------------------------------
# The operations
# ---------------------------------------------------------------------------------------------


def create_container(service: BlobService, req: Request) -> Answer:
    """Create Container: 201, or 409 ``ContainerAlreadyExists``."""
    if not _CONTAINER_NAME.fullmatch(req.container):
        raise AzureError(400, "InvalidResourceName", "The specified resource name is invalid.")
    with service.lock:
        if req.container in service.containers:
            raise AzureError(409, "ContainerAlreadyExists", "The specified container exists.")
        service.containers[req.container] = Container()
        etag, modified = service.stamp()
    return Answer(201, {"ETag": f'"{etag}"', "Last-Modified": _http_date(modified)})


def list_blobs(service: BlobService, req: Request) -> Answer:
    """List Blobs: the committed blobs under ``prefix`` in name order, those with ``delimiter``
    after the prefix rolled up into one ``BlobPrefix``, at most ``maxresults`` entries from
    ``marker`` on, and the ``NextMarker`` that resumes after them."""
    q = req.query
    if "include" in q:
        raise _not_emulated("include in List Blobs")
    prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
    try:
        limit = int(q.get("maxresults", service.page_size))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_RESULTS:
        raise AzureError(
            400, "OutOfRangeQueryParameterValue", "maxresults is out of its range (1 to 5000)."
        )
    try:
        start = base64.urlsafe_b64decode(q.get("marker", "")).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AzureError(400, "InvalidQueryParameterValue", "The marker is invalid.") from None
    with service.lock:
        blobs = sorted(
            (name, blob)
            for name, blob in service.container(req.container).blobs.items()
            if name.startswith(prefix) and name >= start
        )
    # Entries in name order: a blob, or (blob None) a prefix that rolls up the names under it,
    # which sort together. A page ends before the first name of an entry it has no room for.
    entries: list[tuple[str, Blob | None]] = []
    next_name = ""
    for name, blob in blobs:
        cut = name.find(delimiter, len(prefix)) if delimiter else -1
        entry = (name[: cut + len(delimiter)], None) if cut >= 0 else (name, blob)
        if entry[1] is None and entries and entries[-1] == entry:
            continue
        if len(entries) == limit:
            next_name = name
            break
        entries.append(entry)

    root = ElementTree.Element(
        "EnumerationResults",
        ServiceEndpoint=f"http://{req.host}/{ACCOUNT}/",
        ContainerName=req.container,
    )
    for tag, key in [("Prefix", "prefix"), ("Marker", "marker"), ("MaxResults", "maxresults")]:
        if key in q:
            _child(root, tag, q[key])
    if delimiter:
        _child(root, "Delimiter", delimiter)
    listed = _child(root, "Blobs")
    for name, found in entries:
        if found is None:
            _child(_child(listed, "BlobPrefix"), "Name", name)
            continue
        item = _child(listed, "Blob")
        _child(item, "Name", name)
        props = _child(item, "Properties")
        for tag, text in [
            ("Last-Modified", _http_date(found.modified)),
            ("Etag", found.etag),
            ("Content-Length", str(len(found.data))),
            ("Content-Type", found.content_type),
            ("Content-MD5", found.content_md5),
            ("BlobType", "BlockBlob"),
            ("LeaseStatus", "unlocked"),
            ("LeaseState", "available"),
            ("ServerEncrypted", "true"),
        ]:
            _child(props, tag, text)
    marker = base64.urlsafe_b64encode(next_name.encode()).decode() if next_name else None
    _child(root, "NextMarker", marker)
    return Answer(200, {"Content-Type": "application/xml"}, _xml(root))


def _read_properties(blob: Blob) -> None:
    """A Get Blob Properties of `blob`: the last one a pending copy waits for ends it. Call
    with the lock held."""
    copy = blob.copy
    if copy is None or copy.status != "pending":
        return
    copy.reads_left -= 1
    if copy.reads_left <= 0:
        copy.status, copy.completed = copy.outcome, time.time()
        if copy.outcome == "success":
            blob.data = copy.data


def get_blob(service: BlobService, req: Request) -> Answer:
    """Get Blob (or, for ``HEAD``, Get Blob Properties): the whole blob 200, a range 206."""
    with service.lock:
        blob = service.blob(req.container, req.blob)
        _check_conditions(req, blob)
        if req.method == "HEAD":
            _read_properties(blob)
        headers = _properties(blob)
        data = blob.data
    wanted = None if req.method == "HEAD" else _requested_range(req.headers, len(data))
    if wanted is None:
        if blob.content_md5 is not None:
            headers["Content-MD5"] = blob.content_md5
        headers["Content-Length"] = str(len(data))
        return Answer(200, headers, b"" if req.method == "HEAD" else data)
    first, last = wanted
    headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
    if blob.content_md5 is not None:
        headers["x-ms-blob-content-md5"] = blob.content_md5
    return Answer(206, headers, data[first : last + 1])


def put_blob(service: BlobService, req: Request) -> Answer:
    """Put Blob: a block blob of the body, replacing any blob of that name."""
    _refuse_conditional_write(req)
    kind = req.headers.get("x-ms-blob-type")
    if kind is None:
        raise _missing_header("x-ms-blob-type")
    if kind != "BlockBlob":
        raise _not_emulated(f"x-ms-blob-type {kind}")
    content_type = req.headers.get(
        "x-ms-blob-content-type", req.headers.get("content-type", DEFAULT_CONTENT_TYPE)
    )
    md5 = base64.b64encode(hashlib.md5(req.body).digest()).decode()
    with service.lock:
        service.container(req.container)
        etag, modified = service.stamp()
        blob = Blob(req.body, etag, modified, content_type, md5, [])
        service.commit(req.container, req.blob, blob)
    answer = _written(blob)
    answer.headers["Content-MD5"] = md5
    return answer


def put_block(service: BlobService, req: Request) -> Answer:
    """Put Block: an uncommitted block of the blob, by its id (base64 of at most 64 bytes, all
    of one blob's ids of one length)."""
    _refuse_conditional_write(req)
    block_id = req.query.get("blockid", "")
    try:
        valid = 0 < len(base64.b64decode(block_id, validate=True)) <= 64
    except binascii.Error:
        valid = False
    if not valid:
        raise AzureError(
            400, "InvalidQueryParameterValue", f"The block id {block_id!r} is invalid."
        )
    with service.lock:
        container = service.container(req.container)
        if req.container == service.failing_container:
            raise AzureError(500, "InternalError", "Put Block fails in this container (test hook).")
        pending = container.uncommitted.get(req.blob, {})
        committed = container.blobs.get(req.blob)
        ids = [*pending, *(b for b, _ in committed.blocks)] if committed else [*pending]
        if any(len(other) != len(block_id) for other in ids):
            raise AzureError(
                400, "InvalidBlobOrBlock", "The specified blob or block content is invalid."
            )
        container.uncommitted.setdefault(req.blob, {})[block_id] = req.body
    md5 = base64.b64encode(hashlib.md5(req.body).digest()).decode()
    return Answer(201, {"Content-MD5": md5, "x-ms-request-server-encrypted": "true"})


def put_block_list(service: BlobService, req: Request) -> Answer:
    """Put Block List: the blob becomes the listed blocks, in order; its other uncommitted
    blocks are dropped. 400 ``InvalidBlockList`` for an id not found where the list says."""
    _refuse_conditional_write(req)
    try:
        root = ElementTree.fromstring(req.body)
    except ElementTree.ParseError:
        root = None
    if root is None or root.tag != "BlockList":
        raise AzureError(400, "InvalidXmlDocument", "XML specified is not syntactically valid.")
    with service.lock:
        container = service.container(req.container)
        pending = container.uncommitted.get(req.blob, {})
        current = container.blobs.get(req.blob)
        committed = current.committed_blocks() if current else {}
        where = {
            "Uncommitted": (pending,),
            "Committed": (committed,),
            "Latest": (pending, committed),
        }
        parts: list[tuple[str, bytes]] = []
        for el in root:
            block_id = (el.text or "").strip()
            found = [d[block_id] for d in where.get(el.tag, ()) if block_id in d]
            if not found:
                raise AzureError(400, "InvalidBlockList", "The specified block list is invalid.")
            parts.append((block_id, found[0]))
        etag, modified = service.stamp()
        content_type = req.headers.get("x-ms-blob-content-type", DEFAULT_CONTENT_TYPE)
        data = b"".join(d for _, d in parts)
        blob = Blob(data, etag, modified, content_type, None, [(b, len(d)) for b, d in parts])
        service.commit(req.container, req.blob, blob)
    return _written(blob)


def get_block_list(service: BlobService, req: Request) -> Answer:
    """Get Block List: the committed and/or uncommitted blocks (``blocklisttype``), ids and
    sizes; 404 for a name with neither."""
    kind = req.query.get("blocklisttype", "committed")
    if kind not in ("committed", "uncommitted", "all"):
        raise AzureError(400, "InvalidQueryParameterValue", f"blocklisttype {kind} is invalid.")
    with service.lock:
        container = service.container(req.container)
        blob = container.blobs.get(req.blob)
        pending = [(b, len(d)) for b, d in container.uncommitted.get(req.blob, {}).items()]
    if blob is None and not pending:
        raise _blob_not_found()
    root = ElementTree.Element("BlockList")
    for tag, blocks in [
        ("CommittedBlocks", blob.blocks if blob else []),
        ("UncommittedBlocks", pending),
    ]:
        if kind in ("all", tag.removesuffix("Blocks").lower()):
            section = _child(root, tag)
            for block_id, size in blocks:
                block = _child(section, "Block")
                _child(block, "Name", block_id)
                _child(block, "Size", str(size))
    headers = {"Content-Type": "application/xml"}
    if blob is not None:
        headers["ETag"] = f'"{blob.etag}"'
        headers["Last-Modified"] = _http_date(blob.modified)
        headers["x-ms-blob-content-length"] = str(len(blob.data))
    return Answer(200, headers, _xml(root))


def copy_blob(service: BlobService, req: Request) -> Answer:
    """Copy Blob from a blob of this account (``x-ms-copy-source``), done at once, or left
    pending into the hooks' containers (see the module's doc)."""
    _refuse_conditional_write(req)
    source_url = req.headers["x-ms-copy-source"]
    source = urlsplit(source_url).path.split("/")
    if len(source) < 4 or source[1] != ACCOUNT:
        raise _not_emulated("a copy from outside this account")
    with service.lock:
        try:
            src = service.blob(unquote(source[2]), unquote("/".join(source[3:])))
        except AzureError:
            raise AzureError(
                404, "CannotVerifyCopySource", "The specified blob does not exist."
            ) from None
        service.container(req.container)
        etag, modified = service.stamp()
        size = len(src.data)
        copy = Copy(str(uuid.uuid4()), source_url, "success", size, src.data, completed=modified)
        data = src.data
        if req.container in (service.pending_copy_container, service.failed_copy_container):
            copy.status, copy.completed, copy.reads_left = "pending", None, PENDING_READS
            if req.container == service.failed_copy_container:
                copy.outcome = "failed"
            data = src.data[: size // 2] + bytes(size - size // 2)
        blob = Blob(data, etag, modified, src.content_type, src.content_md5, [*src.blocks], copy)
        service.commit(req.container, req.blob, blob)
    answer = _written(blob, 202)
    answer.headers.update({"x-ms-copy-id": copy.id, "x-ms-copy-status": copy.status})
    return answer


def delete_blob(service: BlobService, req: Request) -> Answer:
    """Delete Blob: 202, or 404 for a blob that is not there."""
    _refuse_conditional_write(req)
    with service.lock:
        service.blob(req.container, req.blob)
        del service.container(req.container).blobs[req.blob]
    return Answer(202)


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


Operation = Callable[[BlobService, Request], Answer]

# The blob operations by method and `comp`, with the query parameters each takes.
_BLOB_OPERATIONS: dict[tuple[str, str | None], tuple[Operation, set[str]]] = {
    ("GET", None): (get_blob, set()),
    ("HEAD", None): (get_blob, set()),
    ("GET", "blocklist"): (get_block_list, {"comp", "blocklisttype"}),
    ("PUT", None): (put_blob, set()),  # or copy_blob, with x-ms-copy-source
    ("PUT", "block"): (put_block, {"comp", "blockid"}),
    ("PUT", "blocklist"): (put_block_list, {"comp"}),
    ("DELETE", None): (delete_blob, set()),
}
_LIST_PARAMETERS = {"restype", "comp", "prefix", "delimiter", "marker", "maxresults", "include"}


def _operation(req: Request) -> Operation:
    """The operation a request asks for; 501 for one not emulated, or a query parameter the
    operation does not take (``timeout`` aside, which every operation takes)."""
    q, m = req.query, req.method
    operation: Operation
    takes: set[str]
    if not req.blob:
        if m == "PUT" and q.get("restype") == "container" and "comp" not in q:
            operation, takes = create_container, {"restype"}
        elif m == "GET" and q.get("restype") == "container" and q.get("comp") == "list":
            operation, takes = list_blobs, _LIST_PARAMETERS
        else:
            raise _not_emulated(f"{m} {req.container} with the query {sorted(q)}")
    else:
        found = _BLOB_OPERATIONS.get((m, q.get("comp")))
        if found is None:
            raise _not_emulated(f"{m} on a blob with comp={q.get('comp')}")
        operation, takes = found
        if operation is put_blob and "x-ms-copy-source" in req.headers:
            operation = copy_blob
    extra = set(q) - takes - {"timeout"}
    if extra:
        raise _not_emulated(f"the query parameters {sorted(extra)} in {m}")
    return operation


class BlobServer(ThreadingHTTPServer):
    """The HTTP server of one `BlobService`."""

    def __init__(self, address: tuple[str, int], service: BlobService) -> None:
        super().__init__(address, BlobHandler)
        self.service = service


class BlobHandler(BaseHTTPRequestHandler):
    """Parses, authorizes and dispatches one request, and writes its answer."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_PUT = do_DELETE = do_POST = do_GET

    def _handle(self) -> None:
        try:
            req = self._request()
            self._authorize(req)
            answer = _operation(req)(cast(BlobServer, self.server).service, req)
        except AzureError as e:
            self._send_error(e)
        else:
            self._send(answer.status, answer.headers, answer.body)

    def _request(self) -> Request:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]},{value}" if name in headers else value
        if "transfer-encoding" in headers or (
            "content-length" not in headers and self.command == "PUT"
        ):
            self.close_connection = True  # a body of unknown length cannot be skipped
            raise AzureError(
                411, "MissingContentLengthHeader", "The Content-Length header is required."
            )
        body = self.rfile.read(int(headers.get("content-length", "0")))
        split = urlsplit(self.path)
        segments = split.path.split("/")
        if len(segments) < 3 or segments[1] != ACCOUNT or not segments[2]:
            raise _not_emulated(f"{self.command} {split.path}")
        return Request(
            method=self.command,
            container=unquote(segments[2]),
            blob=unquote("/".join(segments[3:])),
            query=dict(parse_qsl(split.query, keep_blank_values=True)),
            headers=headers,
            body=body,
            host=headers.get("host", ""),
        )

    def _authorize(self, req: Request) -> None:
        """Checks the Shared Key signature and the request's date (see the module's doc)."""
        given = req.headers.get("authorization")
        if given is None:  # anonymous: Azure hides a private container's resources
            raise AzureError(404, "ResourceNotFound", "The specified resource does not exist.")
        date = req.headers.get("x-ms-date", req.headers.get("date"))
        if date is None:
            raise _auth_failed("Request date header not specified.")
        try:
            when = parsedate_to_datetime(date)
        except (TypeError, ValueError):
            raise _auth_failed(f"The request date {date!r} is not an HTTP date.") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        if abs(time.time() - when.timestamp()) > MAX_CLOCK_SKEW_S:
            raise _auth_failed(f"Request date header too old: {date!r}.")
        expected = shared_key(req.method, self.path, req.headers)
        if not hmac.compare_digest(given.encode(), expected.encode()):
            to_sign = string_to_sign(req.method, self.path, req.headers)
            raise _auth_failed(
                f"The MAC signature found in the HTTP request '{given}' is not the same as any "
                f"computed signature. Server used following string to sign: '{to_sign}'."
            )
        if "x-ms-version" not in req.headers:
            raise _missing_header("x-ms-version")

    def _send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.send_response(status)
        self.send_header("x-ms-request-id", str(uuid.uuid4()))
        self.send_header("x-ms-version", VERSION)
        for name, value in headers.items():
            self.send_header(name, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, e: AzureError) -> None:
        headers = {"x-ms-error-code": e.code, **e.headers}
        if e.status == 304:  # no body, as for any 304
            self._send(e.status, headers, b"")
            return
        root = ElementTree.Element("Error")
        _child(root, "Code", e.code)
        _child(root, "Message", e.message)
        if e.detail is not None:
            _child(root, "AuthenticationErrorDetail", e.detail)
        self._send(e.status, {**headers, "Content-Type": "application/xml"}, _xml(root))


def _auth_failed(detail: str) -> AzureError:
    return AzureError(
        403,
        "AuthenticationFailed",
        "Server failed to authenticate the request. Make sure the value of Authorization header "
        "is formed correctly including the signature.",
        detail=detail,
    )


def main(argv: list[str] | None = None) -> None:
    """Serves the emulator on 127.0.0.1 until the process is terminated."""
    parser = argparse.ArgumentParser(description="An emulator of the Azure Blob service.")
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    parser.add_argument(
        "--failing-container", help="every Put Block into this container answers 500"
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=MAX_RESULTS,
        help=f"List Blobs' default maxresults (Azure's: {MAX_RESULTS})",
    )
    parser.add_argument(
        "--pending-copy-container",
        help="every Copy Blob into this container answers pending and succeeds later",
    )
    parser.add_argument(
        "--failed-copy-container",
        help="every Copy Blob into this container answers pending and fails later",
    )
    args = parser.parse_args(argv)
    service = BlobService(
        args.failing_container,
        args.page_size,
        args.pending_copy_container,
        args.failed_copy_container,
    )
    BlobServer(("127.0.0.1", args.port), service).serve_forever()


if __name__ == "__main__":
    main()
