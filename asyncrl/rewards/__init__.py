"""Rewards: answer extraction, built-in scorers (reasoning-gym, math-verify), user functions, batch scoring, DAPO's
overlong shaping and its dynamic-sampling rule."""

from asyncrl.rewards.custom import RewardSpecError, load_custom_function
from asyncrl.rewards.filtering import FilterMetricError, filter_groups, group_by_prompt, keep_group, metric_value
from asyncrl.rewards.overlong import OverlongShaping, overlong_penalty
from asyncrl.rewards.registry import (
    MATH_DATA_SOURCES,
    UnknownDataSourceError,
    get_scorer,
    known_data_sources,
    register_scorer,
    unregister_scorer,
)
from asyncrl.rewards.reward_fn import RewardFn, build_reward_fn, normalize_result
from asyncrl.rewards.scorers import extract_answer, math_verify_score, reasoning_gym_score

__all__ = [
    "MATH_DATA_SOURCES",
    "FilterMetricError",
    "OverlongShaping",
    "RewardFn",
    "RewardSpecError",
    "UnknownDataSourceError",
    "build_reward_fn",
    "extract_answer",
    "filter_groups",
    "group_by_prompt",
    "keep_group",
    "metric_value",
    "overlong_penalty",
    "get_scorer",
    "known_data_sources",
    "load_custom_function",
    "math_verify_score",
    "normalize_result",
    "reasoning_gym_score",
    "register_scorer",
    "unregister_scorer",
]
