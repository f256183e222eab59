"""The colocated actor + rollout (+ reference) worker.

A plain Python class: it owns one model that both generates (through the built-in ``RolloutEngine``) and trains, an
optional frozen reference copy for the KL loss, the optimizer and its schedule. It knows nothing of pipeline modes;
a pipeline decides the order of calls. ``asyncrl.workers.cluster`` places it on a resource pool as a Ray actor.
In modes with a separate rollout pool it is the trainer, and sends its weights to the rollout workers
(``SyncSenderMixin``).
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import torch

from asyncrl.checkpoint import rng_state, set_rng_state
from asyncrl.config import Config
from asyncrl.data.collate import TrainBatch
from asyncrl.models.loading import load_model
from asyncrl.rollout.engine import RolloutEngine, SamplingParams
from asyncrl.sync.ray_sync import SyncSenderMixin
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Prompt, Sample
from asyncrl.workers import policy_ops


def _warmup_lambda(warmup_steps: int):
    return lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


class ActorRolloutWorker(SyncSenderMixin):
    def __init__(self, cfg: Config, name: str = "actor_rollout", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.cfg = cfg
        self.name = name
        torch.manual_seed(cfg.trainer.seed)
        self.model, self.tokenizer = load_model(cfg.model.path, dtype=cfg.model.dtype)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.engine = RolloutEngine(self.model, self.tokenizer, max_batch_size=cfg.rollout.max_batch_size)
        self.ref_model = None
        self.prox_model = None  # decoupled PPO (fully_async): the weights at the start of the sync window
        if cfg.actor.use_kl_loss:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        o = cfg.actor.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _warmup_lambda(o.lr_warmup_steps))
        self.version = 0  # number of policy updates applied (one per training step)
        self.timeline = get_timeline()
        self.timeline.worker = name

    # ---- rollout -------------------------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], params: SamplingParams, seed: int, step: int = -1) -> list[Sample]:
        with self.timeline.span("generate", step=step, worker=self.name):
            return self.engine.generate(prompts, params, seed=seed)

    # ---- training ------------------------------------------------------------------------------------------------
    def compute_logprobs(self, batch: TrainBatch, which: str = "actor", step: int = -1) -> torch.Tensor:
        """Per-token log-probs [B, T] of ``batch``'s responses under the current (``actor``), reference (``ref``) or
        proximal (``prox``: the weights at the last ``snapshot_prox``) model."""
        models = {"actor": self.model, "ref": self.ref_model, "prox": self.prox_model}
        if which not in models:
            raise ValueError(f"{self.name}.compute_logprobs: which must be actor, ref or prox (got {which!r})")
        model = models[which]
        if model is None:
            hint = "set actor.use_kl_loss=true" if which == "ref" else "call snapshot_prox() first"
            raise RuntimeError(f"{self.name}: no {which} model ({hint})")
        with self.timeline.span(f"{which}_logprobs", step=step, worker=self.name):
            return policy_ops.response_logprobs(
                model, batch, self.cfg.rollout.temperature, self.cfg.actor.ppo_micro_batch_size
            )

    def snapshot_prox(self) -> None:
        """Keep a frozen copy of the current weights as the proximal policy (decoupled PPO's anchor)."""
        if self.prox_model is None:
            self.prox_model = copy.deepcopy(self.model).eval()
            for p in self.prox_model.parameters():
                p.requires_grad_(False)
        else:
            self.prox_model.load_state_dict(self.model.state_dict())

    def update(self, batch: TrainBatch, step: int, num_mini_batches: int | None = None) -> dict[str, float]:
        """One training step on ``batch`` (extras: advantages_BT, old_logp_BT, ref_logp_BT); bumps the version.

        ``num_mini_batches`` optimizer steps (default: data.train_batch_size // actor.ppo_mini_batch_size)."""
        num_mini = num_mini_batches or self.cfg.data.train_batch_size // self.cfg.actor.ppo_mini_batch_size
        with self.timeline.span("update_actor", step=step, worker=self.name):
            res = policy_ops.ppo_update(
                self.model,
                self.optimizer,
                self.scheduler,
                batch,
                self.cfg.actor,
                self.cfg.algorithm.rollout_correction,
                self.cfg.rollout.temperature,
                num_mini_batches=num_mini,
                seed=self.cfg.trainer.seed * 100_003 + step,
            )
        self.version += 1
        self.engine.version = self.version  # colocated: the engine generates with these very weights
        return res.metrics

    def update_distill(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """One distillation step on ``batch`` (extras: the teacher's top-k and sampled-token log-probs); bumps the
        version. ``data.train_batch_size // actor.ppo_mini_batch_size`` optimizer steps."""
        num_mini = self.cfg.data.train_batch_size // self.cfg.actor.ppo_mini_batch_size
        with self.timeline.span("update_actor", step=step, worker=self.name):
            res = policy_ops.distill_update(
                self.model,
                self.optimizer,
                self.scheduler,
                batch,
                self.cfg.actor,
                self.cfg.distill,
                num_mini_batches=num_mini,
                seed=self.cfg.trainer.seed * 100_003 + step,
            )
        self.version += 1
        self.engine.version = self.version
        return res.metrics

    def update_timed(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """``update`` plus ``timing_s/update_actor`` measured on this worker (a pipeline that joins several pools'
        updates cannot time one of them from the driver)."""
        t0 = time.perf_counter()
        metrics = self.update(batch, step)
        return {**metrics, "timing_s/update_actor": time.perf_counter() - t0}

    # ---- checkpoint ----------------------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str) -> None:
        """Writes model (safetensors) + tokenizer, optimizer, scheduler and RNG states into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(d / "model", safe_serialization=True)
        self.tokenizer.save_pretrained(d / "model")
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "rng": rng_state(),
        }
        torch.save(state, d / f"{self.name}_state.pt")
        if self.ref_model is not None:
            torch.save(self.ref_model.state_dict(), d / "ref_model.pt")

    def load_checkpoint(self, directory: str) -> int:
        d = Path(directory)
        from safetensors.torch import load_file

        files = sorted((d / "model").glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"checkpoint {d}: no model/*.safetensors")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        missing = [m for m in missing if not _is_tied(self.model, m)]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {d}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
        state = torch.load(d / f"{self.name}_state.pt", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        self.engine.version = self.version
        set_rng_state(state["rng"])
        if self.ref_model is not None:
            self.ref_model.load_state_dict(torch.load(d / "ref_model.pt", weights_only=True))
        return self.version

    def export_model(self, directory: str) -> None:
        """The current policy as a plain HF directory (safetensors + config + tokenizer)."""
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def pop_timeline(self) -> list[dict]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()


def _is_tied(model: torch.nn.Module, name: str) -> bool:
    return name == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
