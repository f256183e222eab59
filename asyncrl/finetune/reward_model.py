"""``asyncrl train-rm``: a small reward model for the demo task, trained here so the reward-model path runs on real
weights.

Pairs come from the dataset: each prompt with its correct answer (label 1) and a corrupted one (label 0,
``corrupt_answer``), in the token layout the policy produces. The model is ``AutoModelForSequenceClassification`` (one
logit) built from a policy directory, so it shares the policy's tokenizer; its body starts from the policy's weights,
its head from scratch. Trained with binary cross-entropy; reports the held-out pairwise accuracy (correct scored
above corrupted). Output: a plain HF directory for ``reward_model.path``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForSequenceClassification

from asyncrl.data.dataset import PromptDataset, load_rows
from asyncrl.models.loading import load_tokenizer_from
from asyncrl.models.reward_model import rm_logits, score_ids
from asyncrl.types import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def corrupt_answer(answer: str, rng: random.Random) -> str:
    """A wrong answer of the same kind: an integer shifted by a non-zero amount in [-10, 10]."""
    try:
        value = int(answer.strip())
    except ValueError:
        raise ValueError(f"train-rm: ground truth {answer!r} is not an integer (chain_sum-like tasks only)") from None
    delta = rng.choice([d for d in range(-10, 11) if d != 0])
    return str(value + delta)


def answer_pairs(
    prompts: list[Prompt], tokenizer: PreTrainedTokenizerBase, seed: int
) -> list[tuple[list[int], list[int]]]:
    """Per prompt: (prompt + correct answer + eos, prompt + corrupted answer + eos) token ids."""
    rng = random.Random(seed)
    eos = tokenizer.eos_token_id

    def seq(p: Prompt, text: str) -> list[int]:
        return list(p.prompt_ids) + tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]

    return [(seq(p, p.ground_truth), seq(p, corrupt_answer(p.ground_truth, rng))) for p in prompts]


def pairwise_accuracy(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]], pad_id: int) -> float:
    good = score_ids(model, [a for a, _ in pairs], pad_id, 256)
    bad = score_ids(model, [b for _, b in pairs], pad_id, 256)
    return float((good > bad).float().mean())


def train_reward_model(
    train_files: list[str],
    val_files: list[str],
    init: str,
    out: str,
    steps: int = 300,
    max_time_s: float = 0.0,
    batch_size: int = 32,
    lr: float = 3e-4,
    seed: int = 1,
    val_max: int = 200,
    num_threads: int = 2,
) -> dict[str, object]:
    torch.set_num_threads(num_threads)
    torch.manual_seed(seed)
    tok = load_tokenizer_from(init)
    model = AutoModelForSequenceClassification.from_pretrained(init, num_labels=1, local_files_only=True)
    model.config.pad_token_id = tok.pad_token_id
    train = PromptDataset(load_rows(train_files), tok, 256)
    train_pairs = answer_pairs([train[i] for i in range(len(train))], tok, seed)
    val_pairs: list[tuple[list[int], list[int]]] = []
    if val_files:
        val = PromptDataset(load_rows(val_files), tok, 256)
        val_pairs = answer_pairs([val[i] for i in range(min(len(val), val_max))], tok, seed + 1)
    before = pairwise_accuracy(model.eval(), val_pairs, tok.pad_token_id) if val_pairs else None
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    half = max(1, batch_size // 2)
    t0 = time.perf_counter()
    model.train()
    step = 0
    loss_val = float("nan")
    for step in range(1, steps + 1):
        chosen = rng.sample(train_pairs, min(half, len(train_pairs)))
        seqs = [a for a, _ in chosen] + [b for _, b in chosen]
        labels = torch.tensor([1.0] * len(chosen) + [0.0] * len(chosen))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(rm_logits(model, seqs, tok.pad_token_id), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = float(loss.detach())
        if step % 50 == 0:
            print(f"[train-rm] step {step} loss {loss_val:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if max_time_s > 0 and time.perf_counter() - t0 >= max_time_s:
            break
    model.eval()
    after = pairwise_accuracy(model, val_pairs, tok.pad_token_id) if val_pairs else None
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    summary: dict[str, object] = {
        "steps": step,
        "final_loss": loss_val,
        "val_pairwise_accuracy_before": before,
        "val_pairwise_accuracy": after,
        "seconds": round(time.perf_counter() - t0, 1),
        "out": out,
    }
    (Path(out) / "rm_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
