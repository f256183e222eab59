"""Scoring samples. A reward never takes the run down: a scorer that raises, returns garbage or meets an unknown
``data_source`` fails that sample only (``reward_failed=True``, ``reward=0.0``), counted in ``reward/failed_count``
and ``RewardFn.failed_total`` and logged.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl.rewards.custom import ScoreFn, load_custom_function
from asyncrl.rewards.overlong import OverlongShaping
from asyncrl.rewards.registry import get_scorer
from asyncrl.types import Sample

logger = logging.getLogger(__name__)


def _as_number(value: Any) -> float | None:
    """``float(value)`` for bools, ints, floats and numpy/torch scalars; ``None`` for anything else."""
    if isinstance(value, bool | int | float):
        return float(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            item = value.item()
        except (TypeError, ValueError, RuntimeError):  # arrays/tensors with more than one element
            return None
        return float(item) if isinstance(item, bool | int | float) else None
    return None


def normalize_result(result: Any, who: str) -> tuple[float, dict[str, float]]:
    """Turn a scorer's return value into ``(reward, extra)``.

    A number is the reward. A dict must have a numeric ``"score"``; its other numeric values (bools count, as 1.0/0.0)
    go to ``extra`` and non-numeric ones (e.g. verl's ``"pred"`` string) are dropped, since ``Sample.reward_extra``
    holds floats only. A non-finite reward raises: NaN would poison every advantage in its group.
    """
    extra: dict[str, float] = {}
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"{who} returned a dict without 'score' (keys {sorted(result)})")
        score = _as_number(result["score"])
        if score is None:
            raise ValueError(f"{who} returned score of type {type(result['score']).__name__}, expected a number")
        for key, value in result.items():
            number = _as_number(value)
            if key != "score" and number is not None:
                extra[str(key)] = number
    else:
        score = _as_number(result)
        if score is None:
            raise ValueError(f"{who} returned {type(result).__name__}, expected a number or a dict with 'score'")
    if not math.isfinite(score):
        raise ValueError(f"{who} returned a non-finite reward ({score})")
    return score, extra


class RewardFn:
    """Fills ``reward``, ``reward_failed`` and ``reward_extra`` of samples from their ``response_text``.

    With ``custom_function`` (a spec for ``load_custom_function``) that function scores every data source, as verl's
    ``custom_reward_function`` does; otherwise the scorer is looked up by ``data_source`` in the registry, once per
    data source (the first time one of its samples is scored: register a scorer before training starts). Picklable
    (for Ray): only the spec travels, the function is re-imported on the other side.
    """

    def __init__(
        self,
        custom_function: str | None = None,
        max_logged_errors: int = 5,
        binarize: bool = False,
        overlong: OverlongShaping | None = None,
    ):
        self.custom_function = custom_function
        self.binarize = binarize  # reward = 1.0 for a full score, else 0.0 (the raw score stays in reward_extra)
        self.overlong = overlong  # the DAPO manager's length penalty, added after binarize (asyncrl.rewards.overlong)
        self.max_logged_errors = max_logged_errors
        self._custom: ScoreFn | None = load_custom_function(custom_function) if custom_function else None
        self._scorers: dict[str, ScoreFn] = {}  # the registry's answer per data source
        self.failed_total = 0
        self.last_errors: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_custom"] = None  # functions loaded from a file are not importable by name, so not picklable
        state["_scorers"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.custom_function:
            self._custom = load_custom_function(self.custom_function)

    def scorer_for(self, data_source: str) -> ScoreFn:
        """The function that scores ``data_source`` (raises ``UnknownDataSourceError`` if there is none)."""
        if self._custom is not None:
            return self._custom
        scorer = self._scorers.get(data_source)
        if scorer is None:
            scorer = self._scorers[data_source] = get_scorer(data_source)
        return scorer

    def score_one(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
    ) -> tuple[float, dict[str, float]]:
        """``(reward, extra)`` for one response; raises whatever the scorer raises. An ``async def`` scorer is run to
        completion here (``asyncrl.rewards.loop`` awaits it on its event loop instead)."""
        result = self.call(data_source, solution_str, ground_truth, extra_info)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return self.normalize(result, data_source)

    def call(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
    ) -> Any:
        """The scorer's raw return value (an awaitable for an ``async def`` scorer)."""
        return self.scorer_for(data_source)(data_source, solution_str, ground_truth, dict(extra_info or {}))

    def normalize(self, result: Any, data_source: str) -> tuple[float, dict[str, float]]:
        if self._custom is not None:
            return normalize_result(result, f"reward function {self.custom_function!r}")
        return normalize_result(result, f"scorer {self.scorer_for(data_source).__name__}")

    def score(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Score ``samples`` in place; never raises for a single sample. Returns ``{"reward/failed_count": n}``.

        A failed sample gets ``reward=0.0``, ``reward_failed=True``, empty ``reward_extra``; the failure messages of
        this call are kept in ``last_errors`` (and the first ``max_logged_errors`` are logged as warnings).
        """
        self.last_errors = []
        for sample in samples:
            p = sample.prompt
            try:
                outcome: tuple[float, dict[str, float]] | Exception = self.score_one(
                    p.data_source, sample.response_text or "", p.ground_truth, p.extra_info
                )
            except Exception as e:  # any scorer error is confined to its sample (see module docstring)
                outcome = e
            self.record(sample, outcome)
        return self.finish_batch()

    def record(self, sample: Sample, outcome: tuple[float, dict[str, float]] | BaseException) -> None:
        """Fill ``sample`` from its ``(reward, extra)``, or mark it failed with the error (kept in ``last_errors``)."""
        if isinstance(outcome, BaseException):
            e = outcome
            message = f"sample {sample.uid} (data_source {sample.prompt.data_source!r}): {type(e).__name__}: {e}"
            self.last_errors.append(message)
            sample.reward, sample.reward_failed, sample.reward_extra = 0.0, True, {}
            if len(self.last_errors) <= self.max_logged_errors:
                logger.warning("reward failed for %s", message)
            return
        reward, extra = outcome
        if self.binarize:
            extra = {**extra, "score": reward}
            reward = 1.0 if reward >= 1.0 - 1e-6 else 0.0
        if self.overlong is not None:
            reward, extra = self.overlong.apply(sample, reward, extra)
        sample.reward, sample.reward_failed, sample.reward_extra = reward, False, extra

    def finish_batch(self) -> dict[str, float]:
        """Close a batch's books: the failures since the last ``last_errors`` reset."""
        failed = len(self.last_errors)
        if failed > self.max_logged_errors:
            logger.warning(
                "reward failed for %d more samples in this batch (see RewardFn.last_errors)",
                failed - self.max_logged_errors,
            )
        self.failed_total += failed
        return {"reward/failed_count": failed}

    __call__ = score


def build_reward_fn(custom_function: str | None = None, binarize: bool = False) -> RewardFn:
    """A ``RewardFn``; a bad ``custom_function`` spec raises ``RewardSpecError`` here, at start-up (the overlong
    shaping is added by ``asyncrl.rewards.loop.build_reward_loop``)."""
    return RewardFn(custom_function or None, binarize=binarize)


async def _awaited(result: Any) -> Any:
    return await result
