"""One checkpoint loaded by every rank of a ``torch.distributed`` group, each byte read once.

The load's buffer is cut into W equal contiguous pieces (padded at its end to a multiple of W);
rank r reads from storage only the file bytes that land in piece r, then the ranks exchange the
pieces in place (one ``all_gather_into_tensor`` on GPUs, W broadcasts on the host), so every
rank ends with the whole buffer and no second full-size buffer exists. Before anything is read
the ranks compare a digest of what they opened, and after reading they tell each other whether
their reads succeeded: a rank that fails makes every rank raise instead of leaving the others
waiting in a collective. The division and the comparison are plain functions (no torch), so
they are tested without a process group.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

# A run of file bytes and where it lands in the buffer: path, file begin, file end, buffer at.
Run = tuple[str, int, int, int]

DIGEST_BYTES = 32
# What a rank contributes when it could not open the checkpoint: sha256 never yields it.
FAILED = bytes(DIGEST_BYTES)


def shares(size: int, world: int) -> tuple[int, int]:
    """Return ``(padded, piece)`` for a buffer of `size` bytes shared by `world` ranks.

    `padded` is `size` rounded up to a multiple of `world`; each rank's piece is
    ``padded // world`` bytes.
    """
    if world < 1:
        raise ValueError(f"a process group has at least one rank, not {world}")
    piece = -(-size // world)
    return piece * world, piece


def rank_runs(runs: Sequence[Run], lo: int, hi: int) -> list[Run]:
    """Return the parts of `runs` whose buffer bytes fall in ``lo..hi`` (one rank's piece).

    Buffer bytes between runs (alignment gaps) and the padding past the last run are read by
    nobody; the exchange carries them as they are and no tensor view covers them.
    """
    out: list[Run] = []
    for path, begin, end, at in runs:
        a, b = max(at, lo), min(at + (end - begin), hi)
        if a < b:
            out.append((path, begin + (a - at), begin + (b - at), a))
    return out


def plan_digest(
    files: Sequence[str],
    metadata: dict[str, str] | None,
    tensors: Sequence[tuple[str, str, list[int], int]],
    runs: Sequence[Run],
    size: int,
    device_kind: str,
) -> bytes:
    """Return a digest of everything the ranks must agree on before sharing one buffer.

    `tensors` is ``(name, dtype, shape, buffer offset)`` per selected tensor and `runs` the
    file ranges read into the buffer; a path is replaced by its position in `files`, so ranks
    may name the same checkpoint by different paths (another mount, a relative name).
    """
    where = {p: i for i, p in enumerate(files)}
    plan = {
        "files": len(files),
        "metadata": metadata,
        "tensors": [list(t) for t in tensors],
        "runs": [[where.get(p, -1), b, e, at] for p, b, e, at in runs],
        "size": size,
        "device": device_kind,
    }
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).digest()


def disagreement(digests: Sequence[bytes]) -> str | None:
    """Return why the ranks cannot share one load (naming the ranks), or None when they agree.

    A rank that sent `FAILED` raises its own error; the others are told which rank failed.
    """
    failed = [r for r, d in enumerate(digests) if d == FAILED]
    if failed:
        return (
            f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of the "
            "process group could not open the checkpoint (the error is raised there)"
        )
    # Against the most common digest, so one odd rank is named even when it is rank 0.
    counts: dict[bytes, int] = {}
    for d in digests:
        counts[d] = counts.get(d, 0) + 1
    common = max(counts, key=lambda d: (counts[d], -digests.index(d)))
    odd = [r for r, d in enumerate(digests) if d != common]
    if not odd:
        return None
    agree = [r for r, d in enumerate(digests) if d == common]
    return (
        f"rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} of the process group "
        f"opened different files or tensors than rank {agree[0]}: every rank must pass the "
        "same checkpoint, tensor_filter and device kind"
    )


class Group:
    """A ``torch.distributed`` process group as a load uses it (torch imported here only)."""

    def __init__(self, process_group: Any, device_kind: str | None, device_index: int | None):
        import torch  # type: ignore[import-not-found, unused-ignore]
        import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "process_group needs torch.distributed initialised (init_process_group)"
            )
        self.torch, self.dist, self.pg = torch, dist, process_group
        self.rank = int(dist.get_rank(process_group))
        self.world = int(dist.get_world_size(process_group))
        if self.rank < 0:
            raise ValueError("this process is not a member of the process_group it passed")
        backend = str(dist.get_backend(process_group)).lower()
        # Small messages go where the group's backend takes host tensors (gloo), else to the
        # load's GPU (an NCCL group takes GPU tensors only).
        if "gloo" in backend:
            self.control = torch.device("cpu")
        elif device_kind == "cuda" and device_index is not None:
            self.control = torch.device("cuda", device_index)
        else:
            self.control = torch.device("cuda", torch.cuda.current_device())
        self.backend = backend

    def check_device(self, device_kind: str) -> None:
        """Refuse a host load on a group without a host backend (NCCL moves GPU memory)."""
        if device_kind == "cpu" and "gloo" not in self.backend and "mpi" not in self.backend:
            raise ValueError(
                f"a {self.backend!r} process group moves GPU memory only: load onto "
                "device='cuda:N', or pass a gloo group for device='cpu'"
            )

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Return every rank's `payload` (all ranks send the same number of bytes)."""
        torch = self.torch
        mine = torch.tensor(list(payload), dtype=torch.uint8, device=self.control)
        # A list of small tensors, which every backend gathers (gloo stages them anyway).
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(out, mine, group=self.pg)
        return [bytes(t.cpu().tolist()) for t in out]

    def exchange(self, buf: Any, piece: int) -> None:
        """Fill every rank's `buf` (``world * piece`` bytes) from piece r of rank r, in place."""
        if piece == 0:
            return
        # numpy and CuPy buffers are shared with torch, not copied (buffer protocol, CAI).
        buf = buf if isinstance(buf, self.torch.Tensor) else self.torch.as_tensor(buf)
        if buf.device.type == "cuda":
            # NCCL gathers in place when the input is the output's piece `rank`.
            mine = buf[self.rank * piece : (self.rank + 1) * piece]
            self.dist.all_gather_into_tensor(buf, mine, group=self.pg)
            return
        # gloo's all-gather stages the whole output in a temporary; broadcasts do not.
        for r in range(self.world):
            src = self.dist.get_global_rank(self.pg, r)
            self.dist.broadcast(buf[r * piece : (r + 1) * piece], src=src, group=self.pg)


def read_failure(status: Sequence[bytes]) -> str | None:
    """Return which ranks failed to read their piece (a nonzero status byte), or None."""
    failed = [r for r, s in enumerate(status) if s != b"\x00"]
    if not failed:
        return None
    return (
        f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of the process "
        "group could not read its share of the checkpoint (the error is raised there)"
    )
