"""From logits ``[B, T, V]`` to per-token log-probs and entropies ``[B, T]``, without materialising log_softmax.

Both functions compute in float32, upcasting bf16/fp16 one batch row at a time: logsumexp over a 150k vocabulary in
bf16 loses several digits. Without grad (old/ref log-probs) the extra memory is one row's ``[T, V]`` at a time; with
autograd on, every row's float32 copy is kept for backward, so the saving then is only the never-built log-softmax.
Gradients flow.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _needs_upcast(logits_BTV: Tensor) -> bool:
    return logits_BTV.dtype not in (torch.float32, torch.float64)


def logprobs_from_logits(logits_BTV: Tensor, labels_BT: Tensor) -> Tensor:
    """Natural-log probability of ``labels_BT`` under softmax(logits): ``logits[label] - logsumexp(logits)``.

    Equal to ``log_softmax(logits).gather(-1, labels)`` but never allocates the full ``[B, T, V]`` log-softmax.
    Returns float32 (or float64 if the logits are float64), shape ``[B, T]``.
    """
    if logits_BTV.shape[:-1] != labels_BT.shape:
        raise ValueError(
            f"labels_BT must match logits_BTV without its vocab dim (got {tuple(labels_BT.shape)} "
            f"and {tuple(logits_BTV.shape)})"
        )
    if not _needs_upcast(logits_BTV):
        picked_BT = logits_BTV.gather(-1, labels_BT.long().unsqueeze(-1)).squeeze(-1)
        return picked_BT - torch.logsumexp(logits_BTV, dim=-1)
    out = []
    for row_TV, labels_T in zip(logits_BTV.unbind(0), labels_BT.unbind(0)):
        row_TV = row_TV.float()
        picked_T = row_TV.gather(-1, labels_T.long().unsqueeze(-1)).squeeze(-1)
        out.append(picked_T - torch.logsumexp(row_TV, dim=-1))
    return torch.stack(out, dim=0)


def logsumexp_float32(x_BTV: Tensor) -> Tensor:
    """``logsumexp`` over the last dim in at least float32 (row by row for low-precision input): ``[B, T]``."""
    if not _needs_upcast(x_BTV):
        return torch.logsumexp(x_BTV, dim=-1)
    return torch.stack([torch.logsumexp(row_TV.float(), dim=-1) for row_TV in x_BTV.unbind(0)], dim=0)


def _entropy_rows(logits_TV: Tensor) -> Tensor:
    # H = -sum p log p = logsumexp(z) - sum softmax(z) * z; stable for any logits (no log of a 0 probability).
    p_TV = torch.softmax(logits_TV, dim=-1)
    return torch.logsumexp(logits_TV, dim=-1) - (p_TV * logits_TV).sum(dim=-1)


def entropy_from_logits(logits_BTV: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, in nats, ``[B, T]`` (uniform over V -> log V).

    Uses H = logsumexp(z) - sum_v softmax(z)_v z_v (as verl), which has no log(0) even when a probability underflows.
    Logits must be finite: a -inf logit (a vocab entry masked out) gives 0 * -inf = NaN; mask with a large negative
    finite value instead.
    """
    if not _needs_upcast(logits_BTV):
        return _entropy_rows(logits_BTV)
    return torch.stack([_entropy_rows(row_TV.float()) for row_TV in logits_BTV.unbind(0)], dim=0)
