"""A reward model worker: a transformers sequence-classification model (one logit) scoring prompt + response.

The reward model reads the policy's token ids as they are, so it must share the policy's tokenizer (``asyncrl
train-rm`` builds it from the policy's directory, so it does); a different vocabulary is an error at start. Each
sequence is right-padded so the classifier reads the last real token.
"""

from __future__ import annotations

import os
import time

import torch
from transformers import AutoModelForSequenceClassification

from asyncrl.config import Config
from asyncrl.models.loading import load_tokenizer_from
from asyncrl.telemetry.timeline import get_timeline
from asyncrl.types import Sample


def load_reward_model(path: str, policy_path: str | None = None) -> tuple[torch.nn.Module, object]:
    tok = load_tokenizer_from(path)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, local_files_only=True)
    except Exception as e:
        raise ValueError(f"reward_model.path {path}: could not load a sequence-classification model ({e})") from e
    if policy_path is not None and load_tokenizer_from(policy_path).get_vocab() != tok.get_vocab():
        raise ValueError(
            f"reward_model.path {path}: its tokenizer differs from model.path {policy_path}'s; the reward model "
            "scores the policy's token ids and must share its vocabulary (train it with `asyncrl train-rm`)"
        )
    model.config.pad_token_id = tok.pad_token_id
    return model.eval().requires_grad_(False), tok


def rm_logits(model: torch.nn.Module, seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """One logit per token sequence, [B] (right-padded; gradients flow if the caller allows them)."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    for j, s in enumerate(seqs):
        ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[j, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits
    if logits.dim() == 3:  # per-token logits: read the last real token
        logits = logits[torch.arange(len(seqs)), attn.sum(dim=1) - 1]
    return logits.reshape(len(seqs), -1)[:, 0].float()


def score_ids(model: torch.nn.Module, seqs: list[list[int]], pad_id: int, micro_batch_size: int) -> torch.Tensor:
    """``rm_logits`` without gradients, in micro-batches: [B]."""
    with torch.inference_mode():
        return torch.cat(
            [rm_logits(model, seqs[i : i + micro_batch_size], pad_id) for i in range(0, len(seqs), micro_batch_size)]
        )


class RewardModelWorker:
    def __init__(self, cfg: Config, name: str = "reward_model", num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.name = name
        self.micro = cfg.reward_model.micro_batch_size
        self.model, self.tokenizer = load_reward_model(cfg.reward_model.path, cfg.model.path)
        self.timeline = get_timeline()
        self.timeline.worker = name

    def score(self, samples: list[Sample], step: int = -1) -> tuple[torch.Tensor, float]:
        """Reward-model logits [B] for ``samples`` and the seconds spent here."""
        t0 = time.perf_counter()
        with self.timeline.span("reward_model", step=step, worker=self.name):
            seqs = [list(s.prompt.prompt_ids) + list(s.response_ids) for s in samples]
            logits = score_ids(self.model, seqs, self.tokenizer.pad_token_id, self.micro)
        return logits, time.perf_counter() - t0

    def save_checkpoint(self, directory: str) -> None:
        """Frozen: nothing to save."""

    def load_checkpoint(self, directory: str) -> int:
        return 0

    def pop_timeline(self) -> list[dict]:
        return self.timeline.drain()

    def pid(self) -> int:
        return os.getpid()
