"""Next-token sampling for a whole batch at once: temperature, top-k, top-p, then one draw per row by inverting the
row's cumulative distribution at its own uniform (``RowStreams``: a row's noise is its own, whatever batch it is in).

The noise is ``uniform(key, position)``, a counter-based hash (splitmix64) of the row's key (``row_keys``) that gives
the same float on every machine, worker and schedule. ``sample_rows`` samples on the logits' device (only one token
and log-prob per row come back); on the CPU the draws and the arithmetic are the host's, bit for bit.

The log-prob recorded for each sampled token is ``log_softmax(logits / temperature)`` over the FULL vocabulary, BEFORE
top-k/top-p truncation: what the trainer recomputes from its own forward (it never re-applies truncation), so both
agree exactly when weights are equal, and importance ratios stay defined even for tokens the truncated distribution
could not pick. Greedy decoding (temperature 0) records ``log_softmax(logits)``, i.e. temperature 1.

Continuing a row, for both engines: ``continuation``, ``resumable`` and ``extend_sample``; and ``check_prompts``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from asyncrl.types import Prompt, Sample, SamplingParams


def row_keys(base: int, rows: Sequence[tuple[int, int, int]]) -> list[int]:
    """One 64-bit key per row ``(epoch, prompt index, row within its group)``: row ``b``'s ``t``-th token is drawn
    with ``uniform(keys[b], position)``, position = the tokens its response already has + ``t``. The key depends on
    the row alone (why: docs/schedules/fully_async.md, "At staleness 0 it is sync"). Two rows of one call with the same
    triple (a batch that holds a prompt twice) get distinct keys: the second by its occurrence number."""
    seen: dict[tuple[int, int, int], int] = {}
    keys = []
    for triple in rows:
        k = seen[triple] = seen.get(triple, -1) + 1
        epoch, index, row = triple
        keys.append(_mix(_mix(_mix(_mix(_mix(base & _M64) ^ epoch) ^ index) ^ row) ^ k))
    return keys


def uniform(key: int, position: int) -> float:
    """A uniform draw in [0, 1) from (``key``, ``position``): 53 bits of a 64-bit mix, the same on every machine."""
    return (_mix(key ^ _mix(position)) >> 11) * 2.0**-53


_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers whose outputs look independent for nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class RowStreams:
    """Each row's own noise: the draw for row ``b``'s ``t``-th new token is ``uniform(keys[b], offsets[b] + t)``,
    ``offsets[b]`` the tokens its response already has (0 for a new row, more for a resumed one)."""

    keys: Sequence[int]
    offsets: Sequence[int]

    @classmethod
    def of(cls, base: int | None, rows: Sequence[tuple[int, int, int]], offsets: Sequence[int]) -> RowStreams:
        """Streams for rows ``(epoch, prompt index, row within its group)`` from ``base`` (None: the OS's entropy, for
        a call that asked for no seed: not reproducible)."""
        return cls(row_keys(random.SystemRandom().getrandbits(63) if base is None else base, rows), list(offsets))

    def uniforms(self, rows: Sequence[int], t: int) -> torch.Tensor:
        """The draws of ``rows`` (indices into these streams) for their ``t``-th new token, float64."""
        return torch.tensor([uniform(self.keys[b], self.offsets[b] + t) for b in rows], dtype=torch.float64)


def filter_top_k(logits_BV: torch.Tensor, k: int) -> torch.Tensor:
    """Set all but the ``k`` largest logits of each row to -inf (ties with the k-th value are kept). 0 = no-op."""
    if k <= 0 or k >= logits_BV.shape[-1]:
        return logits_BV
    kth_B1 = torch.topk(logits_BV, k, dim=-1).values[:, -1:]
    return logits_BV.masked_fill(logits_BV < kth_B1, float("-inf"))


def filter_top_p(logits_BV: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``p`` (never empty: the most likely
    is always kept); others get -inf. ``p >= 1`` is a no-op."""
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
    logits_BV: torch.Tensor, params: SamplingParams, uniforms_B: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row, ``(tokens_B, logp_B)``, the log-prob as the module docstring says. The raw logits are upcast
    to float32, so neither depends on the model's compute dtype. Row ``b`` takes the first token whose cumulative
    probability (float64) exceeds ``uniforms_B[b]`` of the total: a token cut by top-k/top-p is never taken. Greedy
    decoding needs no uniforms."""
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
    if uniforms_B is None:
        raise ValueError("sample_tokens: sampling at temperature > 0 needs one uniform per row")
    cdf_BV = probs_BV.double().cumsum(-1)
    target_B1 = (uniforms_B.double() * cdf_BV[:, -1])[:, None]
    tokens_B = torch.searchsorted(cdf_BV, target_B1, right=True).squeeze(-1).clamp_(max=probs_BV.shape[-1] - 1)
    return tokens_B, logp_BV.gather(-1, tokens_B[:, None]).squeeze(-1)


def sample_rows(
    logits_BV: torch.Tensor, params: SamplingParams, uniforms_B: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_tokens`` on ``logits_BV``'s device: the uniforms (float64, one per row) move there, and
    ``(tokens_B, logp_B)`` come back on that device; callers read them with one ``.tolist()`` (B values to the host
    per step, never the B x V logits)."""
    if uniforms_B is not None:
        uniforms_B = uniforms_B.to(logits_BV.device)
    return sample_tokens(logits_BV, params, uniforms_B)


