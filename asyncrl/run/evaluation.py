"""Held-out accuracy: the fraction of responses the reward registry scores 1.0, computed by ``score_samples`` for
every caller (``asyncrl eval`` and SFT in-process with a ``RolloutEngine``, a run through ``held_out``), so every
number called "accuracy" is computed the same way.

A run evaluates on the engine that generates its training batches (``evaluators``), so the trainer spends no memory on
a KV cache where the schedule has a rollout side; with which weights: docs/metrics.md, ``val/version``. fully_async's
Rollouter evaluates while parked: with ``async_training.partial_rollout`` its rows are interrupted and resumed after,
as at a sync; else they end first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.config.rollout import ValKwargsConfig
from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.roles.clients import RolloutClient, RolloutWorkerClient
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Prompt, Sample

GenerateFn = Callable[[list[Prompt], SamplingParams, int], list[Sample]]
EVAL_SEED = 12345  # fixed so that sampled (temperature > 0) evaluations are comparable across runs


def val_sampling(val_kwargs: ValKwargsConfig, response_length: int) -> SamplingParams:
    """``rollout.val_kwargs`` as sampling: ``n`` responses per prompt, greedy unless ``do_sample`` (then its
    temperature, top-p and top-k). Greedy with ``n`` > 1 decodes n identical responses, as verl's validation does
    (it repeats the batch n times whatever ``do_sample`` says)."""
    v = val_kwargs
    if not v.do_sample:
        return SamplingParams(n=v.n, temperature=0.0, max_new_tokens=response_length)
    top_k = max(v.top_k, 0)  # -1 (verl's vLLM spelling) = off
    return SamplingParams(n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=top_k, max_new_tokens=response_length)


def chunks(prompts: list[Prompt], batch_size: int) -> list[tuple[int, list[Prompt]]]:
    """(seed, prompts) of each generation call: ``batch_size`` prompts each, seeded by where the chunk starts, so a
    chunk draws the same tokens whichever engine decodes it."""
    return [(EVAL_SEED + start, prompts[start : start + batch_size]) for start in range(0, len(prompts), batch_size)]


def evaluate_prompts(
    generate: GenerateFn,
    prompts: list[Prompt],
    reward_fn: RewardFn,
    response_length: int,
    temperature: float = 0.0,
    batch_size: int = 512,
    group_of: Callable[[Prompt], str] | None = None,
) -> dict:
    """Greedy (or sampled at ``temperature``) accuracy over ``prompts``, one response each; see ``score_samples``."""
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=response_length)
    samples = [s for seed, chunk in chunks(prompts, batch_size) for s in generate(chunk, params, seed)]
    return score_samples(samples, reward_fn, group_of)


def score_samples(samples: list[Sample], reward_fn: RewardFn, group_of: Callable[[Prompt], str] | None = None) -> dict:
    """Score ``samples`` and count: ``accuracy`` (fraction scored 1.0), ``n`` (responses), ``prompts``,
    ``response_length_mean`` (tokens). With ``group_of``, also ``by_group``: {group: [accuracy, responses]} for the
    groups it names (e.g. a difficulty level from the row's metadata), to see where a gain comes from."""
    reward_fn.score(samples)
    if not samples:
        return {"accuracy": 0.0, "n": 0.0, "prompts": 0.0}
    ok = [s.reward >= 1.0 - 1e-6 for s in samples]
    result: dict = {
        "accuracy": sum(ok) / len(samples),
        "n": float(len(samples)),
        "prompts": float(len({(s.prompt.epoch, s.prompt.index) for s in samples})),
        "response_length_mean": sum(len(s.response_ids) for s in samples) / len(samples),
    }
    if group_of is not None:
        groups: dict[str, list[bool]] = {}
        for s, good in zip(samples, ok):
            groups.setdefault(group_of(s.prompt), []).append(good)
        result["by_group"] = {g: [sum(v) / len(v), len(v)] for g, v in sorted(groups.items())}
    return result


def held_out(run: Any, step: int) -> dict[str, float]:
    """Held-out accuracy at ``rollout.val_kwargs`` (``val_sampling``) on the engine that generates the training
    batches (``evaluators``); ``val/version`` is the weight version the responses were decoded with (the oldest, if
    the engines differ)."""
    if run.prompts.val is None:
        return {}
    prompts = [run.prompts.val[i] for i in range(len(run.prompts.val))]
    params = val_sampling(run.cfg.rollout.val_kwargs, run.cfg.rollout.response_length)

    def decode(engines: list[RolloutClient]) -> list[Sample]:
        calls = [
            engines[k % len(engines)].generate(chunk, params, seed, step, score=False)
            for k, (seed, chunk) in enumerate(chunks(prompts, run.cfg.data.val_batch_size))
        ]  # issued at once: each engine decodes its share of the chunks
        return [s for call in calls for s in call.result().samples]

    with get_timeline().span("validate", step=step, worker="driver"):
        if run.stream is not None and run.stream.streaming:  # fully_async, streaming: its Rollouter, parked, decodes
            interrupt = run.cfg.async_training.partial_rollout
            samples = run.stream.parked(lambda r: decode([RolloutClient(r.handle)]), interrupt)
            if samples is None:  # the Rollouter died on the way (replaced): nothing evaluated this step
                return {}
        else:
            samples = decode(evaluators(run, step))
        res = score_samples(samples, run.reward_fn)
    version = min((s.start_version for s in samples), default=run.progress.version)
    return {"val/accuracy": res["accuracy"], "val/n": res["n"], "val/version": float(version)}


def evaluators(run: Any, step: int) -> list[RolloutClient]:
    """Who decodes the held-out prompts: the trainer in ``sync``, else the rollout side. A pool worker takes the call
    after the generation it runs, so it decodes with the last sync's weights (one_step_off at step t: v(t-1), which
    generate batch t+1); at the last step (nothing in flight) the pool first gets the final weights. A resumed run's
    pool is not synced before training: the trainer evaluates then. fully_async's Rollouter decodes here before its
    stream starts (step 0); once it streams, ``held_out`` parks it."""
    roles = run.roles
    if roles.rollouter is not None:
        return [RolloutClient(roles.rollouter.handle)] if run.progress.version == 0 else [roles.trainer]
    trainer_ranks = roles.trainer.ranks
    pool = [r for r in roles.rollouts if not any(r.handle is h for h in trainer_ranks)]
    if not pool or (step == 0 and run.progress.version != 0):
        return [roles.trainer]
    if step == run.cfg.trainer.total_training_steps and run.sync is not None:
        behind = [RolloutWorkerClient(r.handle).version().result() != run.progress.version for r in pool]
        if any(behind):
            (run.pool or run.sync).push(run.progress.version)
    return pool
