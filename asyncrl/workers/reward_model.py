"""The reward-model role: scores finished samples with a frozen sequence-classification model
(``asyncrl.models.reward_model``)."""

from __future__ import annotations

import time

from asyncrl.config.specs import RewardModelSpec
from asyncrl.models.device import resolve_device
from asyncrl.models.reward_model import load_reward_model, score_ids
from asyncrl.types import Sample, Scored
from asyncrl.workers.backends import RoleWorker


class RewardModelWorker(RoleWorker):
    def __init__(self, spec: RewardModelSpec, name: str = "reward_model", num_threads: int | None = None):
        super().__init__(name, num_threads)
        self.micro = spec.reward_model.micro_batch_size
        self.device = resolve_device(spec.device, name)
        self.model, self.tokenizer = load_reward_model(spec.reward_model.path, spec.policy_path)
        self.model.to(self.device)

    def score(self, samples: list[Sample], step: int = -1) -> Scored:
        """Reward-model logits [B] for ``samples`` and the seconds spent here."""
        t0 = time.perf_counter()
        with self.timeline.span("reward_model", step=step, worker=self.name):
            seqs = [list(s.prompt.prompt_ids) + list(s.response_ids) for s in samples]
            logits = score_ids(self.model, seqs, self.tokenizer.pad_token_id, self.micro)
        return Scored(logits, time.perf_counter() - t0)
