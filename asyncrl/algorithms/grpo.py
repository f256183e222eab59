"""GRPO, and the policy-gradient objective it shares with PPO: ``PolicyTarget``, per-token advantages and the PPO-clip
loss with its entropy bonus, KL loss and truncated importance sampling, a typed target the trainer fits without
knowing which algorithm built it. GRPO puts each response's group-normalised outcome reward on its tokens; PPO
(``asyncrl.algorithms.ppo``) puts a critic's GAE advantages. What it optimises: docs/algorithms/grpo.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from asyncrl import losses
from asyncrl.algorithms import Algorithm, Finish, Prepared
from asyncrl.config import ActorConfig, AlgorithmConfig, Config, RolloutCorrectionConfig
from asyncrl.data.collate import Objective, TrainBatch, collate, group_ids, rewards_of
from asyncrl.types import Sample


@dataclass(frozen=True)
class PPOClip:
    """The loss's knobs (``actor.*``), carried by every target."""

    temperature: float  # rollout.temperature: the logits are the sampling distribution's
    clip_low: float
    clip_high: float
    clip_c: float | None
    entropy_coeff: float
    kl_coef: float | None  # None: no KL loss (actor.use_kl_loss false)
    kl_type: str
    correction: RolloutCorrectionConfig
    skip_zero_adv_rows: bool

    @classmethod
    def from_config(cls, cfg: Config) -> PPOClip:
        return cls.of(cfg.actor, effective_correction(cfg), cfg.rollout.temperature)

    @classmethod
    def of(cls, a: ActorConfig, correction: RolloutCorrectionConfig, temperature: float = 1.0) -> PPOClip:
        return cls(
            temperature=temperature,
            clip_low=a.clip_ratio if a.clip_ratio_low is None else a.clip_ratio_low,
            clip_high=a.clip_ratio if a.clip_ratio_high is None else a.clip_ratio_high,
            clip_c=a.clip_ratio_c,
            entropy_coeff=a.entropy_coeff,
            kl_coef=a.kl_loss_coef if a.use_kl_loss else None,
            kl_type=a.kl_loss_type,
            correction=correction,
            skip_zero_adv_rows=a.skip_zero_adv_rows and a.entropy_coeff == 0 and not a.use_kl_loss,
        )


def effective_correction(cfg: Config) -> RolloutCorrectionConfig:
    """``algorithm.rollout_correction`` as the update applies it: ``rollout_is`` null means off, except under FP8
    rollout, where token-level truncated importance sampling is on (verl finds FP8 rollout matches bf16 only with
    it); ``disabled`` is off always."""
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is == "disabled":
        return replace(rc, rollout_is=None)
    if rc.rollout_is is None and cfg.rollout.quantization == "fp8":
        return replace(rc, rollout_is="token")
    return rc


@dataclass
class PolicyTarget(Objective):
    """Per-token advantages [B, T] (one per response, broadcast, for GRPO; GAE's for PPO) and the loss's knobs."""

    advantages_BT: Tensor  # float [B, T]
    spec: PPOClip

    compares_behaviour = True

    @property
    def temperature(self) -> float:
        return self.spec.temperature

    @property
    def needs_ref(self) -> bool:
        return self.spec.kl_coef is not None

    @property
    def needs_old(self) -> bool:
        return True

    def keep_rows(self, batch: TrainBatch) -> Tensor | None:
        return (self.advantages_BT != 0).any(dim=1) if self.spec.skip_zero_adv_rows else None

    def loss(self, logits_BTV: Tensor, logp_BT: Tensor, batch: TrainBatch, agg: str) -> tuple[Tensor, dict]:
        s, mask, old_logp = self.spec, batch.response_mask_BT, batch.old_logp_BT
        if old_logp is None:
            raise TypeError("PPO-clip loss: the batch has no old_logp_BT (the trainer fills it before the update)")
        is_weights = None
        stats: dict[str, float] = {}
        rc = s.correction
        if rc.rollout_is is not None:
            is_weights, is_stats = losses.truncated_importance_weights(
                batch.behav_logp_BT, old_logp, mask, level=rc.rollout_is, threshold=rc.rollout_is_threshold
            )
            stats.update(is_stats)
        pg_loss, pg_stats = losses.policy_loss_ppo_clip(
            logp_BT,
            old_logp,
            self.advantages_BT,
            mask,
            clip_ratio_low=s.clip_low,
            clip_ratio_high=s.clip_high,
            loss_agg_mode=agg,
            clip_ratio_c=s.clip_c,
            is_weights_BT=is_weights,
        )
        loss = pg_loss
        stats["actor/pg_loss"] = float(pg_loss.detach())
        stats.update({f"actor/{k}": float(v) for k, v in pg_stats.items()})
        with torch.set_grad_enabled(s.entropy_coeff != 0):
            entropy_BT = losses.entropy_from_logits(logits_BTV if s.entropy_coeff != 0 else logits_BTV.detach())
            entropy = losses.agg_loss(entropy_BT, mask, agg)
        stats["actor/entropy"] = float(entropy.detach())
        if s.entropy_coeff != 0:
            loss = loss - s.entropy_coeff * entropy
        if s.kl_coef is not None:
            kl = losses.agg_loss(losses.kl_penalty(logp_BT, batch.ref_logp_BT, s.kl_type), mask, agg)
            loss = loss + s.kl_coef * kl
            stats["actor/kl_loss"] = float(kl.detach())
            stats["actor/kl_coef"] = s.kl_coef
        return loss, stats


@dataclass
class GRPOConfig(AlgorithmConfig):
    """``algorithm:`` for grpo: the keys every algorithm reads, and its own."""

    norm_adv_by_std_in_grpo: bool = True  # divide by the group's reward std (false: centre only, as Dr. GRPO)


class GRPO(Algorithm):
    name = "grpo"
    replayable = True
    section = GRPOConfig
    estimators = ("grpo",)

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        batch = collate(samples, self.tokenizer.pad_token_id)
        norm = self.options.norm_adv_by_std_in_grpo  # type: ignore[attr-defined] - a GRPOConfig (``section``)
        adv_B = losses.compute_grpo_advantages(rewards_of(samples), group_ids(samples), norm)
        batch.policy = PolicyTarget(
            losses.broadcast_advantages(adv_B, batch.response_mask_BT), PPOClip.from_config(self.cfg)
        )
        prepared = Prepared(samples, batch)
        return lambda: prepared


ALGORITHM = GRPO
