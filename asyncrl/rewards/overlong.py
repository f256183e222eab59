"""Overlong reward shaping (DAPO's soft overlong punishment; ``reward_model.reward_manager=dapo`` with
``reward_model.reward_kwargs.overlong_buffer_cfg``): the formula, where it applies and what it logs are in
docs/rewards.md, "DAPO: dynamic sampling and overlong shaping". ``RewardFn.record`` applies it to every scored sample,
after ``reward.binarize``; a failed sample keeps its 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config import RewardConfig
from asyncrl.config.specs import RewardSpec
from asyncrl.types import Sample


def overlong_penalty(length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """The penalty (<= 0, reward units) of a response of ``length`` tokens, eos and tool output included."""
    if buffer_len < 1:
        raise ValueError(f"overlong_penalty: buffer_len must be >= 1 token (got {buffer_len})")
    expected_len = max_resp_len - buffer_len
    return min(-(length - expected_len) / buffer_len * penalty_factor, 0.0)


@dataclass(frozen=True)
class OverlongShaping:
    """The DAPO manager's penalty as a scoring role applies it; ``log``: record it in ``reward_extra``."""

    max_resp_len: int  # tokens
    buffer_len: int  # tokens
    penalty_factor: float  # reward units at max_resp_len
    log: bool = False

    @classmethod
    def of(cls, reward: RewardConfig) -> OverlongShaping | None:
        """The shaping a role's reward spec asks for (a ``RewardSpec``), or None: a plain ``RewardConfig`` (a
        test's, evaluation's) and a disabled buffer shape nothing."""
        if not isinstance(reward, RewardSpec) or not reward.overlong_buffer.enable:
            return None
        ob = reward.overlong_buffer
        return cls(reward.max_resp_len, ob.len, ob.penalty_factor, ob.log)

    def apply(self, sample: Sample, reward: float, extra: dict[str, float]) -> tuple[float, dict[str, float]]:
        """``(reward + penalty, extra)`` for a scored sample (``reward`` after ``reward.binarize``). ``extra`` keeps
        what the penalty hides: ``score``, the function's own score (verl's reward_extra_info holds it too; binarize
        already put the raw one there), and ``acc``, the unshaped reward, unless the function returned an ``acc``
        of its own (verl's DAPO manager logs a plain number as acc); with ``log``, ``overlong_reward`` is the
        penalty and ``overlong`` 1.0 when it is below 0 (verl's two keys)."""
        penalty = overlong_penalty(len(sample.response_ids), self.max_resp_len, self.buffer_len, self.penalty_factor)
        extra = {"score": reward, "acc": reward, **extra}
        if self.log:
            extra.update(overlong_reward=penalty, overlong=float(penalty < 0))
        return reward + penalty, extra


def overlong_metrics(samples: list[Sample]) -> dict[str, float]:
    """A step's ``reward/overlong_reward_mean`` (the mean penalty, reward units) and ``reward/overlong_frac`` (the
    share of samples penalised), from what ``overlong_buffer_cfg.log`` recorded; none without it."""
    logged = [s.reward_extra for s in samples if "overlong_reward" in s.reward_extra]
    if not logged:
        return {}
    return {
        "reward/overlong_reward_mean": sum(e["overlong_reward"] for e in logged) / len(logged),
        "reward/overlong_frac": sum(e["overlong"] for e in logged) / len(logged),
    }
