"""Overlong reward shaping (DAPO's soft overlong punishment; verl's ``reward_model.reward_manager=dapo`` with
``reward_model.reward_kwargs.overlong_buffer_cfg``).

A response that is cut at the length limit is scored as if it were a finished answer, which punishes a correct
line of reasoning for being long and rewards nothing for finishing. DAPO softens the limit: over the last ``len``
tokens before ``max_resp_len`` the reward goes down linearly, by ``penalty_factor`` at ``max_resp_len``. For a
response of ``L`` tokens (every response token, eos and tool output included, as verl counts the attention mask):

    expected_len = max_resp_len - len
    penalty      = min(-(L - expected_len) / len * penalty_factor, 0)        reward units, added to the score

Applied by ``RewardFn.record`` to every scored sample, wherever its rule reward is computed (the rollout workers,
the sync trainer, the fully_async Rollouter), after ``reward.binarize``; a failed sample keeps its reward of 0.
Held-out accuracy is scored without it: it counts correct answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config import RewardConfig
from asyncrl.config.specs import RewardSpec
from asyncrl.types import Sample


def overlong_penalty(length: int, max_resp_len: int, buffer_len: int, penalty_factor: float) -> float:
    """The penalty (<= 0, reward units) of a response of ``length`` tokens (see the module docstring)."""
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
