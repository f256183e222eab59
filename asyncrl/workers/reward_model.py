"""The reward-model role: scores finished samples with a frozen sequence-classification model
(``asyncrl.models.reward_model``)."""

from __future__ import annotations

import os
import time

import torch

from asyncrl.config.specs import RewardModelSpec
from asyncrl.models.device import resolve_device
from asyncrl.models.reward_model import load_reward_model, score_ids
from asyncrl.telemetry.timeline import Event, get_timeline
from asyncrl.types import Sample, Scored


class RewardModelWorker:
    def __init__(self, spec: RewardModelSpec, name: str = "reward_model", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.micro = spec.reward_model.micro_batch_size
        self.device = resolve_device(spec.device, name)
        self.model, self.tokenizer = load_reward_model(spec.reward_model.path, spec.policy_path)
        self.model.to(self.device)
        self.timeline = get_timeline()
        self.timeline.worker = name

    def score(self, samples: list[Sample], step: int = -1) -> Scored:
        """Reward-model logits [B] for ``samples`` and the seconds spent here."""
        t0 = time.perf_counter()
        with self.timeline.span("reward_model", step=step, worker=self.name):
            seqs = [list(s.prompt.prompt_ids) + list(s.response_ids) for s in samples]
            logits = score_ids(self.model, seqs, self.tokenizer.pad_token_id, self.micro)
        return Scored(logits, time.perf_counter() - t0)

    def save_checkpoint(self, directory: str) -> None:
        """Frozen: nothing to save."""

    def load_checkpoint(self, directory: str) -> int:
        return 0

    def pop_timeline(self) -> list[Event]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()
