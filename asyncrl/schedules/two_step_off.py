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

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asyncrl.algorithms import Prepared
from asyncrl.config import Config
from asyncrl.config.specs import TrainerPlan
from asyncrl.roles.team import RolloutSide
from asyncrl.schedules.dynamic_sampling import BatchFiller
from asyncrl.schedules.generation import Generated, Launched
from asyncrl.schedules.run import open_run
from asyncrl.schedules.skip import Replayed, RolloutSkip
from asyncrl.schedules.step import StepTimer, old_policy, staleness_metrics
from asyncrl.supervision.supervisor import WorkerLostError


def trainer_plan(cfg: Config) -> TrainerPlan:
    """The rollout pool generates; the trainer only evaluates with its engine: one update per version."""
    return TrainerPlan(old_policy=old_policy(cfg))


def run_two_step_off(cfg: Config) -> dict[str, Any]:
    with (
        open_run(cfg, RolloutSide.POOL, trainer_plan(cfg)) as (run, algorithm, roles),
        ThreadPoolExecutor(1, "prepare") as pool,
    ):
        sync = run.start_weight_sync(roles)
        skip, filler = RolloutSkip(cfg), BatchFiller(cfg)
        params, total = run.sampling(), cfg.trainer.total_training_steps
        cursors: dict[int, dict] = {run.start_step - 1: run.sampler.state_dict()}  # batch b -> cursor after it

        def launch(b: int, g: int = 1) -> Launched | Replayed:
            """Batch b's g-th generation batch (g > 1: dynamic sampling's, drawn before batch b+1's first)."""
            prompts = run.next_prompts()
            cursors[b] = run.sampler.state_dict()
            return skip.launch(roles.rollouts, prompts, params, run.gen_seed(), b, run.pool, gen_batch=g)

        def fill(b: int, first: Launched | Replayed) -> Generated:
            return filler.fill(b, first, lambda g: launch(b, g))

        def start_preparing(generated: Generated, b: int) -> Future[tuple[Prepared, Generated]]:
            finish = algorithm.prepare(generated.samples, b)  # issued here, in batch order; finished on the thread
            return pool.submit(lambda: (finish(), generated))

        preparing = start_preparing(fill(run.start_step, launch(run.start_step)), run.start_step)
        pending = launch(run.start_step + 1) if run.start_step < total else None
        step = run.start_step - 1
        for step in range(run.start_step, total + 1):
            tm = StepTimer(step)
            sync_metrics: dict[str, float] = {}
            with tm("step"):
                with tm("wait_prev_prepare"):
                    prepared, gen = preparing.result()
                    samples = gen.samples
                if pending is not None:  # batch step+1 is generated: prepare it while this step trains
                    try:  # the pool replaces a rollout worker that died; past its budget, stop after a checkpoint
                        with tm("wait_prev_gen"):
                            generated = fill(step + 1, pending)
                        with tm("sync_rollout_weights"):
                            sync_metrics = sync.metrics((run.pool or sync).push(run.version))
                    except WorkerLostError:
                        run.save_before_failing(step - 1, roles, cursors.get(step - 1))
                        raise
                    pending = launch(step + 2) if step + 2 <= total else None
                    preparing = start_preparing(generated, step + 1)
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
                sync_metrics,
                gen.metrics,
            )
            metrics["timing_s/gen"] = gen.seconds
            run.end_step(step, metrics, roles, sampler_state=cursors[step])
            for b in [b for b in cursors if b < step]:
                del cursors[b]
        return run.finish(roles, step)
