"""Losses for on-policy distillation (GKD, Agarwal et al. 2024); what each optimises, and why its gradient is what it
is: docs/algorithms/distill.md, "What it optimises". p = teacher, q = student, per response position.

The teacher sends either its top K ids per position (``teacher_topk_ids_BTK``, distinct within a position) with
log-probs normalised over the full vocabulary (``teacher_topk_logp_BTK``; a padded slot needs a valid id and log-prob
-inf), against the student's full ``student_logp_BTV``; or its log-prob of the token the student sampled
(``teacher_logp_BT``). Divergences are in nats per token; each function returns ``(loss, per_token_BT)``, the
per-token value 0 on padding and the loss aggregated by ``loss_agg_mode`` (``agg_loss``). The teacher is detached.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from asyncrl.losses.tokens import (
    _float32_rows,
    _float_mask,
    agg_loss,
    check_one_of,
    check_same_shape,
    zero_padding,
)

TAIL_MODES: tuple[str, ...] = ("renorm", "bucket")
REVERSE_KL_ESTIMATORS: tuple[str, ...] = ("k1", "k3")
REVERSE_KL_GRADIENTS: tuple[str, ...] = ("score_function", "pathwise")


def _kl_last_dim(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a || b) = sum a (log a - log b) over the last dim, with 0 log 0 = 0 (a slot with a = 0 adds nothing)."""
    a = log_a.exp()
    return torch.where(a > 0, a * (log_a - log_b), torch.zeros((), dtype=a.dtype, device=a.device)).sum(dim=-1)


def _log_one_minus_sum_exp(log_p_BTK: Tensor, eps: float) -> Tensor:
    """log(max(1 - sum_k exp(log_p_k), eps)) -> [B, T, 1]: the log-mass of everything outside the K ids."""
    rest = -torch.expm1(torch.logsumexp(log_p_BTK, dim=-1, keepdim=True))
    return torch.log(torch.clamp(rest, min=eps))


def _coarse_logprobs(
    student_logp_BTV: Tensor,
    teacher_topk_ids_BTK: Tensor,
    teacher_topk_logp_BTK: Tensor,
    mask_BT: Tensor,
    tail: str,
    eps: float,
) -> tuple[Tensor, Tensor]:
    """Teacher and student log-probs on the coarsened support: ``[B, T, K]`` (renorm) or ``[B, T, K+1]`` (bucket).

    On padding positions the teacher row is replaced by a harmless uniform one: padding may hold NaN or all -inf,
    and even though the per-token value is masked out afterwards, NaN would leak into the student's gradient.
    """
    check_one_of("tail", tail, TAIL_MODES)
    if student_logp_BTV.dim() != 3 or teacher_topk_ids_BTK.dim() != 3:
        raise ValueError(
            f"student_logp_BTV must be [B, T, V] and teacher_topk_ids_BTK [B, T, K] (got "
            f"{tuple(student_logp_BTV.shape)} and {tuple(teacher_topk_ids_BTK.shape)})"
        )
    check_same_shape(teacher_topk_ids_BTK=teacher_topk_ids_BTK, teacher_topk_logp_BTK=teacher_topk_logp_BTK)
    if teacher_topk_ids_BTK.shape[:2] != student_logp_BTV.shape[:2]:
        raise ValueError(
            f"teacher top-k and student must share [B, T] (got {tuple(teacher_topk_ids_BTK.shape[:2])} and "
            f"{tuple(student_logp_BTV.shape[:2])})"
        )
    # Re-normalising over V is a no-op on log-probs and makes raw logits acceptable too.
    dtype = torch.promote_types(student_logp_BTV.dtype, torch.float32)
    log_z_BT1 = _float32_rows(lambda x: torch.logsumexp(x, dim=-1), student_logp_BTV).unsqueeze(-1)
    log_q_BTK = student_logp_BTV.gather(-1, teacher_topk_ids_BTK.long()).to(dtype) - log_z_BT1
    log_p_BTK = teacher_topk_logp_BTK.detach().to(dtype)
    valid_BT1 = (_float_mask(mask_BT, log_p_BTK) != 0).unsqueeze(-1)
    log_p_BTK = torch.where(valid_BT1, log_p_BTK, -math.log(log_p_BTK.shape[-1]))
    if tail == "renorm":
        log_p = log_p_BTK - torch.logsumexp(log_p_BTK, dim=-1, keepdim=True)
        log_q = log_q_BTK - torch.logsumexp(log_q_BTK, dim=-1, keepdim=True)
        return log_p, log_q
    log_p = torch.cat([log_p_BTK, _log_one_minus_sum_exp(log_p_BTK, eps)], dim=-1)
    log_q = torch.cat([log_q_BTK, _log_one_minus_sum_exp(log_q_BTK, eps)], dim=-1)
    return log_p, log_q


def _finish(per_token_BT: Tensor, mask_BT: Tensor, loss_agg_mode: str) -> tuple[Tensor, Tensor]:
    per_token_BT = torch.where(_float_mask(mask_BT, per_token_BT) != 0, per_token_BT, 0.0)
    return agg_loss(per_token_BT, mask_BT, loss_agg_mode), per_token_BT


