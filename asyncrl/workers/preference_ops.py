"""The online DPO update: a batch of (chosen, rejected) pairs against a frozen reference policy.

Kept apart from ``policy_ops`` because its loss couples two rows: a pair's chosen and rejected responses must be in
the same forward and backward, so mini-batches and micro-batches are cut by pairs, never by rows (the token-budget
packing of ``policy_ops`` would split them). Data-parallel ranks take a share of each mini-batch's pairs.
"""

from __future__ import annotations

import torch

from asyncrl import losses
from asyncrl.config import ActorConfig, DpoConfig
from asyncrl.data.collate import TrainBatch
from asyncrl.data.targets import PreferenceTarget
from asyncrl.losses.dpo import dpo_loss, sequence_logratios
from asyncrl.workers.data_parallel import DataParallel, Lockstep
from asyncrl.workers.optim_step import Means, finish_mini_batch
from asyncrl.workers.policy_ops import UpdateResult, _forward_logits


def _pair_rows(pairs: torch.Tensor) -> torch.Tensor:
    """Row indices of ``pairs``: chosen then rejected for each, in order."""
    return torch.stack([2 * pairs, 2 * pairs + 1], dim=1).reshape(-1)


def dpo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    batch: TrainBatch,
    actor: ActorConfig,
    dpo: DpoConfig,
    temperature: float,
    num_mini_batches: int,
    seed: int,
    dp: DataParallel | None = None,
) -> UpdateResult:
    """``actor.ppo_epochs`` passes over the batch's pairs in ``num_mini_batches`` optimizer steps each; micro-batches
    of ``max(1, actor.ppo_micro_batch_size // 2)`` pairs (padded rows: the token-budget packing, ``use_dynamic_bsz``,
    is not used here). The loss is the mean over a mini-batch's real pairs."""
    target = batch.policy
    if not isinstance(target, PreferenceTarget) or target.ref_logp_BT is None:
        raise TypeError("dpo update: the batch needs a PreferenceTarget with ref_logp_BT filled by the trainer")
    target.check_pairs()
    model.train()
    gen = torch.Generator().manual_seed(seed)
    n_pairs = batch.size // 2
    per_micro = max(1, actor.ppo_micro_batch_size // 2)
    means = Means()
    steps = skipped = 0
    params = [p for p in model.parameters() if p.requires_grad]
    for _epoch in range(actor.ppo_epochs):
        for mini_pairs in torch.randperm(n_pairs, generator=gen).chunk(num_mini_batches):
            weight_P = target.pair_weight_BT[2 * mini_pairs, 0]
            real = float(weight_P.sum())  # the mini-batch's real pairs, over every rank
            if dp is not None:
                mini_pairs = mini_pairs[dp.rows(len(mini_pairs))]
            for p in params:  # every step starts from zero: a rank (or a placeholder pair) adds nothing else
                p.grad = torch.zeros_like(p)
            finite, stats, weights = True, {}, 0.0
            micros = mini_pairs.split(per_micro) if len(mini_pairs) else ()
            lockstep = Lockstep(dp, len(micros))
            for micro in micros:
                mb = batch.select(_pair_rows(micro)).trimmed()
                t: PreferenceTarget = mb.policy  # type: ignore[assignment]
                logits = _forward_logits(model, mb, temperature)
                logp = losses.logprobs_from_logits(logits, mb.response_ids_BT)
                lr = sequence_logratios(logp, t.ref_logp_BT, mb.response_mask_BT, mean=dpo.loss_type == "ipo")
                w_P = t.pair_weight_BT[0::2, 0]
                loss, s = dpo_loss(lr[0::2], lr[1::2], dpo.beta, dpo.loss_type, weight_P=w_P)
                share = float(w_P.sum()) / real if real > 0 else 0.0
                lockstep.passed()
                if not torch.isfinite(loss):
                    finite = False
                    lockstep.drop(loss)
                    break
                (loss * share).backward()
                if s:
                    weights += share
                    for k, v in s.items():
                        stats[k] = stats.get(k, 0.0) + share * v
            lockstep.finish(model)
            if finish_mini_batch(params, optimizer, scheduler, actor, dp, finite, stats, weights, means, "actor"):
                steps += 1
            else:
                skipped += 1
    metrics = means.result()
    metrics["actor/lr"] = float(scheduler.get_last_lr()[0])
    metrics["actor/nonfinite_skipped_steps"] = float(skipped)
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(metrics=metrics, optimizer_steps=steps, skipped_nonfinite=skipped)
