"""The trainer's one update loop, for every role and every algorithm: mini-batches, micro-batches, gradient
accumulation, data-parallel ranks, non-finite steps and the optimizer step.

``optimize`` minimises a micro-batch loss it is handed (the critic's value loss, or a policy ``Objective``'s loss
through ``fit``); it never asks which algorithm made the batch: what differs between objectives comes in as data
(``weight``, ``keep_rows``, ``rows_per_unit``).

Mixed precision (fp32 master weights, ``MasterWeightsAdamW`` where any parameter is not fp32): docs/gpu.md,
"Precision".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor

from asyncrl import losses
from asyncrl.config import ActorConfig, CriticConfig
from asyncrl.data.collate import Batching, Objective, TrainBatch, count_weight, micro_batches
from asyncrl.data.packing import TokenCount
from asyncrl.models.device import to_device
from asyncrl.trainer.data_parallel import DataParallel
from asyncrl.trainer.forward import batching, forward_logits, model_device

if TYPE_CHECKING:
    from asyncrl.config.training import OptimConfig

MicroLoss = Callable[[TrainBatch], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class FitStats:
    """What one call of the update loop did: its metrics (``{prefix}/nonfinite_skipped_steps`` too) and steps taken."""

    metrics: dict[str, float]
    optimizer_steps: int


def fit(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    actor: ActorConfig,
    num_mini_batches: int,
    seed: int,
    dp: DataParallel | None = None,
) -> FitStats:
    """The policy's update on ``batch``: its ``Objective``'s loss on every micro-batch (logits at the objective's
    temperature); the batch's ``ref_logp_BT`` / ``old_logp_BT`` are filled already where the objective needs them.
    With ``compares_behaviour``, the forwards made with the weights the update started from also measure the gap to
    the rollout's log-probs (``rollout_corr/logprob_diff_*``)."""
    objective = batch.policy
    if not isinstance(objective, Objective):
        raise TypeError(f"policy update: the batch's policy target is {type(objective).__name__}, not an Objective")
    gap = LogprobGap() if objective.compares_behaviour else None
    first = scheduler.last_epoch  # forwards before the first optimizer step see the weights the update started from
    agg = actor.loss_agg_mode

    def micro_loss(mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        target: Objective = mb.policy  # type: ignore[assignment]
        logits = forward_logits(model, mb, target.temperature)
        logp = losses.logprobs_from_logits(logits, mb.response_ids_BT)
        if gap is not None and scheduler.last_epoch == first:
            gap.add(logp, mb.behav_logp_BT, mb.response_mask_BT)
        return target.loss(logits, logp, mb, agg)

    res = optimize(
        model,
        optimizer,
        scheduler,
        batch,
        actor,
        num_mini_batches,
        seed,
        micro_loss,
        weight=lambda b: b.policy.weight(b, agg),  # type: ignore[union-attr] - the objective, sliced with b
        keep_rows=lambda b: b.policy.keep_rows(b),  # type: ignore[union-attr]
        rows_per_unit=objective.rows_per_unit,
        dp=dp,
    )
    if gap is not None:
        if dp is not None:
            gap = LogprobGap.merged(dp.all_gather_object(gap))
        res.metrics.update(gap.metrics())
    return res


def optimize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    role: ActorConfig | CriticConfig,
    num_mini_batches: int,
    seed: int,
    micro_loss: MicroLoss,
    prefix: str = "actor",
    weight: Callable[[TrainBatch], float] | None = None,
    keep_rows: Callable[[TrainBatch], torch.Tensor | None] | None = None,
    rows_per_unit: int = 1,
    dp: DataParallel | None = None,
) -> FitStats:
    """``role.ppo_epochs`` passes over ``batch`` in ``num_mini_batches`` optimizer steps each, minimising
    ``micro_loss(micro_batch)``; ``prefix`` names its grad-norm, lr and skipped-step metrics.

    Gradients are accumulated over micro-batches, each scaled by ``weight(micro) / weight(mini-batch)``, so that the
    accumulated gradient equals the gradient of the loss aggregated over the whole mini-batch (default weight: the
    token count for token-mean, the count of sequences with a token for the seq-mean modes). A non-finite loss or
    gradient norm skips that optimizer step (counted): NaN/inf never reaches the weights. ``keep_rows(mini_batch)``
    (a bool per row, or None) leaves out rows whose loss gradient is known to be zero; the weights above still count
    them, so the accumulated gradient does not change; the share left out is ``{prefix}/skipped_rows_frac``.

    ``rows_per_unit`` > 1: rows ``k * n .. k * n + n - 1`` are one unit (online DPO's chosen and rejected): the
    permutation, the mini-batches, the ranks' shares and the micro-batches (``ppo_micro_batch_size // n`` units,
    padded, never packed) are cut by units.

    With ``dp`` each rank fits its share of every mini-batch and steps with the whole mini-batch's gradient
    (``asyncrl.trainer.data_parallel``); the loss statistics are the whole mini-batch's too, the micro-batch counts
    (``{prefix}/micro_batches`` and the like) rank 0's.
    """
    model.train()
    gen = torch.Generator().manual_seed(seed)
    weight = weight or (lambda b: count_weight(b, role.loss_agg_mode))
    means: dict[str, list[float]] = {}  # each metric's value per mini-batch, averaged at the end
    clip = role.optim.grad_clip if role.optim.grad_clip > 0 else float("inf")
    params = [p for p in model.parameters() if p.requires_grad]
    device = model_device(model)  # a GPU's even where offloaded shards live on the host
    steps = skipped = rows_left_out = 0
    skipping = False
    how = batching(role, prefix)
    count = TokenCount()
    n = rows_per_unit
    for _epoch in range(role.ppo_epochs):
        perm = torch.randperm(batch.size // n, generator=gen)
        for mini_units in perm.chunk(num_mini_batches):
            mini = batch.select(unit_rows(mini_units, n))
            total = weight(mini)  # the whole mini-batch's, before the ranks take their shares
            if dp is not None:
                mini = mini.select(dp.share(mini) if n == 1 else unit_rows(dp.rows(mini.size // n), n))
            kept = keep_rows(mini) if keep_rows is not None else None
            if kept is not None:
                skipping = True
                kept = kept.nonzero().flatten()
                rows_left_out += mini.size - len(kept)
                mini = mini.select(kept)
            optimizer.zero_grad(set_to_none=True)
            if mini.size == 0:  # every row left out: a zero gradient, and the optimizer still steps as it would
                for p in params:
                    p.grad = torch.zeros_like(p)
            finite = True
            stats: dict[str, float] = {}
            weights = 0.0
            mbs = micro_batches(mini, how, count) if n == 1 else unit_micro_batches(mini, n, how, count)
            # FSDP2: forwards and backwards are collectives, so every rank runs as many as the rank with the most
            # micro-batches (agreed before any runs): a dropped loss still runs its backward, idle passes do the rest
            left = dp.rounds(len(mbs)) if dp is not None and dp.sharded else 0
            for _, mb in mbs:
                mb = to_device(mb, device)  # the batch crossed to this worker on the CPU
                share = weight(mb) / total if total > 0 else 0.0
                loss, mb_stats = micro_loss(mb)
                left -= 1
                if not torch.isfinite(loss):
                    finite = False
                    if dp is not None and dp.sharded:
                        (loss * 0.0).backward()
                    break
                (loss * share).backward()
                if mb_stats:
                    weights += share
                    for k, v in mb_stats.items():
                        stats[k] = stats.get(k, 0.0) + share * v
            # the ranks' gradients summed, ``stats`` recorded (weighted sums, divided by ``weights``), clipped, stepped
            if dp is not None:
                for _ in range(left):
                    dp.idle_pass(model)
                finite, stats, weights = across_ranks(dp, finite, stats, weights)
                if finite and not dp.sharded:  # FSDP2 reduced the gradients inside backward
                    dp.all_reduce_grads(params)
            for k, v in stats.items():  # weighted as the loss is: the same whatever the micro-batches
                means.setdefault(k, []).append(float(v / weights if weights > 0 else v))
            norm = torch.nn.utils.clip_grad_norm_(grads_to_clip(params, optimizer), clip)  # fp32 masters' gradients
            grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP2: the whole norm
            if not finite or not math.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            means.setdefault(f"{prefix}/grad_norm", []).append(grad_norm)
            optimizer.step()
            scheduler.step()
            steps += 1
    metrics = {k: sum(v) / len(v) for k, v in means.items()}
    metrics[f"{prefix}/lr"] = float(scheduler.get_last_lr()[0])
    metrics[f"{prefix}/nonfinite_skipped_steps"] = float(skipped)
    metrics.update(count.metrics(prefix))
    if skipping:
        if dp is not None:
            rows_left_out = sum(dp.all_gather_object(rows_left_out))
        metrics[f"{prefix}/skipped_rows_frac"] = rows_left_out / max(batch.size * role.ppo_epochs, 1)
    optimizer.zero_grad(set_to_none=True)
    return FitStats(metrics=metrics, optimizer_steps=steps)


def unit_rows(units: torch.Tensor, n: int) -> torch.Tensor:
    """The rows of ``units`` (unit k = rows k * n .. k * n + n - 1), unit by unit."""
    return (units[:, None] * n + torch.arange(n)).reshape(-1)


def unit_micro_batches(
    batch: TrainBatch, n: int, how: Batching, count: TokenCount
) -> list[tuple[torch.Tensor, TrainBatch]]:
    """``batch``'s units in order, ``max(1, micro_batch_size // n)`` units per padded micro-batch (cut to its own
    longest prompt and response)."""
    out = []
    per = max(1, how.micro_batch_size // n)
    for units in torch.arange(batch.size // n).split(per):
        idx = unit_rows(units, n)
        mb = batch.select(idx).trimmed()
        real = int(mb.attention_mask_BL.sum())
        count.add(TokenCount(mb.input_ids_BL.numel(), real, real))
        out.append((idx, mb))
    return out


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


@dataclass
class LogprobGap:
    """|trainer log-prob - rollout log-prob| per response token, over the forwards made with the weights an update
    started from (verl's rollout/trainer probability difference): engine numerics plus the policy's staleness."""

    total: float = 0.0
    tokens: int = 0
    max: float = 0.0

    def add(self, logp_BT: torch.Tensor, behav_BT: torch.Tensor, mask_BT: torch.Tensor) -> None:
        real = mask_BT.bool()
        if not bool(real.any()):
            return
        diff = (logp_BT.detach().float() - behav_BT.float()).abs()[real]
        self.total += float(diff.sum())
        self.tokens += int(diff.numel())
        self.max = max(self.max, float(diff.max()))

    @classmethod
    def merged(cls, parts: list[LogprobGap]) -> LogprobGap:
        """One gap over the tokens of several (the data-parallel ranks' shares)."""
        return cls(sum(p.total for p in parts), sum(p.tokens for p in parts), max((p.max for p in parts), default=0.0))

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {"rollout_corr/logprob_diff_mean": self.total / self.tokens, "rollout_corr/logprob_diff_max": self.max}


# ---- the optimizer --------------------------------------------------------------------------------------------------
class MasterWeightsAdamW(torch.optim.AdamW):
    """AdamW over fp32 masters of low-precision parameters. ``grads_in_fp32`` moves the model's gradients onto the
    masters (to clip them in fp32); ``step`` does that when it was not done, steps, and copies the masters back. Its
    ``state_dict`` holds the masters, so a resumed run continues from the fp32 weights, not their rounding."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **kwargs: Any):
        self.model_params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.model_params]
        super().__init__(self.masters, **kwargs)
        self._moved = False

    def grads_in_fp32(self) -> list[torch.Tensor]:
        """The model's gradients, cast to fp32, onto the masters (the model's are freed); returns the masters."""
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.detach().float()
            p.grad = None
        self._moved = True
        return self.masters

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if not self._moved:
            self.grads_in_fp32()
        self._moved = False
        loss = super().step(closure)
        for p, m in zip(self.model_params, self.masters):
            p.copy_(m)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params:
            p.grad = None
        self._moved = False
        super().zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["master_weights"] = [m.detach().clone() for m in self.masters]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        masters = state.pop("master_weights", None)
        super().load_state_dict(state)
        if masters is None:  # a checkpoint of an fp32 run: start the masters from the model's weights
            return
        if len(masters) != len(self.masters):
            raise ValueError(f"optimizer state: {len(masters)} master weights for {len(self.masters)} parameters")
        with torch.no_grad():
            for p, m, saved in zip(self.model_params, self.masters, masters):
                m.copy_(saved)
                p.copy_(m)


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW with ``optim``'s lr, betas and weight decay: ``MasterWeightsAdamW`` when any parameter is below fp32."""
    params = list(params)
    adamw = MasterWeightsAdamW if any(p.dtype != torch.float32 for p in params) else torch.optim.AdamW
    beta1, beta2 = optim.betas
    return adamw(params, lr=optim.lr, betas=(beta1, beta2), weight_decay=optim.weight_decay)


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The lr ramps linearly from lr / warmup_steps to lr over the first ``warmup_steps`` updates, then holds."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )


def grads_to_clip(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> Sequence[torch.Tensor]:
    """The gradients a step clips and takes: the fp32 masters' under ``MasterWeightsAdamW``, else the model's."""
    return optimizer.grads_in_fp32() if isinstance(optimizer, MasterWeightsAdamW) else params
