"""Full weights of an FSDP2 trainer that keeps no unsharded copy (``TrainerWorker.serving`` is None: every
schedule but sync), gathered one parameter at a time (``DTensor.full_tensor``) for the calls that read them on rank 0
alone (a weight sync, an evaluation on the trainer, an export, a checkpoint), so the whole model is never held
unsharded on a GPU.

A gather is a collective of every trainer rank, but those calls reach rank 0 only. So rank 0 leads: before each
parameter it announces the parameter's index over the data-parallel group, and every other rank, inside
``follow`` (the driver calls ``follow_gather`` on them at the same time, ``asyncrl.roles.clients``), gathers the
parameter it was told, until rank 0 announces the end. Whatever order rank 0 reads in, the ranks gather in step.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping

import torch

from asyncrl.trainer.data_parallel import DataParallel
from asyncrl.trainer.fsdp import whole

STOP = -1  # rank 0's announcement that nothing more is gathered


class Gather:
    """One gathering session over ``model``'s parameters (tied ones once, in ``named_parameters`` order)."""

    def __init__(self, dp: DataParallel, model: torch.nn.Module):
        self.dp = dp
        self.params = dict(model.named_parameters())
        self.names = list(self.params)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.gathered = 0  # parameters gathered by this rank (tests count them)

    def _announce(self, i: int) -> int:
        """Rank 0's ``i`` on every rank (the others' is ignored)."""
        return self.dp.all_gather_int(i)[0]

    def _gather(self, i: int) -> torch.Tensor:
        p = self.params[self.names[i]]
        self.gathered += 1
        return whole(p)

    def full(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """Rank 0: parameter ``name`` whole, in ``dtype`` (the other ranks gather it in ``follow``)."""
        return self._gather(self._announce(self.index[name])).to(dtype)

    def stop(self) -> None:
        """Rank 0: release the followers."""
        self._announce(STOP)

    def follow(self) -> None:
        """Ranks >= 1: gather whatever rank 0 announces, until it stops."""
        while (i := self._announce(STOP - 1)) != STOP:
            self._gather(i)

    def tensors(self, dtype: torch.dtype) -> GatheredTensors:
        return GatheredTensors(self, dtype)


class GatheredTensors(Mapping):
    """Name -> full tensor in ``dtype``, gathered when read (and again each time it is read: nothing is kept)."""

    def __init__(self, gather: Gather, dtype: torch.dtype):
        self.gather, self.dtype = gather, dtype

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.gather.index:
            raise KeyError(name)
        return self.gather.full(name, self.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.gather.names)

    def __len__(self) -> int:
        return len(self.gather.names)


def skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s structure and dtypes on the meta device (no memory): what ``full_model`` fills."""
    return copy.deepcopy(model).to("meta")


def full_model(
    gather: Gather, sharded: torch.nn.Module, frame: torch.nn.Module, device: torch.device
) -> torch.nn.Module:
    """Rank 0: an unsharded module on ``device`` (``frame``'s dtypes, a ``skeleton``) holding the sharded model's
    weights, gathered parameter by parameter."""
    return fill(frame, gather.full, sharded, device)


def fill(
    frame: torch.nn.Module,
    read: Callable[[str, torch.dtype], torch.Tensor],
    sharded: torch.nn.Module,
    device: torch.device,
) -> torch.nn.Module:
    """A copy of ``frame`` on ``device`` whose parameters are ``read(name, dtype)``, one at a time, and whose buffers
    (rotary frequencies: not sharded) are copied from ``sharded``."""
    full = copy.deepcopy(frame).to_empty(device=device)
    if hasattr(full, "tie_weights"):  # moving off the meta device unties shared weights: one parameter again
        full.tie_weights()
    with torch.no_grad():
        for name, p in full.named_parameters():
            p.copy_(read(name, p.dtype))
        mine = dict(sharded.named_buffers())
        for name, b in full.named_buffers():
            b.copy_(mine[name])
    return full
