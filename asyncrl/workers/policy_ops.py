"""Model-side training operations: response log-probs, the policy-gradient update and the distillation update.

These functions hold no role or schedule logic: a worker calls them with a model, an optimizer and a ``TrainBatch``
whose ``policy`` target says what to fit (``PolicyTarget``: advantages and old/ref log-probs; ``TeacherTarget``: the
teacher's top-k). The losses themselves are the pure functions of ``asyncrl.losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from asyncrl import losses
from asyncrl.config import ActorConfig, CriticConfig, DistillConfig, RolloutCorrectionConfig
from asyncrl.data.collate import Batching, TrainBatch, micro_batches
from asyncrl.data.packing import TokenCount
from asyncrl.data.targets import PolicyTarget, TeacherTarget
from asyncrl.workers.data_parallel import DataParallel, Lockstep
from asyncrl.workers.optim_step import Means, finish_mini_batch


def model_inputs(mb: TrainBatch, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The keyword arguments of a transformers forward over ``mb``: its padded rows, or its packed rows with their
    4D attention mask in the model's ``dtype``."""
    if mb.packed is not None:
        p = mb.packed
        return dict(input_ids=p.input_ids_RW, attention_mask=p.attention_mask(dtype), position_ids=p.position_ids_RW)
    return dict(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL, position_ids=mb.position_ids_BL)


def at_responses(out_RLH: torch.Tensor, mb: TrainBatch) -> torch.Tensor:
    """The outputs (logits, hidden states) at the positions predicting each response token: [B, T, H]."""
    if mb.packed is not None:
        return out_RLH.reshape(-1, out_RLH.shape[-1])[mb.packed.src_BT]
    T = mb.response_ids_BT.shape[1]
    return out_RLH[:, mb.prompt_width - 1 : mb.prompt_width - 1 + T]


def _forward_logits(model: torch.nn.Module, mb: TrainBatch, temperature: float) -> torch.Tensor:
    """Logits predicting each response token, scaled by the sampling temperature: [B, T, V]."""
    out = model(**model_inputs(mb, next(model.parameters()).dtype))
    logits = at_responses(out.logits, mb).float()
    return logits / temperature if temperature > 0 else logits


def batching(cfg: ActorConfig | CriticConfig, role: str = "actor") -> Batching:
    """The role's micro-batching: ``ppo_micro_batch_size`` samples, or ``ppo_max_token_len_per_gpu`` tokens with
    ``use_dynamic_bsz``; ``shared_prefix`` packs a group's responses behind one copy of its prompt."""
    return Batching(
        cfg.ppo_micro_batch_size,
        share_prefix=cfg.shared_prefix,
        max_tokens=cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
        knob=f"{role}.ppo_max_token_len_per_gpu",
    )


def response_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float, how: Batching | int
) -> torch.Tensor:
    """Per-token log-probs of the batch's responses under ``model`` (no grad), in micro-batches: [B, T]."""
    was_training = model.training
    model.eval()
    out = torch.zeros_like(batch.response_mask_BT)
    with torch.inference_mode():
        for idx, mb in micro_batches(batch, how):
            logits = _forward_logits(model, mb, temperature)
            out[idx, : mb.response_mask_BT.shape[1]] = (
                losses.logprobs_from_logits(logits, mb.response_ids_BT) * mb.response_mask_BT
            )
    model.train(was_training)
    return out


@dataclass
class UpdateResult:
    metrics: dict[str, float]
    optimizer_steps: int
    skipped_nonfinite: int


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    actor: ActorConfig,
    correction: RolloutCorrectionConfig,
    temperature: float,
    num_mini_batches: int,
    seed: int,
    dp: DataParallel | None = None,
) -> UpdateResult:
    """``actor.ppo_epochs`` passes over ``batch`` in ``num_mini_batches`` optimizer steps each, PPO-clip loss
    (``dp``: this rank's share of each mini-batch, see ``optimize``).

    With ``actor.skip_zero_adv_rows`` (and no entropy bonus or KL loss, the only terms a row with all-zero advantages
    adds to), such rows skip the forward and backward passes: their policy-gradient term is exactly zero, and the
    aggregation weights still count them, so the gradient is the same while the work shrinks by the share of GRPO
    groups with no reward spread. The per-token statistics (``actor/entropy``, clip fractions) are then taken over
    the rows that were trained on."""
    low = actor.clip_ratio if actor.clip_ratio_low is None else actor.clip_ratio_low
    high = actor.clip_ratio if actor.clip_ratio_high is None else actor.clip_ratio_high
    skip = actor.skip_zero_adv_rows and actor.entropy_coeff == 0 and not actor.use_kl_loss
    gap = LogprobGap()
    first = scheduler.last_epoch  # forwards before the first optimizer step see the weights the update started from

    def micro_loss(mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return _micro_loss(
            model, mb, actor, correction, temperature, low, high, gap if scheduler.last_epoch == first else None
        )

    res = optimize(
        model,
        optimizer,
        scheduler,
        batch,
        actor,
        num_mini_batches,
        seed,
        micro_loss,
        keep_rows=(lambda mb: (_policy(mb).advantages_BT != 0).any(dim=1)) if skip else None,
        dp=dp,
    )
    if dp is not None:
        gap = LogprobGap.merged(dp.all_gather_object(gap))
    res.metrics.update(gap.metrics())
    return res


class LogprobGap:
    """|trainer log-prob - rollout log-prob| per response token, over the forwards made with the weights an update
    started from (verl's rollout/trainer probability difference): engine numerics plus the policy's staleness."""

    def __init__(self) -> None:
        self.total = 0.0
        self.tokens = 0
        self.max = 0.0

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
        out = cls()
        out.total, out.tokens = sum(p.total for p in parts), sum(p.tokens for p in parts)
        out.max = max((p.max for p in parts), default=0.0)
        return out

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {"rollout_corr/logprob_diff_mean": self.total / self.tokens, "rollout_corr/logprob_diff_max": self.max}


def distill_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    actor: ActorConfig,
    distill: DistillConfig,
    num_mini_batches: int,
    seed: int,
    dp: DataParallel | None = None,
) -> UpdateResult:
    """Distillation steps on ``batch`` (its ``TeacherTarget``): the student is fitted to the teacher on the batch's
    responses (see ``distill_loss``)."""
    return optimize(
        model,
        optimizer,
        scheduler,
        batch,
        actor,
        num_mini_batches,
        seed,
        lambda mb: _distill_micro_loss(model, mb, actor, distill),
        dp=dp,
    )


