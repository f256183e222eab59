"""Packing parameters into flat buckets for a weight sync (pure torch, no torch.distributed).

Why buckets: one collective per parameter costs a round trip each (a Qwen2 layer has ~12 parameters), one collective
for the whole model needs a second full copy of the weights on both sides. Buckets of ``bucket_mb`` MiB bound both.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

MIB = 1 << 20  # bytes in one MiB (bucket_mb is in MiB)


@dataclass(frozen=True)
class ParamMeta:
    """Name, shape and dtype of one parameter: what both ends of a sync must agree on."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class BucketEntry:
    """One parameter's place in a bucket: ``offset`` and ``numel`` in elements of the bucket's dtype."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class Bucket:
    """A run of same-dtype parameters sent as one flat tensor of ``numel`` elements (``nbytes`` bytes)."""

    index: int
    dtype: torch.dtype
    entries: tuple[BucketEntry, ...]

    @property
    def numel(self) -> int:
        return sum(e.numel for e in self.entries)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @classmethod
    def of(cls, index: int, metas: Sequence[ParamMeta]) -> Bucket:
        """The bucket holding ``metas`` in order (all of one dtype)."""
        if not metas:
            raise ValueError(f"bucket {index}: a bucket needs at least one parameter")
        dtype = metas[0].dtype
        entries: list[BucketEntry] = []
        offset = 0
        for m in metas:
            if m.dtype != dtype:
                raise ValueError(f"bucket {index}: parameter {m.name!r} is {m.dtype}, the bucket holds {dtype}")
            entries.append(BucketEntry(m.name, tuple(m.shape), offset, m.numel))
            offset += m.numel
        return cls(index, dtype, tuple(entries))


def metas_of(named_tensors: Mapping[str, torch.Tensor]) -> list[ParamMeta]:
    """``ParamMeta`` of every (name, tensor), in order."""
    return [ParamMeta(name, tuple(t.shape), t.dtype) for name, t in named_tensors.items()]


def plan_buckets(metas: Sequence[ParamMeta], bucket_mb: float) -> list[Bucket]:
    """Pack ``metas`` in order into buckets of at most ``bucket_mb`` MiB each.

    A new bucket starts when the next parameter would overflow the current one or has another dtype (a flat tensor
    has one dtype); a parameter larger than ``bucket_mb`` gets a bucket of its own rather than being split. Names must
    be unique (they key the tensors).
    """
    if not bucket_mb > 0:
        raise ValueError(f"plan_buckets: bucket_mb must be > 0 (MiB), got {bucket_mb}")
    max_bytes = max(1, int(bucket_mb * MIB))
    seen: set[str] = set()
    groups: list[list[ParamMeta]] = []
    current: list[ParamMeta] = []
    current_bytes = 0
    for m in metas:
        if m.name in seen:
            raise ValueError(f"plan_buckets: parameter {m.name!r} is listed twice")
        seen.add(m.name)
        fits = current and m.dtype == current[0].dtype and current_bytes + m.nbytes <= max_bytes
        if current and not fits:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(m)
        current_bytes += m.nbytes
    if current:
        groups.append(current)
    return [Bucket.of(i, g) for i, g in enumerate(groups)]


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The bucket's parameters flattened and concatenated into one 1-D tensor of ``bucket.dtype``.

    For a one-parameter bucket of a contiguous tensor the result is a view of that tensor (no copy): do not modify
    it in place. Raises ValueError naming the parameter and bucket when one is missing or has the wrong shape/dtype.
    """
    flats: list[torch.Tensor] = []
    for e in bucket.entries:
        t = tensors.get(e.name)
        if t is None:
            raise ValueError(f"pack: bucket {bucket.index} needs parameter {e.name!r}, which was not given")
        if tuple(t.shape) != e.shape or t.dtype != bucket.dtype:
            raise ValueError(
                f"pack: parameter {e.name!r} (bucket {bucket.index}) is {list(t.shape)} {t.dtype}, "
                f"the plan says {list(e.shape)} {bucket.dtype}"
            )
        flats.append(t.detach().reshape(-1))
    return flats[0] if len(flats) == 1 else torch.cat(flats)


def unpack(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter of the bucket: views into ``flat`` with the parameters' shapes."""
    if flat.dim() != 1 or flat.numel() != bucket.numel or flat.dtype != bucket.dtype:
        raise ValueError(
            f"unpack: bucket {bucket.index} expects a flat {bucket.dtype} tensor of {bucket.numel} elements, "
            f"got {flat.dtype} of shape {list(flat.shape)}"
        )
    return [(e.name, flat[e.offset : e.offset + e.numel].view(e.shape)) for e in bucket.entries]


def as_bytes(flat: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D ``uint8`` view of ``flat`` (its raw bytes): the transport sends bytes, whatever the dtype."""
    return flat.detach().contiguous().reshape(-1).view(torch.uint8)


def checksum(flat: torch.Tensor) -> int:
    """CRC32 of the tensor's bytes (an int in [0, 2**32)): deterministic, detects any single flipped element.

    ~2 GB/s on one CPU core; a tensor on an accelerator is copied to the host first.
    """
    raw = as_bytes(flat)
    if raw.device.type != "cpu":
        raw = raw.cpu()
    return zlib.crc32(memoryview(raw.numpy())) & 0xFFFFFFFF


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype
