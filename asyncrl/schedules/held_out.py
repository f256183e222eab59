"""Held-out evaluation (``val/accuracy``, ``val/n``, ``val/version``): on the engine that generates the training
batches, so the trainer spends no memory on a KV cache where the schedule has a rollout side. ``run`` is the
``asyncrl.schedules.run.Run`` (which imports this module).

- ``sync``: the trainer's engine (it is the rollout).
- ``one_step_off``, ``two_step_off``: the rollout pool's workers (vLLM when configured), with the last sync's weights.
- ``fully_async``: the Rollouter's engine; once it streams, while it is parked (``StreamSupervisor.parked``: with
  ``async_training.partial_rollout`` its rows are interrupted and resumed after, as at a sync; else they end first),
  with the last sync's weights.
"""

from __future__ import annotations

from typing import Any

from asyncrl.evaluation import chunks, score_samples, val_sampling
from asyncrl.roles.clients import RolloutClient
from asyncrl.roles.team import Roles
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Sample


def evaluate(run: Any, roles: Roles, step: int) -> dict[str, float]:
    """Held-out accuracy at ``rollout.val_kwargs`` (``n`` responses per prompt, greedy unless ``do_sample``), on
    the engine that generates the training batches (``evaluators``); ``val/version`` is the weight version the
    responses were decoded with (the oldest, if the engines differ)."""
    if run.val is None:
        return {}
    prompts = [run.val[i] for i in range(len(run.val))]
    params = val_sampling(run.cfg.rollout.val_kwargs, run.cfg.rollout.response_length)

    def decode(engines: list[RolloutClient]) -> list[Sample]:
        calls = [
            engines[k % len(engines)].generate(chunk, params, seed, step, score=False)
            for k, (seed, chunk) in enumerate(chunks(prompts, run.cfg.data.val_batch_size))
        ]  # issued at once: each engine decodes its share of the chunks
        return [s for call in calls for s in call.result().samples]

    with get_timeline().span("validate", step=step, worker="driver"):
        if run.stream is not None:  # fully_async, streaming: its Rollouter decodes them while parked
            interrupt = run.cfg.async_training.partial_rollout
            samples = run.stream.parked(lambda r: decode([RolloutClient(r.handle)]), interrupt)
            if samples is None:  # the Rollouter died on the way (replaced): nothing evaluated this step
                return {}
        else:
            samples = decode(evaluators(run, roles, step))
        res = score_samples(samples, run.reward_fn)
    version = min((s.start_version for s in samples), default=run.version)
    return {"val/accuracy": res["accuracy"], "val/n": res["n"], "val/version": float(version)}


def evaluators(run: Any, roles: Roles, step: int) -> list[RolloutClient]:
    """Who decodes the held-out prompts: the rollout pool where the schedule has one (one/two_step_off: vLLM when
    configured, no trainer memory spent on a KV cache), else the trainer (sync: its engine is the rollout). A pool
    worker takes the call after
    the generation it runs, so it decodes with the last sync's weights (one_step_off at step t: v(t-1), which
    generate batch t+1); at the last step (nothing in flight) the pool first gets the final weights. A resumed
    run's pool is not synced before training: the trainer evaluates then. fully_async: the Rollouter, before its
    stream starts (step 0) and, once it streams, parked (``evaluate``), with the last sync's weights."""
    if roles.rollouter is not None:
        return [RolloutClient(roles.rollouter.handle)] if run.version == 0 else [roles.trainer]
    trainer_ranks = roles.trainer.ranks
    pool = [r for r in roles.rollouts if not any(r.handle is h for h in trainer_ranks)]
    if not pool or (step == 0 and run.version != 0):
        return [roles.trainer]
    if step == run.cfg.trainer.total_training_steps and run.weight_sync is not None:
        behind = [r.handle.call("version").result() != run.version for r in pool]
        if any(behind):
            (run.pool or run.weight_sync).push(run.version)
    return pool
