"""Reward models: a transformers sequence-classification model (one logit) that scores prompt + response token ids.

The reward model reads the policy's token ids as they are, so it must share the policy's tokenizer (``asyncrl
train-rm`` builds it from the policy's directory, so it does); a different vocabulary is an error at load. Each
sequence is right-padded so the classifier reads the last real token. Used by the reward-model worker and by
reward-model training.
"""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import AutoModelForSequenceClassification

from asyncrl.models.loading import load_tokenizer_from


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
    lengths = torch.tensor([len(s) for s in seqs])
    ids = pad_sequence([torch.tensor(s, dtype=torch.long) for s in seqs], batch_first=True, padding_value=pad_id)
    attn = (torch.arange(ids.shape[1]) < lengths[:, None]).long()
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
    if logits.dim() == 3:  # per-token logits: read the last real token
        logits = logits[torch.arange(len(seqs), device=device), (lengths - 1).to(device)]
    return logits.reshape(len(seqs), -1)[:, 0].float()


def score_ids(model: torch.nn.Module, seqs: list[list[int]], pad_id: int, micro_batch_size: int) -> torch.Tensor:
    """``rm_logits`` without gradients, in micro-batches: [B], on the CPU."""
    with torch.inference_mode():
        return torch.cat(
            [rm_logits(model, seqs[i : i + micro_batch_size], pad_id) for i in range(0, len(seqs), micro_batch_size)]
        ).cpu()
