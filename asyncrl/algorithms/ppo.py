"""PPO with a critic (docs/algorithms/ppo.md): GAE advantages from the critic's values, the PPO-clip loss on the actor,
the clipped value loss on the critic, and an optional reward model whose score joins the rule reward. Per batch:

    prepare: values (critic) | reward-model scores, issued at once when on different pools   timing_s/values
    finish:  combined reward on each last token -> GAE -> whitened advantages
    train:   update_critic | update_actor (after trainer.critic_warmup steps), at once on different pools
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from asyncrl import losses
from asyncrl.algorithms import Algorithm, Finish, Prepared, Trained
from asyncrl.algorithms.grpo import PolicyTarget, PPOClip
from asyncrl.config import AlgorithmConfig, Config, check
from asyncrl.config.rules import between
from asyncrl.data.collate import ValueTarget, collate, rewards_of
from asyncrl.rewards.combine import combine_rewards, token_level_rewards
from asyncrl.roles.clients import PoolTurns
from asyncrl.types import Sample


@dataclass
class PPOConfig(AlgorithmConfig):
    """``algorithm:`` for ppo: the keys every algorithm reads, and GAE's."""

    gamma: float = 1.0  # discount per response token
    lam: float = 1.0  # lambda (bias/variance trade-off of the advantage estimate)

    RULES = {"gamma": between(0, 1), "lam": between(0, 1)}


class PPO(Algorithm):
    name = "ppo"
    section = PPOConfig
    sections = ("critic", "reward_model")
    estimators = ("gae",)

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        fg, rm = cfg.algorithm.filter_groups, cfg.reward_model
        if fg.enable and fg.metric in ("seq_reward", "seq_final_reward") and rm.enable:
            check(
                False,
                "algorithm.filter_groups.metric",
                fg.metric,
                "acc or score when reward_model.enable is true (the reward model scores on the trainer, after groups "
                "are filtered, so a sequence's full reward is not known yet)",
            )

    @classmethod
    def roles_needed(cls, cfg):  # noqa: ANN001, ANN206 - as Algorithm's
        """The actor, the critic, and the reward model when ``reward_model.enable``."""
        return ["actor", "critic"] + (["reward_model"] if cfg.reward_model.enable else [])

    def prepare(self, samples: list[Sample], step: int) -> Finish:
        roles = self.roles
        batch = collate(samples, self.tokenizer.pad_token_id)
        calls = PoolTurns(roles.placement)
        calls.issue("values", "critic", lambda: roles.critic.values(batch, step))  # type: ignore[union-attr]
        if roles.reward_model is not None:
            rm = roles.reward_model
            calls.issue("rm", "reward_model", lambda: rm.score(samples, step))

        def finish() -> Prepared:
            got = calls.join()
            values_BT = got["values"].values
            rule_B = rewards_of(samples)
            metrics = {"timing_s/values": got["values"].seconds, "reward/rule_mean": float(rule_B.mean())}
            reward_B = rule_B
            if "rm" in got:
                rmc = self.cfg.reward_model
                rm_logit_B = got["rm"].values
                metrics["timing_s/reward_model"] = got["rm"].seconds
                reward_B = combine_rewards(rule_B, rm_logit_B, rmc.rule_weight, rmc.weight)
                metrics["reward/rm_score_mean"] = float(torch.sigmoid(rm_logit_B).mean())
                for s, r in zip(samples, reward_B.tolist(), strict=True):
                    s.reward = r  # reward/mean logs what the policy is trained on
            mask = batch.response_mask_BT
            al = self.options  # a PPOConfig (``section``)
            adv_BT, returns_BT = losses.compute_gae(
                token_level_rewards(reward_B, mask), values_BT, mask, al.gamma, al.lam
            )
            batch.policy = PolicyTarget(losses.whiten(adv_BT, mask), PPOClip.from_config(self.cfg))
            batch.value = ValueTarget(values_BT, returns_BT)
            metrics["critic/vf_explained_var"] = losses.explained_variance(values_BT, returns_BT, mask)
            metrics["critic/returns_mean"] = float(losses.masked_mean(returns_BT, mask))
            return Prepared(samples, batch, metrics)

        return finish

    def train(self, prepared: Prepared, step: int) -> Trained:
        roles = self.roles
        critic = roles.critic
        assert critic is not None
        num_mini = self.num_mini_batches(prepared.samples)
        t0 = time.perf_counter()
        calls = PoolTurns(roles.placement)
        calls.issue("critic", "critic", lambda: critic.update(prepared.batch, step, num_mini))
        if step > self.cfg.trainer.critic_warmup:
            calls.issue("actor", "actor", lambda: roles.trainer.update(prepared.batch, step, num_mini))
        got = calls.join()
        wall = time.perf_counter() - t0
        actor = got.get("actor")
        metrics = {**got["critic"], **(actor.metrics if actor else {})}
        busy = metrics["timing_s/update_critic"] + metrics.get("timing_s/update_actor", 0.0)
        metrics["perf/update_overlap_s"] = max(0.0, busy - wall)  # worker-seconds hidden by running at once
        return Trained(actor, metrics)


ALGORITHM = PPO
