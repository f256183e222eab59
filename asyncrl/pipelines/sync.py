"""``sync``: the baseline every other mode is measured against.

One colocated worker generates, then trains, then generates again: nothing overlaps. Per step, top to bottom:
generate -> reward -> (reference log-probs) -> (old log-probs) -> GRPO advantages -> PPO update -> metrics ->
(held-out eval) -> (checkpoint). On-policy, so the weight version of every sample equals the trainer's (staleness 0).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from asyncrl.config import Config
from asyncrl.pipelines.common import Run, StepTimer, staleness_metrics
from asyncrl.workers.actor_worker import ActorRolloutWorker
from asyncrl.workers.cluster import init_ray, make_pools, release_pools


def run_sync(cfg: Config) -> dict[str, Any]:
    run = Run(cfg)
    init_ray(cfg.ray)
    pools = make_pools({"actor_rollout": (1, cfg.trainer.cpus_per_worker)})
    worker = pools["actor_rollout"].spawn(0, ActorRolloutWorker, cfg)
    try:
        return _loop(cfg, run, worker)
    finally:
        ray.kill(worker)  # frees its CPUs for whatever runs next on this cluster
        release_pools(pools)


def _loop(cfg: Config, run: Run, worker: Any) -> dict[str, Any]:
    workers = {"actor_rollout": worker}
    start = run.maybe_resume(workers)
    logger = run.open_logger()
    total = cfg.trainer.total_training_steps
    params = run.sampling()

    run.evaluate_before_training(worker)

    step = start - 1
    for step in range(start, total + 1):
        t = StepTimer(step)
        t_step = time.perf_counter()
        prompts = run.next_prompts()
        with t("gen"):
            samples = ray.get(worker.generate.remote(prompts, params, seed=run.gen_seed(step), step=step))
        with t("reward"):
            reward_stats = run.score(samples)
        batch = run.make_train_batch(samples, worker, t, step)  # (ref) -> (old log-probs) -> advantages
        with t("update_actor"):
            actor_metrics = ray.get(worker.update.remote(batch, step))
        run.samples_trained += len(samples)
        t.timings["timing_s/step"] = time.perf_counter() - t_step

        metrics = run.step_metrics(samples, batch, t, reward_stats, actor_metrics)
        metrics.update(staleness_metrics(samples, trainer_version=step - 1))  # 0 by construction; measured anyway
        if run.due(cfg.trainer.test_freq, step):
            metrics.update(run.evaluate(worker, step))
        logger.log(step, metrics)
        if run.due(cfg.trainer.save_freq, step):
            run.save(step, workers)

    last_acc = run.last_val_accuracy()
    if last_acc is not None:
        run.summary["accuracy_after"] = last_acc
    events = ray.get(worker.pop_timeline.remote())
    return run.finish(worker, step, events)
