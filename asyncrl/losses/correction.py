"""Off-policy correction (truncated importance sampling; Espeholt et al. 2018, Yao et al. 2025) for rollouts whose
behaviour policy (the engine that sampled) is not the policy the PPO ratio is anchored at; why and the formulas:
docs/algorithms/grpo.md, "What it optimises".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.losses.tokens import _float_mask, check_one_of, check_same_shape, masked_mean

IS_LEVELS: tuple[str, ...] = ("token", "sequence")
# Log-ratio clamp for the *diagnostics* (raw weights, k3): e^20 ~ 4.9e8 is already "hopelessly off-policy".
_STATS_LOG_RATIO_CLAMP = 20.0


def truncated_importance_weights(
    behav_logp_BT: Tensor,
    cur_logp_BT: Tensor,
    mask_BT: Tensor,
    level: str = "token",
    threshold: float = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance weights ``[B, T]`` (detached, 0 on padding) for the per-token policy loss, per token or
    per response (``level``), and diagnostics.

    ``cur_logp_BT`` is the policy being corrected *to* (usually the trainer's old/proximal log-probs, so that the
    PPO ratio and the IS weight together form decoupled PPO); ``behav_logp_BT`` is what the engine reported at
    sampling time. The truncation is applied in log space, before exp, so even a sequence whose summed log-ratio is
    1000 gives ``threshold``, never inf. Stats: docs/metrics.md's ``rollout_corr/*``, python floats with one
    ``.item()`` sync each (call this once per micro-batch).
    """
    check_one_of("level", level, IS_LEVELS)
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0 (got {threshold})")
    check_same_shape(behav_logp_BT=behav_logp_BT, cur_logp_BT=cur_logp_BT, mask_BT=mask_BT)
    with torch.no_grad():
        cur = cur_logp_BT.detach()
        dtype = torch.promote_types(cur.dtype, torch.float32)
        m = _float_mask(mask_BT, cur.to(dtype))
        valid = m != 0
        log_ratio_BT = torch.where(valid, cur.to(dtype) - behav_logp_BT.detach().to(dtype), 0.0)
        log_threshold = math.log(threshold)

        if level == "token":
            log_w_BT = log_ratio_BT
            unit_log_w, unit_mask = log_ratio_BT, m
        else:
            log_w_B = log_ratio_BT.sum(dim=-1)
            log_w_BT = log_w_B[:, None].expand_as(log_ratio_BT)
            unit_log_w, unit_mask = log_w_B, (m.sum(dim=-1) > 0).to(dtype)

        weights_BT = torch.where(valid, torch.exp(torch.clamp(log_w_BT, max=log_threshold)), 0.0)

        raw_w = torch.exp(torch.clamp(unit_log_w, -_STATS_LOG_RATIO_CLAMP, _STATS_LOG_RATIO_CLAMP))
        any_unit = bool((unit_mask > 0).any())
        is_max = float(raw_w[unit_mask > 0].max()) if any_unit else 0.0
        clamped_lr = torch.clamp(log_ratio_BT, -_STATS_LOG_RATIO_CLAMP, _STATS_LOG_RATIO_CLAMP)
        k3_BT = torch.expm1(clamped_lr) - clamped_lr
        stats = {
            "rollout_corr/is_mean": float(masked_mean(raw_w, unit_mask)),
            "rollout_corr/is_max": is_max,
            "rollout_corr/truncated_frac": float(masked_mean((unit_log_w > log_threshold).to(dtype), unit_mask)),
            "rollout_corr/kl": float(masked_mean(-log_ratio_BT, m)),
            "rollout_corr/k3_kl": float(masked_mean(k3_BT, m)),
        }
    return weights_BT, stats
