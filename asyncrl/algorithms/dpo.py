"""Online DPO (docs/algorithms/dpo.md): each prompt's ``rollout.n`` samples, ranked by their reward, give one
(chosen, rejected) pair, and the actor is fitted to the preferences against a reference policy (``losses.dpo``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.algorithms import Algorithm, Finish, Prepared, TrainerNeeds
from asyncrl.config import Config, DpoConfig, check
from asyncrl.data.collate import Objective, TrainBatch, collate
from asyncrl.losses.dpo import dpo_loss, sequence_logratios
from asyncrl.rewards.filtering import group_by_prompt
from asyncrl.types import Sample


@dataclass
class PreferenceTarget(Objective):
    """The batch's rows are pairs, row ``2i`` the chosen and row ``2i + 1`` the rejected response of the same prompt;
    ``pair_weight_BT`` is 1 on a real pair's rows and 0 on a placeholder pair (a batch without any pair still makes
    one optimizer step, with a zero gradient). The trainer fills the reference log-probs; a pair's two rows stay in
    one micro-batch, and a micro-batch weighs its real pairs."""

    chosen_BT: Tensor  # float [B, T]: 1 on the chosen rows, 0 on the rejected
    pair_weight_BT: Tensor  # float [B, T]
    dpo: DpoConfig
    sampling_temperature: float  # rollout.temperature: the logits are the sampling distribution's

    rows_per_unit = 2  # any rows may be taken for a log-prob pass; the update cuts by pairs

    @property
    def temperature(self) -> float:
        return self.sampling_temperature

    @property
    def needs_ref(self) -> bool:
        return True

    def weight(self, batch: TrainBatch, loss_agg_mode: str) -> float:
        return float(self.pair_weight_BT[0::2, 0].sum())  # the real pairs: the loss is their mean

    def loss(self, logits_BTV: Tensor, logp_BT: Tensor, batch: TrainBatch, agg: str) -> tuple[Tensor, dict]:
        lr = sequence_logratios(logp_BT, batch.ref_logp_BT, batch.response_mask_BT, mean=self.dpo.loss_type == "ipo")
        return dpo_loss(lr[0::2], lr[1::2], self.dpo.beta, self.dpo.loss_type, weight_P=self.pair_weight_BT[0::2, 0])


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
    groups = group_by_prompt(samples)
    chosen, rejected = [], []
    ties = failed = 0
    for members in groups:
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
    sections = ("dpo",)

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        check(cfg.rollout.n >= 2, "rollout.n", cfg.rollout.n, ">= 2 when algorithm.name=dpo (a pair needs two samples)")
        check(
            not cfg.actor.use_kl_loss,
            "actor.use_kl_loss",
            cfg.actor.use_kl_loss,
            "false when algorithm.name=dpo (DPO's loss already holds the policy to its reference, dpo.beta)",
        )
        check(
            cfg.dpo.ref_update_freq == 0 or not cfg.model.lora_rank,
            "dpo.ref_update_freq",
            cfg.dpo.ref_update_freq,
            "0 with LoRA (the reference is the base model, the adapter switched off; refreshing it is not implemented)",
        )

    replayable = True

    @classmethod
    def trainer_needs(cls, cfg: Config) -> TrainerNeeds:
        return TrainerNeeds(reference=True, ref_refresh_every=cfg.dpo.ref_update_freq)

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        pairs = make_pairs(samples)
        weight = 1.0
        chosen, rejected = pairs.chosen, pairs.rejected
        if not chosen:  # a zero-gradient step on a placeholder pair: the version advances as always
            chosen, rejected, weight = [samples[0]], [samples[-1]], 0.0
        rows = [s for pair in zip(chosen, rejected) for s in pair]
        batch = collate(rows, self.tokenizer.pad_token_id)
        is_chosen = torch.tensor([1.0, 0.0] * len(chosen))[:, None].expand_as(batch.response_mask_BT)
        weights = torch.full_like(batch.response_mask_BT, weight)
        batch.policy = PreferenceTarget(is_chosen.clone(), weights, self.cfg.dpo, self.cfg.rollout.temperature)
        prepared = Prepared(samples, batch, pairs.metrics())
        return lambda: prepared


ALGORITHM = OnlineDPO
