"""Mixed precision as verl trains: parameters and activations in ``model.dtype`` (bf16 on GPUs), fp32 master weights
and optimizer state, gradient reductions, log-probs and losses in fp32.

``build_optimizer`` gives AdamW over the trainable parameters; when any of them is not fp32 it is
:class:`MasterWeightsAdamW`, which keeps an fp32 copy of each (the master), steps the masters with the gradients
cast to fp32, and writes the result back into the model in its dtype. Without the masters an update smaller than
half a bf16 step of a weight (lr 1e-5 on a weight of 1.0: bf16 resolves 2^-7) is rounded away every time; with them
it accumulates until it shows. The log-probs and losses are fp32 whatever the dtype (``asyncrl.trainer.forward``
upcasts the logits), and data-parallel ranks sum their gradients in fp32 (``asyncrl.trainer.data_parallel``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from asyncrl.config.training import OptimConfig


class MasterWeightsAdamW(torch.optim.AdamW):
    """AdamW over fp32 masters of low-precision parameters. ``grads_in_fp32`` moves the model's gradients onto the
    masters (to clip them in fp32); ``step`` does that when it was not done, steps, and copies the masters back. Its
    ``state_dict`` holds the masters, so a resumed run continues from the fp32 weights, not their rounding."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **kwargs: Any):
        self.model_params = list(params)
        self.masters = [p.detach().float().clone().requires_grad_(True) for p in self.model_params]
        super().__init__(self.masters, **kwargs)
        self._moved = False

    def grads_in_fp32(self) -> list[torch.Tensor]:
        """The model's gradients, cast to fp32, onto the masters (the model's are freed); returns the masters."""
        for p, m in zip(self.model_params, self.masters):
            m.grad = None if p.grad is None else p.grad.detach().float()
            p.grad = None
        self._moved = True
        return self.masters

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if not self._moved:
            self.grads_in_fp32()
        self._moved = False
        loss = super().step(closure)
        for p, m in zip(self.model_params, self.masters):
            p.copy_(m)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.model_params:
            p.grad = None
        self._moved = False
        super().zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["master_weights"] = [m.detach().clone() for m in self.masters]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        masters = state.pop("master_weights", None)
        super().load_state_dict(state)
        if masters is None:  # a checkpoint of an fp32 run: start the masters from the model's weights
            return
        if len(masters) != len(self.masters):
            raise ValueError(f"optimizer state: {len(masters)} master weights for {len(self.masters)} parameters")
        with torch.no_grad():
            for p, m, saved in zip(self.model_params, self.masters, masters):
                m.copy_(saved)
                p.copy_(m)


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over ``params`` with ``optim``'s lr, betas and weight decay (an ``OptimConfig``); with fp32 masters
    when any parameter is in a lower precision."""
    params = list(params)
    beta1, beta2 = optim.betas
    if any(p.dtype != torch.float32 for p in params):
        return MasterWeightsAdamW(params, lr=optim.lr, betas=(beta1, beta2), weight_decay=optim.weight_decay)
    return torch.optim.AdamW(params, lr=optim.lr, betas=(beta1, beta2), weight_decay=optim.weight_decay)


def grads_to_clip(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> Sequence[torch.Tensor]:
    """The gradients a step clips and takes: the fp32 masters' under ``MasterWeightsAdamW``, else the model's."""
    return optimizer.grads_in_fp32() if isinstance(optimizer, MasterWeightsAdamW) else params
