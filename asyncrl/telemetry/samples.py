"""The per-step metrics of a trained batch's samples: rewards, lengths, and the agent loop's turns and tool calls."""

from __future__ import annotations

import torch

from asyncrl import losses
from asyncrl.data.collate import TrainBatch, group_ids, rewards_of
from asyncrl.types import Sample


def sample_metrics(samples: list[Sample], batch: TrainBatch) -> dict[str, float]:
    """``reward/*``, ``response_length/*`` (tokens, tool outputs included), ``prompt_length/mean`` and, for
    multi-turn samples, ``agent/*`` (see ``agent_metrics``)."""
    rewards = rewards_of(samples)
    lens = batch.response_lengths().float()
    return {
        "reward/mean": float(rewards.mean()),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "reward/failed_count": float(sum(s.reward_failed for s in samples)),
        # groups whose rewards differ: the only ones GRPO learns from
        "reward/group_spread_frac": losses.group_reward_spread(rewards, group_ids(samples)),
        "response_length/mean": float(lens.mean()),
        "response_length/max": float(lens.max()),
        "response_length/p95": float(torch.quantile(lens, 0.95)),
        "response_length/clip_ratio": float(sum(s.stop_reason == "length" for s in samples) / len(samples)),
        "prompt_length/mean": float(sum(len(s.prompt.prompt_ids) for s in samples) / len(samples)),
        **agent_metrics(samples),
    }


def agent_metrics(samples: list[Sample]) -> dict[str, float]:
    """Multi-turn metrics of a batch (none when every sample is single-turn): ``agent/turns_mean`` (assistant
    turns per sample), ``agent/tool_call_rate`` (share of samples that called a tool), ``agent/tool_calls_mean``,
    ``agent/tool_error_count`` (calls that failed: raised, timed out, unknown tool, unparsable) and
    ``agent/tool_token_frac`` (share of response tokens that are tool output, trained with mask 0)."""
    if not samples or all(s.response_mask is None for s in samples):
        return {}
    n = len(samples)
    tokens = sum(len(s.response_ids) for s in samples)
    tool_tokens = sum(len(s.response_mask) - sum(s.response_mask) for s in samples if s.response_mask is not None)
    return {
        "agent/turns_mean": sum(s.turns for s in samples) / n,
        "agent/tool_call_rate": sum(s.tool_calls > 0 for s in samples) / n,
        "agent/tool_calls_mean": sum(s.tool_calls for s in samples) / n,
        "agent/tool_error_count": float(sum(s.tool_errors for s in samples)),
        "agent/tool_token_frac": tool_tokens / max(tokens, 1),
    }
