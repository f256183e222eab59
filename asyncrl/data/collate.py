"""Turn a list of ``Sample`` into padded tensors for the trainer, with the typed targets it fits.

Every row is ``[left pad][prompt][response][right pad]``: prompts left-padded to the longest, ``P``, responses
right-padded to the longest, ``T``, so the logits that predict response token ``t`` are ``logits[:, P - 1 + t]`` for
the whole batch, with no per-row gather. Position ids count real tokens only (``cumsum(mask) - 1``), as the rollout
engine numbers them. The targets (at most one ``Objective``, at most one ``ValueTarget``) check their shapes where
they are built, so a batch assembled wrongly fails on the driver, naming the field, not inside a worker.
"""

from __future__ import annotations

import dataclasses
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from asyncrl.data.packing import Batching, PackedInputs, TokenCount, pack, plan
from asyncrl.types import Sample


def _tensor_fields(obj: object) -> dict[str, Tensor]:
    return {f.name: v for f in dataclasses.fields(obj) if isinstance(v := getattr(obj, f.name), Tensor)}


def check_shapes(obj: object, batch_shape: tuple[int, int] | None = None) -> None:
    """Every tensor field starts with the same ``[B, T]`` (and with ``batch_shape`` when given)."""
    shapes = {k: tuple(v.shape[:2]) for k, v in _tensor_fields(obj).items()}
    want = batch_shape or next(iter(shapes.values()), None)
    bad = {k: s for k, s in shapes.items() if s != want}
    if bad:
        raise ValueError(f"{type(obj).__name__}: fields {bad} do not match the batch's [B, T] = {list(want or ())}")


@dataclass
class ValueTarget:
    """The critic's update: its predictions at rollout time (for value clipping) and the returns to regress on."""

    values_BT: Tensor  # float [B, T], reward units
    returns_BT: Tensor  # float [B, T], reward units

    def __post_init__(self) -> None:
        check_shapes(self)


def count_weight(batch: TrainBatch, loss_agg_mode: str) -> float:
    """A batch's tokens (token-mean) or its sequences with at least one token (the seq-mean modes, as
    ``losses.agg_loss`` averages them): how much of a mini-batch's loss it carries."""
    mask = batch.response_mask_BT
    return float(mask.sum()) if loss_agg_mode == "token-mean" else float((mask.sum(dim=1) > 0).sum())


class Objective(ABC):
    """What the policy is fitted to on one batch, as its algorithm defines it: per-token target tensors (the
    subclass's dataclass fields, ``[B, T, ...]``, sliced with the batch) and the pure loss of one micro-batch.

    The trainer knows no algorithm. It asks the objective what to fill into the batch before the update
    (``needs_ref``: the reference policy's log-probs, ``needs_old``: the PPO ratio's denominator; both at
    ``temperature``), how rows belong together (``rows_per_unit``: online DPO's pairs stay in one micro-batch and
    are never packed), how much each micro-batch weighs in its mini-batch's loss (``weight``), which rows cannot
    change the gradient (``keep_rows``), and for the loss itself. Everything else (mini-batches, accumulation,
    data parallelism, non-finite steps, the optimizer) is the trainer's one loop (``asyncrl.trainer.update``).
    """

    rows_per_unit: ClassVar[int] = 1
    compares_behaviour: ClassVar[bool] = False  # log |trainer - rollout| log-probs (rollout_corr/logprob_diff_*)

    def __post_init__(self) -> None:
        check_shapes(self)

    @property
    @abstractmethod
    def temperature(self) -> float:
        """The temperature the loss's logits (and the filled log-probs) are taken at."""

    @property
    def needs_ref(self) -> bool:
        return False

    @property
    def needs_old(self) -> bool:
        return False

    def weight(self, batch: TrainBatch, loss_agg_mode: str) -> float:
        """What ``batch`` counts for in the loss of a mini-batch it is part of (the mini-batch's own weight is the
        denominator); by default ``count_weight``."""
        return count_weight(batch, loss_agg_mode)

    def keep_rows(self, batch: TrainBatch) -> Tensor | None:
        """A bool per row of ``batch``: False where the row's loss gradient is known to be zero (the trainer skips
        its passes; its weight still counts). None: every row is trained."""
        return None

    @abstractmethod
    def loss(
        self, logits_BTV: Tensor, logp_BT: Tensor, batch: TrainBatch, loss_agg_mode: str
    ) -> tuple[Tensor, dict[str, float]]:
        """The micro-batch's loss (aggregated over its own rows by ``loss_agg_mode``) and its statistics, from the
        policy's logits at ``temperature`` and the response tokens' log-probs under them."""


