"""PPO clipped surrogate policy loss (with DAPO's asymmetric clipping and dual-clip), as PPO and GRPO use it; the
loss is minimised, and log-probs are natural-log per-token log-probs of the sampled response tokens, ``[B, T]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.losses.tokens import agg_loss, check_same_shape, masked_mean, zero_padding

# log-ratio clamp before exp, as verl: keeps exp() finite for wildly off-policy tokens (e^20 ~ 4.9e8).
_LOG_RATIO_CLAMP = 20.0


def policy_loss_ppo_clip(
    logp_BT: Tensor,
    old_logp_BT: Tensor,
    adv_BT: Tensor,
    mask_BT: Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    clip_ratio_c: float | None = None,
    is_weights_BT: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip loss, aggregated by ``loss_agg_mode``: the formula, the dual clip (``clip_ratio_c`` > 1) and the
    importance weights are docs/algorithms/grpo.md's. ``old_logp_BT`` and ``is_weights_BT`` are detached here.

    Returns ``(loss, stats)``; ``stats`` holds detached 0-d tensors (no GPU sync here; call ``float()`` to log):
      - ``pg_clipfrac``: fraction of real tokens where the clipped branch was the max (i.e. the ratio clip was active);
      - ``ppo_kl``: mean over real tokens of old_logp - logp, a k1 estimate of KL(pi_old || pi) in nats;
      - ``pg_clipfrac_lower``: fraction of real tokens where the dual clip was active (0 if ``clip_ratio_c`` is None).
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for the dual clip (got {clip_ratio_c})")
    check_same_shape(logp_BT=logp_BT, old_logp_BT=old_logp_BT, adv_BT=adv_BT, mask_BT=mask_BT)
    if is_weights_BT is not None:
        check_same_shape(is_weights_BT=is_weights_BT, logp_BT=logp_BT)
    # Padding may hold anything (even NaN); zero it before exp so it cannot poison the gradient.
    old_logp_BT = zero_padding(old_logp_BT.detach(), mask_BT)
    adv_BT = zero_padding(adv_BT.detach(), mask_BT)
    logp_BT = zero_padding(logp_BT, mask_BT)
    log_ratio_BT = torch.clamp(logp_BT - old_logp_BT, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio_BT = torch.exp(log_ratio_BT)

    loss_unclipped_BT = -adv_BT * ratio_BT
    loss_clipped_BT = -adv_BT * torch.clamp(ratio_BT, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_BT = torch.maximum(loss_unclipped_BT, loss_clipped_BT)
    clip_active_BT = (loss_clipped_BT > loss_unclipped_BT).float()

    if clip_ratio_c is not None:
        loss_cap_BT = -adv_BT * clip_ratio_c
        negative_BT = adv_BT < 0
        dual_active_BT = (negative_BT & (loss_BT > loss_cap_BT)).float()
        loss_BT = torch.where(negative_BT, torch.minimum(loss_BT, loss_cap_BT), loss_BT)
    else:
        dual_active_BT = torch.zeros_like(clip_active_BT)

    if is_weights_BT is not None:
        loss_BT = loss_BT * zero_padding(is_weights_BT.detach(), mask_BT)

    loss = agg_loss(loss_BT, mask_BT, loss_agg_mode)
    with torch.no_grad():
        stats = {
            "pg_clipfrac": masked_mean(clip_active_BT, mask_BT),
            "ppo_kl": masked_mean(-log_ratio_BT, mask_BT),
            "pg_clipfrac_lower": masked_mean(dual_active_BT, mask_BT),
        }
    return loss, stats
