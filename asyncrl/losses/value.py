"""Critic (value-function) loss for PPO, and explained variance as its health metric.

Values and returns are in reward units per response token, ``[B, T]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.losses.tokens import agg_loss, check_same_shape, masked_mean, masked_var, zero_padding


def value_loss_clipped(
    vpreds_BT: Tensor,
    old_values_BT: Tensor,
    returns_BT: Tensor,
    mask_BT: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped value loss, as docs/algorithms/ppo.md writes it (and verl's ``compute_value_loss``): the max makes
    it pessimistic, so a prediction cannot profit from moving more than ``cliprange_value`` (reward units) from its
    rollout-time value. ``old_values_BT`` and ``returns_BT`` are detached here.

    Returns ``(loss, stats)`` with ``stats["vf_clipfrac"]`` (detached 0-d tensor): fraction of real tokens where the
    clipped branch was strictly larger, i.e. the clip changed the loss.
    """
    check_same_shape(vpreds_BT=vpreds_BT, old_values_BT=old_values_BT, returns_BT=returns_BT, mask_BT=mask_BT)
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value must be >= 0 (got {cliprange_value})")
    old_values_BT = zero_padding(old_values_BT.detach(), mask_BT)
    returns_BT = zero_padding(returns_BT.detach(), mask_BT)
    vpreds_BT = zero_padding(vpreds_BT, mask_BT)
    vpred_clipped_BT = torch.clamp(vpreds_BT, old_values_BT - cliprange_value, old_values_BT + cliprange_value)
    loss_unclipped_BT = (vpreds_BT - returns_BT) ** 2
    loss_clipped_BT = (vpred_clipped_BT - returns_BT) ** 2
    loss_BT = torch.maximum(loss_unclipped_BT, loss_clipped_BT)
    loss = 0.5 * agg_loss(loss_BT, mask_BT, loss_agg_mode)
    with torch.no_grad():
        stats = {"vf_clipfrac": masked_mean((loss_clipped_BT > loss_unclipped_BT).float(), mask_BT)}
    return loss, stats


def explained_variance(values_BT: Tensor, returns_BT: Tensor, mask_BT: Tensor) -> float:
    """1 - Var[R - V] / Var[R] over real tokens (population variances); 0.0 rather than NaN or inf when the returns
    have no spread (identical rewards, no real token), so the metric stays plottable."""
    with torch.no_grad():
        v = values_BT.detach().float()
        r = returns_BT.detach().float()
        var_r = masked_var(r, mask_BT, unbiased=False)
        if not float(var_r) > 0:
            return 0.0
        var_resid = masked_var(r - v, mask_BT, unbiased=False)
        return float(1.0 - var_resid / var_r)
