"""The batched decode loop for one chunk of sequences: left-padded prefill, then one token per step with a KV cache.

Every row continues its own prefix (a prompt, or a prompt plus a partial response when resuming) for at most its own
budget of new tokens. Identical prefixes within the chunk (a GRPO group's n copies of one prompt) are prefilled once:
the distinct prefixes are left-padded to the chunk's width and run through the model, then the KV cache and the last
logits are expanded to every row by an index, so the rows start decoding exactly as if each had been prefilled. All
rows are sampled together each step; a row that emits an eos token or reaches its budget stops (its later outputs are
ignored), and once at most half of the batch is still running the finished rows are dropped from the batch and the KV
cache, so long tails do not pay for rows that are already done.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.rollout.kv_cache import PreallocatedCache
from asyncrl.rollout.sampling import RowStreams, SamplingParams, sample_rows
from asyncrl.types import PrefillStats

RUNNING, EOS, LENGTH, INTERRUPTED = 0, 1, 2, 3
STOP_REASONS = {EOS: "eos", LENGTH: "length", INTERRUPTED: "interrupted"}


@dataclass
class DecodeResult:
    """Per row (in input order): new tokens, their behaviour log-probs, and why the row stopped.

    ``prefill`` counts the prefix tokens the prefill actually ran through the model (each distinct prefix of a chunk
    once when prefixes are shared) and what prefilling every row would have run (the ``share_prefixes=False`` path);
    zeros for a chunk interrupted before its prefill.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    stop_reasons: list[str]
    prefill: PrefillStats = PrefillStats()
    # (rows in the batch, decode steps, seconds) per stretch of a constant batch, in order: what each step cost at
    # each batch size, measured (``asyncrl profile`` prices a decode step from them)
    segments: tuple[tuple[int, int, float], ...] = ()