@dataclass
class TrainBatch:
    input_ids_BL: torch.Tensor  # long [B, P + T]
    attention_mask_BL: torch.Tensor  # long [B, P + T]
    position_ids_BL: torch.Tensor  # long [B, P + T]
    response_ids_BT: torch.Tensor  # long [B, T]
    response_mask_BT: torch.Tensor  # float [B, T], 1 = a response token the model generated (the loss mask)
    prompt_width: int  # P
    behav_logp_BT: torch.Tensor  # float [B, T] the rollout's log-probs (0 on padding)
    policy: Objective | None = None  # what the actor fits (the algorithm's)
    value: ValueTarget | None = None  # what the critic fits (PPO)
    # filled by the trainer inside its update, as the objective asks: the reference policy's and the old policy's
    # (the PPO ratio's denominator) log-probs of the responses, float [B, T]
    ref_logp_BT: torch.Tensor | None = None
    old_logp_BT: torch.Tensor | None = None
    packed: PackedInputs | None = None  # set on a packed micro-batch: the model runs on these rows instead
    # rows (B), read where it is made: the trainer's loop asks it of every mini- and micro-batch; a batch's tensors
    # are never replaced (``select``, ``trimmed`` and a device move build a new batch)
    size: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.size = self.input_ids_BL.shape[0]
        for target in (self.policy, self.value):
            if target is not None:
                check_shapes(target, tuple(self.response_mask_BT.shape))

    def _sliced(self, bl: Callable[[Tensor], Tensor], bt: Callable[[Tensor], Tensor], prompt_width: int) -> TrainBatch:
        """A new batch: ``bl`` applied to every ``_BL`` tensor, ``bt`` to every other tensor and to the targets
        (``packed`` is dropped: it belongs to one micro-batch's layout)."""
        kw: dict[str, object] = {"prompt_width": prompt_width}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                kw[f.name] = bl(v) if f.name.endswith("_BL") else bt(v)
            elif isinstance(v, Objective | ValueTarget):
                kw[f.name] = dataclasses.replace(v, **{k: bt(t) for k, t in _tensor_fields(v).items()})
        return TrainBatch(**kw)

    def select(self, idx: torch.Tensor | list[int]) -> TrainBatch:
        """Rows ``idx`` of the batch (all tensors, targets included); the padding widths stay as they are."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        return self._sliced(lambda t: t[idx], lambda t: t[idx], self.prompt_width)

    def response_lengths(self) -> torch.Tensor:
        """Response tokens per row, those appended between turns (mask 0: a tool's output) included: long [B]."""
        return self.attention_mask_BL[:, self.prompt_width :].sum(dim=1)

    def trimmed(self) -> TrainBatch:
        """The same rows without padding columns no row needs (left of the longest prompt, right of the longest
        response); position ids are unchanged, so the model sees exactly the same inputs."""
        T = max(int(self.response_lengths().max()), 1)
        P = max(int(self.attention_mask_BL[:, : self.prompt_width].sum(dim=1).max()), 1)
        cut = self.prompt_width - P
        return self._sliced(lambda t: t[:, cut : self.prompt_width + T], lambda t: t[:, :T], P)


def micro_batches(
    batch: TrainBatch, batching: Batching | int, count: TokenCount | None = None
) -> list[tuple[torch.Tensor, TrainBatch]]:
    """Split ``batch`` into micro-batches; returns ``(row indices into batch, micro-batch)`` pairs (none for an empty
    batch). ``count`` (optional) adds up the positions the micro-batches make the model process.

    Padded (neither sharing nor a token budget): at most ``micro_batch_size`` rows each, grouped by response length
    and each cut to its own longest prompt and response, so a long tail of lengths does not pad every row. Packed:
    micro-batches carry ``packed`` inputs (see ``asyncrl.data.packing``)."""
    if isinstance(batching, int):
        batching = Batching(batching)
    if batch.size == 0:
        return []
    if not batching.packed:
        lengths = batch.response_lengths()
        order = torch.argsort(lengths, stable=True)
        out = []
        for idx in order.split(batching.micro_batch_size):
            mb = batch.select(idx).trimmed()
            if count is not None:
                real = int(mb.attention_mask_BL.sum())
                count.add(TokenCount(mb.input_ids_BL.numel(), real, real))
            out.append((idx, mb))
        return out
    P = batch.prompt_width  # prompts are right-aligned at column P, responses start there
    prompt_lens = batch.attention_mask_BL[:, :P].sum(dim=1).tolist()
    prompts = [tuple(row[P - n :]) for row, n in zip(batch.input_ids_BL[:, :P].tolist(), prompt_lens)]
    resp_lens = batch.response_lengths().tolist()
    responses = [row[:n] for row, n in zip(batch.response_ids_BT.tolist(), resp_lens)]
    out = []
    for segments in plan(prompts, resp_lens, batching):
        idx = [i for seg in segments for i in seg]
        starts = itertools.accumulate(map(len, segments), initial=0)
        local = [list(range(start, start + len(seg))) for start, seg in zip(starts, segments)]
        mb = batch.select(idx).trimmed()
        # pad with token 0: padding is masked out and its outputs are never read
        mb.packed = pack(local, [prompts[i] for i in idx], [responses[i] for i in idx], pad_id=0)
        if count is not None:
            unshared = sum(len(prompts[i]) + resp_lens[i] for i in idx)
            count.add(TokenCount(mb.packed.slots, mb.packed.real_tokens, unshared))
        out.append((torch.tensor(idx, dtype=torch.long), mb))
    return out


def _ragged(lists: list[list], lengths: np.ndarray, start_col: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
    """Row and column indices that place ``lists[b]`` at columns ``start_col[b]...`` of row ``b``, and the values
    flattened: one vectorised assignment instead of a Python loop of small tensor copies."""
    total = int(lengths.sum())
    rows_ = np.repeat(np.arange(len(lists)), lengths)
    offset = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols_ = np.repeat(start_col, lengths) + offset
    return rows_, cols_, list(itertools.chain.from_iterable(lists))


def collate(samples: list[Sample], pad_token_id: int) -> TrainBatch:
    if not samples:
        raise ValueError("collate: no samples")
    for s in samples:
        if len(s.logprobs) != len(s.response_ids):
            raise ValueError(f"sample {s.uid}: {len(s.response_ids)} response tokens but {len(s.logprobs)} log-probs")
        if s.response_mask is not None and len(s.response_mask) != len(s.response_ids):
            raise ValueError(
                f"sample {s.uid}: {len(s.response_ids)} response tokens but a response mask of {len(s.response_mask)}"
            )
    B = len(samples)
    plen = np.array([len(s.prompt.prompt_ids) for s in samples], dtype=np.int64)
    rlen = np.array([len(s.response_ids) for s in samples], dtype=np.int64)
    P = int(plen.max())
    T = max(int(rlen.max()), 1)
    input_ids = torch.full((B, P + T), pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    resp_mask = torch.zeros((B, T), dtype=torch.float32)
    behav = torch.zeros((B, T), dtype=torch.float32)
    # prompts right-aligned at column P, responses from column P on
    r, c, flat = _ragged([s.prompt.prompt_ids for s in samples], plen, P - plen)
    input_ids[r, c] = torch.tensor(flat, dtype=torch.long)
    attn[r, c] = 1
    r, c, flat = _ragged([s.response_ids for s in samples], rlen, np.full(B, P))
    input_ids[r, c] = torch.tensor(flat, dtype=torch.long)
    attn[r, c] = 1
    # 1 where the model generated the token: every response token, then a multi-turn sample's own mask over its row
    # (tokens appended between turns, a tool's output, are 0: no loss on them)
    resp_mask[r, c - P] = 1.0
    for b, s in enumerate(samples):
        if s.response_mask is not None:
            resp_mask[b, : len(s.response_mask)] = torch.tensor(s.response_mask, dtype=torch.float32)
    behav[r, c - P] = torch.tensor(list(itertools.chain.from_iterable(s.logprobs for s in samples)))
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return TrainBatch(
        input_ids_BL=input_ids,
        attention_mask_BL=attn,
        position_ids_BL=position_ids,
        response_ids_BT=input_ids[:, P:],
        response_mask_BT=resp_mask,
        prompt_width=P,
        behav_logp_BT=behav,
    )


def rewards_of(samples: list[Sample]) -> torch.Tensor:
    return torch.tensor([s.reward for s in samples], dtype=torch.float32)


def group_ids(samples: list[Sample]) -> torch.Tensor:
    """Samples generated from the same (epoch, prompt) share a group id (the prompt's ``uid``, kept as the pair)."""
    keys = [(s.prompt.epoch, s.prompt.index) for s in samples]
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return torch.tensor([ids[k] for k in keys], dtype=torch.long)


@dataclass
class Prepared:
    """A batch ready for the update: its samples, the typed ``TrainBatch`` and what preparing it measured."""

    samples: list[Sample]
    batch: TrainBatch
    metrics: dict[str, float] = field(default_factory=dict)
