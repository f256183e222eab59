"""What the trainer is asked to fit, per response token: typed targets instead of tensors looked up by string key.

A ``TrainBatch`` carries at most one ``Objective`` (the policy's, ``asyncrl.data.collate``; each algorithm defines
its own, in ``asyncrl.algorithms``) and at most one ``ValueTarget`` (the critic's). Each target checks its shapes
where it is built, so a batch assembled wrongly fails on the driver, naming the field, not later inside a worker.
Every tensor field is ``[B, T, ...]`` aligned with the batch's ``response_ids_BT``; ``rows``/``cols`` slice them with
the batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from torch import Tensor

if TYPE_CHECKING:
    pass

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
class ValueTarget:
    """The critic's update: its predictions at rollout time (for value clipping) and the returns to regress on."""

    values_BT: Tensor  # float [B, T], reward units
    returns_BT: Tensor  # float [B, T], reward units

    def __post_init__(self) -> None:
        check_shapes(self)
