"""What the trainer is asked to fit, per response token: typed targets instead of tensors looked up by string key.

A ``TrainBatch`` carries at most one policy target (``PolicyTarget`` for policy-gradient algorithms, ``TeacherTarget``
for distillation) and at most one ``ValueTarget`` (the critic's). Each target checks its shapes where it is built,
so a batch assembled wrongly fails on the driver, naming the field, not later inside a worker. Every tensor field is
``[B, T, ...]`` aligned with the batch's ``response_ids_BT``; ``rows``/``cols`` slice them with the batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

T_ = TypeVar("T_")


def _tensor_fields(obj: object) -> dict[str, Tensor]:
    return {f.name: v for f in dataclasses.fields(obj) if isinstance(v := getattr(obj, f.name), Tensor)}


def rows(obj: T_, idx: Tensor) -> T_:
    """The same target for rows ``idx`` of the batch."""
    return dataclasses.replace(obj, **{k: v[idx] for k, v in _tensor_fields(obj).items()})


def cols(obj: T_, width: int) -> T_:
    """The same target cut to the first ``width`` response positions."""
    return dataclasses.replace(obj, **{k: v[:, :width] for k, v in _tensor_fields(obj).items()})


def check_shapes(obj: object, batch_shape: tuple[int, int] | None = None) -> None:
    """Every tensor field starts with the same ``[B, T]`` (and with ``batch_shape`` when given)."""
    shapes = {k: tuple(v.shape[:2]) for k, v in _tensor_fields(obj).items()}
    want = batch_shape or next(iter(shapes.values()), None)
    bad = {k: s for k, s in shapes.items() if s != want}
    if bad:
        raise ValueError(f"{type(obj).__name__}: fields {bad} do not match the batch's [B, T] = {list(want or ())}")


@dataclass
class PolicyTarget:
    """A policy-gradient update (GRPO, PPO): per-token advantages. The trainer fills ``old_logp_BT`` (the PPO
    ratio's denominator: current weights, the proximal snapshot, or the behaviour log-probs in bypass mode) and
    ``ref_logp_BT`` (KL loss) itself, inside its update call, so the batch crosses to it once."""

    advantages_BT: Tensor  # float [B, T]
    old_logp_BT: Tensor | None = None  # float [B, T]
    ref_logp_BT: Tensor | None = None  # float [B, T]

    def __post_init__(self) -> None:
        check_shapes(self)


@dataclass
class TeacherTarget:
    """On-policy distillation: the teacher's top-k log-probs at every response position."""

    topk_ids_BTK: Tensor  # long [B, T, K]
    topk_logp_BTK: Tensor  # float [B, T, K], over the teacher's full vocabulary
    token_logp_BT: Tensor  # float [B, T]: the teacher's log-prob of the response token itself

    def __post_init__(self) -> None:
        check_shapes(self)
        if self.topk_ids_BTK.shape != self.topk_logp_BTK.shape:
            raise ValueError(
                f"TeacherTarget: topk_ids_BTK {list(self.topk_ids_BTK.shape)} and topk_logp_BTK "
                f"{list(self.topk_logp_BTK.shape)} differ"
            )
        if self.topk_ids_BTK.dtype != torch.long:
            raise ValueError(f"TeacherTarget: topk_ids_BTK must be long (got {self.topk_ids_BTK.dtype})")


@dataclass
class ValueTarget:
    """The critic's update: its predictions at rollout time (for value clipping) and the returns to regress on."""

    values_BT: Tensor  # float [B, T], reward units
    returns_BT: Tensor  # float [B, T], reward units

    def __post_init__(self) -> None:
        check_shapes(self)


@dataclass
class PreferenceTarget:
    """Online DPO: the batch's rows are pairs, row ``2i`` the chosen and row ``2i + 1`` the rejected response of the
    same prompt. ``pair_weight_BT`` is 1 on a real pair's rows and 0 on a placeholder pair (a batch without any
    pair still makes one optimizer step, with a zero gradient). The trainer fills ``ref_logp_BT`` itself."""

    chosen_BT: Tensor  # float [B, T]: 1 on the chosen rows, 0 on the rejected
    pair_weight_BT: Tensor  # float [B, T]
    ref_logp_BT: Tensor | None = None  # float [B, T]

    def __post_init__(self) -> None:
        check_shapes(self)  # any rows may be taken (a log-prob pass); the update checks the pairs (check_pairs)

    def check_pairs(self) -> None:
        B = self.chosen_BT.shape[0]
        if B % 2 or not bool((self.chosen_BT[0::2, 0] == 1).all() and (self.chosen_BT[1::2, 0] == 0).all()):
            raise ValueError("PreferenceTarget: rows must alternate chosen, rejected (an even number of rows)")
