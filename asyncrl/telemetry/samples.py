"""The per-step metrics of a trained batch's samples: rewards, lengths, and the agent loop's turns and tool calls."""

from __future__ import annotations

import torch

from asyncrl import algos
from asyncrl.agent.loop import agent_metrics
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
        "reward/group_spread_frac": algos.group_reward_spread(rewards, group_ids(samples)),
        "response_length/mean": float(lens.mean()),
        "response_length/max": float(lens.max()),
        "response_length/p95": float(torch.quantile(lens, 0.95)),
        "response_length/clip_ratio": float(sum(s.stop_reason == "length" for s in samples) / len(samples)),
        "prompt_length/mean": float(sum(len(s.prompt.prompt_ids) for s in samples) / len(samples)),
        **agent_metrics(samples),
    }
