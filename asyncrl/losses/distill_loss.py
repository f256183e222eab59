"""Losses for on-policy distillation (GKD, Agarwal et al. 2024 "On-Policy Distillation of Language Models").

Notation: p = teacher, q = student, per response position. Two kinds of teacher signal are supported:

* **Top-k distributions** (``teacher_topk_ids_BTK`` long, ``teacher_topk_logp_BTK``): the teacher's K most likely ids
  per position and their log-probs *normalised over the full vocabulary* (so sum_k p_k <= 1; the rest, 1 - sum_k p_k,
  is the tail the teacher did not send). The student gives its full ``student_logp_BTV``. Ids within one position
  must be distinct; a padded slot needs a valid id and log-prob -inf (it then carries no mass).
* **Sampled-token log-probs** (``teacher_logp_BT``): the teacher's log-prob of the token the student sampled -- the
  cheap signal used by tinker / prime-rl style on-policy distillation.

All divergences are in nats per token; each function returns ``(loss, per_token_BT)`` with the per-token value 0 on
padding, and the loss aggregated by ``loss_agg_mode`` (see :func:`asyncrl.losses.agg_loss`). The teacher side is
always detached.
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
    """Forward KL(teacher || student) per position, restricted to the teacher's top-k ids. Returns ``(loss, kl_BT)``.

    The teacher's mass outside its top k is unknown, so the full-vocabulary KL cannot be computed; ``tail`` says how
    the remaining mass is handled:

    - ``"renorm"``: renormalise both teacher and student over the K ids only
      (p~_k = p_k / sum_j p_j, q~_k = q_k / sum_j q_j) and return KL(p~ || q~). This ignores how much mass the student
      puts outside the K ids: a student that puts 90% of its mass elsewhere but has the right *shape* on the K ids
      gets loss 0.
    - ``"bucket"`` (default): add one "everything else" bucket, with teacher mass 1 - sum_k p_k and student mass
      1 - sum_k q_k over the *same* ids (each clamped below at ``eps`` to keep the log finite), and return the exact
      KL of these (K+1)-outcome distributions. This coarsened KL is a lower bound on the full-vocabulary KL (data
      processing inequality: merging outcomes cannot increase a KL); it is exact when the teacher's top k holds all
      its mass, and it does penalise a student that leaks mass outside the teacher's top k.

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
    """Generalised Jensen-Shannon divergence of GKD (Agarwal et al. 2024, eq. 1) on the teacher's top-k support.

    With p = teacher, q = student (on the coarsened support, see ``tail`` in :func:`topk_forward_kl`) and the mixture
    m = beta * p + (1 - beta) * q:

        JSD_beta(p || q) = beta * KL(p || m) + (1 - beta) * KL(q || m)

    This is the convention of TRL's ``GKDTrainer.generalized_jsd_loss``: ``beta`` weights the *teacher* side.
    ``beta = 0.5`` is the symmetric JSD (>= 0, bounded by log 2, 0 iff p = q). The endpoints are taken as limits,
    as TRL does: ``beta = 0`` returns forward KL(p || q) and ``beta = 1`` reverse KL(q || p). Note the formula
    itself tends to 0 at both ends -- JSD_beta / beta -> KL(p || q) as beta -> 0 and JSD_beta / (1 - beta) ->
    KL(q || p) as beta -> 1 -- so the endpoints are the *rescaled* limits and the loss scale jumps there
    (beta = 0.01 gives roughly 0.01 * KL(p || q), beta = 0 gives KL(p || q)). Returns ``(loss, jsd_BT)``.
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
    """Per-token reverse KL(student || teacher) estimated on student-sampled tokens. Returns ``(loss, kl_BT)``.

    Inputs are the log-probs, under student q and teacher p, of the token x_t the student sampled at each position.
    Per token (value, nats), with log r = log p(x_t) - log q(x_t):
      - ``k1``: log q - log p. Unbiased for KL(q || p) at that position; can be negative on single tokens.
      - ``k3``: r - 1 - log r. Also unbiased (x ~ q), always >= 0, lower variance when q ~ p. Not clamped.
    ``kl_BT`` (0 on padding) carries this value; ``loss`` is its aggregate, so its *value* is the KL estimate.

    What the gradient is -- be careful, the obvious version does not train:

    - ``gradient="pathwise"``: plain autograd through the estimator with the sampled tokens held fixed.
      For k1 this is grad log q(x_t), whose expectation under x_t ~ q is **zero**: minimising "student_logp -
      teacher_logp" by backprop alone gives no learning signal in expectation, only noise (the teacher term has no
      gradient). For k3 it is (1 - p/q) grad log q(x_t), whose expectation is -sum_x p(x) grad log q(x) = the gradient
      of the *forward* KL(p || q) at that position, not of the reverse KL.
    - ``gradient="score_function"`` (default): a surrogate whose value equals ``kl_BT`` but whose gradient is
      stopgrad(log q - log p) * grad log q(x_t) for either estimator -- the REINFORCE / score-function gradient of
      KL(q || p) at each position, unbiased when x_t ~ q. This is what on-policy distillation does in practice
      (tinker uses -(log q - log p) as a per-token advantage in a policy-gradient loss; equivalently the pathwise
      gradient of k2 = 0.5 (log q - log p)^2).

    Caveats: (1) the score-function gradient is *per position* -- it treats each token's KL as a one-step problem
    and ignores that x_t also changes the states of later tokens (the full sequence-level gradient would weight
    grad log q(x_t) by the sum of the remaining per-token KLs); (2) it is unbiased only if x_t was sampled from the
    same q that ``student_logp_BT`` comes from. For stale or engine-sampled tokens, pass -kl_BT.detach() as the
    advantage to :func:`asyncrl.losses.policy_loss_ppo_clip` together with truncated importance weights instead.
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
    """GKD's data mix: True (use student-generated, on-policy responses) with probability ``lmbda``, else False
    (use the dataset's / teacher's responses).

    ``lmbda = 1`` is pure on-policy distillation, ``lmbda = 0`` pure supervised KD. One draw from ``generator``
    (u ~ U[0, 1), on-policy iff u < lmbda), so a seeded generator makes the schedule reproducible.
    """
    if not 0.0 <= lmbda <= 1.0:
        raise ValueError(f"lmbda must be in [0, 1] (got {lmbda})")
    return bool(torch.rand((), generator=generator).item() < lmbda)