def topk_forward_kl(
    student_logp_BTV: Tensor,
    teacher_topk_ids_BTK: Tensor,
    teacher_topk_logp_BTK: Tensor,
    mask_BT: Tensor,
    tail: str = "bucket",
    loss_agg_mode: str = "token-mean",
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Forward KL(teacher || student) per position on the teacher's top-k ids, the rest of the mass as ``tail`` says
    (``renorm`` or ``bucket``, its masses clamped below at ``eps``). Returns ``(loss, kl_BT)``.

    ``student_logp_BTV`` may be log-probs or raw logits (it is re-normalised with logsumexp, a no-op on log-probs);
    apply any distillation temperature before calling. Computed in float32 (float64 stays float64); gradients flow to
    the student only.
    """
    log_p, log_q = _coarse_logprobs(student_logp_BTV, teacher_topk_ids_BTK, teacher_topk_logp_BTK, mask_BT, tail, eps)
    return _finish(_kl_last_dim(log_p, log_q), mask_BT, loss_agg_mode)


def generalized_jsd_topk(
    student_logp_BTV: Tensor,
    teacher_topk_ids_BTK: Tensor,
    teacher_topk_logp_BTK: Tensor,
    mask_BT: Tensor,
    beta: float,
    tail: str = "bucket",
    loss_agg_mode: str = "token-mean",
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """GKD's generalised JSD (eq. 1) on the teacher's top-k support (``tail`` as in ``topk_forward_kl``), in TRL's
    convention: ``beta`` weights the teacher, and ``beta`` 0 and 1 give the rescaled limits KL(p || q) and KL(q || p).
    Returns ``(loss, jsd_BT)``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (got {beta})")
    log_p, log_q = _coarse_logprobs(student_logp_BTV, teacher_topk_ids_BTK, teacher_topk_logp_BTK, mask_BT, tail, eps)
    if beta == 0.0:
        per_token_BT = _kl_last_dim(log_p, log_q)
    elif beta == 1.0:
        per_token_BT = _kl_last_dim(log_q, log_p)
    else:
        log_m = torch.logaddexp(log_p + math.log(beta), log_q + math.log(1.0 - beta))
        per_token_BT = beta * _kl_last_dim(log_p, log_m) + (1.0 - beta) * _kl_last_dim(log_q, log_m)
    return _finish(per_token_BT, mask_BT, loss_agg_mode)


def reverse_kl_sampled(
    student_logp_BT: Tensor,
    teacher_logp_BT: Tensor,
    mask_BT: Tensor,
    estimator: str = "k1",
    loss_agg_mode: str = "token-mean",
    gradient: str = "score_function",
) -> tuple[Tensor, Tensor]:
    """Per-token reverse KL(student || teacher) estimated on the tokens the student sampled, from their log-probs
    under both. Returns ``(loss, kl_BT)``: ``kl_BT`` (0 on padding) is the ``estimator``'s value, k1 = log q - log p
    (can be negative on one token) or k3 = r - 1 - log r (>= 0, not clamped), and ``loss`` its aggregate.

    ``gradient="score_function"`` (default): stopgrad(log q - log p) * grad log q(x_t), for either estimator;
    ``"pathwise"``: plain autograd through the estimator, which does not train the reverse KL (why:
    docs/algorithms/distill.md). The score-function gradient is per position and unbiased only for tokens sampled
    from this q; for stale tokens, pass -kl_BT.detach() as the advantage to ``policy_loss_ppo_clip`` with importance
    weights.
    """
    check_one_of("estimator", estimator, REVERSE_KL_ESTIMATORS)
    check_one_of("gradient", gradient, REVERSE_KL_GRADIENTS)
    check_same_shape(student_logp_BT=student_logp_BT, teacher_logp_BT=teacher_logp_BT, mask_BT=mask_BT)
    log_q = zero_padding(student_logp_BT, mask_BT)
    log_p = zero_padding(teacher_logp_BT.detach(), mask_BT)
    k1_BT = log_q - log_p
    if estimator == "k1":
        value_BT = k1_BT
    else:
        log_r = log_p - log_q
        value_BT = torch.expm1(log_r) - log_r
    if gradient == "score_function":
        # value: value_BT; gradient: stopgrad(k1) * grad log q.
        value_BT = value_BT.detach() + k1_BT.detach() * (log_q - log_q.detach())
    return _finish(value_BT, mask_BT, loss_agg_mode)


def mix_on_policy(lmbda: float, generator: torch.Generator) -> bool:
    """GKD's data mix: True (train on the student's own responses) with probability ``lmbda``, else False (on the
    dataset's); one draw from ``generator``, so a seeded generator makes the schedule reproducible."""
    if not 0.0 <= lmbda <= 1.0:
        raise ValueError(f"lmbda must be in [0, 1] (got {lmbda})")
    return bool(torch.rand((), generator=generator).item() < lmbda)
