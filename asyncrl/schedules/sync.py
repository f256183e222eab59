"""``sync``: the baseline every other schedule is measured against.

The trainer's own worker generates, then the algorithm prepares the batch, then the roles learn from it: nothing
overlaps. Per step, top to bottom:

    generate with the current weights (rule rewards scored on the worker)     timing_s/gen
      (algorithm.filter_groups: drop groups without a reward spread, generate more until the batch is full)
    prepare the batch (advantages; critic values; teacher knowledge)           timing_s/prepare
    update the roles that learn (ref/old log-probs inside the trainer's call)  timing_s/train
    metrics -> (held-out eval) -> (checkpoint)

On-policy: every sample's weight version equals the trainer's (staleness 0, measured from the recorded versions).
"""

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
