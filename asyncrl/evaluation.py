"""Held-out accuracy: one response per prompt, scored by the reward registry; accuracy = fraction scored 1.0.

Used in-process (``asyncrl eval``, SFT) with a ``RolloutEngine`` and by pipelines through a worker's ``generate``;
both go through ``evaluate_prompts`` so every number called "accuracy" is computed the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.rewards.reward_fn import RewardFn
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.types import Prompt, Sample

GenerateFn = Callable[[list[Prompt], SamplingParams, int], list[Sample]]
EVAL_SEED = 12345  # fixed so that sampled (temperature > 0) evaluations are comparable across runs


def evaluate_prompts(
    generate: GenerateFn,
    prompts: list[Prompt],
    reward_fn: RewardFn,
    response_length: int,
    temperature: float = 0.0,
    batch_size: int = 512,
    group_of: Callable[[Prompt], str] | None = None,
) -> dict:
    """Greedy (or sampled) accuracy over ``prompts``. With ``group_of``, also ``by_group``: {group: [accuracy, n]}
    for the groups it names (e.g. a difficulty level from the row's metadata), to see where a gain comes from."""
    params = SamplingParams(n=1, temperature=temperature, max_new_tokens=response_length)
    samples: list[Sample] = []
    for start in range(0, len(prompts), batch_size):
        samples += generate(prompts[start : start + batch_size], params, EVAL_SEED + start)
    reward_fn.score(samples)
    if not samples:
        return {"accuracy": 0.0, "n": 0.0}
    ok = [s.reward >= 1.0 - 1e-6 for s in samples]
    result: dict = {
        "accuracy": sum(ok) / len(samples),
        "n": float(len(samples)),
        "response_length_mean": sum(len(s.response_ids) for s in samples) / len(samples),
    }
    if group_of is not None:
        groups: dict[str, list[bool]] = {}
        for s, good in zip(samples, ok):
            groups.setdefault(group_of(s.prompt), []).append(good)
        result["by_group"] = {g: [sum(v) / len(v), len(v)] for g, v in sorted(groups.items())}
    return result
