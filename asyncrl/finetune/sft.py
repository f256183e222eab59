"""Supervised warm start: teach a model the task's answer format from question -> answer pairs.

RL needs a policy that already gets some answers right (GRPO learns nothing from a group whose rewards are all equal),
so a tiny model built here from a preset is first fitted on the dataset's ground-truth answers. Runs in-process
(one model, no Ray). Stops at ``trainer.total_steps`` or ``trainer.max_time_s`` wall seconds, whichever comes first,
so a control run can be given exactly the wall time another run took. Output: a plain HF directory.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import ConfigError, check, load_schema
from asyncrl.data.dataset import PromptDataset, load_rows, tokenize_messages
from asyncrl.models.loading import load_model, set_seed_all
from asyncrl.models.presets import PRESETS, init_model_dir
from asyncrl.models.tokenizer import build_char_tokenizer
from asyncrl.rewards.reward_fn import build_reward_fn
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.run.evaluation import evaluate_prompts
from asyncrl.types import Prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class SFTDataConfig:
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    val_max_samples: int = 500
    response_key: str = "ground_truth"  # reward_model.ground_truth, or a key of extra_info holding the target text
    # the target as the model writes it, "{response}" the text response_key names (e.g. "Answer: {response}")
    response_template: str = "{response}"
    batch_size: int = 64  # sequences per optimizer step
    max_prompt_length: int = 256
    max_response_length: int = 32


@dataclass
class SFTModelConfig:
    path: str | None = None  # continue from this HF directory; null = build `preset` with a new tokenizer
    preset: str = "tiny"
    tokenizer: str = "char"  # char: character-level, built from the training text


@dataclass
class SFTOptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 1.0
    # constant (lr after warm-up) | cosine (to lr * min_lr_ratio as the step or time budget, whichever first, runs out)
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.1


@dataclass
class SFTTrainerConfig:
    total_steps: int = 1000
    max_time_s: float = 0.0  # stop after this many wall seconds of training (0 = no limit)
    output_dir: str = "runs/sft"
    seed: int = 1
    num_threads: int = 2
    log_every: int = 50


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)


def load_sft_config(path: str | None, overrides: list[str] | None = None) -> SFTConfig:
    return load_schema(SFTConfig, path, overrides, validate_sft)


def validate_sft(cfg: SFTConfig) -> None:
    d, t = cfg.data, cfg.trainer
    check(bool(d.train_files), "data.train_files", d.train_files, "a non-empty list of parquet/jsonl files")
    check(d.batch_size >= 1, "data.batch_size", d.batch_size, ">= 1")
    check(d.max_response_length >= 1, "data.max_response_length", d.max_response_length, ">= 1")
    check(
        "{response}" in d.response_template and _fills(d.response_template),
        "data.response_template",
        d.response_template,
        'a format string with "{response}" and no other field',
    )
    check(cfg.optim.lr > 0, "optim.lr", cfg.optim.lr, "> 0")
    check(cfg.optim.lr_schedule in LR_SCHEDULES, "optim.lr_schedule", cfg.optim.lr_schedule, " or ".join(LR_SCHEDULES))
    check(0.0 <= cfg.optim.min_lr_ratio <= 1.0, "optim.min_lr_ratio", cfg.optim.min_lr_ratio, "in [0, 1]")
    check(t.total_steps >= 1, "trainer.total_steps", t.total_steps, ">= 1")
    check(t.max_time_s >= 0, "trainer.max_time_s", t.max_time_s, ">= 0 (0 = no limit)")
    check(t.num_threads >= 1, "trainer.num_threads", t.num_threads, ">= 1")
    if cfg.model.path is None:
        check(cfg.model.preset in PRESETS, "model.preset", cfg.model.preset, "one of " + ", ".join(PRESETS))
        check(cfg.model.tokenizer == "char", "model.tokenizer", cfg.model.tokenizer, "char")


LR_SCHEDULES = ("constant", "cosine")


def _fills(template: str) -> bool:
    try:
        template.format(response="x")
    except (KeyError, IndexError, ValueError):
        return False
    return True


def lr_factor(step: int, progress: float, warmup_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of optim.lr at ``step``: linear warm-up over ``warmup_steps``, then constant or a cosine from 1 down
    to ``min_lr_ratio`` as ``progress`` (fraction of the step or time budget used, 0..1) goes from 0 to 1."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    p = min(max(progress, 0.0), 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


def _response_text(row: dict[str, Any], key: str, where: str) -> str:
    if key == "ground_truth":
        return str(row["reward_model"]["ground_truth"])
    extra = row.get("extra_info") or {}
    if key not in extra:
        raise ConfigError(f"{where}: data.response_key {key!r} is not in extra_info (keys: {sorted(extra)})")
    return str(extra[key])


def init_model_from_data(preset: str, files: list[str], out_dir: str, seed: int, response_key: str = "") -> str:
    """``init_model_from_rows`` over the rows of ``files``."""
    return init_model_from_rows(preset, load_rows(files), out_dir, seed, response_key)


def init_model_from_rows(preset: str, rows: list[dict], out_dir: str, seed: int, response_key: str = "") -> str:
    """A fresh ``preset`` model directory whose char tokenizer covers every character of ``rows`` (prompts, answers,
    worked solutions) plus the digits and signs, so no answer can need an unknown token."""
    texts = [m["content"] for r in rows for m in r["prompt"]] + ["0123456789+-=#\n "]
    texts += [str(r["reward_model"]["ground_truth"]) for r in rows]
    texts += [
        str(r["extra_info"][response_key]) for r in rows if response_key and response_key in (r.get("extra_info") or {})
    ]
    init_model_dir(preset, build_char_tokenizer(texts), out_dir, seed=seed)
    return str(out_dir)


def run_sft(cfg: SFTConfig, group_of: Callable[[Prompt], str] | None = None) -> dict[str, object]:
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    torch.set_num_threads(t.num_threads)
    set_seed_all(t.seed)
    out = Path(t.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(d.train_files)
    model_path = cfg.model.path or init_model_from_rows(
        cfg.model.preset, rows, str(out / "init"), t.seed, d.response_key
    )
    model, tok = load_model(model_path)
    examples = sft_examples(rows, tok, d)

    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
    gen = torch.Generator().manual_seed(t.seed)
    model.train()
    t0 = time.time()
    step, losses = 0, []
    while step < t.total_steps:
        if t.max_time_s > 0 and time.time() - t0 >= t.max_time_s:
            break
        idx = torch.randint(len(examples), (d.batch_size,), generator=gen).tolist()
        loss = _sft_loss(model, [examples[i] for i in idx], tok.pad_token_id)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"sft step {step}: non-finite loss {loss.item()}; lower optim.lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        progress = step / t.total_steps
        if t.max_time_s > 0:
            progress = max(progress, (time.time() - t0) / t.max_time_s)
        for g in opt.param_groups:
            g["lr"] = o.lr * lr_factor(step, progress, o.warmup_steps, o.lr_schedule, o.min_lr_ratio)
        opt.step()
        step += 1
        losses.append(loss.item())
        if t.log_every and step % t.log_every == 0:
            print(f"sft step {step} loss {sum(losses[-50:]) / len(losses[-50:]):.4f} ({time.time() - t0:.0f}s)")
    train_s = time.time() - t0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    summary: dict[str, object] = {
        "steps": step,
        "train_s": round(train_s, 2),
        "final_loss": losses[-1] if losses else None,
    }
    if d.val_files:
        summary.update(
            evaluate_model(
                model,
                tok,
                d.val_files,
                d.max_response_length,
                d.val_max_samples,
                d.max_prompt_length,
                group_of=group_of,
            )
        )
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def sft_examples(rows: Any, tok: PreTrainedTokenizerBase, d: SFTDataConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, target tokens + eos) per row: the target is ``data.response_template`` filled with the text
    ``data.response_key`` names, cut to ``data.max_response_length``."""
    examples = []
    for i, row in enumerate(rows):
        where = rows.where(i) if hasattr(rows, "where") else f"row {i}"
        p = tokenize_messages(tok, row["prompt"], where=where)[-d.max_prompt_length :]
        text = d.response_template.format(response=_response_text(row, d.response_key, where))
        r = tok(text, add_special_tokens=False)["input_ids"]
        examples.append((p, (list(r) + [tok.eos_token_id])[: d.max_response_length]))
    return examples


def _sft_loss(model: torch.nn.Module, batch: list[tuple[list[int], list[int]]], pad_id: int) -> torch.Tensor:
    """Token-mean cross-entropy on response tokens only (prompt tokens are context, not targets)."""
    L = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), L), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), L), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), L), dtype=torch.long)
    for i, (p, r) in enumerate(batch):
        seq = p + r
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(r)
        attn[i, : len(seq)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def evaluate_model(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    files: list[str],
    response_length: int,
    max_samples: int = -1,
    max_prompt_length: int = 512,
    temperature: float = 0.0,
    group_of: Callable[[Prompt], str] | None = None,
) -> dict:
    rows = load_rows(files)
    if max_samples > 0:
        rows = rows[:max_samples]
    ds = PromptDataset(rows, tokenizer, max_prompt_length)
    engine = RolloutEngine(model, tokenizer)
    prompts = [ds[i] for i in range(len(ds))]
    return evaluate_prompts(
        lambda ps, params, seed: engine.generate(ps, params, seed=seed),
        prompts,
        build_reward_fn(None),
        response_length,
        temperature=temperature,
        group_of=group_of,
    )
