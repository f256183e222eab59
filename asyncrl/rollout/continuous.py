"""The built-in engine's decoder: rows enter free slots of a running decode and leave when they end.

Every call decodes here: ``generate``/``resume`` submit their rows and step until they end, fully_async's Producer
streams rows in and out. ``capacity`` slots decode one token per step in ``slot_cache.SlotCache``'s layout (one write
column ``p``, each live slot's keys right-aligned ending at it), so a step is a plain batched forward. A step:

1. admit waiting rows into free slots: each distinct prefix is prefilled once, left-padded (prefixes of very different
   lengths, as a sync's interrupted rows are, in a few forwards by length: ``prefill_buckets``), and its keys copied
   into every slot that uses it, right-aligned at ``p`` (the live window moved right first for a prefix longer than
   ``p``);
2. sample every live row from its pending float32 logits at its own uniform (``RowStreams``' rule), so a row draws the
   same tokens whatever else is decoding (its logits differ by float rounding only: other padding);
3. end the rows that drew an eos or filled their budget; when live + waiting rows are at most half the slots in use,
   pack the live ones to the front (trailing free slots are dropped for free);
4. one forward over the slots in use (free ones feed the pad id, seeing only their own column). Before it the live
   window moves back to the left edge when ``p`` is past the buffers, or when the dead columns left of the longest
   live row outnumber the live ones (attention reads them every step; the move costs about one step's reading).

The buffers are zero-filled (masked garbage must be finite) and grown with slack, so the window moves back rarely.
The model stays in eval mode until the decoder is empty again (switching per step walks every module). ``submit`` is
safe from any thread; ``step`` and ``interrupt`` run on one thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.rollout.sampling import sample_rows, uniform
from asyncrl.rollout.slot_cache import SlotCache, unsupported_layer_kinds
from asyncrl.types import PrefillStats, SamplingParams

MIN_DEAD_COLUMNS = 32  # tokens: dead columns below this are cheaper to keep than to move the window for
# padded positions a second prefill forward must save to be worth its own pass (a forward's fixed cost): rows taken
# in together are split by length only when their padding is that wasteful (``prefill_buckets``)
MIN_SAVED_POSITIONS = 512


def unique_prefixes(prefixes: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """``(unique, index)``: the distinct prefixes in first-occurrence order, and for each row its prefix's position
    in ``unique`` (exact equality of the token lists), so ``prefixes[b] == unique[index[b]]``."""
    position: dict[tuple[int, ...], int] = {}
    index = [position.setdefault(tuple(prefix), len(position)) for prefix in prefixes]
    return [list(prefix) for prefix in position], index


def last_logits(
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
    """``(ids_BL, mask_BL, pos_BL)``: prefixes right-aligned, mask 1 on real tokens, positions = cumsum(mask) - 1
    (pads at position 0: masked out, their value never reaches a real token)."""
    lengths = [len(p) for p in prefixes]
    L = max(lengths)
    ids_BL = torch.full((len(prefixes), L), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(prefixes), L), dtype=torch.long)
    for b, prefix in enumerate(prefixes):
        ids_BL[b, L - lengths[b] :] = torch.tensor(prefix, dtype=torch.long)
        mask_BL[b, L - lengths[b] :] = 1
    pos_BL = (mask_BL.cumsum(-1) - 1).clamp_(min=0)
    return ids_BL, mask_BL, pos_BL


def prefill_buckets(lengths: list[int], min_saved: int = MIN_SAVED_POSITIONS) -> list[list[int]]:
    """The prefixes taken in at one step (their ``lengths``), as prefill forwards: positions into ``lengths``, each
    forward's left-padded to its longest. One forward unless splitting by length saves at least ``min_saved`` padded
    positions a forward more: the partition of the sorted lengths into runs that minimises padded positions plus
    ``min_saved`` per forward. Fresh groups share one prompt each and come alike; the rows a sync interrupted come back
    with partial responses from a few tokens to hundreds (BENCHMARKS.md, "Taking interrupted rows back after a
    sync")."""
    n = len(lengths)
    if n < 2 or n * max(lengths) - sum(lengths) < min_saved:
        return [list(range(n))]
    by_len = sorted(range(n), key=lambda i: -lengths[i])  # longest first: a run pads to its first
    best = [0.0] + [float("inf")] * n  # best[j]: the cheapest split of the j longest
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + (j - i) * lengths[by_len[i]] + min_saved
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j:
        runs.append(by_len[cut[j] : j])
        j = cut[j]
    return runs[::-1]


@dataclass(eq=False)
class StreamRow:
    """One row to continue: ``prefix`` (prompt + response so far) for at most ``budget`` (>= 1) new tokens, the
    ``t``-th drawing ``uniform(key, offset + t)``; ``tag``: the caller's id (submission order)."""

    tag: int
    prefix: list[int]
    budget: int
    key: int
    offset: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class ContinuousDecoder:
    """``capacity`` slots decoding one token per step; rows enter from a thread-safe inbox (``submit``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        capacity: int,
        eos_ids: list[int],
        pad_id: int,
        keep_last: bool = True,
        share_prefixes: bool = True,
    ) -> None:
        self.model = model
        self.capacity = capacity
        self.eos_ids = frozenset(eos_ids)
        self.pad_id = pad_id
        self.keep_last = keep_last
        self.share_prefixes = share_prefixes
        self._lock = threading.Lock()
        self._inbox: deque[StreamRow] = deque()
        self._slots: list[StreamRow | None] = []  # the batch of every forward: slot s is its row s
        self._length: list[int] = []  # valid keys per slot, tokens (a free slot: 0)
        self._pending: tuple[list[int], torch.Tensor] | None = None  # (slots, logits_AV) of the last forward
        self._cache: SlotCache | None = None
        self._prefill = PrefillStats()
        self._unsupported: list[str] | None = None  # the model's cache layer kinds the slot cache cannot hold
        self._restore_training = False  # the model was in training mode when streaming began: restore when idle
        # the last step, measured: the slots in use once its rows were admitted (what ``planning.cost.decode_segments``
        # prices a step by) and the seconds the admission (prefill) took
        self.step_rows = 0
        self.admit_s = 0.0

    # ---------------------------------------------------------------------------------------------- bookkeeping

    def check_supported(self) -> None:
        """NotImplementedError naming the layer kinds when the model has any but full attention and sliding window."""
        if self._unsupported is None:
            self._unsupported = unsupported_layer_kinds(self.model.config)
        kinds = self._unsupported
        if kinds:
            raise NotImplementedError(
                f"the built-in engine decodes full-attention and sliding-window layers only; this model has {kinds} "
                "(rollout.engine=vllm serves it)"
            )

    def submit(self, rows: list[StreamRow]) -> None:
        """Queue rows (any thread); they enter free slots at a later ``step``, first come first served."""
        with self._lock:
            self._inbox.extend(rows)

    def waiting(self) -> int:
        with self._lock:
            return len(self._inbox)

    def take_prefill(self) -> PrefillStats:
        """Prefill token counts since the last call (``tokens`` run, ``unshared_tokens`` without sharing), then zero."""
        stats, self._prefill = self._prefill, PrefillStats()
        return stats

    def interrupt(self) -> list[StreamRow]:
        """Every row (decoding or waiting) with its tokens so far, in submission order; the decoder is then empty
        and its buffers freed (the trainer may want the memory while weights are synced)."""
        with self._lock:
            waiting = list(self._inbox)
            self._inbox.clear()
        rows = [row for row in self._slots if row is not None] + waiting
        self._slots, self._length, self._pending, self._cache = [], [], None, None
        self._leave_eval()
        return sorted(rows, key=lambda row: row.tag)

    # ------------------------------------------------------------------------------------------------------ step

    def step(self, params: SamplingParams, admit_below: int | None = None) -> list[tuple[StreamRow, str]]:
        """One decode step (admitting waiting rows with ``tag < admit_below`` first, all when None); returns the rows
        that ended in it with their reason, "eos" or "length"."""
        if self.model.training:  # eval for the whole stream: ``train()`` walks every module (~6% of a tiny step)
            self.model.eval()
            self._restore_training = True
        try:
            with torch.inference_mode():
                return self._step(params, admit_below)
        finally:
            if not self._slots and not self.waiting():
                self._leave_eval()

    def _leave_eval(self) -> None:
        if self._restore_training:
            self.model.train()
            self._restore_training = False

    def _step(self, params: SamplingParams, admit_below: int | None) -> list[tuple[StreamRow, str]]:
        """Admit, sample every live row from its pending logits, end rows, settle the slots, feed the survivors."""
        t0 = time.perf_counter()
        admitted = self._admit(admit_below)
        self.admit_s, self.step_rows = time.perf_counter() - t0, len(self._slots)
        chunks = [chunk for chunk in (self._pending, admitted) if chunk is not None]
        self._pending = None
        if not chunks:
            return []
        slots_A = [s for chunk in chunks for s in chunk[0]]
        logits_AV = chunks[0][1] if len(chunks) == 1 else torch.cat([chunk[1] for chunk in chunks])
        rows_A = [self._slots[s] for s in slots_A]
        uniforms_A = None
        if not params.greedy:  # float64 draws made on the CPU; sample_rows moves them to the logits' device
            draws = [uniform(r.key, r.offset + len(r.tokens)) for r in rows_A if r is not None]
            uniforms_A = torch.tensor(draws, dtype=torch.float64)
        tok_A, logp_A = sample_rows(logits_AV, params, uniforms_A)
        ended: list[tuple[StreamRow, str]] = []
        for s, row, tok, logp in zip(slots_A, rows_A, tok_A.tolist(), logp_A.tolist()):
            assert row is not None
            row.tokens.append(tok)
            row.logprobs.append(logp)
            if tok in self.eos_ids or len(row.tokens) >= row.budget:
                ended.append((row, "eos" if tok in self.eos_ids else "length"))
                self._slots[s], self._length[s] = None, 0
        self._settle()
        if any(row is not None for row in self._slots):
            self._forward()
        return ended

    def _admit(self, admit_below: int | None) -> tuple[list[int], torch.Tensor] | None:
        """Move waiting rows into free slots and prefill them; returns (their slots, their logits) or None."""
        free = [s for s, row in enumerate(self._slots) if row is None]
        free += range(len(self._slots), self.capacity)
        rows: list[StreamRow] = []
        with self._lock:
            while self._inbox and len(rows) < len(free):
                if admit_below is not None and self._inbox[0].tag >= admit_below:
                    break
                rows.append(self._inbox.popleft())
        if not rows:
            return None
        device = next(self.model.parameters()).device
        prefixes = [row.prefix for row in rows]
        unique, index = unique_prefixes(prefixes) if self.share_prefixes else (prefixes, list(range(len(rows))))
        buckets = prefill_buckets([len(u) for u in unique], MIN_SAVED_POSITIONS)
        prefills = []  # (the unique prefixes' positions, their prefill cache), a forward each
        logits = []
        for members in buckets:
            ids_UW, mask_UW, pos_UW = (t.to(device) for t in left_pad([unique[u] for u in members], self.pad_id))
            prefilled = DynamicCache(config=self.model.config)
            logits.append(last_logits(self.model, ids_UW, mask_UW, pos_UW, prefilled, self.keep_last))
            prefills.append((members, prefilled))
        logits_UV = logits[0]
        if len(buckets) > 1:  # back to the unique prefixes' order
            order = torch.tensor([u for members in buckets for u in members], dtype=torch.long)
            logits_UV = torch.cat(logits).index_select(0, torch.argsort(order).to(logits_UV.device))
        W = max(map(len, unique))
        self._prefill += PrefillStats(sum(map(len, unique)), sum(map(len, prefixes)), len(rows))

        if self._cache is None:
            self._cache = SlotCache(self.model.config)
        cache, used = self._cache, len(self._slots)
        width = max(self._length, default=0)
        slots_R = free[: len(rows)]
        self._slots += [None] * (max(slots_R) + 1 - used)
        self._length += [0] * (max(slots_R) + 1 - used)
        need = max(len(row.prefix) + row.budget for row in rows)
        n_rows, n_cols = cache.rows, cache.columns
        if n_rows < len(self._slots):
            n_rows = min(self.capacity, max(len(self._slots), 2 * n_rows))
        if n_cols < need:
            n_cols = need + max(need // 2, 16)
        new_p = max(cache.p, W) if width else W
        if (n_rows, n_cols) != (cache.rows, cache.columns):
            new_p = max(width, W)  # new buffers: drop the dead columns on the way
        cache.relayout(used, width, new_p, n_rows, n_cols, like=prefills[0][1])
        index_R = torch.tensor(index, dtype=torch.long)
        for members, prefilled in prefills:  # each forward's rows, right-aligned at p like every live slot
            local = {u: k for k, u in enumerate(members)}
            mine = [r for r, u in enumerate(index) if u in local]
            slots = torch.tensor([slots_R[r] for r in mine], dtype=torch.long)
            cache.write_prefill(slots, prefilled, torch.tensor([local[index[r]] for r in mine], dtype=torch.long))
        for s, row in zip(slots_R, rows):
            self._slots[s], self._length[s] = row, len(row.prefix)
        if len(unique) < len(rows):
            logits_UV = logits_UV.index_select(0, index_R.to(logits_UV.device))
        return slots_R, logits_UV

    def _settle(self) -> None:
        """After rows ended: drop trailing free slots; pack the live ones to the front when few are left."""
        while self._slots and self._slots[-1] is None:
            self._slots.pop()
            self._length.pop()
        live = [s for s, row in enumerate(self._slots) if row is not None]
        if not live:
            if self._cache is not None:
                self._cache.reset_window()
            return
        if len(live) < len(self._slots) and len(live) + self.waiting() <= len(self._slots) // 2:
            assert self._cache is not None
            self._cache.gather_slots(torch.tensor(live, dtype=torch.long), max(self._length))
            self._slots = [self._slots[s] for s in live]
            self._length = [self._length[s] for s in live]

    def _forward(self) -> None:
        """Feed every live slot its last token (free slots in the batch: the pad id, seeing only itself)."""
        cache = self._cache
        assert cache is not None
        width = max(self._length)
        p = cache.p
        if p + 1 > cache.columns or p - width > max(width, MIN_DEAD_COLUMNS):
            cache.relayout(len(self._slots), width, width, cache.rows, cache.columns)
            p = width
        device = next(self.model.parameters()).device
        live = [row is not None for row in self._slots]
        ids_S = torch.tensor([row.tokens[-1] if row is not None else self.pad_id for row in self._slots])
        pos_S = torch.tensor([n if on else 0 for n, on in zip(self._length, live)])
        start_S = torch.tensor([p - n if on else p for n, on in zip(self._length, live)])
        mask_SK = torch.arange(p + 1, device=device)[None, :] >= start_S.to(device)[:, None]
        logits_SV = last_logits(
            self.model, ids_S.to(device)[:, None], mask_SK, pos_S.to(device)[:, None], cache, self.keep_last
        )
        slots_A = [s for s, on in enumerate(live) if on]
        for s in slots_A:
            self._length[s] += 1
        if len(slots_A) < len(live):
            logits_SV = logits_SV.index_select(0, torch.tensor(slots_A, device=logits_SV.device))
        self._pending = (slots_A, logits_SV)
