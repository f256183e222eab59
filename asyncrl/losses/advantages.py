"""Advantage estimators (GRPO's group-relative outcome advantages, PPO's GAE) and masked whitening; their formulas:
docs/algorithms/grpo.md and ppo.md, "What it optimises". GRPO advantages with ``norm_by_std`` are in group standard
deviations, GAE advantages and returns in reward units.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.losses.tokens import _float_mask, check_same_shape, masked_mean, masked_var


def _group_stats(rewards_B: Tensor, group_ids_B: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-response dense group index 0..G-1 (groups need not be contiguous or sorted), and per-group count, mean and
    unbiased std (0 for groups of size 1)."""
    check_same_shape(rewards_B=rewards_B, group_ids_B=group_ids_B)
    if group_ids_B.dim() != 1:
        raise ValueError(f"group_ids_B must be 1-D [B] (got shape {tuple(group_ids_B.shape)})")
    _, inverse_B = torch.unique(group_ids_B, return_inverse=True)
    G = int(inverse_B.max().item()) + 1 if inverse_B.numel() > 0 else 0
    r = rewards_B.to(torch.float32) if not rewards_B.is_floating_point() else rewards_B
    count_G = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inverse_B, torch.ones_like(r))
    mean_G = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inverse_B, r) / count_G
    sq_dev_G = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inverse_B, (r - mean_G[inverse_B]) ** 2)
    multi_G = count_G > 1
    var_G = torch.where(multi_G, sq_dev_G / torch.where(multi_G, count_G - 1, torch.ones_like(count_G)), 0.0)
    return inverse_B, count_G, mean_G, var_G.sqrt()


def compute_grpo_advantages(
    rewards_B: Tensor, group_ids_B: Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO outcome advantage ``adv_B``: each response's reward minus its group's mean (responses with one
    ``group_ids_B``), over (unbiased group std + eps) with ``norm_by_std``. A group of one gets 0 (it has no baseline;
    verl passes its raw reward through)."""
    inverse_B, count_G, mean_G, std_G = _group_stats(rewards_B, group_ids_B)
    r = rewards_B.to(mean_G.dtype)
    adv_B = r - mean_G[inverse_B]
    if norm_by_std:
        adv_B = adv_B / (std_G[inverse_B] + eps)
    return torch.where(count_G[inverse_B] > 1, adv_B, torch.zeros_like(adv_B))


def broadcast_advantages(adv_B: Tensor, mask_BT: Tensor) -> Tensor:
    """Give every response token its response's advantage: ``adv_BT = adv_B[:, None] * mask_BT`` (0 on padding)."""
    if adv_B.dim() != 1 or adv_B.shape[0] != mask_BT.shape[0]:
        raise ValueError(
            f"adv_B must be 1-D with one entry per row of mask_BT (got {tuple(adv_B.shape)} and {tuple(mask_BT.shape)})"
        )
    return adv_B[:, None] * _float_mask(mask_BT, adv_B)


def group_reward_spread(rewards_B: Tensor, group_ids_B: Tensor) -> float:
    """Fraction of groups whose rewards are not all equal (the only ones GRPO learns from), in [0, 1]; a group of
    one counts as all equal, an empty batch gives 0.0."""
    if rewards_B.numel() == 0:
        return 0.0
    inverse_B, _, _, std_G = _group_stats(rewards_B, group_ids_B)
    return int((std_G > 0).sum().item()) / std_G.numel()


def compute_gae(
    rewards_BT: Tensor, values_BT: Tensor, mask_BT: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016) over response tokens, as docs/algorithms/ppo.md writes
    it, with t+1 the next *real* token and V = A = 0 after the last one: rewards and values on padding are ignored.

    Same recursion as verl's ``compute_gae_advantage_return``, with two departures: advantages are returned *raw*
    (verl whitens them inside; call :func:`whiten` yourself), and both outputs are 0 on padding. Runs in float32 or
    the input dtype if wider. Returns ``(advantages_BT, returns_BT)``, both detached, in reward units.
    """
    check_same_shape(rewards_BT=rewards_BT, values_BT=values_BT, mask_BT=mask_BT)
    with torch.no_grad():
        dtype = torch.promote_types(torch.promote_types(rewards_BT.dtype, values_BT.dtype), torch.float32)
        m = mask_BT.to(dtype)
        valid = m != 0
        r = torch.where(valid, rewards_BT.to(dtype), 0.0)
        v = torch.where(valid, values_BT.to(dtype), 0.0)
        B, T = r.shape
        next_value_B = torch.zeros(B, dtype=dtype, device=r.device)
        last_gae_B = torch.zeros(B, dtype=dtype, device=r.device)
        adv_cols = [None] * T
        for t in reversed(range(T)):
            delta_B = r[:, t] + gamma * next_value_B - v[:, t]
            gae_B = delta_B + gamma * lam * last_gae_B
            # Padding is transparent: carry the next real token's value and advantage through it.
            next_value_B = torch.where(valid[:, t], v[:, t], next_value_B)
            last_gae_B = torch.where(valid[:, t], gae_B, last_gae_B)
            adv_cols[t] = torch.where(valid[:, t], gae_B, 0.0)
        advantages_BT = torch.stack(adv_cols, dim=1) if T > 0 else torch.zeros_like(r)
        returns_BT = torch.where(valid, advantages_BT + v, 0.0)
    return advantages_BT, returns_BT


def whiten(x_BT: Tensor, mask_BT: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Masked whitening, as verl's ``masked_whiten``: (x - mean) / sqrt(var + eps) over the masked tokens.

    The variance is unbiased (Bessel-corrected), like verl. With ``shift_mean=False`` the mean is added back, so only
    the scale changes. Departure from verl: padding positions are set to 0 in the output (verl whitens them too).
    Statistics are over the whole tensor (all rows), i.e. batch-level whitening.
    """
    mean = masked_mean(x_BT, mask_BT)
    var = masked_var(x_BT, mask_BT, unbiased=True)
    out = (x_BT - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(_float_mask(mask_BT, out) != 0, out, torch.zeros((), dtype=out.dtype, device=out.device))
