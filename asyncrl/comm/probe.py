"""One all-reduce and one broadcast on a group, timed and checked: what ``asyncrl preflight`` asks of every rank of a
trainer group before a run, so that a rank that cannot reach the others, or a link far slower than expected, shows up
in seconds instead of at the first gradient all-reduce of step 1."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.comm import groups


@dataclass(frozen=True)
class CollectiveProbe:
    """One rank's view: ``nbytes`` all-reduced (sum) and broadcast (from rank 0) over ``world_size`` ranks on
    ``backend``, the seconds each took on this rank (after one small warm-up all-reduce, which opens the
    connections), and whether the values that came back are the expected ones."""

    rank: int
    world_size: int
    backend: str
    nbytes: int
    all_reduce_s: float
    broadcast_s: float
    correct: bool


def _timed(device: torch.device, op: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    op()
    if device.type == "cuda":  # NCCL's wait orders the stream, not the host: wait for the device itself
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def probe_group(
    pg: Any, rank: int, world_size: int, backend: str, device: torch.device, nbytes: int, timeout_s: float
) -> CollectiveProbe:
    """Run on every rank of the group at once; each collective gives up after ``timeout_s`` seconds (RuntimeError
    from c10d, or the local group's), so a rank that never takes part fails the others instead of hanging them."""
    n = max(1, nbytes // 4)
    groups.allreduce_sum(pg, torch.ones(1, device=device), groups.Deadline(timeout_s))
    x = torch.full((n,), float(rank + 1), device=device)
    reduce_s = _timed(device, lambda: groups.allreduce_sum(pg, x, groups.Deadline(timeout_s)))
    y = torch.full((n,), 7.0 if rank == 0 else 0.0, device=device)
    broadcast_s = _timed(device, lambda: groups.broadcast(pg, y, groups.Deadline(timeout_s)))
    want = world_size * (world_size + 1) / 2  # the sum of rank + 1 over the ranks
    correct = bool((x == want).all()) and bool((y == 7.0).all())
    return CollectiveProbe(rank, world_size, backend, n * 4, reduce_s, broadcast_s, correct)
