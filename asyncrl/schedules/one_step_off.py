"""``one_step_off``: the pool generates batch t+1 while the roles learn on t (docs/schedules/one_step_off.md)."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config
from asyncrl.config.specs import TrainerPlan, default_old_policy
from asyncrl.roles.clients import RolloutSide
from asyncrl.schedules.run_ports import drive


def rollout_side() -> tuple[RolloutSide, type | None]:
    """On the rollout pool; no producer."""
    return RolloutSide.POOL, None


def trainer_plan(cfg: Config) -> TrainerPlan:
    """The rollout pool generates; the trainer only evaluates with its engine: one update per version."""
    return TrainerPlan(old_policy=default_old_policy(cfg))


def run_one_step_off(cfg: Config) -> dict[str, Any]:
    """The loop is ``loops.one_step_off``, on the real roles."""
    return drive(cfg)
