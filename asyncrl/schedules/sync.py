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
from asyncrl.config.specs import TrainerPlan
from asyncrl.roles.team import RolloutSide
from asyncrl.schedules.dynamic_sampling import BatchFiller
from asyncrl.schedules.run import open_run
from asyncrl.schedules.skip import RolloutSkip
from asyncrl.schedules.step import StepTimer, old_policy, staleness_metrics


def trainer_plan(cfg: Config) -> TrainerPlan:
    """The trainer's own engine generates every batch, with the weights it trains: one update per version."""
    return TrainerPlan(old_policy=old_policy(cfg), engine_is_rollout=True)


def run_sync(cfg: Config) -> dict[str, Any]:
    with open_run(cfg, RolloutSide.ACTOR, trainer_plan(cfg)) as (run, algorithm, roles):
        params, skip, filler = run.sampling(), RolloutSkip(cfg), BatchFiller(cfg)

        def launch(b: int, g: int = 1):
            return skip.launch(roles.rollouts, run.next_prompts(), params, run.gen_seed(), b, gen_batch=g)

        step = run.start_step - 1
        for step in range(run.start_step, cfg.trainer.total_training_steps + 1):
            tm = StepTimer(step)
            with tm("step"):
                with tm("gen"):
                    gen = filler.fill(step, launch(step), lambda g, b=step: launch(b, g))
                    samples = gen.samples
                with tm("prepare"):
                    prepared = algorithm.prepare(samples, step)()
                staleness = staleness_metrics(samples, run.version)  # 0 by construction; measured anyway
                with tm("train"):
                    trained = run.learn(algorithm, prepared, step)
            metrics = run.step_metrics(
                prepared.samples, prepared.batch, tm, prepared.metrics, trained.metrics, staleness, gen.metrics
            )
            run.end_step(step, metrics, roles)
        return run.finish(roles, step)
