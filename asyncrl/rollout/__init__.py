"""Rollout generation: our batched, pausable decode loop over a transformers causal LM (the CPU hot path)."""