def unique_prefixes(prefixes: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """``(unique, index)``: the distinct prefixes in first-occurrence order, and for each row its prefix's position
    in ``unique`` (exact equality of the token lists), so ``prefixes[b] == unique[index[b]]``."""
    position: dict[tuple[int, ...], int] = {}
    unique: list[list[int]] = []
    index: list[int] = []
    for prefix in prefixes:
        key = tuple(prefix)
        u = position.get(key)
        if u is None:
            u = position[key] = len(unique)
            unique.append(prefix)
        index.append(u)
    return unique, index


def supports_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether ``model.forward`` can skip the lm_head for all but the last position (saves prefill time and memory)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _last_logits(
    model: PreTrainedModel,
    ids_BS: torch.Tensor,
    mask_BK: torch.Tensor,
    pos_BS: torch.Tensor,
    cache: DynamicCache,
    keep_last: bool,
) -> torch.Tensor:
    """Run the model on ``ids_BS`` (S new positions, K = cached + S keys) and return the last position's logits_BV."""
    kwargs = dict(input_ids=ids_BS, attention_mask=mask_BK, position_ids=pos_BS, past_key_values=cache, use_cache=True)
    if keep_last:
        kwargs["logits_to_keep"] = 1
    return model(**kwargs).logits[:, -1, :]


def left_pad(prefixes: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids_BL, mask_BL, pos_BL)``: prefixes right-aligned, mask 1 on real tokens, positions = cumsum(mask) - 1.

    Pad positions get position 0; they are masked out, so their value never reaches a real token.
    """
    lengths = [len(p) for p in prefixes]
    L = max(lengths)
    ids_BL = torch.full((len(prefixes), L), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(prefixes), L), dtype=torch.long)
    for b, prefix in enumerate(prefixes):
        ids_BL[b, L - lengths[b] :] = torch.tensor(prefix, dtype=torch.long)
        mask_BL[b, L - lengths[b] :] = 1
    pos_BL = (mask_BL.cumsum(-1) - 1).clamp_(min=0)
    return ids_BL, mask_BL, pos_BL


def decode_batch(
    model: PreTrainedModel,
    prefixes: list[list[int]],
    budgets: list[int],
    params: SamplingParams,
    streams: RowStreams,
    eos_ids_E: torch.Tensor,
    pad_id: int,
    should_stop: Callable[[], bool],
    keep_last: bool = True,
    refill: Callable[[int], bool] | None = None,
    share_prefixes: bool = True,
    on_finish: Callable[[int, list[int], list[float], str], None] | None = None,
) -> DecodeResult:
    """Continue every prefix by up to ``budgets[b]`` (>= 1) tokens; call under ``torch.inference_mode()``.

    ``should_stop`` is polled before the prefill and between decode steps; when it returns True every row still
    running stops with reason "interrupted", keeping the tokens it has so far. ``refill(n_active)`` is polled between
    decode steps too: True interrupts the same way, so a caller can refill a batch whose long tail left it mostly
    empty (continuing the interrupted rows together with new ones, with the same weights).

    With ``share_prefixes`` identical prefixes (exact token equality) are prefilled once, left-padded to the same
    width as all prefixes would be, and the KV cache, last logits, mask and positions are then expanded to every row;
    each row still draws from its own stream (``streams``, row ``b`` = ``prefixes[b]``), so tokens and log-probs
    match the unshared path (log-probs up to float rounding). When every prefix is distinct, or a cache layer kind
    cannot be expanded (see ``PreallocatedCache.can_batch_expand``), it is the plain path: every row prefilled, no
    expansion.

    ``on_finish(row, tokens, logprobs, reason)`` is called the moment a row ends (eos or its budget), while the
    others go on decoding (the reward loop scores it meanwhile); interrupted rows are not reported.
    """
    B = len(prefixes)
    T = max(budgets)
    device = next(model.parameters()).device
    out_tok_BT = torch.zeros((B, T), dtype=torch.long)
    out_logp_BT = torch.zeros((B, T), dtype=torch.float32)
    length_B = torch.zeros(B, dtype=torch.long)
    reason_B = torch.full((B,), RUNNING, dtype=torch.long)
    budget_B = torch.tensor(budgets, dtype=torch.long)

    if should_stop():
        return DecodeResult([[] for _ in range(B)], [[] for _ in range(B)], ["interrupted"] * B)

    cache = PreallocatedCache(model.config, capacity=max(len(p) for p in prefixes) + T)
    unshared_tokens = sum(len(p) for p in prefixes)
    unique, index = unique_prefixes(prefixes) if share_prefixes else (prefixes, [])
    if len(unique) < B and cache.can_batch_expand:
        # U distinct prefixes: prefill those (same width L: the longest prefix is among them), then expand to B rows.
        ids_UL, mask_UL, pos_UL = left_pad(unique, pad_id)
        logits_UV = _last_logits(model, ids_UL.to(device), mask_UL.to(device), pos_UL.to(device), cache, keep_last)
        index_B = torch.tensor(index, dtype=torch.long)
        cache.batch_expand(index_B.to(device))
        logits_bV = logits_UV.index_select(0, index_B.to(logits_UV.device))
        mask_BL, pos_BL = mask_UL.index_select(0, index_B), pos_UL.index_select(0, index_B)
        prefill_tokens = sum(len(p) for p in unique)
    else:
        ids_BL, mask_BL, pos_BL = left_pad(prefixes, pad_id)
        logits_bV = _last_logits(model, ids_BL.to(device), mask_BL.to(device), pos_BL.to(device), cache, keep_last)
        prefill_tokens = unshared_tokens

    # Lower-case b indexes the live batch, which shrinks when finished rows are dropped; rows_b maps it to chunk rows.
    rows_b = torch.arange(B)
    active_b = torch.ones(B, dtype=torch.bool)
    mask_bK = mask_BL.to(device)
    next_pos_b = pos_BL[:, -1].to(device) + 1
    segments: list[tuple[int, int, float]] = []
    seg_steps, seg_t0 = 0, time.perf_counter()
    for t in range(T):
        seg_steps += 1
        # Sampled on the logits' device from the rows' own draws; B tokens and log-probs come back to the host.
        uniforms_b = None if params.greedy else streams.uniforms(rows_b.tolist(), t)
        tok_b, logp_b = (x.cpu() for x in sample_rows(logits_bV, params, uniforms_b))
        # Finished rows still in the batch write past their length here; those entries are never read.
        out_tok_BT[rows_b, t] = tok_b
        out_logp_BT[rows_b, t] = logp_b
        length_B[rows_b[active_b]] = t + 1
        eos_b = active_b & torch.isin(tok_b, eos_ids_E)
        full_b = active_b & ~eos_b & (budget_B[rows_b] <= t + 1)
        reason_B[rows_b[eos_b]] = EOS
        reason_B[rows_b[full_b]] = LENGTH
        if on_finish is not None:
            for r in rows_b[eos_b | full_b].tolist():
                n = int(length_B[r])
                on_finish(r, out_tok_BT[r, :n].tolist(), out_logp_BT[r, :n].tolist(), STOP_REASONS[int(reason_B[r])])
        active_b &= ~(eos_b | full_b)
        n_active = int(active_b.sum())
        if n_active == 0:
            break
        if should_stop() or (refill is not None and refill(n_active)):
            reason_B[rows_b[active_b]] = INTERRUPTED
            break
        if n_active <= len(rows_b) // 2:
            now = time.perf_counter()
            segments.append((len(rows_b), seg_steps, now - seg_t0))
            seg_steps, seg_t0 = 0, now
            keep_b = active_b.nonzero().squeeze(-1)
            cache.batch_select_indices(keep_b.to(device))
            rows_b, tok_b, active_b = rows_b[keep_b], tok_b[keep_b], active_b[keep_b]
            mask_bK, next_pos_b = mask_bK[keep_b.to(device)], next_pos_b[keep_b.to(device)]
        feed_b = torch.where(active_b, tok_b, pad_id).to(device)
        mask_bK = torch.cat([mask_bK, torch.ones_like(mask_bK[:, :1])], dim=1)
        logits_bV = _last_logits(model, feed_b[:, None], mask_bK, next_pos_b[:, None], cache, keep_last)
        next_pos_b = next_pos_b + 1

    if seg_steps:
        segments.append((len(rows_b), seg_steps, time.perf_counter() - seg_t0))
    lengths = length_B.tolist()
    tokens = [row[:n] for row, n in zip(out_tok_BT.tolist(), lengths)]
    logprobs = [row[:n] for row, n in zip(out_logp_BT.tolist(), lengths)]
    reasons = [STOP_REASONS[r] for r in reason_B.tolist()]
    return DecodeResult(
        tokens, logprobs, reasons, PrefillStats(prefill_tokens, unshared_tokens, len(prefixes)), tuple(segments)
    )
