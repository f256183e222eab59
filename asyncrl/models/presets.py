"""Randomly initialised tiny Qwen2 models, sized for a 1-2 core CPU.

"tiny" (~4.2M parameters with a ~100-token character vocabulary) is the policy used in examples and end-to-end tests
(and the teacher of the distillation example); "small" (~17M) is larger; "mini" (~0.7M) is the distillation example's
student; "micro" (~80k) is for unit tests. All tie the input embedding and the lm_head, so the vocabulary costs
parameters only once. Sizes are fixed here rather than in YAML so "tiny" means the same thing everywhere; any
``Qwen2Config`` field can still be overridden per call.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from asyncrl.models.tokenizer import save_tokenizer

MAX_POSITION_EMBEDDINGS = 512  # tokens: prompt + response must fit

SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")
PRESETS: dict[str, dict[str, Any]] = {
    name: dict(zip(SHAPE_KEYS, sizes))
    for name, sizes in {
        # 6 x (attention 197k + MLP 492k) + embeddings vocab*256  ~= 4.16M for a 100-token vocabulary.
        "tiny": (256, 6, 4, 2, 640),
        # 8 x (attention 394k + MLP 1.77M) + embeddings vocab*384 ~= 17.3M for a 100-token vocabulary.
        "small": (384, 8, 6, 2, 1536),
        # 4 x (attention 49k + MLP 123k) + embeddings vocab*128 ~= 0.7M: the student of the distillation example.
        "mini": (128, 4, 4, 2, 320),
        # ~80k parameters: unit tests of anything that needs a real transformers model (runs in milliseconds).
        "micro": (64, 2, 4, 2, 128),
    }.items()
}


def preset_config(preset: str, tokenizer: PreTrainedTokenizerBase, **overrides: Any) -> Qwen2Config:
    """The ``Qwen2Config`` of ``preset`` with vocabulary and special token ids taken from ``tokenizer``."""
    if preset not in PRESETS:
        raise ValueError(f"model preset {preset!r} is unknown (known presets: {', '.join(sorted(PRESETS))})")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"model preset {preset!r}: the tokenizer has no eos token (generation could never stop)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    fields: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    fields.update(PRESETS[preset])
    fields.update(overrides)
    return Qwen2Config(**fields)


def build_model(preset: str, tokenizer: PreTrainedTokenizerBase, seed: int, **overrides: Any) -> Qwen2ForCausalLM:
    """A freshly initialised float32 model; the same ``(preset, tokenizer, seed, overrides)`` gives the same weights."""
    config = preset_config(preset, tokenizer, **overrides)
    # Seed only this initialisation (CPU RNG; devices=[] forks no accelerator RNG), leave the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
    )
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def init_model_dir(
    preset: str,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | os.PathLike[str],
    seed: int,
    **overrides: Any,
) -> Qwen2ForCausalLM:
    """Write a plain Hugging Face model directory (config, safetensors weights, generation config, tokenizer).

    The result loads with ``AutoModelForCausalLM.from_pretrained`` / :func:`asyncrl.models.loading.load_model` like
    any downloaded checkpoint, so everything downstream treats tiny and real models the same way.
    """
    model = build_model(preset, tokenizer, seed, **overrides)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    save_tokenizer(tokenizer, out_dir)
    return model
