"""``sync``: generate with the current weights, prepare, train; nothing overlaps (docs/schedules/sync.md)."""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config
from asyncrl.config.specs import TrainerPlan, default_old_policy
from asyncrl.roles.clients import RolloutSide
from asyncrl.schedules.run_ports import drive


def rollout_side() -> tuple[RolloutSide, type | None]:
    """On the trainer's own engine; no producer."""
    return RolloutSide.ACTOR, None


def trainer_plan(cfg: Config) -> TrainerPlan:
    """The trainer's own engine generates every batch, with the weights it trains: one update per version."""
    return TrainerPlan(old_policy=default_old_policy(cfg), engine_is_rollout=True)


def run_sync(cfg: Config) -> dict[str, Any]:
    """The loop is ``loops.sync``, on the real roles."""
    return drive(cfg)
