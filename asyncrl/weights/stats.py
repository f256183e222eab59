"""What one weight sync cost, and the in-process copy speed to compare it with."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SyncStats:
    """Cost of one sync as seen by one rank. ``seconds``: its transport time (on the trainer from the first bucket's
    header to the last bucket sent, packing and checksums included; on a rollout worker the time spent waiting for
    buckets and checking them); ``bytes``: the parameter payload, headers excluded; ``apply_seconds``: the rest of a
    rollout worker's sync, copying each bucket into its model while the next one is received (0 on the trainer)."""

    seconds: float
    bytes: int
    bytes_per_s: float
    buckets: int
    apply_seconds: float = 0.0

    @classmethod
    def measured(cls, seconds: float, nbytes: int, buckets: int, apply_seconds: float = 0.0) -> SyncStats:
        seconds = max(seconds, 1e-9)  # a zero-byte or instantaneous sync must not divide by zero
        return cls(seconds, nbytes, nbytes / seconds, buckets, apply_seconds)

    @property
    def total_seconds(self) -> float:
        """Transport plus apply: how long the rank was busy with this sync."""
        return self.seconds + self.apply_seconds


def memcpy_bytes_per_s(nbytes: int, repeats: int = 3) -> float:
    """Bytes per second of an in-process ``copy_`` of ``nbytes`` bytes (best of ``repeats``), on the CPU: the limit to
    report beside a sync's ``bytes_per_s``, since a sync over loopback moves the same bytes at least once through
    memory."""
    if nbytes <= 0:
        raise ValueError(f"memcpy_bytes_per_s: nbytes must be > 0, got {nbytes}")
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults are not the copy's cost
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / max(best, 1e-9)
