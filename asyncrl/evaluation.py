"""Held-out accuracy: ``n`` responses per prompt (``rollout.val_kwargs``), scored by the reward registry; accuracy =
the fraction of responses scored 1.0 (the mean over every prompt's responses).

Used in-process (``asyncrl eval``, SFT) with a ``RolloutEngine`` and by pipelines through a worker's ``generate``
(``Run.evaluate``: on a rollout worker's engine where the schedule has a pool); all go through ``score_samples`` so
every number called "accuracy" is computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt, Sample

GenerateFn = Callable[[list[Prompt], SamplingParams, int], list[Sample]]
EVAL_SEED = 12345  # fixed so that sampled (temperature > 0) evaluations are comparable across runs


def val_sampling(val_kwargs: Any, response_length: int) -> SamplingParams:
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
    params: SamplingParams | None = None,
) -> dict:
    """Greedy (or sampled: ``temperature``, or ``params`` whole, e.g. ``val_sampling``'s) accuracy over
    ``prompts``; see ``score_samples``."""
    if params is None:
        params = SamplingParams(n=1, temperature=temperature, max_new_tokens=response_length)
    samples: list[Sample] = []
    for seed, chunk in chunks(prompts, batch_size):
        samples += generate(chunk, params, seed)
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
