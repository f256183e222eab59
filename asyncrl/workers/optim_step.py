"""The end of a mini-batch, shared by every update (``policy_ops.optimize``, ``preference_ops.dpo_update``): the
data-parallel ranks agree on it, the loss statistics are recorded, the gradient is clipped, and the optimizer steps,
unless the loss or the gradient norm was not finite (then the step is skipped and counted: NaN/inf never reaches the
weights)."""

from __future__ import annotations

import math

import torch

from asyncrl.config import ActorConfig, CriticConfig
from asyncrl.workers.data_parallel import DataParallel
from asyncrl.workers.fsdp import to_float


class Means:
    """Running means of named metrics over a call's mini-batches."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.counts[key] = self.counts.get(key, 0) + 1

    def result(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums}


def across_ranks(
    dp: DataParallel, finite: bool, stats: dict[str, float], weights: float
) -> tuple[bool, dict[str, float], float]:
    """A mini-batch's outcome over all ranks: finite only if every rank's loss was; the weighted statistics and their
    weights summed (each rank weighted its rows by their share of the whole mini-batch)."""
    parts = dp.all_gather_object((finite, stats, weights))
    merged: dict[str, float] = {}
    for _, s, _ in parts:
        for k, v in s.items():
            merged[k] = merged.get(k, 0.0) + v
    return all(f for f, _, _ in parts), merged, sum(w for _, _, w in parts)


def finish_mini_batch(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: ActorConfig | CriticConfig,
    dp: DataParallel | None,
    finite: bool,
    stats: dict[str, float],
    weights: float,
    means: Means,
    prefix: str,
) -> bool:
    """After a mini-batch's backward passes: sum the ranks' gradients, record ``stats`` (weighted sums, divided by
    ``weights``), clip, and step. Returns whether the optimizer stepped."""
    if dp is not None:
        finite, stats, weights = across_ranks(dp, finite, stats, weights)
        if finite and not dp.sharded:  # FSDP2 reduced the gradients inside backward
            dp.all_reduce_grads(params)
    for k, v in stats.items():  # weighted as the loss is: the same whatever the micro-batches
        means.add(k, v / weights if weights > 0 else v)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = to_float(torch.nn.utils.clip_grad_norm_(params, clip))  # sharded: the whole gradient's norm
    if not finite or not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return False
    means.add(f"{prefix}/grad_norm", grad_norm)
    optimizer.step()
    scheduler.step()
    return True
