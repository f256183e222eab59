"""Online DPO: each prompt's ``rollout.n`` samples, ranked by their reward, give one (chosen, rejected) pair, and the
actor is fitted to the preferences against a frozen reference policy (``losses.dpo``).

Roles: the actor, with its reference copy inside it (refreshed to the actor's weights every
``algorithm.dpo.ref_update_freq`` steps; 0 = frozen for the run). Per batch: the rule rewards (scored on the rollout
side) -> per group, the highest-reward sample is chosen and the lowest rejected (the first of equals, in sample
order) -> groups whose rewards are all equal (ties) or that have no scored sample are dropped and counted -> the
trainer's update (which computes the reference log-probs). A batch without a single pair still makes the trainer's
step, on a placeholder pair of weight 0, so the weight version advances as in every other algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.data.collate import collate
from asyncrl.data.targets import PreferenceTarget
from asyncrl.types import Sample


@dataclass
class Pairs:
    """A batch's preference pairs and what was dropped."""

    chosen: list[Sample]
    rejected: list[Sample]
    groups: int
    ties: int  # groups whose scored samples all have the same reward
    failed: int  # groups with no scored sample (every reward failed)

    def metrics(self) -> dict[str, float]:
        return {
            "dpo/pairs": float(len(self.chosen)),
            "dpo/tie_rate": self.ties / max(self.groups, 1),
            "dpo/failed_groups": float(self.failed),
        }


def make_pairs(samples: list[Sample]) -> Pairs:
    """One pair per group (``Sample.uid``), in order of first appearance; failed rewards never enter a pair."""
    groups: dict[object, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.uid, []).append(s)
    chosen, rejected = [], []
    ties = failed = 0
    for members in groups.values():
        scored = [s for s in members if not s.reward_failed]
        if not scored:
            failed += 1
            continue
        best = max(scored, key=lambda s: s.reward)  # max/min keep the first of equals
        worst = min(scored, key=lambda s: s.reward)
        if best.reward == worst.reward:
            ties += 1
            continue
        chosen.append(best)
        rejected.append(worst)
    return Pairs(chosen, rejected, len(groups), ties, failed)


class OnlineDPO(Algorithm):
    name = "dpo"

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        pairs = make_pairs(samples)
        weight = 1.0
        chosen, rejected = pairs.chosen, pairs.rejected
        if not chosen:  # a zero-gradient step on a placeholder pair: the version advances as always
            chosen, rejected, weight = [samples[0]], [samples[-1]], 0.0
        rows = [s for pair in zip(chosen, rejected) for s in pair]
        batch = collate(rows, self.tokenizer.pad_token_id)
        is_chosen = torch.tensor([1.0, 0.0] * len(chosen))[:, None].expand_as(batch.response_mask_BT)
        batch.policy = PreferenceTarget(is_chosen.clone(), torch.full_like(batch.response_mask_BT, weight))
        prepared = Prepared(samples, batch, pairs.metrics())
        return lambda: prepared

    def train(self, prepared: Prepared, step: int) -> Trained:
        n_pairs = prepared.batch.size // 2
        num_mini = max(1, min(self.num_mini_batches(prepared.samples), n_pairs))
        res = self.bound.trainer.update(prepared.batch, step, num_mini).result()
        return Trained(res, res.metrics)
