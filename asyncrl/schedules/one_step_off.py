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
from asyncrl.config.specs import TrainerPlan
from asyncrl.roles.team import RolloutSide
from asyncrl.schedules.dynamic_sampling import BatchFiller
from asyncrl.schedules.run import open_run
from asyncrl.schedules.skip import RolloutSkip
from asyncrl.schedules.step import StepTimer, old_policy, staleness_metrics
from asyncrl.supervision.supervisor import WorkerLostError


def trainer_plan(cfg: Config) -> TrainerPlan:
    """The rollout pool generates; the trainer only evaluates with its engine: one update per version."""
    return TrainerPlan(old_policy=old_policy(cfg))


def run_one_step_off(cfg: Config) -> dict[str, Any]:
    with open_run(cfg, RolloutSide.POOL, trainer_plan(cfg)) as (run, algorithm, roles):
        sync = run.start_weight_sync(roles)
        skip, filler = RolloutSkip(cfg), BatchFiller(cfg)
        params, total = run.sampling(), cfg.trainer.total_training_steps

        def launch(b: int, g: int = 1):
            return skip.launch(roles.rollouts, run.next_prompts(), params, run.gen_seed(), b, run.pool, gen_batch=g)

        pending = launch(run.start_step)
        step, cursor = run.start_step - 1, None
        for step in range(run.start_step, total + 1):
            tm = StepTimer(step)
            with tm("step"):
                try:  # the pool replaces a rollout worker that died; past its budget, stop after a checkpoint
                    with tm("wait_prev_gen"):
                        gen = filler.fill(step, pending, lambda g, b=step: launch(b, g))
                        samples = gen.samples
                    with tm("sync_rollout_weights"):
                        stats = (run.pool or sync).push(run.version)
                except WorkerLostError:
                    run.save_before_failing(step - 1, roles, cursor)
                    raise
                # the cursor after batch `step` (all its generation batches), before batch step+1 is drawn: a
                # checkpoint of this step resumes by drawing and generating the in-flight batch step+1 again, so it
                # is neither lost nor repeated
                cursor = run.sampler.state_dict()
                if step < total:
                    pending = launch(step + 1)
                with tm("prepare"):
                    prepared = algorithm.prepare(samples, step)()
                staleness = staleness_metrics(samples, run.version)
                with tm("train"):
                    trained = run.learn(algorithm, prepared, step)
            metrics = run.step_metrics(
                prepared.samples,
                prepared.batch,
                tm,
                prepared.metrics,
                trained.metrics,
                staleness,
                sync.metrics(stats),
                gen.metrics,
            )
            metrics["timing_s/gen"] = gen.seconds  # measured on the rollout workers, overlapped with the previous step
            run.end_step(step, metrics, roles, sampler_state=cursor)
        return run.finish(roles, step)
