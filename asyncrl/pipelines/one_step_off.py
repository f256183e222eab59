"""``one_step_off``: the rollout pool generates batch t+1 while the trainer learns on batch t.

Two resource pools: one trainer (rank 0 of the weight-sync group) and ``rollout.num_workers`` rollout workers.
Per step, top to bottom:

    wait for batch t (generated with weights v(t-2), or v(t-1) at the first step)   timing_s/wait_prev_gen
    sync the trainer's weights v(t-1) to the rollout pool                             timing_s/sync_rollout_weights
    launch generation of batch t+1 (with v(t-1); not waited for)
    reward -> (ref log-probs) -> (old log-probs) -> GRPO advantages -> update -> v(t) timing_s/update_actor
    metrics (staleness from each sample's recorded version) -> (eval) -> (checkpoint)

So every sample but the first batch's is trained on exactly one version after the one that generated it; the
staleness metrics are computed from the versions the engine recorded, not assumed. Where this departs from verl's
recipe: the in-flight batch's prompts are not lost at a checkpoint (the data cursor saved is the one from before that
batch was drawn, so a resumed run draws and generates it again).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from asyncrl.config import Config
from asyncrl.pipelines.common import Run, StepTimer, gather_generation, launch_generation, staleness_metrics
from asyncrl.sync.ray_sync import setup_weight_sync, sync_weights
from asyncrl.sync.stats import memcpy_bytes_per_s
from asyncrl.workers.actor_worker import ActorRolloutWorker
from asyncrl.workers.cluster import init_ray, make_pools, release_pools
from asyncrl.workers.rollout_worker import RolloutWorker


def run_one_step_off(cfg: Config) -> dict[str, Any]:
    run = Run(cfg)
    init_ray(cfg.ray)
    r, t = cfg.rollout, cfg.trainer
    pools = make_pools({"trainer": (1, t.cpus_per_worker), "rollout": (r.num_workers, r.cpus_per_worker)})
    trainer = pools["trainer"].spawn(0, ActorRolloutWorker, cfg, name="trainer")
    rollouts = [pools["rollout"].spawn(i, RolloutWorker, cfg, name=f"rollout{i}") for i in range(r.num_workers)]
    try:
        return _loop(cfg, run, trainer, rollouts)
    finally:
        for actor in [trainer, *rollouts]:
            ray.kill(actor)
        release_pools(pools)


def _loop(cfg: Config, run: Run, trainer: Any, rollouts: list[Any]) -> dict[str, Any]:
    s = cfg.sync
    start = run.maybe_resume({"actor_rollout": trainer})
    plan = setup_weight_sync(trainer, rollouts, bucket_mb=s.bucket_mb, timeout_s=s.timeout_s)
    run.summary["sync_bytes"] = plan["bytes"]
    run.summary["memcpy_bytes_per_s"] = memcpy_bytes_per_s(int(plan["bytes"]))
    version = start - 1  # the trainer's weight version = updates applied so far
    sync_weights(trainer, rollouts, version, verify=s.verify, timeout_s=s.timeout_s)  # after a resume: catch up
    logger = run.open_logger()
    total = cfg.trainer.total_training_steps
    params = run.sampling()

    run.evaluate_before_training(trainer)

    pending = launch_generation(rollouts, run.next_prompts(), params, run.gen_seed(start), start)
    step = start - 1
    for step in range(start, total + 1):
        tm = StepTimer(step)
        t_step = time.perf_counter()
        with tm("wait_prev_gen"):
            samples, gen_s = gather_generation(pending)
        with tm("sync_rollout_weights"):
            stats = sync_weights(trainer, rollouts, version, verify=s.verify, timeout_s=s.timeout_s)
        # the cursor after batch `step` (the one trained now), before batch step+1 is drawn: a checkpoint of this
        # step resumes by drawing and generating the in-flight batch step+1 again, so it is neither lost nor repeated
        cursor_for_checkpoint = run.sampler.state_dict()
        if step < total:
            pending = launch_generation(rollouts, run.next_prompts(), params, run.gen_seed(step + 1), step + 1)
        with tm("reward"):
            reward_stats = run.score(samples)
        batch = run.make_train_batch(samples, trainer, tm, step)  # (ref) -> (old log-probs) -> advantages
        with tm("update_actor"):
            actor_metrics = ray.get(trainer.update.remote(batch, step))
        staleness = staleness_metrics(samples, trainer_version=version)
        version += 1
        run.samples_trained += len(samples)
        tm.timings["timing_s/step"] = time.perf_counter() - t_step

        metrics = run.step_metrics(samples, batch, tm, reward_stats, actor_metrics, staleness)
        metrics["timing_s/gen"] = gen_s  # measured on the rollout workers, overlapped with the previous step
        metrics["sync/seconds"] = stats.seconds
        metrics["sync/bytes_per_s"] = stats.bytes_per_s
        if run.due(cfg.trainer.test_freq, step):
            metrics.update(run.evaluate(trainer, step))
        logger.log(step, metrics)
        if run.due(cfg.trainer.save_freq, step):
            run.save(step, {"actor_rollout": trainer}, sampler_state=cursor_for_checkpoint)

    last = run.last_val_accuracy()
    if last is not None:
        run.summary["accuracy_after"] = last
    events = ray.get(trainer.pop_timeline.remote()) + sum(ray.get([w.pop_timeline.remote() for w in rollouts]), [])
    return run.finish(trainer, step, events)
