"""One module per algorithm (``algorithm.name``): the roles it needs, how finished samples become a typed training
batch, and which pure losses from ``asyncrl.losses`` update which role. Every algorithm runs on every schedule."""

from __future__ import annotations

from asyncrl.algorithms.base import Algorithm, Finish, Prepared, Trained
from asyncrl.config import Config


def make_algorithm(cfg: Config, tokenizer: object) -> Algorithm:
    name = cfg.algorithm.name
    if name == "grpo":
        from asyncrl.algorithms.grpo import GRPO

        return GRPO(cfg, tokenizer)
    if name == "ppo":
        from asyncrl.algorithms.ppo import PPO

        return PPO(cfg, tokenizer)
    if name == "distill":
        from asyncrl.algorithms.distill import Distill

        return Distill(cfg, tokenizer)
    if name == "dpo":
        from asyncrl.algorithms.dpo import OnlineDPO

        return OnlineDPO(cfg, tokenizer)
    raise ValueError(f"algorithm.name={name!r}: no such algorithm (the config check should have caught this)")


__all__ = ["Algorithm", "Finish", "Prepared", "Trained", "make_algorithm"]
