"""The critic: a value head on a transformers causal-LM body, predicting the return from each response state.

Initialised from ``critic.model.path`` or, when that is null, from the policy's ``model.path`` (the body's weights;
the head starts at zero, so every first prediction is 0). The value of response token t is read from the hidden state
that predicts token t (column ``P - 1 + t``, the same alignment as the policy's logits): the state *before* the
token is chosen, as in verl. A plain Python class; a backend runs it on the pool ``placement.roles.critic`` names.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from asyncrl import losses, seeds
from asyncrl.checkpoint import rng_state, set_rng_state
from asyncrl.config.specs import CriticSpec
from asyncrl.data.collate import TrainBatch, micro_batches
from asyncrl.models.device import resolve_device, to_device
from asyncrl.models.loading import load_model
from asyncrl.trainer.forward import at_responses, batching, model_inputs
from asyncrl.trainer.update import build_optimizer, optimize, warmup_schedule
from asyncrl.types import Scored
from asyncrl.workers.backends import RoleWorker

_STATEFUL = ("model", "optimizer", "scheduler")  # what a checkpoint holds of the critic, beside its counter and RNG


class ValueModel(torch.nn.Module):
    """A causal LM's body (its ``base_model``, lm_head dropped) + a linear head to one scalar per position."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.body = lm.base_model
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, mb: TrainBatch) -> torch.Tensor:
        """Values [B, T] of ``mb``'s response states (reward units)."""
        h = self.body(**model_inputs(mb, next(self.body.parameters()).dtype)).last_hidden_state
        return self.value_head(at_responses(h, mb).float()).squeeze(-1)


class CriticWorker(RoleWorker):
    def __init__(self, spec: CriticSpec, name: str = "critic", num_threads: int | None = None):
        super().__init__(name, num_threads)
        self.spec = spec
        torch.manual_seed(seeds.critic_init(spec.seed))
        path = spec.critic.model.path or spec.model.path
        self.device = resolve_device(spec.device, name)
        lm, _ = load_model(path, dtype=spec.model.dtype)
        self.model = ValueModel(lm).to(self.device)
        o = spec.critic.optim
        self.optimizer = build_optimizer(self.model.parameters(), o)
        self.scheduler = warmup_schedule(self.optimizer, o.lr_warmup_steps)
        self.updates = 0

    def compute_values(self, batch: TrainBatch, step: int = -1) -> Scored:
        """Values [B, T] (0 on padding) and the seconds spent on this worker (``timing_s/values``)."""
        t0 = time.perf_counter()
        out = torch.zeros_like(batch.response_mask_BT)
        self.model.eval()
        with self.timeline.span("values", step=step, worker=self.name), torch.inference_mode():
            for idx, mb in micro_batches(batch, batching(self.spec.critic, "critic")):
                mb = to_device(mb, self.device)
                out[idx, : mb.response_mask_BT.shape[1]] = (self.model(mb) * mb.response_mask_BT).to(out.device)
        return Scored(out, time.perf_counter() - t0)

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int) -> dict[str, float]:
        """``critic.ppo_epochs`` passes of the clipped value loss on ``batch.value`` (the predictions at rollout time
        and the GAE returns). A non-finite loss or gradient skips that optimizer step."""
        c = self.spec.critic
        if batch.value is None:
            raise TypeError(f"{self.name}.update: the batch has no ValueTarget (values and returns)")
        t0 = time.perf_counter()

        def micro_loss(mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
            mask = mb.response_mask_BT
            vpred = self.model(mb)
            value = mb.value
            loss, stats = losses.value_loss_clipped(
                vpred, value.values_BT, value.returns_BT, mask, c.cliprange_value, loss_agg_mode=c.loss_agg_mode
            )
            return loss, {
                "critic/vf_loss": float(loss.detach()),
                "critic/vf_clipfrac": float(stats["vf_clipfrac"]),
                "critic/vpred_mean": float(losses.masked_mean(vpred.detach(), mask)),
            }

        seed = seeds.critic_update(self.spec.seed, step)
        with self.timeline.span("update_critic", step=step, worker=self.name):
            result = optimize(
                self.model, self.optimizer, self.scheduler, batch, c, num_mini_batches, seed, micro_loss, "critic"
            )
        self.updates += 1
        names = ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm")
        metrics = {**dict.fromkeys(names, float("nan")), **result.metrics}  # NaN when every micro-batch was non-finite
        metrics["timing_s/update_critic"] = time.perf_counter() - t0
        return metrics

    # ---- checkpoint ----------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        state = {k: getattr(self, k).state_dict() for k in _STATEFUL}
        torch.save({**state, "updates": self.updates, "rng": rng_state()}, d / f"{self.name}_state.pt")

    def load_checkpoint(self, directory: str) -> int:
        f = Path(directory) / f"{self.name}_state.pt"
        if not f.is_file():
            raise FileNotFoundError(f"checkpoint {directory}: no {f.name} (was it written by a ppo run?)")
        state = torch.load(f, weights_only=False, map_location="cpu")
        for k in _STATEFUL:
            getattr(self, k).load_state_dict(state[k])
        self.updates = int(state["updates"])
        set_rng_state(state["rng"])
        return self.updates
