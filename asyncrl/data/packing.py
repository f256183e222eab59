"""Packed micro-batches: sequences concatenated into rows instead of padded, and a group's prompt run once where that
pays. The two layouts (shared segments under a 4D mask, or one sequence per row with no mask), why, and the token
budget: docs/performance.md, "Packing and attention memory".

A segment is one prompt followed by the responses that continue it (or one sample). Positions restart at 0 at each
segment's prompt and each response continues from the prompt's end, as in the padded layout (``collate``), so the
logits, losses and gradients are the padded layout's to float round-off (tests/test_packing.py). A segment over the
token budget is split into pieces, each with its own copy of the prompt. ``PackedInputs.src_BT`` maps every response
token to the row position whose output predicts it, so callers get ``[B, T, ...]`` outputs aligned with the
micro-batch's ``response_ids_BT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PackedInputs:
    """The model inputs of one packed micro-batch: ``R`` rows of ``W`` tokens."""

    input_ids_RW: Tensor  # long [R, W]
    position_ids_RW: Tensor  # long [R, W]: restart at 0 for each segment's prompt
    segment_RW: Tensor  # long [R, W]: segment id (unique in the micro-batch), -1 on padding
    branch_RW: Tensor  # long [R, W]: 0 on a prompt, k on the k-th response of the segment (1-based)
    src_BT: Tensor  # long [B, T]: flat index into [R * W] of the position predicting response token t of sample b
    per_row: bool = False  # one sequence per row from column 0, padding after it: plain causal attention, no mask

    def attention_mask(self, dtype: torch.dtype) -> Tensor | None:
        """``[R, 1, W, W]`` additive mask (0 = visible, dtype's min = hidden): a query sees earlier keys of its own
        segment that are the prompt or its own response. Padding sees only padding, so no row is fully masked.
        None for per-row rows: causal attention is exact there, and the model builds no mask of its own."""
        if self.per_row:
            return None
        seg, br = self.segment_RW, self.branch_RW
        W = seg.shape[1]
        causal = torch.ones(W, W, dtype=torch.bool, device=seg.device).tril()  # on the rows' device (CUDA)
        same_segment = seg[:, :, None] == seg[:, None, :]
        visible = (br[:, None, :] == 0) | (br[:, :, None] == br[:, None, :])
        allowed = same_segment & visible & causal
        mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]

    @property
    def slots(self) -> int:
        """Token positions the model processes (real + padding)."""
        return self.input_ids_RW.numel()

    @property
    def real_tokens(self) -> int:
        return int((self.segment_RW >= 0).sum())


@dataclass
class TokenCount:
    """What a set of forward passes processed: ``slots`` positions, of which ``real`` were tokens, against
    ``unshared`` (every sample's own prompt + response, no padding: what an unshared packed layout would process)."""

    slots: int = 0
    real: int = 0
    unshared: int = 0

    def add(self, other: TokenCount) -> None:
        self.slots += other.slots
        self.real += other.real
        self.unshared += other.unshared

    def metrics(self, prefix: str) -> dict[str, float]:
        """``perf/{prefix}_tokens`` (positions processed), ``..._padding_frac`` (share of them padding) and
        ``..._prefix_saving`` (share of the samples' own tokens not processed because a prompt was shared)."""
        return {
            f"perf/{prefix}_tokens": float(self.slots),
            f"perf/{prefix}_padding_frac": 1.0 - self.real / self.slots if self.slots else 0.0,
            f"perf/{prefix}_prefix_saving": 1.0 - self.real / self.unshared if self.unshared else 0.0,
        }


@dataclass(frozen=True)
class Batching:
    """How a batch is cut into forward/backward passes: ``micro_batch_size`` samples each, or with ``max_tokens``
    (verl's ``use_dynamic_bsz``) up to that many positions each, so no packed row is wider; ``share_prefix`` runs a
    prompt once for the samples of the micro-batch that continue it where that pays (``sharing_pays``).
    ``knob`` names the token budget's setting in errors."""

    micro_batch_size: int
    share_prefix: bool = False
    max_tokens: int | None = None
    knob: str = "ppo_max_token_len_per_gpu"

    @property
    def packed(self) -> bool:
        return self.share_prefix or self.max_tokens is not None


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each bin's sizes summing to at most ``capacity``: items in decreasing size (stable),
    each into the first bin with room, else a new bin. An item larger than ``capacity`` gets a bin of its own."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for b, left in enumerate(room):
            if sizes[i] <= left:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return bins


def sharing_pays(prompt_len: int, resp_lens: list[int]) -> bool:
    """Whether ``len(resp_lens)`` responses should share one copy of their ``prompt_len``-token prompt in one row.

    Sharing saves ``(k - 1) * P`` positions of every layer's linear work. It costs attention over the whole
    ``W x W`` square (``W = P + sum(R)``: a kernel given a dense mask skips no block of it, and the mask holds that many
    elements) where the per-row layout's causal kernels compute only their sequences' own triangles,
    ``sum((P + R_i)^2) / 2``, with no mask. A saved position is priced as one row of the square (``W`` keys), so
    sharing pays when ``W^2 <= sum((P + R_i)^2) / 2 + (k - 1) * P * W``: a prompt longer than about its responses
    (a heuristic; lab/asyncrl_lab/bench_packing.py measures both layouts)."""
    k = len(resp_lens)
    if k < 2:
        return False
    W = prompt_len + sum(resp_lens)
    own = sum((prompt_len + r) ** 2 for r in resp_lens)
    return 2 * W * W <= own + 2 * (k - 1) * prompt_len * W


def plan(prompts: list[tuple[int, ...]], resp_lens: list[int], batching: Batching) -> list[list[list[int]]]:
    """Micro-batches as lists of segments (lists of sample indices; a segment's samples share its prompt), as
    ``batching`` asks: a group's pieces are segments where ``sharing_pays``, every other sample one of its own, and a
    micro-batch holds only one kind. Longest first, so micro-batches hold similar widths. Raises ValueError when one
    sample alone exceeds ``max_tokens`` (``knob`` names the setting)."""
    share_prefix, micro_batch_size, max_tokens = batching.share_prefix, batching.micro_batch_size, batching.max_tokens
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p if share_prefix else (i,), []).append(i)
    shared: list[list[int]] = []
    single: list[list[int]] = []
    for members in groups.values():
        p = len(prompts[members[0]])
        pieces: list[list[int]] = [[]]
        tokens = p
        for i in members:
            need = resp_lens[i]
            if max_tokens is not None and p + need > max_tokens:
                raise ValueError(
                    f"{batching.knob}={max_tokens} is smaller than one sample ({p} prompt + {need} response tokens); "
                    f"raise it to at least {p + need}"
                )
            full = len(pieces[-1]) >= micro_batch_size if max_tokens is None else tokens + need > max_tokens
            if pieces[-1] and full:
                pieces.append([])
                tokens = p
            pieces[-1].append(i)
            tokens += need
        for piece in pieces:
            if sharing_pays(p, [resp_lens[i] for i in piece]):
                shared.append(piece)
            else:
                single.extend([i] for i in piece)

    def size(seg: list[int]) -> int:
        return len(prompts[seg[0]]) + sum(resp_lens[i] for i in seg)

    shared.sort(key=size, reverse=True)
    single.sort(key=size, reverse=True)
    out: list[list[list[int]]] = []
    if max_tokens is None:  # consecutive segments, up to micro_batch_size samples each
        for segs in (shared, single):
            count = micro_batch_size
            for seg in segs:
                if count + len(seg) > micro_batch_size:
                    out.append([])
                    count = 0
                out[-1].append(seg)
                count += len(seg)
        return out
    bins = first_fit_decreasing([size(seg) for seg in shared], max_tokens)  # into token budgets
    out.extend([shared[i] for i in b] for b in bins)
    width = 0  # single segments: rows x the first (longest) sequence within the budget
    for seg in single:
        if not out or not width or (len(out[-1]) + 1) * width > max_tokens:
            out.append([])
            width = size(seg)
        out[-1].append(seg)
    return out


def pack(
    segments: list[list[int]],
    prompts: list[tuple[int, ...]],
    responses: list[list[int]],
    pad_id: int,
) -> PackedInputs:
    """Lay out ``segments`` (sample indices local to the micro-batch, which is ordered segment by segment) into rows
    as wide as the longest segment: first-fit decreasing with the shared-prefix mask, or, when every segment is one
    sample, one per row with no mask (``per_row``). Built in Python lists and converted once: this runs on the
    trainer before every forward pass."""
    lengths = [len(prompts[seg[0]]) + sum(len(responses[i]) for i in seg) for seg in segments]
    W = max(lengths)
    per_row = all(len(seg) == 1 for seg in segments)
    rows = [[s] for s in range(len(segments))] if per_row else first_fit_decreasing(lengths, W)
    B = sum(len(seg) for seg in segments)
    T = max(max((len(r) for r in responses), default=1), 1)
    ids: list[int] = []
    pos: list[int] = []
    seg_id: list[int] = []
    branch: list[int] = []
    src = [[0] * T for _ in range(B)]

    def put(tokens: Sequence[int], positions: Iterable[int], segment: int, k: int) -> None:
        ids.extend(tokens)
        pos.extend(positions)
        seg_id.extend([segment] * len(tokens))
        branch.extend([k] * len(tokens))

    for row in rows:
        base = len(ids)  # flat index of the row's first position
        for s in row:
            prompt = prompts[segments[s][0]]
            p = len(prompt)
            put(prompt, range(p), s, 0)
            last_prompt = len(ids) - 1
            for k, i in enumerate(segments[s], start=1):
                n = len(responses[i])
                if n:
                    start = len(ids)
                    put(responses[i], range(p, p + n), s, k)
                    src[i][:n] = [last_prompt, *range(start, start + n - 1)]
        used = len(ids) - base
        # per row: positions count on through the padding, so the model sees one sequence a row (no packed-sequence
        # mask of its own); the padding's outputs are never read
        put([pad_id] * (W - used), range(used, W) if per_row else [0] * (W - used), -1, 0)
    shape = (len(rows), W)
    return PackedInputs(
        torch.tensor(ids, dtype=torch.long).view(shape),
        torch.tensor(pos, dtype=torch.long).view(shape),
        torch.tensor(seg_id, dtype=torch.long).view(shape),
        torch.tensor(branch, dtype=torch.long).view(shape),
        torch.tensor(src, dtype=torch.long),
        per_row=per_row,
    )
