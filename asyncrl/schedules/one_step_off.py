"""``one_step_off``: the rollout pool generates batch t+1 while the roles learn on batch t.

The trainer sends its weights to ``rollout.num_workers`` rollout workers over the sync group. Per step, top to bottom:

    wait for batch t (generated with weights v(t-2), or v(t-1) at the first step)   timing_s/wait_prev_gen
      (algorithm.filter_groups: groups without a reward spread dropped, more generated with the same weights
      until the batch is full)
    sync the trainer's weights v(t-1) to the rollout pool                             timing_s/sync_rollout_weights
    launch generation of batch t+1 (with v(t-1); not waited for)
    prepare batch t                                                                   timing_s/prepare
    update -> v(t)                                                                    timing_s/train
    metrics (staleness from each sample's recorded version) -> (eval) -> (checkpoint)

So every sample but the first batch's is trained exactly one version after the one that generated it. Where this
departs from verl's recipe: the in-flight batch's prompts are not lost at a checkpoint (the data cursor saved is the
one from before that batch was drawn, so a resumed run draws and generates it again).
"""

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
