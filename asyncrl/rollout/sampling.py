"""Next-token sampling for a whole batch at once: temperature, top-k, top-p, then one multinomial draw per row.

The log-probability recorded for each sampled token is ``log_softmax(logits / temperature)`` over the FULL vocabulary,
taken BEFORE top-k/top-p truncation. That is the quantity the trainer can recompute from its own forward pass (it knows
the temperature but never re-applies truncation), so the behaviour and recomputed log-probs agree exactly when weights
are equal, and importance ratios stay well defined even for tokens the truncated distribution could not pick. Greedy
decoding (temperature 0) records ``log_softmax(logits)``, i.e. temperature 1.
"""

from __future__ import annotations

import torch

from asyncrl.types import SamplingParams

__all__ = ["SamplingParams", "filter_top_k", "filter_top_p", "make_generator", "sample_tokens"]


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed``, or from OS entropy when ``seed`` is None (non-reproducible)."""
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def filter_top_k(logits_BV: torch.Tensor, k: int) -> torch.Tensor:
    """Set all but the ``k`` largest logits of each row to -inf (ties with the k-th value are kept). 0 = no-op."""
    if k <= 0 or k >= logits_BV.shape[-1]:
        return logits_BV
    kth_B1 = torch.topk(logits_BV, k, dim=-1).values[:, -1:]
    return logits_BV.masked_fill(logits_BV < kth_B1, float("-inf"))


def filter_top_p(logits_BV: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``p``; others get -inf.

    The most likely token is always kept, so the result is never empty. ``p >= 1`` is a no-op.
    """
    if p >= 1.0:
        return logits_BV
    sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
    probs_BV = torch.softmax(sorted_BV, dim=-1)
    mass_before_BV = torch.cumsum(probs_BV, dim=-1) - probs_BV  # probability of strictly more likely tokens
    drop_sorted_BV = mass_before_BV >= p
    drop_sorted_BV[:, 0] = False
    drop_BV = torch.zeros_like(drop_sorted_BV).scatter_(-1, order_BV, drop_sorted_BV)
    return logits_BV.masked_fill(drop_BV, float("-inf"))


def sample_tokens(
    logits_BV: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns ``(tokens_B, logp_B)`` with the behaviour log-prob described in the module doc.

    ``logits_BV`` are the model's raw last-position logits; they are upcast to float32 so sampling and log-probs do
    not depend on the model's compute dtype.
    """
    logits_BV = logits_BV.float()
    if params.greedy:
        tokens_B = torch.argmax(logits_BV, dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
        return tokens_B, logp_BV.gather(-1, tokens_B[:, None]).squeeze(-1)

    scaled_BV = logits_BV / params.temperature
    logp_BV = torch.log_softmax(scaled_BV, dim=-1)
    if params.top_k > 0 or params.top_p < 1.0:
        filtered_BV = filter_top_p(filter_top_k(scaled_BV, params.top_k), params.top_p)
        probs_BV = torch.softmax(filtered_BV, dim=-1)
    else:
        probs_BV = logp_BV.exp()
    tokens_B = torch.multinomial(probs_BV, 1, generator=generator).squeeze(-1)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None]).squeeze(-1)
