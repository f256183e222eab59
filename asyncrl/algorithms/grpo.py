"""GRPO: group-normalised outcome rewards as every token's advantage, the PPO-clip loss on the actor.

Roles: the actor (+ its reference copy with ``actor.use_kl_loss``). Per batch: the rule rewards (already scored on
the rollout side) -> per-group mean (and std, ``algorithm.norm_adv_by_std_in_grpo``) normalisation -> one advantage
per response, broadcast over its tokens -> the trainer's update (which computes the old and reference log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl import losses
from asyncrl.algorithms.base import Algorithm, Finish, Prepared
from asyncrl.algorithms.ppo_clip import PolicyTarget, PPOClip
from asyncrl.config import AlgorithmConfig
from asyncrl.data.collate import collate, group_ids, rewards_of
from asyncrl.types import Sample


@dataclass
class GRPOConfig(AlgorithmConfig):
    """``algorithm:`` for grpo: the keys every algorithm reads, and its own."""

    norm_adv_by_std_in_grpo: bool = True  # divide by the group's reward std (false: centre only, as Dr. GRPO)


class GRPO(Algorithm):
    name = "grpo"
    replayable = True
    section = GRPOConfig
    estimators = ("grpo",)

    def __init__(self, cfg, tokenizer, roles, resources=None):  # noqa: ANN001 - as Algorithm's
        super().__init__(cfg, tokenizer, roles, resources)
        self.loss = PPOClip.from_config(cfg)

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        batch = collate(samples, self.tokenizer.pad_token_id)
        norm = self.options.norm_adv_by_std_in_grpo  # type: ignore[attr-defined] - a GRPOConfig (``section``)
        adv_B = losses.compute_grpo_advantages(rewards_of(samples), group_ids(samples), norm)
        batch.policy = PolicyTarget(losses.broadcast_advantages(adv_B, batch.response_mask_BT), self.loss)
        prepared = Prepared(samples, batch)
        return lambda: prepared


ALGORITHM = GRPO
