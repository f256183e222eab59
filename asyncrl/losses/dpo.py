"""Direct preference optimisation losses over (chosen, rejected) response pairs, ``sigmoid`` (DPO) and ``ipo``, on
each response's log-ratio against the reference (``sequence_logratios``); the formulas: docs/algorithms/dpo.md. ``ipo``
takes log-ratios averaged over each response's tokens (as TRL does), so ``beta`` means the same for any length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from asyncrl.losses.tokens import check_one_of

DPO_LOSSES = ("sigmoid", "ipo")


def sequence_logratios(logp_BT: Tensor, ref_logp_BT: Tensor, mask_BT: Tensor, mean: bool = False) -> Tensor:
    """Per response: the sum (``mean``: the per-token mean) of ``logp - ref_logp`` over its tokens: [B]."""
    diff = (logp_BT - ref_logp_BT) * mask_BT
    total = diff.sum(dim=1)
    return total / mask_BT.sum(dim=1).clamp(min=1) if mean else total


def dpo_loss(
    chosen_P: Tensor, rejected_P: Tensor, beta: float, loss_type: str = "sigmoid", weight_P: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """The mean loss over pairs (``weight_P``: each pair's weight, 0 for a placeholder pair; mean over the weights)
    and its statistics. ``chosen_P``/``rejected_P``: the log-ratios of each pair's responses."""
    check_one_of("dpo_loss: loss_type", loss_type, DPO_LOSSES)
    if beta <= 0:
        raise ValueError(f"dpo_loss: beta must be > 0 (got {beta})")
    h = chosen_P - rejected_P
    losses = -F.logsigmoid(beta * h) if loss_type == "sigmoid" else (h - 1.0 / (2.0 * beta)) ** 2
    w = torch.ones_like(losses) if weight_P is None else weight_P.to(losses.dtype)
    n = w.sum()
    loss = (losses * w).sum() / n.clamp(min=1)
    with torch.no_grad():
        real = w > 0
        if not bool(real.any()):
            return loss, {}
        c, r = beta * chosen_P.detach()[real], beta * rejected_P.detach()[real]
        stats = {
            "dpo/loss": float(loss.detach()),
            "dpo/rewards_chosen": float(c.mean()),
            "dpo/rewards_rejected": float(r.mean()),
            "dpo/rewards_margin": float((c - r).mean()),
            "dpo/logratio_chosen": float(chosen_P.detach()[real].mean()),
            "dpo/logratio_rejected": float(rejected_P.detach()[real].mean()),
            "dpo/preference_accuracy": float((c > r).float().mean()),
        }
    return loss, stats
