"""Dynamic sampling's rule (DAPO; ``algorithm.filter_groups``): which groups of samples are worth training on.

A group is the ``rollout.n`` samples of one prompt. When its metric is the same for every sample, GRPO's
group-normalised advantages are all zero and online DPO has no pair, so the group costs a trainer pass and teaches
nothing: it is dropped and another prompt is generated in its place. This module is the rule alone, pure and
importable by every producer of groups (the batch schedules' ``asyncrl.run.generation`` and the
fully_async Producer) without importing any schedule.

The metrics, as verl names them, on what an asyncrl ``Sample`` carries:

- ``acc``: ``reward_extra["acc"]`` when the reward function returned one in its dict (verl's math_dapo does), else
  its score after ``reward.binarize`` and before the overlong penalty (a function that returns a number returns its
  accuracy; verl's DAPO manager logs such a number as acc; the penalty records it in ``reward_extra["acc"]``);
- ``score``: the reward function's score before the DAPO manager's overlong penalty and ``reward.binarize``
  (``reward_extra["score"]`` when either changed the reward, else ``reward``);
- ``seq_reward``: ``reward``, the sample's reward as trained (after the overlong penalty; verl's token_level_scores
  summed);
- ``seq_final_reward``: ``reward`` too (verl subtracts ``algorithm.use_kl_in_reward``'s KL penalty here, which
  asyncrl does not build: its KL is a loss term);
- any other name: that key of ``reward_extra`` (a key the reward function returns in its dict), or an error naming
  the metric, the sample and the keys it has.

Where verl differs: verl keeps a group when ``np.std(values) > 0``, and float rounding can make the std of equal
values positive (``np.std([0.1] * 3)`` is 1.4e-17); "no spread" here means all values equal, exactly. Like verl, a
group of one sample is kept (there is no spread to measure).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.errors import UserInputError
from asyncrl.types import Sample

BUILT_IN_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


class FilterMetricError(UserInputError, ValueError):
    """``algorithm.filter_groups.metric`` names a value the samples do not carry."""


def metric_value(sample: Sample, metric: str) -> float:
    """The value of ``metric`` (see the module docstring) for ``sample``, in reward units."""
    extra = sample.reward_extra
    if metric in ("seq_reward", "seq_final_reward"):
        return sample.reward
    if metric in ("score", "acc"):  # without the function's or the penalty's own, the reward is unshaped
        return extra.get(metric, sample.reward)
    if metric in extra:
        return extra[metric]
    raise FilterMetricError(
        f"algorithm.filter_groups.metric={metric!r}: sample {sample.uid} row {sample.row} "
        f"has no such value (its reward_extra holds {sorted(extra) or 'nothing'}; built in: "
        f"{', '.join(BUILT_IN_METRICS)})"
    )


def keep_group(group: Sequence[Sample], metric: str) -> bool:
    """Whether a finished group goes to the trainer: its ``metric`` differs between at least two samples, or it has
    a single sample. Raises ``FilterMetricError`` when a sample lacks the metric, ``ValueError`` for an empty group
    or one that mixes prompts."""
    if not group:
        raise ValueError("keep_group: an empty group")
    uids = {s.uid for s in group}
    if len(uids) > 1:
        raise ValueError(f"keep_group: a group holds the samples of one prompt (got prompts {sorted(uids)})")
    values = [metric_value(s, metric) for s in group]
    return len(values) == 1 or min(values) != max(values)


def group_by_prompt(samples: Sequence[Sample]) -> list[list[Sample]]:
    """``samples`` as groups, one per prompt (``Sample.uid``: epoch and row), in order of first appearance."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.uid, []).append(s)
    return list(groups.values())


def filter_groups(groups: Sequence[Sequence[Sample]], metric: str) -> tuple[list[list[Sample]], int]:
    """The groups ``keep_group`` keeps, in their order, and how many it dropped."""
    kept = [list(g) for g in groups if keep_group(g, metric)]
    return kept, len(groups) - len(kept)