def optimize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    actor: ActorConfig | CriticConfig,
    num_mini_batches: int,
    seed: int,
    micro_loss: Callable[[TrainBatch], tuple[torch.Tensor, dict[str, float]]],
    prefix: str = "actor",
    keep_rows: Callable[[TrainBatch], torch.Tensor] | None = None,
    dp: DataParallel | None = None,
) -> UpdateResult:
    """``actor.ppo_epochs`` passes over ``batch`` in ``num_mini_batches`` optimizer steps each, minimising
    ``micro_loss(micro_batch)``. ``actor`` is the role's config (the critic's has the same fields); ``prefix`` names
    its grad-norm, lr and skipped-step metrics.

    Gradients are accumulated over micro-batches with weights chosen so that the accumulated gradient equals the
    gradient of the loss aggregated over the whole mini-batch (token-mean: by token count; seq-mean-*: by sequence
    count). A non-finite loss or gradient norm skips that optimizer step (counted): NaN/inf never reaches the weights.
    ``keep_rows(mini_batch)`` (a bool per row) leaves out rows whose loss gradient is known to be zero; the weights
    above still count them, so the accumulated gradient does not change. The share left out is
    ``{prefix}/skipped_rows_frac``.

    With ``dp`` (data-parallel ranks), every rank draws the same permutation and works on its rows of each
    mini-batch with the whole mini-batch's weights; the ranks' gradients are then summed, so each rank steps with
    the gradient of the whole mini-batch. The loss statistics are the whole mini-batch's too; the micro-batch
    counts (``{prefix}/micro_batches`` and the like) are rank 0's.
    """
    model.train()
    gen = torch.Generator().manual_seed(seed)
    means = Means()
    params = [p for p in model.parameters() if p.requires_grad]
    steps = skipped = rows_left_out = 0
    how = batching(actor, prefix)
    count = TokenCount()
    for _epoch in range(actor.ppo_epochs):
        perm = torch.randperm(batch.size, generator=gen)
        for mini_idx in perm.chunk(num_mini_batches):
            mini = batch.select(mini_idx)
            mini_tokens = float(mini.response_mask_BT.sum().clamp(min=1))
            # seq-mean modes average over sequences with at least one token (losses.agg_loss): count those
            mini_seqs = float((mini.response_mask_BT.sum(dim=1) > 0).sum().clamp(min=1))
            if dp is not None:
                mini = mini.select(dp.share(mini))
            if keep_rows is not None:
                kept = keep_rows(mini).nonzero().flatten()
                rows_left_out += mini.size - len(kept)
                mini = mini.select(kept)
            optimizer.zero_grad(set_to_none=True)
            if mini.size == 0:  # every row left out: a zero gradient, and the optimizer still steps as it would
                for p in model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
            finite = True
            mini_stats: dict[str, float] = {}
            weights = 0.0
            mbs = micro_batches(mini, how, count)
            lockstep = Lockstep(dp, len(mbs))
            for _, mb in mbs:
                if actor.loss_agg_mode == "token-mean":
                    weight = float(mb.response_mask_BT.sum()) / mini_tokens
                else:
                    weight = float((mb.response_mask_BT.sum(dim=1) > 0).sum()) / mini_seqs
                loss, stats = micro_loss(mb)
                lockstep.passed()
                if not torch.isfinite(loss):
                    finite = False
                    lockstep.drop(loss)
                    break
                (loss * weight).backward()
                weights += weight
                for k, v in stats.items():
                    mini_stats[k] = mini_stats.get(k, 0.0) + weight * v
            lockstep.finish(model)
            if finish_mini_batch(params, optimizer, scheduler, actor, dp, finite, mini_stats, weights, means, prefix):
                steps += 1
            else:
                skipped += 1
    metrics = means.result()
    metrics[f"{prefix}/lr"] = float(scheduler.get_last_lr()[0])
    metrics[f"{prefix}/nonfinite_skipped_steps"] = float(skipped)
    metrics.update(count.metrics(prefix))
    if keep_rows is not None:
        if dp is not None:
            rows_left_out = sum(dp.all_gather_object(rows_left_out))
        metrics[f"{prefix}/skipped_rows_frac"] = rows_left_out / max(batch.size * actor.ppo_epochs, 1)
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(metrics=metrics, optimizer_steps=steps, skipped_nonfinite=skipped)


