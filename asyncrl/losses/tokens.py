"""Per-token arithmetic shared by every loss in ``asyncrl.losses``: log-probs and entropies ``[B, T]`` from logits
``[B, T, V]``, and the masked reductions over ``[B, T]`` response tokens.

From logits: computed in float32, bf16/fp16 upcast one batch row at a time (logsumexp over a 150k vocabulary in bf16
loses several digits), never materialising log_softmax; with autograd on, every row's float32 copy is kept for
backward. Masked reductions: padding may hold anything, NaN or inf included, so they select with ``torch.where``
(``nan * 0`` is ``nan``), and an all-zero mask gives 0, not NaN, so an empty micro-batch cannot poison a step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """The mask as float weights (bool -> 0./1.), in at least float32.

    Never bf16/fp16, even for a bf16 ``like``: token counts above 256 are not exact in bf16, so a bf16 denominator
    would silently mis-scale a token-mean. Reductions over bf16 values therefore come out in float32.
    """
    dtype = torch.promote_types(like.dtype, torch.float32) if like.is_floating_point() else torch.float32
    return mask.to(dtype)


def check_one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise a ValueError naming ``name`` and the allowed values unless ``value`` is one of them."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)} (got {value!r})")


def check_same_shape(**tensors: Tensor) -> None:
    """Raise a ValueError naming the tensors and their shapes unless they all have the same shape."""
    shapes = [tuple(t.shape) for t in tensors.values()]
    if any(shape != shapes[0] for shape in shapes):
        *rest, last = tensors
        raise ValueError(f"{', '.join(rest)} and {last} must have the same shape (got {', '.join(map(str, shapes))})")


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with every position where ``mask == 0`` set to 0 (whatever it held, NaN included).

    Use on inputs *before* non-linear ops: a NaN on padding that is only masked out at the end still turns the
    gradient of the real tokens' inputs into NaN through 0 * NaN in backward.
    """
    return torch.where(mask != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Sum of ``x * mask``, ignoring whatever (even NaN/inf) sits where ``mask == 0``."""
    m = _float_mask(mask, x)
    xm = torch.where(m != 0, x * m, torch.zeros((), dtype=m.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim=dim, keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero (a float mask acts as weights).

    Returns 0 (not NaN) wherever the mask sums to 0, over the whole tensor (``dim=None``) or along ``dim``.
    """
    m = _float_mask(mask, x)
    num = masked_sum(x, m, dim=dim, keepdim=keepdim)
    den = m.sum() if dim is None else m.sum(dim=dim, keepdim=keepdim)
    has = den > 0
    return torch.where(has, num / torch.where(has, den, torch.ones_like(den)), torch.zeros_like(num))


def masked_var(x: Tensor, mask: Tensor, dim: int | None = None, keepdim: bool = False, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over masked positions; ``unbiased`` (Bessel, n = mask sum) as verl's ``masked_var``, but 0
    where n <= 1 (verl raises): a lone token has no spread."""
    m = _float_mask(mask, x)
    mean = masked_mean(x, m, dim=dim, keepdim=True)
    centered_sq = (x - mean) ** 2
    var = masked_mean(centered_sq, m, dim=dim, keepdim=keepdim)
    if not unbiased:
        return var
    n = m.sum() if dim is None else m.sum(dim=dim, keepdim=keepdim)
    ok = n > 1
    bessel = n / torch.where(ok, n - 1, torch.ones_like(n))
    return torch.where(ok, var * bessel, torch.zeros_like(var))


def agg_loss(loss_BT: Tensor, mask_BT: Tensor, loss_agg_mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar, as verl's ``agg_loss`` does (the modes: docs/algorithms/grpo.md,
    "What it optimises"), in ``loss_BT``'s units. Departure from verl: in both ``seq-mean-*`` modes a sequence with no
    valid token is left out of the mean over sequences (verl gives NaN for seq-mean-token-mean and counts it as 0 for
    seq-mean-token-sum); an all-empty batch gives 0.
    """
    check_one_of("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_BT, mask_BT)
    m = _float_mask(mask_BT, loss_BT)
    tokens_B = m.sum(dim=-1)
    seq_valid_B = (tokens_B > 0).to(m.dtype)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_loss_B = masked_sum(loss_BT, m, dim=-1)
    else:
        seq_loss_B = masked_mean(loss_BT, m, dim=-1)
    return masked_mean(seq_loss_B, seq_valid_B)


def _float32_rows(fn: Callable[..., Tensor], logits_BTV: Tensor, *per_row: Tensor) -> Tensor:
    """``fn(logits_BTV, *per_row)`` in at least float32: on the whole batch when it is float32/64, else one upcast
    batch row at a time (``per_row`` tensors are split by rows alongside)."""
    if logits_BTV.dtype in (torch.float32, torch.float64):
        return fn(logits_BTV, *per_row)
    rows = zip(logits_BTV.unbind(0), *(t.unbind(0) for t in per_row))
    return torch.stack([fn(row_TV.float(), *rest) for row_TV, *rest in rows], dim=0)


def _picked_logprobs(logits_TV: Tensor, labels_T: Tensor) -> Tensor:
    picked_T = logits_TV.gather(-1, labels_T.long().unsqueeze(-1)).squeeze(-1)
    return picked_T - torch.logsumexp(logits_TV, dim=-1)


def logprobs_from_logits(logits_BTV: Tensor, labels_BT: Tensor) -> Tensor:
    """Natural-log probability of ``labels_BT`` under softmax(logits), ``[B, T]``, in float32 (float64 for float64
    logits)."""
    if logits_BTV.shape[:-1] != labels_BT.shape:
        raise ValueError(
            f"labels_BT must match logits_BTV without its vocab dim (got {tuple(labels_BT.shape)} "
            f"and {tuple(logits_BTV.shape)})"
        )
    return _float32_rows(_picked_logprobs, logits_BTV, labels_BT)


def _entropy_rows(logits_TV: Tensor) -> Tensor:
    # H = -sum p log p = logsumexp(z) - sum softmax(z) * z; stable for any logits (no log of a 0 probability).
    p_TV = torch.softmax(logits_TV, dim=-1)
    return torch.logsumexp(logits_TV, dim=-1) - (p_TV * logits_TV).sum(dim=-1)


def entropy_from_logits(logits_BTV: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, in nats, ``[B, T]``. Logits must be finite: a -inf logit (a vocab
    entry masked out) gives 0 * -inf = NaN; mask with a large negative finite value instead."""
    return _float32_rows(_entropy_rows, logits_BTV)
