"""``fully_async``: a Rollouter streams groups through a bounded queue; the trainer consumes them as they come.

Two resource pools: the trainer (rank 0 of the weight-sync group) and one Rollouter (``asyncrl.workers.rollouter``),
which generates on its own thread all the time, admitted by the staleness controller. Per trainer step, top to bottom:

    take B = require_batches x ppo_mini_batch_size groups from the queue (oldest first)   timing_s/wait_batch
    reward -> (ref) -> old log-probs (current weights | proximal snapshot | behaviour) -> GRPO advantages
    update (require_batches optimizer steps)                                              timing_s/update_actor
    every trigger_parameter_sync_step steps: version += 1 and                             timing_s/param_sync
        park the Rollouter (partial_rollout: interrupt its decode; else let it finish) ->
        broadcast the weights -> (checkpoint snapshot) -> it resumes with the new version
    metrics (staleness and partial spans from the versions the engine recorded) -> (eval) -> (checkpoint)

Staleness is bounded by the controller's admission rule (proof in ``asyncrl/streaming/staleness.py``) and checked at
every consumption. A checkpoint is taken while the Rollouter is parked for a sync, so it holds the queue, the
in-flight partial rows, the controller, the prompt ledger and the prompt cursor of one instant: a resumed run loses and
repeats no prompt (``ledger.json`` at the end of the run is the evidence).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import ray
import torch

from asyncrl.config import Config
from asyncrl.pipelines.common import Run, StepTimer, staleness_metrics
from asyncrl.streaming.ledger import PromptLedger
from asyncrl.sync.ray_sync import setup_weight_sync, sync_weights
from asyncrl.sync.stats import memcpy_bytes_per_s
from asyncrl.types import Sample
from asyncrl.workers.actor_worker import ActorRolloutWorker
from asyncrl.workers.cluster import init_ray, make_pools, release_pools
from asyncrl.workers.rollouter import Rollouter

ROLLOUTER_STATE = "rollouter_state.pt"


def run_fully_async(cfg: Config) -> dict[str, Any]:
    run = Run(cfg)
    init_ray(cfg.ray)
    r, t = cfg.rollout, cfg.trainer
    pools = make_pools({"trainer": (1, t.cpus_per_worker), "rollout": (1, r.cpus_per_worker)})
    trainer = pools["trainer"].spawn(0, ActorRolloutWorker, cfg, name="trainer")
    rollouter = pools["rollout"].spawn(0, Rollouter, cfg, name="rollouter", max_concurrency=4)
    try:
        return _loop(cfg, run, trainer, rollouter)
    finally:
        try:
            ray.get(rollouter.stop.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - already failing or dead: killing it below is all that is left
            pass
        for actor in (trainer, rollouter):
            ray.kill(actor)
        release_pools(pools)


def partial_metrics(samples: list[Sample]) -> dict[str, float]:
    """Samples whose tokens come from more than one weight version (interrupted by a sync and resumed)."""
    spans = [(max(s.versions) - min(s.versions)) if s.versions else 0 for s in samples]
    partial = sum(sp > 0 for sp in spans)
    return {
        "fully_async/partial/total_partial_num": float(partial),
        "fully_async/partial/partial_ratio": partial / len(samples),
        "fully_async/partial/max_partial_span": float(max(spans)),
    }


def processing_metrics(seconds: list[float]) -> dict[str, float]:
    """Seconds from a group's admission to its arrival in the queue, over the groups of this step."""
    q = sorted(seconds)

    def pct(p: float) -> float:
        return q[min(len(q) - 1, int(round(p * (len(q) - 1))))]

    pre = "fully_async/processing_time/"
    return {
        pre + "avg": statistics.fmean(q),
        pre + "max": q[-1],
        pre + "tp50": pct(0.50),
        pre + "tp95": pct(0.95),
        pre + "tp99": pct(0.99),
    }