def check_prompts(prompts: list[Prompt], owner: str) -> None:
    """A prompt without tokens is an error naming its index (both engines' ``generate``)."""
    for prompt in prompts:
        if not prompt.prompt_ids:
            raise ValueError(f"{owner}.generate: prompt index {prompt.index} has no tokens")


def continuation(
    samples: list[Sample], params: SamplingParams, seed: int | None
) -> tuple[list[list[int]], list[int], RowStreams]:
    """What continuing ``samples`` decodes from, in both engines: each one's prefix (prompt + response so far), the
    tokens left to ``max_new_tokens``, and its own noise going on where its response stopped."""
    rows = [(s.prompt.epoch, s.prompt.index, s.row) for s in samples]
    prefixes = [s.prompt.prompt_ids + s.response_ids for s in samples]
    budgets = [params.max_new_tokens - len(s.response_ids) for s in samples]
    return prefixes, budgets, RowStreams.of(seed, rows, [len(s.response_ids) for s in samples])


def resumable(
    samples: list[Sample], params: SamplingParams, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[Sample], list[int]]:
    """``resume``'s triage, for both engines: (the output list with every sample that needs no decoding in its final
    form, the indices still to decode). Samples that are not "interrupted" stay as they are; an interrupted one
    already at ``max_new_tokens`` becomes "length"."""
    out = list(samples)
    todo: list[int] = []
    for i, s in enumerate(samples):
        if s.stop_reason != "interrupted":
            continue
        if len(s.response_ids) >= params.max_new_tokens:
            out[i] = extend_sample(s, [], [], [], "length", tokenizer)
        else:
            todo.append(i)
    return out, todo


def extend_sample(
    sample: Sample,
    tokens: list[int],
    logprobs: list[float],
    versions: list[int],
    stop_reason: str,
    tokenizer: PreTrainedTokenizerBase,
) -> Sample:
    """A copy of ``sample`` with a continuation the model generated appended (reward fields reset: the response
    changed; a multi-turn sample's mask and counters carried on); both engines build their continued samples with
    it."""
    response_ids = sample.response_ids + tokens
    return dataclasses.replace(
        sample,
        response_ids=response_ids,
        logprobs=sample.logprobs + logprobs,
        versions=sample.versions + versions,
        stop_reason=stop_reason,
        response_text=tokenizer.decode(response_ids, skip_special_tokens=True),
        response_mask=None if sample.response_mask is None else sample.response_mask + [1] * len(tokens),
        reward=0.0,
        reward_failed=False,
        reward_extra={},
    )
