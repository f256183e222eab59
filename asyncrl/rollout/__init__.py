"""Rollout generation: our batched, pausable decode loop over a transformers causal LM (the CPU hot path)."""

from asyncrl.rollout.engine import EngineBusyError, RolloutEngine, WeightUpdateError
from asyncrl.rollout.sampling import SamplingParams

__all__ = ["EngineBusyError", "RolloutEngine", "SamplingParams", "WeightUpdateError"]
