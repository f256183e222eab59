"""A role's torch device, resolved where the role runs: ``trainer.device`` (auto | cpu | cuda; docs/config.md).

Under Ray, ``auto``'s GPU is the one the role's slot was given, ``cuda:0`` in the worker (Ray sets
``CUDA_VISIBLE_DEVICES``). Models, optimizer state, batches and KV caches live on the device; tensors go to the CPU
only to cross a process boundary (the built-in engine samples on the logits' device: ``asyncrl.rollout.sampling``).
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass, replace
from typing import TypeVar

import torch

from asyncrl.errors import UserInputError

T = TypeVar("T")


class DeviceError(UserInputError, RuntimeError):
    """``trainer.device=cuda`` for a role that sees no CUDA device."""


def resolve_device(setting: str, who: str) -> torch.device:
    """The device ``who`` (a worker's name) runs on for ``trainer.device=setting``."""
    if setting == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if setting == "cuda":
        raise DeviceError(
            f"trainer.device=cuda: {who} sees no CUDA device (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__} built for CUDA "
            f"{torch.version.cuda}); give its pool GPUs (trainer/rollout.n_gpus_per_node, placement.pools.<name>.gpus) "
            "or set trainer.device=auto"
        )
    return torch.device("cpu")


def to_device(obj: T, device: torch.device) -> T:
    """``obj`` with every tensor in it on ``device``: a tensor, or a dataclass whose fields are tensors, dataclasses
    of tensors, or anything else (kept). The same object when nothing moves (a CPU run copies nothing)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)  # type: ignore[return-value]
    if not is_dataclass(obj) or isinstance(obj, type):
        return obj
    values = {f.name: getattr(obj, f.name) for f in fields(obj) if f.init}
    changes = {k: moved for k, v in values.items() if (moved := to_device(v, device)) is not v}
    return replace(obj, **changes) if changes else obj  # type: ignore[type-var]
