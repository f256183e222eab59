"""Combining a reward model's scores with rule-based rewards (pure functions on tensors)."""

from __future__ import annotations

import torch
from torch import Tensor


def combine_rewards(rule_B: Tensor, rm_logit_B: Tensor, rule_weight: float, rm_weight: float) -> Tensor:
    """``rule_weight * rule + rm_weight * sigmoid(rm_logit)``, per sample.

    The reward model's logit is squashed to (0, 1) so both terms live on the rule scorer's [0, 1] scale and the
    weights mean what they say (``rm_weight=0`` ignores the reward model, ``rule_weight=0`` trains on it alone).
    """
    if rule_B.shape != rm_logit_B.shape:
        raise ValueError(f"rule_B and rm_logit_B must have the same [B] shape (got {rule_B.shape}, {rm_logit_B.shape})")
    return rule_weight * rule_B.float() + rm_weight * torch.sigmoid(rm_logit_B.float())


def token_level_rewards(reward_B: Tensor, mask_BT: Tensor) -> Tensor:
    """The outcome reward placed on each response's last real token, 0 elsewhere: [B, T] (GAE's input)."""
    out = torch.zeros_like(mask_BT, dtype=torch.float32)
    lengths_B = mask_BT.sum(dim=1).long()
    rows = torch.nonzero(lengths_B > 0).squeeze(-1)
    out[rows, lengths_B[rows] - 1] = reward_B[rows].float()
    return out
