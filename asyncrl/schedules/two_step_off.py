"""``two_step_off``: batch t+2 is generated and batch t+1 prepared while the roles learn on batch t.

For algorithms whose preparation is slow and remote (a teacher scoring every position, a reward service, critic
values on another pool): preparing batch t+1 runs on a driver thread, so it overlaps both the update of batch t and
the generation of batch t+2. Per step, top to bottom:

    wait for batch t's preparation (started during the previous step)             timing_s/wait_prev_prepare
    wait for batch t+1's generation                                                timing_s/wait_prev_gen
      (algorithm.filter_groups: groups without a reward spread dropped, more generated with the same weights
      until the batch is full)
    sync the trainer's weights v(t-1) to the rollout pool                          timing_s/sync_rollout_weights
    launch generation of batch t+2 (with v(t-1)); start preparing batch t+1
    update on batch t -> v(t)                                                      timing_s/train
    metrics -> (eval) -> (checkpoint)

Every sample after the first two batches is trained exactly two versions after the one that generated it. A
checkpoint records the data cursor after the batch it trained, so the batches in flight are drawn, generated and
prepared again by a resumed run, neither lost nor repeated.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import Config
from asyncrl.schedules.one_step_off import rollout_side as rollout_side  # one_step_off's pool and plan, re-exported
from asyncrl.schedules.one_step_off import trainer_plan as trainer_plan
from asyncrl.schedules.run_ports import drive


def run_two_step_off(cfg: Config) -> dict[str, Any]:
    """The loop is ``loops.two_step_off``, on the real roles; preparation finishes on a thread of its own."""
    return drive(cfg)