def _distill_micro_loss(
    model: torch.nn.Module, mb: TrainBatch, actor: ActorConfig, distill: DistillConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of one micro-batch. The student's logits are taken at temperature 1, the scale the
    teacher's log-probs come in."""
    mask = mb.response_mask_BT
    logits = _forward_logits(model, mb, 1.0)
    agg = actor.loss_agg_mode
    target = mb.policy
    if not isinstance(target, TeacherTarget):
        raise TypeError(f"distillation update: the batch's policy target is {type(target).__name__}, not TeacherTarget")
    ids, teacher_logp = target.topk_ids_BTK, target.topk_logp_BTK
    if distill.loss == "forward_kl":
        loss, _ = losses.topk_forward_kl(logits, ids, teacher_logp, mask, tail=distill.tail, loss_agg_mode=agg)
    elif distill.loss == "jsd":
        loss, _ = losses.generalized_jsd_topk(
            logits, ids, teacher_logp, mask, beta=distill.beta, tail=distill.tail, loss_agg_mode=agg
        )
    else:
        student_logp = losses.logprobs_from_logits(logits, mb.response_ids_BT)
        loss, _ = losses.reverse_kl_sampled(
            student_logp, target.token_logp_BT, mask, estimator=distill.reverse_kl_estimator, loss_agg_mode=agg
        )
    stats = {"actor/kl_loss": float(loss.detach())}
    with torch.no_grad():
        stats["actor/entropy"] = float(losses.agg_loss(losses.entropy_from_logits(logits), mask, agg))
    return loss, stats


def _micro_loss(
    model: torch.nn.Module,
    mb: TrainBatch,
    actor: ActorConfig,
    correction: RolloutCorrectionConfig,
    temperature: float,
    clip_low: float,
    clip_high: float,
    gap: LogprobGap | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's policy loss; ``gap`` (when given) records its log-probs against the rollout's."""
    mask = mb.response_mask_BT
    logits = _forward_logits(model, mb, temperature)
    logp = losses.logprobs_from_logits(logits, mb.response_ids_BT)
    if gap is not None:
        gap.add(logp, mb.behav_logp_BT, mask)
    target = _policy(mb)
    old_logp = target.old_logp_BT
    is_weights = None
    stats: dict[str, float] = {}
    if correction.rollout_is is not None:
        is_weights, is_stats = losses.truncated_importance_weights(
            mb.behav_logp_BT, old_logp, mask, level=correction.rollout_is, threshold=correction.rollout_is_threshold
        )
        stats.update(is_stats)
    pg_loss, pg_stats = losses.policy_loss_ppo_clip(
        logp,
        old_logp,
        target.advantages_BT,
        mask,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        loss_agg_mode=actor.loss_agg_mode,
        clip_ratio_c=actor.clip_ratio_c,
        is_weights_BT=is_weights,
    )
    loss = pg_loss
    stats["actor/pg_loss"] = float(pg_loss.detach())
    for k, v in pg_stats.items():
        stats[f"actor/{k}"] = float(v)
    with torch.set_grad_enabled(actor.entropy_coeff != 0):
        entropy_BT = losses.entropy_from_logits(logits if actor.entropy_coeff != 0 else logits.detach())
        entropy = losses.agg_loss(entropy_BT, mask, actor.loss_agg_mode)
    stats["actor/entropy"] = float(entropy.detach())
    if actor.entropy_coeff != 0:
        loss = loss - actor.entropy_coeff * entropy
    if actor.use_kl_loss:
        kl_BT = losses.kl_penalty(logp, target.ref_logp_BT, actor.kl_loss_type)
        kl = losses.agg_loss(kl_BT, mask, actor.loss_agg_mode)
        loss = loss + actor.kl_loss_coef * kl
        stats["actor/kl_loss"] = float(kl.detach())
        stats["actor/kl_coef"] = actor.kl_loss_coef
    return loss, stats


def _policy(mb: TrainBatch) -> PolicyTarget:
    """The batch's policy-gradient target, with the old (and, under a KL loss, ref) log-probs the trainer filled."""
    target = mb.policy
    if not isinstance(target, PolicyTarget) or target.old_logp_BT is None:
        raise TypeError(
            f"policy-gradient update: the batch's policy target is {type(target).__name__} "
            "(a PolicyTarget with old_logp_BT filled by the trainer is needed)"
        )
    return target
