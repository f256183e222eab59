"""Rollout generation: our batched, pausable decode loop over a transformers causal LM (the CPU hot path)."""

from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.gate import EngineBusyError, WeightUpdateError
from asyncrl.rollout.sampling import SamplingParams

__all__ = ["EngineBusyError", "RolloutEngine", "SamplingParams", "WeightUpdateError"]