def _loop(cfg: Config, run: Run, trainer: Any, rollouter: Any) -> dict[str, Any]:
    s, at = cfg.sync, cfg.async_training
    k = at.trigger_parameter_sync_step
    groups_per_step = at.require_batches * cfg.actor.ppo_mini_batch_size
    old_policy = "prox" if at.compute_prox_log_prob else "actor"

    start = run.maybe_resume({"actor_rollout": trainer})
    plan = setup_weight_sync(trainer, [rollouter], bucket_mb=s.bucket_mb, timeout_s=s.timeout_s)
    run.summary["sync_bytes"] = plan["bytes"]
    run.summary["memcpy_bytes_per_s"] = memcpy_bytes_per_s(int(plan["bytes"]))
    version = (start - 1) // k  # weight syncs so far; checkpoints are only taken at syncs, so this is exact
    sync_weights(trainer, [rollouter], version, verify=s.verify, timeout_s=s.timeout_s)
    if run.resumed_from is not None:
        state = torch.load(run.resumed_from / ROLLOUTER_STATE, weights_only=False)
        ray.get(rollouter.restore.remote(state))
    if at.compute_prox_log_prob:
        ray.get(trainer.snapshot_prox.remote())
    logger = run.open_logger()
    total = cfg.trainer.total_training_steps
    run.evaluate_before_training(trainer)
    ray.get(rollouter.take_metrics.remote())  # start the idle window now
    ray.get(rollouter.start.remote())

    step = start - 1
    for step in range(start, total + 1):
        tm = StepTimer(step)
        t_step = time.perf_counter()
        with tm("wait_batch"):
            got = ray.get(rollouter.get_batch.remote(groups_per_step, version))
        samples = [smp for g in got["groups"] for smp in g.samples]
        with tm("reward"):
            reward_stats = run.score(samples)
        batch = run.make_train_batch(samples, trainer, tm, step, old_policy=old_policy)
        with tm("update_actor"):
            actor_metrics = ray.get(trainer.update.remote(batch, step, at.require_batches))
        trained_at = version
        staleness = staleness_metrics(samples, trainer_version=version)
        if max(got["staleness"]) != staleness["fully_async/staleness/max"]:  # two accounts of the same fact
            raise RuntimeError(f"step {step}: controller staleness {got['staleness']} != recorded {staleness}")
        run.samples_trained += len(samples)

        snapshot = None
        sync_metrics: dict[str, float] = {}
        save = run.due(cfg.trainer.save_freq, step)
        if step % k == 0:
            version += 1
            with tm("param_sync"):
                sync_metrics["timing_s/param_sync_pause"] = ray.get(
                    rollouter.pause.remote(interrupt=at.partial_rollout)
                )
                stats = sync_weights(trainer, [rollouter], version, verify=s.verify, timeout_s=s.timeout_s)
                if save:
                    snapshot = ray.get(rollouter.snapshot.remote())
                ray.get(rollouter.resume_generation.remote(version))
            sync_metrics["sync/seconds"] = stats.seconds
            sync_metrics["sync/bytes_per_s"] = stats.bytes_per_s
            if at.compute_prox_log_prob:
                ray.get(trainer.snapshot_prox.remote())
        tm.timings["timing_s/step"] = time.perf_counter() - t_step

        ro = ray.get(rollouter.take_metrics.remote())
        metrics = run.step_metrics(samples, batch, tm, reward_stats, actor_metrics, staleness, sync_metrics, ro)
        metrics.update(partial_metrics(samples))
        metrics.update(processing_metrics(got["processing_s"]))
        metrics["trainer/idle_ratio"] = tm.timings["timing_s/wait_batch"] / tm.timings["timing_s/step"]
        metrics["timing_s/gen"] = ro["rollouter/busy_s"]  # decode seconds on the Rollouter during this step
        metrics["fully_async/trainer_version"] = float(trained_at)  # the version this step's update ran at
        if run.due(cfg.trainer.test_freq, step):
            metrics.update(run.evaluate(trainer, step))
        logger.log(step, metrics)
        if snapshot is not None:
            run.save(step, {"actor_rollout": trainer}, extra_files={ROLLOUTER_STATE: snapshot})

    last = run.last_val_accuracy()
    if last is not None:
        run.summary["accuracy_after"] = last
    ray.get(rollouter.stop.remote())  # the books are final from here on
    counts = ray.get(rollouter.take_metrics.remote())
    run.summary["counts"] = {k.rsplit("/", 1)[1]: v for k, v in counts.items() if k.startswith("fully_async/count/")}
    run.summary["ledger"] = write_ledger_report(run, ray.get(rollouter.ledger_state.remote()))
    events = ray.get(trainer.pop_timeline.remote()) + ray.get(rollouter.pop_timeline.remote())
    return run.finish(trainer, step, events)


def write_ledger_report(run: Run, ledger_state: dict[str, Any]) -> dict[str, Any]:
    """``ledger.json``: the per-prompt ledger and, per epoch, how many prompts were trained on once, lost, repeated."""
    ledger = PromptLedger()
    ledger.load_state_dict(ledger_state)
    epochs = sorted({row[0] for row in ledger_state["records"]})
    reports = {}
    for e in epochs:
        rep = ledger.verify_epoch(e, len(run.train))
        reports[str(e)] = {
            "consumed_once": rep.consumed_once,
            "lost": rep.lost,
            "duplicated": rep.duplicated,
            "dropped": rep.dropped,
            "open": len(rep.open),
            "never_issued": len(rep.never_issued),
            "complete": not rep.open and not rep.never_issued,
        }
    (run.dir / "ledger.json").write_text(json.dumps({"epochs": reports, "ledger": ledger_state}) + "\n")
    return {
        "lost": sum(len(r["lost"]) for r in reports.values()),
        "duplicated": sum(len(r["duplicated"]) for r in reports.values()),
        "dropped": sum(len(r["dropped"]) for r in reports.values()),
        "epochs_complete": sum(r["complete"] for r in reports.values()),
    }
