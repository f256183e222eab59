"""Dynamic sampling's rule (DAPO; ``algorithm.filter_groups``): a group (the ``rollout.n`` samples of one prompt)
whose metric is the same for every sample has all-zero GRPO advantages and no DPO pair, so it is dropped. Pure, so
that every producer of groups imports it without importing a schedule. The metrics, and where this departs from verl:
docs/rewards.md, "DAPO: dynamic sampling and overlong shaping".
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.errors import UserInputError
from asyncrl.types import Sample

BUILT_IN_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


class FilterMetricError(UserInputError, ValueError):
    """``algorithm.filter_groups.metric`` names a value the samples do not carry."""


def metric_value(sample: Sample, metric: str) -> float:
    """The value of ``metric`` for ``sample``, in reward units; ``FilterMetricError`` when the sample lacks it."""
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
